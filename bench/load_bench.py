"""Load and server faults: how much concurrency the gate holds and which faults it survives.

**Load.** A coroutine function guarded by ``capgate.guard`` (the async ``Gate``: estimate →
decide → log → act; the function itself returns at once, so the figures are the gate's) is called
``--calls`` times (default: the level, at least 8) with 1, 16, 64 and 256 calls in flight
(``--levels``), on real held-out questions, for each estimator: the local probe (embedded
SmolLM2-135M-Instruct + shipped probe; ``--torch-threads``, default 1: on a shared CPU
torch's spinning OpenMP threads made it 10x slower) and, against an OpenAI-compatible server (the CI's vLLM
CPU server), verbalized confidence and P(True). The gate caps its own estimates in flight
(``max_concurrency``, ``--gate-concurrency``): a burst queues; ``estimate_timeout_s``
(``--deadline``) bounds each call's estimate, queue included, and a late one is a degraded
decision naming the deadline. Per level: throughput, p50/p99 gate latency (call to return), the
share of degraded decisions, and the decision log's rows against the calls (a missing row, a call
that raised or did not return within deadline + ``SLACK_S``, is *lost*).

**Faults.** The same guarded function, over the verbalized estimator, against the fault-injection
server of ``tests/_fault_server.py``: 429 with ``Retry-After`` (retries must wait as asked, all
calls then succeed), 500 (all degraded; the circuit breaker must open and say so in the logged
reasons; requests sent are counted against what retrying every call would have sent), hangs past
the request time-out, truncated JSON bodies, a slow drip (each read within the client's read
time-out, the body far past the gate's deadline), and an outage followed by recovery (calls
after it succeed). With a vLLM server started by ``scripts/vllm-server.sh`` (``--vllm-state-dir``)
the server is killed (SIGKILL, its process group) mid-run and restarted on the same port: calls
during the outage degrade, with their reasons; calls after the restart succeed. A fault is
*survived* when every call returned within its deadline, every decision is in the log, every
degraded decision carries a reason and the policy's ``on_degraded`` action, and the fault's own
expectation holds.

Run: ``python bench/load_bench.py [--vllm-url URL --served-model NAME | --vllm-state-dir DIR]
[--levels 1,16,64,256] [--calls N] [--estimators probe,verbalized,ptrue] [--no-faults]
[--no-restart] [--no-report] [--coalesce-sweep] [--no-gc | --only-gc | --only-modes]``. Prints its tables,
rewrites the load, faults and gc sections of bench/RELIABILITY.md (*gc*: the probe's shadow
rounds untuned, after ``capgate.tune_process()`` and untuned again, side by side in one process;
with ``--coalesce-sweep``, the coalescer section too: the probe at ``--sweep-level`` calls in
flight for each coalescer window and maximum batch), and ends with
``reliability: N calls, C concurrent max, p99 L s, degraded D%, lost 0; faults survived F/F``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fault-injection server
sys.path.insert(0, str(REPO / "bench"))

from _fault_server import Drip, FaultServer, Hang, Raw, Reply, chat_completion  # noqa: E402
from _loop_watch import LoopWatch, Stall  # noqa: E402
from _report import machine, update_section  # noqa: E402

from capgate import Gate, guard, load_policy  # noqa: E402
from capgate.adapters.backends.openai import OpenAIBackend  # noqa: E402
from capgate.core.backend import SamplingParams  # noqa: E402
from capgate.decision import DecisionLog  # noqa: E402
from capgate.demo.live import demo_questions  # noqa: E402
from capgate.estimators import PTrue, VerbalizedConfidence  # noqa: E402
from capgate.estimators.base import CapabilityEstimator  # noqa: E402

POLICY = load_policy("balanced")
ON_DEGRADED = POLICY.on_degraded.action
SLACK_S = 2.0
"""How long past its deadline a call may take to return (deciding and logging, on a loaded CPU)."""
DELAY_S = 0.05
"""In shadow mode, a call that returns this much later than the function's own time counts as
delayed by the gate (#36's definition: capgate added more than 50 ms)."""
STALL_S = 0.03
"""The loop watch records every stretch longer than this in which the event loop did not run."""
SUMMARY_NOTE = (
    "Calls: every gated call the load and fault runs made; p99 and degraded: the load runs only "
    "(degraded includes estimates that missed the gate's deadline on this CPU server); lost: calls "
    "that raised, did not return or left no row in the decision log, over all runs."
)
ROW = "{:<12} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9} {:>6} {:>5}"


@dataclass
class Run:
    """What one batch of gated calls did."""

    name: str
    level: int
    calls: int
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    rows: int = 0
    degraded: int = 0
    lost: int = 0
    late: int = 0
    unreasoned: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    mode: str = "enforce"
    call_s: float = 0.0  # what the gated function itself takes
    discarded: int = 0  # speculative: calls started with their estimate whose result was dropped
    windows: list[tuple[float, float]] = field(default_factory=list)  # each returned call: start, end
    collections: list[tuple[float, float]] = field(default_factory=list)  # full GCs during the run
    stalls: list[Stall] = field(default_factory=list)  # the event loop's stalls over STALL_S

    @property
    def delays(self) -> list[float]:
        """What the gate added to each returned call: its latency less the function's own time."""
        return [max(0.0, x - self.call_s) for x in self.latencies]

    def _in_gc(self, start: float, end: float) -> float:
        """How long the process stood still in full garbage collections within ``start``-``end``."""
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self.collections)

    @property
    def delayed(self) -> int:
        """Calls the gate held more than ``DELAY_S`` beyond the function's own time, not counting
        the time the whole process stood still in a full garbage collection (see :attr:`held_by_gc`)."""
        return sum(d - self._in_gc(*w) > DELAY_S for d, w in zip(self.delays, self.windows, strict=True))

    @property
    def held_by_gc(self) -> int:
        """Calls over ``DELAY_S`` only because a full garbage collection of the process (every
        coroutine and thread held, gated or not) fell inside them."""
        return sum(d > DELAY_S for d in self.delays) - self.delayed

    @property
    def longest_gc(self) -> float:
        return max((b - a for a, b in self.collections), default=0.0)

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")

    @property
    def p99(self) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    @property
    def sound(self) -> bool:
        """Nothing lost or late, every degraded decision with its reason and fail-safe action."""
        return self.lost == 0 and self.late == 0 and self.unreasoned == 0 and self.rows == self.calls

    def line(self) -> str:
        return ROW.format(
            self.name,
            self.level,
            self.calls,
            f"{self.calls / self.wall_s:.1f}" if self.wall_s else "-",
            f"{self.p50:.2f}",
            f"{self.p99:.2f}",
            f"{100 * self.degraded / max(self.calls, 1):.0f}%",
            self.rows,
            self.lost,
        )


