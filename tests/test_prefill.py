"""The shared prefill: the probe's forward pass feeds the answer, with the same tokens and estimates.

On the tiny model: the shared path gives token for token what an ungated call gives (greedy,
seeded sampling, n > 1, batches of prompts of different lengths), the same estimate as the
standalone probe, and runs no second pass over the prompt; a miss takes the normal path; the
cache stays bounded. One slow test does the same on the real default model through ``guard``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from capgate import SamplingParams, guard
from capgate.adapters.backends.transformers import TransformersBackend, load_backend
from capgate.estimators import LinearProbe, ProbeEstimator
from capgate.loading import FAST_PATH_MAX_ABS_DP
from capgate.local.hidden_states import HiddenStateFeaturizer
from capgate.local.models import LoadedModel
from capgate.local.prefill import PrefillCache, PrefillEntry, prefill_cache
from capgate.policies import Policy

PROMPTS: list[Any] = [
    "What is 2+3?",
    "Name a colour that is not red, please, and say why.",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
]
PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=10),
    "sampled-n3": SamplingParams(temperature=0.9, top_p=0.95, max_tokens=10, n=3, seed=7),
    "logprobs": SamplingParams(temperature=0.7, max_tokens=6, seed=3, logprobs=True, top_logprobs=2),
}
ANSWER = Policy.from_yaml_text(
    "version: 1\nname: a\nbands:\n  - action: answer\non_degraded: answer\n", source="tests"
)
ABSTAIN = Policy.from_yaml_text(
    "version: 1\nname: b\nbands:\n  - action: abstain\non_degraded: abstain\n", source="tests"
)


@dataclass
class Passes:
    """Forward passes the model really ran, by how many tokens they read."""

    lengths: list[int] = field(default_factory=list)

    @property
    def prompt(self) -> int:
        """Passes over more than one token: prefills."""
        return sum(n > 1 for n in self.lengths)


@contextmanager
def counting(loaded: LoadedModel) -> Iterator[Passes]:
    passes = Passes()

    def hook(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        passes.lengths.append(int(kwargs["input_ids"].shape[1]))

    handle = loaded.model.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield passes
    finally:
        handle.remove()


def same_tokens(a: list[list[Any]], b: list[list[Any]]) -> None:
    assert [[(g.text, g.n_tokens, g.finish_reason) for g in row] for row in a] == [
        [(g.text, g.n_tokens, g.finish_reason) for g in row] for row in b
    ]
    for row_a, row_b in zip(a, b, strict=True):
        for g, h in zip(row_a, row_b, strict=True):
            assert g.mean_logprob == pytest.approx(h.mean_logprob, abs=1e-5)
            assert [t.token for t in g.tokens or []] == [t.token for t in h.tokens or []]


@pytest.fixture
def shared(tiny_model: LoadedModel) -> Iterator[PrefillCache]:
    cache = prefill_cache(tiny_model)
    cache.clear()
    yield cache
    cache.clear()


@pytest.fixture
def backend(tiny_model: LoadedModel, shared: PrefillCache) -> TransformersBackend:
    return TransformersBackend(tiny_model, max_batch_size=4)


@pytest.fixture(scope="module")
def probe(tiny_model: LoadedModel) -> ProbeEstimator:
    queries = [f"Question {i}: what is {i} + {i * 3}?" for i in range(24)]
    mu = np.linspace(0.05, 0.95, len(queries))
    probe = LinearProbe(lr=0.05, validation_fraction=None, max_epochs=20)
    return ProbeEstimator(HiddenStateFeaturizer(tiny_model), probe).fit(queries, mu)


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
def test_shared_prefill_gives_the_ungated_tokens_without_a_second_prefill(
    tiny_model: LoadedModel, backend: TransformersBackend, shared: PrefillCache, params: SamplingParams
) -> None:
    plain = backend.generate(PROMPTS, params)  # nothing cached: the normal path
    HiddenStateFeaturizer(tiny_model).transform(PROMPTS)
    assert len(shared) == len(PROMPTS)
    with counting(tiny_model) as passes:
        reused = backend.generate(PROMPTS, params)
    same_tokens(reused, plain)
    assert passes.prompt == 0, passes.lengths
    assert passes.lengths  # the answers' tokens were still computed


def test_estimates_match_the_standalone_probe(
    probe: ProbeEstimator, backend: TransformersBackend, shared: PrefillCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_cache = [e.p for e in probe.estimate(PROMPTS)]
    assert len(shared) == len(PROMPTS)
    monkeypatch.setattr(shared, "enabled", False)
    alone = [e.p for e in probe.estimate(PROMPTS)]
    assert with_cache == pytest.approx(alone, abs=1e-6)


def test_a_miss_takes_the_normal_path(
    tiny_model: LoadedModel, backend: TransformersBackend, shared: PrefillCache
) -> None:
    params = PARAMS["greedy"]
    plain = backend.generate([PROMPTS[0]], params)
    HiddenStateFeaturizer(tiny_model).transform([PROMPTS[1]])
    with counting(tiny_model) as passes:
        other = backend.generate([PROMPTS[0]], params)
    same_tokens(other, plain)
    assert passes.prompt == 1
    # A batch with one prompt missing also runs its prefill.
    with counting(tiny_model) as passes:
        backend.generate(PROMPTS[:2], params)
    assert passes.prompt == 1


def test_guard_answers_from_the_probes_prefill(
    tiny_model: LoadedModel, probe: ProbeEstimator, backend: TransformersBackend
) -> None:
    params = PARAMS["sampled-n3"]

    def ask(prompt: str) -> list[str]:
        return [g.text for g in backend.generate([prompt], params)[0]]

    expected = ask(PROMPTS[1])
    with counting(tiny_model) as passes:
        got = guard(policy=ANSWER, estimator=probe)(ask)(PROMPTS[1])
    assert got == expected
    assert passes.prompt == 1  # the probe's, and no other

    with counting(tiny_model) as passes:
        blocked = guard(policy=ABSTAIN, estimator=probe)(ask)(PROMPTS[0])
    assert blocked.action == "abstain"
    assert len(passes.lengths) == 1  # the probe's pass; nothing generated


def test_chat_model_reuses_the_gates_prefill(
    tiny_model: LoadedModel, probe: ProbeEstimator, backend: TransformersBackend
) -> None:
    from langchain_core.messages import HumanMessage

    from capgate import Gate
    from capgate.adapters.agents.chat_model import CapgateChatModel

    chat = CapgateChatModel(backend=backend, params=SamplingParams(temperature=0.0, max_tokens=8))
    messages = [HumanMessage("What is 7 times 6?")]
    expected = chat.invoke(messages).content
    with counting(tiny_model) as passes:
        Gate(policy=ANSWER, estimator=probe).assess([{"role": "user", "content": "What is 7 times 6?"}])
        got = chat.invoke(messages).content
    assert got == expected
    assert passes.prompt == 1


def _entry(nbytes: int) -> PrefillEntry:
    return PrefillEntry.of([torch.zeros(nbytes // 4)], [], torch.zeros(0))


def test_the_cache_is_bounded() -> None:
    cache = PrefillCache(max_entries=2, max_bytes=1000)
    cache.put([1], _entry(40))
    assert len(cache) == 0  # disabled until a consumer exists
    cache.enable()
    for ids in ([1], [2], [3]):
        cache.put(ids, _entry(40))
    assert cache.get([1]) is None
    assert cache.get([3]) is not None
    assert len(cache) == 2
    cache.put([4], _entry(800))
    assert cache.get([2]) is None
    assert cache.nbytes <= 1000
    cache.put([5], _entry(2000))  # too big alone: never kept
    assert cache.get([5]) is None
    expiring = PrefillCache(ttl_s=0.0)
    expiring.enable()
    expiring.put([1], _entry(40))
    assert expiring.get([1]) is None
    assert expiring.nbytes == 0


def test_a_featurizer_keeps_nothing_without_a_consumer(tiny_model_dir: Any) -> None:
    from capgate.local.models import load_model

    loaded = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")  # another identity
    HiddenStateFeaturizer(loaded).transform(PROMPTS)
    assert len(prefill_cache(loaded)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_default_model_guard_matches_ungated_and_standalone(default_model_dir: Any, dtype: str) -> None:
    from capgate import load_estimator

    backend = load_backend("default", device="cpu")  # loaded apart from the estimator's copy
    estimator = load_estimator("default", device="cpu", dtype=dtype)  # type: ignore[arg-type]
    cache = prefill_cache(estimator.featurizer.loaded)  # type: ignore[attr-defined]
    assert cache is prefill_cache(backend.loaded)
    prompts = ["What is 17 * 23?", "Name the capital of France."]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=0.7, max_tokens=24, n=2, seed=5),
    ):
        cache.clear()

        def ask(prompt: str, params: SamplingParams = params) -> list[str]:
            return [g.text for g in backend.generate([prompt], params)[0]]

        for prompt in prompts:
            expected = ask(prompt)
            with counting(backend.loaded) as passes:
                got = guard(policy=ANSWER, estimator=estimator)(ask)(prompt)
            assert got == expected
            assert passes.prompt == 0  # the estimator's copy ran the only prefill
    shared = estimator.estimate(prompts)
    cache.enabled = False
    try:
        alone = estimator.estimate(prompts)
    finally:
        cache.enabled = True
    # The shared prefill is the answer model's own pass (float32 here), and the estimate says so;
    # alone, the estimator runs its reader's pass: the same numbers when that is float32 too, and
    # within the fast path's checked tolerance when it is a faster one (`auto` picks bf16-mixed on
    # CPUs where bfloat16 pays off, measured, and the shipped probe's check passes).
    reader_dtype = estimator.featurizer.dtype  # type: ignore[attr-defined]
    assert {e.details["dtype"] for e in shared} == {"float32"}
    assert {e.details["dtype"] for e in alone} == {reader_dtype}
    tolerance = 1e-6 if reader_dtype == "float32" else FAST_PATH_MAX_ABS_DP
    assert [e.p for e in shared] == pytest.approx([e.p for e in alone], abs=tolerance)
