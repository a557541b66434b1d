"""Write throughput of the SQLite decision log, alone and under concurrent writer processes.

Each writer process records ``--per-writer`` decisions (synthetic, made here; every other one
also gets an outcome, i.e. a second transaction) into one fresh database file in a temporary
folder, and the bench reports decisions per second overall and per writer, for 1, 2 and 4
writers, plus the time of one ``capgate monitor``-style calibration report over the result.
Every write is its own committed transaction (WAL, synchronous=NORMAL), as in production use.
Run: ``python bench/decision_log_bench.py [--per-writer N]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import tempfile
import time
from pathlib import Path

from capgate import Estimate
from capgate.decision import Decision, DecisionLog, calibration_report


def _write(path: str, tag: str, count: int, start: mp.synchronize.Event) -> None:
    log = DecisionLog(path)
    log.record(
        Decision(id=f"{tag}-warmup", action="answer", estimate=Estimate(p=0.5, method="probe"), reason="b")
    )
    start.wait()
    for i in range(count):
        p = (i % 97) / 97
        d = Decision(id=f"{tag}-{i}", action="answer", estimate=Estimate(p=p, method="probe"), reason="bench")
        log.record(d, query=f"question {tag} {i}", samples_used=1)
        if i % 2 == 0:
            log.record_outcome(d.id, correct=(i % 3 != 0))
    log.close()


def run(n_writers: int, per_writer: int, folder: Path) -> tuple[float, Path]:
    path = folder / f"bench_{n_writers}.sqlite3"
    DecisionLog(path).close()
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [
        ctx.Process(target=_write, args=(str(path), f"w{k}", per_writer, start)) for k in range(n_writers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # let every writer import and open its connection
    began = time.perf_counter()
    start.set()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"writer exited with {proc.exitcode}")
    return time.perf_counter() - began, path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--per-writer", type=int, default=2000)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"each writer: {args.per_writer} decisions + {args.per_writer // 2} outcomes, one transaction each\n"
    )
    print(f"{'writers':>7} {'decisions':>9} {'seconds':>8} {'decisions/s':>12} {'per writer/s':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        last = None
        for n in (1, 2, 4):
            seconds, last = run(n, args.per_writer, Path(tmp))
            total = n * args.per_writer
            print(f"{n:>7} {total:>9} {seconds:>8.2f} {total / seconds:>12.0f} {total / seconds / n:>13.0f}")
        assert last is not None
        with DecisionLog(last) as log:
            began = time.perf_counter()
            reports = calibration_report(log, window=1000)
            took = time.perf_counter() - began
            print(f"\nintegrity_check: {log.integrity_check()}; rows: {len(log)}")
        print(f"calibration report (window 1000, {len(reports)} methods): {took * 1000:.1f} ms")


if __name__ == "__main__":
    main()
