"""The integration API: a gated call as an I/O-free flow of effects, run by a sync or an async driver.

A *flow* is a generator that yields :class:`Effect` s, receives each one's result back, and
returns its own. An integration (:func:`~capgate.guard`, the LangGraph nodes, the LangChain
middleware) writes its logic once as a flow; :func:`drive` runs it with sync I/O and :func:`adrive`
with async I/O, so the two paths cannot drift apart. A failed effect is thrown back into the flow.

Effects an integration yields:

* :class:`Assess`: estimate a query's capability under the gate's limits and decide (a
  :class:`~capgate.gate.Verdict`); :class:`AssessEach` does several at once, one batched estimate
  per estimator; :class:`Route` chooses a model choice by predicted capability.
* :class:`Sample`: carry out a ``resample`` verdict under CAS, each sample one call of the user's
  code; :class:`Record`: write a decision to the gate's log; :class:`Invoke`: run the user's code.

:class:`Assess`, :class:`AssessEach`, :class:`Route` and :class:`Sample` are flows of the gate
(:class:`Compound` effects) that the driver runs down to their leaves, :class:`EstimateCall` (one
estimator call) and :class:`Draw` (one resample round). The gate's flows fail closed around
:class:`EstimateCall` (degraded estimates naming the error); an integration that yields it itself
gets the raw error thrown back, so prefer ``yield from gate.estimates_flow(...)``.

The driver also traces (:mod:`capgate.gate.telemetry`, a no-op without OpenTelemetry): each decision
is a ``capgate.gate`` span open until the flow ends, its estimator calls and resample rounds nest
under it, and the user's own calls run under the caller's span.

Examples:
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

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import operator
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from capgate._util import drive as twins
from capgate.core.types import Speculation
from capgate.gate import telemetry
from capgate.gate._effects import (
    Assess,
    AssessEach,
    Compound,
    Decide,
    Draw,
    Effect,
    EstimateCall,
    Flow,
    FlowGate,
    Invoke,
    Record,
    Route,
    Sample,
    Shadow,
)
from capgate.gate._limits import failure_reason
from capgate.gate._results import GateBlocked, Verdict
from capgate.gate._workers import WORKERS

__all__ = [
    "Assess",
    "AssessEach",
    "Compound",
    "Decide",
    "Draw",
    "Effect",
    "EstimateCall",
    "Flow",
    "FlowGate",
    "Invoke",
    "Record",
    "Route",
    "Sample",
    "Shadow",
    "Speculate",
    "adrive",
    "aperform",
    "drive",
    "failure_reason",
    "perform",
]
R = TypeVar("R")


class _Spans:
    """The spans of one drive: each decision's ``capgate.gate`` span stays open until it ends."""

    def __init__(self) -> None:
        self.open: dict[str, Any] = {}

    def enter(self, effect: Effect) -> Any:
        """The span(s) ``effect`` opens (``None``: it runs under the current one)."""
        if isinstance(effect, Assess):  # a shadow decision's span is its Decide's, beside the call
            return None if effect.gate.in_shadow() else telemetry.start(telemetry.SPAN_GATE)
        if isinstance(effect, Decide):
            return telemetry.start(telemetry.SPAN_GATE)
        if isinstance(effect, AssessEach):
            return [None if g.in_shadow() else telemetry.start(telemetry.SPAN_GATE) for g, _ in effect.items]
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
        if isinstance(effect, Assess | Decide):
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
            if isinstance(effect, Assess | Decide | AssessEach | EstimateCall | Draw):
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
        """``flow`` with its compound effects expanded: yields leaf effects only, I/O-free (a span
        made current here stays current while the driver runs the leaf)."""
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


@dataclass(frozen=True)
class Speculate(Effect):
    """Start the gated call together with its assessment (``speculative``): the verdict (recording
    the :class:`~capgate.Speculation`) and, on ``answer``, the finished call as an :class:`Invoke`
    that returns its value or raises its error (so the flow records the decision first), else
    ``None`` (the value is discarded; an async call is cancelled)."""

    assess: Assess
    call: Invoke

    def run(self) -> tuple[Verdict, Invoke | None]:
        done: concurrent.futures.Future[tuple[Any, BaseException | None, float]] = concurrent.futures.Future()
        context = contextvars.copy_context()

        def call() -> None:
            started = time.monotonic()
            try:
                value, error = context.run(self.call.run), None
            except BaseException as exc:  # handed to the caller on answer, dropped on a block
                value, error = None, exc
            done.set_result((value, error, time.monotonic() - started))  # its time known when done

        WORKERS.start_now(call, "capgate-speculative")  # a started thread: the call waits for none
        verdict: Verdict = perform(self.assess)
        if verdict.action == "answer":
            value, error, call_s = done.result()
            return _speculated(verdict, Speculation(discarded=False, call_s=call_s)), _finished(value, error)
        ended = done.result()[2] if done.done() else None
        return _speculated(verdict, Speculation(discarded=True, call_s=ended)), None

    async def arun(self) -> tuple[Verdict, Invoke | None]:
        started = time.monotonic()
        task = asyncio.ensure_future(self.call.arun())
        ended: list[float] = []
        task.add_done_callback(lambda _: ended.append(time.monotonic()))
        try:
            verdict: Verdict = await aperform(self.assess)
        except BaseException:
            task.cancel()
            raise
        if verdict.action == "answer":
            value, error = None, None
            try:
                value = await task
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # raised by the flow once the decision is recorded
                error = exc
            call_s = (ended[0] if ended else time.monotonic()) - started
            return _speculated(verdict, Speculation(discarded=False, call_s=call_s)), _finished(value, error)
        cancelled = not task.done()
        task.cancel()
        if not cancelled and not task.cancelled():
            task.exception()  # retrieved, so a discarded call's error is not reported as unhandled
        call_s = (ended[0] if ended else time.monotonic()) - started
        return _speculated(verdict, Speculation(discarded=True, cancelled=cancelled, call_s=call_s)), None


def _finished(value: Any, error: BaseException | None) -> Invoke:
    """A call already made, as an effect: its value, or its error raised (by the driver, like a call's)."""

    def outcome() -> Any:
        if error is not None:
            raise error
        return value

    async def aoutcome() -> Any:
        return outcome()

    return Invoke(outcome, aoutcome)


def _speculated(verdict: Verdict, speculation: Speculation) -> Verdict:
    decision = verdict.decision.model_copy(update={"speculation": speculation})
    return Verdict(decision=decision, query=verdict.query, pending=verdict.pending)


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
