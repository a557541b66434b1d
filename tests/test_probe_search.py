"""ProbeSearch and nested CV: what is chosen, what the chosen probe records, bad input, no leaks.

The estimator contract (fit returns self, determinism, save/load round trip, batching) is in
``test_estimator_conformance.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capgate.estimators import LinearProbe, ProbeSearch, nested_cross_val_predict
from capgate.estimators._convex import kfold, ridge_loo, ridge_path

SPEC = {
    "model_id": "m",
    "weights_fingerprint": "sha256:0",
    "layers": [0, 2, 4, 6],
    "pooling": "last",
    "dim": 5,
}


def layered(n: int = 150, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4, 5))
    mu = 1 / (1 + np.exp(-(1.5 * X[:, 2, 0] - X[:, 2, 1])))
    return X, mu


def quick(**settings: Any) -> ProbeSearch:
    return ProbeSearch(**{"alphas": [1e-3, 1e-1, 10.0], "n_splits": 3, **settings})


def test_chooses_the_informative_layer_and_records_it_in_the_spec(tmp_path: Path) -> None:
    X, mu = layered()
    search = quick(solvers=["ridge"]).fit(X, mu, feature_spec=SPEC, source="labels.jsonl")
    assert search.best_params_["layers"] == [2]
    assert search.layers_ == [4]  # position 2 is hidden state 4
    probe = search.best_estimator_
    assert isinstance(probe, LinearProbe)
    assert probe.feature_spec_ == {**SPEC, "layers": [4]}
    assert probe.training_["trainer"]["solver"] == "ridge"
    assert probe.training_["trainer"]["hidden_states"] == [4]
    # the saved probe is an ordinary LinearProbe, fed the chosen layer's features
    loaded = LinearProbe.load(search.save(tmp_path / "p"))
    np.testing.assert_array_equal(loaded.predict(X[:, 2]), search.predict(X))


def test_all_layers_chosen_is_spelled_all() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3, 4))
    signal = X.mean(axis=1)[:, 0]
    mu = 1 / (1 + np.exp(-2 * signal))
    search = quick(solvers=["ridge"], layers=[[0, 1, 2]]).fit(
        X, mu, feature_spec={**SPEC, "layers": "all", "dim": 4}
    )
    assert search.best_estimator_ is not None
    assert search.best_estimator_.feature_spec_ is not None
    assert search.best_estimator_.feature_spec_["layers"] == "all"


def test_ridge_path_and_leave_one_out_are_exact() -> None:
    rng = np.random.default_rng(2)
    for n, d in ((40, 10), (20, 30)):
        z = rng.normal(size=(n, d))
        y = rng.uniform(size=n)
        (w,), _ = ridge_path(z, y, [0.3])
        zc = z - z.mean(axis=0)
        direct = np.linalg.solve(zc.T @ zc + n * 0.3 * np.eye(d), zc.T @ (y - y.mean()))
        np.testing.assert_allclose(w, direct, atol=1e-10)
        # leave-one-out at a fixed total penalty n * alpha equals refitting without the row
        loo = ridge_loo(z, y, [0.3])[0]
        keep = np.arange(n) != 4
        (w4,), (b4,) = ridge_path(z[keep], y[keep], [0.3 * n / (n - 1)])
        assert loo[4] == pytest.approx(z[4] @ w4 + b4, abs=1e-10)


def test_ensemble_is_one_linear_probe() -> None:
    X, mu = layered()
    search = quick(ensemble=True, standardize=[True, False]).fit(X, mu)
    assert search.best_estimator_ is not None
    assert search.best_estimator_.coef_ is not None
    assert search.best_estimator_.coef_.shape == (5,)
    assert search.best_score_ < np.mean((mu - mu.mean()) ** 2)


@pytest.mark.parametrize(
    ("X", "y", "match"),
    [
        (np.ones((30, 4)), np.full(29, 0.5), r"`y` must have 30 entries"),
        (np.ones((30, 4)), np.r_[np.full(29, 0.5), 1.5], r"`y`\[29\].*\[0, 1\]"),
        (np.ones((30, 4)), np.r_[np.full(29, 0.5), -0.1], r"`y`\[29\].*\[0, 1\]"),
        (np.r_[np.ones((29, 4)), [[np.nan, 0, 0, 0]]], np.full(30, 0.5), r"non-finite values in rows \[29\]"),
        (np.ones(30), np.full(30, 0.5), r"shape \(n_queries, n_features\)"),
    ],
)
def test_bad_training_input_is_named(X: np.ndarray, y: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        quick().fit(X, y)


def test_wrong_width_and_spec_mismatch_are_named() -> None:
    X, mu = layered()
    search = quick(solvers=["ridge"]).fit(X, mu)
    with pytest.raises(ValueError, match=r"rows of shape \(4, 6\).*fitted on \(4, 5\)"):
        search.predict(np.ones((2, 4, 6)))
    with pytest.raises(ValueError, match=r"non-finite values in rows \[1\]"):
        search.predict(np.r_[X[:1], np.full((1, 4, 5), np.inf)])
    with pytest.raises(ValueError, match="feature_spec says dim=7 but X has 5"):
        quick().fit(X, mu, feature_spec={**SPEC, "dim": 7})
    with pytest.raises(ValueError, match=r"lists layers .* but X has 4 layers"):
        quick().fit(X, mu, feature_spec={**SPEC, "layers": [1, 2]})


def test_bad_settings_are_named() -> None:
    X, mu = layered(60)
    with pytest.raises(ValueError, match="`solvers`"):
        ProbeSearch(solvers=["lasso"]).fit(X, mu)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="`alphas`"):
        ProbeSearch(alphas=[0.0]).fit(X, mu)
    with pytest.raises(ValueError, match="outside X's 4 layers"):
        ProbeSearch(layers=[[7]]).fit(X, mu)


# ------------------------------------------------------------------ nested CV never peeks


def outer_predictions(fit_predict: Any, X: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Predictions on each outer fold, with every *other* query's label left as it is and the
    fold's own labels replaced by noise: an honest procedure gives the same predictions."""
    changed = []
    rng = np.random.default_rng(99)
    baseline = fit_predict(X, y)
    for _, test in kfold(len(y), 5, 0)[:2]:  # two outer folds keep the test quick
        y_poisoned = y.copy()
        y_poisoned[test] = rng.uniform(size=len(test))
        changed.append(fit_predict(X, y_poisoned)[test] - baseline[test])
    return changed


