"""Decision records, the decision log, replay and monitoring."""

from capgate.decision.log import DecisionLog, LoggedDecision, default_log_path, query_hash
from capgate.decision.monitor import MethodReport, WindowStats, calibration_report
from capgate.decision.types import Action, Decision, Outcome

__all__ = [
    "Action",
    "Decision",
    "DecisionLog",
    "LoggedDecision",
    "MethodReport",
    "Outcome",
    "WindowStats",
    "calibration_report",
    "default_log_path",
    "query_hash",
]
