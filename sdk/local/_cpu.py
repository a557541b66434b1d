"""What this CPU computes fast: native bfloat16 (its flags) and whether bfloat16 pays off (measured).

Read by :func:`capgate.loading.load_estimator` to choose the probe's reader pass; re-exported by
:mod:`capgate.local.models`. Nothing here imports torch at module import time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from pathlib import Path

_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""CPU flags of native bfloat16 arithmetic: x86 AVX512-BF16 and AMX-BF16 (Linux), Arm's BF16 (Linux)."""


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the OS lists them (empty where it does not)."""
    import platform
    import subprocess

    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                flags.update(value.split())
    if platform.system() == "Darwin":  # Apple silicon from M2 on
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5
            )
            if out.stdout.strip() == "1":
                flags.add("bf16")
    return frozenset(flags)


@functools.lru_cache(maxsize=1)
def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16 on x86, BF16 on Arm),
    cached for the process. Elsewhere torch emulates it, slower than float32; native is not always
    fast either (:func:`bf16_speedup`).

    Examples:
        >>> isinstance(native_bf16_cpu(), bool)
        True
    """
    return bool(_cpu_flags() & _NATIVE_BF16_FLAGS)


BF16_PAYS_OFF = 1.25
"""The measured speed-up of a bfloat16 linear layer over a float32 one from which a CPU's fast
reader pass is used (:func:`bf16_pays_off`)."""

_BF16_LOCK = threading.Lock()
_BF16_SPEEDUP: list[float] = []  # measured once per process


def bf16_speedup() -> float:
    """How much faster this CPU runs a linear layer in bfloat16 than in float32, measured once
    per process (thread-safe; no random numbers drawn). The flag does not settle it: some CPUs
    listing AVX512-BF16 run torch's bfloat16 matmuls slower (0.6x on one Xeon here). Times a
    256-row input through the embedded model's 576 -> 1536 MLP layer, cast to bfloat16 and back,
    against float32; interleaved, best of 6 rounds (about 0.2 s).
    """
    with _BF16_LOCK:
        if not _BF16_SPEEDUP:
            _BF16_SPEEDUP.append(_measure_bf16_speedup())
        return _BF16_SPEEDUP[0]


def _measure_bf16_speedup() -> float:
    import time

    import torch
    from torch.nn.functional import linear

    x = torch.full((256, 576), 0.5)
    weight = torch.full((1536, 576), 0.01)
    weight_bf16 = weight.to(torch.bfloat16)
    passes: dict[str, Callable[[], object]] = {
        "float32": lambda: linear(x, weight),
        "bfloat16": lambda: linear(x.to(torch.bfloat16), weight_bf16).float(),
    }
    best = dict.fromkeys(passes, float("inf"))
    with torch.inference_mode():
        for _ in range(6):
            for name, run in passes.items():
                start = time.perf_counter()
                for _ in range(3):
                    run()
                best[name] = min(best[name], time.perf_counter() - start)
    return best["float32"] / best["bfloat16"]


def bf16_pays_off() -> bool:
    """Whether a bfloat16 reader pass is worth it on this CPU: native bfloat16
    (:func:`native_bf16_cpu`) and a bfloat16 linear layer measured at least
    :data:`BF16_PAYS_OFF` times as fast as a float32 one (:func:`bf16_speedup`)."""
    return native_bf16_cpu() and bf16_speedup() >= BF16_PAYS_OFF
