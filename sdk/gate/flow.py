"""The integration API: a gated call as an I/O-free flow of effects, run by a sync or an async driver.

A *flow* is a generator that yields :class:`Effect` s and receives each one's result back, then
returns its own result. An integration (the :func:`~capgate.guard` decorator, the LangGraph nodes,
the LangChain middleware) writes its logic once as a flow: which action leads where, what is logged,
when to block. :func:`drive` runs it with each effect's sync I/O and :func:`adrive` with its async
I/O, so the two paths cannot drift apart; an effect that fails is thrown back into the flow.

Effects an integration yields:

* :class:`Assess`: estimate a query's capability under the gate's limits and decide (a
  :class:`~capgate.gate.Verdict`); :class:`AssessEach` does several at once, one batched estimate
  per estimator; :class:`Route` chooses a model choice by predicted capability.
* :class:`Sample`: carry out a ``resample`` verdict under CAS, each sample one call of the user's
  code; :class:`Record`: write a decision to the gate's log; :class:`Invoke`: run the user's code.

:class:`Assess`, :class:`AssessEach`, :class:`Route` and :class:`Sample` are themselves flows of the
gate (:class:`Compound` effects): the driver runs them down to their leaves, :class:`EstimateCall`
(one estimator call) and :class:`Draw` (one resample round), with the same driver, so a call walks
down from the integration to the estimator once, calling back up only to run the user's code.

The driver also traces (:mod:`capgate.telemetry`, a no-op without OpenTelemetry): each decision
is a ``capgate.gate`` span open until the flow ends, its estimator calls and resample rounds nest
under it, and the user's own calls run under the caller's span.

Example:
    >>> from capgate import Gate
    >>> from capgate.estimators import ConstantPrior
    >>> likely = ConstantPrior.from_mean(0.9, n_train=1)  # predicts 0.9 for every query
    >>> gate = Gate(policy="balanced", estimator=likely)
    >>> def ask(question: str) -> Flow[str]:
    ...     verdict = yield Assess(gate, question)
    ...     yield Record(gate, verdict, samples_used=1)
    ...     if verdict.action != "answer":
    ...         return gate.block(verdict).message
    ...     return (yield Invoke(lambda: "4"))
    >>> drive(ask("2 + 2?"))
    '4'
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import operator
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from capgate import _twins as twins
from capgate import telemetry
from capgate._types import Estimate, RoutePlan
from capgate.backend import Generation, Prompt
from capgate.cas.drawn import DrawnValues
from capgate.cas.loop import CASResult
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._limits import Limits, limited_aestimate, limited_estimate, log_writer
from capgate.gate._results import GateBlocked, Sampled, Verdict
from capgate.gate._settings import GateSettings
from capgate.messages import as_query

if TYPE_CHECKING:
    from capgate.decision.log import DecisionLog

__all__ = [
    "Assess",
    "AssessEach",
    "Compound",
    "Draw",
    "Effect",
    "EstimateCall",
    "Flow",
    "FlowGate",
    "Invoke",
    "Record",
    "Route",
    "Sample",
    "adrive",
    "aperform",
    "drive",
    "perform",
]

R = TypeVar("R")


class Effect(ABC):
    """One piece of I/O a flow asks for; :meth:`run` does it sync, :meth:`arun` async."""

    @abstractmethod
    def run(self) -> Any:
        """Do it synchronously."""

    @abstractmethod
    async def arun(self) -> Any:
        """Do it asynchronously."""


Flow: TypeAlias = Generator[Effect, Any, R]
"""A flow yields effects, receives their results, and returns its own."""


class Compound(Effect):
    """An effect that is itself a flow of effects; a driver runs its :meth:`flow` with itself."""

    @abstractmethod
    def flow(self) -> Flow[Any]:
        """The effects it is made of."""

    def run(self) -> Any:
        return perform(self)

    async def arun(self) -> Any:
        return await aperform(self)


class FlowGate(Protocol):
    """What the gate's effects ask of a gate (:class:`~capgate.Gate` is the implementation)."""

    @property
    def settings(self) -> GateSettings: ...

    @property
    def log(self) -> DecisionLog | None: ...

    def assess_flow(self, query: object, *, where: str | None = None) -> Flow[Verdict]: ...

    def route_flow(self, query: Prompt, plan: RoutePlan) -> Flow[tuple[str, RoutePlan, str]]: ...

    def sample_flow(
        self,
        verdict: Verdict,
        draw: Invoke,
        *,
        to_text: Callable[[Any], str] | None,
        count_tokens: Callable[[Any], int] | None,
        concurrent: bool,
    ) -> Flow[Sampled[Any]]: ...

    def resolve_estimator(self) -> CapabilityEstimator: ...

    def estimate_call(self, estimator: CapabilityEstimator, queries: list[Prompt]) -> EstimateCall: ...

    def decide_on(self, query: Prompt, estimates: object, estimator: CapabilityEstimator) -> Verdict: ...

    def record(
        self, verdict: Verdict, *, samples_used: int | None = None, cas: CASResult | None = None
    ) -> None: ...


