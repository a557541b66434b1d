"""Decision records, the decision log (SQLite, or PostgreSQL by URL), replay and monitoring.

Storage lives in :mod:`capgate.decision.store`, analysis in :mod:`capgate.decision.analysis`; the
public names of both are imported from here. Outcomes attach to logged decisions one at a time or
in bulk (:mod:`capgate.decision.store.outcomes`); :func:`gate_report` says what a gate bought over
a window of the log (:mod:`capgate.decision.analysis.report`). Replay of policies on labelled data
(:mod:`capgate.decision.analysis.simulate`) and risk-controlled thresholds
(:mod:`capgate.decision.analysis.risk`) are pure functions on arrays of confidences and labels.
Decisions a log cannot take yet wait in its spill file (:mod:`capgate.decision.store.spill`).
"""

from capgate.core.messages import query_hash
from capgate.core.types import Action, Decision, Outcome
from capgate.decision.analysis.monitor import MethodReport, WindowStats, calibration_report
from capgate.decision.analysis.report import GateReport, GroupReport, gate_report
from capgate.decision.analysis.risk import RiskControl, calibrate_threshold
from capgate.decision.analysis.simulate import ReplaySummary, replay_policy, threshold_frontier
from capgate.decision.store.calibrations import CalibrationEvent
from capgate.decision.store.features import LoggedFeatures
from capgate.decision.store.log import DecisionLog, LoggedDecision, PostgresDecisionLog, default_log_path
from capgate.decision.store.outcomes import (
    ImportSummary,
    OutcomeConflictError,
    OutcomeImportError,
    import_outcomes,
)
from capgate.decision.store.spill import SpillFile

__all__ = [
    "Action",
    "CalibrationEvent",
    "Decision",
    "DecisionLog",
    "GateReport",
    "GroupReport",
    "ImportSummary",
    "LoggedDecision",
    "LoggedFeatures",
    "MethodReport",
    "Outcome",
    "OutcomeConflictError",
    "OutcomeImportError",
    "PostgresDecisionLog",
    "ReplaySummary",
    "RiskControl",
    "SpillFile",
    "WindowStats",
    "calibrate_threshold",
    "calibration_report",
    "default_log_path",
    "gate_report",
    "import_outcomes",
    "query_hash",
    "replay_policy",
    "threshold_frontier",
]
