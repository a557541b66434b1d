"""Starting budgets from a capability estimate.

With a verifier (tests, a checker, a proof assistant), one correct response among k suffices, so
the budget is the smallest k with pass@k = 1 − (1 − p)^k >= target. Without one, the model's own
vote must carry the answer: :func:`route_by_capability` sends confident queries to a single sample
and the rest to CAS. For a batch of queries sharing one budget, :func:`allocate_budget` applies the
metrics core's greedy pass@k allocator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from capgate._types import Estimate

__all__ = ["Route", "StartingBudget", "allocate_budget", "route_by_capability", "samples_for_target"]

Route: TypeAlias = Literal["single", "cas"]


class StartingBudget(BaseModel):
    """How many samples to start with, and why.

    Attributes:
        k: Samples to draw.
        reaches_target: Whether the predicted pass@k at ``k`` meets the target.
        predicted_pass_at_k: 1 − (1 − p)^k, or ``None`` when p was unavailable.
        reason: A human-readable account of the choice.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(ge=1)
    reaches_target: bool
    predicted_pass_at_k: float | None
    reason: str


def _as_p(p: float | Estimate | None, where: str) -> tuple[float | None, str | None]:
    if isinstance(p, Estimate):
        return p.p, (p.reason or "estimate degraded") if p.p is None else None
    if p is None:
        return None, "no estimate"
    if not (isinstance(p, int | float) and math.isfinite(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"{where} must be a probability in [0, 1], an Estimate or None; got {p!r}")
    return float(p), None


def samples_for_target(
    p: float | Estimate | None, *, target: float = 0.95, max_samples: int = 64
) -> StartingBudget:
    """The smallest k with 1 − (1 − p)^k >= ``target`` (a verifier picks any correct one), capped.

    Explicit edge cases: p = 1 needs one sample; p = 0 can never reach the target, so the budget
    is the cap with ``reaches_target=False`` (whether to spend it is the policy's call); an
    unavailable or degraded-without-value estimate gets the cap too, since without a prediction the
    only safe budget is the most the caller allows. A p so small that the target needs more than
    ``max_samples`` gets the cap and ``reaches_target=False``.

    Example:
        >>> samples_for_target(0.5, target=0.95).k
        5
        >>> b = samples_for_target(0.0, max_samples=16)
        >>> b.k, b.reaches_target
        (16, False)
    """
    if not (isinstance(target, int | float) and 0.0 < target < 1.0):
        raise ValueError(f"`target` must be in (0, 1); got {target!r}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
        raise ValueError(f"`max_samples` must be a positive integer; got {max_samples!r}")
    value, why = _as_p(p, "`p`")
    if value is None:
        return StartingBudget(
            k=max_samples,
            reaches_target=False,
            predicted_pass_at_k=None,
            reason=f"capability unavailable ({why}); spending the cap of {max_samples}",
        )
    if value >= 1.0:
        return StartingBudget(k=1, reaches_target=True, predicted_pass_at_k=1.0, reason="p = 1: one sample")
    if value <= 0.0:
        return StartingBudget(
            k=max_samples,
            reaches_target=False,
            predicted_pass_at_k=0.0,
            reason=f"p = 0: no budget reaches pass@k >= {target:g}; capped at {max_samples}",
        )
    # (1-p)^k <= 1-target  <=>  k >= log(1-target) / log(1-p); guard the ceiling against rounding.
    k = max(1, math.ceil(math.log1p(-target) / math.log1p(-value) - 1e-12))
    while k > 1 and 1.0 - (1.0 - value) ** (k - 1) >= target:
        k -= 1
    while 1.0 - (1.0 - value) ** k < target:
        k += 1
    if k > max_samples:
        reached = 1.0 - (1.0 - value) ** max_samples
        return StartingBudget(
            k=max_samples,
            reaches_target=False,
            predicted_pass_at_k=reached,
            reason=f"p = {value:.3g} needs k = {k} for pass@k >= {target:g}; capped at {max_samples}",
        )
    return StartingBudget(
        k=k,
        reaches_target=True,
        predicted_pass_at_k=1.0 - (1.0 - value) ** k,
        reason=f"smallest k with 1-(1-p)^k >= {target:g} at p = {value:.3g}",
    )


def route_by_capability(p: float | Estimate | None, threshold: float = 0.8) -> Route:
    """Without a verifier: ``"single"`` (one sample) when p >= ``threshold``, else ``"cas"``.

    An unavailable estimate routes to ``"cas"``: without a prediction a lone sample is not trusted
    (fail closed; CAS's own stop rule then decides how many samples the query needs).

    Example:
        >>> route_by_capability(0.93), route_by_capability(0.4), route_by_capability(None)
        ('single', 'cas', 'cas')
    """
    if not (isinstance(threshold, int | float) and 0.0 <= threshold <= 1.0):
        raise ValueError(f"`threshold` must be in [0, 1]; got {threshold!r}")
    value, _ = _as_p(p, "`p`")
    return "single" if value is not None and value >= threshold else "cas"


def allocate_budget(
    estimates: Sequence[float | Estimate | None],
    budget: int,
    *,
    max_per_query: int | None = None,
    fill_unavailable: float | None = None,
) -> NDArray[np.int64]:
    """Split ``budget`` samples over queries by the greedy pass@k allocator of the metrics core.

    Delegates to :func:`capgate.metrics.greedy_allocation` (each next sample goes to the query whose
    predicted pass@k gains most). An unavailable estimate is an error naming its index unless
    ``fill_unavailable`` gives an explicit stand-in value: no silent default.

    Example:
        >>> allocate_budget([0.9, 0.2], 4).sum()
        np.int64(4)
    """
    from capgate.metrics import greedy_allocation

    p = np.asarray(_capabilities(estimates, fill_unavailable=fill_unavailable), dtype=np.float64)
    return np.asarray(greedy_allocation(p, budget, max_per_query=max_per_query), dtype=np.int64)


def _capabilities(
    estimates: Sequence[float | Estimate | None], *, fill_unavailable: float | None = None
) -> list[float]:
    """The capability of each estimate for a batch allocator: an unavailable one is an error
    naming its index unless ``fill_unavailable`` gives an explicit stand-in (no silent default)."""
    out: list[float] = []
    for i, estimate in enumerate(estimates):
        value, why = _as_p(estimate, f"estimates[{i}]")
        if value is None:
            if fill_unavailable is None:
                raise ValueError(
                    f"estimates[{i}] is unavailable ({why}); pass fill_unavailable=... to allocate anyway"
                )
            filled, _ = _as_p(fill_unavailable, "`fill_unavailable`")
            value = 0.0 if filled is None else filled
        out.append(value)
    return out
