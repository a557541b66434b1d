"""Concurrent calls coalesce into batched calls; an error reaches only the call that caused it."""

from __future__ import annotations

import threading
import time

import pytest

from capgate._coalesce import Coalescer, _Call


def test_calls_that_arrive_during_a_batch_run_together_next() -> None:
    release = threading.Event()
    sizes: list[int] = []

    def double(items: list[int]) -> list[int]:
        sizes.append(len(items))
        if len(sizes) == 1:
            release.wait(10)
        return [2 * x for x in items]

    coalesce: Coalescer[int, int] = Coalescer(double)
    results: dict[int, list[int]] = {}
    first = threading.Thread(target=lambda: results.setdefault(0, coalesce([0])))
    first.start()
    while not sizes:
        time.sleep(0.001)
    others = [
        threading.Thread(target=lambda i=i: results.setdefault(i, coalesce([i, 10 * i]))) for i in (1, 2, 3)
    ]
    for thread in others:
        thread.start()
    while len(coalesce._queue) < 3:
        time.sleep(0.001)
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert sizes == [1, 6]
    assert results == {0: [0], 1: [2, 20], 2: [4, 40], 3: [6, 60]}


def test_a_failing_batch_is_rerun_call_by_call() -> None:
    def check(items: list[int]) -> list[int]:
        if any(x < 0 for x in items):
            raise ValueError("negative")
        return items

    coalesce: Coalescer[int, int] = Coalescer(check)
    assert coalesce([1, 2]) == [1, 2]
    with pytest.raises(ValueError, match="negative"):
        coalesce([-1])
    good: _Call[int, int] = _Call([5])
    bad: _Call[int, int] = _Call([-5])
    coalesce._run([good, bad])
    assert good.results == [5]
    assert good.error is None
    assert isinstance(bad.error, ValueError)
