"""Choosing a calibration on held-out outcomes: the previous estimator stays unless a candidate
beats it beyond the noise. Each candidate is scored by its capability Brier on the held-out
(latest) outcomes, with a 95% interval, and by its paired difference from the previous estimator.
The one with the lowest held-out Brier replaces the previous estimator only when

* the upper end of the one-sided ``1 - level / m`` interval of that paired difference is below
  zero, ``m`` the number of challengers (it is better on the held-out outcomes beyond their
  noise; the best of ``m`` is tested, so the level is split among them: Bonferroni), and
* on the older part, its cross-fitted predictions (each from a fit that never saw the row) are
  better than the previous estimator's too: a veto, never a reason to switch on its own (a
  challenger whose cross-fitting made no predictions, where the previous estimator has a
  cross-fitted Brier, fails it).

Anything short of both goes to the previous estimator, so a map fitting its window's noise
rarely ships (measured by ``bench/learn_selection.py``, in ``bench/RESULTS.md``). When queries
recur, the intervals are cluster-robust by query: one query's outcomes are not independent
evidence, and counting them so made a probe fitting a few recurring queries look better.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from capgate._util.jsonl import json_ready
from capgate._util.validate import FloatArray

PREVIOUS = "previous"
SELECTION_LEVEL = 0.05
"""One-sided level of the test a challenger must pass to replace the previous estimator, split
among the challengers."""


@dataclass(frozen=True)
class HeldOutRow:
    """One candidate's figures on the held-out outcomes.

    Attributes:
        candidate: ``"previous"``, ``"isotonic"``, ``"platt"`` or ``"probe"``.
        n: Held-out outcomes the figures rest on.
        n_fit: Older outcomes the candidate was fitted on (0 for the previous estimator).
        brier: Capability Brier score (mean squared error against the outcome).
        brier_low: Lower end of its 95% interval.
        brier_high: Upper end of its 95% interval.
        diff: Paired mean difference from the previous estimator's Brier (negative: better).
        diff_high: Upper end of the one-sided ``1 - level / m`` interval of ``diff`` (``m``
            challengers).
        crossfit_brier: Brier of cross-fitted predictions on the older part (``None`` if not
            computed, or if cross-fitting made no predictions): the same comparison made inside
            the fitting data, never on fitted rows.
        chosen: Whether this candidate was kept.
    """

    candidate: str
    n: int
    n_fit: int
    brier: float
    brier_low: float
    brier_high: float
    diff: float
    diff_high: float
    crossfit_brier: float | None
    chosen: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (NaN as ``None``)."""
        return cast(dict[str, Any], json_ready(self))


def _mean_interval(
    values: FloatArray, z: float, groups: npt.NDArray[Any] | None = None
) -> tuple[float, float, float]:
    """The mean and its normal interval; with ``groups``, the standard error is cluster-robust
    (the residuals summed within each group, with the usual ``G / (G - 1)`` correction)."""
    mean = float(values.mean())
    if groups is None:
        half = z * float(values.std(ddof=1)) / math.sqrt(values.size) if values.size > 1 else math.inf
        return mean, mean - half, mean + half
    _, cluster = np.unique(groups, return_inverse=True)
    sums = np.bincount(cluster, weights=values - mean)
    g = sums.size
    if g < 2:
        return mean, -math.inf, math.inf
    half = z * math.sqrt(g / (g - 1) * float(np.sum(sums**2))) / values.size
    return mean, mean - half, mean + half


def table_rows(
    y: FloatArray,
    predictions: Mapping[str, FloatArray],
    *,
    n_fit: Mapping[str, int],
    crossfit_brier: Mapping[str, float | None] | None = None,
    level: float = SELECTION_LEVEL,
    groups: npt.ArrayLike | None = None,
) -> list[HeldOutRow]:
    """The held-out table: one row per candidate (``predictions[name]``, aligned with ``y``),
    the previous estimator (key ``"previous"``) first; no candidate is marked chosen yet.

    ``groups`` (one label per outcome: its query) makes every interval cluster-robust by query.
    """
    if PREVIOUS not in predictions:
        raise ValueError("the candidates must include the previous estimator ('previous')")
    labels = None if groups is None else np.asarray(groups)
    if labels is not None and labels.shape != y.shape:
        raise ValueError(f"`groups` must have one label per outcome ({y.size}); got shape {labels.shape}")
    z95 = NormalDist().inv_cdf(0.975)
    z_sel = NormalDist().inv_cdf(1.0 - level / max(1, len(predictions) - 1))
    prev_sq = (predictions[PREVIOUS] - y) ** 2
    rows = []
    for name in [PREVIOUS, *(k for k in predictions if k != PREVIOUS)]:
        sq = (predictions[name] - y) ** 2
        brier, low, high = _mean_interval(sq, z95, labels)
        if name == PREVIOUS:
            diff, diff_high = 0.0, 0.0
        else:
            diff, _, diff_high = _mean_interval(sq - prev_sq, z_sel, labels)
        rows.append(
            HeldOutRow(
                candidate=name,
                n=int(y.size),
                n_fit=int(n_fit.get(name, 0)),
                brier=brier,
                brier_low=max(0.0, low),
                brier_high=high,
                diff=diff,
                diff_high=diff_high,
                crossfit_brier=None if crossfit_brier is None else crossfit_brier.get(name),
                chosen=False,
            )
        )
    return rows


def select(rows: Sequence[HeldOutRow]) -> tuple[str, list[HeldOutRow]]:
    """The kept candidate and the table with it marked (the rule in the module docstring).

    Examples:
        >>> y = np.array([0.0, 1.0] * 50)
        >>> rows = table_rows(y, {"previous": np.full(100, 0.5), "platt": 0.1 + 0.8 * y}, n_fit={})
        >>> select(rows)[0]
        'platt'
    """
    best = best_challenger(rows)
    winner = best.candidate if best is not None and _beats_previous(best, rows) else PREVIOUS
    marked = [HeldOutRow(**{**asdict(r), "chosen": r.candidate == winner}) for r in rows]
    return winner, marked


def best_challenger(rows: Sequence[HeldOutRow]) -> HeldOutRow | None:
    """The candidate other than the previous estimator with the lowest held-out Brier."""
    return min((r for r in rows if r.candidate != PREVIOUS), key=lambda r: r.brier, default=None)


def _beats_previous(row: HeldOutRow, rows: Sequence[HeldOutRow]) -> bool:
    previous = next(r for r in rows if r.candidate == PREVIOUS)
    if previous.crossfit_brier is None:  # no cross-fitted comparison made: the held-out test alone
        return row.diff_high < 0.0
    # a challenger without a cross-fitted Brier cannot pass the veto: short of both, no switch
    vetoed = row.crossfit_brier is None or row.crossfit_brier >= previous.crossfit_brier
    return row.diff_high < 0.0 and not vetoed
