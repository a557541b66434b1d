"""Where an event loop stood still: the load bench's profiler of its own stalls.

A ticker coroutine on the watched loop stamps the time (and the process's CPU time) every
:data:`TICK_S`; a watchdog thread, finding the stamp older than ``stall_s``, samples the loop
thread's stack every :data:`TICK_S` for as long as the stall lasts. When the ticker runs again, the
stall is recorded with its length, the CPU time the whole process used meanwhile (little CPU while
the loop stood still means the process was waiting: for a core the machine gave to another process,
or on a blocking call; as much CPU as wall time or more means its own threads were busy), the
garbage collections that fell inside it (any generation, from a ``gc.callbacks`` hook) and the
frames the loop thread was sampled in most often.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

TICK_S = 0.005
"""How often the ticker stamps the time, and the watchdog samples a stalled loop's stack."""

REPO = str(Path(__file__).resolve().parents[1])


@dataclass
class Stall:
    """One stretch in which the loop did not run its ticker for longer than the watch's ``stall_s``."""

    start: float
    end: float
    cpu_s: float  # CPU time the process used during it (every thread)
    collections: list[tuple[int, float]] = field(default_factory=list)  # generation, seconds inside
    frames: Counter[str] = field(default_factory=Counter)  # the loop thread's sampled frames
    others: Counter[str] = field(default_factory=Counter)  # the other threads' sampled frames

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def cause(self) -> str:
        """The stall in words: its length, the process's CPU share, its collections, the loop's frame."""
        parts = [f"{1000 * self.seconds:.0f} ms", f"process CPU {self.cpu_s / max(self.seconds, 1e-9):.0%}"]
        full = [s for g, s in self.collections if g == 2]
        young = [s for g, s in self.collections if g != 2]
        if full:
            parts.append("full GC " + ", ".join(f"{1000 * s:.0f} ms" for s in full))
        if young:
            parts.append(f"{len(young)} younger GCs {1000 * sum(young):.0f} ms")
        if self.frames:
            frame, n = self.frames.most_common(1)[0]
            parts.append(f"loop at {frame} ({n}/{sum(self.frames.values())} samples)")
        else:
            parts.append("loop not sampled")
        if self.others:
            busy = ", ".join(f"{f} ({n})" for f, n in self.others.most_common(3))
            parts.append(f"other threads at {busy}")
        return "; ".join(parts)


def _where(frame: FrameType | None) -> str:
    """The innermost frame, and the innermost one of this repository's code when that is another."""
    if frame is None:
        return "?"
    inner = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
    walk: FrameType | None = frame
    while walk is not None and not walk.f_code.co_filename.startswith(REPO):
        walk = walk.f_back
    if walk is None or walk is frame:
        return inner
    own = f"{Path(walk.f_code.co_filename).name}:{walk.f_lineno} {walk.f_code.co_name}"
    return f"{inner} < {own}"


IDLE = frozenset({"wait", "_worker", "select", "_wait_for_tstate_lock", "get", "accept"})


def _idle(frame: FrameType) -> bool:
    """A thread parked on a lock, a queue or a selector: not what holds the process up."""
    return frame.f_code.co_name in IDLE


class LoopWatch:
    """Records the stalls over ``stall_s`` of the running loop while the ``async with`` body runs."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.stalls: list[Stall] = []
        self._stamp = (time.monotonic(), time.process_time())
        self._samples: Counter[str] = Counter()
        self._others: Counter[str] = Counter()
        self._collections: list[tuple[int, float, float]] = []
        self._gc_started = 0.0
        self._done = threading.Event()
        self._loop_thread = threading.get_ident()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.monotonic()
        else:
            self._collections.append((info["generation"], self._gc_started, time.monotonic()))

    async def _tick(self) -> None:
        while not self._done.is_set():
            await asyncio.sleep(TICK_S)
            now, cpu = time.monotonic(), time.process_time()
            last, last_cpu = self._stamp
            if now - last > self.stall_s:
                stall = Stall(last, now, cpu - last_cpu, frames=self._samples, others=self._others)
                stall.collections = [
                    (g, min(now, b) - max(last, a)) for g, a, b in self._collections if a < now and b > last
                ]
                self.stalls.append(stall)
            self._samples, self._others = Counter(), Counter()
            self._stamp = (now, cpu)

    def _watch(self) -> None:
        while not self._done.wait(TICK_S):
            if time.monotonic() - self._stamp[0] > self.stall_s:
                me = threading.get_ident()
                for thread, frame in sys._current_frames().items():
                    if thread == self._loop_thread:
                        self._samples[_where(frame)] += 1
                    elif thread != me and not _idle(frame):
                        self._others[_where(frame)] += 1

    async def __aenter__(self) -> LoopWatch:
        self._loop_thread = threading.get_ident()
        self._stamp = (time.monotonic(), time.process_time())
        gc.callbacks.append(self._on_gc)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        await self._ticker
        self._thread.join()
        gc.callbacks.remove(self._on_gc)

    def longest(self) -> Stall | None:
        return max(self.stalls, key=lambda s: s.seconds, default=None)
