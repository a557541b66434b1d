"""The probe's fast paths (issue 21): a truncated reader pass, a bfloat16 pass checked against
float32, and the automatic choice between them, which falls back to float32 on a CPU where
bfloat16 does not pay off. No speed figures here: they are measured by ``bench/probe_speed.py``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from capgate.errors import DataError, ProbeMismatchError
from capgate.estimators.probe import LinearProbe, ProbeEstimator, check_spec_match
from capgate.loading import FastPathCheck, _feature_dtype, recorded_fast_paths
from capgate.local.hidden_states import FeatureSpec, HiddenStateFeaturizer
from capgate.local.models import LoadedModel
from capgate.local.prefill import prefill_cache

QUERIES = [
    "What is 2+3?",
    "Hi",
    "Name the largest planet of the solar system and say why it is so large.",
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "7 * 6?"}],
]


@pytest.fixture(autouse=True)
def no_shared_prefill() -> Any:
    """These tests read the reader's own pass: a sampling backend of the same model, built by an
    earlier test of the session, turns the shared prefill on for it (the full pass in the model's
    dtype); switch that off here and restore it after."""
    from capgate.local import prefill as _prefill

    with _prefill._REGISTRY_LOCK:
        caches = list(_prefill._REGISTRY.values())
    were = [cache.enabled for cache in caches]
    for cache in caches:
        cache.enabled = False
    yield
    for cache, enabled in zip(caches, were, strict=True):
        cache.enabled = enabled


def full_pass_states(loaded: LoadedModel, query: Any) -> torch.Tensor:
    """Every hidden state of one unpadded query from the model's full pass: (layers + 1, tokens, dim)."""
    ids = torch.tensor([loaded.prompt_ids(query)])
    with torch.inference_mode():
        out = loaded.model(input_ids=ids, output_hidden_states=True)
    return torch.stack([h[0].float() for h in out.hidden_states])


def count_calls(module: torch.nn.Module) -> list[int]:
    calls: list[int] = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_truncated_pass_gives_the_full_pass_features_and_skips_the_rest(
    tiny_model: LoadedModel, pooling: str
) -> None:
    layers = tiny_model.model.model.layers
    second, norm, head = (
        count_calls(layers[1]),
        count_calls(tiny_model.model.model.norm),
        count_calls(tiny_model.model.lm_head),
    )
    reads = ([0], [1], [0, 1])
    featurizers = [HiddenStateFeaturizer(tiny_model, layers=r, pooling=pooling, batch_size=3) for r in reads]  # type: ignore[arg-type]
    got = [featurizer.transform(QUERIES) for featurizer in featurizers]
    assert (second, norm, head) == ([], [], [])  # nothing past layer 1 ran
    for read, featurizer, features in zip(reads, featurizers, got, strict=True):
        assert featurizer._reader().truncated
        for row, query in enumerate(QUERIES):
            states = full_pass_states(tiny_model, query)[list(read)]
            pooled = states[:, -1, :] if pooling == "last" else states.mean(dim=1)
            np.testing.assert_allclose(features[row], pooled.mean(dim=0).numpy(), rtol=1e-5, atol=1e-6)
    del second[:], head[:]
    # Reading the last state (the final norm's output) runs the whole decoder, not the LM head.
    last = HiddenStateFeaturizer(tiny_model, layers=[2], pooling=pooling)  # type: ignore[arg-type]
    last_got = last.transform(QUERIES[:2])
    assert not last._reader().truncated
    assert len(second) > 0
    assert head == []
    for row, query in enumerate(QUERIES[:2]):
        state = full_pass_states(tiny_model, query)[2]
        want = state[-1] if pooling == "last" else state.mean(dim=0)
        np.testing.assert_allclose(last_got[row], want.numpy(), rtol=1e-5, atol=1e-6)


def test_truncated_layers_of_one_pass_match_separate_featurizers(tiny_model: LoadedModel) -> None:
    both = HiddenStateFeaturizer(tiny_model, layers=[0, 1]).transform_layers(
        QUERIES, poolings=["last", "mean"]
    )
    for j, pooling in enumerate(("last", "mean")):
        for k, layer in enumerate((0, 1)):
            alone = HiddenStateFeaturizer(tiny_model, layers=[layer], pooling=pooling).transform(QUERIES)  # type: ignore[arg-type]
            np.testing.assert_allclose(both[:, j, k], alone, rtol=1e-5, atol=1e-6)


