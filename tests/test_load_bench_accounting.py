"""The load bench's accounting of shadow-call delays: what it blames on the gate and what on a
full garbage collection of the process (which holds every thread, gated or not). No figures:
those are measured by ``bench/load_bench.py``."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import load_bench


def shadow_run(
    latencies: list[float], windows: list[tuple[float, float]], gcs: list[tuple[float, float]]
) -> load_bench.Run:
    return load_bench.Run(name="verbalized load", level=len(latencies), calls=len(latencies), mode="shadow",
                          call_s=0.05, latencies=latencies, windows=windows, collections=gcs,
                          wall_s=2.0, rows=len(latencies))  # fmt: skip


def test_a_delay_covered_by_a_full_collection_is_not_the_gates() -> None:
    # three calls of a 0.05 s function: one held 0.4 s by a 0.3 s collection inside it (0.1 s left:
    # not delayed), one held 0.4 s with the collection only partly inside (0.3 s left: delayed), one
    # prompt (0.01 s added)
    gcs = [(0.10, 0.40)]
    run = shadow_run([0.45, 0.45, 0.06], [(0.0, 0.45), (0.30, 0.75), (1.0, 1.06)], gcs)
    assert [round(d, 3) for d in run.delays] == [0.4, 0.4, 0.01]
    assert run.delayed == 1
    assert run.held_by_gc == 1
    assert abs(run.longest_gc - 0.3) < 1e-9


def test_without_collections_every_slow_call_is_the_gates() -> None:
    run = shadow_run([0.45, 0.06], [(0.0, 0.45), (1.0, 1.06)], [])
    assert (run.delayed, run.held_by_gc, run.longest_gc) == (1, 0, 0.0)


def test_the_rows_print_both_counts() -> None:
    run = shadow_run([0.45, 0.45, 0.06], [(0.0, 0.45), (0.30, 0.75), (1.0, 1.06)], [(0.10, 0.40)])
    cells = load_bench._mode_cells(run)
    assert cells[5:7] == ("0.400", "9.00x")  # p99 added, and the call's p99 over the ungated 0.05 s
    assert cells[7:10] == (1, 1, "0.300")
    assert "verbalized load" in run.line()
    enforce = load_bench.Run(
        name="x", level=1, calls=1, mode="speculative", latencies=[1.0], windows=[(0, 1)]
    )
    assert load_bench._mode_cells(enforce)[7:9] == ("-", "-")  # enforce waits for its decision by design


def test_full_collections_are_recorded_only_while_watched() -> None:
    seen: list[tuple[float, float]] = []
    with load_bench.FullCollections(seen):
        gc.collect(1)  # not a full collection
        gc.collect()
    gc.collect()  # after: not recorded
    assert len(seen) == 1
    start, end = seen[0]
    assert end >= start
