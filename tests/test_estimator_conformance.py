"""One conformance suite over every fitted estimator (scikit-learn's check_estimator, in small).

To cover a new estimator, add one ``Case`` line to ``CASES``: how to build it unfitted, what data
it eats (features, queries or confidences), how to load what it saved, and its method name if it
is a CapabilityEstimator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _fakes import ScriptedBackend, gen
from _probe_helpers import CharCountFeaturizer, linear_capability, random_queries, sampled_mu_hat

from capgate import CapabilityEstimator, Estimate, NotFittedError
from capgate.estimators import (
    Consistency,
    ConstantPrior,
    FallbackChain,
    IsotonicCalibrator,
    LinearProbe,
    NuisanceProjection,
    PlattCalibrator,
    ProbeEstimator,
    ProbeSearch,
    PTrue,
    Recalibrated,
    UniformRandom,
    VerbalizedConfidence,
)
from capgate.estimators._claims import ClaimDetector
from capgate.estimators.guarded import InjectionGuard

Data = tuple[Any, np.ndarray, Any]  # (X_train, y_train, X_test)


@cache
def feature_data() -> Data:
    rng = np.random.default_rng(7)
    X = rng.normal(loc=3.0, scale=[1.0, 5.0, 0.2, 2.0, 1.0, 1.0], size=(300, 6)).astype(np.float32)
    mu = linear_capability(X, 8)
    return X[:240], sampled_mu_hat(mu[:240], 8, 9), X[240:]


@cache
def layered_data() -> Data:
    """Per-layer features (n, 4 layers, 6): the signal lives in layers 1-2."""
    rng = np.random.default_rng(21)
    X = rng.normal(loc=1.0, size=(200, 4, 6)).astype(np.float32)
    mu = linear_capability(X[:, 1:3].mean(axis=1), 22)
    return X[:160], sampled_mu_hat(mu[:160], 8, 23), X[160:]


def small_search(**settings: Any) -> ProbeSearch:
    return ProbeSearch(**{"alphas": [1e-3, 1e-1, 10.0], "n_splits": 3, **settings})


@cache
def query_data() -> Data:
    queries = random_queries(300, 11)
    mu = linear_capability(CharCountFeaturizer().transform(queries), 12)
    return queries[:240], sampled_mu_hat(mu[:240], 8, 13), queries[240:]


@cache
def confidence_data() -> Data:
    rng = np.random.default_rng(14)
    c = rng.uniform(size=260)
    mu = np.clip(c**2 + rng.normal(scale=0.05, size=260), 0, 1)
    return c[:200], mu[:200], np.concatenate([c[200:], [0.0, 1.0, 0.5]])


def small_probe(**settings: Any) -> LinearProbe:
    return LinearProbe(**{"lr": 2e-2, "max_epochs": 40, "patience": 5, **settings})


@cache
def fitted_probe_estimator() -> ProbeEstimator:
    X, y, _ = query_data()
    return ProbeEstimator(CharCountFeaturizer(), small_probe()).fit(X, y)


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], Any]
    data: Callable[[], Data]
    load: Callable[[Any, Path], Any]
    method: str | None = None  # set for CapabilityEstimators: estimate() is checked on X_test
    needs_fit: bool = True


def _load(cls: Any) -> Callable[[Any, Path], Any]:
    return lambda _estimator, path: cls.load(path)


def recalibrated(name: str, base: Callable[[], Any], calibrator: Callable[[], Any], method: str) -> Case:
    """A :class:`Recalibrated` over ``base()``, reloaded over the same base."""
    make = lambda: Recalibrated(base(), calibrator())  # noqa: E731
    return Case(
        name, make, query_data, lambda est, path: Recalibrated.load(path, est.estimator), method=method
    )


CASES = [
    Case("linear-probe", small_probe, feature_data, _load(LinearProbe)),
    Case(
        "linear-probe-raw", lambda: small_probe(standardize=False, lr=1e-3), feature_data, _load(LinearProbe)
    ),
    Case("probe-search", small_search, feature_data, _load(ProbeSearch)),
    Case("probe-search-layers", small_search, layered_data, _load(ProbeSearch)),
    Case(
        "probe-search-ensemble",
        lambda: small_search(ensemble=True, standardize=[True, False], screen=2),
        layered_data,
        _load(ProbeSearch),
    ),
    Case(
        "probe-estimator",
        lambda: ProbeEstimator(CharCountFeaturizer(), small_probe()),
        query_data,
        lambda est, path: ProbeEstimator.load(path, est.featurizer),
        method="probe",
    ),
    Case(
        "uniform", UniformRandom, query_data, _load(UniformRandom), method="uniform-random", needs_fit=False
    ),
    Case("constant-prior", ConstantPrior, query_data, _load(ConstantPrior), method="constant-prior"),
    Case("isotonic", IsotonicCalibrator, confidence_data, _load(IsotonicCalibrator)),
    Case("platt", PlattCalibrator, confidence_data, _load(PlattCalibrator)),
    recalibrated("probe+isotonic", fitted_probe_estimator, IsotonicCalibrator, "probe+isotonic"),
    recalibrated(
        "uniform+platt", lambda: UniformRandom(random_state=3), PlattCalibrator, "uniform-random+platt"
    ),
]
ESTIMATORS = [c for c in CASES if c.method is not None]
NEEDS_FIT = [c for c in CASES if c.needs_fit]


def one_row(X: Any, i: int) -> Any:
    return X[i : i + 1] if isinstance(X, np.ndarray) else [X[i]]


def n_of(X: Sequence[Any] | np.ndarray) -> int:
    return len(X)


def learned_state(estimator: Any) -> dict[str, Any]:
    """Attributes ending in ``_`` of the estimator and of the estimators it wraps."""
    parts = ("probe", "calibrator", "best_estimator_")
    state = {
        k: v
        for k, v in vars(estimator).items()
        if k.endswith("_") and not k.startswith("_") and k not in parts
    }
    for part in parts:
        if hasattr(estimator, part):
            state.update({f"{part}.{k}": v for k, v in learned_state(getattr(estimator, part)).items()})
    return state


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype, key
            assert a[key].tobytes() == b[key].tobytes(), key  # bitwise
        else:
            assert a[key] == b[key], key


@pytest.fixture(params=CASES, ids=lambda c: c.id)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


def test_fit_returns_self(case: Case) -> None:
    X, y, _ = case.data()
    estimator = case.make()
    assert estimator.fit(X, y) is estimator


def test_predictions_are_probabilities(case: Case) -> None:
    X, y, X_test = case.data()
    p = case.make().fit(X, y).predict(X_test)
    assert isinstance(p, np.ndarray)
    assert p.shape == (n_of(X_test),)
    assert p.dtype == np.float64
    assert np.all(np.isfinite(p))
    assert np.all((p >= 0) & (p <= 1))


def test_batching_gives_the_same_answers_as_one_by_one(case: Case) -> None:
    X, y, X_test = case.data()
    estimator = case.make().fit(X, y)
    batched = estimator.predict(X_test)
    single = np.concatenate([estimator.predict(one_row(X_test, i)) for i in range(n_of(X_test))])
    np.testing.assert_array_equal(batched, single)


def test_fitting_is_deterministic(case: Case) -> None:
    X, y, X_test = case.data()
    first = case.make().fit(X, y)
    second = case.make().fit(X, y)
    np.testing.assert_array_equal(first.predict(X_test), second.predict(X_test))
    assert_same_state(learned_state(first), learned_state(second))


def test_save_load_round_trips_exactly(case: Case, tmp_path: Path) -> None:
    X, y, X_test = case.data()
    estimator = case.make().fit(X, y)
    estimator.save(tmp_path / "saved")
    loaded = case.load(estimator, tmp_path / "saved")
    assert type(loaded) is type(estimator)
    np.testing.assert_array_equal(loaded.predict(X_test), estimator.predict(X_test))
    assert_same_state(learned_state(loaded), learned_state(estimator))
    # and saving the loaded one writes the same files
    loaded.save(tmp_path / "again")
    first = sorted(p.relative_to(tmp_path / "saved") for p in (tmp_path / "saved").rglob("*"))
    for rel in first:
        a, b = tmp_path / "saved" / rel, tmp_path / "again" / rel
        assert b.exists(), rel
        if a.is_file():
            assert a.read_bytes() == b.read_bytes(), rel


@pytest.mark.parametrize("case", NEEDS_FIT, ids=lambda c: c.id)
def test_unfitted_use_raises_not_fitted(case: Case, tmp_path: Path) -> None:
    _, _, X_test = case.data()
    estimator = case.make()
    with pytest.raises(NotFittedError, match="not fitted yet; call fit"):
        estimator.predict(X_test)
    with pytest.raises(NotFittedError):
        estimator.save(tmp_path / "unfitted")
    if case.method is not None:
        with pytest.raises(NotFittedError):
            estimator.estimate(list(X_test))


@pytest.mark.parametrize("case", [c for c in CASES if not c.needs_fit], ids=lambda c: c.id)
def test_stateless_estimators_predict_the_same_without_fit(case: Case) -> None:
    X, y, X_test = case.data()
    np.testing.assert_array_equal(case.make().predict(X_test), case.make().fit(X, y).predict(X_test))


@pytest.mark.parametrize("case", ESTIMATORS, ids=lambda c: c.id)
def test_estimate_returns_estimates_with_the_method(case: Case) -> None:
    X, y, X_test = case.data()
    estimator = case.make().fit(X, y)
    assert isinstance(estimator, CapabilityEstimator)
    assert estimator.method == case.method
    estimates = estimator.estimate(list(X_test))
    assert len(estimates) == n_of(X_test)
    assert all(isinstance(e, Estimate) for e in estimates)
    assert {e.method for e in estimates} == {case.method}
    assert not any(e.degraded for e in estimates)
    np.testing.assert_array_equal([e.p for e in estimates], estimator.predict(X_test))
    assert estimator.estimate_one(X_test[0]).p == estimates[0].p
    assert estimator.estimate([]) == []


@pytest.mark.parametrize("case", ESTIMATORS, ids=lambda c: c.id)
def test_async_estimate_matches_sync(case: Case) -> None:
    X, y, X_test = case.data()
    estimator = case.make().fit(X, y)
    sync = estimator.estimate(list(X_test[:5]))
    asynchronous = asyncio.run(estimator.aestimate(list(X_test[:5])))
    assert [e.p for e in asynchronous] == [e.p for e in sync]


def test_wrong_length_targets_are_rejected(case: Case) -> None:
    X, y, _ = case.data()
    with pytest.raises(ValueError, match=r"entries|features|queries"):
        case.make().fit(X, y[:-1])


def test_targets_outside_unit_interval_are_rejected(case: Case) -> None:
    X, y, _ = case.data()
    bad = y.copy()
    bad[3] = 1.5
    with pytest.raises(ValueError, match=r"\[3\].*\[0, 1\]"):
        case.make().fit(X, bad)


# ------------------------------------------------------------------ settings (get_params / repr)


def _backend() -> ScriptedBackend:
    return ScriptedBackend(lambda text, params: [gen("\\boxed{0.5}")])


SETTINGS_ONLY: list[Callable[[], Any]] = [
    lambda: Consistency(_backend(), k_c=3),
    lambda: PTrue(_backend(), top_logprobs=5),
    lambda: VerbalizedConfidence(_backend(), max_tries=2),
    lambda: FallbackChain([UniformRandom(random_state=4), ConstantPrior()]),
    lambda: InjectionGuard(UniformRandom(), lift_tolerance=0.1, on_claim="strip"),
    lambda: NuisanceProjection(energy=0.5),
    lambda: ClaimDetector(l2=1e-3),
]
MAKERS = [c.make for c in CASES] + SETTINGS_ONLY
MAKER_IDS = [c.id for c in CASES] + [f"settings-{i}" for i in range(len(SETTINGS_ONLY))]


@pytest.mark.parametrize("make", MAKERS, ids=MAKER_IDS)
def test_get_params_round_trips_through_the_constructor(make: Callable[[], Any]) -> None:
    estimator = make()
    params = estimator.get_params(deep=False)
    copy = type(estimator)(**params)
    again = copy.get_params(deep=False)
    assert again.keys() == params.keys()
    assert all(again[k] is params[k] or again[k] == params[k] for k in params)
    # the repr is derived from those settings: the changed ones, in constructor order
    text = repr(estimator)
    assert repr(copy) == text
    shown = [f"{k}={v!r}" for k, v in params.items() if f"{k}={v!r}" in text]
    assert text == f"{type(estimator).__name__}({', '.join(shown)})"
    # deep params reach into nested estimators (``part__setting``)
    deep = estimator.get_params()
    for key, value in deep.items():
        owner: Any = estimator
        *path, name = key.split("__")
        for part in path:
            owner = getattr(owner, part)
        assert getattr(owner, name) is value


def test_repr_shows_settings_that_differ_from_their_defaults() -> None:
    assert repr(LinearProbe()) == "LinearProbe()"
    assert repr(ProbeSearch(n_splits=3, ensemble=True)) == "ProbeSearch(n_splits=3, ensemble=True)"
    assert repr(Recalibrated(UniformRandom(random_state=2), PlattCalibrator(l2=0.5))) == (
        "Recalibrated(estimator=UniformRandom(random_state=2), calibrator=PlattCalibrator(l2=0.5))"
    )
    assert repr(ConstantPrior()) == "ConstantPrior()"


def test_a_subclass_that_hides_its_settings_is_told_so_and_keeps_the_default_repr() -> None:
    class Hidden(CapabilityEstimator):
        def __init__(self, p: float) -> None:
            self._p = p

        def estimate(self, queries: Sequence[Any]) -> list[Estimate]:
            return [Estimate(p=self._p, method=self.method) for _ in queries]

    assert repr(Hidden(0.5)).startswith("<")  # the default repr, never an error
    with pytest.raises(AttributeError, match=r"Hidden takes `p` but does not store it as self\.p"):
        Hidden(0.5).get_params()


def test_set_params_checks_like_the_constructor_and_reaches_nested_settings() -> None:
    recal = Recalibrated(UniformRandom(), PlattCalibrator())
    assert recal.set_params(calibrator__l2=2.0, estimator__random_state=5) is recal
    assert recal.calibrator.l2 == 2.0
    assert recal.estimator.random_state == 5
    recal.set_params(calibrator=IsotonicCalibrator())
    assert recal.method == "uniform-random+isotonic"  # what the constructor derives follows
    with pytest.raises(ValueError, match="`k_c` must be an integer >= 2; got 1"):
        Consistency(_backend()).set_params(k_c=1)
    with pytest.raises(ValueError, match="`foo` is not a setting of PlattCalibrator"):
        PlattCalibrator().set_params(foo=1)
