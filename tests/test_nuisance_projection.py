"""NuisanceProjection: a probe folded through it cannot be moved by edits along the learned directions."""

from __future__ import annotations

import numpy as np
import pytest

from capgate.errors import NotFittedError
from capgate.estimators import LinearProbe, NuisanceProjection, ProbeSearch


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features whose dim 0 carries µ, and an 'easiness claim' edit that moves dims 0 and 3."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 8))
    mu = 1 / (1 + np.exp(-(2 * X[:, 0] - 1)))
    claim = np.array([0.8, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0])
    return X, mu, claim


def _edits(X: np.ndarray, claim: np.ndarray, seed: int) -> np.ndarray:
    """The claim, of varying strength, plus small noise (each edit is worded differently)."""
    rng = np.random.default_rng(seed)
    strength = rng.uniform(0.5, 1.5, size=(len(X), 1))
    return X + strength * claim + 0.01 * rng.normal(size=X.shape)


def test_folded_probe_ignores_the_edit_and_matches_the_projected_fit() -> None:
    X, mu, claim = _data()
    plain = ProbeSearch(solvers=["ridge"], alphas=[1e-2, 1.0]).fit(X, mu).best_estimator_
    assert plain is not None
    attacked = _edits(X, claim, seed=1)
    lift_plain = plain.predict(attacked) - plain.predict(X)
    assert lift_plain.mean() > 0.05  # the edit moves dim 0, which the probe reads

    proj = NuisanceProjection(energy=0.99).fit(X, X[:100], _edits(X[:100], claim, seed=2))
    inner = ProbeSearch(solvers=["ridge"], alphas=[1e-2, 1.0]).fit(proj.transform(X), mu).best_estimator_
    assert inner is not None
    folded = proj.fold(inner)
    np.testing.assert_allclose(folded.predict(X), inner.predict(proj.transform(X)), atol=1e-5)
    lift = folded.predict(attacked) - folded.predict(X)
    # What is left is the edits' own per-wording noise, which no direction captures.
    assert np.abs(lift).mean() < 0.005
    assert np.abs(lift).max() < 0.03
    # Dim 0 still carries signal outside the claim's direction: the probe is not a constant.
    assert np.corrcoef(folded.predict(X), mu)[0, 1] > 0.5
    assert folded.training_["nuisance_projection"]["directions"] == proj.components_.shape[0]


def test_folded_probe_round_trips_through_safetensors(tmp_path) -> None:
    X, mu, claim = _data()
    proj = NuisanceProjection().fit(X, X[:50], X[:50] + claim)
    inner = LinearProbe(lr=5e-2, max_epochs=30).fit(proj.transform(X), mu)
    folded = proj.fold(inner)
    loaded = LinearProbe.load(folded.save(tmp_path / "probe"))
    np.testing.assert_allclose(loaded.predict(X + claim), loaded.predict(X), atol=1e-5)
    assert loaded.training_["nuisance_projection"]["energy"] == pytest.approx(proj.energy_)


def test_energy_picks_the_fewest_directions() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 10))
    clean = X[:80]
    edited = (
        clean
        + np.outer(rng.uniform(1, 2, 80), np.eye(10)[2])
        + np.outer(rng.normal(0, 0.1, 80), np.eye(10)[7])
    )
    assert NuisanceProjection(energy=0.9).fit(X, clean, edited).components_.shape[0] == 1
    assert NuisanceProjection(energy=1.0).fit(X, clean, edited).components_.shape[0] == 2
    assert NuisanceProjection(energy=1.0, max_directions=1).fit(X, clean, edited).components_.shape[0] == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"energy": 0.0}, "energy"), ({"energy": 1.5}, "energy"), ({"max_directions": 0}, "max_directions")],
)
def test_bad_settings_are_named(kwargs: dict[str, float], match: str) -> None:
    X, _, claim = _data()
    with pytest.raises(ValueError, match=match):
        NuisanceProjection(**kwargs).fit(X, X[:10], X[:10] + claim)  # type: ignore[arg-type]


def test_bad_data_is_named() -> None:
    X, mu, claim = _data()
    with pytest.raises(ValueError, match="pair row for row"):
        NuisanceProjection().fit(X, X[:10], X[:11] + claim)
    with pytest.raises(ValueError, match="`edited` has 7 features"):
        NuisanceProjection().fit(X, X[:10], X[:10, :7])
    with pytest.raises(ValueError, match="do not move"):
        NuisanceProjection().fit(X, X[:10], X[:10])
    bad = X[:10].copy()
    bad[4, 2] = np.nan
    with pytest.raises(ValueError, match=r"`clean` has non-finite values in rows \[4\]"):
        NuisanceProjection().fit(X, bad, X[:10] + claim)
    with pytest.raises(NotFittedError):
        NuisanceProjection().transform(X)
    proj = NuisanceProjection().fit(X, X[:10], X[:10] + claim)
    with pytest.raises(ValueError, match="3 features but the projection was fitted on 8"):
        proj.transform(X[:, :3])
    narrow = LinearProbe(lr=5e-2, max_epochs=5).fit(X[:, :4], mu)
    with pytest.raises(ValueError, match="reads 4 features"):
        proj.fold(narrow)
