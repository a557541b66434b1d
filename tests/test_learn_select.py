"""The held-out comparison when queries recur: outcomes of one query are one piece of evidence.

A probe on logged features can fit a handful of recurring queries; counted outcome by outcome,
its held-out advantage looks many times surer than it is. These tests pin the cluster-robust
intervals and the per-query probe fit that keep such a probe from replacing the estimator.
"""

from __future__ import annotations

import numpy as np
import pytest

from capgate.learn import select, table_rows
from capgate.learn._probe import by_query, fit_probe


def _recurring_window() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """8 queries, 25 outcomes each, every outcome of a query the same; a challenger closer than
    the flat previous estimator on 5 queries and further on 3."""
    per_query_y = np.array([1, 0, 1, 0, 1, 0, 1, 0], dtype=float)
    closer = np.array([True, True, True, True, True, False, False, False])
    p_q = np.where(closer, np.where(per_query_y == 1, 0.6, 0.4), np.where(per_query_y == 1, 0.4, 0.6))
    groups = np.repeat([f"q{i}" for i in range(8)], 25)
    return np.repeat(per_query_y, 25), np.full(200, 0.5), np.repeat(p_q, 25), groups


def test_recurring_outcomes_do_not_count_as_independent_evidence() -> None:
    y, previous, challenger, groups = _recurring_window()
    naive = table_rows(y, {"previous": previous, "platt": challenger}, n_fit={})
    grouped = table_rows(y, {"previous": previous, "platt": challenger}, n_fit={}, groups=groups)
    assert naive[1].diff == grouped[1].diff < 0  # the same mean difference...
    assert select(naive)[0] == "platt"  # ...sure enough over 200 outcomes,
    assert select(grouped)[0] == "previous"  # not over 8 queries
    assert grouped[1].diff_high - grouped[1].diff > 3 * (naive[1].diff_high - naive[1].diff)


def test_distinct_queries_give_the_plain_interval() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(150) < 0.4).astype(float)
    p = {"previous": np.full(150, 0.5), "isotonic": rng.uniform(0.2, 0.6, 150)}
    plain = table_rows(y, p, n_fit={})
    own = table_rows(y, p, n_fit={}, groups=[f"q{i}" for i in range(150)])
    for a, b in zip(plain, own, strict=True):
        assert np.isclose(a.diff_high, b.diff_high)
        assert np.isclose(a.brier_high, b.brier_high)


def test_groups_must_match_the_outcomes() -> None:
    with pytest.raises(ValueError, match="one label per outcome"):
        table_rows(np.zeros(4), {"previous": np.zeros(4)}, n_fit={}, groups=["a", "b"])


def test_the_probe_is_fitted_on_one_row_per_query() -> None:
    rng = np.random.default_rng(0)
    n_queries, rounds = 60, 5
    X_q = rng.normal(size=(n_queries, 6)).astype(np.float32)
    mu = 1 / (1 + np.exp(-2 * X_q[:, 0]))
    order = np.concatenate([rng.permutation(n_queries) for _ in range(rounds)])
    y = (rng.random(order.size) < mu[order]).astype(float)
    X_rows, y_rows = by_query(X_q[order], y, order)
    assert X_rows.shape == (n_queries, 6)
    first = order[np.sort(np.unique(order, return_index=True)[1])]
    np.testing.assert_array_equal(X_rows, X_q[first])  # first-seen order, the query's features
    np.testing.assert_allclose(y_rows, [y[order == q].mean() for q in first])
    probe = fit_probe(X_q[order], y, spec={}, target=None, source="test", seed=0, groups=order)
    assert probe.training_["n"] == n_queries
    assert "60 queries" in probe.training_["source"]
    assert np.corrcoef(probe.predict(X_q), mu)[0, 1] > 0.8


def test_a_challenger_without_a_cross_fitted_brier_fails_the_veto() -> None:
    """Anything short of both checks keeps the previous estimator: a missing cross-fitted Brier
    (cross-fitting made no predictions) is no passed veto."""
    y = np.array([0.0, 1.0] * 50)
    predictions = {"previous": np.full(100, 0.5), "platt": 0.1 + 0.8 * y}
    missing = table_rows(y, predictions, n_fit={}, crossfit_brier={"previous": 0.25, "platt": None})
    assert select(missing)[0] == "previous"
    confirmed = table_rows(y, predictions, n_fit={}, crossfit_brier={"previous": 0.25, "platt": 0.2})
    assert select(confirmed)[0] == "platt"
    assert select(table_rows(y, predictions, n_fit={}))[0] == "platt"  # no cross-fitting asked for
