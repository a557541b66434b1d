"""Greedy budget allocation: optimal on tiny instances (checked exhaustively), caps respected."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capgate.metrics import expected_success, greedy_allocation, uniform_allocation


def objective(p: list[float], allocation: tuple[int, ...] | list[int]) -> float:
    clipped = [min(max(x, 1e-6), 1 - 1e-6) for x in p]
    return sum(1 - (1 - x) ** k for x, k in zip(clipped, allocation, strict=True))


def exhaustive_best(p: list[float], budget: int, caps: list[int]) -> float:
    best = -1.0
    for allocation in itertools.product(*(range(c + 1) for c in caps)):
        if sum(allocation) == min(budget, sum(caps)):
            best = max(best, objective(p, allocation))
    return best


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=4),
    st.integers(min_value=0, max_value=7),
    st.data(),
)
def test_greedy_is_optimal_on_tiny_instances(p: list[float], budget: int, data: st.DataObject) -> None:
    caps = data.draw(st.lists(st.integers(min_value=0, max_value=4), min_size=len(p), max_size=len(p)))
    allocation = greedy_allocation(p, budget, max_per_query=caps)
    assert allocation.sum() == min(budget, sum(caps))
    assert np.all(allocation <= np.array(caps))
    assert objective(p, allocation.tolist()) == pytest.approx(exhaustive_best(p, budget, caps), abs=1e-9)


def test_greedy_prefers_uncertain_queries() -> None:
    assert greedy_allocation([0.9, 0.1], 3).tolist() == [1, 2]
    # Certain queries still get their first sample before anyone gets a tenth.
    assert greedy_allocation([1.0, 0.5], 2).tolist() == [1, 1]


def test_uniform_allocation_spreads_remainder_and_caps() -> None:
    assert uniform_allocation(3, 7).tolist() == [3, 2, 2]
    assert uniform_allocation(2, 10, max_per_query=[3, 100]).tolist() == [3, 5]


def test_bad_budget_is_named() -> None:
    with pytest.raises(ValueError, match="`budget` must be an integer >= 0; got -1"):
        greedy_allocation([0.5], -1)


def test_greedy_then_exact_evaluation_on_pools() -> None:
    n, c = np.array([4, 4]), np.array([4, 0])
    allocation = greedy_allocation([0.99, 0.01], 8, max_per_query=n)
    assert allocation.tolist() == [4, 4]
    assert expected_success(allocation, n, c) == 0.5