# --------------------------------------------------------------------------- leaf effects


@dataclass(frozen=True)
class EstimateCall(Effect):
    """One call of an estimator, within the gate's concurrency cap and deadline (a late estimate
    is degraded, naming the deadline; an async one is cancelled)."""

    estimator: CapabilityEstimator
    queries: list[Prompt]
    limits: Limits

    def run(self) -> list[Estimate]:
        return limited_estimate(self.estimator, self.queries, self.limits)

    async def arun(self) -> list[Estimate]:
        return await limited_aestimate(self.estimator, self.queries, self.limits)


@dataclass(frozen=True)
class Record(Effect):
    """Write a decision to the gate's log (:meth:`capgate.Gate.record`); async, from the log's thread."""

    gate: FlowGate
    verdict: Verdict
    samples_used: int | None = None
    cas: CASResult | None = None

    def run(self) -> None:
        self.gate.record(self.verdict, samples_used=self.samples_used, cas=self.cas)

    async def arun(self) -> None:
        if self.gate.settings.log is not None:
            await asyncio.get_running_loop().run_in_executor(log_writer(), self.run)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass(frozen=True)
class Invoke(Effect):
    """Call the user's code: ``call()`` on the sync path, ``acall()`` (awaited) on the async one.

    Without ``acall``, the async path awaits what ``call()`` returns when it is awaitable (a
    coroutine function's call).
    """

    call: Callable[[], Any]
    acall: Callable[[], Awaitable[Any]] | None = None

    def run(self) -> Any:
        return self.call()

    async def arun(self) -> Any:
        return await (self.acall() if self.acall is not None else _awaited(self.call()))


@dataclass(frozen=True)
class Draw(Effect):
    """One resample round: ``n`` calls of the user's code, kept in ``drawn`` (async: concurrent
    unless ``concurrent`` is off); the generations they read as, in call order."""

    invoke: Invoke
    n: int
    drawn: DrawnValues[Any]
    concurrent: bool = True
    index: int = 0
    model: str | None = None

    def run(self) -> list[Generation]:
        return [self.drawn.generation(self.invoke.run()) for _ in range(self.n)]

    async def arun(self) -> list[Generation]:
        if self.concurrent:
            values = list(await asyncio.gather(*(self.invoke.arun() for _ in range(self.n))))
        else:
            values = [await self.invoke.arun() for _ in range(self.n)]
        return [self.drawn.generation(v) for v in values]


# --------------------------------------------------------------------------- the gate's own flows


@dataclass(frozen=True)
class Assess(Compound):
    """Estimate a query and decide (:meth:`capgate.Gate.assess`): a :class:`~capgate.gate.Verdict`.

    ``where`` names where the query came from, for the error of a query that is not one.
    """

    gate: FlowGate
    query: object
    where: str | None = None

    def flow(self) -> Flow[Verdict]:
        return self.gate.assess_flow(self.query, where=self.where)


