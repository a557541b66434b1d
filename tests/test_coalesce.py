"""Concurrent calls coalesce into batched calls; an error reaches only the call that caused it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from capgate.local._coalesce import Coalescer, _Call


def _merged_behind_a_held_batch(
    fn: Callable[[list[int]], list[int]], first: list[int], later: list[list[int]]
) -> tuple[list[int], list[object]]:
    """Call with ``first`` (its batch held until every ``later`` call is queued), then with each of
    ``later``, which coalesce into the next batch: the batch sizes and what each call got (its
    result, or the error it raised), in call order."""
    release = threading.Event()
    sizes: list[int] = []

    def held(items: list[int]) -> list[int]:
        sizes.append(len(items))
        if len(sizes) == 1:
            release.wait(10)
        return fn(items)

    coalesce: Coalescer[int, int] = Coalescer(held)
    outcomes: list[object] = [None] * (1 + len(later))

    def call(i: int, items: list[int]) -> None:
        try:
            outcomes[i] = coalesce(items)
        except BaseException as error:  # the test records what each caller got
            outcomes[i] = error

    threads = [threading.Thread(target=call, args=(0, first))]
    threads[0].start()
    while not sizes:
        time.sleep(0.001)
    threads += [threading.Thread(target=call, args=(i, items)) for i, items in enumerate(later, 1)]
    for thread in threads[1:]:
        thread.start()
    while len(coalesce._queue) < len(later):
        time.sleep(0.001)
    release.set()
    for thread in threads:
        thread.join(10)
    return sizes, outcomes


def test_calls_that_arrive_during_a_batch_run_together_next() -> None:
    sizes, outcomes = _merged_behind_a_held_batch(
        lambda items: [2 * x for x in items], [0], [[1, 10], [2, 20], [3, 30]]
    )
    assert sizes == [1, 6]
    assert outcomes == [[0], [2, 20], [4, 40], [6, 60]]


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


def _blocked_first(
    max_batch: int, window_s: float = 0.0
) -> tuple[Coalescer[int, int], list[int], threading.Event]:
    """A coalescer whose first batch blocks until released; returns it, the batch sizes, the release."""
    release = threading.Event()
    sizes: list[int] = []

    def echo(items: list[int]) -> list[int]:
        sizes.append(len(items))
        if len(sizes) == 1:
            release.wait(10)
        return list(items)

    return Coalescer(echo, max_batch=max_batch, window_s=window_s), sizes, release


def test_batches_stop_at_max_batch_and_never_split_a_call() -> None:
    coalesce, sizes, release = _blocked_first(max_batch=4)
    results: dict[int, list[int]] = {}
    first = threading.Thread(target=lambda: results.setdefault(0, coalesce([0])))
    first.start()
    while not sizes:
        time.sleep(0.001)
    calls = {1: [1, 1, 1], 2: [2, 2], 3: [3], 4: [4] * 6}
    threads = []
    for key, items in calls.items():  # queued in this order
        threads.append(threading.Thread(target=lambda k=key, i=items: results.setdefault(k, coalesce(i))))
        threads[-1].start()
        while len(coalesce._queue) < key:
            time.sleep(0.001)
    release.set()
    for thread in [first, *threads]:
        thread.join(10)
    # Oldest first, at most 4 items: [1,1,1] alone (+[2,2] would make 5), then [2,2]+[3], then the
    # 6-item call alone, whole.
    assert sizes == [1, 3, 3, 6]
    assert results == {0: [0], **calls}


def test_under_load_the_next_batch_waits_for_calls_to_join() -> None:
    coalesce, sizes, release = _blocked_first(max_batch=32, window_s=1.0)
    release.set()
    assert coalesce([1]) == [1]  # alone, no load: no window
    assert coalesce([2]) == [2]
    assert sizes == [1, 1]
    coalesce._contended = True  # as after a batch that merged calls
    results: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: results.setdefault(i, coalesce([i]))) for i in range(3)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sizes[2:] == [3]  # the window gathered the burst into one batch
    assert results == {0: [0], 1: [1], 2: [2]}
    assert time.monotonic() - start < 5


def test_a_full_batch_does_not_wait_out_the_window() -> None:
    coalesce: Coalescer[int, int] = Coalescer(lambda items: items, max_batch=2, window_s=30.0)
    coalesce._contended = True
    start = time.monotonic()
    assert coalesce([1, 2]) == [1, 2]
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(("field", "value"), [("max_batch", 0), ("window_s", -1.0), ("window_s", True)])
def test_bad_settings_are_named(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        Coalescer(lambda items: items, **{field: value})  # type: ignore[arg-type]


class _Interrupt(BaseException):
    """Not an Exception, as a KeyboardInterrupt in the thread running a batch."""


def test_a_batch_interrupted_by_a_base_exception_fails_every_merged_call() -> None:
    def echo(items: list[int]) -> list[int]:
        if -1 in items:
            raise _Interrupt("runner interrupted")
        return list(items)

    sizes, outcomes = _merged_behind_a_held_batch(echo, [0], [[-1], [5, 6]])
    assert sizes == [1, 3]  # the two calls ran as one batch
    assert outcomes[0] == [0]
    got = [outcomes[1], outcomes[2]]
    # The thread that ran the batch gets the BaseException itself; the other an error, not [].
    raised = [e for e in got if isinstance(e, _Interrupt)]
    failed = [e for e in got if isinstance(e, RuntimeError)]
    assert len(raised) == 1
    assert len(failed) == 1
    assert "interrupted" in str(failed[0])
    assert failed[0].__cause__ is raised[0]
