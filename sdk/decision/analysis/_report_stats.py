"""The gate report's rates and their intervals: Wilson's for proportions, a bootstrap for the
calibration metrics (see :mod:`capgate.decision.analysis.report`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Z95 = 1.959963984540054  # the 95% normal quantile
_BOOT = 200  # bootstrap resamples
_BOOT_MAX = 2_000  # decisions per resample, at most (m-out-of-n beyond, widths rescaled)


@dataclass(frozen=True)
class Rate:
    """A rate with its 95% interval.

    Attributes:
        value: The rate.
        low: Lower end of the interval.
        high: Upper end of the interval.
        n: The denominator (decisions it is a rate of; outcome mass for a share of the wrong or
            right answers).
        method: ``"wilson"`` or ``"bootstrap"``.
    """

    value: float
    low: float
    high: float
    n: float
    method: str = "wilson"

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def wilson(successes: float, n: float, *, z: float = Z95) -> Rate | None:
    """The rate ``successes / n`` with its Wilson score interval (``None`` when ``n`` is 0).

    Examples:
        >>> r = wilson(8, 10)
        >>> round(r.value, 2), round(r.low, 3), round(r.high, 3)
        (0.8, 0.49, 0.943)
    """
    if n <= 0:
        return None
    p = successes / n
    denominator = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(max(p * (1.0 - p), 0.0) / n + z * z / (4 * n * n)) / denominator
    return Rate(value=p, low=max(0.0, center - half), high=min(1.0, center + half), n=n)


@dataclass(frozen=True)
class Calibration:
    """Calibration of the logged estimates p against the outcomes y (decisions with both).

    Attributes:
        n: Decisions with an estimate and an outcome.
        brier: Capability Brier score, mean (p - y)^2 (lower is better).
        ece: Expected calibration error (10 equal-width bins).
        auroc: How well p ranks right answers above wrong ones (``None`` if all y agree).
    """

    n: int
    brier: Rate
    ece: Rate
    auroc: Rate | None


def soft_auroc(p: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """AUROC of ``p`` against outcomes ``y`` in [0, 1], each y a soft label (NaN if all y agree)."""
    from capgate.metrics import auroc

    return float(auroc(p, np.rint(y * 1000).astype(np.int64), k=1000))


def bootstrap_calibration(
    p: NDArray[np.float64], y: NDArray[np.float64], rng: np.random.Generator
) -> Calibration:
    from capgate.metrics import capability_brier, expected_calibration_error

    def metrics(pp: NDArray[np.float64], yy: NDArray[np.float64]) -> tuple[float, float, float]:
        return capability_brier(pp, yy), expected_calibration_error(pp, yy), soft_auroc(pp, yy)

    n = p.size
    point = metrics(p, y)
    m = min(n, _BOOT_MAX)
    scale = math.sqrt(m / n)
    draws = np.array([metrics(p[i], y[i]) for i in (rng.integers(0, n, m) for _ in range(_BOOT))])
    rates: list[Rate | None] = []
    for j, value in enumerate(point):
        column = draws[:, j][np.isfinite(draws[:, j])]
        if not math.isfinite(value) or column.size < _BOOT // 2:
            rates.append(None)
            continue
        center = float(np.mean(column))
        low, high = (float(q) for q in np.quantile(column, [0.025, 0.975]))
        lo = value + (low - center) * scale
        hi = value + (high - center) * scale
        rates.append(Rate(value, max(0.0, lo), min(1.0, hi), n, "bootstrap"))
    brier, ece, area = rates
    assert brier is not None
    assert ece is not None
    return Calibration(n=n, brier=brier, ece=ece, auroc=area)
