"""Decision records, the decision log (SQLite, or PostgreSQL by URL), replay and monitoring.

Replay of policies on labelled data (:mod:`capgate.decision.simulate`) and risk-controlled
thresholds (:mod:`capgate.decision.risk`) are pure functions on arrays of confidences and labels.
"""

from capgate._types import Action, Decision, Outcome
from capgate.decision.log import DecisionLog, LoggedDecision, PostgresDecisionLog, default_log_path
from capgate.decision.monitor import MethodReport, WindowStats, calibration_report
from capgate.decision.risk import RiskControl, calibrate_threshold
from capgate.decision.simulate import ReplaySummary, replay_policy, threshold_frontier
from capgate.messages import query_hash

__all__ = [
    "Action",
    "Decision",
    "DecisionLog",
    "LoggedDecision",
    "MethodReport",
    "Outcome",
    "PostgresDecisionLog",
    "ReplaySummary",
    "RiskControl",
    "WindowStats",
    "calibrate_threshold",
    "calibration_report",
    "default_log_path",
    "query_hash",
    "replay_policy",
    "threshold_frontier",
]
