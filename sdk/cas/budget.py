"""A query's sample budget from its capability estimate.

With a verifier (tests, a checker, a proof assistant) one correct response among k suffices, so
the budget is the smallest k with pass@k = 1 − (1 − p)^k >= target (:func:`samples_for_target`, as
a policy's ``target_pass_at_k``). A batch's shared budget is split by
:class:`~capgate.cas.BatchAllocator` or :func:`capgate.metrics.greedy_allocation`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capgate._util.validate import check_positive_int, check_unit_interval
from capgate.core.types import Estimate

__all__ = ["StartingBudget", "samples_for_target"]


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
    real = isinstance(p, numbers.Real) and not isinstance(p, bool | np.bool_)  # numpy floats too, no bools
    if not (real and math.isfinite(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"{where} must be a probability in [0, 1], an Estimate or None; got {p!r}")
    return float(p), None


def samples_for_target(
    p: float | Estimate | None, *, target: float = 0.95, max_samples: int = 64
) -> StartingBudget:
    """The smallest k with 1 − (1 − p)^k >= ``target`` (a verifier picks any correct one), capped.

    p = 1 needs one sample. p = 0, or a p needing more than ``max_samples``, gets the cap with
    ``reaches_target=False`` (whether to spend it is the policy's call); so does an unavailable
    estimate (without a prediction the only safe budget is the most the caller allows).

    Examples:
        >>> samples_for_target(0.5, target=0.95).k
        5
        >>> b = samples_for_target(0.0, max_samples=16)
        >>> b.k, b.reaches_target
        (16, False)
    """
    check_unit_interval("target", target, open_ends=True)
    check_positive_int("max_samples", max_samples)
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
    # (1-p)^k <= 1-target  <=>  k >= log(1-target) / log(1-p), computed without 1 - p (which is
    # 1.0 for a p below 1e-16, where a search one k at a time would never end).
    needed = math.log1p(-target) / math.log1p(-value)
    if needed > max_samples:
        needs = f"needs k = {math.ceil(needed)}" if math.isfinite(needed) else "needs more samples than any k"
        return StartingBudget(
            k=max_samples,
            reaches_target=False,
            predicted_pass_at_k=_pass_at_k(value, max_samples),
            reason=f"p = {value:.3g} {needs} for pass@k >= {target:g}; capped at {max_samples}",
        )
    k = max(1, math.ceil(needed - 1e-12))  # then k <= max_samples: guard the ceiling against rounding
    while k > 1 and _pass_at_k(value, k - 1) >= target:
        k -= 1
    while _pass_at_k(value, k) < target:
        k += 1
    if k > max_samples:
        return StartingBudget(
            k=max_samples,
            reaches_target=False,
            predicted_pass_at_k=_pass_at_k(value, max_samples),
            reason=f"p = {value:.3g} needs k = {k} for pass@k >= {target:g}; capped at {max_samples}",
        )
    return StartingBudget(
        k=k,
        reaches_target=True,
        predicted_pass_at_k=_pass_at_k(value, k),
        reason=f"smallest k with 1-(1-p)^k >= {target:g} at p = {value:.3g}",
    )


def _pass_at_k(p: float, k: int) -> float:
    """1 − (1 − p)^k, accurate for a tiny p too."""
    return -math.expm1(k * math.log1p(-p))


def _capabilities(
    estimates: Sequence[float | Estimate | None], *, fill_unavailable: float | None = None
) -> list[float]:
    """Each estimate's capability; an unavailable one is an error unless ``fill_unavailable``."""
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
