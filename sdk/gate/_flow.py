"""I/O-free flows: each integration's logic written once, run by a sync or an async driver.

A *flow* is a generator that yields :class:`Effect` s (estimate a query, log a decision, call the
user's function, resample it) and receives each one's result back, then returns its own result.
:func:`drive` runs a flow with the sync I/O of each effect and :func:`adrive` with the async I/O,
so a flow's decisions (which action leads where, what is logged, when to block) exist once and
the sync and async paths of an integration cannot drift apart. Both run on the drivers of
:mod:`capgate._twins`, like every other plan in capgate; an effect that fails is thrown back
into the flow.

The drivers also trace (:mod:`capgate.telemetry`, a no-op without OpenTelemetry): each decision
an :class:`Assess` makes opens a ``capgate.gate`` span that stays open until the flow ends, so its
:class:`Sample` rounds nest under it and its :class:`Record` adds what was drawn; the user's own
calls (:class:`Invoke`) run under the caller's span.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from capgate import _twins as twins
from capgate import telemetry
from capgate.cas.loop import CASResult
from capgate.gate._results import Sampled, Verdict
from capgate.messages import as_query

if TYPE_CHECKING:
    from capgate.gate._gate import Gate

__all__ = ["Assess", "AssessEach", "Effect", "Flow", "Invoke", "Record", "Sample", "adrive", "drive"]

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


@dataclass(frozen=True)
class Assess(Effect):
    """Estimate a query and decide: a :class:`~capgate.gate.Verdict`."""

    gate: Gate
    query: object

    def run(self) -> Verdict:
        return self.gate.assess(self.query)

    async def arun(self) -> Verdict:
        return await self.gate.aassess(self.query)


@dataclass(frozen=True)
class AssessEach(Effect):
    """Several assessments, each by its own gate (view): a list of verdicts, in order.

    The queries that share an estimator are estimated in one batched call (one batched forward
    pass for a probe), then each gate decides on its own query's estimate.
    """

    items: Sequence[tuple[Gate, object]]

    def run(self) -> list[Verdict]:
        def estimate(ask: tuple[Any, Any, list[Any]]) -> Any:
            with telemetry.estimate_span(ask[1].target_model) as span:
                estimates = ask[0].estimate_with(ask[1], ask[2])
                span.record(estimates)
                return estimates

        return twins.drive(self._plan(), estimate)

    async def arun(self) -> list[Verdict]:
        async def estimate(ask: tuple[Any, Any, list[Any]]) -> Any:
            with telemetry.estimate_span(ask[1].target_model) as span:
                estimates = await ask[0].aestimate_with(ask[1], ask[2])
                span.record(estimates)
                return estimates

        return await twins.adrive(self._plan(), estimate)

    def _plan(self) -> twins.Plan[list[Verdict]]:
        asked = [(gate, as_query(query), gate.resolve_estimator()) for gate, query in self.items]
        groups: dict[int, list[int]] = {}
        for index, (_, _, estimator) in enumerate(asked):
            groups.setdefault(id(estimator), []).append(index)
        verdicts: dict[int, Verdict] = {}
        for indices in groups.values():
            estimator = asked[indices[0]][2]
            # The first asking gate's limits (max_concurrency, estimate_timeout_s) bound the call.
            estimates = yield asked[indices[0]][0], estimator, [asked[i][1] for i in indices]
            if not isinstance(estimates, list) or len(estimates) != len(indices):
                raise TypeError(
                    f"{type(estimator).__name__}.estimate(queries) must return one Estimate per query; "
                    f"got {estimates!r} for {len(indices)} queries"
                )
            for i, estimate in zip(indices, estimates, strict=True):
                gate, query, _ = asked[i]
                verdicts[i] = gate._verdict(query, [estimate], estimator)
        return [verdicts[i] for i in range(len(asked))]


@dataclass(frozen=True)
class Record(Effect):
    """Write a decision to the gate's log."""

    gate: Gate
    verdict: Verdict
    samples_used: int | None = None
    cas: CASResult | None = None

    def run(self) -> None:
        self.gate.record(self.verdict, samples_used=self.samples_used, cas=self.cas)

    async def arun(self) -> None:
        await self.gate.arecord(self.verdict, samples_used=self.samples_used, cas=self.cas)


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
class Sample(Effect):
    """Carry out a resample verdict: draw with ``draw`` under CAS (:meth:`Gate.sample`)."""

    gate: Gate
    verdict: Verdict
    draw: Invoke
    to_text: Callable[[Any], str] | None = None

    def run(self) -> Sampled[Any]:
        return self.gate.sample(lambda _: self.draw.run(), self.verdict, to_text=self.to_text)

    async def arun(self) -> Sampled[Any]:
        async def draw(_: object) -> Any:
            return await self.draw.arun()

        return await self.gate.asample(draw, self.verdict, to_text=self.to_text)


