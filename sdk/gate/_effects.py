"""The effects a flow yields: the vocabulary of :mod:`capgate.gate.flow` (see there)."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from capgate._util import drive as twins
from capgate.cas.drawn import DrawnValues
from capgate.cas.loop import CASResult, sampling_plan
from capgate.cas.settings import stop_rule
from capgate.core.backend import Generation, Prompt
from capgate.core.messages import as_query
from capgate.core.types import Estimate, Extractor, RoutePlan
from capgate.errors import NotFittedError, ProbeMismatchError, SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._limits import (
    Limits,
    fail_closed,
    limited_aestimate,
    limited_estimate,
    log_key,
    log_writer,
)
from capgate.gate._results import Sampled, Verdict
from capgate.gate._settings import GateSettings
from capgate.gate._stats import GateStats

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog

R = TypeVar("R")
_logger = logging.getLogger("capgate")
MISCONFIGURED = (SettingsError, ProbeMismatchError, NotFittedError)
"""Errors of a misconfigured gate or estimator: raised at once, never a degraded decision."""


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
Estimates: TypeAlias = list[Estimate]


class Compound(Effect):
    """An effect that is itself a flow of effects; a driver runs its :meth:`flow` with itself."""

    @abstractmethod
    def flow(self) -> Flow[Any]:
        """The effects it is made of."""

    def run(self) -> Any:
        raise TypeError(f"{type(self).__name__} is run by a flow driver: capgate.gate.flow.perform(effect)")

    async def arun(self) -> Any:
        raise TypeError(f"{type(self).__name__} is run by a flow driver: capgate.gate.flow.aperform(effect)")


class FlowGate(Protocol):
    """What the gate's effects ask of a gate (:class:`~capgate.Gate` is the implementation)."""

    @property
    def settings(self) -> GateSettings: ...

    @property
    def log(self) -> DecisionLog | None: ...

    @property
    def stats(self) -> GateStats: ...

    def assess_flow(self, query: object, *, where: str | None = None) -> Flow[Verdict]: ...

    def decide_flow(self, query: Prompt, *, shadow_of: str | None = None) -> Flow[Verdict]: ...

    def shadow(self, query: Prompt) -> Verdict: ...

    def spill_queued(self, verdict: Verdict, samples_used: int | None, cas: CASResult | None) -> None: ...

    async def ashadow(self, query: Prompt) -> Verdict: ...

    def in_shadow(self) -> bool: ...

    def route_flow(self, query: Prompt, plan: RoutePlan) -> Flow[tuple[str, RoutePlan, str]]: ...

    @property
    def extract(self) -> Extractor: ...

    def resolve_estimator(self) -> CapabilityEstimator: ...

    def estimates_flow(self, estimator: CapabilityEstimator, queries: list[Prompt]) -> Flow[Estimates]: ...

    def decide_on(
        self,
        query: Prompt,
        estimates: object,
        estimator: CapabilityEstimator | None,
        *,
        shadow_of: str | None = None,
    ) -> Verdict: ...

    def record(
        self, verdict: Verdict, *, samples_used: int | None = None, cas: CASResult | None = None
    ) -> None: ...


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


def estimates_of(estimator: CapabilityEstimator, queries: list[Prompt], limits: Limits) -> Flow[Estimates]:
    """One estimate per query from one :class:`EstimateCall`, failing closed (:func:`fail_closed`;
    the traceback at debug level). A misconfiguration (:data:`MISCONFIGURED`: a bad setting, a
    probe that does not fit its reader or was never fitted) is raised: it is not a missing estimate."""
    try:
        outcome: object = yield EstimateCall(estimator, queries, limits)
    except MISCONFIGURED:
        raise
    except Exception as exc:
        _logger.debug("%s raised", type(estimator).__name__, exc_info=exc)
        outcome = exc
    return fail_closed(estimator, queries, outcome)


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
        if self.verdict.pending is not None:
            # A shadow decision: recording it only arranges its write (no I/O), so no hop to the
            # log's thread, whose queue held 256 shadow calls at once ~0.2-0.5 s.
            self.run()
        elif self.gate.settings.log is not None:
            writer = log_writer(log_key(self.gate.settings.log))
            if writer.full:  # a stuck log: the decision waits on local disk, not in memory
                self.gate.spill_queued(self.verdict, self.samples_used, self.cas)
            else:
                await asyncio.get_running_loop().run_in_executor(writer, self.run)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass(frozen=True)
class Invoke(Effect):
    """Call the user's code: ``call()`` on the sync path, ``acall()`` (awaited) on the async one;
    without ``acall``, the async path awaits what ``call()`` returns when it is awaitable."""

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