def _reason_kind(reason: str) -> str:
    for needle, kind in (
        ("circuit open", "circuit open"),
        ("estimate_timeout_s", "gate deadline"),
        ("timed out", "request time-out"),
        ("could not reach", "unreachable"),
        ("HTTP 5", "HTTP 5xx"),
        ("HTTP 429", "HTTP 429"),
        ("malformed", "malformed body"),
        ("no usable", "unparsable reply"),
    ):
        if needle in reason:
            return kind
    return "other"


class FullCollections:
    """Records when the interpreter runs a full (generation 2) garbage collection: it stops every
    thread and coroutine of the process for as long as it takes to walk every object it holds."""

    def __init__(self, into: list[tuple[float, float]]) -> None:
        self.into = into
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.monotonic()
        else:
            self.into.append((self._started, time.monotonic()))

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def gated_calls(
    name: str,
    estimator: CapabilityEstimator,
    prompts: list[str],
    *,
    level: int,
    deadline: float,
    gate_concurrency: int,
    folder: Path,
    mode: str = "enforce",
    call_s: float = 0.0,
) -> Run:
    """``len(prompts)`` calls of a guarded coroutine function, ``level`` in flight at once.

    ``mode``: ``"enforce"``, ``"shadow"`` (the gate decides beside each call) or ``"speculative"``
    (enforce, the call started with its estimate); ``call_s``: what the function itself takes."""
    log_path = folder / f"{name}-{mode}-{level}-{time.monotonic_ns()}.sqlite3"
    gate = Gate(
        policy=POLICY,
        estimator=estimator,
        log=log_path,
        max_concurrency=gate_concurrency,
        estimate_timeout_s=deadline,
        mode="shadow" if mode == "shadow" else "enforce",
        speculative=mode == "speculative",
    )

    @guard(gate=gate)
    async def ask(prompt: str) -> str:
        if call_s:
            await asyncio.sleep(call_s)
        return "answered"

    run = Run(name=name, level=level, calls=len(prompts), mode=mode, call_s=call_s)
    in_flight = asyncio.Semaphore(level)

    async def one(prompt: str) -> None:
        async with in_flight:
            start = time.monotonic()
            try:
                await asyncio.wait_for(ask(prompt), deadline + SLACK_S * 5)
            except Exception as exc:  # a call that raised or hung: lost
                run.lost += 1
                run.reasons[f"lost: {type(exc).__name__}"] += 1
                return
            end = time.monotonic()
            elapsed = end - start
            run.latencies.append(elapsed)
            run.windows.append((start, end))
            run.late += int(elapsed > deadline + SLACK_S)

    gc.collect()  # the previous run's garbage is not this run's (pyperf collects between runs too)
    start = time.monotonic()
    with FullCollections(run.collections):
        async with LoopWatch(STALL_S) as watch:
            await asyncio.gather(*(one(p) for p in prompts))
    run.stalls = watch.stalls
    run.wall_s = time.monotonic() - start
    if mode == "shadow":
        await gate.aflush()  # the decisions made beside the calls are logged when they are done
    with DecisionLog(log_path) as log:
        run.rows = log.count()
        for row in log.decisions():
            decision = row.decision
            run.actions[decision.action] += 1
            if decision.speculation is not None and decision.action != "answer":
                run.discarded += 1
            if decision.degraded:
                run.degraded += 1
                reason = decision.estimate.reason or ""
                run.reasons[_reason_kind(reason)] += 1
                run.unreasoned += int(not reason or decision.action != ON_DEGRADED)
    run.lost += max(0, run.calls - run.rows - run.lost)
    return run


# ------------------------------------------------------------------------------------------ load


@functools.cache
def _held_out() -> tuple[str, ...]:
    """The first 64 held-out questions' prompts (read once: each read parses the shipped labels)."""
    return tuple(q.prompt for q in demo_questions(64, seed=1))


