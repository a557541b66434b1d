"""Starting budgets from a capability estimate."""

from __future__ import annotations

import math
import threading

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


def test_numpy_probabilities_are_accepted_and_bools_refused() -> None:
    import numpy as np

    from capgate.cas import BatchAllocator

    assert samples_for_target(np.float32(0.5)).k == samples_for_target(0.5).k == 5
    assert samples_for_target(np.int64(1)).k == 1
    assert BatchAllocator(np.array([0.5, 0.25], dtype=np.float32), budget=4).priors == [0.5, 0.25]
    for bad in (True, np.True_, np.float32("nan")):
        with pytest.raises(
            ValueError, match=r"`p` must be a probability in \[0, 1\], an Estimate or None; got"
        ):
            samples_for_target(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"estimates\[0\] must be a probability"):
        BatchAllocator([False], budget=2)  # type: ignore[list-item]


@pytest.mark.parametrize("p", [1e-12, 1e-17, 1e-300, 5e-324])
def test_a_vanishing_p_gets_the_cap_at_once(p: float) -> None:
    """A logistic probe gives p ~ 1e-12 at a logit of -27.6: 1 - p rounds to 1.0 there, and a
    search for k one step at a time would never end (a guarded call hung in Policy.decide)."""
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(samples_for_target(p, max_samples=16)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert got, f"samples_for_target({p!r}) did not return within 10 s"
    (budget,) = got
    assert isinstance(budget, type(samples_for_target(0.5)))
    assert (budget.k, budget.reaches_target) == (16, False)
    assert budget.predicted_pass_at_k == pytest.approx(16 * p, rel=1e-6)  # pass@16 = 16 p for a tiny p
    assert "capped at 16" in budget.reason
    tiny = samples_for_target(1e-12, max_samples=10**15)  # a cap that p can reach: the smallest k

    def pass_at(k: int) -> float:
        return -math.expm1(k * math.log1p(-1e-12))

    assert tiny.reaches_target
    assert pass_at(tiny.k) >= 0.95 > pass_at(tiny.k - 1)
