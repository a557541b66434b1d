"""Calibration metrics against brute-force references written as plain loops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capgate import metrics

probabilities = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def labelled(draw: st.DrawFn, max_size: int = 40) -> tuple[list[float], list[int], list[int]]:
    n = draw(st.integers(min_value=1, max_value=max_size))
    p = draw(st.lists(probabilities, min_size=n, max_size=n))
    k = draw(st.lists(st.integers(min_value=1, max_value=12), min_size=n, max_size=n))
    c = [draw(st.integers(min_value=0, max_value=kk)) for kk in k]
    return p, c, k


def brute_ece(p: list[float], mu: list[float], m: int) -> float:
    bins: dict[int, list[int]] = {}
    for i, pi in enumerate(p):
        b = max(j for j in range(m) if j / m <= pi)  # bin b holds b/m <= p < (b+1)/m, the last closed
        bins.setdefault(b, []).append(i)
    total = 0.0
    for members in bins.values():
        conf = sum(p[i] for i in members) / len(members)
        acc = sum(mu[i] for i in members) / len(members)
        total += len(members) / len(p) * abs(conf - acc)
    return total


def brute_response_brier(p: list[float], c: list[int], k: list[int]) -> float:
    per_query = []
    for pi, ci, ki in zip(p, c, k, strict=True):
        outcomes = [1.0] * ci + [0.0] * (ki - ci)
        per_query.append(sum((pi - y) ** 2 for y in outcomes) / ki)
    return sum(per_query) / len(per_query)


@settings(max_examples=200, deadline=None)
@given(labelled())
def test_brier_and_ece_match_brute_force(data: tuple[list[float], list[int], list[int]]) -> None:
    p, c, k = data
    mu = [ci / ki for ci, ki in zip(c, k, strict=True)]
    assert metrics.capability_brier(p, mu) == pytest.approx(
        sum((a - b) ** 2 for a, b in zip(p, mu, strict=True)) / len(p)
    )
    for m in (1, 3, 10):
        assert metrics.expected_calibration_error(p, mu, n_bins=m) == pytest.approx(
            brute_ece(p, mu, m), abs=1e-12
        )
    assert metrics.response_brier(p, c, k) == pytest.approx(brute_response_brier(p, c, k), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(labelled())
def test_response_brier_is_capability_brier_plus_variance(
    data: tuple[list[float], list[int], list[int]],
) -> None:
    p, c, k = data
    d = metrics.brier_decomposition(p, c, k)
    assert d.response == pytest.approx(d.capability + d.variance, abs=1e-12)
    assert d.response >= d.capability - 1e-15


def test_ece_counts_confidence_of_exactly_one_in_last_bin() -> None:
    diagram = metrics.reliability_diagram([1.0, 0.95, 0.0], [1.0, 1.0, 0.0])
    assert diagram.counts.tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0, 2]
    assert metrics.expected_calibration_error([1.0], [0.5]) == pytest.approx(0.5)


def test_ece_bin_edges_are_left_closed() -> None:
    # 0.3 belongs to [0.3, 0.4), not [0.2, 0.3).
    assert metrics.reliability_diagram([0.3], [0.3]).counts.tolist()[3] == 1
    assert metrics.reliability_diagram([0.7], [0.7]).counts.tolist()[7] == 1


def test_a_prediction_on_an_edge_lands_in_the_bin_whose_edges_include_it() -> None:
    """floor(p·M) in floats put 0.29 (100 bins) below its edge and 0.7000000000000001 above."""
    for m in (10, 20, 50, 100):
        for p in [b / m for b in range(m + 1)] + [0.29, 0.57, 0.58, 0.7, 0.7000000000000001]:
            d = metrics.reliability_diagram([p], [0.0], n_bins=m)
            (b,) = np.flatnonzero(d.counts)
            assert d.edges[b] <= p < d.edges[b + 1] or (b == m - 1 and p == 1.0), (m, p, b)
    assert metrics.reliability_diagram([0.29], [0.0], n_bins=100).counts[29] == 1
    # 0.28 and 0.29 sit in two bins: the ECE is the mean gap, not the gap of their means
    assert metrics.expected_calibration_error([0.28, 0.29], [0.38, 0.19], n_bins=100) == pytest.approx(0.1)


def test_reliability_diagram_ece_agrees_with_ece_function() -> None:
    rng = np.random.default_rng(0)
    p, mu = rng.random(500), rng.random(500)
    for strategy in ("uniform", "quantile"):
        d = metrics.reliability_diagram(p, mu, n_bins=7, strategy=strategy)
        assert d.ece == pytest.approx(metrics.expected_calibration_error(p, mu, n_bins=7, strategy=strategy))
        assert d.counts.sum() == 500
    empty_bins = metrics.reliability_diagram([0.05], [0.0])
    assert np.isnan(empty_bins.mean_confidence[5])


def test_equal_mass_bins_hold_equal_counts() -> None:
    p = np.linspace(0, 1, 103)
    d = metrics.reliability_diagram(p, p, n_bins=10, strategy="quantile")
    assert set(d.counts.tolist()) <= {10, 11}
    assert d.counts.sum() == 103
    # Sorted predictions are cut into consecutive chunks.
    assert np.all(np.diff(d.edges[1:]) > 0)


def brute_equal_mass_ece(p: list[float], mu: list[float], m: int) -> float:
    order = sorted(range(len(p)), key=lambda i: (p[i], i))
    total = 0.0
    for b in range(m):
        members = [order[j] for j in range(len(order)) if (j * m) // len(order) == b]
        if members:
            conf = sum(p[i] for i in members) / len(members)
            acc = sum(mu[i] for i in members) / len(members)
            total += len(members) / len(p) * abs(conf - acc)
    return total


@settings(max_examples=100, deadline=None)
@given(labelled())
def test_equal_mass_ece_matches_brute_force(data: tuple[list[float], list[int], list[int]]) -> None:
    p, c, k = data
    mu = [ci / ki for ci, ki in zip(c, k, strict=True)]
    got = metrics.expected_calibration_error(p, mu, n_bins=4, strategy="quantile")
    assert got == pytest.approx(brute_equal_mass_ece(p, mu, 4), abs=1e-12)


def test_mae_rmse() -> None:
    assert metrics.mean_absolute_error([0.2, 0.8], [0.0, 1.0]) == pytest.approx(0.2)
    assert metrics.root_mean_squared_error([0.2, 0.8], [0.0, 1.0]) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("p", "mu", "message"),
    [
        ([1.5], [0.5], "`p` must lie in [0, 1]; got 1.5 at index 0"),
        ([float("nan")], [0.5], "`p` must be finite"),
        ([0.5], [-0.1], "`mu` must lie in [0, 1]"),
        ([], [], "`p` must not be empty"),
        ([0.5, 0.5], [0.5], "inputs must have the same length; `p` has 2, `mu` has 1"),
    ],
)
def test_bad_inputs_are_named(p: list[float], mu: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("`", "`")):
        metrics.capability_brier(p, mu)


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="`n_bins` must be a positive integer; got 0"):
        metrics.expected_calibration_error([0.5], [0.5], n_bins=0)
    with pytest.raises(ValueError, match="`strategy` must be 'uniform' or 'quantile'"):
        metrics.expected_calibration_error([0.5], [0.5], strategy="weird")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`correct` must be <= `k`"):
        metrics.response_brier([0.5], [3], 2)