class _Spans:
    """The ``capgate.gate`` spans of one flow run, by decision id, ended when the flow ends."""

    def __init__(self) -> None:
        self.open: dict[str, Any] = {}

    def enter(self, effect: Effect) -> Any:
        """The span to make current while ``effect`` runs (``None``: the caller's)."""
        if isinstance(effect, Assess):
            return telemetry.start(telemetry.SPAN_GATE)
        if isinstance(effect, AssessEach):
            return [telemetry.start(telemetry.SPAN_GATE) for _ in effect.items]
        if isinstance(effect, Sample):
            decision = effect.verdict.decision
            if decision.id not in self.open:  # decided earlier (read from state): a span of its own
                span = telemetry.start(telemetry.SPAN_GATE)
                telemetry.record_verdict(span, effect.gate, effect.verdict)
                self.open[decision.id] = span
            return self.open[decision.id]
        return None

    def current(self, effect: Effect, span: Any) -> Any:
        one = None if isinstance(span, list) else span
        return telemetry.current(one, decision=isinstance(effect, Assess))

    def done(self, effect: Effect, span: Any, result: Any) -> None:
        if isinstance(effect, Assess):
            telemetry.record_verdict(span, effect.gate, result)
            self._keep(result, span)
        elif isinstance(effect, AssessEach):
            for one, verdict, (gate, _) in zip(span, result, effect.items, strict=True):
                telemetry.record_verdict(one, gate, verdict)
                self._keep(verdict, one)
        elif isinstance(effect, Sample):
            telemetry.record_sampling(span, result.cas)
        elif isinstance(effect, Record) and effect.cas is None:
            span = self.open.get(effect.verdict.decision.id)
            telemetry.record_sampling(span, samples_used=effect.samples_used)

    def _keep(self, verdict: Verdict, span: Any) -> None:
        previous = self.open.pop(verdict.decision.id, None)
        telemetry.end(previous)
        self.open[verdict.decision.id] = span

    def failed(self, effect: Effect, span: Any, error: BaseException) -> None:
        for one in span if isinstance(span, list) else [span]:
            telemetry.fail(one, error)
            if isinstance(effect, Assess | AssessEach):
                telemetry.end(one)

    def close(self) -> None:
        for span in self.open.values():
            telemetry.end(span)
        self.open.clear()

    def run(self, effect: Effect) -> Any:
        span = self.enter(effect)
        try:
            with self.current(effect, span):
                result = effect.run()
        except BaseException as exc:
            self.failed(effect, span, exc)
            raise
        self.done(effect, span, result)
        return result

    async def arun(self, effect: Effect) -> Any:
        span = self.enter(effect)
        try:
            with self.current(effect, span):
                result = await effect.arun()
        except BaseException as exc:
            self.failed(effect, span, exc)
            raise
        self.done(effect, span, result)
        return result


def drive(flow: Flow[R]) -> R:
    """Run a flow, doing each effect's sync I/O (:func:`capgate._twins.drive`)."""
    if not telemetry.enabled():
        return twins.drive(flow, lambda effect: effect.run())
    spans = _Spans()
    try:
        return twins.drive(flow, spans.run)
    finally:
        spans.close()


async def adrive(flow: Flow[R]) -> R:
    """Run a flow, doing each effect's async I/O (:func:`capgate._twins.adrive`)."""
    if not telemetry.enabled():
        return await twins.adrive(flow, lambda effect: effect.arun())
    spans = _Spans()
    try:
        return await twins.adrive(flow, spans.arun)
    finally:
        spans.close()
