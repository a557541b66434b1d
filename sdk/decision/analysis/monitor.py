"""Live calibration of logged decisions, and drift flags.

For each estimator method, target and calibration version in a
:class:`~capgate.decision.store.log.DecisionLog`, the decisions with both a predicted capability p
and an outcome are taken in time order (a candidate calibration's shadow decisions are left to
``capgate report``'s paired comparison). The outcome µ is the mean over its sources of each
outcome's value (:attr:`~capgate.decision.store.log.LoggedDecision.value`, as ``capgate report``
scores it). The **window** is the latest ``window`` of them, the **reference** the
``window`` before it. Reported: capability Brier and ECE (:mod:`capgate.metrics`) of both, mean p
against mean outcome, and how many decisions had no usable estimate (degraded).

Once the window holds ``min_count`` decisions, drift is flagged on either rule:

1. **Brier rise**: window Brier − reference Brier > ``brier_tolerance`` (default 0.05; the
   reference needs ``min_count`` too): the estimator no longer fits the traffic of its own past.
2. **Calibration in the large**: z = Σ(µ − p) / √Σ p(1 − p) over the window, |z| >
   ``z_threshold`` (default 3). Under calibration z is about standard normal (|z| > 3 by chance
   about 0.3% of the time); for ``mu_hat`` outcomes the variance is smaller, so the test is
   conservative. It needs no reference, so it also catches an estimator miscalibrated from the
   start.

ECE is reported but flags nothing (noisy and biased upward on a few hundred decisions). A flagged
report carries ``advice``: the ``capgate calibrate`` command that refits that method and target.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capgate._util.validate import check_positive_int
from capgate.decision.store.calibrations import NO_CALIBRATION
from capgate.decision.store.log import DecisionLog, is_database_url
from capgate.errors import DataError
from capgate.metrics import capability_brier, expected_calibration_error

__all__ = ["MethodReport", "WindowStats", "calibration_report"]


class WindowStats(BaseModel):
    """Calibration of one window of decisions with outcomes.

    Attributes:
        n: Decisions in the window.
        brier: Capability Brier, mean (p − µ)².
        ece: Expected calibration error (uniform bins).
        mean_p: Mean predicted capability.
        mean_outcome: Mean outcome µ.
        z: Calibration-in-the-large statistic Σ(µ − p)/√Σp(1 − p) (``None`` if undefined).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=1)
    brier: float
    ece: float
    mean_p: float
    mean_outcome: float
    z: float | None


class MethodReport(BaseModel):
    """Live calibration of one estimator method (for one target and calibration version).

    Attributes:
        method: The estimator method.
        n_decisions: Decisions logged for it.
        n_unavailable: Of those, how many had no usable estimate (p unavailable).
        n_scored: Decisions with both p and an outcome.
        window: Stats of the latest window (``None`` if nothing is scored yet).
        reference: Stats of the window before it (``None`` if there is none).
        brier_delta: window Brier − reference Brier, when both exist.
        ece_delta: window ECE − reference ECE, when both exist.
        drift: Whether a drift rule fired.
        reasons: Which rules fired, in words.
        target: The model the decisions were for (``None``: not recorded).
        calibration: The calibration version they were made under (``None``: uncalibrated).
        advice: When drift is flagged: the ``capgate calibrate`` command to recalibrate.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    n_decisions: int
    n_unavailable: int
    n_scored: int
    window: WindowStats | None
    reference: WindowStats | None
    brier_delta: float | None
    ece_delta: float | None
    drift: bool
    reasons: list[str]
    target: str | None = None
    calibration: str | None = None
    advice: str | None = None

    @property
    def label(self) -> str:
        """``method``, then ``target`` and ``@ version`` where they are set."""
        label = " ".join(part for part in (self.method, self.target) if part)
        return label if self.calibration is None else f"{label} @ {self.calibration}"


def _stats(pairs: np.ndarray, n_bins: int) -> WindowStats:
    """One window's stats from its rows of (p, outcome)."""
    p, mu = pairs[:, 0], pairs[:, 1]
    var = float(np.sum(p * (1.0 - p)))
    resid = float(np.sum(mu - p))
    if var > 0:
        z: float | None = resid / math.sqrt(var)
    else:
        z = 0.0 if resid == 0 else None
    return WindowStats(
        n=len(p),
        brier=capability_brier(p, mu),
        ece=expected_calibration_error(p, mu, n_bins=n_bins),
        mean_p=float(p.mean()),
        mean_outcome=float(mu.mean()),
        z=z,
    )


_GROUP = "d.method, d.target, d.calibration"
_SCORED = "d.p IS NOT NULL AND EXISTS (SELECT 1 FROM outcomes o WHERE o.decision_id = d.id)"


def _groups(store: DecisionLog, method: str | None, calibration: str | None) -> list[tuple[object, ...]]:
    """(method, target, calibration, decisions, unavailable, scored) per group, sorted."""
    where, params = ["d.beside IS NULL"], []
    if method is not None:
        where.append("d.method = ?")
        params.append(method)
    if calibration is not None:
        where.append("d.calibration IS NULL" if calibration == NO_CALIBRATION else "d.calibration = ?")
        params += [] if calibration == NO_CALIBRATION else [calibration]
    sql = (
        f"SELECT {_GROUP}, COUNT(*), SUM(CASE WHEN d.p IS NULL THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN {_SCORED} THEN 1 ELSE 0 END) FROM decisions d WHERE {' AND '.join(where)}"
        f" GROUP BY {_GROUP}"
    )
    rows = store.store.read(sql, params)
    return sorted(rows, key=lambda r: (str(r[0]), r[1] is not None, str(r[1]), r[2] is not None, str(r[2])))


