"""What the gate buys, from the decision log: ``capgate report`` and :func:`gate_report`.

For a time window, decisions are grouped by policy, step, tool, target, mode (``shadow``,
``enforce``, or ``candidate``: a candidate calibration's shadow decisions, scored on the outcome of
the enforced decision each was made beside) and calibration version. Each group gives its
decisions by action (for shadow decisions, the actions the gate *would* have taken) and, where
outcomes exist: the accuracy of everything (the ungated agent) against that of what the gate let
through (``answer``, ``resample``) and the coverage (in shadow mode, "had we enforced this
policy"); the wrong and right answers stopped (``abstain``, ``clarify``, ``escalate``) as outcome
mass and as shares; escalations and their outcomes; ``route`` decisions apart (another model
answered); samples spent; the gate's latency (p50/p95; in shadow mode what it would have added);
and the calibration of the estimates (capability Brier, ECE, AUROC: :mod:`capgate.metrics`).

A decision's outcome y in [0, 1] is the mean over its sources (or only ``source``) of each
outcome's :attr:`~capgate.Outcome.value`. Decisions without one are counted, never guessed. Every
rate has a 95% interval: Wilson's for proportions (for a fractional y, the Wilson interval of its
mean: conservative), a bootstrap for the calibration metrics (resamples of at most 2,000
decisions, widths rescaled by sqrt(m / n)). A group with fewer than ``min_outcomes`` outcomes says
how many it has and gives no outcome-based rate; a rate whose denominator is 0 is ``None``.

Only the needed columns are read, off a covering index (groups and samples summed in SQL; each
decision's y kept in its row, ``outcome_y``, by the transaction that writes an outcome), so a
million decisions take seconds (``bench/report_bench.py``); with ``source``, y is averaged from
that source's outcomes (one index lookup per decision). A candidate policy (``policy=``) is
replayed by :func:`capgate.decision.analysis.simulate.replay_policy`, as in ``capgate simulate``.
A candidate calibration is compared with the enforced one on the same decisions
(:mod:`capgate.decision.analysis._report_compare`: :attr:`GateReport.comparisons`).

Examples:
    >>> import os, tempfile
    >>> from capgate import Estimate
    >>> from capgate.decision import Decision, DecisionLog
    >>> log = DecisionLog(os.path.join(tempfile.mkdtemp(), "d.sqlite3"))
    >>> for i in range(40):
    ...     p = 0.9 if i % 2 else 0.1
    ...     d = Decision(action="answer" if p > 0.5 else "abstain", estimate=Estimate(p=p, method="m"),
    ...                  reason="r", policy="balanced", shadow=True)
    ...     _ = log.record(d)
    ...     _ = log.record_outcome(d.id, correct=i % 2 == 1 or i % 4 == 0, source="grader")
    >>> (group,) = gate_report(log).groups
    >>> group.mode, group.actions["abstain"], group.accuracy_all.value, group.accuracy_gated.value
    ('shadow', 20, 0.75, 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from capgate._util.jsonl import json_ready
from capgate._util.validate import check_int_at_least
from capgate.core.types import Action
from capgate.decision.analysis._report_compare import VersionComparison, action_code, compare_versions
from capgate.decision.analysis._report_stats import Calibration, Rate, bootstrap_calibration, wilson
from capgate.decision.analysis.simulate import ACTIONS, ReplaySummary, replay_policy
from capgate.decision.store.schema import OUTCOME_VALUE

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog
    from capgate.policies import Policy

__all__ = ["Calibration", "GateReport", "GroupReport", "Rate", "VersionComparison", "gate_report", "wilson"]

LET_THROUGH: tuple[Action, ...] = ("answer", "resample")
"""The actions that let a call through (an answer comes back from this model)."""
STOPPED: tuple[Action, ...] = ("abstain", "clarify", "escalate")
"""The actions that stop a call."""


@dataclass(frozen=True)
class GroupReport:
    """One policy / step / tool / target / mode / calibration version's figures (see the module
    docstring); ``calibration_version``: the version the decisions were made under.

    ``wrong_stopped`` and ``right_stopped`` are outcome mass: the sums of 1 - y and of y over the
    stopped decisions with an outcome. ``p`` and ``y``: the estimates (NaN when unavailable) and
    outcomes of the decisions with an outcome (for the plots).
    """

    policy: str | None
    step: str | None
    tool: str | None
    target: str | None
    mode: str
    decisions: int
    actions: dict[str, int]
    degraded: int
    with_outcome: int
    without_outcome: int
    enough_outcomes: bool
    coverage: Rate | None
    accuracy_all: Rate | None
    accuracy_gated: Rate | None
    wrong_stopped: float | None
    right_stopped: float | None
    wrong_stopped_share: Rate | None
    right_stopped_share: Rate | None
    escalations: int
    escalation_outcomes: int
    escalation_accuracy: Rate | None
    routed: int
    samples: int
    latency_n: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    calibration: Calibration | None
    candidate: ReplaySummary | None = None
    notes: list[str] = field(default_factory=list)
    calibration_version: str | None = None
    p: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    y: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)

    @property
    def label(self) -> str:
        """``policy / step / tool / target / mode``, with ``-`` for what is not set, then
        ``@ version`` when the decisions were made under a calibration."""
        parts = (self.policy, self.step, self.tool, self.target, self.mode)
        label = " / ".join(part or "-" for part in parts)
        return label if self.calibration_version is None else f"{label} @ {self.calibration_version}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (without the per-decision arrays ``p`` and ``y``)."""
        data: dict[str, Any] = json_ready({k: v for k, v in vars(self).items() if k not in ("p", "y")})
        return data


