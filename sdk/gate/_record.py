"""Writing a decision to the gate's log (or its spill file), and the work it brings along beside
the call: its features (``log_features``) and a candidate's decision (``shadow_calibration``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from capgate.cas.loop import CASResult
from capgate.core.types import Decision
from capgate.errors import LogUnavailableError
from capgate.gate._calibration import Calibrations, decide_candidate
from capgate.gate._effects import FlowGate
from capgate.gate._features import keep_features
from capgate.gate._limits import log_key, log_writer
from capgate.gate._results import Verdict
from capgate.gate._settings import GateSettings
from capgate.gate._shadow import Shadows

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog

_logger = logging.getLogger("capgate")


def _as_logged(
    verdict: Verdict, samples_used: int | None, cas: CASResult | None
) -> tuple[Decision, int | None]:
    """The decision as the log stores it, and its samples (a resample's from its CAS run)."""
    if cas is None:
        return verdict.decision, samples_used
    return verdict.decision.model_copy(update={"stopped_by": cas.stopped_by}), cas.samples_used


def spill_full(
    gate: FlowGate, log: DecisionLog | None, verdict: Verdict, samples_used: int | None, cas: CASResult | None
) -> None:
    """Keep a decision in the spill file: the log's write queue is full (lost, counted and warned,
    only when the log has no spill file)."""
    if log is None:
        return
    decision, samples_used = _as_logged(verdict, samples_used, cas)
    why = "the log's write queue was full"
    if not spill(gate, log, decision, verdict, samples_used, why):
        gate.stats.log_failed(RuntimeError(why))
        _logger.warning("decision %s (%s) was not logged: %s", decision.id, decision.action, why)


def _logged(
    gate: FlowGate, log: DecisionLog, verdict: Verdict, samples_used: int | None, cas: CASResult | None
) -> bool:
    decision, samples_used = _as_logged(verdict, samples_used, cas)
    writer = log_writer(log_key(gate.settings.log))
    failure = None if log.fail_closed else writer.resting()
    why = f"the log failed just now: {failure}"
    if failure is not None and spill(gate, log, decision, verdict, samples_used, why):
        gate.stats.log_failed(LogUnavailableError(why, location=log.location))  # not stored, not tried
        _logger.warning(
            "decision %s (%s) was not logged; kept in its spill file: %s", decision.id, decision.action, why
        )
        return False
    try:
        log.record(decision, query=verdict.query, samples_used=samples_used)
    except LogUnavailableError as exc:
        writer.failed(exc)
        gate.stats.log_failed(exc)
        closed = log.fail_closed
        kept = not closed and spill(gate, log, decision, verdict, samples_used, f"the log failed: {exc}")
        _logger.warning(
            "decision %s (%s) was not logged%s: %s",
            decision.id,
            decision.action,
            "; failing the call (fail_closed)" if closed else ("; kept in its spill file" if kept else ""),
            exc,
        )
        if closed:
            raise
        return False
    if log.spill is not None and log.spill.pending():
        replay_later(gate, log)
    return True


def spill(
    gate: FlowGate, log: DecisionLog, decision: Decision, verdict: Verdict, samples_used: int | None, why: str
) -> bool:
    """Keep ``decision`` in ``log``'s spill file, counted in ``stats.log_spilled`` (``False``: no
    file, or it could not be written)."""
    kept = log.spill
    if kept is None:
        return False
    try:
        kept.append(
            decision, query=verdict.query, samples_used=samples_used, store_text=log.store_text, why=why
        )
    except OSError as exc:
        _logger.warning("decision %s could not be kept in %s either: %s", decision.id, kept.path, exc)
        return False
    gate.stats.log_spilled_one()
    return True


REPLAY_BATCH = 20
"""Spilled decisions written back per turn of the log's writer thread: the calls' own writes
queued meanwhile go between two batches instead of waiting for the whole file."""


def replay_later(gate: FlowGate, log: DecisionLog) -> None:
    """Write the log's spilled decisions back from its writer thread: the log takes writes again."""
    kept = log.spill
    writer = log_writer(log_key(gate.settings.log))
    if kept is None or not writer.claim_replay():
        return

    def replay() -> None:
        more = False
        try:
            count = kept.replay(log, limit=REPLAY_BATCH)
            more = kept.replaying_path.exists()
        except Exception as exc:  # the log failed again, or a bad file: the decisions stay kept
            _logger.warning("the spilled decisions of %s stay kept in %s: %s", log.location, kept.path, exc)
        else:
            if count:
                _logger.info("wrote %d spilled decisions back into %s", count, log.location)
        finally:
            if more:  # the next batch queues behind the writes that came meanwhile
                writer.submit(replay)
            else:
                writer.replay_done()

    writer.submit(replay)


def write_decision(
    gate: FlowGate,
    verdict: Verdict,
    samples_used: int | None,
    cas: CASResult | None,
    *,
    shadows: Shadows,
    calibrations: Calibrations,
    make_gate: Callable[[GateSettings], FlowGate],
) -> None:
    """:meth:`capgate.Gate.record`: write the decision, then start what it brings along."""
    log = gate.log
    if log is None or not _logged(gate, log, verdict, samples_used, cas):
        return
    keep_features(gate, verdict, log, shadows)
    decide_candidate(gate, verdict, log, shadows, calibrations, make_gate)
