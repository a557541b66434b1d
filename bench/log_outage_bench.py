"""A decision log that stops answering under load: which gates wait, and what is lost (issue 36).

Setup: one process, two gates, each kept at ``--in-flight`` async calls at once for the whole run;
one logs to a real PostgreSQL server (``DecisionLog(url, timeout_s=2)``, ``--timeout-s``), the other
to a SQLite file. The gated function awaits 20 ms (a model call); the estimator is a fixed async
estimate, so what a call costs beyond 20 ms is the gate's, its log's included. After ``--pause-s`` seconds the
PostgreSQL server is **paused**: SIGSTOP to the postmaster and every backend (a frozen host, not a
refused connection), then SIGCONT ``--pause-s`` later; calls go on for ``--pause-s`` more.

Measured: per gate and phase (by when the call started: before, paused, after), calls and the
gated call's latency (p50, p99, max) beside the ungated function's own 20 ms; then decisions: calls
made, in each log once the writers drained, kept in the spill file, lost (calls minus both).
The server is this bench's own (``scripts/postgres-server.sh``, a throwaway data folder), so
pausing it disturbs nothing else. ``--smoke``: 2 in flight, a 1 s pause, ``timeout_s`` 0.3 s (so
writes fail and spill), every step the same.
Writes the *log outage* section of bench/RELIABILITY.md (not with ``--smoke``).

Run: ``.venv/bin/python bench/log_outage_bench.py`` (needs Debian's ``postgresql`` package).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _pg_server import ThrowawayPostgres
from _report import machine, update_section
from _smoke import smoke_dir

from capgate import Estimate, Gate, guard
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator
from capgate.gate._limits import log_key, log_writer

CALL_S = 0.02


class Fixed(CapabilityEstimator):
    """A fixed async estimate: the bench measures the log, not an estimator."""

    method = "fixed"

    def estimate(self, queries: Sequence[Any]) -> list[Estimate]:
        return [Estimate(p=0.9, method=self.method) for _ in queries]

    async def aestimate(self, queries: Sequence[Any]) -> list[Estimate]:
        return self.estimate(queries)


@dataclass
class Calls:
    """One gate's calls: (start, latency) each, relative to the run's start."""

    name: str
    log: DecisionLog
    gate: Gate
    done: list[tuple[float, float]] = field(default_factory=list)


class Server:
    """This bench's own PostgreSQL server (scripts/postgres-server.sh), paused and resumed by signal."""

    def __init__(self) -> None:
        self.server = ThrowawayPostgres("capgate-pg-outage-")
        try:
            self.url = self.server.start()
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None

    def pids(self) -> list[int]:
        """The postmaster and its children (the backends and background workers)."""
        postmaster = int((self.server.state / "data" / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [postmaster, *map(int, children)]

    def signal(self, signum: int) -> int:
        pids = self.pids()
        for pid in pids:
            os.kill(pid, signum)
        return len(pids)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)  # a stopped server cannot shut down
        self.server.stop()


async def keep_busy(calls: Calls, in_flight: int, until: float, t0: float) -> None:
    @guard(gate=calls.gate)
    async def ask(prompt: str) -> str:
        await asyncio.sleep(CALL_S)
        return "42"

    async def worker(w: int) -> None:
        i = 0
        while time.monotonic() < until:
            start = time.monotonic()
            await ask(f"{calls.name} worker {w} call {i}")
            calls.done.append((start - t0, time.monotonic() - start))
            i += 1

    await asyncio.gather(*(worker(w) for w in range(in_flight)))


def phase_rows(calls: Calls, pause_at: float, resume_at: float) -> list[str]:
    rows = []
    for phase, low, high in (
        ("before", 0.0, pause_at),
        ("paused", pause_at, resume_at),
        ("after", resume_at, 1e9),
    ):
        took = sorted(lat for start, lat in calls.done if low <= start < high)
        if not took:
            rows.append(f"| {calls.name} | {phase} | 0 | - | - | - | - |")
            continue
        p50 = statistics.median(took)
        p99 = took[min(len(took) - 1, int(0.99 * len(took)))]
        rows.append(
            f"| {calls.name} | {phase} | {len(took)} | {p50 * 1000:.0f} | {p99 * 1000:.0f} | "
            f"{took[-1] * 1000:.0f} | {p99 / CALL_S:.1f}x |"
        )
    return rows


def drain(log: DecisionLog, within_s: float = 300.0) -> None:
    """Wait until the log's writer holds nothing and its spill file is written back (the replay
    goes in batches, each queued behind the writes that came meanwhile)."""
    writer = log_writer(log_key(log))
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        writer.submit(lambda: None).result(timeout=within_s)
        if writer.pending == 0 and not (log.spill is not None and log.spill.pending()):
            return
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--pause-s", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="The PostgreSQL log's timeout_s.")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.in_flight, args.pause_s, args.timeout_s = 2, 1.0, 0.3
    folder = smoke_dir("log_outage") if args.smoke else Path(tempfile.mkdtemp(prefix="capgate-outage-"))
    started_at = machine()
    server = Server()
    try:
        pg_log = DecisionLog(server.url, timeout_s=args.timeout_s, spill=folder / "pg.spill.jsonl")
        sqlite_log = DecisionLog(folder / "log.sqlite3")
        gates = [
            Calls("PostgreSQL", pg_log, Gate(policy="balanced", estimator=Fixed(), log=pg_log)),
            Calls("SQLite", sqlite_log, Gate(policy="balanced", estimator=Fixed(), log=sqlite_log)),
        ]
        pg_log.count()  # connect and create the tables before the clock starts

        async def run() -> tuple[float, float, float]:
            t0 = time.monotonic()
            until = t0 + 3 * args.pause_s
            load = asyncio.gather(*(keep_busy(c, args.in_flight, until, t0) for c in gates))
            await asyncio.sleep(args.pause_s)
            pause_at = time.monotonic() - t0
            stopped = server.signal(signal.SIGSTOP)
            await asyncio.sleep(args.pause_s)
            server.signal(signal.SIGCONT)
            resume_at = time.monotonic() - t0
            print(
                f"paused {stopped} PostgreSQL processes from {pause_at:.2f} s to {resume_at:.2f} s",
                flush=True,
            )
            await load
            return pause_at, resume_at, t0

        pause_at, resume_at, t0 = asyncio.run(run())
        for c in gates:
            c.gate.flush(120)
            drain(c.log)
        settled = time.monotonic() - t0
        lines = [
            f"log outage: {args.in_flight} async calls in flight per gate, PostgreSQL paused "
            f"{args.pause_s:g} s (SIGSTOP) under load, its log's timeout_s {args.timeout_s:g} s; the "
            f"ungated call takes {CALL_S * 1000:.0f} ms",
            "",
            "| gate's log | phase | calls | p50 ms | p99 ms | max ms | p99 / ungated |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in gates:
            lines += phase_rows(c, pause_at, resume_at)
        lines += [
            "",
            "| gate's log | calls | in the log | kept in spill file | lost | failed writes counted |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lost_total = 0
        for c in gates:
            logged = c.log.count()
            kept = len(c.log.spill.read()) if c.log.spill is not None else 0
            if c.log.spill is not None and c.log.spill.replaying_path.exists():
                kept += len(c.log.spill.read(c.log.spill.replaying_path))
            lost = len(c.done) - logged - kept
            lost_total += lost
            lines.append(
                f"| {c.name} | {len(c.done)} | {logged} | {kept} | {lost} | {c.gate.stats.log_failures} |"
            )
        lines.append("")
        lines.append(
            f"every log's writer drained, spill files written back, {settled - resume_at:.1f} s after the "
            f"resume (the load had stopped {settled - 3 * args.pause_s:.1f} s before); lost {lost_total}"
        )
        table = "\n".join(lines)
        print(table, flush=True)
        if not args.smoke:
            update_section(
                "log-outage",
                "## Log outage: a paused PostgreSQL under load (`bench/log_outage_bench.py`)\n\n"
                f"Run on {started_at}. Method: see the bench's docstring.\n\n{table}",
            )
        return 0 if lost_total == 0 else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
