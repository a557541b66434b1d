"""The logged traffic a calibration learns from: decisions with outcomes of one target and one
estimator method, in time order, checked for the inputs :func:`~capgate.learn.calibrate` refuses."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray
from capgate.errors import DataError

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog, LoggedDecision


_MAP_SUFFIXES = ("+isotonic", "+platt")


class CalibrationRefusedError(DataError):
    """The log cannot support the calibration asked for; the message says why and what is needed."""


def base_method(method: str) -> str:
    """The estimator method beneath a recalibration's name (``"probe+isotonic"`` -> ``"probe"``).

    Examples:
        >>> base_method("verbalized+platt"), base_method("probe")
        ('verbalized', 'probe')
    """
    for suffix in _MAP_SUFFIXES:
        if method.endswith(suffix):
            return method[: -len(suffix)]
    return method


def _logged_raw_p(row: LoggedDecision) -> float | None:
    """The ``raw_p`` a recalibrated estimate logged (the base estimator's confidence behind it)."""
    estimate = row.decision.estimate
    raw = estimate.details.get("raw_p") if estimate.method != base_method(estimate.method) else None
    return float(raw) if isinstance(raw, int | float) else None


@dataclass(frozen=True)
class Traffic:
    """Decisions with outcomes of one target and method, oldest first.

    Attributes:
        ids: Decision ids.
        at: When each decision was made.
        p: The estimate each decision was made on (the previous estimator's confidence; NaN
            where it had none: a degraded decision, made by the policy's fallback).
        base_p: The base estimator's confidence (``raw_p`` of a recalibrated estimate, else ``p``):
            what a new map is fitted on and applied to (NaN where ``p`` is).
        y: Each decision's outcome in [0, 1] (the mean over its sources).
        shadow: Whether each decision was a shadow decision (made beside a call that proceeded).
        target: The target model (``None`` when the decisions record none).
        method: The base estimator method.
        versions: Calibration versions the window's decisions were made under (``None``: none).
        counts: Decisions in the window per action: ``{action: {"with_outcome": n, "without": m}}``,
            enforced and shadow separately (keys ``"enforce"`` and ``"shadow"``).
        excluded: Decisions left out and why (``{"candidate shadow": n, "other target": n, ...}``).
        policy: The policy most of the window's decisions were made by (its name).
        has_base: Whether every decision's base confidence is known: made uncalibrated, or under a
            map that logged the raw confidence (a probe calibration's estimates have none).
        queries: Each decision's query hash (``None`` where none was logged).
    """

    ids: tuple[str, ...]
    at: tuple[datetime, ...]
    p: FloatArray
    base_p: FloatArray
    y: FloatArray
    shadow: npt.NDArray[np.bool_]
    target: str | None
    method: str
    versions: tuple[str | None, ...]
    counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    excluded: dict[str, int] = field(default_factory=dict)
    policy: str | None = None
    has_base: bool = True
    queries: tuple[str | None, ...] = ()

    @functools.cached_property
    def groups(self) -> npt.NDArray[np.str_] | None:
        """One label per decision naming its query (its hash; a decision without one is its own
        group), so that splits keep every outcome of a recurring query on one side; ``None``
        when the decisions record no queries."""
        if not self.queries or all(q is None for q in self.queries):
            return None
        pairs = zip(self.ids, self.queries, strict=True)
        labels = [q if q is not None else f"decision:{i}" for i, q in pairs]
        return np.array(labels)

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def estimated(self) -> npt.NDArray[np.bool_]:
        """Which decisions had a usable estimate: the only ones a map of the previous estimator
        is fitted on or compared on (a probe on logged features learns from the others too)."""
        return np.asarray(~np.isnan(self.p))

    @property
    def blocked_without_outcome(self) -> int:
        """Enforced decisions that did not answer and have no outcome: the selection gap."""
        enforce = self.counts.get("enforce", {})
        return sum(c["without"] for action, c in enforce.items() if action != "answer")

    @property
    def window(self) -> dict[str, Any]:
        """First and last decision time of the window (ISO 8601)."""
        return {
            "first": self.at[0].isoformat() if self.at else None,
            "last": self.at[-1].isoformat() if self.at else None,
        }


def _label(values: Counter[Any]) -> str:
    return ", ".join(f"{k if k is not None else 'none'}: {n}" for k, n in sorted(values.items(), key=str))


def _the_only(values: Counter[Any], several: str, way_out: str, where: str) -> Any:
    """The one value counted (``None`` when none is); several are refused, naming them."""
    if len(values) > 1:
        raise CalibrationRefusedError(f"the window holds {several} ({_label(values)}); {way_out}", path=where)
    return next(iter(values), None)


def read_traffic(
    log: DecisionLog,
    *,
    target: str | None = None,
    method: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    allow_mixed_versions: bool = False,
    min_outcomes: int = 1,
) -> Traffic:
    """Read the window's decisions with outcomes of one target and method from ``log``.

    A candidate's shadow decision (made *beside* an enforced one) is left out: it speaks for the
    candidate, not the estimator being calibrated. A degraded decision is read with ``p`` NaN: its
    outcome still teaches a probe on logged features (``min_outcomes`` counts it).

    Raises:
        CalibrationRefusedError: No decisions, several targets or methods without one chosen, a
            target or method the log does not hold, a window mixing calibration versions
            (unless ``allow_mixed_versions``), or fewer than ``min_outcomes`` outcomes (the
            message names the count needed and the count found).
    """
    where = log.location
    since, until = _aware(since), _aware(until)
    rows = [r for r in log.decisions() if _in_window(r, since, until)]
    kept = [r for r in rows if r.decision.beside is None]
    excluded = Counter({"candidate shadow": len(rows) - len(kept)})
    targets = Counter(r.decision.target for r in kept if r.value is not None)
    if target is None:
        target = _the_only(
            targets, "outcomes of several targets", "calibrate one at a time: pass target (--target)", where
        )
    elif target not in targets:
        found = _label(targets) if targets else "no outcomes at all"
        raise CalibrationRefusedError(
            f"no outcomes for target {target!r} in the window; the log's outcomes are of another "
            f"target ({found}): outcomes of one model do not calibrate another",
            path=where,
            field="target",
        )
    on_target = [r for r in kept if r.decision.target == target]
    excluded["other target"] = len(kept) - len(on_target)
    kept = on_target
    methods = Counter(base_method(r.method) for r in kept if r.value is not None and r.p is not None)
    if method is None:
        method = _the_only(
            methods,
            "estimates of several methods",
            "a calibration maps one estimator's: pass method (--method)",
            where,
        )
    if method is None or method not in methods:
        found = _label(methods) if methods else "none"
        raise CalibrationRefusedError(
            f"no usable estimates with outcomes for method {method!r} (target {target!r}); "
            f"methods with outcomes: {found}",
            path=where,
            field="method",
        )
    kept = [r for r in kept if base_method(r.method) == method]
    counts = _counts(kept)
    learnable = [r for r in kept if r.value is not None]
    usable = [r for r in learnable if _usable(r)]
    versions = Counter(r.decision.calibration for r in learnable)
    if len(versions) > 1 and not allow_mixed_versions:
        raise CalibrationRefusedError(
            f"the window mixes decisions made under {len(versions)} calibration versions "
            f"({_label(versions)}); their estimates are not one estimator's. Narrow the window "
            "(since/until) to one version, or allow it (allow_mixed_versions, --allow-mixed-versions)",
            path=where,
        )
    if len(learnable) < min_outcomes:
        raise CalibrationRefusedError(
            f"too few outcomes: {len(learnable)} decisions of target {target!r} and method {method!r} "
            f"have an outcome ({len(usable)} of them a usable estimate); at least {min_outcomes} "
            "are needed",
            path=where,
        )
    learnable.sort(key=lambda r: (r.decision.created_at, r.id))
    policies = Counter(r.decision.policy for r in usable)
    nan = float("nan")
    return Traffic(
        ids=tuple(r.id for r in learnable),
        at=tuple(r.decision.created_at for r in learnable),
        p=np.array([r.p if _usable(r) else nan for r in learnable], dtype=np.float64),
        base_p=np.array([_base_p(r) if _usable(r) else nan for r in learnable], dtype=np.float64),
        y=np.array([r.value for r in learnable], dtype=np.float64),
        shadow=np.array([r.decision.shadow for r in learnable], dtype=bool),
        target=target,
        method=method,
        versions=tuple(sorted(versions, key=str)),
        counts=counts,
        excluded={k: v for k, v in excluded.items() if v},
        policy=policies.most_common(1)[0][0] if policies else None,
        has_base=all(_has_base(r) for r in usable),
        queries=tuple(r.query_sha256 for r in learnable),
    )


def _base_p(row: LoggedDecision) -> float | None:
    """The base estimator's confidence behind a logged estimate (``raw_p`` of a recalibrated one)."""
    raw = _logged_raw_p(row)
    return row.p if raw is None else raw


def _usable(row: LoggedDecision) -> bool:
    return row.p is not None and not (row.decision.degraded or row.decision.estimate.degraded)


def _has_base(row: LoggedDecision) -> bool:
    return row.decision.calibration is None or _logged_raw_p(row) is not None


def _aware(at: datetime | None) -> datetime | None:
    """A time without a zone is taken as UTC (the log's times are UTC)."""
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def _in_window(row: LoggedDecision, since: datetime | None, until: datetime | None) -> bool:
    at = row.decision.created_at
    return (since is None or at >= since) and (until is None or at < until)


def _counts(rows: list[LoggedDecision]) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in rows:
        mode = "shadow" if r.decision.shadow else "enforce"
        entry = out.setdefault(mode, {}).setdefault(r.decision.action, {"with_outcome": 0, "without": 0})
        entry["with_outcome" if r.value is not None else "without"] += 1
    return out