def prompts_for(n: int) -> list[str]:
    """``n`` distinct prompts: held-out questions, numbered past the first 64."""
    pool = _held_out()
    return [pool[i % len(pool)] + ("" if i < len(pool) else f" (#{i})") for i in range(n)]


def estimators(args: argparse.Namespace) -> dict[str, Callable[[], CapabilityEstimator]]:
    chosen = args.estimators.split(",")
    found: dict[str, Callable[[], CapabilityEstimator]] = {}
    if "probe" in chosen:
        import capgate

        if args.torch_threads:
            import torch

            torch.set_num_threads(args.torch_threads)
        model, probe = getattr(args, "model", None) or "default", getattr(args, "probe", None)
        found["probe"] = lambda: capgate.load_estimator(model, probe=probe)
    if args.vllm_url:

        def backend() -> OpenAIBackend:
            return OpenAIBackend(
                args.served_model,
                base_url=args.vllm_url,
                timeout=args.deadline,
                max_retries=1,
                max_concurrency=args.gate_concurrency,
            )

        if "verbalized" in chosen:
            params = SamplingParams(temperature=0.0, max_tokens=16)
            found["verbalized"] = lambda: VerbalizedConfidence(backend(), params=params, max_tries=1)
        if "ptrue" in chosen:
            found["ptrue"] = lambda: PTrue(backend())
    elif {"verbalized", "ptrue"} & set(chosen):
        print("note: no --vllm-url/--vllm-state-dir: verbalized and P(True) are not measured")
    return found


def coalesce_sweep(args: argparse.Namespace, folder: Path) -> list[tuple[float, int, Run]]:
    """The probe at ``--sweep-level`` calls in flight for each coalescer window and maximum batch."""
    import capgate

    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    estimator = capgate.load_estimator("default")
    coalescer = estimator.featurizer._coalescer
    level = args.sweep_level
    print(
        f"coalescer sweep: probe ({estimator.featurizer.dtype}), {level} calls in flight, {level * 2} calls"
    )
    print(ROW.format("window/max", "level", "calls", "calls/s", "p50 s", "p99 s", "degraded", "rows", "lost"))
    results: list[tuple[float, int, Run]] = []
    for window in args.sweep_windows:
        for max_batch in args.sweep_max_batches:
            coalescer.window_s, coalescer.max_batch = window, max_batch
            run = asyncio.run(
                gated_calls(f"{window * 1e3:g}ms/{max_batch}", estimator, prompts_for(level * 2), level=level,
                            deadline=args.deadline, gate_concurrency=args.gate_concurrency, folder=folder)
            )  # fmt: skip
            print(run.line(), flush=True)
            results.append((window, max_batch, run))
    return results


