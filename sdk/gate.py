"""The capability gate: estimate a query's capability, let a policy decide, act on the decision.

:class:`Gate` is the object every integration shares: the :func:`~capgate.guard` decorator, the
LangGraph nodes (:mod:`capgate.adapters.langgraph`) and the LangChain middleware
(:mod:`capgate.adapters.langchain`) differ only in how they read the query and carry out the
action. The gate does the rest once: it estimates (sync :meth:`Gate.assess` or async
:meth:`Gate.aassess`), decides through its :class:`~capgate.policies.Policy`, counts what it did
(:class:`GateStats`), writes decisions to an optional :class:`~capgate.decision.DecisionLog`,
runs ``resample`` through CAS over any function that draws one response per call
(:meth:`Gate.sample` / :meth:`Gate.asample`), and turns ``abstain`` / ``clarify`` / ``escalate``
into a typed :class:`Gated` result or a :class:`GateBlocked` exception (:meth:`Gate.block`).

Example:
    >>> from capgate import Estimate
    >>> from capgate.estimators import CapabilityEstimator
    >>> class Fixed(CapabilityEstimator):
    ...     method = "fixed"
    ...     def estimate(self, queries):
    ...         return [Estimate(p=0.2, method=self.method) for _ in queries]
    >>> gate = Gate(policy="balanced", estimator=Fixed())
    >>> verdict = gate.assess("Prove the Riemann hypothesis.")
    >>> verdict.action, gate.stats.calls
    ('abstain', 1)
    >>> gate.block(verdict).message
    "I can't answer this reliably (estimated chance of a correct answer: 20%)."
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Generic, Literal, TypeAlias, TypeVar

from capgate._types import Estimate
from capgate.backend import ChatMessage, Prompt
from capgate.cas.function import AsyncFunctionBackend, FunctionBackend
from capgate.cas.loop import CASResult, aadaptive_sample, adaptive_sample
from capgate.cas.stop import StopFn
from capgate.decision.log import DecisionLog
from capgate.decision.types import Action, Decision
from capgate.estimators.base import CapabilityEstimator, Query
from capgate.policies import Policy, ResampleAction, load_policy

__all__ = [
    "RESAMPLE_FAILED_MESSAGE",
    "UNSET",
    "Abstained",
    "ClarificationNeeded",
    "Escalated",
    "Extractor",
    "Gate",
    "GateBlocked",
    "GateStats",
    "Gated",
    "OnBlock",
    "PolicyLike",
    "ResampleFailed",
    "Sampled",
    "SamplingPlan",
    "Unset",
    "Verdict",
    "as_query",
    "default_estimator",
    "default_extract",
    "set_default_estimator",
]

T = TypeVar("T")


class Unset(enum.Enum):
    """Type of :data:`UNSET`."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET
"""Marks a per-call override as not given (inherit the gate's setting), unlike an explicit
``None`` (which, for ``step`` and ``tool``, means "no step" / "no tool")."""

OnBlock: TypeAlias = Literal["return", "raise"]
"""What a blocked query (abstain, clarify, escalate, a resample without an answer) produces: a
:class:`Gated` result, or a :class:`GateBlocked` exception."""

PolicyLike: TypeAlias = str | Path | Policy
"""A policy, a preset name (``"balanced"``) or a policy file path."""

Extractor: TypeAlias = Callable[[str], str | None]
"""Maps a response text to its normalized answer (``None``: no answer); CAS votes by it. A
grader's ``extract`` method is one."""

_ON_BLOCK: tuple[str, ...] = ("return", "raise")

RESAMPLE_FAILED_MESSAGE = (
    "I sampled {n} answers to check my consistency, but none of them gave an answer I could "
    "compare, so I won't guess."
)
"""Text of a :class:`Gated` result when ``resample`` drew responses but none had an answer."""


# --------------------------------------------------------------------------- default estimator

_default: list[CapabilityEstimator] = []


def set_default_estimator(estimator: CapabilityEstimator | None) -> None:
    """Set (or, with ``None``, clear) the estimator that gates built without one use.

    Example:
        >>> set_default_estimator(None)
        >>> default_estimator() is None
        True
    """
    if estimator is not None and not isinstance(estimator, CapabilityEstimator):
        raise TypeError(f"the default estimator must be a CapabilityEstimator; got {estimator!r}")
    _default[:] = [] if estimator is None else [estimator]


