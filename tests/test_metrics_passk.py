"""pass@k against its combinatorial definition, and the paper's Table 2 figures."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capgate.metrics import (
    dataset_pass_at_k,
    expected_success,
    pass_at_k_mse,
    pass_at_k_predicted,
    pass_at_k_unbiased,
)


@st.composite
def pools(draw: st.DrawFn) -> tuple[int, int, int]:
    n = draw(st.integers(min_value=1, max_value=200))
    c = draw(st.integers(min_value=0, max_value=n))
    k = draw(st.integers(min_value=1, max_value=n))
    return n, c, k


@settings(max_examples=300, deadline=None)
@given(pools())
def test_unbiased_pass_at_k_matches_combinatorial_definition(pool: tuple[int, int, int]) -> None:
    n, c, k = pool
    exact = 1 - comb(n - c, k) / comb(n, k)
    assert pass_at_k_unbiased([n], [c], k)[0] == pytest.approx(exact, abs=1e-12)


def test_unbiased_pass_at_k_is_stable_for_large_pools() -> None:
    # C(1000, 500) overflows a float; the product form does not.
    value = pass_at_k_unbiased([1000], [1], 500)[0]
    assert value == pytest.approx(0.5)


def test_predicted_pass_at_k() -> None:
    assert pass_at_k_predicted([0.0, 0.5, 1.0], 3).tolist() == [0.0, 0.875, 1.0]


def test_k_larger_than_pool_is_rejected() -> None:
    with pytest.raises(ValueError, match="`k` must be <= n for every query; got k=5, smallest n=4"):
        pass_at_k_unbiased([4], [1], 5)


def test_mse_is_zero_for_degenerate_pools() -> None:
    assert pass_at_k_mse([0.0, 1.0], [10, 10], [0, 10], [1, 4]) == {1: 0.0, 4: 0.0}


def test_dataset_interval() -> None:
    interval = dataset_pass_at_k([0.2, 0.9, 0.5], 2)
    s = np.array([1 - 0.8**2, 1 - 0.1**2, 1 - 0.5**2])
    assert interval.mean == pytest.approx(s.mean())
    assert interval.std == pytest.approx(np.sqrt(np.sum(s * (1 - s))) / 3)
    assert interval.low == pytest.approx(s.mean() - 1.959963984540054 * interval.std)


@settings(max_examples=200, deadline=None)
@given(st.lists(pools(), min_size=1, max_size=8))
def test_expected_success_matches_definition(rows: list[tuple[int, int, int]]) -> None:
    n = [r[0] for r in rows]
    c = [r[1] for r in rows]
    k = [r[2] - 1 for r in rows]  # allows 0 draws
    exact = np.mean(
        [0.0 if kk == 0 else 1 - comb(nn - cc, kk) / comb(nn, kk) for nn, cc, kk in zip(n, c, k, strict=True)]
    )
    assert expected_success(k, n, c) == pytest.approx(exact, abs=1e-12)


def test_expected_success_refuses_more_draws_than_pool() -> None:
    with pytest.raises(
        ValueError, match="an allocation cannot exceed the pool; got 3 draws from 2 at index 0"
    ):
        expected_success([3], [2], [1])
