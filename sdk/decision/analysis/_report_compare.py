"""A candidate calibration against the enforced one, on the same decisions (``capgate report``).

A gate with ``shadow_calibration`` decides every call under the enforced version (decision d,
acted on) and the candidate (decision c, a shadow decision with ``c.beside == d.id``). Both are
scored against **d's outcome**: capability Brier of each and their paired difference (candidate −
enforced, normal 95% interval), AUROC of each, the share each lets through, the accuracy of what
each lets through (Wilson), and how often their actions agree. In enforce mode only the calls d
let through have outcomes: the comparison rests on those, and counts the pairs d stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from capgate._util.jsonl import json_ready
from capgate.decision.analysis._report_stats import Z95, Rate, soft_auroc, wilson
from capgate.decision.analysis.simulate import ACTIONS
from capgate.decision.store.schema import OUTCOME_VALUE

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog

_THROUGH = (ACTIONS.index("answer"), ACTIONS.index("resample"))


@dataclass(frozen=True)
class VersionComparison:
    """A candidate calibration version against the enforced one on the same decisions.

    Attributes:
        target: The model the decisions were for.
        enforced: The enforced decisions' calibration version (``None``: uncalibrated).
        candidate: The candidate's calibration version.
        pairs: Pairs (enforced decision, candidate decision made beside it) in the window.
        with_outcome: Of those, pairs whose enforced decision has an outcome.
        stopped_without_outcome: Pairs whose enforced decision stopped the call and has no outcome.
        enough_outcomes: Whether ``with_outcome`` reaches the report's ``min_outcomes``.
        brier_enforced: Capability Brier of the enforced estimates on the scored pairs.
        brier_candidate: Capability Brier of the candidate's estimates on the same pairs.
        brier_difference: candidate − enforced (negative: the candidate is better), with the
            normal interval of the mean paired difference.
        auroc_enforced: AUROC of the enforced estimates (``None`` if every outcome agrees).
        auroc_candidate: AUROC of the candidate's estimates.
        coverage_enforced: Share of all pairs the enforced decision let through.
        coverage_candidate: Share of all pairs the candidate would have let through.
        accuracy_enforced: Accuracy of the scored pairs the enforced decision let through.
        accuracy_candidate: Accuracy of the scored pairs the candidate would have let through.
        agreement: Share of all pairs where both took the same action.
        notes: What the figures rest on.
    """

    target: str | None
    enforced: str | None
    candidate: str | None
    pairs: int
    with_outcome: int
    stopped_without_outcome: int
    enough_outcomes: bool
    brier_enforced: Rate | None = None
    brier_candidate: Rate | None = None
    brier_difference: Rate | None = None
    auroc_enforced: float | None = None
    auroc_candidate: float | None = None
    coverage_enforced: Rate | None = None
    coverage_candidate: Rate | None = None
    accuracy_enforced: Rate | None = None
    accuracy_candidate: Rate | None = None
    agreement: Rate | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``target: candidate vs enforced``, with ``-`` for what is not set."""
        return f"{self.target or '-'}: {self.candidate or '-'} vs {self.enforced or '-'}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes None)."""
        return {**json_ready(self), "label": self.label}