def default_estimator() -> CapabilityEstimator | None:
    """The estimator set by :func:`set_default_estimator`, if any."""
    return _default[0] if _default else None


# --------------------------------------------------------------------------- results and errors


def default_extract(text: str) -> str | None:
    """The default answer extractor for voting: the final-answer span, normalized.

    The last ``\\boxed{}``, else the text after "answer is" / "Answer:", else the first line;
    then lowercased with punctuation and articles dropped (:func:`capgate.grading.normalize_text`).

    Example:
        >>> default_extract("Let me think.\\nThe answer is: **The Eiffel Tower**.")
        'eiffel tower'
    """
    from capgate.grading import final_answer_text, normalize_text

    span = final_answer_text(text)
    if span is None:
        return None
    return normalize_text(span) or None


@dataclass(frozen=True)
class Gated:
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
    query: Query
    message: str
    cas: CASResult | None = None

    @property
    def action(self) -> Action:
        """The action that blocked the call."""
        return self.decision.action

    @property
    def estimate(self) -> Estimate:
        """The capability estimate the decision was made on."""
        return self.decision.estimate

    def __str__(self) -> str:
        return self.message


class GateBlocked(Exception):  # noqa: N818 - reads as a state, like StopIteration
    """Raised (with ``on_block="raise"``) when the policy does not let the query be answered.

    Catch the subclass for one action, or this class for all of them.

    Attributes:
        gated: The blocked result, with the decision, the estimate and the message.
    """

    def __init__(self, gated: Gated) -> None:
        self.gated = gated
        super().__init__(gated.message)

    @property
    def decision(self) -> Decision:
        """The policy's decision."""
        return self.gated.decision

    @property
    def estimate(self) -> Estimate:
        """The capability estimate."""
        return self.gated.estimate

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


@dataclass(frozen=True)
class SamplingPlan:
    """How a ``resample`` decision samples: the policy's stop rule, batch size and budget.

    Attributes:
        stop: The stop rule (from the resample action's ``stop`` settings).
        batch_size: Responses drawn per round.
        max_samples: The budget (the decision's ``budget``).
    """

    stop: StopFn
    batch_size: int
    max_samples: int

    @classmethod
    def from_action(cls, spec: ResampleAction, budget: int) -> SamplingPlan:
        """The plan of a resample action for a decision with the given budget."""
        return cls(stop=spec.stop.rule(), batch_size=min(spec.batch_size, budget), max_samples=budget)


@dataclass(frozen=True)
class Verdict:
    """A decision on a query, with what an integration needs to carry it out.

    Attributes:
        decision: The policy's decision.
        query: The query (normalized: a string or chat messages).
        plan: For ``resample``, how to sample; else ``None``.
    """

    decision: Decision
    query: Query
    plan: SamplingPlan | None = None

    @property
    def action(self) -> Action:
        """The decided action."""
        return self.decision.action

    @property
    def estimate(self) -> Estimate:
        """The capability estimate."""
        return self.decision.estimate


@dataclass(frozen=True)
class Sampled(Generic[T]):
    """The outcome of resampling a function under CAS.

    Attributes:
        value: The first drawn value whose answer won the vote (``None`` if no response had one).
        cas: The sampling run (votes, samples used, why it stopped).
    """

    value: T | None
    cas: CASResult


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

    def _decided(self, decision: Decision) -> None:
        with self._lock:
            self.calls += 1
            self.actions[decision.action] += 1
            self.degraded += int(decision.degraded)
            self.last_decision = decision

    def _sampled(self, cas: CASResult) -> None:
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


# --------------------------------------------------------------------------- queries


def _content_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text") if isinstance(p, Mapping) else p for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(str(p) for p in parts)
    raise TypeError(f"{where}: message content must be text; got {type(content).__name__}")


_ROLES: dict[str, str] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
}


