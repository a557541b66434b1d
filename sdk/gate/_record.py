"""Writing a decision to the gate's log, and the work a logged decision brings along beside the call.

Once a decision is in the log, its reader features (``log_features``) and a candidate
calibration's decision on the same query (``shadow_calibration``) follow in the gate's shadow
threads: neither delays nor fails the call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from capgate.cas.loop import CASResult
from capgate.errors import LogUnavailableError
from capgate.gate._calibration import Calibrations, decide_candidate
from capgate.gate._effects import FlowGate
from capgate.gate._features import keep_features
from capgate.gate._results import Verdict
from capgate.gate._settings import GateSettings
from capgate.gate._shadow import Shadows

if TYPE_CHECKING:
    from capgate.decision.log import DecisionLog

_logger = logging.getLogger("capgate")


def _logged(
    gate: FlowGate, log: DecisionLog, verdict: Verdict, samples_used: int | None, cas: CASResult | None
) -> bool:
    decision = verdict.decision
    if cas is not None:
        samples_used = cas.samples_used
        decision = decision.model_copy(update={"stopped_by": cas.stopped_by})
    try:
        log.record(decision, query=verdict.query, samples_used=samples_used)
    except LogUnavailableError as exc:
        gate.stats.log_failed(exc)
        closed = log.fail_closed
        _logger.warning(
            "decision %s (%s) was not logged%s: %s",
            decision.id,
            decision.action,
            "; failing the call (fail_closed)" if closed else "",
            exc,
        )
        if closed:
            raise
        return False
    return True


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
    """Write ``verdict``'s decision to the gate's log (no-op without one), then start what it
    brings along: its features and a candidate's decision beside it (see :meth:`capgate.Gate.record`).

    Raises:
        LogUnavailableError: The log could not store the decision and is ``fail_closed``.
    """
    log = gate.log
    if log is None or not _logged(gate, log, verdict, samples_used, cas):
        return
    keep_features(gate, verdict, log, shadows)
    decide_candidate(gate, verdict, log, shadows, calibrations, make_gate)
