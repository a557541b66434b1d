"""Shadow decisions: made beside the gated call, so the estimate never delays or fails it.

The gate hands the integration a stand-in ``answer`` decision at once and makes the real one (with
the stand-in's id) in a worker thread, logged once it and the call are done; an estimator that
raises becomes a degraded decision naming the error, never the call's failure.

An async call's decision is made in the same threads, off the caller's loop, through the
estimator's sync path bounded by ``max_concurrency`` and ``estimate_timeout_s`` (a late estimate
is degraded at once but keeps its thread and slot until the estimator returns). That needs a sync
path that works from any thread
(:attr:`~capgate.estimators.CapabilityEstimator.thread_safe_estimate`). An estimator with only a
native async path is awaited by a task of the caller's loop instead (its client, a user's
``AsyncOpenAI``, may be bound to that loop): ``await gate.aflush()`` before the loop ends, or the
decisions still being made are logged degraded (:data:`LOOP_CLOSED`), as ``asyncio.run`` cancels
the tasks it leaves.

The worker threads are not daemons and finish their queue at interpreter exit (a decision made
then is logged from its own thread), so a script that ends without :meth:`~capgate.Gate.flush`
loses none.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from capgate.core.backend import Prompt
from capgate.core.types import Decision, Estimate
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._defaults import default_estimator
from capgate.gate._effects import Decide, Flow, FlowGate
from capgate.gate._limits import failure_reason, log_key, log_writer
from capgate.gate._results import ShadowDecision, Verdict
from capgate.gate._workers import Lane, submit_or_run
from capgate.gate.flow import adrive, drive

if TYPE_CHECKING:
    from capgate.gate._settings import GateSettings
    from capgate.gate._stats import GateStats, Work

_logger = logging.getLogger("capgate")

SHADOW_REASON = "shadow mode: the gate decides beside the call and logs what it would have done"

LOOP_CLOSED = "the event loop closed before the shadow decision was made (await gate.aflush() before it ends)"
"""The reason logged for a shadow decision made on the caller's loop that the loop's end cancelled."""

WORKERS = 4  # threads making shadow decisions at once, for a gate without max_concurrency


def stand_in(query: Prompt) -> Verdict:
    """The ``answer`` verdict a shadow call proceeds on; the real decision takes its id."""
    estimate = Estimate.unavailable("shadow", "estimated beside the call")
    decision = Decision(action="answer", estimate=estimate, reason=SHADOW_REASON, shadow=True)
    return Verdict(decision=decision, query=query)


class Shadows:
    """The shadow decisions in flight from one gate (and its views), and the threads they use."""

    def __init__(self, workers: int) -> None:
        self._lock = threading.Lock()
        self._lane = Lane(workers)  # its places in the process's started threads
        self._pending: set[concurrent.futures.Future[Any] | asyncio.Future[Any]] = set()

    @classmethod
    def for_gate(cls, settings: GateSettings) -> Shadows:
        """A gate's shadows, with its worker threads (``max_concurrency``, or :data:`WORKERS`) and
        its log's writer thread started now, so no call starts a thread."""
        shadows = cls(settings.max_concurrency or WORKERS)
        if settings.log is not None:
            log_writer(log_key(settings.log))
        return shadows

    def _track(self, future: concurrent.futures.Future[Any] | asyncio.Future[Any]) -> None:
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Any) -> None:
        with self._lock:
            self._pending.discard(future)

    def start(self, job: Callable[[], Verdict]) -> ShadowDecision:
        """Run ``job`` in a worker thread (at most the gate's workers at once; more wait their turn)."""
        decision = ShadowDecision(self._lane.submit(job))
        self._track(decision.future)  # its callbacks (the log write) run first: a flush waits for them
        return decision

    def beside(
        self, stats: GateStats, work: Work, job: Callable[[], bool], described: Callable[[Exception], str]
    ) -> None:
        """Run ``job`` (a logged decision's features, a candidate's decision) in one of the same
        threads, beside the call (a flush waits for it). It is counted in ``stats`` as ``work``
        when it returns True; an error is counted and warned (``described(error)``), never raised."""

        def counted() -> None:
            try:
                if not job():
                    return
            except Exception as exc:
                why = described(exc)
                stats.beside(work, failed=why)
                _logger.warning("%s (not logged; the call was not affected)", why)
                return
            stats.beside(work)

        self._track(self._lane.submit(counted))

    def write(self, job: Callable[[], None], spill: Callable[[], None], log: object) -> None:
        """Run the log write ``job`` of a shadow decision in the thread of its log (the gate's
        ``log`` setting; a flush waits for it); ``spill()`` here instead when its queue is full."""
        writer = log_writer(log_key(log))
        if writer.full:
            spill()
            return
        self._track(submit_or_run(writer, job))

    def astart(self, job: Callable[[], Any], unmade: Callable[[], Verdict]) -> ShadowDecision:
        """Run the coroutine ``job()`` as a task of the running event loop; ``unmade()``: the
        verdict logged instead when the loop closes before the task is done."""
        decision = ShadowDecision(asyncio.get_running_loop().create_task(job()), unmade)
        self._track(decision.future)
        return decision

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the shadow decisions made in threads (and their log writes); ``False`` on time-out."""
        while True:
            with self._lock:
                threads = [f for f in self._pending if isinstance(f, concurrent.futures.Future)]
            if not threads:
                return True
            _, waiting = concurrent.futures.wait(threads, timeout=timeout)
            if waiting:
                return False

    async def await_all(self) -> None:
        """Wait for every shadow decision and log write (tasks of this loop and threads alike)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            waits = [
                f if isinstance(f, asyncio.Future) else asyncio.wrap_future(f, loop=loop) for f in pending
            ]
            await asyncio.wait(waits)
            await asyncio.sleep(0)  # let the done callbacks (which track the log writes) run


