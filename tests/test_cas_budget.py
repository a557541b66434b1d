"""Starting budgets from a capability estimate."""

from __future__ import annotations

import numpy as np
import pytest

from capgate import Estimate
from capgate.cas import allocate_budget, route_by_capability, samples_for_target


@pytest.mark.parametrize("p", [0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.6, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("target", [0.5, 0.9, 0.95, 0.99])
def test_smallest_k_matches_brute_force(p: float, target: float) -> None:
    brute = next(k for k in range(1, 10_000) if 1 - (1 - p) ** k >= target)
    budget = samples_for_target(p, target=target, max_samples=10_000)
    assert budget.k == brute
    assert budget.reaches_target
    assert budget.predicted_pass_at_k == pytest.approx(1 - (1 - p) ** brute)


def test_edge_cases_are_explicit() -> None:
    assert samples_for_target(1.0).k == 1
    zero = samples_for_target(0.0, max_samples=16)
    assert (zero.k, zero.reaches_target, zero.predicted_pass_at_k) == (16, False, 0.0)
    assert "p = 0" in zero.reason
    capped = samples_for_target(0.01, target=0.99, max_samples=32)
    assert capped.k == 32
    assert not capped.reaches_target
    assert capped.predicted_pass_at_k == pytest.approx(1 - 0.99**32)
    missing = samples_for_target(Estimate.unavailable("probe", "server down"), max_samples=8)
    assert missing.k == 8
    assert not missing.reaches_target
    assert missing.predicted_pass_at_k is None
    assert "server down" in missing.reason
    assert samples_for_target(Estimate(p=0.5, method="probe"), target=0.75).k == 2
    with pytest.raises(ValueError, match="`p` must be a probability"):
        samples_for_target(1.5)
    with pytest.raises(ValueError, match="`target` must be in"):
        samples_for_target(0.5, target=1.0)


def test_route_by_capability() -> None:
    assert route_by_capability(0.8, 0.8) == "single"
    assert route_by_capability(0.79, 0.8) == "cas"
    assert route_by_capability(Estimate(p=0.95, method="probe")) == "single"
    degraded = Estimate(p=0.95, method="probe", degraded=True, reason="fallback estimator")
    assert route_by_capability(degraded) == "single"  # a usable value, though weakened
    assert route_by_capability(Estimate.unavailable("probe", "timeout")) == "cas"
    assert route_by_capability(None) == "cas"


def test_allocate_budget_uses_the_greedy_allocator() -> None:
    from capgate.metrics import greedy_allocation

    p = [0.9, 0.5, 0.05, 0.3]
    alloc = allocate_budget([Estimate(p=x, method="probe") for x in p], 12, max_per_query=6)
    assert alloc.sum() == 12
    assert alloc.max() <= 6
    np.testing.assert_array_equal(alloc, greedy_allocation(np.array(p), 12, max_per_query=6))
    with pytest.raises(ValueError, match=r"estimates\[1\] is unavailable \(timeout\)"):
        allocate_budget([0.5, Estimate.unavailable("probe", "timeout")], 4)
    filled = allocate_budget([0.5, None], 4, fill_unavailable=0.5)
    np.testing.assert_array_equal(filled, greedy_allocation(np.array([0.5, 0.5]), 4))
