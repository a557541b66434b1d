"""Risk-controlled answer thresholds written into a policy: the steps ``capgate policy calibrate``
and ``capgate calibrate`` share (the base policy, the Learn-then-Test summary, the message when
nothing can be certified, and the calibrated policy file's header).

The test itself is :func:`capgate.decision.analysis.risk.calibrate_threshold`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from capgate.decision.analysis.risk import RiskControl
from capgate.policies import Policy, load_policy

__all__ = [
    "base_policy",
    "floored_threshold",
    "no_threshold_message",
    "policy_header",
    "risk_summary",
]


def base_policy(policy: str | Path | Policy | None, *, name: str, below: str = "abstain") -> Policy:
    """The policy whose answer threshold is set: ``policy`` (a policy, preset or file), else a new
    two-band one (``below`` under the threshold, answer at or above it; ``below`` on degraded).

    Raises:
        PolicyError, DataError: ``policy`` cannot be loaded.

    Examples:
        >>> base_policy(None, name="mine").rule().edges
        ((0.0, 0.5), (0.5, 1.0))
    """
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        return load_policy(policy)
    bands = [{"below": 0.5, "action": below}, {"action": "answer"}]
    return Policy.model_validate({"name": name, "bands": bands, "on_degraded": below})


def risk_summary(result: RiskControl) -> dict[str, Any]:
    """The Learn-then-Test result as JSON-able figures (NaN as ``None``)."""
    return {
        "threshold": result.threshold,
        "alpha": result.alpha,
        "delta": result.delta,
        "pvalue": result.pvalue,
        "loss": result.loss,
        "procedure": result.procedure,
        "n": result.n,
        "n_unusable": result.n_unusable,
        "n_answered": result.n_answered,
        "coverage": result.coverage,
        "risk": None if math.isnan(result.risk) else result.risk,
        "mean_mu_answered": None if math.isnan(result.mean_mu) else result.mean_mu,
        "tests": len(result.tests),
    }


def no_threshold_message(result: RiskControl, *, advice: str) -> str:
    """Why no threshold was certified (the closest test, or too few answered) and ``advice``."""
    if result.tests:
        best = min(result.tests, key=lambda t: t.pvalue / t.level)
        where = (
            f"none of {len(result.tests)} tests rejected (closest: threshold {best.threshold:g}, "
            f"{best.n_answered} answered, risk {best.risk:.4f}, "
            f"p-value {best.pvalue:.3g} at level {best.level:.3g})"
        )
    else:
        where = f"no threshold answers the {result.min_answered} queries needed to certify anything"
    return (
        f"no threshold keeps the risk <= {result.alpha:g} with probability >= {1 - result.delta:g} "
        f"on this data: {where}. Answering nothing is the only certified choice; {advice}"
    )


def floored_threshold(result: RiskControl, floor: float | None) -> float | None:
    """The lowest certified threshold at or above ``floor`` (``result.threshold`` without one).

    Every rejected test certifies its own threshold, so raising the answer edge to the lowest
    rejected one at or above ``floor`` keeps the guarantee; ``None`` when no such test rejected.
    """
    if result.threshold is None or floor is None or result.threshold >= floor:
        return result.threshold
    certified = [t.threshold for t in result.tests if t.rejected and t.threshold >= floor]
    return min(certified) if certified else None


def policy_header(
    *,
    command: str,
    data: str,
    result: RiskControl,
    threshold: float,
    based_on: str,
    notes: Sequence[str] = (),
    when: datetime | None = None,
) -> str:
    """The comment lines heading a calibrated policy file: what made it, on what, and its claim
    (``when``: the time it names, default now)."""
    return "\n".join(
        [
            f"Calibrated by `{command}` on {when or datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
            f"Data: {data}.",
            f"Answer when p >= {threshold:g}: the error rate among answered queries is <= "
            f"{result.alpha:g} with probability >= {1 - result.delta:g}",
            f"(Learn-then-Test, {result.procedure} testing, {result.pvalue} p-value, {result.loss} loss).",
            f"On the calibration data: coverage {result.coverage:.3f}, "
            f"mean µ̂ of answered {result.mean_mu:.4f}.",
            f"Based on: {based_on}.",
            *notes,
        ]
    )
