"""Side work runs on threads started once per process: no call waits for a thread to start.

The process's worker threads start when a gate is made; each gate takes at most its share of
them (a lane); a burst of shadow calls starts no thread and leaves the caller's event loop free.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import capgate
from capgate import Estimate, Gate
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator
from capgate.gate._workers import WORKERS, Lane, Workers


class Sleepy(CapabilityEstimator):
    """A sync estimate that blocks its thread (as a forward pass or an HTTP call does)."""

    method = "sleepy"

    def __init__(self, seconds: float = 0.02) -> None:
        self.seconds = seconds

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        time.sleep(self.seconds)
        return [Estimate(p=0.9, method=self.method) for _ in queries]


@pytest.fixture
def thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started while the test runs (after its gates were made)."""
    started: list[str] = []
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return started


def test_a_lane_runs_at_most_its_limit_at_once_and_the_rest_in_order() -> None:
    workers = Workers()
    lane = Lane(2, workers)
    release = threading.Event()
    running, peak, order = [0], [0], []
    lock = threading.Lock()

    def job(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            order.append(i)
        release.wait(5)
        with lock:
            running[0] -= 1
        return i

    futures = [lane.submit(lambda i=i: job(i)) for i in range(6)]
    time.sleep(0.1)
    assert running[0] == 2  # two run, four wait without a thread
    release.set()
    assert [f.result(timeout=5) for f in futures] == list(range(6))
    assert peak[0] == 2
    assert order[:2] == [0, 1]
    assert sorted(order) == list(range(6))
    assert workers.size >= 2


def test_a_job_that_raises_hands_its_error_to_its_future_and_frees_its_place() -> None:
    lane = Lane(1, Workers())

    def boom() -> None:
        raise ValueError("estimator broke")

    with pytest.raises(ValueError, match="estimator broke"):
        lane.submit(boom).result(timeout=5)
    assert lane.submit(lambda: 7).result(timeout=5) == 7


def test_the_process_starts_threads_when_gates_are_made_and_grows_rarely() -> None:
    workers = Workers()
    sizes = set()
    for _ in range(40):
        workers.reserve(4)
        sizes.add(workers.size)
    assert workers.size >= 160  # every gate's share is started
    assert len(sizes) <= 7  # the pool was rebuilt (doubling) a handful of times, not 40
    workers.reserve(1000)
    assert workers.size == 256  # MAX_THREADS


def test_gates_that_are_gone_give_their_places_back() -> None:
    """Making and dropping gates one after another does not grow the process's threads: a gone
    gate's reservation is released, and the next gate reuses the threads it had."""
    workers = Workers()
    for _ in range(50):
        lane = Lane(8, workers)
        del lane
        gc.collect()
    assert workers.size == 8
    kept = [Lane(8, workers) for _ in range(3)]  # live gates' places still add up (grown by doubling)
    assert workers.size == 32
    assert len(kept) == 3


def test_a_gate_gone_inside_reserve_does_not_deadlock() -> None:
    """A gate's places are given back from a garbage collection's finalizer, which can fire on
    the thread that is inside ``reserve()`` holding its lock (it deadlocked load_bench once):
    ``release`` must not wait for that lock."""
    workers = Workers()
    workers.reserve(4)

    def inside_reserve() -> None:
        with workers._lock:
            workers.release(4)

    thread = threading.Thread(target=inside_reserve)
    thread.start()
    thread.join(2)
    assert not thread.is_alive(), "release() waited for the lock reserve() holds"
    workers.reserve(4)  # the 4 given back are folded in: no growth
    assert workers.size == 4


def test_shadow_calls_start_no_thread(tmp_path: Path, thread_starts: list[str]) -> None:
    gate_log = DecisionLog(tmp_path / "log.sqlite3")
    guarded = capgate.guard(policy="balanced", estimator=Sleepy(0.001), mode="shadow", log=gate_log)(
        lambda prompt: "42"
    )
    thread_starts.clear()  # the gate and its log are made; now the calls
    for i in range(30):
        assert guarded(f"What is {i} + 1?") == "42"
    guarded.gate.flush()
    assert [name for name in thread_starts if not name.startswith("capgate-log")] == []
    assert gate_log.count() == 30
    gate_log.close()


def test_two_gates_keep_their_own_limits(tmp_path: Path) -> None:
    """A gate flooded with slow shadow work does not hold another gate's shadow decisions."""
    slow = Gate(policy="balanced", estimator=Sleepy(0.5), mode="shadow", max_concurrency=2)
    quick = Gate(policy="balanced", estimator=Sleepy(0.001), mode="shadow", max_concurrency=2)
    for i in range(8):
        slow.shadow(f"slow {i}")
    started = time.monotonic()
    verdict = quick.shadow("quick")
    assert verdict.pending is not None
    verdict.pending.future.result(timeout=5)  # type: ignore[union-attr]
    assert time.monotonic() - started < 0.4, "the quick gate waited for the slow gate's work"
    slow.flush()


class Collections:
    """The interpreter's garbage collections while it is open, as (start, end) times: a full one
    in a process that has loaded torch, transformers and a whole test session stops every thread
    for most of a second, which is the interpreter's pause, not capgate's."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.monotonic()
        else:
            self.spans.append((self._started, time.monotonic()))

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def within(self, start: float, end: float) -> float:
        """Seconds of collection inside [start, end]."""
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self.spans)


def test_the_event_loop_stays_free_under_64_async_shadow_calls(tmp_path: Path) -> None:
    """The real gate, 64 shadow calls in flight on one loop, each estimate blocking a worker
    thread for 50 ms: a ticker on the same loop measures how late it wakes, less the time the
    interpreter spent collecting garbage in that interval (the issue's bound is outside them)."""
    log = DecisionLog(tmp_path / "log.sqlite3")

    @capgate.guard(policy="balanced", estimator=Sleepy(0.05), mode="shadow", log=log, max_concurrency=64)
    async def ask(prompt: str) -> str:
        await asyncio.sleep(0.01)
        return "42"

    async def main() -> float:
        lags: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                before = time.monotonic()
                await asyncio.sleep(0.005)
                after = time.monotonic()
                lags.append(after - before - 0.005 - collections.within(before, after))

        tick = asyncio.create_task(ticker())
        answers = await asyncio.gather(*(ask(f"q{i}") for i in range(64)))
        await ask.gate.aflush()
        stop.set()
        await tick
        assert answers == ["42"] * 64
        return max(lags)

    with Collections() as collections:
        worst = asyncio.run(main())
    log.close()
    collected = sum(b - a for a, b in collections.spans)
    print(
        f"event loop lag under 64 shadow calls: worst {worst * 1000:.1f} ms outside "
        f"{len(collections.spans)} collections ({collected * 1000:.0f} ms); worker threads {WORKERS.size}"
    )
    assert worst < 0.25, f"the caller's loop was held {worst * 1000:.0f} ms"


def test_a_stuck_log_delays_only_the_gates_that_write_to_it(tmp_path: Path) -> None:
    """Each log has its own writer thread: while one log cannot be written (a paused
    PostgreSQL, say; here its writes are held), another gate's async calls finish and their
    decisions are on disk; the held ones are all written once it resumes (none lost)."""
    stuck_log = DecisionLog(tmp_path / "stuck.sqlite3")
    free_log = DecisionLog(tmp_path / "free.sqlite3")
    resume = threading.Event()
    record = stuck_log.record

    def paused_record(*args: object, **kwargs: object) -> object:
        resume.wait(10)
        return record(*args, **kwargs)  # type: ignore[arg-type]

    stuck_log.record = paused_record  # type: ignore[method-assign]
    stuck = capgate.guard(policy="balanced", estimator=Sleepy(0.001), log=stuck_log)
    free = capgate.guard(policy="balanced", estimator=Sleepy(0.001), log=free_log)

    @stuck
    async def ask_stuck(prompt: str) -> str:
        return "42"

    @free
    async def ask_free(prompt: str) -> str:
        return "42"

    async def main() -> float:
        held = [asyncio.create_task(ask_stuck(f"s{i}")) for i in range(4)]
        await asyncio.sleep(0.05)  # the stuck gate's writes are queued on its log's thread
        started = time.monotonic()
        answers = await asyncio.wait_for(asyncio.gather(*(ask_free(f"f{i}") for i in range(8))), 5)
        took = time.monotonic() - started
        assert answers == ["42"] * 8
        assert free_log.count() == 8  # on disk while the other log is still stuck
        assert not any(task.done() for task in held)  # the stuck gate's calls wait for their log
        resume.set()
        assert await asyncio.gather(*held) == ["42"] * 4
        return took

    took = asyncio.run(main())
    assert took < 1.0, f"the free gate's calls took {took:.2f} s behind another gate's log"
    assert stuck_log.count() == 4  # nothing lost
    stuck_log.close()
    free_log.close()


def test_speculative_calls_and_estimate_deadlines_start_no_thread(
    tmp_path: Path, thread_starts: list[str]
) -> None:
    """Enforce mode's other side work: a speculative call runs in a started worker thread, and a
    sync estimate under a deadline too (its thread keeps running past the deadline, as before)."""
    log = DecisionLog(tmp_path / "log.sqlite3")
    speculative = capgate.guard(policy="balanced", estimator=Sleepy(0.01), speculative=True, log=log)(
        lambda prompt: f"reply to {prompt}"
    )
    deadline = capgate.guard(policy="balanced", estimator=Sleepy(0.01), estimate_timeout_s=2.0, log=log)(
        lambda prompt: f"reply to {prompt}"
    )
    late = Gate(policy="balanced", estimator=Sleepy(0.3), estimate_timeout_s=0.05)
    thread_starts.clear()  # the gates and their log are made; now the calls
    overflow = WORKERS.overflow
    for i in range(10):
        assert speculative(f"q{i}") == f"reply to q{i}"
        assert deadline(f"q{i}") == f"reply to q{i}"
    verdict = late.assess("slow")
    assert verdict.decision.degraded
    assert "estimate_timeout_s=0.05" in verdict.decision.reason
    assert [name for name in thread_starts if not name.startswith("capgate-log")] == []
    assert WORKERS.overflow == overflow
    assert {d.decision.speculation is not None for d in log.decisions()} == {True, False}
    log.close()


def test_work_beyond_the_started_threads_runs_at_once_on_a_thread_of_its_own() -> None:
    """More side work in flight than the gates reserved never queues behind other work: it gets a
    new thread, counted."""
    workers = Workers()
    workers.reserve(1)
    release, ran = threading.Event(), threading.Event()
    workers.start_now(lambda: release.wait(5), "busy")
    workers.start_now(ran.set, "extra")
    assert ran.wait(2), "the second job waited for the first"
    assert workers.overflow == 1
    release.set()
    done = threading.Event()
    time.sleep(0.05)
    workers.start_now(done.set, "again")  # the started thread is free again: no new one
    assert done.wait(2)
    assert workers.overflow == 1