@dataclass(frozen=True)
class AssessEach(Compound):
    """Several assessments, each by its own gate (view): a list of verdicts, in order.

    The queries that share an estimator are estimated in one call (one batched forward pass for a
    probe), within the first asking gate's limits; then each gate decides on its own estimate.
    """

    items: Sequence[tuple[FlowGate, object]]

    def flow(self) -> Flow[list[Verdict]]:
        asked = [(gate, as_query(query), gate.resolve_estimator()) for gate, query in self.items]
        groups: dict[int, list[int]] = {}
        for index, (_, _, estimator) in enumerate(asked):
            groups.setdefault(id(estimator), []).append(index)
        verdicts: dict[int, Verdict] = {}
        for indices in groups.values():
            gate, _, estimator = asked[indices[0]]
            estimates = yield gate.estimate_call(estimator, [asked[i][1] for i in indices])
            if not isinstance(estimates, list) or len(estimates) != len(indices):
                raise TypeError(
                    f"{type(estimator).__name__}.estimate(queries) must return one Estimate per query; "
                    f"got {estimates!r} for {len(indices)} queries"
                )
            for i, estimate in zip(indices, estimates, strict=True):
                verdicts[i] = asked[i][0].decide_on(asked[i][1], [estimate], estimator)
        return [verdicts[i] for i in range(len(asked))]


@dataclass(frozen=True)
class Route(Compound):
    """Choose a model for a query by the gate's ``routes``: the chosen name, the plan with each
    estimated choice's p, and the reason (:func:`capgate.policies.choose_route`)."""

    gate: FlowGate
    query: object
    plan: RoutePlan

    def flow(self) -> Flow[tuple[str, RoutePlan, str]]:
        return self.gate.route_flow(as_query(self.query), self.plan)


@dataclass(frozen=True)
class Sample(Compound):
    """Carry out a resample verdict under CAS, each sample one ``draw`` (:meth:`capgate.Gate.sample`)."""

    gate: FlowGate
    verdict: Verdict
    draw: Invoke
    to_text: Callable[[Any], str] | None = None
    count_tokens: Callable[[Any], int] | None = None
    concurrent: bool = True

    def flow(self) -> Flow[Sampled[Any]]:
        return self.gate.sample_flow(
            self.verdict,
            self.draw,
            to_text=self.to_text,
            count_tokens=self.count_tokens,
            concurrent=self.concurrent,
        )


# --------------------------------------------------------------------------- tracing observer


