"""What a gate has done so far: counts shared by every call through it."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Literal, TypeAlias

from capgate.cas.loop import CASResult
from capgate.core.types import Decision

Work: TypeAlias = Literal["features", "candidate"]
"""Work done beside the call that :class:`GateStats` counts."""


@dataclass
class GateStats:
    """What a gate has done so far (shared by every call through it; updates are thread-safe).

    Attributes:
        calls: Gated calls (in shadow mode, counted when the call proceeds).
        actions: Actions taken, per action (a shadow call's is ``answer``).
        shadow_actions: What the gate would have done on its shadow calls, per action (counted
            when each shadow decision is made, beside the call: ``flush()`` before reading).
        degraded: Decisions made on a degraded estimate (the policy's fail-safe), shadow ones too.
        samples: Responses drawn by ``resample``.
        last_decision: The most recent decision.
        last_cas: The most recent resample run.
        log_failures: Decisions the log could not store (each warned on the ``capgate`` logger;
            the decisions were still returned).
        last_log_error: The most recent of those failures, in words.
        log_spilled: Decisions kept in the log's spill file instead (the log failed, or its queue
            was full), written back once it takes writes (:mod:`capgate.decision.store.spill`).
        features_logged: Decisions whose reader features were written to the log (``log_features``).
        feature_failures: Decisions whose features could not be had or written (each warned,
            naming the decision, never the features; the call was not affected).
        candidate_decisions: Decisions a ``shadow_calibration`` candidate made and logged.
        candidate_failures: Candidate decisions that could not be made or logged.
        last_beside_error: The latest feature or candidate failure (the error's type and where; no
            text or feature values).
    """

    calls: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    shadow_actions: Counter[str] = field(default_factory=Counter)
    degraded: int = 0
    samples: int = 0
    last_decision: Decision | None = None
    last_cas: CASResult | None = None
    log_failures: int = 0
    last_log_error: str | None = None
    log_spilled: int = 0
    features_logged: int = 0
    feature_failures: int = 0
    candidate_decisions: int = 0
    candidate_failures: int = 0
    last_beside_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def decided(self, decision: Decision) -> None:
        """Count a decision (a shadow one as a would-be action)."""
        with self._lock:
            if decision.shadow:
                self.shadow_actions[decision.action] += 1
            else:
                self.calls += 1
                self.actions[decision.action] += 1
            self.degraded += int(decision.degraded)
            self.last_decision = decision

    def proceeded(self) -> None:
        """Count a shadow call, which proceeds as if answered."""
        with self._lock:
            self.calls += 1
            self.actions["answer"] += 1

    def routed(self, decision: Decision) -> None:
        """Record the route chosen for the last decision (already counted)."""
        with self._lock:
            self.last_decision = decision

    def sampled(self, cas: CASResult) -> None:
        """Count a resample run."""
        with self._lock:
            self.samples += cas.samples_used
            self.last_cas = cas

    def log_failed(self, error: BaseException) -> None:
        """Count a decision the log could not store."""
        with self._lock:
            self.log_failures += 1
            self.last_log_error = str(error)

    def log_spilled_one(self) -> None:
        """Count a decision kept in the log's spill file."""
        with self._lock:
            self.log_spilled += 1

    def beside(self, work: Work, *, failed: str | None = None) -> None:
        """Count work done beside the call: ``"features"`` logged or a ``"candidate"`` decision
        (``failed``: it could not be done, and why, in words without text or feature values)."""
        with self._lock:
            if failed is not None:
                self.last_beside_error = failed
            if work == "features":
                self.features_logged += failed is None
                self.feature_failures += failed is not None
            else:
                self.candidate_decisions += failed is None
                self.candidate_failures += failed is not None

    def reset(self) -> None:
        """Zero every count (and forget the last decision, resample run and errors)."""
        with self._lock:
            for spec in fields(self):
                value = getattr(self, spec.name)
                if isinstance(value, Counter):
                    value.clear()
                elif spec.name != "_lock":
                    factory = spec.default_factory
                    setattr(self, spec.name, factory() if callable(factory) else spec.default)
