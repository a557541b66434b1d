"""Shadow decisions: made beside the gated call, so the estimate never delays or fails it.

In shadow mode the gate hands the integration a stand-in ``answer`` decision at once and makes the
real one in a worker thread (sync calls) or a task (async calls). The real decision keeps the
stand-in's id and is logged when both it and the call are done; an estimator that raises becomes a
degraded decision naming the error, never the call's failure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from capgate._types import Decision, Estimate
from capgate.backend import Prompt
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._effects import Decide, FlowGate
from capgate.gate._results import ShadowDecision, Verdict
from capgate.gate.flow import aperform, perform

__all__ = [
    "SHADOW_REASON",
    "WORKERS",
    "Shadows",
    "astart_shadow",
    "failed_shadow",
    "failure_reason",
    "stand_in",
    "start_shadow",
]

SHADOW_REASON = "shadow mode: the gate decides beside the call and logs what it would have done"

_ERROR_TEXT = 200  # characters of an estimator's error kept in a degraded shadow decision's reason
WORKERS = 4  # threads making shadow decisions at once, for a gate without max_concurrency


def stand_in(query: Prompt) -> Verdict:
    """The ``answer`` verdict a shadow call proceeds on; the real decision takes its id."""
    estimate = Estimate.unavailable("shadow", "estimated beside the call")
    decision = Decision(action="answer", estimate=estimate, reason=SHADOW_REASON, shadow=True)
    return Verdict(decision=decision, query=query)


def failure_reason(error: BaseException) -> str:
    """Why a shadow estimate failed, in words (the error's type and the start of its message)."""
    text = str(error)
    text = text if len(text) <= _ERROR_TEXT else text[:_ERROR_TEXT] + "..."
    return f"the estimator raised {type(error).__name__}: {text}" if text else type(error).__name__


class Shadows:
    """The shadow decisions in flight from one gate (and its views), and the threads they use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: set[concurrent.futures.Future[Any] | asyncio.Future[Any]] = set()

    def _track(self, future: concurrent.futures.Future[Any] | asyncio.Future[Any]) -> None:
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Any) -> None:
        with self._lock:
            self._pending.discard(future)

    def _threads(self, workers: int) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    workers, thread_name_prefix="capgate-shadow"
                )
            return self._pool

    def start(self, job: Callable[[], Verdict], workers: int) -> ShadowDecision:
        """Run ``job`` in a worker thread (at most ``workers`` at once; more wait their turn)."""
        decision = ShadowDecision(self._threads(workers).submit(job))  # its callbacks (the log
        self._track(decision.future)  # write) run before the future is forgotten: a flush waits
        return decision

    def beside(self, job: Callable[[], None], workers: int) -> None:
        """Run ``job`` in one of the same worker threads, beside the call (a flush waits for it).

        The work a logged decision brings along (its features, a candidate's decision) runs here:
        ``job`` must catch its own errors, since nobody waits on its result.
        """
        self._track(self._threads(workers).submit(job))

    def astart(self, job: Callable[[], Any]) -> ShadowDecision:
        """Run the coroutine ``job()`` as a task of the running event loop."""
        decision = ShadowDecision(asyncio.get_running_loop().create_task(job()))
        self._track(decision.future)
        return decision

    def track(self, future: concurrent.futures.Future[Any]) -> None:
        """Also wait for ``future`` (a log write of a shadow decision) when flushing."""
        self._track(future)

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


def failed_shadow(gate: FlowGate, query: Prompt, decision_id: str, error: Exception) -> Verdict:
    """The degraded shadow decision of an estimate that raised (the policy's ``on_degraded``)."""
    try:
        estimator: CapabilityEstimator | None = gate.resolve_estimator()
    except SettingsError:
        estimator = None
    estimate = Estimate.unavailable(estimator.method if estimator else "unknown", failure_reason(error))
    return gate.decide_on(query, [estimate], None, shadow_of=decision_id)


def start_shadow(gate: FlowGate, query: Prompt, shadows: Shadows) -> Verdict:
    """Make ``gate``'s decision on ``query`` in a worker thread; the stand-in ``answer`` at once."""
    stand = stand_in(query)
    decision_id = stand.decision.id

    def decide() -> Verdict:
        try:
            made: Verdict = perform(Decide(gate, query, decision_id))
        except Exception as exc:  # never the call's failure: a degraded decision naming it
            made = failed_shadow(gate, query, decision_id, exc)
        return made

    gate.stats.proceeded()
    pending = shadows.start(decide, gate.settings.max_concurrency or WORKERS)
    return Verdict(decision=stand.decision, query=query, pending=pending)


def astart_shadow(gate: FlowGate, query: Prompt, shadows: Shadows) -> Verdict:
    """:func:`start_shadow` for an async call: the decision is made by a task of the running loop."""
    stand = stand_in(query)
    decision_id = stand.decision.id

    async def decide() -> Verdict:
        try:
            made: Verdict = await aperform(Decide(gate, query, decision_id))
        except Exception as exc:  # never the call's failure: a degraded decision naming it
            made = failed_shadow(gate, query, decision_id, exc)
        return made

    gate.stats.proceeded()
    return Verdict(decision=stand.decision, query=query, pending=shadows.astart(decide))
