"""Live calibration of logged decisions, and drift flags.

For each estimator method in a :class:`~capgate.decision.log.DecisionLog`, the decisions that have
both a predicted capability p and an outcome are taken in time order. The outcome's target is
``mu_hat`` when it was measured (correct / k), else ``correct`` as 0/1. The **window** is the
latest ``window`` of them, the **reference** the ``window`` before it.

Reported per method: capability Brier and ECE (``capgate.metrics``) on both windows, mean p
against mean outcome, and how many decisions had no usable estimate (degraded).

Drift is flagged, once the window holds at least ``min_count`` decisions, when either

1. **Brier rise**: window Brier − reference Brier > ``brier_tolerance`` (default 0.05; needs a
   reference of at least ``min_count`` too). A rise in squared error against the method's own
   recent past is the plainest sign that the estimator no longer fits the traffic.
2. **Calibration in the large**: z = Σ(µ − p) / √Σ p(1 − p) over the window, with
   |z| > ``z_threshold`` (default 3). Under calibration each binary outcome has mean p and
   variance p(1 − p), so z is about standard normal and |z| > 3 happens by chance about 0.3% of
   the time. For ``mu_hat`` outcomes (means of k samples) the true variance is smaller, so the
   test is conservative there. It needs no reference window, so it also catches an estimator that
   was miscalibrated from the start.

ECE is reported but not used to flag drift: on windows of a few hundred it is noisy and biased
upward by binning.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capgate.decision.log import DecisionLog, LoggedDecision, is_database_url
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
    """Live calibration of one estimator method.

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


def _target(row: LoggedDecision) -> float | None:
    outcome = row.outcome
    if outcome is None:
        return None
    if outcome.mu_hat is not None:
        return float(outcome.mu_hat)
    return None if outcome.correct is None else float(outcome.correct)


def _stats(p: np.ndarray, mu: np.ndarray, n_bins: int) -> WindowStats:
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


def _report(
    store: DecisionLog,
    method: str,
    *,
    window: int,
    min_count: int,
    brier_tolerance: float,
    z_threshold: float,
    n_bins: int,
) -> MethodReport:
    rows = store.decisions(method=method, with_outcome=True, usable=True, last=2 * window)
    scored = [(r.p, t) for r in rows if r.p is not None and (t := _target(r)) is not None]
    current = scored[-window:]
    previous = scored[-2 * window : -window] if len(scored) > window else []
    win = (
        _stats(np.array([a for a, _ in current]), np.array([b for _, b in current]), n_bins)
        if current
        else None
    )
    ref = (
        _stats(np.array([a for a, _ in previous]), np.array([b for _, b in previous]), n_bins)
        if previous
        else None
    )
    brier_delta = None if win is None or ref is None else win.brier - ref.brier
    ece_delta = None if win is None or ref is None else win.ece - ref.ece
    reasons: list[str] = []
    if win is not None and win.n >= min_count:
        if (
            ref is not None
            and ref.n >= min_count
            and brier_delta is not None
            and brier_delta > brier_tolerance
        ):
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
        method=method,
        n_decisions=store.count(method=method),
        n_unavailable=store.count(method=method, usable=False),
        n_scored=store.count(method=method, with_outcome=True, usable=True),
        window=win,
        reference=ref,
        brier_delta=brier_delta,
        ece_delta=ece_delta,
        drift=bool(reasons),
        reasons=reasons,
    )


def calibration_report(
    log: DecisionLog | str | Path,
    *,
    window: int = 200,
    method: str | None = None,
    min_count: int = 30,
    brier_tolerance: float = 0.05,
    z_threshold: float = 3.0,
    n_bins: int = 10,
) -> list[MethodReport]:
    """Rolling-window calibration of the logged decisions, per estimator method, with drift flags.

    Args:
        log: A decision log, or the path or database URL of one.
        window: Decisions (with p and an outcome) per window.
        method: Report only this estimator method.
        min_count: Fewest decisions a window needs before a drift rule may fire.
        brier_tolerance: Largest allowed rise of the window's Brier over the reference's.
        z_threshold: Largest allowed |z| of the calibration-in-the-large statistic.
        n_bins: ECE bins.

    Returns:
        One report per method, sorted by method name.

    Example:
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
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer; got {value!r}")
    if not (isinstance(brier_tolerance, int | float) and brier_tolerance >= 0):
        raise ValueError(f"`brier_tolerance` must be >= 0; got {brier_tolerance!r}")
    if not (isinstance(z_threshold, int | float) and z_threshold > 0):
        raise ValueError(f"`z_threshold` must be > 0; got {z_threshold!r}")
    if isinstance(log, DecisionLog):
        store, owned = log, False
    elif is_database_url(log):
        store, owned = DecisionLog(log), True
    else:
        if not Path(log).is_file():
            raise DataError("no decision log at this path", path=log)
        store, owned = DecisionLog(log), True
    try:
        methods = [method] if method is not None else store.methods()
        return [
            _report(
                store,
                m,
                window=window,
                min_count=min_count,
                brier_tolerance=brier_tolerance,
                z_threshold=z_threshold,
                n_bins=n_bins,
            )
            for m in methods
        ]
    finally:
        if owned:
            store.close()
