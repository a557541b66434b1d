"""Discrimination and correlation: does a higher p go with a more capable query?"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from capgate._util.validate import FloatArray, as_correct_and_k, as_float_array, same_length

__all__ = ["auprc", "auroc", "pearson", "rankdata", "spearman"]


def _grouped_counts(
    scores: ArrayLike, correct: ArrayLike, k: ArrayLike | int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Unique scores (ascending) with the positive and negative responses at each."""
    s = as_float_array("p", scores)
    c, ks = as_correct_and_k(correct, k, len(s))
    same_length(p=s, correct=c)
    unique, inverse = np.unique(s, return_inverse=True)
    positives = np.bincount(inverse, weights=c, minlength=len(unique)).astype(np.float64)
    negatives = np.bincount(inverse, weights=ks - c, minlength=len(unique)).astype(np.float64)
    return unique.astype(np.float64), positives, negatives


def auroc(p: ArrayLike, correct: ArrayLike, *, k: ArrayLike | int = 1) -> float:
    """Area under the ROC curve of confidence against response-level correctness.

    Every sampled response is an example: a query with ``correct`` right answers out of ``k``
    contributes that many positives and ``k − correct`` negatives, all scored ``p``. This uses
    the soft label µ̂ exactly. Ties count one half, as in the Mann–Whitney U statistic.

    Args:
        p: Scores (confidences), one per query.
        correct: Correct responses per query (0/1 labels when ``k=1``).
        k: Responses per query (an int for all, or one per query).

    Returns:
        AUROC in [0, 1], or NaN when there are no positives or no negatives.

    Examples:
        >>> auroc([0.9, 0.1], [3, 1], k=4)
        0.75
    """
    _, positives, negatives = _grouped_counts(p, correct, k)
    total_pos, total_neg = positives.sum(), negatives.sum()
    if total_pos == 0 or total_neg == 0:
        return float("nan")
    negatives_below = np.cumsum(negatives) - negatives
    u = np.sum(positives * (negatives_below + 0.5 * negatives))
    return float(u / (total_pos * total_neg))


def auprc(p: ArrayLike, correct: ArrayLike, *, k: ArrayLike | int = 1) -> float:
    """Area under the precision–recall curve (average precision), correct responses positive.

    Responses are counted as in :func:`auroc`; tied scores form one threshold, and
    AP = Σ_t (R_t − R_{t−1}) · P_t over thresholds from high to low.

    Returns:
        Average precision in [0, 1], or NaN when there are no positives.

    Examples:
        >>> auprc([0.9, 0.1], [1, 0])
        1.0
    """
    _, positives, negatives = _grouped_counts(p, correct, k)
    total_pos = positives.sum()
    if total_pos == 0:
        return float("nan")
    tp = np.cumsum(positives[::-1])
    fp = np.cumsum(negatives[::-1])
    precision = tp / (tp + fp)
    recall = tp / total_pos
    recall_step = np.diff(recall, prepend=0.0)
    return float(np.sum(recall_step * precision))


def rankdata(values: ArrayLike) -> FloatArray:
    """Ranks starting at 1, ties given their average rank (as ``scipy.stats.rankdata``).

    Examples:
        >>> rankdata([10, 20, 10]).tolist()
        [1.5, 3.0, 1.5]
    """
    x = as_float_array("values", values)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    # A value's average rank: ranks before it plus the mean of its own block (1-based).
    before = np.cumsum(counts) - counts
    average = before + (counts + 1) / 2.0
    ranks: FloatArray = average[inverse.reshape(-1)].astype(np.float64)
    return ranks


def pearson(a: ArrayLike, b: ArrayLike) -> float:
    """Pearson correlation; NaN when either input is constant.

    Examples:
        >>> pearson([1, 2, 3], [2, 4, 7]) > 0.99
        True
    """
    x = as_float_array("a", a)
    y = as_float_array("b", b)
    same_length(a=x, b=y)
    xc = x - x.mean()
    yc = y - y.mean()
    denominator = np.sqrt(np.sum(xc * xc) * np.sum(yc * yc))
    if denominator == 0.0:
        return float("nan")
    return float(np.clip(np.sum(xc * yc) / denominator, -1.0, 1.0))


def spearman(a: ArrayLike, b: ArrayLike) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when either is constant.

    Examples:
        >>> spearman([0.1, 0.5, 0.9], [0.0, 0.2, 1.0])
        1.0
    """
    x = as_float_array("a", a)
    y = as_float_array("b", b)
    same_length(a=x, b=y)
    return pearson(rankdata(x), rankdata(y))
