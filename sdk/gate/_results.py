"""What a gate hands back: a verdict to act on, a blocked result or exception, a resample's winner."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from capgate.cas.loop import CASResult
from capgate.core.backend import Prompt
from capgate.core.types import Action, Decision, Estimate, SamplingPlan

T = TypeVar("T")

RESAMPLE_FAILED_MESSAGE = (
    "I sampled {n} answers to check my consistency, but none of them gave an answer I could "
    "compare, so I won't guess."
)
"""Text of a :class:`Gated` result when ``resample`` drew responses but none had an answer."""


class _DecisionFacts:
    """``action`` and ``estimate`` read from the object's ``decision``."""

    decision: Decision

    @property
    def action(self) -> Action:
        """The decided action."""
        return self.decision.action

    @property
    def estimate(self) -> Estimate:
        """The capability estimate the decision was made on."""
        return self.decision.estimate


class ShadowDecision:
    """A shadow decision being made: :meth:`then` runs a callback with its verdict once it exists;
    ``unmade()``: the (degraded) verdict logged when its task was cancelled first (its loop closed)."""

    def __init__(
        self,
        future: concurrent.futures.Future[Verdict] | asyncio.Future[Verdict],
        unmade: Callable[[], Verdict] | None = None,
    ) -> None:
        self.future = future
        self._unmade = unmade
        self._unmade_verdict: Verdict | None = None  # made once: every callback gets the same one
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Verdict], None]] = []
        future.add_done_callback(self._done)

    def _verdict(self) -> Verdict | None:
        """The finished future's verdict (``None``: it failed, or was cancelled with no ``unmade``)."""
        if self.future.cancelled():
            with self._lock:
                if self._unmade_verdict is None and self._unmade is not None:
                    self._unmade_verdict = self._unmade()
                return self._unmade_verdict
        return self.future.result() if self.future.exception() is None else None

    def _done(self, future: Any) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        verdict = self._verdict() if callbacks else None
        if verdict is not None:
            for callback in callbacks:
                callback(verdict)

    def then(self, callback: Callable[[Verdict], None]) -> None:
        """Call ``callback(verdict)`` once the decision is made (now, if it is)."""
        with self._lock:
            if not self.future.done():
                self._callbacks.append(callback)
                return
        verdict = self._verdict()
        if verdict is not None:
            callback(verdict)


@dataclass(frozen=True)
class Verdict(_DecisionFacts):
    """A decision on a query, and the query it was made on: all an integration needs to act.

    Attributes:
        decision: The policy's decision (self-contained: it carries its sampling plan, its
            hand-off target and its texts).
        query: The query (normalized: a string or chat messages).
        pending: In shadow mode, the decision being made beside the call (``decision`` is then
            its stand-in: ``answer``, with the same id the logged decision will have).
    """

    decision: Decision
    query: Prompt
    pending: ShadowDecision | None = field(default=None, compare=False, repr=False)

    @property
    def plan(self) -> SamplingPlan | None:
        """For ``resample``, how to sample (the decision's plan); else ``None``."""
        return self.decision.plan


@dataclass(frozen=True)
class Gated(_DecisionFacts):
    """What a gated call returns instead of an answer when the policy blocks it.

    Attributes:
        decision: The policy's decision (its ``action`` is abstain, clarify or escalate; or
            resample when no sampled response had an answer).
        query: The query the decision was made on.
        message: The text for the user (abstain message, clarifying question) or the human
            (escalation summary).
        cas: For a failed resample, the sampling run.
    """

    decision: Decision
    query: Prompt
    message: str
    cas: CASResult | None = None

    @classmethod
    def of(cls, verdict: Verdict, cas: CASResult | None = None) -> Gated:
        """The blocked result of a verdict (``cas``: the resample run that found no answer).

        Raises:
            ValueError: The decision does not block (answer, or resample with no run given).
        """
        decision = verdict.decision
        if decision.action == "answer" or (decision.action == "resample" and cas is None):
            raise ValueError(f"a {decision.action!r} decision does not block; nothing to return or raise")
        if decision.action == "resample":
            assert cas is not None
            message = RESAMPLE_FAILED_MESSAGE.format(n=cas.samples_used)
        else:
            message = decision.text
        return cls(decision=decision, query=verdict.query, message=message, cas=cas)

    def __str__(self) -> str:
        return self.message


class GateBlocked(_DecisionFacts, Exception):  # noqa: N818 - reads as a state, like StopIteration
    """Raised (with ``on_block="raise"``) when the policy does not let the query be answered; catch
    the subclass for one action, or this class for all of them.

    Attributes:
        gated: The blocked result, with the decision, the estimate and the message.
    """

    def __init__(self, gated: Gated) -> None:
        self.gated = gated
        super().__init__(gated.message)

    @property
    def decision(self) -> Decision:  # type: ignore[override]  # read-only here, a field elsewhere
        """The policy's decision."""
        return self.gated.decision

    @property
    def message(self) -> str:
        """The text for the user or the human."""
        return self.gated.message


class Abstained(GateBlocked):
    """The policy abstained; ``message`` is the text for the user."""


class ClarificationNeeded(GateBlocked):
    """The policy asks the user to clarify; ``message`` is the clarifying question."""


class Escalated(GateBlocked):
    """The policy hands the query to a human; ``message`` is the hand-off summary."""


class ResampleFailed(GateBlocked):
    """Resampling drew responses but none had an extractable answer."""


_BLOCKED: dict[str, type[GateBlocked]] = {
    "abstain": Abstained,
    "clarify": ClarificationNeeded,
    "escalate": Escalated,
    "resample": ResampleFailed,
}


def blocked_error(gated: Gated) -> GateBlocked:
    """The :class:`GateBlocked` subclass instance for a blocked result (to raise)."""
    return _BLOCKED[gated.action](gated)


@dataclass(frozen=True)
class Sampled(Generic[T]):
    """The outcome of resampling a function under CAS.

    Attributes:
        value: The first drawn value whose answer won the vote (``None`` if no response had one).
        cas: The sampling run (votes, samples used, why it stopped).
    """

    value: T | None
    cas: CASResult