def sweep_report(args: argparse.Namespace, sweep: list[tuple[float, int, Run]], started: str) -> str:
    lines = [
        "## Coalescer",
        "",
        f'Method: `bench/load_bench.py --coalesce-sweep`: the probe (`load_estimator("default")`) behind the '
        f"gate (`max_concurrency={args.gate_concurrency}`, `estimate_timeout_s={args.deadline:g}`), "
        f"{args.sweep_level} calls in flight, {args.sweep_level * 2} calls per setting of the coalescer "
        f"(`capgate.local._coalesce`: window under load, most items per batch). Machine: {started}.",
        "",
        "| window | max batch | calls/s | p50 s | p99 s | degraded |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for window, max_batch, r in sweep:
        lines.append(
            f"| {window * 1e3:g} ms | {max_batch} | {r.calls / r.wall_s:.1f} | {r.p50:.2f} | {r.p99:.2f} | "
            f"{100 * r.degraded / max(r.calls, 1):.0f}% |"
        )
    return "\n".join(lines)


def load_runs(args: argparse.Namespace, folder: Path) -> list[Run]:
    runs: list[Run] = []
    print(ROW.format("estimator", "level", "calls", "calls/s", "p50 s", "p99 s", "degraded", "rows", "lost"))
    for name, make in estimators(args).items():
        estimator = make()
        for level in args.levels:
            calls = args.calls or max(level, 8)
            run = asyncio.run(
                gated_calls(
                    name,
                    estimator,
                    prompts_for(calls),
                    level=level,
                    deadline=args.deadline,
                    gate_concurrency=args.gate_concurrency,
                    folder=folder,
                )
            )
            print(run.line(), flush=True)
            runs.append(run)
    return runs


# ------------------------------------------------------------------------------------------ faults

OK = Reply(chat_completion(["\\boxed{0.7}"]))


@dataclass
class Fault:
    """One fault scenario's outcome."""

    name: str
    runs: list[Run]
    expectation: str
    met: bool
    detail: str = ""

    @property
    def survived(self) -> bool:
        return self.met and all(r.sound for r in self.runs)


def _kinds(run: Run) -> str:
    return ", ".join(f"{k} {c}" for k, c in run.reasons.most_common()) or "none degraded"


def _fault_estimator(url: str, **backend: Any) -> VerbalizedConfidence:
    settings: dict[str, Any] = {"timeout": 2.0, "max_retries": 3, "backoff_initial": 0.05, "backoff_max": 5.0}
    settings.update(backend)
    be = OpenAIBackend("fault-model", base_url=url, max_concurrency=64, **settings)
    return VerbalizedConfidence(be, max_tries=1, structured=False)


def _fault_calls(name: str, estimator: CapabilityEstimator, args: argparse.Namespace, folder: Path) -> Run:
    n = args.fault_calls
    return asyncio.run(
        gated_calls(
            name,
            estimator,
            prompts_for(n),
            level=min(16, n),
            deadline=args.fault_deadline,
            gate_concurrency=args.gate_concurrency,
            folder=folder,
        )
    )


def fault_server_runs(args: argparse.Namespace, folder: Path) -> list[Fault]:
    faults: list[Fault] = []
    n = args.fault_calls

    first_seen: dict[str, float] = {}
    gaps: list[float] = []
    limited = Reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "1"})

    def rate_limited(body: dict[str, Any], i: int) -> Reply:
        key = json.dumps(body.get("messages"), sort_keys=True)  # one call's prompt
        now = time.monotonic()
        if key not in first_seen:
            first_seen[key] = now
            return limited
        gaps.append(now - first_seen[key])
        return OK

    with FaultServer(rate_limited) as server:
        run = _fault_calls("429", _fault_estimator(server.url), args, folder)
    gap = min(gaps) if gaps else 0.0
    faults.append(
        Fault("429 + Retry-After 1 s", [run], "no call degraded; each retry waited >= 1 s",
              run.degraded == 0 and gap >= 0.95 and len(gaps) == len(first_seen),
              f"shortest wait before a retry {gap:.2f} s; {_kinds(run)}")
    )  # fmt: skip

    down = Reply({"error": {"message": "engine overloaded"}}, status=500)
    with FaultServer(lambda body, i: down) as server:
        est = _fault_estimator(server.url, circuit_failures=5, circuit_cooldown_s=60.0)
        run = _fault_calls("500", est, args, folder)
        sent = len(server.requests)
    breaker = run.reasons["circuit open"]
    faults.append(
        Fault("HTTP 500 always", [run], "all degraded; the circuit opened and the log says so",
              run.degraded == n and breaker > 0,
              f"{sent} requests for {n} calls (retrying each: {n * 4}); {breaker} reasons 'circuit open'")
    )  # fmt: skip

    scenarios: list[tuple[str, Any, dict[str, Any], str]] = [
        ("hang past time-out", Hang(60), {"timeout": 0.5, "max_retries": 1}, "request time-out"),
        ("truncated JSON", Raw(b'{"choices": [{"index": 0, "mess', content_length=400), {}, "unreachable"),
        ("slow drip", Drip(OK.body, chunk=4, every=0.5), {"timeout": 30.0}, "gate deadline"),
    ]
    for name, action, backend, kind in scenarios:
        with FaultServer(lambda body, i, action=action: action) as server:
            run = _fault_calls(name, _fault_estimator(server.url, **backend), args, folder)
        kinds = ", ".join(f"{k} {c}" for k, c in run.reasons.most_common())
        faults.append(
            Fault(name, [run], f"all degraded, within the deadline ({kind} or circuit open)",
                  run.degraded == n, kinds)
        )  # fmt: skip

    state = {"down": True}
    with FaultServer(lambda body, i: down if state["down"] else OK) as server:
        est = _fault_estimator(server.url, circuit_failures=3, circuit_cooldown_s=1.0)
        during = _fault_calls("outage", est, args, folder)
        state["down"] = False
        time.sleep(1.2)  # the breaker's cooldown: its next attempt is the trial
        after = _fault_calls("recovered", est, args, folder)
    faults.append(
        Fault("outage, then recovery", [during, after], "degraded during; none degraded after",
              during.degraded == n and after.degraded == 0, f"after: {after.degraded}/{n} degraded")
    )  # fmt: skip
    return faults


# ------------------------------------------------------------------------------ shadow, speculative

MODE_CALL_S = 0.05
"""What the gated function takes in the shadow and speculative runs (a stand-in for the agent's call)."""


def mode_runs(args: argparse.Namespace, folder: Path) -> list[Run]:
    """The same gated function in shadow mode and speculative enforce mode, against the fault
    server (healthy, then each fault) and, with a vLLM server, at each level of load."""
    runs: list[Run] = []
    n = args.fault_calls
    scenarios: list[tuple[str, Any, dict[str, Any]]] = [
        ("healthy", OK, {}),
        ("HTTP 500", Reply({"error": {"message": "engine overloaded"}}, status=500), {}),
        ("hang", Hang(60), {"timeout": 0.5, "max_retries": 1}),
        ("truncated JSON", Raw(b'{"choices": [{"index": 0, "mess', content_length=400), {}),
        ("slow drip", Drip(OK.body, chunk=4, every=0.5), {"timeout": 30.0}),
    ]
    print(MODE_ROW.format("mode", "fault / load", "level", "calls", "p50 +s", "p99 +s", "p99 / f", "delayed",
                          "by GC", "GC s", "degraded", "rows", "lost", "discarded"))  # fmt: skip
    for mode in ("shadow", "speculative"):
        for name, action, backend in scenarios:
            with FaultServer(lambda body, i, action=action: action) as server:
                run = asyncio.run(
                    gated_calls(name, _fault_estimator(server.url, **backend), prompts_for(n),
                                level=min(16, n), deadline=args.fault_deadline,
                                gate_concurrency=args.gate_concurrency, folder=folder, mode=mode,
                                call_s=MODE_CALL_S)
                )  # fmt: skip
            print(_mode_line(run), flush=True)
            runs.append(run)
        for est_name, make in estimators(args).items():
            if est_name == "probe" and mode == "speculative":
                continue  # speculative gating is for a remote call whose estimate is a call of its own
            estimator = make()
            for level in args.levels:
                calls = args.calls or max(level, 8)
                run = asyncio.run(
                    gated_calls(f"{est_name} load", estimator, prompts_for(calls), level=level,
                                deadline=args.deadline, gate_concurrency=args.gate_concurrency,
                                folder=folder, mode=mode, call_s=MODE_CALL_S)
                )  # fmt: skip
                print(_mode_line(run), flush=True)
                runs.append(run)
    return runs