def test_the_hooks_stay_out_of_other_passes(tiny_model: LoadedModel) -> None:
    HiddenStateFeaturizer(tiny_model, layers=[1]).transform(QUERIES[:1])  # installs the hooks
    ids = torch.tensor([tiny_model.prompt_ids(QUERIES[0])])
    with torch.inference_mode():
        out = tiny_model.model(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == 3
    assert out.logits.shape[1] == ids.shape[1]


def test_a_bfloat16_pass_reads_a_copy_and_stays_close_to_float32(tiny_model: LoadedModel) -> None:
    weights = {name: p.detach().clone() for name, p in tiny_model.model.named_parameters()}
    f32 = HiddenStateFeaturizer(tiny_model, layers=[1])
    bf16 = HiddenStateFeaturizer(tiny_model, layers=[1], dtype="bfloat16")
    assert (f32.dtype, bf16.dtype) == ("float32", "bfloat16")
    assert f32.spec.dtype == "float32"
    assert bf16.spec.dtype == "bfloat16"
    a, (b, made) = f32.transform(QUERIES), bf16.transform_with_details(QUERIES)
    assert made == {"dtype": "bfloat16"}
    assert b.dtype == np.float32
    scale = np.abs(a).max()
    assert np.abs(a - b).max() <= 0.05 * scale
    assert not np.array_equal(a, b)  # really another number format
    # The loaded model is untouched: same dtype, same weights; the copy holds only layer 0.
    for name, p in tiny_model.model.named_parameters():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, weights[name]), name
    copy = bf16._reader()._module
    assert len(copy.layers) == 1
    assert copy.embed_tokens.weight.dtype == torch.bfloat16
    assert all(buffer.dtype == torch.float32 for buffer in copy.buffers())  # rotary frequencies


def test_a_mixed_pass_runs_only_the_mlp_matmuls_in_bfloat16(tiny_model: LoadedModel) -> None:
    weights = {name: p.detach().clone() for name, p in tiny_model.model.named_parameters()}
    f32 = HiddenStateFeaturizer(tiny_model, layers=[1])
    mixed = HiddenStateFeaturizer(tiny_model, layers=[1], dtype="bf16-mixed")
    assert mixed.spec.dtype == "bf16-mixed"
    assert FeatureSpec.model_validate(mixed.spec.model_dump()) == mixed.spec
    a, (b, made) = f32.transform(QUERIES), mixed.transform_with_details(QUERIES)
    assert made == {"dtype": "bf16-mixed"}
    assert b.dtype == np.float32
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()
    assert not np.array_equal(a, b)  # the MLP matmuls really ran in bfloat16
    for name, p in tiny_model.model.named_parameters():  # the loaded model is untouched
        assert p.dtype == torch.float32, name
        assert torch.equal(p, weights[name]), name
    copy = mixed._reader()._module
    assert len(copy.layers) == 1
    for name, p in copy.named_parameters():
        want = torch.bfloat16 if ".mlp." in name else torch.float32
        assert p.dtype == want, name
    assert any(".mlp." in name for name, _ in copy.named_parameters())
    # A mixed pass of the same model in one process: the same features every time.
    np.testing.assert_array_equal(mixed.transform(QUERIES), b)


def test_a_mixed_pass_refuses_layers_without_an_mlp() -> None:
    from capgate.local._reader import _mix_bf16_matmuls

    with pytest.raises(ValueError, match=r"layer 0 .*no `mlp`"):
        _mix_bf16_matmuls(torch.nn.ModuleList([torch.nn.Linear(2, 2)]))


def test_the_shared_prefill_pass_runs_in_the_models_dtype(tiny_model_dir: Any) -> None:
    from capgate.local.models import load_model

    loaded = load_model(tiny_model_dir, device="cpu", dtype="float32")
    cache = prefill_cache(loaded)
    featurizer = HiddenStateFeaturizer(loaded, layers=[1], dtype="bfloat16")
    assert featurizer.transform_with_details(QUERIES[:1])[1] == {"dtype": "bfloat16"}
    cache.clear()  # entries an earlier test's backend of this model kept
    cache.enable()
    try:
        features, made = featurizer.transform_with_details(QUERIES[:1])
        assert made == {"dtype": "float32"}
        assert len(cache) == 1
        want = HiddenStateFeaturizer(loaded, layers=[1]).transform(QUERIES[:1])
        np.testing.assert_allclose(features, want, rtol=1e-5, atol=1e-6)
    finally:
        cache.enabled = False
        cache.clear()


def test_the_spec_records_the_dtype_and_a_probe_refuses_another(tiny_model: LoadedModel) -> None:
    f32 = HiddenStateFeaturizer(tiny_model).spec
    bf16 = HiddenStateFeaturizer(tiny_model, dtype="bfloat16").spec
    assert "dtype" not in f32.model_dump()  # as specs were saved before the field existed
    assert bf16.model_dump()["dtype"] == "bfloat16"
    assert FeatureSpec.model_validate(bf16.model_dump()) == bf16
    assert FeatureSpec.model_validate(f32.model_dump()).dtype == "float32"
    with pytest.raises(ProbeMismatchError, match="dtype"):
        check_spec_match(f32.model_dump(), bf16)
    check_spec_match(f32.model_dump(), bf16, ignore=["dtype"])
    with pytest.raises(ValueError, match="dtype must be"):
        HiddenStateFeaturizer(tiny_model, dtype="int8")  # type: ignore[arg-type]


