"""Isotonic and Platt recalibration, and the Recalibrated wrapper."""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capgate import DataError, Estimate, NotFittedError
from capgate.core.backend import Prompt
from capgate.estimators import IsotonicCalibrator, PlattCalibrator, Recalibrated, UniformRandom
from capgate.estimators.base import CapabilityEstimator
from capgate.estimators.recalibration import pool_adjacent_violators
from capgate.metrics import capability_brier, expected_calibration_error

# ------------------------------------------------------------------ isotonic vs brute force


def brute_force_isotonic(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """Best non-decreasing fit (equal x → equal value) by trying every contiguous partition.

    The weighted least-squares isotonic solution is constant on blocks of consecutive distinct x
    values, at each block's weighted mean; among partitions whose block means do not decrease,
    the one with least error is optimal. Returns fitted values per input point and that error.
    """
    levels = np.unique(x)
    m = len(levels)
    sw = np.array([w[x == v].sum() for v in levels])
    swy = np.array([(w * y)[x == v].sum() for v in levels])
    best_err, best_fit = np.inf, np.zeros(m)
    for cuts in itertools.product([False, True], repeat=m - 1):
        bounds = [0, *[i + 1 for i, c in enumerate(cuts) if c], m]
        fit = np.zeros(m)
        for a, b in itertools.pairwise(bounds):
            fit[a:b] = swy[a:b].sum() / sw[a:b].sum()
        if np.any(np.diff(fit) < -1e-12):
            continue
        per_point = fit[np.searchsorted(levels, x)]
        err = float(np.sum(w * (per_point - y) ** 2))
        if err < best_err:
            best_err, best_fit = err, fit
    return best_fit[np.searchsorted(levels, x)], best_err


points = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.6, 0.9, 1.0]),  # few levels: ties are common
        st.floats(0.0, 1.0),
        st.floats(0.05, 5.0),
    ),
    min_size=1,
    max_size=9,
)


@settings(max_examples=300, deadline=None)
@given(points)
def test_isotonic_is_the_least_squares_monotone_fit(data: list[tuple[float, float, float]]) -> None:
    x, y, w = (np.array(col, dtype=np.float64) for col in zip(*data, strict=True))
    iso = IsotonicCalibrator().fit(x, y, sample_weight=w)
    fitted = iso.predict(x)
    expected, best_err = brute_force_isotonic(x, y, w)
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(fitted[order]) >= -1e-12)  # monotone
    assert np.sum(w * (fitted - y) ** 2) == pytest.approx(best_err, rel=1e-9, abs=1e-12)  # optimal
    # and the optimum is unique, up to what float64 can tell apart: two fits whose squared errors
    # differ by less than ~1e-16 of the error tie, and such fits can differ by ~1e-8 (its root)
    np.testing.assert_allclose(fitted, expected, atol=1e-6)
    grid = np.linspace(0, 1, 101)
    assert np.all(np.diff(iso.predict(grid)) >= -1e-12)  # monotone between points too


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=30))
def test_pav_output_is_non_decreasing_and_keeps_the_mean(values: list[float]) -> None:
    y = np.array(values)
    fit = pool_adjacent_violators(y, np.ones_like(y))
    assert np.all(np.diff(fit) >= -1e-9)
    assert fit.mean() == pytest.approx(y.mean(), abs=1e-9)


def test_isotonic_pools_ties_interpolates_and_clips() -> None:
    iso = IsotonicCalibrator().fit([0.2, 0.2, 0.4, 0.8], [0.0, 1.0, 0.7, 0.9])
    np.testing.assert_allclose(iso.predict([0.2, 0.4, 0.8]), [0.5, 0.7, 0.9])
    assert iso.predict([0.3])[0] == pytest.approx(0.6)  # linear between fitted points
    np.testing.assert_allclose(iso.predict([0.0, 1.0]), [0.5, 0.9])  # constant outside the range
    with pytest.raises(ValueError, match=r"confidence\[0\] = 0.1 is outside the fitted range \[0.2, 0.8\]"):
        IsotonicCalibrator(out_of_bounds="raise").fit([0.2, 0.8], [0.1, 0.9]).predict([0.1])