MODE_ROW = "{:<12} {:<16} {:>5} {:>5} {:>7} {:>7} {:>7} {:>7} {:>6} {:>7} {:>8} {:>5} {:>4} {:>9}"


def _mode_cells(r: Run) -> tuple[Any, ...]:
    delays = sorted(r.delays)
    p50 = statistics.median(delays) if delays else float("nan")
    p99 = delays[min(len(delays) - 1, round(0.99 * (len(delays) - 1)))] if delays else float("nan")
    shadow = r.mode == "shadow"  # enforce waits for its decision by design: no "delayed" there
    delayed, by_gc = (r.delayed, r.held_by_gc) if shadow else ("-", "-")
    ratio = f"{(r.call_s + p99) / r.call_s:.2f}x" if r.call_s and delays else "-"  # vs the ungated call
    return (r.mode, r.name, r.level, r.calls, f"{p50:.3f}", f"{p99:.3f}", ratio, delayed, by_gc,
            f"{r.longest_gc:.3f}", f"{100 * r.degraded / max(r.calls, 1):.0f}%", r.rows, r.lost,
            r.discarded)  # fmt: skip


def _mode_line(r: Run) -> str:
    stall = max(r.stalls, key=lambda s: s.seconds, default=None)
    return MODE_ROW.format(*_mode_cells(r)) + (f"   longest stall: {stall.cause()}" if stall else "")


def _stall_lines(runs: list[Run]) -> list[str]:
    """The longest loop stall of each shadow run at 64 in flight or more, or with a delayed call."""
    lines = []
    for r in runs:
        stall = max(r.stalls, key=lambda s: s.seconds, default=None)
        if r.mode == "shadow" and stall is not None and (r.level >= 64 or r.delayed):
            count = f"{len(r.stalls)} stalls over {1000 * STALL_S:.0f} ms"
            lines.append(f"- shadow, {r.name} at {r.level} in flight: {count}; longest: {stall.cause()}")
    return lines


