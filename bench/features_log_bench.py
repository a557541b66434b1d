"""What logging reader features costs: bytes per decision and write throughput, on both stores.

A gate with ``log_features=True`` writes each decision's reader features beside it
(:meth:`capgate.decision.DecisionLog.record_features`: float16, tagged with the reader spec's
SHA-256). On a fresh log per store, this bench records ``--n`` synthetic decisions (one
transaction each, as a gate does), then their features (``--dim`` values each, default the
shipped default probe's reader width, spec from its ``probe.json``) in two ways:

- **one call per decision** (one transaction each: what the gate does beside each call);
- **batches** of ``--batch`` rows per call (one transaction per batch: a backfill).

It reports rows and MB of vector payload per second for both, the time to read every vector back
(:meth:`~capgate.decision.DecisionLog.features`), and the bytes each decision takes on disk
without and with its features: for SQLite the file's pages after a WAL checkpoint, for
PostgreSQL ``pg_total_relation_size`` of the tables (indexes and TOAST included). Stores as in
``bench/decision_log_bench.py`` (PostgreSQL: ``--postgres URL``, else $CAPGATE_TEST_POSTGRES_URL,
else a throwaway server started here; fsync and synchronous_commit on).

Run: ``python bench/features_log_bench.py [--n 2000] [--dim D] [--batch 100] [--stores sqlite,postgres]``.
``--smoke``: 20 decisions of 16 values, on SQLite and on PostgreSQL only where one is given (the test
suite runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from capgate import Estimate
from capgate.decision import Decision, DecisionLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pg_server import ThrowawayPostgres
from decision_log_bench import _fresh_schema, _postgres_url


def _default_spec() -> dict[str, Any]:
    from capgate.loading import default_probe_path

    meta = json.loads((default_probe_path() / "probe.json").read_text(encoding="utf-8"))
    spec: dict[str, Any] = meta["feature_spec"]
    return spec


def _size(location: str) -> dict[str, int]:
    """Bytes on disk: the whole SQLite file, or each PostgreSQL table with its indexes and TOAST."""
    if not location.startswith("postgresql://"):
        with sqlite3.connect(location) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages, page = (
                conn.execute("PRAGMA page_count").fetchone()[0],
                conn.execute("PRAGMA page_size").fetchone()[0],
            )
        return {"file": int(pages * page)}
    import psycopg

    with psycopg.connect(location, autocommit=True) as conn:
        return {
            t: int(conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()[0])
            for t in ("decisions", "features", "feature_specs")
        }


def bench(location: str, n: int, dim: int, batch: int, spec: dict[str, Any]) -> dict[str, float]:
    rng = np.random.default_rng(0)
    vectors = rng.normal(0.0, 1.0, (2 * n, dim)).astype(np.float32)
    with DecisionLog(location) as log:
        ids = []
        began = time.perf_counter()
        for i in range(2 * n):
            d = Decision(action="answer", estimate=Estimate(p=(i % 97) / 97, method="probe"), reason="bench")
            log.record(d, query=f"question {i}", samples_used=1)
            ids.append(d.id)
        decisions = time.perf_counter() - began
        before = _size(location)
        began = time.perf_counter()
        for i in range(n):  # as a gate does: one transaction per decision
            log.record_features([(ids[i], vectors[i])], spec)
        single = time.perf_counter() - began
        began = time.perf_counter()
        for start in range(n, 2 * n, batch):
            log.record_features(
                list(zip(ids[start : start + batch], vectors[start : start + batch], strict=True)), spec
            )
        batched = time.perf_counter() - began
        began = time.perf_counter()
        got = log.features(ids)
        read = time.perf_counter() - began
        if len(got) != 2 * n or not np.array_equal(
            got[ids[-1]].vector, vectors[-1].astype(np.float16).astype(np.float32)
        ):
            raise SystemExit(f"{location}: read back {len(got)} vectors of {2 * n}, or a wrong one")
    after = _size(location)
    payload_mb = n * dim * 2 / 1e6
    return {
        "decision_rows_s": 2 * n / decisions,
        "single_rows_s": n / single,
        "single_mb_s": payload_mb / single,
        "batch_rows_s": n / batched,
        "batch_mb_s": payload_mb / batched,
        "read_rows_s": 2 * n / read,
        "decision_bytes": sum(before.values()) / (2 * n),
        "features_bytes": (sum(after.values()) - sum(before.values())) / (2 * n),
    }


def main() -> None:
    spec = _default_spec()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="Decisions per way of writing (2n in all).")
    parser.add_argument("--dim", type=int, default=int(spec["dim"]), help="Values per vector.")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--postgres", default=None, help="A PostgreSQL URL (default: see above).")
    parser.add_argument("--smoke", action="store_true", help="20 small vectors (the test suite runs it)")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import postgres_url

        args.n, args.dim, args.batch = 20, 16, 5
        args.postgres = postgres_url(args.postgres)
        args.stores = "sqlite,postgres" if args.postgres else "sqlite"
    spec = {**spec, "dim": args.dim}
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"{2 * args.n} synthetic decisions; features: {args.dim} float32 values each (stored float16: "
        f"{2 * args.dim} bytes), spec of {spec['model_id']}; {args.n} written one per call, {args.n} in "
        f"batches of {args.batch}\n"
    )
    header = (
        f"{'store':<9} {'decisions/s':>11} {'1/call rows/s':>13} {'MB/s':>6} {'batch rows/s':>12} {'MB/s':>6}"
        f" {'read rows/s':>11}"
        f" {'bytes/decision':>14} {'+ features':>10}"
    )
    print(header)
    started: ThrowawayPostgres | None = None
    try:
        for store in args.stores.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                if store == "postgres":
                    url, started = _postgres_url(args.postgres)
                    location = _fresh_schema(url)
                else:
                    location = str(Path(tmp) / "features.sqlite3")
                r = bench(location, args.n, args.dim, args.batch, spec)
            print(
                f"{store:<9} {r['decision_rows_s']:>11.0f} {r['single_rows_s']:>13.0f}"
                f" {r['single_mb_s']:>6.2f}"
                f" {r['batch_rows_s']:>12.0f}"
                f" {r['batch_mb_s']:>6.2f} {r['read_rows_s']:>11.0f} {r['decision_bytes']:>14.0f}"
                f" {r['features_bytes']:>10.0f}"
            )
    finally:
        if started is not None:
            started.stop()
    print(
        "\ndecisions/s: log.record, one transaction each (for reference)\n"
        "bytes/decision: on disk per logged decision without features (query hash, no text)\n"
        "+ features: what its features add on disk (payload, id, spec hash, key index; PostgreSQL: "
        "tables, indexes, TOAST)"
    )


if __name__ == "__main__":
    main()