def test_isotonic_drops_redundant_points_and_zero_weights() -> None:
    iso = IsotonicCalibrator().fit([0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.5, 0.5, 0.5, 1.0])
    assert iso.X_thresholds_ is not None
    assert iso.X_thresholds_.tolist() == [0.1, 0.4, 0.5]
    ignored = IsotonicCalibrator().fit([0.1, 0.5, 0.9], [0.2, 1.0, 0.8], sample_weight=[1.0, 0.0, 1.0])
    np.testing.assert_allclose(ignored.predict([0.1, 0.9]), [0.2, 0.8])


def test_isotonic_repairs_a_miscalibrated_estimator() -> None:
    rng = np.random.default_rng(0)
    c = rng.uniform(size=4000)
    mu = c**3  # badly overconfident
    iso = IsotonicCalibrator().fit(c[:3000], mu[:3000])
    after = iso.predict(c[3000:])
    assert (
        expected_calibration_error(after, mu[3000:]) < 0.01 < expected_calibration_error(c[3000:], mu[3000:])
    )
    assert capability_brier(after, mu[3000:]) < capability_brier(c[3000:], mu[3000:]) / 20


def test_isotonic_rejects_bad_input_and_unfitted_use(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"`confidence`\[1\] must be a finite number in \[0, 1\]; got 1.2"):
        IsotonicCalibrator().fit([0.1, 1.2], [0.0, 1.0])
    with pytest.raises(ValueError, match="`out_of_bounds` must be 'clip' or 'raise'"):
        IsotonicCalibrator(out_of_bounds="nan").fit([0.1], [0.1])  # type: ignore[arg-type]
    with pytest.raises(NotFittedError, match="IsotonicCalibrator"):
        IsotonicCalibrator().predict([0.5])


def test_isotonic_json_is_readable_and_validated(tmp_path: Path) -> None:
    iso = IsotonicCalibrator().fit([0.1, 0.3, 0.7], [0.2, 0.1, 0.9])
    iso.save(tmp_path / "iso.json")
    payload = json.loads((tmp_path / "iso.json").read_text())
    assert payload["format"] == "capgate.isotonic_calibrator"
    assert payload["X_thresholds"] == [0.1, 0.3, 0.7]
    assert payload["y_thresholds"] == [0.15000000000000002, 0.15000000000000002, 0.9]
    payload["y_thresholds"] = [0.9, 0.1, 0.2]
    (tmp_path / "bad.json").write_text(json.dumps(payload))
    with pytest.raises(DataError, match=r"bad\.json: field 'X_thresholds': X_thresholds must increase"):
        IsotonicCalibrator.load(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"X_min": 0.9, "X_max": 0.1}, "X_min"),  # reversed: "raise" refused every confidence
        ({"X_min": 0.0}, "X_min"),  # wider than the fitted range: no longer refused
        ({"X_max": 0.5}, "X_max"),
    ],
)
def test_isotonic_json_range_must_be_the_thresholds_ends(
    tmp_path: Path, change: dict[str, float], field: str
) -> None:
    IsotonicCalibrator(out_of_bounds="raise").fit([0.2, 0.4, 0.6, 0.8], [0.0, 0.5, 0.3, 1.0]).save(
        tmp_path / "iso.json"
    )
    payload = json.loads((tmp_path / "iso.json").read_text())
    assert (payload["X_min"], payload["X_max"]) == (0.2, 0.8)
    assert IsotonicCalibrator.load(tmp_path / "iso.json").predict([0.5]).tolist() == [0.4]
    (tmp_path / "bad.json").write_text(json.dumps({**payload, **change}))
    with pytest.raises(
        DataError, match=rf"bad\.json: field '{field}': must equal the (first|last) of X_thres"
    ):
        IsotonicCalibrator.load(tmp_path / "bad.json")