def advice(location: str, method: str, target: str | None) -> str:
    """The ``capgate calibrate`` command that refits ``method``'s estimates for ``target``."""
    words = ["capgate", "calibrate", "--db", location, "--out", "DIR", "--method", method]
    words += [] if target is None else ["--target", target]
    return "recalibrate on the recent outcomes: " + " ".join(shlex.quote(w) for w in words)


def _report(
    store: DecisionLog,
    group: tuple[object, ...],
    *,
    window: int,
    min_count: int,
    brier_tolerance: float,
    z_threshold: float,
    n_bins: int,
) -> MethodReport:
    method, target, calibration, n_decisions, n_unavailable, n_scored = group
    same = store.store.dialect.same
    where = f" WHERE d.beside IS NULL AND d.method = ? AND d.target {same} ? AND d.calibration {same} ?"
    where += f" AND {_SCORED}"
    rows = store._read(where, (method, target, calibration), f" LIMIT {2 * window}")[::-1]
    scored = [(r.p, r.value) for r in rows if r.p is not None and r.value is not None]
    current = scored[-window:]
    previous = scored[-2 * window : -window] if len(scored) > window else []
    win = _stats(np.array(current), n_bins) if current else None
    ref = _stats(np.array(previous), n_bins) if previous else None
    brier_delta = None if win is None or ref is None else win.brier - ref.brier
    ece_delta = None if win is None or ref is None else win.ece - ref.ece
    reasons: list[str] = []
    if win is not None and win.n >= min_count:
        if ref is not None and ref.n >= min_count and win.brier - ref.brier > brier_tolerance:
            reasons.append(
                f"Brier rose by {brier_delta:.3f} (> {brier_tolerance:g}) "
                f"from {ref.brier:.3f} to {win.brier:.3f}"
            )
        if win.z is None or abs(win.z) > z_threshold:
            direction = "under" if (win.mean_outcome > win.mean_p) else "over"
            z_text = "inf" if win.z is None else f"{win.z:+.2f}"
            reasons.append(
                f"calibration-in-the-large z = {z_text} (|z| > {z_threshold:g}): {direction}-confident, "
                f"mean p {win.mean_p:.3f} vs outcome {win.mean_outcome:.3f}"
            )
    return MethodReport(
        method=str(method),
        target=None if target is None else str(target),
        calibration=None if calibration is None else str(calibration),
        n_decisions=int(str(n_decisions)),
        n_unavailable=int(str(n_unavailable or 0)),
        n_scored=int(str(n_scored or 0)),
        window=win,
        reference=ref,
        brier_delta=brier_delta,
        ece_delta=ece_delta,
        drift=bool(reasons),
        reasons=reasons,
        advice=advice(store.location, str(method), None if target is None else str(target))
        if reasons
        else None,
    )


def calibration_report(
    log: DecisionLog | str | Path,
    *,
    window: int = 200,
    method: str | None = None,
    calibration: str | None = None,
    min_count: int = 30,
    brier_tolerance: float = 0.05,
    z_threshold: float = 3.0,
    n_bins: int = 10,
) -> list[MethodReport]:
    """Rolling-window calibration of the logged decisions, per estimator method, target and
    calibration version, with drift flags.

    Args:
        log: A decision log, or the path or database URL of one.
        window: Decisions (with p and an outcome) per window.
        method: Report only this estimator method.
        calibration: Report only decisions made under this calibration version (``""``: only
            uncalibrated ones; ``None``: every version, each apart).
        min_count: Fewest decisions a window needs before a drift rule may fire.
        brier_tolerance: Largest allowed rise of the window's Brier over the reference's.
        z_threshold: Largest allowed |z| of the calibration-in-the-large statistic.
        n_bins: ECE bins.

    Returns:
        One report per method, target and version, sorted by method name, target, version.

    Examples:
        >>> import os, tempfile
        >>> from capgate import Estimate
        >>> from capgate.decision import Decision
        >>> log = DecisionLog(os.path.join(tempfile.mkdtemp(), "d.sqlite3"))
        >>> for i in range(40):
        ...     d = Decision(action="answer", estimate=Estimate(p=0.9, method="probe"), reason="ok")
        ...     _ = log.record(d)
        ...     _ = log.record_outcome(d.id, correct=i % 10 != 0)
        >>> r = calibration_report(log, window=40)[0]
        >>> r.method, r.n_scored, round(r.window.brier, 3), r.drift
        ('probe', 40, 0.09, False)
    """
    for name, value in (("window", window), ("min_count", min_count), ("n_bins", n_bins)):
        check_positive_int(name, value)
    if not (isinstance(brier_tolerance, int | float) and brier_tolerance >= 0):
        raise ValueError(f"`brier_tolerance` must be >= 0; got {brier_tolerance!r}")
    if not (isinstance(z_threshold, int | float) and z_threshold > 0):
        raise ValueError(f"`z_threshold` must be > 0; got {z_threshold!r}")
    if not isinstance(log, DecisionLog) and not is_database_url(log) and not Path(log).is_file():
        raise DataError("no decision log at this path", path=log)
    store = log if isinstance(log, DecisionLog) else DecisionLog(log)
    try:
        return [
            _report(
                store,
                group,
                window=window,
                min_count=min_count,
                brier_tolerance=brier_tolerance,
                z_threshold=z_threshold,
                n_bins=n_bins,
            )
            for group in _groups(store, method, calibration)
        ]
    finally:
        if store is not log:
            store.close()
