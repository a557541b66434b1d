"""The gate's own bounds: ``max_concurrency`` queues a burst, ``estimate_timeout_s`` degrades a late
estimate (routed to ``on_degraded`` and logged with its reason), sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import capgate
from capgate import Estimate, Gate, SettingsError
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator


class Slow(CapabilityEstimator):
    """Sleeps ``delay`` seconds per call and records the most calls in flight at once."""

    method = "slow"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self._enter()
        try:
            time.sleep(self.delay)
        finally:
            self._leave()
        return [Estimate(p=0.95, method=self.method) for _ in queries]

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self._enter()
        try:
            await asyncio.sleep(self.delay)
        finally:
            self._leave()
        return [Estimate(p=0.95, method=self.method) for _ in queries]


def test_async_burst_queues_within_max_concurrency() -> None:
    slow = Slow(0.02)

    @capgate.guard(policy="balanced", estimator=slow, max_concurrency=3)
    async def ask(prompt: str) -> str:
        return "answered"

    async def burst() -> list[object]:
        return await asyncio.gather(*(ask(f"q{i}") for i in range(40)))

    results = asyncio.run(burst())
    assert results == ["answered"] * 40  # queued, none failed
    assert slow.max_in_flight == 3


class Held(Slow):
    """Blocks in ``estimate`` until released; no ``aestimate`` of its own, so the default runs
    ``estimate`` in a worker thread."""

    aestimate = CapabilityEstimator.aestimate

    def __init__(self) -> None:
        super().__init__(0.0)
        self.release = threading.Event()

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self._enter()
        try:
            self.release.wait(timeout=10)
        finally:
            self._leave()
        return [Estimate(p=0.95, method=self.method) for _ in queries]


def test_a_late_async_estimate_in_a_thread_keeps_its_slot_until_it_returns() -> None:
    """A worker thread cannot be cancelled: past the deadline it goes on, and so must hold its slot,
    or each late call leaves one more estimator running beyond the cap (as on the sync path)."""
    held = Held()
    gate = Gate(policy="balanced", estimator=held, max_concurrency=1, estimate_timeout_s=0.05)

    async def one_after_another() -> list[str | None]:
        return [(await gate.aassess(f"q{i}")).decision.estimate.reason for i in range(4)]

    reasons = asyncio.run(one_after_another())
    held.release.set()
    assert held.max_in_flight == 1
    assert "did not return" in (reasons[0] or "")
    assert all("no free estimator slot" in (r or "") for r in reasons[1:])
    for _ in range(100):  # the first estimate returns once released
        if held.in_flight == 0:
            break
        time.sleep(0.01)
    assert held.in_flight == 0


def test_sync_threads_share_the_cap_across_views() -> None:
    slow = Slow(0.02)
    gate = Gate(policy="balanced", estimator=slow, max_concurrency=2)
    views = [gate, gate.with_options(step="draft")]
    threads = [threading.Thread(target=views[i % 2].assess, args=(f"q{i}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slow.max_in_flight == 2
    assert gate.stats.calls == 12


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_late_estimate_is_a_degraded_decision_logged_with_its_reason(mode: str, tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.sqlite3")
    gate = Gate(policy="balanced", estimator=Slow(2.0), estimate_timeout_s=0.1, log=log)

    def ask(prompt: str) -> str:
        return "answered"

    async def aask(prompt: str) -> str:
        return ask(prompt)

    guarded = capgate.guard(gate=gate)(ask if mode == "sync" else aask)
    start = time.monotonic()
    result = guarded("q") if mode == "sync" else asyncio.run(guarded("q"))
    assert time.monotonic() - start < 1.0
    assert isinstance(result, capgate.Gated)
    decision = result.decision
    assert decision.degraded
    assert decision.action == gate.resolve_policy().on_degraded.action
    assert "estimate_timeout_s=0.1s" in decision.reason
    (row,) = log.decisions()
    assert row.decision.reason == decision.reason


def test_a_call_waiting_too_long_for_a_slot_is_degraded_naming_the_queue() -> None:
    slow = Slow(0.0)
    gate = Gate(policy="balanced", estimator=slow, max_concurrency=1, estimate_timeout_s=0.2)

    async def while_the_slot_is_taken() -> capgate.gate.Verdict:
        slots = gate._shared.slots.asyncio_slots(1)
        async with slots:  # another call holds the only slot
            return await gate.aassess("b")

    verdict = asyncio.run(while_the_slot_is_taken())
    assert verdict.decision.degraded
    assert "no free estimator slot (max_concurrency)" in verdict.decision.reason
    assert slow.max_in_flight == 0  # it never reached the estimator


def test_no_limits_calls_the_estimator_directly() -> None:
    gate = Gate(policy="balanced", estimator=Slow(0.0))
    assert gate.assess("q").action == "answer"


@pytest.mark.parametrize(
    ("name", "value"), [("max_concurrency", 0), ("max_concurrency", True), ("estimate_timeout_s", -1.0)]
)
def test_bad_limits_are_named(name: str, value: object) -> None:
    with pytest.raises(SettingsError, match=name):
        Gate(policy="balanced", **{name: value})  # type: ignore[arg-type]


@pytest.mark.slow
def test_an_estimate_past_its_deadline_never_aborts_the_process_at_exit() -> None:
    """The late estimate is still in torch's forward pass when the script ends: a daemon worker
    killed there aborted the process ("terminate called without an active exception")."""
    import subprocess
    import sys

    script = (
        "import capgate\n"
        "gate = capgate.Gate(estimator=capgate.load_estimator('default'), estimate_timeout_s=0.05)\n"
        "print(gate.assess('Calculate 62 - 10 = ' * 30).decision.degraded)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert "terminate called" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"  # the deadline did pass: degraded
