"""The gate's bounds on its estimator calls: how many run at once, and how long one may take.

``max_concurrency`` caps the estimate calls in flight from one gate (and its views): a burst
queues for a slot. ``estimate_timeout_s`` is a deadline on one call's estimate, the wait for a
slot included: a late estimate becomes a degraded :class:`~capgate.Estimate` naming the deadline
(the policy's ``on_degraded``). Either way the gate fails closed (:func:`fail_closed`): an
estimator that raises or returns garbage gives degraded estimates, never the call's failure.

A late sync estimate keeps running in its worker thread, and keeps its slot, until the estimator
returns (a thread cannot be cancelled), so the cap bounds the work really in flight; the
interpreter waits for it at exit rather than kill it mid-forward-pass. So does an async one whose
``aestimate`` is the default (``estimate`` in a worker thread); a native async one is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from capgate.core.backend import Prompt
from capgate.core.types import Estimate
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._workers import WORKERS

_logger = logging.getLogger("capgate")
T = TypeVar("T")
_ERROR_TEXT = 200  # characters of an error (or of a wrong return value) kept in a degraded reason

RETRY_LOG_AFTER_S = 1.0
"""After a log failed a write, how long the gates spill its decisions without trying it (during an
outage every write would otherwise wait out the log's time limit, one after another)."""

MAX_PENDING_WRITES = 10_000
"""Most writes one log's writer thread holds queued; beyond it, decisions go to the log's spill
file (:mod:`capgate.decision.store.spill`) and the memory a stuck log takes stays bounded."""


class LogWriter(ThreadPoolExecutor):
    """One log's writer thread and its queue, with the count of writes waiting in it."""

    def __init__(self, max_pending: int = MAX_PENDING_WRITES) -> None:
        super().__init__(max_workers=1, thread_name_prefix="capgate-log")
        self.max_pending = max_pending
        self.pending = 0
        """Writes submitted and not yet done."""
        self._count = threading.Lock()
        self._replaying = False
        self._failed_at = -float("inf")
        self._failure = ""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)`` for the writer thread (counted in :attr:`pending`)."""
        with self._count:
            self.pending += 1

        def counted() -> T:
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count:
                    self.pending -= 1

        try:
            return super().submit(counted)
        except BaseException:
            with self._count:
                self.pending -= 1
            raise

    @property
    def full(self) -> bool:
        """Whether :attr:`max_pending` writes already wait (the gate spills instead of queueing)."""
        return self.pending >= self.max_pending

    def failed(self, error: BaseException) -> None:
        """Note that the log failed a write now (see :meth:`resting`)."""
        with self._count:
            self._failed_at, self._failure = time.monotonic(), str(error)

    def resting(self) -> str | None:
        """The log's last failure, if it was less than :data:`RETRY_LOG_AFTER_S` ago (then
        decisions go straight to its spill file); ``None``: try the log."""
        with self._count:
            if time.monotonic() - self._failed_at < RETRY_LOG_AFTER_S:
                return self._failure
            return None

    def claim_replay(self) -> bool:
        """Take the one place for a spill replay (``False``: one is queued or running)."""
        with self._count:
            if self._replaying:
                return False
            self._replaying = True
            return True

    def replay_done(self) -> None:
        """Free the place :meth:`claim_replay` took."""
        with self._count:
            self._replaying = False


_LOG_WRITERS: dict[str, LogWriter] = {}
_LOG_WRITERS_LOCK = threading.Lock()


def log_key(log: object) -> str:
    """Which log a gate's ``log`` setting names (a :class:`~capgate.decision.DecisionLog`'s
    location, or the path or URL given), for :func:`log_writer`."""
    location = getattr(log, "location", None)
    return str(location if location is not None else log)


def log_writer(key: str) -> LogWriter:
    """The thread the async path and shadow decisions write to the log ``key`` from: one per log
    (a slow log delays only its own gates), started when a gate naming it is made; beyond
    :data:`MAX_PENDING_WRITES` queued, decisions go to the spill file. Not the event loop's
    default executor, which late estimates may still fill."""
    with _LOG_WRITERS_LOCK:
        writer = _LOG_WRITERS.get(key)
        if writer is None:
            writer = LogWriter()
            writer.submit(lambda: None)  # start its thread now
            _LOG_WRITERS[key] = writer
        return writer


@dataclass
class Slots:
    """The slots one gate (with its views) shares, per ``max_concurrency`` value and event loop."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sync: dict[int, threading.BoundedSemaphore] = field(default_factory=dict)
    loops: dict[tuple[int, int], tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = field(
        default_factory=dict
    )

    def threading_slots(self, size: int) -> threading.BoundedSemaphore:
        """The thread semaphore of ``size`` slots."""
        with self.lock:
            return self.sync.setdefault(size, threading.BoundedSemaphore(size))

    def asyncio_slots(self, size: int) -> asyncio.Semaphore:
        """The running event loop's semaphore of ``size`` slots."""
        loop = asyncio.get_running_loop()
        key = (size, id(loop))
        with self.lock:
            found = self.loops.get(key)
            if found is None or found[0] is not loop:
                found = (loop, asyncio.Semaphore(size))
                self.loops[key] = found
            return found[1]


@dataclass(frozen=True)
class Limits:
    """A gate's bounds on one estimate: its shared slots, ``max_concurrency`` and deadline."""

    slots: Slots
    max_concurrency: int | None = None
    timeout_s: float | None = None


def _timed_out(
    estimator: CapabilityEstimator, queries: Sequence[Prompt], timeout_s: float, queued: bool
) -> list[Estimate]:
    what = "no free estimator slot (max_concurrency)" if queued else "the estimate did not return"
    reason = f"{what} within the gate's estimate_timeout_s={timeout_s:g}s"
    return [Estimate.unavailable(estimator.method, reason, timeout_s=timeout_s) for _ in queries]


def failure_reason(error: BaseException, *, by: str = "the estimator") -> str:
    """Why an estimate failed, in words: who raised what (the error's type and the start of its message)."""
    text = _clipped(str(error))
    return f"{by} raised {type(error).__name__}" + (f": {text}" if text else "")


def _clipped(text: str) -> str:
    return text if len(text) <= _ERROR_TEXT else text[:_ERROR_TEXT] + "..."


def fail_closed(estimator: CapabilityEstimator, queries: Sequence[Prompt], outcome: object) -> list[Estimate]:
    """One estimate per query from an estimator call's ``outcome`` (its return value or error): its
    own if one :class:`~capgate.Estimate` per query, else degraded ones naming what went wrong
    (one warning on the ``capgate`` logger)."""
    if isinstance(outcome, list) and len(outcome) == len(queries):
        estimates = [e for e in outcome if isinstance(e, Estimate)]
        if len(estimates) == len(queries):
            return estimates
    if isinstance(outcome, BaseException):
        reason = failure_reason(outcome)
    else:
        reason = (
            f"{type(estimator).__name__}.estimate returned {_clipped(repr(outcome))} for "
            f"{len(queries)} queries, not one Estimate per query"
        )
    _logger.warning("%s; the decision is degraded", reason)
    method = getattr(estimator, "method", None) or type(estimator).__name__
    return [Estimate.unavailable(method, reason) for _ in queries]


def limited_estimate(
    estimator: CapabilityEstimator, queries: Sequence[Prompt], limits: Limits
) -> list[Estimate]:
    """``estimator.estimate(queries)`` within the gate's concurrency cap and deadline (blocking)."""
    slots, max_concurrency, timeout_s = limits.slots, limits.max_concurrency, limits.timeout_s
    if max_concurrency is None and timeout_s is None:
        return estimator.estimate(queries)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    semaphore = None if max_concurrency is None else slots.threading_slots(max_concurrency)
    if semaphore is not None and not semaphore.acquire(timeout=-1 if timeout_s is None else timeout_s):
        return _timed_out(estimator, queries, timeout_s or 0.0, queued=True)
    if deadline is None:
        try:
            return estimator.estimate(queries)
        finally:
            if semaphore is not None:
                semaphore.release()
    box: list[list[Estimate] | BaseException] = []
    finished = threading.Event()

    def work() -> None:
        try:
            box.append(estimator.estimate(queries))
        except BaseException as exc:  # handed to the caller below
            box.append(exc)
        finally:
            if semaphore is not None:
                semaphore.release()
            finished.set()

    WORKERS.start_now(work, "capgate-estimate")  # a started thread, not a daemon (see start_now)
    finished.wait(max(0.0, deadline - time.monotonic()))
    if not box:
        return _timed_out(estimator, queries, timeout_s or 0.0, queued=False)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


async def limited_aestimate(
    estimator: CapabilityEstimator, queries: Sequence[Prompt], limits: Limits
) -> list[Estimate]:
    """Async twin of :func:`limited_estimate`; a native async estimate past its deadline is
    cancelled, one in a worker thread keeps its slot until it returns (as on the sync path)."""
    slots, max_concurrency, timeout_s = limits.slots, limits.max_concurrency, limits.timeout_s
    if max_concurrency is None and timeout_s is None:
        return await estimator.aestimate(queries)
    if type(estimator).aestimate is CapabilityEstimator.aestimate:
        return await _threaded_aestimate(estimator, queries, limits)
    semaphore = None if max_concurrency is None else slots.asyncio_slots(max_concurrency)
    acquired = False

    async def bounded() -> list[Estimate]:
        nonlocal acquired
        if semaphore is None:
            return await estimator.aestimate(queries)
        async with semaphore:
            acquired = True
            return await estimator.aestimate(queries)

    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await bounded()
    except TimeoutError:
        if not deadline.expired():  # the estimator's own time-out: its error, not the gate's deadline
            raise
    return _timed_out(estimator, queries, timeout_s or 0.0, queued=semaphore is not None and not acquired)


async def _threaded_aestimate(
    estimator: CapabilityEstimator, queries: Sequence[Prompt], limits: Limits
) -> list[Estimate]:
    """The default ``aestimate`` (``estimate`` in a worker thread) within the cap and deadline: the
    thread holds its slot until the estimator returns, so late calls cannot pile up past the cap."""
    max_concurrency, timeout_s = limits.max_concurrency, limits.timeout_s
    semaphore = None if max_concurrency is None else limits.slots.asyncio_slots(max_concurrency)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[Estimate]] = loop.create_future()
    acquired = False

    def settle(result: list[Estimate] | None, error: BaseException | None) -> None:
        if semaphore is not None:
            semaphore.release()
        if not done.done():  # a caller past its deadline has given up on it (cancelled)
            done.set_exception(error) if error is not None else done.set_result(result or [])

    def work() -> None:
        result, error = None, None
        try:
            result = estimator.estimate(queries)
        except BaseException as exc:  # handed to the caller through ``done`` (which refuses a StopIteration)
            error = RuntimeError(f"the estimator raised {exc!r}") if isinstance(exc, StopIteration) else exc
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nothing to hand over
            loop.call_soon_threadsafe(settle, result, error)

    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            if semaphore is not None:
                await semaphore.acquire()
                acquired = True
            WORKERS.start_now(work, "capgate-estimate")
            return await done
    except TimeoutError:
        if not deadline.expired():  # the estimator's own time-out: its error, not the gate's deadline
            raise
    return _timed_out(estimator, queries, timeout_s or 0.0, queued=semaphore is not None and not acquired)