def as_query(value: object, *, where: str = "query") -> Query:
    """Normalize a prompt to a capgate query: a string, or a list of ``{role, content}`` messages.

    Messages may be mappings (OpenAI style) or objects with ``role`` or ``type`` and ``content``
    (LangChain messages); ``human``/``ai`` roles map to ``user``/``assistant``.

    Raises:
        TypeError: Not a string or chat messages; ``where`` names the offending value.

    Example:
        >>> as_query([{"role": "human", "content": "hi"}])
        [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        messages: list[ChatMessage] = []
        for i, item in enumerate(value):
            at = f"{where}, message {i}"
            if isinstance(item, Mapping):
                role, content = item.get("role", item.get("type")), item.get("content")
            else:
                role = getattr(item, "role", None) or getattr(item, "type", None)
                content = getattr(item, "content", None)
            mapped = _ROLES.get(str(role)) if role is not None else None
            if mapped is None:
                raise TypeError(
                    f"{at}: expected a chat message with a role in {sorted(_ROLES)}; got {item!r}"
                )
            messages.append({"role": mapped, "content": _content_text(content, at)})  # type: ignore[typeddict-item]
        return messages
    raise TypeError(
        f"{where}: expected a prompt string or a list of chat messages; got {type(value).__name__}"
    )


# --------------------------------------------------------------------------- the gate


class Gate:
    """Estimate, decide, count, log and act: the engine behind every capgate integration.

    The constructor only checks and stores its settings; the policy loads on first use.

    Args:
        policy: A :class:`~capgate.policies.Policy`, a preset name or a policy file path.
        estimator: The capability estimator; ``None`` uses :func:`default_estimator` at call time.
        extract: Answer extractor for ``resample`` votes (default: :func:`default_extract`).
        on_block: ``"return"`` a :class:`Gated` result or ``"raise"`` a :class:`GateBlocked`.
        step: Agent step name passed to the policy (selects its step override).
        tool: Tool name passed to the policy (selects its tool override).
        log: Decision log (a :class:`~capgate.decision.DecisionLog` or a path to one).

    Raises:
        ValueError: A setting has a wrong value (the message names it).
        TypeError: A setting has a wrong type.
    """

    def __init__(
        self,
        *,
        policy: PolicyLike = "balanced",
        estimator: CapabilityEstimator | None = None,
        extract: Extractor | None = None,
        on_block: OnBlock = "return",
        step: str | None = None,
        tool: str | None = None,
        log: DecisionLog | str | Path | None = None,
    ) -> None:
        _check_policy(policy, "policy")
        _check_estimator(estimator, "estimator")
        if extract is not None and not callable(extract):
            raise TypeError(f"`extract` must be a function text -> answer or None; got {extract!r}")
        _check_on_block(on_block, "on_block")
        for name, value in (("step", step), ("tool", tool)):
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"`{name}` must be a non-empty string or None; got {value!r}")
        if log is not None and not isinstance(log, DecisionLog | str | Path):
            raise TypeError(f"`log` must be a DecisionLog, a path or None; got {log!r}")
        self.policy = policy
        self.estimator = estimator
        self.extract = extract
        self.on_block: OnBlock = on_block
        self.step = step
        self.tool = tool
        self.log: DecisionLog | None = DecisionLog(log) if isinstance(log, str | Path) else log
        self.stats = GateStats()
        self._policies: dict[str, Policy] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        policy = self.policy.name if isinstance(self.policy, Policy) else str(self.policy)
        return (
            f"Gate(policy={policy!r}, estimator={self.estimator!r}, on_block={self.on_block!r}, "
            f"step={self.step!r}, tool={self.tool!r})"
        )

    # ------------------------------------------------------------------ settings

    def resolve_policy(self, policy: PolicyLike | Unset = UNSET) -> Policy:
        """The policy in force (a preset or file is loaded once, then cached)."""
        chosen = self.policy if policy is UNSET else policy
        if isinstance(chosen, Policy):
            return chosen
        key = str(chosen)
        with self._lock:
            if key not in self._policies:
                self._policies[key] = load_policy(chosen)
            return self._policies[key]

    def resolve_estimator(self, estimator: CapabilityEstimator | Unset | None = UNSET) -> CapabilityEstimator:
        """The estimator in force.

        Raises:
            ValueError: None was given and no default is set.
        """
        chosen = self.estimator if estimator is UNSET else estimator
        if chosen is None:
            chosen = default_estimator()
        if chosen is None:
            raise ValueError(
                "no capability estimator: pass estimator=... (any capgate CapabilityEstimator) or "
                "call capgate.gate.set_default_estimator(...)"
            )
        return chosen

    # ------------------------------------------------------------------ deciding (no I/O here)

    def _prepare(
        self,
        query: object,
        policy: PolicyLike | Unset,
        step: str | Unset | None,
        tool: str | Unset | None,
        estimator: CapabilityEstimator | Unset | None,
    ) -> tuple[Query, Policy, str | None, str | None, CapabilityEstimator]:
        if policy is not UNSET:
            _check_policy(policy, "capgate_policy")
        if estimator is not UNSET:
            _check_estimator(estimator, "capgate_estimator")
        return (
            as_query(query),
            self.resolve_policy(policy),
            self.step if step is UNSET else step,
            self.tool if tool is UNSET else tool,
            self.resolve_estimator(estimator),
        )

    def _decide(
        self,
        query: Query,
        estimates: object,
        estimator: CapabilityEstimator,
        policy: Policy,
        step: str | None,
        tool: str | None,
    ) -> Verdict:
        if not (isinstance(estimates, list) and len(estimates) == 1 and isinstance(estimates[0], Estimate)):
            raise TypeError(
                f"{type(estimator).__name__}.estimate([query]) must return a list of one Estimate; "
                f"got {estimates!r}"
            )
        estimate = estimates[0]
        decision = policy.decide(estimate, step=step, tool=tool)
        plan: SamplingPlan | None = None
        if decision.action == "resample":
            spec = policy.match(estimate, step=step, tool=tool).spec
            assert isinstance(spec, ResampleAction)
            assert decision.budget is not None
            plan = SamplingPlan.from_action(spec, decision.budget)
        self.stats._decided(decision)
        return Verdict(decision=decision, query=query, plan=plan)

    def assess(
        self,
        query: object,
        *,
        policy: PolicyLike | Unset = UNSET,
        step: str | Unset | None = UNSET,
        tool: str | Unset | None = UNSET,
        estimator: CapabilityEstimator | Unset | None = UNSET,
    ) -> Verdict:
        """Estimate the query's capability and decide (counted in :attr:`stats`, not logged).

        Args:
            query: A prompt string or chat messages (see :func:`as_query`).
            policy: Overrides the gate's policy for this query.
            step: Overrides the gate's step (``None``: no step).
            tool: Overrides the gate's tool (``None``: no tool).
            estimator: Overrides the gate's estimator.

        Returns:
            The decision, the normalized query and, for resample, the sampling plan. Degraded
            estimates follow the policy's ``on_degraded`` and the decision records it.
        """
        q, chosen, s, t, est = self._prepare(query, policy, step, tool, estimator)
        return self._decide(q, est.estimate([q]), est, chosen, s, t)

    async def aassess(
        self,
        query: object,
        *,
        policy: PolicyLike | Unset = UNSET,
        step: str | Unset | None = UNSET,
        tool: str | Unset | None = UNSET,
        estimator: CapabilityEstimator | Unset | None = UNSET,
    ) -> Verdict:
        """Async twin of :meth:`assess` (uses the estimator's ``aestimate``)."""
        q, chosen, s, t, est = self._prepare(query, policy, step, tool, estimator)
        return self._decide(q, await est.aestimate([q]), est, chosen, s, t)

    # ------------------------------------------------------------------ logging

    def record(self, verdict: Verdict, *, samples_used: int | None = None) -> None:
        """Write the decision to the gate's log (no-op without one)."""
        if self.log is not None:
            self.log.record(verdict.decision, query=verdict.query, samples_used=samples_used)

    async def arecord(self, verdict: Verdict, *, samples_used: int | None = None) -> None:
        """Async twin of :meth:`record` (the SQLite write runs in a worker thread)."""
        if self.log is not None:
            await asyncio.to_thread(self.record, verdict, samples_used=samples_used)

    # ------------------------------------------------------------------ blocking

    def block(
        self, verdict: Verdict, *, on_block: OnBlock | Unset = UNSET, cas: CASResult | None = None
    ) -> Gated:
        """The :class:`Gated` result for a blocked decision, or raise it (``on_block="raise"``).

        Raises:
            GateBlocked: The action's subclass, when ``on_block`` is ``"raise"``.
            ValueError: The decision does not block (answer, or resample with an answer).
        """
        mode = self.on_block if on_block is UNSET else on_block
        _check_on_block(mode, "capgate_on_block")
        decision = verdict.decision
        if decision.action == "answer" or (decision.action == "resample" and cas is None):
            raise ValueError(f"a {decision.action!r} decision does not block; nothing to return or raise")
        if decision.action == "resample":
            assert cas is not None
            message = RESAMPLE_FAILED_MESSAGE.format(n=cas.samples_used)
        else:
            message = decision.message or decision.reason
        gated = Gated(decision=decision, query=verdict.query, message=message, cas=cas)
        if mode == "raise":
            raise _BLOCKED[decision.action](gated)
        return gated

    # ------------------------------------------------------------------ resampling

    def _backend_kwargs(self, verdict: Verdict, extract: Extractor | Unset | None) -> dict[str, object]:
        if verdict.plan is None:
            raise ValueError(f"only a resample decision can be sampled; this one is {verdict.action!r}")
        chosen = self.extract if extract is UNSET else extract
        return {
            "extract": chosen or default_extract,
            "stop": verdict.plan.stop,
            "batch_size": verdict.plan.batch_size,
            "max_samples": verdict.plan.max_samples,
        }

    def sample(
        self,
        draw: Callable[[Prompt], T],
        verdict: Verdict,
        *,
        extract: Extractor | Unset | None = UNSET,
        to_text: Callable[[T], str] | None = None,
        count_tokens: Callable[[T], int] | None = None,
    ) -> Sampled[T]:
        """Carry out a ``resample`` decision: call ``draw`` under CAS and return the vote winner.

        Each call of ``draw(query)`` is one sample; the policy's stop rule, batch size and budget
        bound the run (:class:`SamplingPlan`).

        Args:
            draw: Draws one response (any object: a string, a chat message, a state update).
            verdict: A resample verdict from :meth:`assess`.
            extract: Overrides the gate's answer extractor.
            to_text: Reads a drawn value's text (default: a string, or its ``content``).
            count_tokens: Reads a drawn value's generated tokens, if known.
        """
        backend = FunctionBackend(draw, to_text=to_text, count_tokens=count_tokens)
        kwargs = self._backend_kwargs(verdict, extract)
        cas = adaptive_sample(backend, verdict.query, **kwargs)  # type: ignore[arg-type]
        self.stats._sampled(cas)
        return Sampled(value=backend.winner(cas), cas=cas)

    async def asample(
        self,
        draw: Callable[[Prompt], Awaitable[T]],
        verdict: Verdict,
        *,
        extract: Extractor | Unset | None = UNSET,
        to_text: Callable[[T], str] | None = None,
        count_tokens: Callable[[T], int] | None = None,
        concurrent: bool = True,
    ) -> Sampled[T]:
        """Async twin of :meth:`sample`; the draws of one batch run concurrently by default."""
        backend = AsyncFunctionBackend(
            draw, to_text=to_text, count_tokens=count_tokens, concurrent=concurrent
        )
        kwargs = self._backend_kwargs(verdict, extract)
        cas = await aadaptive_sample(backend, verdict.query, **kwargs)  # type: ignore[arg-type]
        self.stats._sampled(cas)
        return Sampled(value=backend.winner(cas), cas=cas)


def _check_policy(policy: object, name: str) -> None:
    if not isinstance(policy, str | Path | Policy) or (isinstance(policy, str) and not policy):
        raise ValueError(f"`{name}` must be a Policy, a preset name or a policy file path; got {policy!r}")


def _check_estimator(estimator: object, name: str) -> None:
    if estimator is not None and not isinstance(estimator, CapabilityEstimator):
        raise TypeError(f"`{name}` must be a capgate CapabilityEstimator or None; got {estimator!r}")


def _check_on_block(on_block: object, name: str) -> None:
    if on_block not in _ON_BLOCK:
        raise ValueError(f"`{name}` must be one of {_ON_BLOCK}; got {on_block!r}")
