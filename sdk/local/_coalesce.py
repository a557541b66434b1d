"""Concurrent calls coalesced into batched calls, up to a maximum batch, with a short window under load.

A caller that finds no batch running runs the queued calls (its own among them) as one batch;
calls arriving meanwhile queue up, and when it ends one of them runs the queued calls, oldest
first, up to ``max_batch`` items (a call is never split: a larger one runs alone). So eight threads
of a LangGraph fan-out estimating one query each cost two batched forward passes, not eight.

Under load (the last batch merged calls, or calls queued while it ran) the next batch first waits
up to ``window_s`` for more calls to join; a lone caller never waits. If a batch of several calls
fails, each call runs again alone, so an error reaches only the call whose items caused it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from capgate._util.validate import check_positive_int

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_BATCH = 32
"""Most items per batch: past it, a batch's wall time (latency for all its calls) grows faster than
its throughput (``bench/load_bench.py --coalesce-sweep``; bench/RELIABILITY.md)."""

DEFAULT_WINDOW_S = 0.005
"""How long, under load, the next batch waits for calls to join (``bench/load_bench.py``)."""


class _Call(Generic[T, R]):
    def __init__(self, items: Sequence[T]) -> None:
        self.items = list(items)
        self.done = False
        self.results: list[R] = []
        self.error: BaseException | None = None
        self.settled = False  # results or error set


class Coalescer(Generic[T, R]):
    """Runs ``fn(items) -> results`` (one result per item, in order), merging concurrent calls.

    Args:
        fn: The batch function.
        max_batch: Most items per batch (a call with more runs alone, whole).
        window_s: Under load, how long the next batch waits for calls to join (0: never).

    Examples:
        >>> sizes = []
        >>> def double(items):
        ...     sizes.append(len(items))
        ...     return [2 * x for x in items]
        >>> coalesce = Coalescer(double)
        >>> coalesce([1, 2]), sizes
        ([2, 4], [2])
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Iterable[R]],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        check_positive_int("max_batch", max_batch)
        if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not 0 <= window_s < 60:
            raise ValueError(f"window_s must be a number of seconds in [0, 60); got {window_s!r}")
        self._fn = fn
        self.max_batch = max_batch
        self.window_s = float(window_s)
        self._cond = threading.Condition()
        self._queue: list[_Call[T, R]] = []
        self._busy = False
        self._contended = False  # the last batch merged calls, or calls queued while it ran

    def __call__(self, items: Sequence[T]) -> list[R]:
        call: _Call[T, R] = _Call(items)
        with self._cond:
            self._queue.append(call)
            self._cond.notify_all()  # a runner waiting in its window counts the newcomer
        while True:
            with self._cond:
                while not call.done and self._busy:
                    self._cond.wait()
                if call.done:
                    if call.error is not None:
                        raise call.error
                    return call.results
                self._busy = True
                if self._contended and self.window_s > 0:
                    self._gather()
                batch = self._take()
            try:
                self._run(batch)
            except BaseException as error:  # not an Exception (_run keeps those): a KeyboardInterrupt, ...
                interrupted = f"the batch this call was merged into was interrupted: {error!r}"
                for member in batch:
                    if not member.settled:  # an error, not an empty result, for the calls merged in
                        member.error = RuntimeError(interrupted)
                        member.error.__cause__ = error
                raise
            finally:
                with self._cond:
                    self._busy = False
                    self._contended = len(batch) > 1 or bool(self._queue)
                    for member in batch:
                        member.done = True
                    self._cond.notify_all()

    def _gather(self) -> None:
        """Wait (lock held, released while waiting) up to the window or until a batch is full."""
        deadline = time.monotonic() + self.window_s
        while sum(len(member.items) for member in self._queue) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _take(self) -> list[_Call[T, R]]:
        """The oldest queued calls, up to ``max_batch`` items (at least one call)."""
        batch: list[_Call[T, R]] = []
        count = 0
        while self._queue and (not batch or count + len(self._queue[0].items) <= self.max_batch):
            member = self._queue.pop(0)
            batch.append(member)
            count += len(member.items)
        return batch

    def _run(self, batch: list[_Call[T, R]]) -> None:
        try:
            results = list(self._fn([item for member in batch for item in member.items]))
        except Exception as error:
            if len(batch) == 1:
                batch[0].error, batch[0].settled = error, True
                return
            for member in batch:
                self._run([member])
            return
        start = 0
        for member in batch:
            member.results, member.settled = results[start : start + len(member.items)], True
            start += len(member.items)
