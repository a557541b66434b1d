"""The thresholds step of :func:`~capgate.learn.calibrate`: Learn-then-Test on the kept
estimator's cross-fitted confidences, floored where enforced traffic left blocked queries
without outcomes, written into a policy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from capgate._util.validate import FloatArray
from capgate.learn._probe import by_query
from capgate.learn._traffic import Traffic
from capgate.learn.thresholds import (
    base_policy,
    floored_threshold,
    no_threshold_message,
    policy_header,
    risk_summary,
)

if TYPE_CHECKING:
    from capgate.policies import Policy


def _floor(traffic: Traffic, fitted: Any, kind: str) -> tuple[float | None, str]:
    """The kept estimator's confidence at the lowest enforced estimate that has an outcome, and
    whose estimates those are; with no enforced outcome yet, at the lowest estimate that has one
    (shadow traffic); ``None`` without any estimate."""
    rows, scope = ~traffic.shadow & traffic.estimated, "enforced "
    if not rows.any():
        rows, scope = traffic.estimated, ""
    if not rows.any():
        return None, scope
    if kind in ("isotonic", "platt") and fitted is not None:
        return float(fitted.predict(np.array([traffic.base_p[rows].min()]))[0]), scope
    return float(traffic.p[rows].min()), scope


def _per_query(conf: FloatArray, traffic: Traffic) -> tuple[FloatArray, FloatArray] | None:
    """One row per query when queries recur (the mean confidence and the mean outcome of its
    decisions, skipping NaN confidences), else ``None``."""
    groups = traffic.groups
    if groups is None:
        return None
    keep = ~np.isnan(conf)
    if np.unique(groups[keep]).size == int(keep.sum()):
        return None
    mean_conf, mean_y = by_query(conf[keep, None], traffic.y[keep], groups[keep])
    return mean_conf[:, 0], mean_y


def certify(
    conf: FloatArray,
    traffic: Traffic,
    *,
    fitted: Any,
    kind: str,
    risk: float,
    delta: float,
    policy: str | Path | Policy | None,
    seed: int,
    notes: list[str],
) -> tuple[float | None, str | None, dict[str, Any]]:
    """The certified threshold, the policy file's text, and the figures (``None``s and a note
    when nothing can be certified).

    Args:
        conf: The kept estimator's confidence per row of ``traffic``, each from a fit that never
            saw the row's outcome (NaN: none).
        traffic: The window.
        fitted: The kept map (isotonic/Platt), else ``None``.
        kind: The kept candidate's kind.
        risk: Allowed error rate among answered queries.
        delta: Allowed probability of exceeding it.
        policy: The policy to set the answer edge of (default: the decisions' preset, if any).
        seed: Seed of the one-response draw.
        notes: Where to say what was decided.
    """
    from capgate.decision.analysis.risk import calibrate_threshold
    from capgate.policies import PRESETS

    per_query = _per_query(conf, traffic)
    if per_query is None:  # a row without a confidence is never answered: the fallback acts
        known = ~np.isnan(conf)
        result = calibrate_threshold(conf[known], traffic.y[known], alpha=risk, delta=delta, seed=seed)
    else:  # outcomes of one query are not independent trials: test over queries, not outcomes
        q_conf, q_mu = per_query
        result = calibrate_threshold(
            q_conf, q_mu, alpha=risk, delta=delta, pvalue="hoeffding-bentkus", loss="expected", seed=seed
        )
        used = int((~np.isnan(conf)).sum())
        left_out = (
            f" ({len(traffic) - used} of the {len(traffic)} had no confidence and were left out)"
            if used < len(traffic)
            else ""
        )
        notes.append(
            f"thresholds tested over {len(q_mu)} distinct queries (their mean outcome each, "
            f"Hoeffding-Bentkus), not the {used} outcomes{left_out}: a recurring query's outcomes are "
            "not independent trials"
        )
    info: dict[str, Any] = {
        **risk_summary(result),
        "certified": result.threshold,  # before any floor
        "selection_gap": traffic.blocked_without_outcome,
    }
    floor: float | None = None
    scope = "enforced "
    if traffic.blocked_without_outcome:
        if kind == "probe":
            info["threshold"] = None
            notes.append(
                f"no threshold: {traffic.blocked_without_outcome} enforced decisions were blocked "
                "without outcomes, and a probe orders queries its own way, so nothing bounds the "
                "risk of those it would now answer; log shadow traffic to calibrate its thresholds"
            )
            return None, None, info
        floor, scope = _floor(traffic, fitted, kind)
        info["floor"] = floor
    threshold = floored_threshold(result, floor)
    info["threshold"] = threshold
    if threshold is None:
        notes.append(
            no_threshold_message(
                result, advice="more outcomes or a larger risk would help. No policy written."
            )
            if result.threshold is None
            else f"no threshold: none certified at or above {floor:g}, the confidence of the lowest "
            f"{scope}estimate with an outcome (blocked queries have none). No policy written."
        )
        return None, None, info
    extra = []
    if threshold != result.threshold:
        extra.append(
            f"Raised from {result.threshold:g} to {threshold:g}: {scope or 'all '}traffic has outcomes only "
            f"down to p = {floor:g} ({traffic.blocked_without_outcome} blocked decisions without any)."
        )
        notes.append(extra[0])
    preset = traffic.policy if traffic.policy in PRESETS else None
    chosen = policy if policy is not None else preset
    base = base_policy(chosen, name=f"calibrated-{traffic.target or traffic.method}")
    calibrated, changes = base.with_answer_threshold(threshold)
    header = policy_header(
        command="capgate calibrate",
        data=f"{len(traffic)} logged decisions with outcomes of target {traffic.target!r}, method "
        f"{traffic.method!r}, from {traffic.window['first']} to {traffic.window['last']}",
        result=result,
        threshold=threshold,
        based_on=_describe(chosen),
        notes=[*changes, *extra],
        when=traffic.at[-1],
    )
    return threshold, calibrated.to_yaml(header=header), info


def _describe(policy: str | Path | Policy | None) -> str:
    if policy is None:
        return "a new two-band policy"
    return str(policy) if isinstance(policy, str | Path) else f"policy {policy.name!r}"
