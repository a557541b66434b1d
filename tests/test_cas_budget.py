"""Starting budgets from a capability estimate."""

from __future__ import annotations

import pytest

from capgate import Estimate
from capgate.cas import samples_for_target


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
    with pytest.raises(ValueError, match=r"`target` must be a number in \(0, 1\); got 1.0"):
        samples_for_target(0.5, target=1.0)
