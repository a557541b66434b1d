"""The threads a gate's side work (shadow decisions, what a logged decision brings along) runs on.

Starting a thread inside a call makes the call wait for it (``Thread.start`` blocks until it runs;
a 0.31 s stall at 16 shadow calls in bench/RELIABILITY.md), so the threads are started when a gate
is made (:meth:`Workers.reserve`) and shared by every gate of the process; each gate takes its
share through a :class:`Lane`, which queues its jobs beyond ``limit`` without holding a thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

MAX_THREADS = 256
"""Most worker threads the process starts, however many gates reserve them."""


def submit_or_run(
    pool: concurrent.futures.ThreadPoolExecutor, job: Callable[[], Any]
) -> concurrent.futures.Future[Any]:
    """``pool.submit(job)``; at interpreter exit, when the pool takes no new work, ``job`` run here."""
    try:
        return pool.submit(job)
    except RuntimeError as exc:
        if "cannot schedule new futures" not in str(exc):
            raise
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    try:
        done.set_result(job())
    except BaseException as exc:  # the caller reads it from the future, as from the pool's
        done.set_exception(exc)
    return done


class Workers:
    """A process's worker threads: a pool whose threads are all started up front, so a job never
    waits for one to start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._reserved = 0
        self._released: list[int] = []  # places given back by gates that are gone (see release)
        self._busy = 0
        self.size = 0
        """Threads started (and kept) for the jobs."""
        self.overflow = 0
        """Jobs :meth:`start_now` ran on a thread of their own (every started one was busy)."""

    def reserve(self, threads: int) -> None:
        """Add ``threads`` to what the process keeps started (up to :data:`MAX_THREADS`), starting
        any missing now (when a gate is made, never inside a call)."""
        with self._lock:
            while self._released:
                self._reserved = max(0, self._reserved - self._released.pop())
            self._reserved += threads
            if min(self._reserved, MAX_THREADS) <= self.size:
                return
            wanted = min(max(self._reserved, 2 * self.size), MAX_THREADS)  # grows rarely: doubling
            pool = concurrent.futures.ThreadPoolExecutor(wanted, thread_name_prefix="capgate-worker")
            started = threading.Barrier(wanted + 1)
            for _ in range(wanted):  # each start-up job holds its thread until all have started
                pool.submit(started.wait)
            started.wait()
            old, self._pool, self.size = self._pool, pool, wanted
        if old is not None:  # finishes the jobs it holds, takes no new ones, then its threads end
            old.shutdown(wait=False)

    def release(self, threads: int) -> None:
        """Give back what :meth:`reserve` took (a gate that is gone): later gates reuse the threads.

        Takes no lock: it runs from a garbage collection's finalizer, which may fire inside
        :meth:`reserve` on the same thread (a lock there deadlocked a bench).
        """
        self._released.append(threads)  # atomic; read and cleared under the lock in reserve()

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``job`` in a started thread (:meth:`reserve` first); it queues while all are busy."""
        with self._lock:
            pool = self._pool
            if pool is None:
                raise RuntimeError("no worker threads reserved: call reserve() when the gate is made")
            self._busy += 1
        return submit_or_run(pool, self._counted(job))

    def start_now(self, job: Callable[[], Any], name: str) -> None:
        """Run ``job`` at once, never queued: in an idle started thread, else in a new thread named
        ``name`` (counted in :attr:`overflow`). ``job`` must hand over its own result and errors.
        Its thread is not a daemon: it may be in native code (a forward pass), where a daemon
        thread killed at interpreter exit aborts the process."""
        with self._lock:
            pool = self._pool if self._busy < self.size else None
            if pool is not None:
                self._busy += 1
            else:
                self.overflow += 1
        if pool is None:
            threading.Thread(target=job, name=name).start()
        else:
            submit_or_run(pool, self._counted(job))

    def _counted(self, job: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            try:
                return job()
            finally:
                with self._lock:
                    self._busy -= 1

        return run


WORKERS = Workers()
"""The process's worker threads, shared by every gate."""


class Lane:
    """One gate's share of :data:`WORKERS`: at most ``limit`` of its jobs run at once; the others
    wait here, in order, holding no thread."""

    def __init__(self, limit: int, workers: Workers = WORKERS) -> None:
        self.limit = limit
        self._workers = workers
        self._lock = threading.Lock()
        self._running = 0
        self._waiting: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        workers.reserve(limit)
        weakref.finalize(self, workers.release, limit)  # its gate gone, its places are free again

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``job`` in a worker thread when one of this lane's ``limit`` places is free."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            start = self._running < self.limit
            if start:
                self._running += 1
            else:
                self._waiting.append((job, future))
        if start:
            self._dispatch(job, future)
        return future

    def _dispatch(self, job: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
        def run() -> None:
            try:
                result = job()
            except BaseException as exc:  # the caller reads it from the future
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self._next()

        self._workers.submit(run)

    def _next(self) -> None:
        with self._lock:
            if not self._waiting:
                self._running -= 1
                return
            job, future = self._waiting.popleft()
        self._dispatch(job, future)