def _mean_rate(values: NDArray[np.float64], low: float = 0.0, high: float = 1.0) -> Rate:
    """The mean of ``values`` with its normal 95% interval, clipped to [low, high]."""
    n = values.size
    mean = float(values.mean())
    half = Z95 * float(values.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
    return Rate(mean, max(low, mean - half), min(high, mean + half), n, "normal")


def _auroc(p: NDArray[np.float64], y: NDArray[np.float64]) -> float | None:
    value = soft_auroc(p, y)
    return value if math.isfinite(value) else None


def _compare(key: tuple[Any, ...], rows: NDArray[np.float64], min_outcomes: int) -> VersionComparison:
    """One (target, enforced, candidate)'s pairs: rows of (c action, d action, c p, d p, y)."""
    target, enforced, candidate = key
    c_act, d_act, c_p, d_p, y = (rows[:, j] for j in range(5))
    n = int(rows.shape[0])
    scored = ~np.isnan(y)
    c_through, d_through = np.isin(c_act, _THROUGH), np.isin(d_act, _THROUGH)
    stopped_unknown = int((~d_through & ~scored).sum())
    n_scored = int(scored.sum())
    enough = n_scored >= min_outcomes
    notes: list[str] = []
    if stopped_unknown:
        notes.append(
            f"{stopped_unknown} pairs were stopped by the enforced version and have no outcome: "
            "the comparison rests on the calls it let through"
        )
    if not enough:
        notes.append(
            f"only {n_scored} pairs have an outcome (at least {min_outcomes} needed): no rate is given"
        )
        return VersionComparison(
            target, enforced, candidate, n, n_scored, stopped_unknown, False, notes=notes
        )
    both = scored & ~np.isnan(c_p) & ~np.isnan(d_p)
    if int(both.sum()) < n_scored:
        notes.append(
            f"{n_scored - int(both.sum())} scored pairs lack an estimate on one side: left out of Brier"
        )
    yy, cp, dp = y[both], c_p[both], d_p[both]
    briers: tuple[Rate | None, Rate | None, Rate | None] = (None, None, None)
    if yy.size >= 2:
        c_err, d_err = (cp - yy) ** 2, (dp - yy) ** 2
        briers = (_mean_rate(d_err), _mean_rate(c_err), _mean_rate(c_err - d_err, -1.0, 1.0))
    return VersionComparison(
        target,
        enforced,
        candidate,
        n,
        n_scored,
        stopped_unknown,
        True,
        brier_enforced=briers[0],
        brier_candidate=briers[1],
        brier_difference=briers[2],
        auroc_enforced=_auroc(dp, yy) if yy.size else None,
        auroc_candidate=_auroc(cp, yy) if yy.size else None,
        coverage_enforced=wilson(float(d_through.sum()), n),
        coverage_candidate=wilson(float(c_through.sum()), n),
        accuracy_enforced=wilson(float(y[d_through & scored].sum()), int((d_through & scored).sum())),
        accuracy_candidate=wilson(float(y[c_through & scored].sum()), int((c_through & scored).sum())),
        agreement=wilson(float((c_act == d_act).sum()), n),
        notes=notes,
    )


def action_code(alias: str) -> str:
    """SQL for the index in :data:`ACTIONS` of the action of decision row ``alias``."""
    return f"CASE {alias}.action " + " ".join(f"WHEN '{a}' THEN {i}" for i, a in enumerate(ACTIONS)) + " END"


def compare_versions(
    log: DecisionLog, window: tuple[str, list[Any]], source: str | None, min_outcomes: int
) -> list[VersionComparison]:
    """Each (target, enforced version, candidate version)'s paired comparison in the window
    (``window``: a WHERE clause on ``d.created_at`` and its parameters, applied to the candidate's
    decisions), most pairs first."""
    dialect = log.store.dialect
    y = "e.outcome_y"
    params: list[Any] = []
    if source is not None:
        value = dialect.render(OUTCOME_VALUE)
        y = f"(SELECT AVG({value}) FROM outcomes o WHERE o.decision_id = e.id AND o.source = ?)"
        params.append(source)
    where, window_params = window  # d: the candidate's decision; e: the enforced one beside it
    where = " WHERE d.beside IS NOT NULL" + (where.replace(" WHERE ", " AND ", 1) if where else "")
    sql = (
        f"SELECT e.target, e.calibration, d.calibration, {action_code('d')}, {action_code('e')}, d.p, e.p,"
        f" {y} FROM decisions d JOIN decisions e ON e.id = d.beside{where}"
    )
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in log.store.read(sql, params + window_params):
        groups.setdefault(tuple(row[:3]), []).append(row[3:])
    found = [
        _compare(key, np.array(rows, dtype=np.float64).reshape(len(rows), 5), min_outcomes)
        for key, rows in groups.items()
    ]
    return sorted(found, key=lambda c: (-c.pairs, c.label))