@dataclass(frozen=True)
class Shadow(Effect):
    """Start a shadow decision beside the call: the stand-in ``answer`` verdict, at once
    (:attr:`~capgate.gate.Verdict.pending` is the decision being made, logged by :class:`Record`)."""

    gate: FlowGate
    query: Prompt

    def run(self) -> Verdict:
        return self.gate.shadow(self.query)

    async def arun(self) -> Verdict:
        return await self.gate.ashadow(self.query)


@dataclass(frozen=True)
class Assess(Compound):
    """Estimate a query and decide (:meth:`capgate.Gate.assess`): a :class:`~capgate.gate.Verdict`;
    ``where`` names where the query came from, for the error of a query that is not one."""

    gate: FlowGate
    query: object
    where: str | None = None

    def flow(self) -> Flow[Verdict]:
        return self.gate.assess_flow(self.query, where=self.where)


@dataclass(frozen=True)
class Decide(Compound):
    """Estimate and decide in enforce mode, whatever the gate's mode (a shadow decision is made
    this way beside its call, with the stand-in's id ``shadow_of``)."""

    gate: FlowGate
    query: Prompt
    shadow_of: str | None = None

    def flow(self) -> Flow[Verdict]:
        return self.gate.decide_flow(self.query, shadow_of=self.shadow_of)


@dataclass(frozen=True)
class AssessEach(Compound):
    """Several assessments, each by its own gate (view): a list of verdicts, in order. Queries that
    share an estimator are estimated in one call, within the first asking gate's limits."""

    items: Sequence[tuple[FlowGate, object]]

    def flow(self) -> Flow[list[Verdict]]:
        verdicts: dict[int, Verdict] = {}
        asked = []
        for index, (gate, query) in enumerate(self.items):
            if gate.in_shadow():  # decided beside the call, one by one
                verdicts[index] = yield Shadow(gate, as_query(query))
            else:
                asked.append((index, gate, as_query(query), gate.resolve_estimator()))
        groups: dict[int, list[int]] = {}
        for position, (_, _, _, estimator) in enumerate(asked):
            groups.setdefault(id(estimator), []).append(position)
        for positions in groups.values():
            _, gate, _, estimator = asked[positions[0]]
            estimates = yield from gate.estimates_flow(estimator, [asked[i][2] for i in positions])
            for i, estimate in zip(positions, estimates, strict=True):
                index, gate, query, _ = asked[i]
                verdicts[index] = gate.decide_on(query, [estimate], estimator)
        return [verdicts[i] for i in range(len(self.items))]


@dataclass(frozen=True)
class Route(Compound):
    """Choose a model for a query by the gate's ``routes``: the chosen name, the plan with each
    estimated choice's p, and the reason (:func:`capgate.policies.choose_route`)."""

    gate: FlowGate
    query: object
    plan: RoutePlan

    def flow(self) -> Flow[tuple[str, RoutePlan, str]]:
        return self.gate.route_flow(as_query(self.query), self.plan)


def decision_seed(decision_id: str) -> int:
    """The seed of a decision's stochastic stop rules, fixed by its id (a replay stops alike)."""
    return int.from_bytes(hashlib.sha256(decision_id.encode("utf-8")).digest()[:8], "big")


@dataclass(frozen=True)
class Sample(Compound):
    """Carry out a resample verdict under CAS (:func:`capgate.cas.loop.sampling_plan`), each round
    a :class:`Draw` of ``draw`` (:meth:`capgate.Gate.sample`): the winning value and the run.

    Raises:
        ValueError: The verdict is not a resample.
    """

    gate: FlowGate
    verdict: Verdict
    draw: Invoke
    to_text: Callable[[Any], str] | None = None
    count_tokens: Callable[[Any], int] | None = None
    concurrent: bool = True

    def flow(self) -> Flow[Sampled[Any]]:
        verdict = self.verdict
        plan = verdict.decision.plan
        if plan is None:
            raise ValueError(f"only a resample decision can be sampled; this one is {verdict.action!r}")
        drawn: DrawnValues[Any] = DrawnValues(to_text=self.to_text, count_tokens=self.count_tokens)
        rounds = itertools.count()
        loop = sampling_plan(
            verdict.query,
            extract=self.gate.extract,
            stop=stop_rule(plan.stop),
            batch_size=plan.batch_size,
            max_samples=plan.max_samples,
            seed=decision_seed(verdict.decision.id),
        )
        target = verdict.decision.target
        cas: CASResult = yield from twins.relay(
            loop,
            lambda ask: Draw(self.draw, ask[1].n, drawn, self.concurrent, next(rounds), target),
            lambda generations: [generations],
        )
        self.gate.stats.sampled(cas)
        return Sampled(value=drawn.winner(cas), cas=cas)