def modes_report(args: argparse.Namespace, runs: list[Run], started: str) -> str:
    shadow = [r for r in runs if r.mode == "shadow"]
    sound = all(r.lost == 0 and r.rows == r.calls for r in runs)
    lines = [
        "## Shadow mode and speculative gating",
        "",
        f"Method: `bench/load_bench.py` (`mode_runs`); the gated coroutine takes {MODE_CALL_S:g} s; each run "
        f"starts after a `gc.collect()` (the previous run's garbage is not its own); "
        f"{args.fault_calls} calls per fault, 16 in flight, against the fault server (verbalized estimator, "
        f"gate deadline {args.fault_deadline:g} s), and each estimator at {args.levels} in flight "
        f"(deadline {args.deadline:g} s); vLLM server: {args.vllm_url or 'none'} "
        f"({args.served_model or '-'}). "
        f"'+s' is what the gate added to a call (its latency less the function's own time); *p99 / f*: "
        f"the call's p99 over the ungated function's own {MODE_CALL_S:g} s; a shadow call "
        f"is *delayed* when the gate added more than {DELAY_S:g} s, not counting the time the process stood "
        f"still in full garbage collections within the call; *by GC*: shadow calls over {DELAY_S:g} s only "
        f"because such a collection fell inside them (it holds every thread and coroutine, gated or not); "
        f"*GC s*: the longest full collection during the run (recorded by a `gc.callbacks` hook); "
        f"*discarded*: speculative calls whose result was dropped because the decision blocked. "
        f"Machine: {started}.",
        "",
        "| mode | fault / load | in flight | calls | p50 +s | p99 +s | p99 / f | delayed | by GC | GC s "
        "| degraded | log rows | lost | discarded |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += ["| " + " | ".join(str(c) for c in _mode_cells(r)) + " |" for r in runs]
    lines += [
        "",
        f"Shadow mode: {sum(r.calls for r in shadow)} calls, {sum(r.lost for r in shadow)} failed or lost, "
        f"{sum(r.delayed for r in shadow)} delayed by the gate, {sum(r.held_by_gc for r in shadow)} held "
        f"by a full garbage collection (longest {max((r.longest_gc for r in runs), default=0.0):.2f} s; the "
        f"process tracked {len(gc.get_objects()):,} objects at the end: torch, transformers, the clients "
        f"and the bench's own); decisions logged = calls in every run: {'yes' if sound else 'NO'}.",
    ]
    stalls = _stall_lines(runs)
    if stalls:
        lines += [
            "",
            f"Where the caller's event loop stood still (`bench/_loop_watch.py`: a ticker on the loop every "
            f"5 ms, a watchdog thread sampling the loop thread's stack while the ticker is over "
            f"{1000 * STALL_S:.0f} ms late; *process CPU*: the CPU time the whole process used during "
            f"the stall over its length, on {os.cpu_count()} cores; *GC*: collections of any generation "
            f"inside it):",
            "",
            *stalls,
        ]
    return "\n".join(lines)


GC_PHASES = ("untuned", "tune_process()", "untuned again")


@dataclass
class GcPhase:
    """One phase of the garbage-collection comparison: the same shadow rounds, one process setting."""

    label: str
    runs: list[Run]
    collections: list[tuple[float, float]]
    explicit_s: float  # one full collection run by hand at the end of the phase
    frozen: int  # objects kept out of collections (gc.get_freeze_count())

    def cells(self) -> tuple[Any, ...]:
        delays = sorted(d for r in self.runs for d in r.delays)
        p99 = delays[min(len(delays) - 1, round(0.99 * (len(delays) - 1)))] if delays else float("nan")
        took = [b - a for a, b in self.collections]
        return (
            self.label, f"{self.frozen:,}", sum(r.calls for r in self.runs), len(took),
            f"{max(took, default=0.0):.3f}", f"{sum(took):.2f}", f"{self.explicit_s:.3f}", f"{p99:.3f}",
            sum(r.delayed for r in self.runs), sum(r.held_by_gc for r in self.runs),
        )  # fmt: skip


def gc_tuning_runs(args: argparse.Namespace, folder: Path) -> list[GcPhase]:
    """The probe in shadow mode, ``--gc-rounds`` rounds of ``--gc-level`` calls in flight, three
    times in one process: untuned, after ``capgate.tune_process()``, then untuned again
    (``gc.unfreeze()``), so that a drift of the machine shows as a difference between the first
    and the last."""
    import capgate

    estimator = estimators(args)["probe"]()
    phases: list[GcPhase] = []
    for label in GC_PHASES:
        if label == "tune_process()":
            capgate.tune_process()
        elif label == "untuned again":
            gc.unfreeze()
        collections: list[tuple[float, float]] = []
        runs: list[Run] = []
        with FullCollections(collections):
            for round_ in range(args.gc_rounds):
                runs.append(asyncio.run(
                    gated_calls(f"probe gc {label} {round_}", estimator, prompts_for(args.gc_level),
                                level=args.gc_level, deadline=args.deadline,
                                gate_concurrency=args.gate_concurrency, folder=folder, mode="shadow",
                                call_s=MODE_CALL_S)
                ))  # fmt: skip
        started = time.perf_counter()
        gc.collect()
        phase = GcPhase(label, runs, collections, time.perf_counter() - started, gc.get_freeze_count())
        print(GC_ROW.format(*phase.cells()), flush=True)
        phases.append(phase)
    return phases


GC_ROW = "{:<14} {:>9} {:>6} {:>5} {:>8} {:>7} {:>9} {:>7} {:>7} {:>6}"


def gc_report(args: argparse.Namespace, phases: list[GcPhase], started: str) -> str:
    lines = [
        "## Garbage collections: `capgate.tune_process()` (issue 36)",
        "",
        f"Method: `bench/load_bench.py` (`gc_tuning_runs`): the probe gate in shadow mode, "
        f"{args.gc_rounds} rounds of {args.gc_level} calls in flight (the gated coroutine takes "
        f"{MODE_CALL_S:g} s), three times in one process: untuned; after `capgate.tune_process()` "
        f"(`gc.freeze()` of everything loaded); untuned again after `gc.unfreeze()`. *full GCs*: the "
        f"interpreter's own generation-2 collections during the rounds (a `gc.callbacks` hook), "
        f"the longest and their total; *one by hand*: a `gc.collect()` after the rounds; *p99 +s*: "
        f"what the gate added to a call; *delayed* and *by GC* as in the modes table. Machine: {started}.",
        "",
        "| process | objects frozen | calls | full GCs | longest s | total s | one by hand s | p99 +s "
        "| delayed | by GC |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += ["| " + " | ".join(str(c) for c in phase.cells()) + " |" for phase in phases]
    return "\n".join(lines)


def vllm_restart_run(args: argparse.Namespace, folder: Path) -> Fault:
    state = Path(args.vllm_state_dir)
    pid = int((state / "pid").read_text())
    port = args.vllm_url.rsplit(":", 1)[1].split("/")[0]
    model_dir = (
        subprocess.run(
            [str(REPO / ".venv/bin/capgate"), "model", "prepare", "default"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    backend = OpenAIBackend(args.served_model, base_url=args.vllm_url, timeout=args.deadline, max_retries=1,
                            circuit_failures=3, circuit_cooldown_s=3.0)  # fmt: skip
    estimator = PTrue(backend)
    n = 8

    def calls(name: str) -> Run:
        return asyncio.run(
            gated_calls(name, estimator, prompts_for(n), level=n, deadline=args.deadline,
                        gate_concurrency=args.gate_concurrency, folder=folder)
        )  # fmt: skip

    before = calls("vllm up")
    os.killpg(pid, signal.SIGKILL)  # the server this bench's caller started (scripts/vllm-server.sh)
    time.sleep(1.0)
    during = [calls("vllm killed")]
    env = {**os.environ, "CAPGATE_VLLM_STATE_DIR": str(state), "CAPGATE_VLLM_PORT": port}
    restart = subprocess.Popen(
        ["bash", str(REPO / "scripts/vllm-server.sh"), "start", model_dir],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    started = time.monotonic()
    while restart.poll() is None:
        during.append(calls("vllm restarting"))
        time.sleep(5.0)
    if restart.returncode != 0:
        why = (restart.stderr.read() if restart.stderr else "")[-300:]
        return Fault("vLLM killed + restarted", [before, *during], "restart", False, f"restart failed: {why}")
    restarted_s = time.monotonic() - started
    time.sleep(3.5)  # the breaker's cooldown
    after = calls("vllm back")
    killed = during[0]  # the wave right after the kill; later waves may meet the server back up
    calls_during = sum(r.calls for r in during)
    answered_during = calls_during - sum(r.degraded for r in during)
    kinds = Counter[str]()
    for r in during:
        kinds.update(r.reasons)
    return Fault(
        "vLLM killed + restarted",
        [before, *during, after],
        "degraded while down; none degraded after the restart",
        killed.degraded == killed.calls and after.degraded == 0,
        f"restart took {restarted_s:.0f} s; {calls_during} calls meanwhile ({answered_during} answered once "
        "the server was up again), degraded: "
        + ", ".join(f"{k} {c}" for k, c in kinds.most_common())
        + f"; after: {after.degraded}/{after.calls} degraded"
        + f" (before the kill: {before.degraded}/{before.calls})",
    )


# ------------------------------------------------------------------------------------------ report


def report(args: argparse.Namespace, runs: list[Run], faults: list[Fault], started: str) -> tuple[str, str]:
    lines = [
        "## Load",
        "",
        f"Method: `bench/load_bench.py` (see its docstring); gate `max_concurrency={args.gate_concurrency}`, "
        f"`estimate_timeout_s={args.deadline:g}`; policy `balanced` (on_degraded: {ON_DEGRADED}); "
        f"vLLM server: {args.vllm_url or 'none'} ({args.served_model or '-'}). Machine: {started}.",
        "",
        "| estimator | in flight | calls | calls/s | p50 s | p99 s | degraded | log rows | lost |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        lines.append(
            f"| {r.name} | {r.level} | {r.calls} | {r.calls / r.wall_s:.1f} | {r.p50:.2f} | {r.p99:.2f} | "
            f"{100 * r.degraded / max(r.calls, 1):.0f}% | {r.rows} | {r.lost} |"
        )
    why = Counter[str]()
    for r in runs:
        why.update(r.reasons)
    lines += ["", "Degraded by reason: " + (", ".join(f"{k} {c}" for k, c in why.most_common()) or "none")]
    fault_lines = [
        "## Faults",
        "",
        f"Method: `bench/load_bench.py`; {args.fault_calls} calls per fault, 16 in flight, gate deadline "
        f"{args.fault_deadline:g} s (+{SLACK_S:g} s slack to return). Machine: {started}.",
        "",
        "| fault | calls | degraded | p99 s | log rows | lost | expectation | survived | detail |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for f in faults:
        calls = sum(r.calls for r in f.runs)
        p99 = max(r.p99 for r in f.runs)
        degraded, rows, lost = (sum(getattr(r, k) for r in f.runs) for k in ("degraded", "rows", "lost"))
        fault_lines.append(
            f"| {f.name} | {calls} | {degraded} | {p99:.2f} | {rows} | {lost} | {f.expectation} "
            f"| {'yes' if f.survived else 'NO'} | {f.detail} |"
        )
    return "\n".join(lines), "\n".join(fault_lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-url", default=os.environ.get("CAPGATE_TEST_VLLM_URL"))
    parser.add_argument("--served-model", default=os.environ.get("CAPGATE_TEST_VLLM_MODEL"))
    parser.add_argument("--vllm-state-dir", help="state folder of scripts/vllm-server.sh (url, model, pid)")
    parser.add_argument("--levels", default="1,16,64,256", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--calls", type=int, default=0, help="calls per level (default: the level, >= 8)")
    parser.add_argument("--estimators", default="probe,verbalized,ptrue")
    parser.add_argument("--gate-concurrency", type=int, default=8)
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch threads for the probe (0: torch's default)"
    )
    parser.add_argument("--deadline", type=float, default=30.0, help="gate estimate_timeout_s, load runs")
    parser.add_argument("--fault-calls", type=int, default=32)
    parser.add_argument("--fault-deadline", type=float, default=5.0)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--no-modes", action="store_true", help="skip the shadow and speculative runs")
    parser.add_argument(
        "--only-modes", action="store_true", help="run only the shadow and speculative runs (their section)"
    )
    parser.add_argument("--no-restart", action="store_true", help="skip the vLLM kill + restart run")
    parser.add_argument("--no-report", action="store_true", help="do not rewrite bench/RELIABILITY.md")
    parser.add_argument("--gc-rounds", type=int, default=4, help="shadow rounds per phase, GC comparison")
    parser.add_argument("--gc-level", type=int, default=64, help="calls in flight in the GC comparison")
    parser.add_argument("--no-gc", action="store_true", help="skip the tune_process() comparison")
    parser.add_argument(
        "--only-gc", action="store_true", help="run only the tune_process() comparison (its section alone)"
    )
    parser.add_argument(
        "--coalesce-sweep", action="store_true", help="also sweep the probe's coalescer window and max batch"
    )
    parser.add_argument("--sweep-level", type=int, default=16, help="calls in flight in the sweep")
    parser.add_argument(
        "--sweep-windows", default="0,0.005,0.02", type=lambda s: [float(x) for x in s.split(",")]
    )
    parser.add_argument("--sweep-max-batches", default="8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: levels 1 and 4, 2 calls each, a tiny model and probe, the reports to a temporary "
        "folder (a test runs it)",
    )
    args = parser.parse_args()
    if args.smoke:
        import contextlib

        from _smoke import left_out, openai_server, smoke_dir, tiny_model, tiny_probe

        args.smoke_dir = smoke_dir("load")
        args.model = tiny_model(args.smoke_dir)
        args.probe = tiny_probe(args.model, args.smoke_dir)
        args.levels, args.calls, args.fault_calls, args.fault_deadline = [1, 4], 2, 2, 1.5
        args.no_restart, args.coalesce_sweep, args.sweep_level = True, True, 2
        args.sweep_windows, args.sweep_max_batches = [0.005], [8]
        args.gc_rounds, args.gc_level = 1, 4
        left_out("the embedded model and shipped probe (a tiny model and probe), the vLLM kill + restart run")
        with contextlib.ExitStack() as stack:
            if not args.vllm_url:
                args.vllm_url, args.served_model = stack.enter_context(openai_server())
            run(args)
        return
    run(args)


T = TypeVar("T")


def _one_section(
    args: argparse.Namespace,
    name: str,
    runs: Callable[[Path], list[T]],
    report_of: Callable[[argparse.Namespace, list[T], str], str],
    started: str,
) -> list[T]:
    """Run one section's runs alone and rewrite only that section (``--only-modes``, ``--only-gc``)."""
    with tempfile.TemporaryDirectory() as tmp:
        done = runs(Path(tmp))
    text = report_of(args, done, started)
    if getattr(args, "smoke_dir", None):
        (args.smoke_dir / "RELIABILITY.md").write_text(text + "\n")
    elif not args.no_report:
        update_section(name, text)
    return done


def run(args: argparse.Namespace) -> None:
    if args.vllm_state_dir and not args.vllm_url:
        state = Path(args.vllm_state_dir)
        args.vllm_url = (state / "url").read_text().strip()
        args.served_model = (state / "model").read_text().strip()
    started = machine()
    print(f"machine: {started}")
    if args.only_modes:
        modes = _one_section(args, "modes", lambda folder: mode_runs(args, folder), modes_report, started)
        print(
            f"reliability: modes only, {sum(r.calls for r in modes)} calls, lost {sum(r.lost for r in modes)}"
        )
        return
    if args.only_gc:
        phases = _one_section(args, "gc", lambda folder: gc_tuning_runs(args, folder), gc_report, started)
        print(f"reliability: gc only, {sum(r.calls for p in phases for r in p.runs)} calls")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sweep = coalesce_sweep(args, folder) if args.coalesce_sweep else []
        runs = load_runs(args, folder)
        faults: list[Fault] = []
        if not args.no_faults:
            faults = fault_server_runs(args, folder)
            if args.vllm_state_dir and not args.no_restart:
                faults.append(vllm_restart_run(args, folder))
            print()
            for f in faults:
                print(f"fault {f.name:<24} survived={'yes' if f.survived else 'NO '}  {f.detail}")
        modes: list[Run] = [] if args.no_modes else mode_runs(args, folder)
        phases: list[GcPhase] = [] if args.no_gc else gc_tuning_runs(args, folder)
    every = runs + [r for f in faults for r in f.runs] + modes
    latencies = sorted(x for r in runs for x in r.latencies)
    p99 = (
        latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))] if latencies else float("nan")
    )
    total = sum(r.calls for r in runs)
    degraded = 100 * sum(r.degraded for r in runs) / max(total, 1)
    lost = sum(r.lost for r in every)
    survived = sum(f.survived for f in faults)
    summary = (
        f"reliability: {sum(r.calls for r in every)} calls, {max(args.levels)} concurrent max, "
        f"p99 {p99:.2f} s, degraded {degraded:.0f}%, lost {lost}; faults survived {survived}/{len(faults)}"
    )
    if getattr(args, "smoke_dir", None):  # the sections it would write, in the temporary folder
        load_text, fault_text = report(args, runs, faults, started)
        sections = [
            load_text,
            fault_text,
            sweep_report(args, sweep, started),
            modes_report(args, modes, started),
            gc_report(args, phases, started),
        ]
        (args.smoke_dir / "RELIABILITY.md").write_text("\n\n".join([summary, *sections]) + "\n")
    elif not args.no_report:
        load_text, fault_text = report(args, runs, faults, started)
        update_section("summary", f"`{summary}`\n\n{SUMMARY_NOTE}")
        update_section("load", load_text)
        if faults:
            update_section("faults", fault_text)
        if sweep:
            update_section("coalescer", sweep_report(args, sweep, started))
        if modes:
            update_section("modes", modes_report(args, modes, started))
        if phases:
            update_section("gc", gc_report(args, phases, started))
    print(summary)


if __name__ == "__main__":
    main()
