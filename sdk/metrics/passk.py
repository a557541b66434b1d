"""pass@k: the unbiased estimator from n samples, and its prediction from a capability p."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from capgate._util.validate import (
    FloatArray,
    IntArray,
    as_counts,
    as_probabilities,
    check_positive_int,
    same_length,
)

__all__ = [
    "PassAtKInterval",
    "dataset_pass_at_k",
    "expected_success",
    "pass_at_k_mse",
    "pass_at_k_predicted",
    "pass_at_k_unbiased",
]


def _miss_probability(n: IntArray, c: IntArray, k: IntArray) -> FloatArray:
    """C(n−c, k) / C(n, k) per row: the chance that k draws without replacement all miss (1 for k = 0).

    The product Π_{j<k} (n−c−j)/(n−j) of factors in [0, 1] cannot overflow or cancel; each distinct
    (n, c, k) triple (real data repeats them) is computed once.
    """
    span_c, span_k = int(c.max()) + 1, int(k.max()) + 1
    if (int(n.max()) + 1) * span_c * span_k < 2**62:
        # One int64 key per triple: sorting integers is far faster than np.unique(axis=0).
        keys = (n * span_c + c) * span_k + k
        unique_keys, inverse = np.unique(keys, return_inverse=True)
        uk = unique_keys % span_k
        uc = (unique_keys // span_k) % span_c
        un = unique_keys // (span_k * span_c)
    else:
        unique, inverse = np.unique(np.stack([n, c, k], axis=1), axis=0, return_inverse=True)
        un, uc, uk = unique[:, 0], unique[:, 1], unique[:, 2]
    result = np.ones(len(un), dtype=np.float64)
    wrong = (un - uc).astype(np.float64)
    total = un.astype(np.float64)
    for j in range(int(uk.max()) if len(uk) else 0):
        active = uk > j
        factor = np.clip(wrong[active] - j, 0.0, None) / (total[active] - j)
        result[active] *= factor
    miss: FloatArray = result[inverse.reshape(-1)]
    return miss


def _counts(n: ArrayLike, c: ArrayLike) -> tuple[IntArray, IntArray]:
    na = as_counts("n", n, minimum=1)
    ca = as_counts("c", c)
    same_length(n=na, c=ca)
    if (ca > na).any():
        bad = int(np.flatnonzero(ca > na)[0])
        raise ValueError(f"`c` must be <= `n`; got c={ca[bad]}, n={na[bad]} at index {bad}")
    return na, ca


def pass_at_k_unbiased(n: ArrayLike, c: ArrayLike, k: int) -> FloatArray:
    """Unbiased pass@k estimate 1 − C(n−c, k)/C(n, k) per query (Chen et al., 2021).

    Args:
        n: Samples drawn per query.
        c: Correct samples per query.
        k: Attempts; must not exceed any n.

    Examples:
        >>> pass_at_k_unbiased([4], [1], 2).round(4).tolist()
        [0.5]
    """
    na, ca = _counts(n, c)
    k = check_positive_int("k", k)
    if (na < k).any():
        raise ValueError(f"`k` must be <= n for every query; got k={k}, smallest n={int(na.min())}")
    return 1.0 - _miss_probability(na, ca, np.full(len(na), k, dtype=np.int64))


def pass_at_k_predicted(p: ArrayLike, k: int) -> FloatArray:
    """pass@k predicted from a capability: 1 − (1 − p)^k.

    Examples:
        >>> pass_at_k_predicted([0.5], 2).tolist()
        [0.75]
    """
    pa = as_probabilities("p", p)
    k = check_positive_int("k", k)
    return 1.0 - (1.0 - pa) ** k


def pass_at_k_mse(p: ArrayLike, n: ArrayLike, c: ArrayLike, ks: Iterable[int]) -> dict[int, float]:
    """Instance-level MSE between predicted and unbiased pass@k, for each k in ``ks``.

    Examples:
        >>> pass_at_k_mse([1.0], [4], [4], [1, 2])
        {1: 0.0, 2: 0.0}
    """
    pa = as_probabilities("p", p)
    na, ca = _counts(n, c)
    same_length(p=pa, n=na)
    return {
        int(k): float(np.mean((pass_at_k_predicted(pa, k) - pass_at_k_unbiased(na, ca, k)) ** 2)) for k in ks
    }


@dataclass(frozen=True)
class PassAtKInterval:
    """Dataset-level predicted pass@k with a 95% interval.

    ``std`` is σ_k = sqrt(Σ S_i(1 − S_i)) / N, the spread of the success rate when each query
    succeeds independently with probability S_i = 1 − (1 − p_i)^k.
    """

    k: int
    mean: float
    std: float
    low: float
    high: float


def dataset_pass_at_k(p: ArrayLike, k: int, *, z: float = 1.959963984540054) -> PassAtKInterval:
    """Predicted dataset-level pass@k: the mean of 1 − (1 − p_i)^k with a normal interval.

    Examples:
        >>> dataset_pass_at_k([0.5, 0.5], 1).mean
        0.5
    """
    s = pass_at_k_predicted(p, k)
    mean = float(s.mean())
    std = float(np.sqrt(np.sum(s * (1.0 - s))) / len(s))
    return PassAtKInterval(
        k=k, mean=mean, std=std, low=max(0.0, mean - z * std), high=min(1.0, mean + z * std)
    )


def expected_success(allocation: ArrayLike, n: ArrayLike, c: ArrayLike) -> float:
    """Exact expected success rate of an allocation evaluated on pooled samples.

    Query i gets ``allocation[i]`` draws without replacement from its pool of ``n[i]`` samples
    with ``c[i]`` correct, and succeeds if any draw is correct: 1 − C(n−c, k)/C(n, k) (0 when it
    gets no draw). Returns the mean over queries.

    Examples:
        >>> expected_success([1, 0], [2, 2], [1, 2])
        0.25
    """
    na, ca = _counts(n, c)
    ka = as_counts("allocation", allocation)
    same_length(allocation=ka, n=na)
    if (ka > na).any():
        bad = int(np.flatnonzero(ka > na)[0])
        raise ValueError(
            f"an allocation cannot exceed the pool; got {ka[bad]} draws from {na[bad]} at index {bad}"
        )
    return float(np.mean(1.0 - _miss_probability(na, ca, ka)))