@dataclass(frozen=True)
class GateReport:
    """The report of a window of the log: one :class:`GroupReport` per group.

    Attributes:
        location: The log it was read from.
        since: Start of the window (inclusive; ``None``: the first decision).
        until: End of the window (exclusive; ``None``: now).
        source: Only outcomes from this source (``None``: all sources).
        min_outcomes: Outcomes a group needs before it gives outcome-based rates.
        groups: The groups, largest first.
        candidate_policy: Name of the candidate policy replayed, if any.
        comparisons: Each candidate calibration against the enforced one, on the same decisions.
    """

    location: str
    since: datetime | None
    until: datetime | None
    source: str | None
    min_outcomes: int
    groups: list[GroupReport]
    candidate_policy: str | None = None
    comparisons: list[VersionComparison] = field(default_factory=list)

    @property
    def decisions(self) -> int:
        """Decisions in the window."""
        return sum(g.decisions for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "location": self.location,
            "since": None if self.since is None else self.since.isoformat(),
            "until": None if self.until is None else self.until.isoformat(),
            "source": self.source,
            "min_outcomes": self.min_outcomes,
            "candidate_policy": self.candidate_policy,
            "decisions": self.decisions,
            "groups": [g.to_dict() for g in self.groups],
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    def format(self) -> str:
        """The report as text (what ``capgate report`` prints)."""
        from capgate.decision.analysis._report_text import format_report

        return format_report(self)

    def plot(self, folder: str | Path) -> list[Path]:
        """Draw each group's reliability diagram and risk-coverage curve as PNGs into ``folder``
        (needs matplotlib: the ``plots`` extra); returns the written paths. A group without
        enough outcomes for its calibration gets no plot."""
        from capgate.decision.analysis._report_text import plot_report

        return plot_report(self, Path(folder))


def _window_sql(since: datetime | None, until: datetime | None, time: str) -> tuple[str, list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    for bound, op in ((since, ">="), (until, "<")):
        if bound is not None:
            if bound.tzinfo is None:
                raise ValueError(f"window bounds must carry a time zone (UTC); got {bound.isoformat()}")
            where.append(f"d.created_at {op} CAST(? AS {time})")
            params.append(bound.astimezone(UTC).isoformat())
    return (" WHERE " + " AND ".join(where) if where else ""), params


_KEY = ("d.policy", "d.step", "d.tool", "d.target", "d.shadow", "d.calibration")
_CANDIDATE = "CASE WHEN d.beside IS NULL THEN 0 ELSE 1 END"  # a candidate calibration's shadow decision


def _groups_in(log: DecisionLog, window: tuple[str, list[Any]]) -> list[tuple[Any, ...]]:
    """The window's groups (policy, step, tool, target, shadow, calibration, candidate, samples)."""
    where, params = window
    columns = ", ".join((*_KEY, _CANDIDATE))
    sql = f"SELECT {columns}, SUM(d.samples_used) FROM decisions d{where} GROUP BY {columns}"
    return log.store.read(sql, params)


def _rows_of(
    log: DecisionLog, key: Sequence[Any], window: tuple[str, list[Any]], source: str | None
) -> NDArray[np.float64]:
    """One group's decisions as rows of (action code, p, degraded, latency, y), NaN where unknown,
    off the covering index ``decisions_for_report`` (for one ``source``, y from ``outcomes_values``).
    A candidate's shadow decision takes the y of the decision it was made beside."""
    dialect = log.store.dialect
    y = (
        "CASE WHEN d.beside IS NULL THEN d.outcome_y"
        " ELSE (SELECT e.outcome_y FROM decisions e WHERE e.id = d.beside) END"
    )
    if source is not None:
        value = dialect.render(OUTCOME_VALUE)
        y = (
            f"(SELECT AVG({value}) FROM outcomes o WHERE o.decision_id = COALESCE(d.beside, d.id)"
            " AND o.source = ?)"
        )
    where, params = window
    match = " AND ".join(f"{c} {dialect.same} ?" for c in (*_KEY, _CANDIDATE))
    where = f" WHERE {match}" + (where.replace(" WHERE ", " AND ", 1) if where else "")
    sql = f"SELECT {action_code('d')}, d.p, d.degraded, d.latency_s, {y} FROM decisions d{where}"
    rows = log.store.read(sql, ([source] if source is not None else []) + list(key) + params)
    return np.array(rows, dtype=np.float64).reshape(len(rows), 5)  # None becomes NaN


def _group(
    key: Sequence[Any],
    rows: NDArray[np.float64],
    samples: int,
    *,
    min_outcomes: int,
    candidate: Policy | None,
    rng: np.random.Generator,
) -> GroupReport:
    """One group's figures from its rows (see :func:`_rows_of`)."""
    policy, step, tool, target, shadow, version, candidate_of = key
    actions, p, degraded = rows[:, 0].astype(np.int64), rows[:, 1], rows[:, 2] == 1.0
    latency, y = rows[:, 3], rows[:, 4]
    n = int(actions.size)
    counts: dict[str, int] = {
        str(a): int(c) for a, c in zip(ACTIONS, np.bincount(actions, minlength=len(ACTIONS)), strict=True)
    }
    scored = ~np.isnan(y)
    n_scored = int(scored.sum())
    through = np.isin(actions, [ACTIONS.index(a) for a in LET_THROUGH])
    stopped = np.isin(actions, [ACTIONS.index(a) for a in STOPPED])
    escalated = actions == ACTIONS.index("escalate")
    enough = n_scored >= min_outcomes
    notes: list[str] = []
    if n < min_outcomes:
        notes.append(f"only {n} decisions (at least {min_outcomes} needed for a rate): no coverage is given")
    if not enough:
        notes.append(
            f"only {n_scored} of {n} decisions have an outcome (at least {min_outcomes} needed): "
            "no outcome-based rate is given"
        )
    elif n_scored < n:
        notes.append(f"{n - n_scored} decisions have no outcome: counted, left out of every outcome rate")
    mode = "candidate" if candidate_of else "shadow" if shadow else "enforce"
    if candidate_of:
        notes.append(
            "a candidate calibration's shadow decisions, scored on the outcomes of the decisions beside them"
        )
    if enough and mode == "enforce" and int((stopped & ~scored).sum()):
        notes.append(
            "enforce mode: stopped calls without an outcome (nothing was answered) are left out of "
            "'all'; run in shadow mode, or attach outcomes to them, for the ungated accuracy"
        )
    y_s = y[scored]
    wrong_total = float(np.sum(1.0 - y_s))
    right_total = float(np.sum(y_s))
    stopped_y = y[stopped & scored]
    wrong_stopped = float(np.sum(1.0 - stopped_y)) if enough else None
    right_stopped = float(np.sum(stopped_y)) if enough else None
    esc_y = y[escalated & scored]
    p_scored = p[scored]
    usable = ~np.isnan(p_scored)
    calibration = None
    if enough and int(usable.sum()) >= min_outcomes:
        calibration = bootstrap_calibration(p_scored[usable], y_s[usable], rng)
    replay = None
    if candidate is not None and enough:
        replay = replay_policy(candidate, p_scored, y_s, degraded=degraded[scored], step=step, tool=tool)
    lat = latency[~np.isnan(latency)]
    p50, p95 = (float(v) for v in np.percentile(lat, [50, 95])) if lat.size else (None, None)
    return GroupReport(
        policy=policy,
        step=step,
        tool=tool,
        target=target,
        mode=mode,
        decisions=n,
        actions=counts,
        degraded=int(degraded.sum()),
        with_outcome=n_scored,
        without_outcome=n - n_scored,
        enough_outcomes=enough,
        coverage=wilson(float(through.sum()), n) if n >= min_outcomes else None,
        accuracy_all=wilson(right_total, n_scored) if enough else None,
        accuracy_gated=wilson(float(np.sum(y[through & scored])), int((through & scored).sum()))
        if enough
        else None,
        wrong_stopped=wrong_stopped,
        right_stopped=right_stopped,
        wrong_stopped_share=wilson(wrong_stopped, wrong_total) if wrong_stopped is not None else None,
        right_stopped_share=wilson(right_stopped, right_total) if right_stopped is not None else None,
        escalations=counts["escalate"],
        escalation_outcomes=int(esc_y.size),
        escalation_accuracy=wilson(float(esc_y.sum()), int(esc_y.size)) if enough else None,
        routed=counts["route"],
        samples=samples,
        latency_n=int(lat.size),
        latency_p50_s=p50,
        latency_p95_s=p95,
        calibration=calibration,
        candidate=replay,
        notes=notes,
        calibration_version=version,
        p=p_scored,
        y=y_s,
    )


def gate_report(
    log: DecisionLog,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    source: str | None = None,
    policy: Policy | str | None = None,
    min_outcomes: int = 30,
    seed: int = 0,
) -> GateReport:
    """What the gate bought over a window of the log (see the module docstring).

    Args:
        log: The decision log (either store).
        since: Only decisions made at or after this time (timezone-aware).
        until: Only decisions made before this time (timezone-aware).
        source: Only outcomes from this source (default: every source, averaged per decision).
        policy: A candidate policy (a :class:`~capgate.policies.Policy`, preset name or file)
            to replay on each group's logged estimates and outcomes.
        min_outcomes: Outcomes (and decisions, for the coverage) a group needs before it gives
            a rate.
        seed: Seed of the calibration bootstrap.

    Returns:
        The report; its groups largest first.

    Raises:
        ValueError: A window bound without a time zone, or ``min_outcomes`` below 1.
        LogUnavailableError: The log could not be read.
    """
    check_int_at_least("min_outcomes", min_outcomes, 1)
    candidate: Policy | None = None
    if policy is not None:
        from capgate.policies import Policy, load_policy

        candidate = policy if isinstance(policy, Policy) else load_policy(policy)
    window = _window_sql(since, until, log.store.dialect.time)
    rng = np.random.default_rng(seed)
    groups: list[GroupReport] = []
    for *key, samples in _groups_in(log, window):
        rows = _rows_of(log, key, window, source)
        groups.append(
            _group(key, rows, int(samples or 0), min_outcomes=min_outcomes, candidate=candidate, rng=rng)
        )
    groups.sort(key=lambda g: (-g.decisions, g.label))
    comparisons = compare_versions(log, window, source, min_outcomes)
    return GateReport(
        location=log.location,
        since=since,
        until=until,
        source=source,
        min_outcomes=min_outcomes,
        groups=groups,
        candidate_policy=None if candidate is None else candidate.name,
        comparisons=comparisons,
    )
