"""What a gate has done so far: counts shared by every call through it."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from capgate._types import Decision
from capgate.cas.loop import CASResult

__all__ = ["GateStats"]


@dataclass
class GateStats:
    """What a gate has done so far (shared by every call through it; updates are thread-safe).

    Attributes:
        calls: Decisions made.
        actions: Decisions per action.
        degraded: Decisions made on a degraded estimate (the policy's fail-safe).
        samples: Responses drawn by ``resample``.
        last_decision: The most recent decision.
        last_cas: The most recent resample run.
    """

    calls: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    degraded: int = 0
    samples: int = 0
    last_decision: Decision | None = None
    last_cas: CASResult | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def decided(self, decision: Decision) -> None:
        """Count a decision."""
        with self._lock:
            self.calls += 1
            self.actions[decision.action] += 1
            self.degraded += int(decision.degraded)
            self.last_decision = decision

    def routed(self, decision: Decision) -> None:
        """Record the route chosen for the last decision (already counted)."""
        with self._lock:
            self.last_decision = decision

    def sampled(self, cas: CASResult) -> None:
        """Count a resample run."""
        with self._lock:
            self.samples += cas.samples_used
            self.last_cas = cas

    def reset(self) -> None:
        """Zero every count."""
        with self._lock:
            self.calls = self.degraded = self.samples = 0
            self.actions.clear()
            self.last_decision = None
            self.last_cas = None
