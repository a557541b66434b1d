"""Async shadow decisions run off the caller's event loop (issue 22: the estimate never delays the call).

The loop is watched by a ticker coroutine: while an estimate holds its thread for ``BUSY_S`` (CPU
work or a blocking wait, as parsing a reply or a sync client would), the loop must keep ticking:
the typical gap between ticks a small part of the estimate's time, and no gap most of it. Made on
the loop, the estimate stops the ticker for all of it (one gap, at least as long as the estimate).
The bounds are ratios with a wide margin, since a loaded machine stalls both threads now and then.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import capgate
from capgate import Estimate, Gate
from capgate.core.backend import Generation, Prompt, SamplingParams
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator, FallbackChain, VerbalizedConfidence

WAIT_S = 30.0  # a bound on every wait, so a regression fails instead of hanging
BUSY_S = 1.0  # what one estimate holds its thread for
TICK_S = 0.005
TYPICAL_LAG = 0.1  # the loop's median gap between ticks during an estimate, as a share of its time
MOST_LAG = 0.9  # the loop's longest gap during an estimate, as a share of its time


class Busy:
    """A backend whose sync and async paths both hold the calling thread for ``BUSY_S``.

    ``agenerate`` does its work on whatever loop awaits it, as a client parsing its replies does;
    ``kind`` is ``"cpu"`` (a Python loop, holding the GIL) or ``"blocking"`` (a sleep).
    """

    model_id = "busy"

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.spans: list[tuple[float, float]] = []
        self.threads: list[int] = []

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        reply = [[Generation(text="\\boxed{0.05}", n_tokens=4)] * params.n for _ in prompts]
        if "warm up" in str(prompts[0]):
            return reply
        start = time.monotonic()
        self.threads.append(threading.get_ident())
        if self.kind == "cpu":
            n = 0
            while time.monotonic() - start < BUSY_S:
                n += sum(i * i for i in range(200))
        else:
            time.sleep(BUSY_S)
        self.spans.append((start, time.monotonic()))
        return reply

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        return self.generate(prompts, params)


@pytest.mark.parametrize("kind", ["cpu", "blocking"])
def test_an_async_shadow_estimate_never_blocks_the_callers_loop(tmp_path: Path, kind: str) -> None:
    backend = Busy(kind)
    estimator = VerbalizedConfidence(backend, max_tries=1, structured=False)
    assert estimator.thread_safe_estimate  # a backend with a sync generate: run off the loop
    log = DecisionLog(tmp_path / "log.sqlite3")

    @capgate.guard(policy="balanced", estimator=estimator, mode="shadow", log=log)
    async def ask(prompt: str) -> str:
        return "42"

    ticks: list[float] = []

    async def main() -> float:
        assert await ask("warm up") == "42"  # the gate's first-call set-up (policy, threads) done
        await asyncio.wait_for(ask.gate.aflush(), WAIT_S)
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(TICK_S)

        watching = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        assert await ask("What will the lottery draw next week?") == "42"
        returned = time.monotonic()
        await asyncio.wait_for(ask.gate.aflush(), WAIT_S)
        done.set()
        await watching
        return returned

    loop_thread = threading.get_ident()
    returned = asyncio.run(main())
    ((start, end),) = backend.spans
    during = [b - a for a, b in itertools.pairwise(ticks) if b > start and a < end]
    assert during, "the ticker never ran while the estimate did"
    took = end - start
    assert statistics.median(during) < TYPICAL_LAG * took, (statistics.median(during), took)
    assert max(during) < MOST_LAG * took, (max(during), took)
    assert returned < end  # the call came back while its estimate was still running
    assert backend.threads != [loop_thread]  # the estimate ran in a worker thread
    logged = log.decisions()
    assert [(d.decision.shadow, d.decision.action) for d in logged] == [(True, "abstain")] * 2


class Held(CapabilityEstimator):
    """Holds each estimate until released (default ``aestimate``: a sync path that works anywhere);
    counts the estimates in flight."""

    method = "held"

    def __init__(self, *, fail: str | None = None) -> None:
        self.fail = fail
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            assert self.release.wait(WAIT_S)
            if self.fail == "raise":
                raise RuntimeError("estimator exploded")
            if self.fail == "garbage":
                return ["not an estimate"]  # type: ignore[list-item]
            return [Estimate(p=0.05, method=self.method) for _ in queries]
        finally:
            with self.lock:
                self.running -= 1


@pytest.mark.parametrize("fail", ["raise", "garbage", "late"])
def test_an_async_shadow_decision_in_a_thread_is_degraded_with_its_reason(tmp_path: Path, fail: str) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    held = Held(fail=None if fail == "late" else fail)
    if fail != "late":
        held.release.set()
    timeout = {"estimate_timeout_s": 0.2} if fail == "late" else {}

    @capgate.guard(policy="balanced", estimator=held, mode="shadow", log=log, **timeout)
    async def ask(prompt: str) -> str:
        return "42"

    async def main() -> None:
        assert await ask("anything") == "42"
        await asyncio.wait_for(ask.gate.aflush(), WAIT_S)

    asyncio.run(main())
    held.release.set()
    (logged,) = [d.decision for d in log.decisions()]
    assert (logged.shadow, logged.degraded, logged.action) == (True, True, "abstain")
    expected = {
        "raise": "RuntimeError: estimator exploded",
        "garbage": "not one Estimate per query",
        "late": "0.2s",
    }
    assert expected[fail] in (logged.estimate.reason or "")


def test_async_shadow_estimates_keep_the_gates_concurrency_cap(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    held = Held()
    gate = Gate(policy="balanced", estimator=held, mode="shadow", log=log, max_concurrency=2)

    @capgate.guard(gate=gate)
    async def ask(prompt: str) -> str:
        return "42"

    async def main() -> list[str]:
        answers = await asyncio.gather(*(ask(f"question {i}") for i in range(6)))
        await asyncio.sleep(0.3)  # time for more estimates to start, were the cap not kept
        held.release.set()
        await asyncio.wait_for(gate.aflush(), WAIT_S)
        return list(answers)

    assert asyncio.run(main()) == ["42"] * 6
    assert held.most == 2
    assert log.count() == 6


def test_only_an_estimator_with_a_sync_path_that_works_anywhere_leaves_the_loop() -> None:
    class NativeAsync(CapabilityEstimator):
        def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            raise NotImplementedError

        async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            return [Estimate(p=0.5, method="native") for _ in queries]

    class AsyncOnly:
        model_id = "async-only"

        async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> Any:
            raise NotImplementedError

    held = Held()
    assert held.thread_safe_estimate  # the default aestimate runs estimate in a thread anyway
    assert not NativeAsync().thread_safe_estimate  # its client may be bound to the caller's loop
    assert VerbalizedConfidence(Busy("cpu"), structured=False).thread_safe_estimate
    assert not VerbalizedConfidence(AsyncOnly(), structured=False).thread_safe_estimate
    assert FallbackChain([held, Held()]).thread_safe_estimate
    assert not FallbackChain([held, NativeAsync()]).thread_safe_estimate


def test_a_native_async_estimator_is_awaited_on_the_callers_loop(tmp_path: Path) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    class LoopBound(CapabilityEstimator):
        """Its client belongs to the loop it was made on, as a user's AsyncOpenAI does."""

        method = "loop-bound"

        def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            raise AssertionError("the async path must use aestimate")

        async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            loops.append(asyncio.get_running_loop())
            return [Estimate(p=0.05, method=self.method) for _ in queries]

    log = DecisionLog(tmp_path / "log.sqlite3")

    @capgate.guard(policy="balanced", estimator=LoopBound(), mode="shadow", log=log)
    async def ask(prompt: str) -> str:
        return "42"

    async def main() -> asyncio.AbstractEventLoop:
        assert await ask("anything") == "42"
        await ask.gate.aflush()
        return asyncio.get_running_loop()

    assert loops == [asyncio.run(main())]
    assert [d.decision.action for d in log.decisions()] == ["abstain"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_shadow_decisions_still_being_made_at_exit_are_logged(tmp_path: Path, kind: str) -> None:
    """A script that ends without flush: exit waits for the decisions and logs every one."""
    path = tmp_path / "log.sqlite3"
    script = f"""
import asyncio, time
import capgate
from capgate import Estimate
from capgate.estimators import CapabilityEstimator

class Slow(CapabilityEstimator):
    method = "slow"
    def estimate(self, queries):
        time.sleep(0.3)
        return [Estimate(p=0.05, method=self.method) for _ in queries]

@capgate.guard(policy="balanced", estimator=Slow(), mode="shadow", log={str(path)!r})
def ask(prompt):
    return "42"

@capgate.guard(policy="balanced", estimator=Slow(), mode="shadow", log={str(path)!r})
async def aask(prompt):
    return "42"

async def main():
    for i in range(4):
        await aask(f"question {{i}}")

if {kind!r} == "sync":
    for i in range(4):
        ask(f"question {{i}}")
else:
    asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    with DecisionLog(path) as log:
        assert [(d.decision.shadow, d.decision.action) for d in log.decisions()] == [(True, "abstain")] * 4


def test_an_async_shadow_call_never_waits_on_the_logs_thread(tmp_path: Path) -> None:
    """The log's one thread may be busy (opening a log, other gates' writes): a shadow call must
    not queue behind it. Recording a shadow decision only arranges its write for later."""
    from capgate.gate._limits import log_key, log_writer

    gate = Gate(policy="balanced", estimator=VerbalizedConfidence(Busy("blocking")), log=tmp_path / "log.db",
                mode="shadow")  # fmt: skip

    @capgate.guard(gate=gate)
    async def ask(prompt: str) -> str:
        return "answered"

    release = threading.Event()
    held = log_writer(log_key(gate.settings.log)).submit(release.wait, WAIT_S)  # busy until released

    async def calls() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(ask(f"q{i}") for i in range(8))), WAIT_S / 3)

    try:
        assert asyncio.run(calls()) == ["answered"] * 8  # returned while the log's thread was held
    finally:
        release.set()
    held.result(WAIT_S)
    assert gate.flush(WAIT_S)
    with DecisionLog(tmp_path / "log.db") as log:
        assert log.count() == 8


def test_a_shadow_decision_its_loop_ends_before_is_logged_degraded(tmp_path: Path) -> None:
    """A native async estimator decides on the caller's loop; when that loop ends first
    (``asyncio.run`` cancels the tasks left), the decision is logged, degraded, saying so."""
    from capgate.gate._shadow import LOOP_CLOSED

    class Endless(CapabilityEstimator):
        method = "endless"

        def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            raise AssertionError("the async path must use aestimate")

        async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            await asyncio.Event().wait()  # never set
            raise AssertionError("unreachable")

    log = DecisionLog(tmp_path / "log.sqlite3")

    @capgate.guard(policy="balanced", estimator=Endless(), mode="shadow", log=log, estimate_timeout_s=None)
    async def ask(prompt: str) -> str:
        return "42"

    async def main() -> list[str]:
        first = await ask("started")
        await asyncio.sleep(0.05)  # this one's estimate is under way when the loop ends
        return [first, await ask("never started")]  # this one's task never ran

    assert asyncio.run(main()) == ["42", "42"]
    assert ask.gate.flush(WAIT_S)
    rows = [r.decision for r in log.decisions()]
    assert len(rows) == 2
    assert all(d.shadow and d.degraded and d.estimate.reason == LOOP_CLOSED for d in rows)
    assert {d.action for d in rows} == {"abstain"}  # balanced's on_degraded


def test_a_cancelled_shadow_decision_is_made_once_for_every_callback() -> None:
    from capgate.gate._results import ShadowDecision
    from capgate.gate._shadow import stand_in

    made: list[Any] = []

    def unmade() -> Any:
        made.append(stand_in("q"))
        return made[-1]

    async def main() -> list[Any]:
        task = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        decision = ShadowDecision(task, unmade)  # type: ignore[arg-type]
        seen: list[Any] = []
        decision.then(seen.append)  # before the cancel
        task.cancel()
        await asyncio.sleep(0.01)
        decision.then(seen.append)  # after it
        return seen

    seen = asyncio.run(main())
    assert len(made) == 1
    assert seen == [made[0], made[0]]