def passed_check(**changes: Any) -> dict[str, Any]:
    fields = {"dtype": "bfloat16", "n": 356, "max_abs_dp": 0.004, "brier_float32": 0.02, "brier_fast": 0.0201,
              "split": "held-out"}  # fmt: skip
    return {**fields, **changes}


def probe_with(validation: dict[str, Any]) -> LinearProbe:
    probe = LinearProbe()
    probe.validation_ = validation
    return probe


@pytest.mark.parametrize(
    ("native", "speedup", "pays"), [(True, 2.4, True), (True, 0.6, False), (False, 2.4, False)]
)
def test_bfloat16_pays_off_only_where_native_and_measured_faster(
    monkeypatch: pytest.MonkeyPatch, native: bool, speedup: float, pays: bool
) -> None:
    """A CPU that lists AVX512-BF16 may still multiply bfloat16 slower than float32 (0.6x on one
    Xeon here): the fast path needs both the flag and the measured speed."""
    from capgate.local import _cpu

    monkeypatch.setattr(_cpu, "native_bf16_cpu", lambda: native)
    monkeypatch.setattr(_cpu, "bf16_speedup", lambda: speedup)
    monkeypatch.setattr("capgate.local.models.native_bf16_cpu", lambda: native)
    monkeypatch.setattr("capgate.local.models.bf16_speedup", lambda: speedup)
    assert _cpu.bf16_pays_off() is pays
    probe = probe_with({"fast_path": {"bf16-mixed": passed_check(dtype="bf16-mixed")}})
    chosen, record = _feature_dtype("auto", "cpu", probe)
    assert chosen == ("bf16-mixed" if pays else "float32")
    # the choice is on the record: what was measured, against which threshold, and what it chose
    assert record == {
        "dtype": chosen,
        "chosen_by": "auto",
        "checked_fast_paths": ["bf16-mixed"],
        "native_bf16": native,
        "bf16_speedup": speedup if native else None,  # measured only where bfloat16 is native
        "bf16_threshold": 1.25,
    }