# ------------------------------------------------------------------ Platt


@pytest.mark.parametrize(("a", "b"), [(1.0, 0.0), (0.5, -1.0), (2.5, 0.7), (-0.8, 0.2)])
def test_platt_recovers_known_parameters_from_exact_soft_targets(a: float, b: float) -> None:
    c = np.linspace(0.01, 0.99, 80)
    mu = 1 / (1 + np.exp(-(a * np.log(c / (1 - c)) + b)))
    platt = PlattCalibrator().fit(c, mu)
    assert platt.converged_
    assert platt.coef_ == pytest.approx(a, abs=1e-7)
    assert platt.intercept_ == pytest.approx(b, abs=1e-7)


def test_platt_recovers_parameters_from_sampled_labels() -> None:
    rng = np.random.default_rng(1)
    c = rng.uniform(0.02, 0.98, size=20000)
    mu = 1 / (1 + np.exp(-(1.7 * np.log(c / (1 - c)) - 0.4)))
    mu_hat = rng.binomial(10, mu) / 10
    platt = PlattCalibrator().fit(c, mu_hat)
    assert platt.coef_ == pytest.approx(1.7, abs=0.05)
    assert platt.intercept_ == pytest.approx(-0.4, abs=0.05)


def test_platt_weights_count_like_repeated_rows() -> None:
    c = np.array([0.2, 0.4, 0.6, 0.9])
    mu = np.array([0.1, 0.5, 0.4, 0.95])
    weighted = PlattCalibrator().fit(c, mu, sample_weight=[1, 3, 1, 2])
    repeated = PlattCalibrator().fit(np.repeat(c, [1, 3, 1, 2]), np.repeat(mu, [1, 3, 1, 2]))
    assert weighted.coef_ == pytest.approx(repeated.coef_, abs=1e-9)
    assert weighted.intercept_ == pytest.approx(repeated.intercept_, abs=1e-9)


def test_platt_separable_data_warns_unless_regularized() -> None:
    c = np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9])
    y = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    with pytest.warns(RuntimeWarning, match="did not converge"):
        PlattCalibrator(max_iter=20).fit(c, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ridge = PlattCalibrator(l2=1.0).fit(c, y)
    assert ridge.converged_
    assert ridge.coef_ is not None
    assert 0 < ridge.coef_ < 50


def test_platt_handles_constant_confidence() -> None:
    platt = PlattCalibrator().fit(np.full(10, 0.5), np.linspace(0, 1, 10) ** 2)
    assert platt.predict([0.5])[0] == pytest.approx(np.mean(np.linspace(0, 1, 10) ** 2), abs=1e-6)


def test_platt_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="`l2` must be a non-negative number; got -1"):
        PlattCalibrator(l2=-1).fit([0.5], [0.5])
    with pytest.raises(ValueError, match="`eps` must be"):
        PlattCalibrator(eps=0.7).fit([0.5], [0.5])


def test_platt_json_round_trip_and_validation(tmp_path: Path) -> None:
    platt = PlattCalibrator().fit([0.1, 0.5, 0.8], [0.2, 0.4, 0.7])
    platt.save(tmp_path / "platt.json")
    again = PlattCalibrator.load(tmp_path / "platt.json")
    assert (again.coef_, again.intercept_) == (platt.coef_, platt.intercept_)
    payload = json.loads((tmp_path / "platt.json").read_text())
    payload["settings"]["l2"] = -3
    (tmp_path / "bad.json").write_text(json.dumps(payload))
    with pytest.raises(DataError, match="field 'settings': `l2` must be a non-negative"):
        PlattCalibrator.load(tmp_path / "bad.json")


# ------------------------------------------------------------------ Recalibrated


