"""Concurrent calls coalesced into one batched call (no waiting window, so no added latency).

A caller that finds no batch running runs its own items at once; calls that arrive meanwhile
queue up, and when the running batch ends one of them runs *all* queued items as the next batch.
So eight threads of a LangGraph fan-out (or eight ``aestimate`` worker threads of a LangChain
``abatch``) estimating one query each cost two batched forward passes, not eight.

If a batch of several calls fails, each call is run again alone, so an error reaches only the
call whose items caused it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

T = TypeVar("T")
R = TypeVar("R")


class _Call(Generic[T, R]):
    def __init__(self, items: Sequence[T]) -> None:
        self.items = list(items)
        self.done = False
        self.results: list[R] = []
        self.error: BaseException | None = None


class Coalescer(Generic[T, R]):
    """Runs ``fn(items) -> results`` (one result per item, in order), merging concurrent calls.

    Example:
        >>> sizes = []
        >>> def double(items):
        ...     sizes.append(len(items))
        ...     return [2 * x for x in items]
        >>> coalesce = Coalescer(double)
        >>> coalesce([1, 2]), sizes
        ([2, 4], [2])
    """

    def __init__(self, fn: Callable[[list[T]], Iterable[R]]) -> None:
        self._fn = fn
        self._cond = threading.Condition()
        self._queue: list[_Call[T, R]] = []
        self._busy = False

    def __call__(self, items: Sequence[T]) -> list[R]:
        call: _Call[T, R] = _Call(items)
        with self._cond:
            self._queue.append(call)
            while not call.done and self._busy:
                self._cond.wait()
            if call.done:
                return self._outcome(call)
            self._busy = True
            batch, self._queue = self._queue, []
        try:
            self._run(batch)
        finally:
            with self._cond:
                self._busy = False
                for member in batch:
                    member.done = True
                self._cond.notify_all()
        return self._outcome(call)

    @staticmethod
    def _outcome(call: _Call[T, R]) -> list[R]:
        if call.error is not None:
            raise call.error
        return call.results

    def _run(self, batch: list[_Call[T, R]]) -> None:
        try:
            results = list(self._fn([item for member in batch for item in member.items]))
        except Exception as error:
            if len(batch) == 1:
                batch[0].error = error
                return
            for member in batch:
                self._run([member])
            return
        start = 0
        for member in batch:
            member.results = results[start : start + len(member.items)]
            start += len(member.items)
