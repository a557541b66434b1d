"""Write throughput of the decision log on both stores, alone and under concurrent writer processes.

Each writer process records ``--per-writer`` decisions (synthetic, made here; every other one
also gets an outcome, i.e. a second transaction) into one fresh log, and the bench reports
decisions per second overall and per writer, for 1, 2, 4 and 8 writers, on each store:

- SQLite: one fresh file in a temporary folder (WAL, synchronous=NORMAL);
- PostgreSQL: a fresh schema on a local server (``--postgres URL``, else $CAPGATE_TEST_POSTGRES_URL,
  else one started here with ``scripts/postgres-server.sh``; fsync and synchronous_commit on).

Every write is its own committed transaction, as in production use. After each run the bench
checks that the log holds exactly the rows written (no loss, no duplicates), and times one
``capgate monitor``-style calibration report over the largest log.
Run: ``python bench/decision_log_bench.py [--per-writer N] [--stores sqlite,postgres]``. ``--smoke``:
2 writers of 20 decisions, on SQLite and on PostgreSQL only where one is given (``--postgres`` or
$CAPGATE_TEST_POSTGRES_URL; the test suite runs it under scripts/with-vllm-server.sh).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

from _pg_server import ThrowawayPostgres

from capgate import Estimate
from capgate.decision import Decision, DecisionLog, calibration_report


def _write(location: str, tag: str, count: int, start: mp.synchronize.Event) -> None:
    log = DecisionLog(location)
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


def run(location: str, n_writers: int, per_writer: int) -> float:
    DecisionLog(location).close()
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [
        ctx.Process(target=_write, args=(location, f"w{k}", per_writer, start)) for k in range(n_writers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.5)  # let every writer import and open its connection
    began = time.perf_counter()
    start.set()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"writer exited with {proc.exitcode}")
    seconds = time.perf_counter() - began
    with DecisionLog(location) as log:
        expected = n_writers * (per_writer + 1)
        if len(log) != expected or len({r.id for r in log.decisions()}) != expected:
            raise SystemExit(f"{location}: {len(log)} rows, expected {expected}")
    return seconds


def _postgres_url(given: str | None) -> tuple[str, ThrowawayPostgres | None]:
    url = given or os.environ.get("CAPGATE_TEST_POSTGRES_URL")
    if url:
        return url, None
    server = ThrowawayPostgres("capgate-pg-bench-")
    return server.start(), server


def _fresh_schema(url: str) -> str:
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--per-writer", type=int, default=1000)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--writers", default="1,2,4,8")
    parser.add_argument("--postgres", default=None, help="A PostgreSQL URL (default: see above).")
    parser.add_argument("--smoke", action="store_true", help="seconds, 2 writers (the test suite runs it)")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import postgres_url

        args.per_writer, args.writers = 20, "2"
        args.postgres = postgres_url(args.postgres)
        args.stores = "sqlite,postgres" if args.postgres else "sqlite"
    writers = [int(n) for n in args.writers.split(",")]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"each writer: {args.per_writer} decisions + {args.per_writer // 2} outcomes, one transaction each\n"
    )
    started: ThrowawayPostgres | None = None
    try:
        for store in args.stores.split(","):
            if store == "postgres":
                url, started = _postgres_url(args.postgres)
            print(f"{store}:")
            print(f"{'writers':>7} {'decisions':>9} {'seconds':>8} {'decisions/s':>12} {'per writer/s':>13}")
            with tempfile.TemporaryDirectory() as tmp:
                last = ""
                for n in writers:
                    last = str(Path(tmp) / f"bench_{n}.sqlite3") if store == "sqlite" else _fresh_schema(url)
                    seconds = run(last, n, args.per_writer)
                    total = n * args.per_writer
                    rate = total / seconds
                    print(f"{n:>7} {total:>9} {seconds:>8.2f} {rate:>12.0f} {rate / n:>13.0f}")
                with DecisionLog(last) as log:
                    began = time.perf_counter()
                    reports = calibration_report(log, window=1000)
                    took = time.perf_counter() - began
                    verdict = log.integrity_check()
                    print(f"integrity_check: {verdict}; rows: {len(log)} (no loss, no duplicates)")
                print(f"calibration report (window 1000, {len(reports)} methods): {took * 1000:.1f} ms\n")
    finally:
        if started is not None:
            started.stop()


if __name__ == "__main__":
    main()