def test_the_bfloat16_speedup_is_measured_once_without_touching_the_random_stream() -> None:
    import threading

    import torch

    from capgate.local import _cpu

    _cpu._BF16_SPEEDUP.clear()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    found: list[float] = []
    threads = [threading.Thread(target=lambda: found.append(_cpu.bf16_speedup())) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.equal(torch.rand(3), expected)  # a user's seeded stream is left where it was
    assert len(set(found)) == 1  # measured once, under the lock, however many ask at once
    assert 0.01 < found[0] < 100.0  # a ratio of two real timings, whichever way it goes here


@pytest.mark.parametrize(
    ("native", "record", "expected"),
    [
        (True, passed_check(), "bfloat16"),
        (False, passed_check(), "float32"),  # bfloat16 does not pay off here: float32
        (True, None, "float32"),  # never checked: float32
        (True, passed_check(max_abs_dp=0.02), "float32"),  # checked and failed
        (True, passed_check(brier_fast=0.0207), "float32"),
        # bfloat16 failed its check, the mixed pass passed its own: the mixed pass.
        (
            True,
            {"bfloat16": passed_check(max_abs_dp=0.02), "bf16-mixed": passed_check(dtype="bf16-mixed")},
            "bf16-mixed",
        ),
        (False, {"bf16-mixed": passed_check(dtype="bf16-mixed")}, "float32"),  # needs bfloat16 to pay off
        (True, {"bf16-mixed": passed_check(dtype="bf16-mixed", max_abs_dp=0.011)}, "float32"),
        (True, {"bfloat16": passed_check(), "bf16-mixed": passed_check(dtype="bf16-mixed")}, "bfloat16"),
    ],
)
def test_auto_picks_a_fast_path_only_where_bfloat16_pays_off_and_checked(
    monkeypatch: pytest.MonkeyPatch, native: bool, record: dict[str, Any] | None, expected: str
) -> None:
    monkeypatch.setattr("capgate.local.models.native_bf16_cpu", lambda: native)
    monkeypatch.setattr("capgate.local.models.bf16_speedup", lambda: 2.4)
    checks = record if record is None or "n" not in record else {"bfloat16": record}
    probe = probe_with({} if checks is None else {"fast_path": checks})
    assert _feature_dtype("auto", "cpu", probe)[0] == expected
    # an explicit dtype wins, and says so
    assert _feature_dtype("float32", "cpu", probe) == (
        "float32",
        {"dtype": "float32", "chosen_by": "setting"},
    )
    assert _feature_dtype("auto", "cuda", probe)[0] == "auto"  # the model's own on CUDA


@pytest.mark.parametrize(
    "record",
    [
        ["bfloat16"],
        {"bfloat16": {"dtype": "bfloat16"}},
        {"float16": passed_check()},
        {"bfloat16": passed_check(n=0)},
    ],
)
def test_a_malformed_check_record_is_refused(record: Any) -> None:
    with pytest.raises(DataError, match="fast_path"):
        recorded_fast_paths(probe_with({"fast_path": record}))


def test_a_check_is_computed_and_recorded() -> None:
    check = FastPathCheck.of([0.1, 0.5, 0.9], [0.1, 0.52, 0.9], [0.0, 0.5, 1.0], dtype="bfloat16", split="s")
    assert check.n == 3
    assert check.max_abs_dp == pytest.approx(0.02)
    assert not check.passed
    probe = probe_with({"brier": 0.1})
    check.record(probe)
    assert recorded_fast_paths(probe) == {"bfloat16": check}
    assert probe.validation_["brier"] == 0.1
    with pytest.raises(ValueError, match="p_fast"):
        FastPathCheck.of([0.1], [1.5], [0.0], dtype="bfloat16", split="s")


# ---------------------------------------------------------------------- the embedded model


@pytest.mark.slow
def test_fast_path_estimates_match_float32_on_a_fixed_sample(default_model_dir: Any) -> None:
    """bfloat16 tracks float32 closely on a fixed sample; the shipped probe records its own check
    on its whole held-out split (the automatic choice follows it: the next test)."""
    from capgate.demo.live import demo_questions
    from capgate.loading import default_probe_path, load_estimator

    questions = demo_questions(12, seed=3)
    prompts = [q.prompt for q in questions]
    reference = load_estimator("default", device="cpu", dtype="float32", batch_size=12)
    fast = ProbeEstimator(
        HiddenStateFeaturizer(reference.featurizer.loaded, layers=[26], batch_size=12, dtype="bfloat16"),
        reference.probe,
        ignore_spec_fields=["dtype"],
    )
    a, b = reference.estimate(prompts), fast.estimate(prompts)
    assert {e.details["dtype"] for e in a} == {"float32"}
    assert {e.details["dtype"] for e in b} == {"bfloat16"}
    check = FastPathCheck.of([e.p for e in a], [e.p for e in b], [q.mu_hat for q in questions],
                             dtype="bfloat16", split="12 held-out")  # fmt: skip
    # bfloat16's envelope on this probe (the whole split: 0.018, bench/RESULTS.md): close, yet
    # wider than the 0.01 the automatic choice asks for.
    assert 0 < check.max_abs_dp <= 0.03
    assert abs(check.brier_delta) <= 0.002
    shipped = recorded_fast_paths(LinearProbe.load(default_probe_path()))
    assert shipped["bfloat16"].n == 356  # checked on the whole held-out split
    # The mixed pass (MLP matmuls in bfloat16) is within the automatic choice's tolerance.
    mixed = ProbeEstimator(
        HiddenStateFeaturizer(reference.featurizer.loaded, layers=[26], batch_size=12, dtype="bf16-mixed"),
        reference.probe,
        ignore_spec_fields=["dtype"],
    )
    c = mixed.estimate(prompts)
    assert {e.details["dtype"] for e in c} == {"bf16-mixed"}
    mixed_check = FastPathCheck.of([e.p for e in a], [e.p for e in c], [q.mu_hat for q in questions],
                                   dtype="bf16-mixed", split="12 held-out")  # fmt: skip
    assert 0 < mixed_check.max_abs_dp <= 0.01
    assert mixed_check.passed
    assert shipped["bf16-mixed"].n == 356


@pytest.mark.slow
def test_a_cpu_where_bfloat16_does_not_pay_off_falls_back_to_float32(
    default_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capgate.loading import default_probe_path, load_estimator

    shipped = recorded_fast_paths(LinearProbe.load(default_probe_path()))
    passed = [fast for fast in ("bfloat16", "bf16-mixed") if fast in shipped and shipped[fast].passed]
    monkeypatch.setattr("capgate.local.models.bf16_speedup", lambda: 2.4)  # measured faster
    for native in (False, True):
        monkeypatch.setattr("capgate.local.models.native_bf16_cpu", lambda native=native: native)
        estimator = load_estimator("default", device="cpu")
        expected = passed[0] if native and passed else "float32"
        assert estimator.featurizer.dtype == expected
        details = estimator.estimate_one("What is 2+3?").details
        assert details["dtype"] == expected
        assert details["fast_path"]["dtype"] == expected  # and how it was chosen is on the record
        assert details["fast_path"]["bf16_speedup"] == (2.4 if native else None)
