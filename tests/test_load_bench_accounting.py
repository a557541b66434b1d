"""The load bench's accounting of shadow-call delays: what it blames on the gate and what on a
full garbage collection of the process (which holds every thread, gated or not). No figures:
those are measured by ``bench/load_bench.py``."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
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
    # three calls of a 0.05 s function: one held 0.4 s by a 0.38 s collection inside it (0.02 s left,
    # under the 50 ms that counts as delayed), one held 0.4 s with the collection only partly inside
    # (0.27 s left: delayed), one prompt (0.01 s added)
    gcs = [(0.05, 0.43)]
    run = shadow_run([0.45, 0.45, 0.06], [(0.0, 0.45), (0.30, 0.75), (1.0, 1.06)], gcs)
    assert [round(d, 3) for d in run.delays] == [0.4, 0.4, 0.01]
    assert run.delayed == 1
    assert run.held_by_gc == 1
    assert abs(run.longest_gc - 0.38) < 1e-9


def test_without_collections_every_slow_call_is_the_gates() -> None:
    run = shadow_run([0.45, 0.06], [(0.0, 0.45), (1.0, 1.06)], [])
    assert (run.delayed, run.held_by_gc, run.longest_gc) == (1, 0, 0.0)


def test_the_rows_print_both_counts() -> None:
    run = shadow_run([0.45, 0.45, 0.06], [(0.0, 0.45), (0.30, 0.75), (1.0, 1.06)], [(0.05, 0.43)])
    cells = load_bench._mode_cells(run)
    assert cells[5:7] == ("0.400", "9.00x")  # p99 added, and the call's p99 over the ungated 0.05 s
    assert cells[7:10] == (1, 1, "0.380")
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


def _blocks_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call on the loop: the process waits, using no CPU


def _spins_on_the_loop(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the process's own work on the loop: CPU all the while
        pass


def test_the_loop_watch_names_where_and_why_the_loop_stood_still() -> None:
    from _loop_watch import LoopWatch

    async def watched() -> LoopWatch:
        async with LoopWatch(0.05) as watch:
            await asyncio.sleep(0.1)  # idle: no stall
            _blocks_the_loop(0.3)
            await asyncio.sleep(0.05)
            _spins_on_the_loop(0.3)
            await asyncio.sleep(0.05)
        return watch

    watch = asyncio.run(watched())
    assert len(watch.stalls) == 2, [s.cause() for s in watch.stalls]
    blocked, spun = watch.stalls
    assert 0.25 < blocked.seconds < 1.0
    assert 0.25 < spun.seconds < 1.0
    assert "_blocks_the_loop" in blocked.cause()
    assert "_spins_on_the_loop" in spun.cause()
    assert blocked.cpu_s < 0.5 * blocked.seconds < spun.cpu_s  # waiting vs working
    assert watch.longest() in (blocked, spun)


def test_a_stall_names_its_full_collections_and_sums_the_younger_ones() -> None:
    from _loop_watch import Stall

    stall = Stall(0.0, 0.5, 0.5, collections=[(0, 0.001), (2, 0.4), (1, 0.003)])
    assert "full GC 400 ms" in stall.cause()
    assert "2 younger GCs 4 ms" in stall.cause()
    assert "loop not sampled" in stall.cause()
