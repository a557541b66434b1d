"""Calibration metrics of a capability estimate p against the empirical capability µ̂."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from capgate._util.validate import (
    FloatArray,
    IntArray,
    as_correct_and_k,
    as_probabilities,
    check_positive_int,
    same_length,
)

__all__ = [
    "BinStrategy",
    "BrierDecomposition",
    "ReliabilityDiagram",
    "brier_decomposition",
    "capability_brier",
    "expected_calibration_error",
    "mean_absolute_error",
    "reliability_diagram",
    "response_brier",
    "root_mean_squared_error",
]

BinStrategy = Literal["uniform", "quantile"]


def _pair(p: ArrayLike, mu: ArrayLike) -> tuple[FloatArray, FloatArray]:
    pa = as_probabilities("p", p)
    ma = as_probabilities("mu", mu)
    same_length(p=pa, mu=ma)
    return pa, ma


def capability_brier(p: ArrayLike, mu: ArrayLike) -> float:
    """Capability Brier score: mean (p − µ̂)².

    Args:
        p: Predicted capabilities in [0, 1].
        mu: Empirical capabilities µ̂ = correct / k in [0, 1].

    Returns:
        The mean squared error (lower is better; 0 for a perfect estimate).

    Examples:
        >>> round(capability_brier([0.9, 0.2], [1.0, 0.0]), 4)
        0.025
    """
    pa, ma = _pair(p, mu)
    return float(np.mean((pa - ma) ** 2))


def mean_absolute_error(p: ArrayLike, mu: ArrayLike) -> float:
    """Mean |p − µ̂|.

    Examples:
        >>> mean_absolute_error([0.5, 0.5], [0.25, 1.0])
        0.375
    """
    pa, ma = _pair(p, mu)
    return float(np.mean(np.abs(pa - ma)))


def root_mean_squared_error(p: ArrayLike, mu: ArrayLike) -> float:
    """Square root of the capability Brier score.

    Examples:
        >>> root_mean_squared_error([0.5], [0.25])
        0.25
    """
    return float(np.sqrt(capability_brier(p, mu)))


def response_brier(p: ArrayLike, correct: ArrayLike, k: ArrayLike | int) -> float:
    """Brier score of p against each sampled response's 0/1 correctness.

    Each query's k responses are scored against the same p and averaged, then queries are
    averaged (every query weighs the same, as in the capability Brier score).

    Args:
        p: Predicted capabilities in [0, 1].
        correct: Correct responses per query.
        k: Responses sampled per query (an int for all, or one per query).

    Examples:
        >>> response_brier([0.5], [1], 2)
        0.25
    """
    pa = as_probabilities("p", p)
    c, ks = as_correct_and_k(correct, k, len(pa))
    same_length(p=pa, correct=c)
    mu = c / ks
    per_query = mu * (1.0 - pa) ** 2 + (1.0 - mu) * pa**2
    return float(np.mean(per_query))


@dataclass(frozen=True)
class BrierDecomposition:
    """Response Brier = capability Brier + mean Var(correctness).

    The variance term µ̂(1 − µ̂) is the Jensen gap: no estimator that sees only the query can
    beat it on the response-level score, which is why capability is the right target.
    """

    response: float
    capability: float
    variance: float


def brier_decomposition(p: ArrayLike, correct: ArrayLike, k: ArrayLike | int) -> BrierDecomposition:
    """Split the response Brier score into the capability Brier score and the variance term.

    Examples:
        >>> d = brier_decomposition([0.5, 0.8], [1, 4], [2, 4])
        >>> round(d.response, 6) == round(d.capability + d.variance, 6)
        True
    """
    pa = as_probabilities("p", p)
    c, ks = as_correct_and_k(correct, k, len(pa))
    mu = c / ks
    return BrierDecomposition(
        response=response_brier(pa, c, ks),
        capability=capability_brier(pa, mu),
        variance=float(np.mean(mu * (1.0 - mu))),
    )


def _bin_index(p: FloatArray, n_bins: int, strategy: BinStrategy) -> IntArray:
    """Bin of each prediction: by the :func:`_uniform_edges` (the last bin closed), or equal-mass."""
    if strategy == "uniform":
        index = np.searchsorted(_uniform_edges(n_bins), p, side="right") - 1
        return np.minimum(index.astype(np.int64), n_bins - 1)
    if strategy == "quantile":
        order = np.argsort(p, kind="stable")
        index = np.empty(len(p), dtype=np.int64)
        # Equal-count chunks of the sorted predictions (sizes differ by at most one).
        index[order] = (np.arange(len(p), dtype=np.int64) * n_bins) // len(p)
        return index
    raise ValueError(f"`strategy` must be 'uniform' or 'quantile'; got {strategy!r}")


def _uniform_edges(n_bins: int) -> FloatArray:
    """Equal-width bin edges b/M, each the float nearest it (``np.linspace`` gives 0.7000000000000001
    for 7/10): what uniform bins assign by and what the diagram reports."""
    return np.arange(n_bins + 1, dtype=np.float64) / n_bins


@dataclass(frozen=True)
class ReliabilityDiagram:
    """Per-bin data of a reliability diagram.

    Attributes:
        edges: Bin edges (``n_bins + 1`` values; for ``quantile`` bins, the min/max of each bin's
            predictions, joined).
        counts: Predictions per bin.
        mean_confidence: Mean p per bin (NaN for an empty bin).
        mean_capability: Mean µ̂ per bin (NaN for an empty bin).
        strategy: ``"uniform"`` (equal-width) or ``"quantile"`` (equal-mass).
    """

    edges: FloatArray
    counts: IntArray
    mean_confidence: FloatArray
    mean_capability: FloatArray
    strategy: BinStrategy

    @property
    def ece(self) -> float:
        """Expected calibration error implied by these bins."""
        filled = self.counts > 0
        weights = self.counts[filled] / self.counts.sum()
        gaps = np.abs(self.mean_confidence[filled] - self.mean_capability[filled])
        return float(np.sum(weights * gaps))


def reliability_diagram(
    p: ArrayLike, mu: ArrayLike, *, n_bins: int = 10, strategy: BinStrategy = "uniform"
) -> ReliabilityDiagram:
    """Per-bin counts, mean confidence and mean µ̂.

    With ``strategy="uniform"``, bin b holds ``edges[b] <= p < edges[b+1]`` (the edges b/M, so
    that a p on an edge lands in the bin its edges include), and the last bin is closed so that
    p = 1.0 is counted. With ``"quantile"``, the sorted
    predictions are cut into M chunks of equal size.

    Examples:
        >>> d = reliability_diagram([0.05, 1.0], [0.0, 1.0], n_bins=10)
        >>> d.counts.tolist()
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    """
    pa, ma = _pair(p, mu)
    n_bins = check_positive_int("n_bins", n_bins)
    index = _bin_index(pa, n_bins, strategy)
    counts = np.bincount(index, minlength=n_bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(index, weights=pa, minlength=n_bins) / counts
        mean_mu = np.bincount(index, weights=ma, minlength=n_bins) / counts
    if strategy == "uniform":
        edges = _uniform_edges(n_bins)
    else:
        lows = np.full(n_bins, np.inf)
        highs = np.full(n_bins, -np.inf)
        np.minimum.at(lows, index, pa)
        np.maximum.at(highs, index, pa)
        lows[counts == 0] = np.nan
        highs[counts == 0] = np.nan
        edges = np.concatenate([lows[:1], highs])
    return ReliabilityDiagram(
        edges=edges,
        counts=counts,
        mean_confidence=mean_conf,
        mean_capability=mean_mu,
        strategy=strategy,
    )


def expected_calibration_error(
    p: ArrayLike, mu: ArrayLike, *, n_bins: int = 10, strategy: BinStrategy = "uniform"
) -> float:
    """Expected calibration error: Σ_b (n_b / N) · |mean p_b − mean µ̂_b|.

    Args:
        p: Predicted capabilities in [0, 1].
        mu: Empirical capabilities µ̂ in [0, 1].
        n_bins: Number of bins M (default 10).
        strategy: ``"uniform"`` (equal-width) or ``"quantile"`` (equal-mass): see :func:`reliability_diagram`.

    Examples:
        >>> round(expected_calibration_error([0.9, 0.9], [1.0, 0.6]), 4)
        0.1
    """
    pa, ma = _pair(p, mu)
    n_bins = check_positive_int("n_bins", n_bins)
    index = _bin_index(pa, n_bins, strategy)
    counts = np.bincount(index, minlength=n_bins)
    sum_p = np.bincount(index, weights=pa, minlength=n_bins)
    sum_mu = np.bincount(index, weights=ma, minlength=n_bins)
    # Σ_b (n_b/N)|Σp_b/n_b − Σµ_b/n_b| = Σ_b |Σp_b − Σµ_b| / N (empty bins add 0).
    return float(np.sum(np.abs(sum_p - sum_mu)) / counts.sum())