class Scripted(CapabilityEstimator):
    """Returns fixed estimates: a value from the query's last digit, degraded for "down"/"weak"."""

    method = "verbalized"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        out = []
        for q in queries:
            text = str(q)
            if "down" in text:
                out.append(Estimate.unavailable(self.method, "server down", attempt=3))
            elif "weak" in text:
                out.append(Estimate(p=0.9, method="fallback", degraded=True, reason="fallback answered"))
            else:
                out.append(Estimate(p=int(text[-1]) / 10, method=self.method, details={"raw": text}))
        return out


def test_recalibrated_maps_usable_estimates_and_passes_degraded_ones_untouched() -> None:
    base = Scripted()
    queries = [f"q{i}" for i in range(10)]
    recal = Recalibrated(base, IsotonicCalibrator()).fit(queries, [(i / 10) ** 2 for i in range(10)])
    assert recal.method == "verbalized+isotonic"
    mixed = ["q3", "server is down", "weak one", "q9"]
    before = base.estimate(mixed)
    after = recal.estimate(mixed)
    assert after[0].p == pytest.approx(0.09)
    assert after[0].method == "verbalized+isotonic"
    assert after[0].details == {"raw": "q3", "raw_p": 0.3}
    assert after[1] == before[1]  # unavailable: untouched, still no value
    assert after[1].p is None
    assert after[1].degraded
    assert after[2] == before[2]  # weakened with a value: untouched, not recalibrated
    assert after[2].p == 0.9
    assert after[2].method == "fallback"
    predicted = recal.predict(mixed)
    assert np.isnan(predicted[1])
    assert predicted[2] == 0.9


def test_recalibrated_fit_skips_degraded_estimates() -> None:
    recal = Recalibrated(Scripted(), IsotonicCalibrator())
    recal.fit(["q1", "down", "weak", "q8"], [0.0, 1.0, 1.0, 0.5])
    assert recal.calibrator.X_thresholds_ is not None
    assert recal.calibrator.X_thresholds_.tolist() == [0.1, 0.8]
    with pytest.raises(ValueError, match="no usable estimate from 'verbalized'"):
        Recalibrated(Scripted(), PlattCalibrator()).fit(["down", "weak"], [0.5, 0.5])


def test_recalibrated_load_refuses_another_base_method(tmp_path: Path) -> None:
    recal = Recalibrated(Scripted(), PlattCalibrator()).fit(
        [f"q{i}" for i in range(10)], np.linspace(0, 1, 10)
    )
    recal.save(tmp_path / "recal.json")
    loaded = Recalibrated.load(tmp_path / "recal.json", Scripted())
    assert loaded.method == "verbalized+platt"
    assert loaded.estimate(["q4"]) == recal.estimate(["q4"])
    with pytest.raises(
        DataError, match="fitted on 'verbalized' confidences; refusing to apply it to 'uniform-random'"
    ):
        Recalibrated.load(tmp_path / "recal.json", UniformRandom())


# ------------------------------------------------------------------ real data

MATH500 = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"


@pytest.mark.parametrize("make", [IsotonicCalibrator, PlattCalibrator])
def test_recalibrating_the_papers_probe_lowers_its_ece_out_of_sample(
    make: type[IsotonicCalibrator] | type[PlattCalibrator],
) -> None:
    from capgate.labels.labelled import read_labelled

    labelled = read_labelled(MATH500, confidence=["probe_conf_raw"])
    raw, mu = labelled.confidences["probe_conf_raw"], labelled.mu_hat
    out = np.empty_like(raw)
    for fold in np.array_split(np.random.default_rng(0).permutation(len(raw)), 5):
        train = np.setdiff1d(np.arange(len(raw)), fold)
        out[fold] = make().fit(raw[train], mu[train]).predict(raw[fold])
    assert capability_brier(raw, mu) == pytest.approx(0.0267, abs=5e-5)  # the paper's pass@1 MSE
    assert expected_calibration_error(out, mu) < expected_calibration_error(raw, mu) / 2
    assert capability_brier(out, mu) < capability_brier(raw, mu) + 1e-3
