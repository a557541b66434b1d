"""LinearProbe and ProbeEstimator: learning, training options, persistence, spec matching."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from _probe_helpers import (
    CharCountFeaturizer,
    linear_capability,
    random_queries,
    sampled_mu_hat,
    sigmoid,
)

from capgate import DataError, NotFittedError, ProbeMismatchError
from capgate.core.backend import Prompt
from capgate.estimators import ConstantPrior, LinearProbe, ProbeEstimator, UniformRandom
from capgate.estimators.probe import LR_GRID, check_spec_match
from capgate.metrics import capability_brier

# Most tests train for a few epochs on purpose; the "still improving" warning has its own test.
pytestmark = pytest.mark.filterwarnings("ignore:LinearProbe stopped at max_epochs:RuntimeWarning")


def linear_problem(
    n: int, d: int, seed: int, *, k: int = 10, loc: float = 0.0, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, true µ = sigmoid(2 x·w) and sampled µ̂ = Binomial(k, µ) / k."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    mu = sigmoid(2.0 * z @ w - 0.3)
    X = (z * scale + loc).astype(np.float32)
    return X, mu, sampled_mu_hat(mu, k, seed + 1)


# --------------------------------------------------------------------------- learning


def test_probe_learns_a_linear_capability_from_soft_targets() -> None:
    X, mu, mu_hat = linear_problem(1200, 20, 0)
    probe = LinearProbe(lr=1e-2).fit(X[:1000], mu_hat[:1000])
    p = probe.predict(X[1000:])
    prior = ConstantPrior().fit(X[:1000], mu_hat[:1000]).predict(X[1000:])
    uniform = UniformRandom().predict(X[1000:])
    probe_brier = capability_brier(p, mu[1000:])
    assert probe_brier < 0.005  # against the true µ: the probe recovers it closely
    assert probe_brier < capability_brier(prior, mu[1000:]) / 10
    assert probe_brier < capability_brier(uniform, mu[1000:]) / 20
    # the learned direction is the true one
    rng = np.random.default_rng(0)
    rng.normal(size=(1200, 20))
    w_true = rng.normal(size=20)
    cosine = probe.coef_ @ w_true / (np.linalg.norm(probe.coef_) * np.linalg.norm(w_true))
    assert cosine > 0.98


def test_probe_estimator_learns_capability_of_queries() -> None:
    featurizer = CharCountFeaturizer(dim=12)
    queries = random_queries(1400, 0)
    mu = linear_capability(featurizer.transform(queries), 1)
    mu_hat = sampled_mu_hat(mu, 10, 2)
    estimator = ProbeEstimator(featurizer, LinearProbe(lr=1e-2)).fit(queries[:1000], mu_hat[:1000])
    p = np.array([e.p for e in estimator.estimate(queries[1000:])])
    brier = capability_brier(p, mu[1000:])
    assert brier < 0.005
    assert brier < capability_brier(np.full(400, mu_hat[:1000].mean()), mu[1000:]) / 10


def test_soft_targets_are_learned_as_probabilities_not_labels() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 5))
    probe = LinearProbe(lr=1e-2, validation_fraction=None, max_epochs=30).fit(X, np.full(400, 0.3))
    np.testing.assert_allclose(probe.predict(X), 0.3, atol=0.03)


def test_z_scoring_makes_the_probe_invariant_to_feature_offset_and_scale() -> None:
    X, _, mu_hat = linear_problem(500, 8, 4)
    shifted = X.astype(np.float64) * 250.0 + 1000.0
    a = LinearProbe(lr=1e-2).fit(X, mu_hat)
    b = LinearProbe(lr=1e-2).fit(shifted, mu_hat)
    np.testing.assert_allclose(a.predict(X), b.predict(shifted), atol=1e-4)
    np.testing.assert_allclose(
        b.scale_, X.astype(np.float64)[b_train_rows(b, 500)].std(axis=0) * 250.0, rtol=1e-5
    )


def b_train_rows(probe: LinearProbe, n: int) -> np.ndarray:
    """Rows of the training split a seeded validation_fraction leaves (mirrors LinearProbe.fit)."""
    n_val = round(n * probe.validation_fraction)  # type: ignore[operator]
    order = np.random.default_rng(probe.random_state).permutation(n)
    return np.sort(order[n_val:])


def test_z_score_statistics_come_from_the_training_split() -> None:
    X, _, mu_hat = linear_problem(300, 4, 5, loc=7.0, scale=3.0)
    probe = LinearProbe(lr=1e-2, max_epochs=5).fit(X, mu_hat)
    rows = b_train_rows(probe, 300)
    np.testing.assert_allclose(probe.mean_, X.astype(np.float64)[rows].mean(axis=0))
    np.testing.assert_allclose(probe.scale_, X.astype(np.float64)[rows].std(axis=0))
    assert probe.training_["n"] == len(rows) == 270
    assert probe.validation_["n"] == 30
    assert probe.training_["mean_mu_hat"] == pytest.approx(mu_hat[rows].mean())


def test_constant_features_get_unit_scale() -> None:
    X, _, mu_hat = linear_problem(200, 3, 6)
    X = np.hstack([X, np.full((200, 1), 5.0, dtype=np.float32)])
    probe = LinearProbe(lr=1e-2, max_epochs=5).fit(X, mu_hat)
    assert probe.scale_ is not None
    assert probe.scale_[-1] == 1.0
    assert np.all(np.isfinite(probe.predict(X)))


def test_without_z_scoring_no_statistics_are_kept() -> None:
    X, _, mu_hat = linear_problem(200, 3, 6)
    probe = LinearProbe(standardize=False, lr=1e-2, max_epochs=5).fit(X, mu_hat)
    assert probe.mean_ is None
    assert probe.scale_ is None


# --------------------------------------------------------------------------- training options


def test_early_stopping_on_noise_keeps_an_early_checkpoint() -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=(200, 30))
    y = rng.uniform(size=200)  # unrelated to X: more training only overfits
    probe = LinearProbe(lr=5e-2, patience=3, max_epochs=200).fit(X, y)
    assert probe.n_epochs_ < 200
    assert probe.n_epochs_ - probe.best_epoch_ == 3
    # never worse on validation than the constant prior it starts from (epoch 0)
    rows = b_train_rows(probe, 200)
    val = np.setdiff1d(np.arange(200), rows)
    prior = np.full(val.size, y[rows].mean())
    assert probe.validation_["brier"] <= np.mean((prior - y[val]) ** 2) + 1e-6


def test_explicit_validation_set_is_used() -> None:
    X, _, mu_hat = linear_problem(300, 4, 9)
    probe = LinearProbe(lr=1e-2, max_epochs=10).fit(X[:200], mu_hat[:200], X_val=X[200:], y_val=mu_hat[200:])
    assert probe.training_["n"] == 200
    assert probe.validation_["n"] == 100
    p = probe.predict(X[200:])
    assert probe.validation_["brier"] == pytest.approx(np.mean((p - mu_hat[200:]) ** 2))


def test_no_validation_trains_max_epochs_and_keeps_the_last() -> None:
    X, _, mu_hat = linear_problem(100, 4, 10)
    probe = LinearProbe(lr=1e-2, max_epochs=7, validation_fraction=None).fit(X, mu_hat)
    assert probe.n_epochs_ == probe.best_epoch_ == 7
    assert probe.validation_ == {}
    assert probe.lr_sweep_ == {}
    assert probe.training_["n"] == 100


def test_seed_controls_the_fit() -> None:
    X, _, mu_hat = linear_problem(300, 6, 11)
    a = LinearProbe(lr=1e-2, max_epochs=10, random_state=1).fit(X, mu_hat)
    b = LinearProbe(lr=1e-2, max_epochs=10, random_state=1).fit(X, mu_hat)
    c = LinearProbe(lr=1e-2, max_epochs=10, random_state=2).fit(X, mu_hat)
    assert a.coef_ is not None
    assert b.coef_ is not None
    assert c.coef_ is not None
    assert a.coef_.tobytes() == b.coef_.tobytes()
    assert a.coef_.tobytes() != c.coef_.tobytes()


def test_lr_sweep_keeps_the_rate_with_the_lowest_validation_loss() -> None:
    X, _, mu_hat = linear_problem(400, 6, 12)
    probe = LinearProbe(lr=[1e-5, 1e-2], max_epochs=20).fit(X, mu_hat)
    assert set(probe.lr_sweep_) == {1e-5, 1e-2}
    assert probe.lr_ == min(probe.lr_sweep_, key=probe.lr_sweep_.__getitem__)
    assert probe.lr_ == 1e-2  # 20 epochs at 1e-5 barely move from the prior
    assert probe.validation_["bce"] == pytest.approx(probe.lr_sweep_[1e-2], abs=1e-5)
    assert probe.lr == [1e-5, 1e-2]  # the setting itself is left as given


def test_lr_sweep_default_is_the_paper_grid() -> None:
    X, _, mu_hat = linear_problem(100, 3, 13)
    probe = LinearProbe(max_epochs=3)
    assert probe.lr == "sweep"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 3 epochs at these rates do not converge
        probe.fit(X, mu_hat)
    assert tuple(probe.lr_sweep_) == LR_GRID == (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
    assert probe.lr_ in LR_GRID


def test_warns_when_stopped_while_still_improving() -> None:
    X, _, mu_hat = linear_problem(300, 6, 14)
    with pytest.warns(RuntimeWarning, match="max_epochs=2 while the validation loss was still falling"):
        LinearProbe(lr=1e-5, max_epochs=2).fit(X, mu_hat)


def test_divergence_is_reported_and_a_finite_checkpoint_kept() -> None:
    X, _, mu_hat = linear_problem(200, 4, 15, scale=1e3)
    with pytest.warns(RuntimeWarning, match="diverged"):
        probe = LinearProbe(standardize=False, lr=1e3, max_epochs=50).fit(X, mu_hat)
    assert np.all(np.isfinite(probe.predict(X)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"lr": 0.0}, "`lr` must be"),
        ({"lr": "fast"}, "`lr` must be"),
        ({"lr": []}, "`lr` must be"),
        ({"batch_size": 0}, "`batch_size` must be a positive integer; got 0"),
        ({"validation_fraction": 1.0}, r"`validation_fraction` must be a number in \(0, 1\); got 1.0"),
        ({"weight_decay": -1.0}, "`weight_decay` must be a non-negative"),
    ],
)
def test_bad_settings_are_rejected_at_fit(settings: dict[str, Any], message: str) -> None:
    probe = LinearProbe(**settings)  # the constructor only stores
    X, _, mu_hat = linear_problem(50, 2, 16)
    with pytest.raises(ValueError, match=message):
        probe.fit(X, mu_hat)


def test_bad_data_is_rejected_with_what_and_where() -> None:
    X, _, mu_hat = linear_problem(50, 2, 17)
    with pytest.raises(ValueError, match=r"`y`\[4\] must be a finite number in \[0, 1\]; got nan"):
        LinearProbe().fit(X, np.where(np.arange(50) == 4, np.nan, mu_hat))
    bad = X.copy()
    bad[7, 1] = np.inf
    with pytest.raises(ValueError, match=r"non-finite values in rows \[7\]"):
        LinearProbe().fit(bad, mu_hat)
    with pytest.raises(ValueError, match="2-D"):
        LinearProbe().fit(X[:, 0], mu_hat)
    with pytest.raises(ValueError, match="give both"):
        LinearProbe().fit(X, mu_hat, X_val=X)
    with pytest.raises(ValueError, match=r"sweep .* needs validation data"):
        LinearProbe(validation_fraction=None).fit(X, mu_hat)
    with pytest.raises(ValueError, match="empty training or validation split"):
        LinearProbe().fit(X[:3], mu_hat[:3])
    with pytest.raises(ValueError, match="feature_spec says dim=5 but X has 2 features"):
        LinearProbe().fit(X, mu_hat, feature_spec={"model_id": "m", "dim": 5})
    probe = LinearProbe(lr=1e-2, max_epochs=2).fit(X, mu_hat)
    with pytest.raises(ValueError, match="X has 3 features but the probe was fitted on 2"):
        probe.predict(np.zeros((1, 3)))


def test_repr_shows_changed_settings() -> None:
    assert repr(LinearProbe()) == "LinearProbe()"
    assert repr(LinearProbe(lr=0.1, patience=3)) == "LinearProbe(lr=0.1, patience=3)"


# --------------------------------------------------------------------------- persistence


def fitted_estimator(featurizer: CharCountFeaturizer | None = None) -> ProbeEstimator:
    featurizer = featurizer or CharCountFeaturizer()
    queries = random_queries(200, 20)
    mu_hat = sampled_mu_hat(linear_capability(featurizer.transform(queries), 21), 5, 22)
    probe = LinearProbe(lr=2e-2, max_epochs=15)
    return ProbeEstimator(featurizer, probe).fit(queries, mu_hat, source="labels/train.jsonl")


def test_saved_probe_is_safetensors_and_json_with_full_metadata(tmp_path: Path) -> None:
    import safetensors.numpy

    estimator = fitted_estimator()
    estimator.save(tmp_path / "probe")
    assert sorted(p.name for p in (tmp_path / "probe").iterdir()) == ["probe.json", "probe.safetensors"]
    tensors = safetensors.numpy.load_file(str(tmp_path / "probe" / "probe.safetensors"))
    assert set(tensors) == {"weight", "bias", "mean", "scale"}
    probe = estimator.probe
    assert tensors["weight"].tobytes() == probe.coef_.tobytes()  # type: ignore[union-attr]
    meta = json.loads((tmp_path / "probe" / "probe.json").read_text())
    spec = estimator.featurizer.spec
    assert meta["model_id"] == "tests/char-counts"
    assert meta["weights_fingerprint"] == spec["weights_fingerprint"]
    assert meta["dim"] == 12
    assert meta["feature_spec"] == spec
    assert meta["training"] == {
        "n": 180,
        "mean_mu_hat": pytest.approx(probe.training_["mean_mu_hat"]),
        "source": "labels/train.jsonl",
    }
    assert set(meta["validation"]) == {"n", "bce", "brier"}
    assert meta["lr"] == 2e-2
    assert meta["settings"]["lr"] == 2e-2
    assert len(meta["weights_sha256"]) == 64


def test_no_pickle_anywhere_in_the_saved_files(tmp_path: Path) -> None:
    fitted_estimator().save(tmp_path / "probe")
    for path in (tmp_path / "probe").iterdir():
        assert not path.read_bytes().startswith(b"\x80")  # pickle protocol marker
    json.loads((tmp_path / "probe" / "probe.json").read_text())


def test_tampered_weights_are_refused(tmp_path: Path) -> None:
    fitted_estimator().save(tmp_path / "probe")
    weights = tmp_path / "probe" / "probe.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="does not match the SHA-256"):
        LinearProbe.load(tmp_path / "probe")


def test_missing_or_foreign_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        LinearProbe.load(tmp_path / "nothing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "probe.json").write_text('{"format": "something-else"}')
    with pytest.raises(
        DataError, match=r"expected a saved 'capgate\.linear_probe'; got format 'something-else'"
    ):
        LinearProbe.load(tmp_path / "other")
    fitted_estimator().save(tmp_path / "probe")
    (tmp_path / "probe" / "probe.safetensors").unlink()
    with pytest.raises(DataError, match="weights file not found"):
        LinearProbe.load(tmp_path / "probe")


def test_newer_format_is_refused(tmp_path: Path) -> None:
    fitted_estimator().save(tmp_path / "probe")
    meta_path = tmp_path / "probe" / "probe.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 99
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="newer capgate"):
        LinearProbe.load(tmp_path / "probe")


# --------------------------------------------------------------------------- spec matching


def test_load_accepts_an_equal_spec(tmp_path: Path) -> None:
    estimator = fitted_estimator()
    estimator.save(tmp_path / "probe")
    loaded = ProbeEstimator.load(tmp_path / "probe", CharCountFeaturizer())
    queries = random_queries(10, 99)
    np.testing.assert_array_equal(loaded.predict(queries), estimator.predict(queries))


def test_another_source_is_refused_unless_explicitly_ignored(tmp_path: Path) -> None:
    fitted_estimator().save(tmp_path / "probe")
    other_engine = CharCountFeaturizer(source="vllm")
    with pytest.raises(ProbeMismatchError, match='source: probe has "tests", featurizer has "vllm"'):
        ProbeEstimator.load(tmp_path / "probe", other_engine)
    loaded = ProbeEstimator.load(tmp_path / "probe", other_engine, ignore_spec_fields=["source"])
    assert loaded.estimate(["q"])[0].usable
    with pytest.raises(ProbeMismatchError):  # ignoring one field does not ignore the others
        ProbeEstimator.load(
            tmp_path / "probe", CharCountFeaturizer(seed=3, source="vllm"), ignore_spec_fields=["source"]
        )


def test_load_refuses_a_featurizer_with_other_weights(tmp_path: Path) -> None:
    fitted_estimator().save(tmp_path / "probe")
    other = CharCountFeaturizer(seed=1)  # same shape, different "weights"
    with pytest.raises(ProbeMismatchError) as info:
        ProbeEstimator.load(tmp_path / "probe", other)
    message = str(info.value)
    assert "weights_fingerprint" in message
    assert CharCountFeaturizer().spec["weights_fingerprint"] in message  # the probe's side
    assert other.spec["weights_fingerprint"] in message  # the featurizer's side


def test_load_refuses_other_layers_pooling_or_dim(tmp_path: Path) -> None:
    fitted_estimator().save(tmp_path / "probe")

    class Relayered(CharCountFeaturizer):
        @property
        def spec(self) -> Any:
            return {**super().spec, "layers": [-1], "pooling": "mean"}

    with pytest.raises(ProbeMismatchError, match=r"layers: probe has \[0\], featurizer has \[-1\]"):
        ProbeEstimator.load(tmp_path / "probe", Relayered())
    with pytest.raises(ProbeMismatchError, match="dim: probe has 12, featurizer has 8"):
        ProbeEstimator.load(tmp_path / "probe", CharCountFeaturizer(dim=8))


def test_pydantic_specs_are_recorded_and_matched(tmp_path: Path) -> None:
    featurizer = CharCountFeaturizer(pydantic_spec=True)
    estimator = fitted_estimator(featurizer)
    assert estimator.probe.feature_spec_ == featurizer.spec.model_dump(mode="json")
    estimator.save(tmp_path / "probe")
    ProbeEstimator.load(tmp_path / "probe", CharCountFeaturizer(pydantic_spec=True))
    ProbeEstimator.load(tmp_path / "probe", CharCountFeaturizer())  # same fields as a plain mapping
    with pytest.raises(ProbeMismatchError):
        ProbeEstimator.load(tmp_path / "probe", CharCountFeaturizer(pydantic_spec=True, seed=5))


def test_a_probe_without_a_spec_cannot_serve_a_featurizer(tmp_path: Path) -> None:
    X, _, mu_hat = linear_problem(100, 12, 23)
    LinearProbe(lr=1e-2, max_epochs=3).fit(X, mu_hat).save(tmp_path / "bare")
    with pytest.raises(ProbeMismatchError, match="records no feature spec"):
        ProbeEstimator.load(tmp_path / "bare", CharCountFeaturizer())
    with pytest.raises(ProbeMismatchError, match="records no feature spec"):
        ProbeEstimator(CharCountFeaturizer(), LinearProbe.load(tmp_path / "bare")).estimate(["q"])


def test_check_spec_match_reports_fields_only_one_side_has() -> None:
    with pytest.raises(ProbeMismatchError, match="revision: only the featurizer records it"):
        check_spec_match({"model_id": "m", "dim": 2}, {"model_id": "m", "dim": 2, "revision": "abc"})


# --------------------------------------------------------------------------- estimates


class FlakyFeaturizer(CharCountFeaturizer):
    """Raises on any batch with a query containing "boom"; NaN features for "nan"."""

    def transform(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float32]:
        texts = [q if isinstance(q, str) else q[-1]["content"] for q in queries]
        if any("boom" in t for t in texts):
            raise RuntimeError("CUDA out of memory")
        out = super().transform(queries)
        out[[i for i, t in enumerate(texts) if "nan" in t]] = np.nan
        return out


def test_estimate_fails_closed_per_query() -> None:
    clean = fitted_estimator()
    flaky = ProbeEstimator(FlakyFeaturizer(), clean.probe)
    queries = ["what is two plus two?", "boom goes the query", "a nan query", "another fine one"]
    estimates = flaky.estimate(queries)
    assert [e.usable for e in estimates] == [True, False, False, True]
    assert estimates[1].degraded
    assert estimates[1].reason == "featurizer failed: RuntimeError: CUDA out of memory"
    assert estimates[2].reason == "featurizer returned non-finite features"
    assert {e.method for e in estimates} == {"probe"}
    reference = clean.predict([queries[0], queries[3]])
    assert [estimates[0].p, estimates[3].p] == reference.tolist()


def test_estimate_reports_cost_one_forward_pass_per_query() -> None:
    estimator = fitted_estimator()
    estimates = estimator.estimate(random_queries(4, 30))
    for e in estimates:
        assert e.cost.forward_passes == 1
        assert e.cost.latency_s >= 0
        assert e.details["batch_size"] == 4
    assert estimator.featurizer.calls[-1] == 4  # type: ignore[attr-defined]  # one batched call


def test_estimate_accepts_chat_queries() -> None:
    estimator = fitted_estimator()
    chat: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2+2?"}]
    assert estimator.estimate([chat])[0].p == estimator.estimate(["what is 2+2?"])[0].p


def test_unfitted_probe_estimator_raises() -> None:
    with pytest.raises(NotFittedError, match="ProbeEstimator"):
        ProbeEstimator(CharCountFeaturizer(), LinearProbe()).estimate(["q"])


def test_featurizer_with_wrong_width_is_misuse() -> None:
    estimator = fitted_estimator()

    class Wide(CharCountFeaturizer):
        @property
        def spec(self) -> Any:
            return CharCountFeaturizer().spec  # lies about its output

    liar = ProbeEstimator(Wide(dim=13), estimator.probe)
    with pytest.raises(ProbeMismatchError, match="returned 13 features; the probe expects 12"):
        liar.estimate(["q"])