def assert_test_labels_unused(fit_predict: Any, X: np.ndarray, y: np.ndarray) -> None:
    for k, diff in enumerate(outer_predictions(fit_predict, X, y)):
        assert np.all(diff == 0), f"outer fold {k}'s predictions depend on its own labels"


def honest(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    return nested_cross_val_predict(quick(solvers=["ridge"]), X, y).predictions


def leaky(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The classic mistake: choose the recipe on all the data, then cross-validate only the refit."""
    chosen = quick(solvers=["ridge"]).fit(X, y).best_params_
    fixed = quick(solvers=["ridge"], alphas=[chosen["alpha"]], layers=[chosen["layers"]])
    return nested_cross_val_predict(fixed, X, y).predictions


def test_nested_cv_never_uses_the_outer_test_labels() -> None:
    X, mu = layered(100, seed=5)
    assert_test_labels_unused(honest, X, mu)


def test_a_planted_leak_is_caught() -> None:
    X, mu = layered(100, seed=5)
    with pytest.raises(AssertionError, match="depend on its own labels"):
        assert_test_labels_unused(leaky, X, mu)


def test_nested_cv_prior_is_the_training_fold_mean() -> None:
    X, mu = layered(50, seed=6)
    cv = nested_cross_val_predict(quick(solvers=["ridge"]), X[:, 0], mu)
    for k, (train, test) in enumerate(kfold(50, 5, 0)):
        assert np.all(cv.fold[test] == k)
        np.testing.assert_array_equal(cv.prior[test], mu[train].mean())


def test_the_chosen_layers_featurize_correctly_at_load_time(tiny_model: Any, tmp_path: Path) -> None:
    """A probe chosen on per-layer features loads with a featurizer of exactly those layers."""
    from _probe_helpers import random_queries

    from capgate.estimators import ProbeEstimator
    from capgate.local.hidden_states import FeatureSpec, HiddenStateFeaturizer

    queries = random_queries(40, 3)
    featurizer = HiddenStateFeaturizer(tiny_model, batch_size=8)
    X = featurizer.transform_layers(queries)
    mu = 1 / (1 + np.exp(-X[:, 1, :3].sum(axis=1)))
    search = quick(solvers=["ridge"], layers=[[1], [1, 2], [0, 1, 2]]).fit(
        X, mu, feature_spec=featurizer.spec
    )
    assert search.best_estimator_ is not None
    spec = FeatureSpec.model_validate(search.best_estimator_.feature_spec_)
    search.save(tmp_path / "probe")
    chosen = HiddenStateFeaturizer(tiny_model, layers=spec.layers, pooling=spec.pooling, batch_size=8)
    estimator = ProbeEstimator.load(tmp_path / "probe", chosen)  # the spec matches: no ProbeMismatchError
    np.testing.assert_allclose(estimator.predict(queries), search.predict(X), rtol=1e-5, atol=1e-6)


def test_settings_given_as_numpy_arrays_are_saved_as_json_lists(tmp_path: Path) -> None:
    X, mu = layered(60)
    search = quick(solvers=["ridge"], alphas=np.array([1e-2, 1.0])).fit(X[:, 0], mu)
    search.save(tmp_path / "search")
    loaded = ProbeSearch.load(tmp_path / "search")
    assert loaded.alphas == [1e-2, 1.0]
    np.testing.assert_array_equal(loaded.predict(X[:, 0]), search.predict(X[:, 0]))
    probe = LinearProbe(lr=np.array([2e-2, 5e-2]), max_epochs=3).fit(X[:, 0], mu)
    probe.save(tmp_path / "probe")
    assert LinearProbe.load(tmp_path / "probe").lr == (2e-2, 5e-2)
