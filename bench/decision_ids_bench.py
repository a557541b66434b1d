"""Decision ids on a busy process: what making one id costs the event loop that makes it.

Every gated call makes its decision's id on the caller's thread (an async call: on its event
loop). ``uuid.uuid4()`` reads ``os.urandom``, which gives up the GIL; with other threads running
Python code (a shadow gate's workers parsing replies, a reader's tokenizer), the loop then waits
for one of them to hand it back, up to the interpreter's switch interval (5 ms) each time.
capgate's ids (``capgate.core.types._new_id``) come from a generator seeded from ``os.urandom``
once per process (and again in a forked child), and never give it up.

Method: ``--ids`` ids made in a row inside a coroutine, by ``uuid.uuid4().hex`` and by
``_new_id()``, alternately (``--rounds`` rounds each), while 0 and then ``--threads`` threads spin
in pure Python; the median and the slowest round of each, side by side in one run (the wait is
all-or-nothing: a round either keeps the GIL throughout or loses it at every id, so the slowest
round is the figure a caller feels). No data: synthetic ids. Run: ``python
bench/decision_ids_bench.py [--ids 256] [--rounds 20] [--threads 8] [--smoke]``. Ends with ``ids:
N on a loop beside T busy threads, slowest of R rounds: uuid4 X ms, capgate Y ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from _report import machine

from capgate.core.types import _new_id

MAKERS: dict[str, Callable[[], str]] = {"uuid4": lambda: uuid.uuid4().hex, "capgate": _new_id}


def rounds(ids: int, n: int) -> dict[str, list[float]]:
    """Seconds to make ``ids`` ids in a coroutine, per maker, over ``n`` alternating rounds."""

    async def timed() -> dict[str, list[float]]:
        seen: dict[str, list[float]] = {name: [] for name in MAKERS}
        for _ in range(n):
            for name, make in MAKERS.items():
                start = time.perf_counter()
                for _ in range(ids):
                    make()
                seen[name].append(time.perf_counter() - start)
                await asyncio.sleep(0)
        return seen

    return asyncio.run(timed())


def with_busy_threads(count: int, job: Callable[[], dict[str, list[float]]]) -> dict[str, list[float]]:
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        return job()
    finally:
        stop.set()
        for t in threads:
            t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="seconds: 32 ids, 2 rounds, 2 threads")
    args = parser.parse_args()
    if args.smoke:
        args.ids, args.rounds, args.threads = 32, 2, 2
    print(f"machine: {machine()}")
    header = f"{'uuid4 median ms':>16} {'slowest':>9} {'capgate median ms':>18} {'slowest':>9}"
    print(f"{'busy threads':>12} {header}")
    worst: dict[str, float] = {}
    for busy in (0, args.threads):
        times = with_busy_threads(busy, lambda: rounds(args.ids, args.rounds))
        worst = {name: max(t) for name, t in times.items()}
        cells = [f"{1000 * statistics.median(times[n]):>{w}.2f} {1000 * worst[n]:>9.2f}" for n, w in
                 (("uuid4", 16), ("capgate", 18))]  # fmt: skip
        print(f"{busy:>12} {cells[0]} {cells[1]}")
    print(
        f"ids: {args.ids} on a loop beside {args.threads} busy threads, slowest of {args.rounds} rounds: "
        f"uuid4 {1000 * worst['uuid4']:.1f} ms, capgate {1000 * worst['capgate']:.1f} ms"
    )


if __name__ == "__main__":
    main()