def off_loop(gate: FlowGate) -> bool:
    """Whether ``gate``'s async shadow decisions run in worker threads: every estimator they may
    call (its own or the default, and its routes') has ``thread_safe_estimate`` (or there is none)."""
    settings = gate.settings
    own = settings.estimator if settings.estimator is not None else default_estimator()
    estimators = [own, *(settings.routes or {}).values()]
    return all(e is None or getattr(e, "thread_safe_estimate", False) for e in estimators)


def failed_shadow(gate: FlowGate, query: Prompt, decision_id: str, error: Exception | str) -> Verdict:
    """The degraded shadow decision (the policy's ``on_degraded``) when the decision itself failed
    (a misconfigured gate); ``error``: what failed, or the reason in words."""
    try:
        estimator: CapabilityEstimator | None = gate.resolve_estimator()
    except SettingsError:
        estimator = None
    reason = error if isinstance(error, str) else failure_reason(error, by="the shadow decision")
    _logger.warning("%s; the shadow decision is degraded", reason)  # as a failed estimate's is
    estimate = Estimate.unavailable(estimator.method if estimator else "unknown", reason)
    return gate.decide_on(query, [estimate], None, shadow_of=decision_id)


def decided(gate: FlowGate, query: Prompt, decision_id: str) -> Flow[Verdict]:
    """``gate``'s enforce-mode decision on ``query``, with the id ``decision_id``; one that fails
    (a misconfigured gate) is degraded, naming the error, never the call's failure."""
    try:
        made: Verdict = yield Decide(gate, query, decision_id)
    except Exception as exc:  # never the call's failure: a degraded decision naming it
        made = failed_shadow(gate, query, decision_id, exc)
    return made


def start_shadow(gate: FlowGate, query: Prompt, shadows: Shadows) -> Verdict:
    """Make ``gate``'s decision on ``query`` in a worker thread; the stand-in ``answer`` at once."""
    stand = stand_in(query)
    gate.stats.proceeded()
    context = contextvars.copy_context()  # its span nests under the caller's, as a task's does
    pending = shadows.start(lambda: context.run(drive, decided(gate, query, stand.decision.id)))
    return Verdict(decision=stand.decision, query=query, pending=pending)


def astart_shadow(gate: FlowGate, query: Prompt, shadows: Shadows) -> Verdict:
    """:func:`start_shadow` for an async call: in a worker thread, off the running loop, when
    :func:`off_loop`; else (an estimator with only a native async path) by a task of that loop."""
    if off_loop(gate):
        return start_shadow(gate, query, shadows)
    stand = stand_in(query)
    decision_id = stand.decision.id
    gate.stats.proceeded()
    pending = shadows.astart(
        lambda: adrive(decided(gate, query, decision_id)),
        lambda: failed_shadow(gate, query, decision_id, LOOP_CLOSED),
    )
    return Verdict(decision=stand.decision, query=query, pending=pending)
