"""Decision records, the decision log, replay and monitoring.

Replay (:mod:`capgate.decision.simulate`) and risk-controlled thresholds
(:mod:`capgate.decision.risk`) are pure functions on arrays of confidences and labels.
"""

from capgate.decision.risk import RiskControl, calibrate_threshold
from capgate.decision.simulate import ReplaySummary, frontier, replay
from capgate.decision.types import Action, Decision, Outcome

__all__ = [
    "Action",
    "Decision",
    "Outcome",
    "ReplaySummary",
    "RiskControl",
    "calibrate_threshold",
    "frontier",
    "replay",
]
