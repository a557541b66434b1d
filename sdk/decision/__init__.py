"""Decision records, the decision log (SQLite, or PostgreSQL by URL), replay and monitoring.

Outcomes attach to logged decisions one at a time or in bulk (:mod:`capgate.decision.outcomes`);
:func:`gate_report` says what a gate bought over a window of the log (:mod:`capgate.decision.report`).
Replay of policies on labelled data (:mod:`capgate.decision.simulate`) and risk-controlled
thresholds (:mod:`capgate.decision.risk`) are pure functions on arrays of confidences and labels.
Decisions a log cannot take yet wait in its spill file (:mod:`capgate.decision.spill`).
"""

from capgate.core.messages import query_hash
from capgate.core.types import Action, Decision, Outcome
from capgate.decision.calibrations import CalibrationEvent
from capgate.decision.features import LoggedFeatures
from capgate.decision.log import DecisionLog, LoggedDecision, PostgresDecisionLog, default_log_path
from capgate.decision.monitor import MethodReport, WindowStats, calibration_report
from capgate.decision.outcomes import ImportSummary, OutcomeConflictError, OutcomeImportError, import_outcomes
from capgate.decision.report import GateReport, GroupReport, gate_report
from capgate.decision.risk import RiskControl, calibrate_threshold
from capgate.decision.simulate import ReplaySummary, replay_policy, threshold_frontier
from capgate.decision.spill import SpillFile

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