class _Spans:
    """The spans of one drive: each decision's ``capgate.gate`` span stays open until it ends."""

    def __init__(self) -> None:
        self.open: dict[str, Any] = {}

    def enter(self, effect: Effect) -> Any:
        """The span(s) ``effect`` opens (``None``: it runs under the current one)."""
        if isinstance(effect, Assess):
            return telemetry.start(telemetry.SPAN_GATE)
        if isinstance(effect, AssessEach):
            return [telemetry.start(telemetry.SPAN_GATE) for _ in effect.items]
        if isinstance(effect, EstimateCall):
            return telemetry.start(telemetry.SPAN_ESTIMATE)
        if isinstance(effect, Draw):
            span = telemetry.start(telemetry.SPAN_ROUND)
            telemetry.record_round(span, effect.index, effect.n, effect.model)
            return span
        if isinstance(effect, Sample):
            decision = effect.verdict.decision
            if decision.id not in self.open:  # decided earlier (read from state): a span of its own
                span = telemetry.start(telemetry.SPAN_GATE)
                self._decided(span, effect.gate, effect.verdict)
                self.open[decision.id] = span
            return self.open[decision.id]
        return None

    @staticmethod
    def _decided(span: Any, gate: FlowGate, verdict: Verdict) -> None:
        keeps_text = getattr(gate.log, "store_text", False) if gate.settings.log is not None else False
        telemetry.record_decision(span, verdict.decision, verdict.query if keeps_text else None)

    def done(self, effect: Effect, span: Any, result: Any) -> None:
        if isinstance(effect, Assess):
            self._keep(effect.gate, result, span)
        elif isinstance(effect, AssessEach):
            for one, verdict, (gate, _) in zip(span, result, effect.items, strict=True):
                self._keep(gate, verdict, one)
        elif isinstance(effect, EstimateCall):
            telemetry.record_estimates(span, result, effect.estimator.target_model)
            telemetry.end(span)
        elif isinstance(effect, Draw):
            telemetry.record_drawn(span, result)
            telemetry.end(span)
        elif isinstance(effect, Sample):
            telemetry.record_sampling(span, result.cas)
        elif isinstance(effect, Record) and effect.cas is None:
            telemetry.record_sampling(
                self.open.get(effect.verdict.decision.id), samples_used=effect.samples_used
            )

    def _keep(self, gate: FlowGate, verdict: Verdict, span: Any) -> None:
        self._decided(span, gate, verdict)
        telemetry.end(self.open.pop(verdict.decision.id, None))
        self.open[verdict.decision.id] = span

    @staticmethod
    def failed(effect: Effect, span: Any, error: BaseException) -> None:
        for one in span if isinstance(span, list) else [span]:
            if not isinstance(error, GateBlocked):
                telemetry.fail(one, error)
            if isinstance(effect, Assess | AssessEach | EstimateCall | Draw):
                telemetry.end(one)

    def close(self) -> None:
        for span in self.open.values():
            telemetry.end(span)
        self.open.clear()


class _Driver:
    """Flattens a flow: compound effects run in place, each under its span; only leaves come out."""

    def __init__(self) -> None:
        self.spans = _Spans() if telemetry.enabled() else None

    @contextlib.contextmanager
    def _traced(self, effect: Effect) -> Iterator[Callable[[Any], None]]:
        spans = self.spans
        if spans is None:
            yield lambda _: None
            return
        span = spans.enter(effect)
        try:
            with telemetry.current(None if isinstance(span, list) else span):
                yield functools.partial(spans.done, effect, span)
        except BaseException as exc:
            spans.failed(effect, span, exc)
            raise

    def leaves(self, flow: Flow[R], *, outer: bool = True) -> Generator[Effect, Any, R]:
        """``flow`` with its compound effects expanded: yields leaf effects only, I/O-free.

        A span made current here stays current while the driver runs the leaf (the same context).
        """
        with contextlib.closing(flow):
            try:
                effect = next(flow)
                while True:
                    try:
                        with self._traced(effect) as done:
                            if isinstance(effect, Compound):
                                result = yield from self.leaves(effect.flow(), outer=False)
                            else:
                                result = yield effect
                            done(result)
                    except BaseException as exc:  # thrown into the flow, which may handle it
                        effect = flow.throw(exc)
                    else:
                        effect = flow.send(result)
            except StopIteration as finished:
                value: R = finished.value
                return value
            finally:
                if outer and self.spans is not None:  # a decision's span ends with the whole flow
                    self.spans.close()


def drive(flow: Flow[R]) -> R:
    """Run a flow, doing each effect's sync I/O; an effect's error is thrown into the flow."""
    return twins.drive(_Driver().leaves(flow), operator.methodcaller("run"))


async def adrive(flow: Flow[R]) -> R:
    """Run a flow, doing each effect's async I/O; an effect's error is thrown into the flow."""
    return await twins.adrive(_Driver().leaves(flow), operator.methodcaller("arun"))


def _alone(effect: Effect) -> Flow[Any]:
    return (yield effect)


def perform(effect: Effect) -> Any:
    """Do one effect (a compound one down to its leaves), sync, traced like a flow."""
    return drive(_alone(effect))


async def aperform(effect: Effect) -> Any:
    """Async twin of :func:`perform`."""
    return await adrive(_alone(effect))
