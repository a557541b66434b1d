"""Decision records, the decision log, replay and monitoring."""

from capgate.decision.types import Action, Decision, Outcome

__all__ = ["Action", "Decision", "Outcome"]
