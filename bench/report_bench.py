"""How fast ``capgate report`` reads a large log: a generated log of N decisions with outcomes.

The log is written here (in bulk, one transaction per 50,000 rows, through the log's own store and
SQL): N decisions over 4 groups (2 policies x shadow/enforce), every action, a logged p, latency and
samples, and an outcome on 90% of them (binary from a "grader", plus a "user" score on every
tenth). Then, on the same log, the bench times:

- ``report``: :func:`capgate.decision.gate_report` (what ``capgate report --db LOG`` computes:
  every group's figures with their intervals and the calibration bootstrap);
- ``read rows``: fetching the decision rows with their outcomes (``SELECT`` of every column of
  decisions joined with outcomes), the floor of any report that would read the rows;
- ``parse rows``: ``DecisionLog.decisions()`` (rows parsed into objects) on the last
  ``--parse-sample`` decisions, scaled to N.

It prints each time and the report's ratio to them. Run:
``python bench/report_bench.py [--n 1000000] [--stores sqlite,postgres] [--postgres URL]``.
PostgreSQL: ``--postgres URL``, else $CAPGATE_TEST_POSTGRES_URL, else one started here with
``scripts/postgres-server.sh`` (and stopped at the end). ``--smoke``: 2,000 decisions, on SQLite and
on PostgreSQL only where one is given (the test suite runs it).
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from _pg_server import ThrowawayPostgres
from _report import bench_parser
from decision_log_bench import _fresh_schema, _postgres_url  # the same throwaway server and schema

from capgate import Estimate
from capgate.decision import Decision, DecisionLog, gate_report
from capgate.decision.store.schema import INSERT, INSERT_OUTCOME, UPDATE_Y, writer_id

ACTIONS = ("answer", "abstain", "clarify", "escalate", "resample", "route")
_CHUNK = 50_000


def generate(log: DecisionLog, n: int, seed: int = 0) -> None:
    """Write n synthetic decisions (and their outcomes) in bulk."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 1.5, n)
    mu = np.clip(p + rng.normal(0, 0.15, n), 0, 1)
    correct = rng.random(n) < mu
    action_ix = np.where(p >= 0.7, 0, np.where(p < 0.3, 1, rng.choice([2, 3, 4, 5], n)))
    template = Decision(action="answer", estimate=Estimate(p=0.5, method="probe"), reason="bench")
    decision_json = template.model_dump_json()  # the report never reads it; stored as usual
    start = datetime(2026, 11, 1, tzinfo=UTC)
    writer = writer_id()
    dialect = log.store.dialect
    outcome_sql = dialect.render(INSERT_OUTCOME)
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        ids = [uuid.uuid4().hex for _ in range(hi - lo)]
        rows = []
        outcomes = []
        for j, i in enumerate(range(lo, hi)):
            action = ACTIONS[int(action_ix[i])]
            shadow = i % 2
            when = (start + timedelta(seconds=i)).isoformat()
            rows.append(
                (
                    ids[j],
                    when,
                    None,
                    None,
                    None,
                    None,
                    "probe",
                    float(p[i]),
                    0,
                    None,
                    action,
                    "bench",
                    None,
                    1 if action in ("answer", "route") else (4 if action == "resample" else 0),
                    0.002 + 0.001 * (i % 7),
                    "balanced" if i % 4 < 2 else "cost-saver",
                    decision_json,
                    writer,
                    shadow,
                    "m1",
                    None,  # calibration
                    None,  # beside
                )
            )
            if i % 10 != 9:
                recorded = (start + timedelta(seconds=i + 60)).isoformat()
                outcomes.append(
                    ("grader", int(correct[i]), None, None, None, None, 0, None, recorded, ids[j])
                )
            if i % 10 == 0:
                recorded = (start + timedelta(seconds=i + 90)).isoformat()
                score = float(mu[i])
                outcomes.append(("user", None, None, None, score, None, 0, None, recorded, ids[j]))
        # as the log's own outcome writes do: the outcomes, and each decision's outcome_y refreshed
        refresh = [(decision_id,) for decision_id in ids]
        log.store.write_all([(INSERT, rows), (outcome_sql, outcomes), (dialect.render(UPDATE_Y), refresh)])


def _timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def bench(location: str | Path, n: int, parse_sample: int) -> dict[str, float]:
    log = DecisionLog(location, timeout_s=600) if isinstance(location, str) else DecisionLog(location)
    write_s, _ = _timed(lambda: generate(log, n))
    report_s, report = _timed(lambda: gate_report(log))
    assert report.decisions == n, (report.decisions, n)
    read_s, rows = _timed(
        lambda: log.store.read("SELECT * FROM decisions d LEFT JOIN outcomes o ON o.decision_id = d.id")
    )
    assert len(rows) >= n
    del rows
    sample = min(parse_sample, n)
    parse_s, parsed = _timed(lambda: log.decisions(last=sample))
    assert len(parsed) == sample
    parse_all_s = parse_s * n / sample
    log.close()
    return {
        "write_s": write_s,
        "report_s": report_s,
        "read_s": read_s,
        "parse_s": parse_all_s,
        "groups": float(len(report.groups)),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--n", type=int, default=1_000_000, help="decisions in the generated log")
    parser.add_argument("--stores", default="sqlite", help="comma-separated: sqlite, postgres")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL server URL")
    parser.add_argument("--parse-sample", type=int, default=20_000, help="rows parsed to time decisions()")
    parser.add_argument("--smoke", action="store_true", help="2,000 decisions (the test suite runs it)")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import postgres_url

        args.n, args.parse_sample = 2_000, 200
        args.postgres = postgres_url(args.postgres)
        args.stores = "sqlite,postgres" if args.postgres else "sqlite"
    print(
        f"report bench: {args.n:,} decisions, 90% with an outcome; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        f"{'store':<10} {'write s':>9} {'report s':>9} {'read rows s':>12} {'report/read':>12} "
        f"{'parse rows s':>13} {'report/parse':>13}"
    )
    started: ThrowawayPostgres | None = None
    try:
        for store in args.stores.split(","):
            if store == "sqlite":
                location: str | Path = Path(tempfile.mkdtemp(prefix="capgate-report-bench-")) / "log.sqlite3"
            elif store == "postgres":
                base, started = _postgres_url(args.postgres)
                location = _fresh_schema(base)
            else:
                raise SystemExit(f"unknown store {store!r}: sqlite or postgres")
            r = bench(location, args.n, args.parse_sample)
            print(
                f"{store:<10} {r['write_s']:>9.1f} {r['report_s']:>9.2f} {r['read_s']:>12.2f} "
                f"{r['report_s'] / r['read_s']:>12.2f} {r['parse_s']:>13.1f} "
                f"{r['report_s'] / r['parse_s']:>13.3f}"
            )
            if isinstance(location, Path):
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{location}{suffix}").unlink(missing_ok=True)
    finally:
        if started is not None:
            started.stop()


if __name__ == "__main__":
    main()
