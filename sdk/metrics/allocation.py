"""Allocation: splitting one sampling budget across queries by predicted capability.

(A single query's budget is :func:`capgate.cas.samples_for_target`; an adaptive split that also
watches the votes is :class:`capgate.cas.BatchAllocator`.)
"""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import ArrayLike

from capgate._util.validate import (
    IntArray,
    as_counts,
    as_probabilities,
    check_int_at_least,
    check_positive_int,
    same_length,
)

__all__ = ["greedy_allocation", "uniform_allocation"]

_CLIP = 1e-6


def _caps(max_per_query: ArrayLike | int | None, n: int) -> IntArray | None:
    if max_per_query is None:
        return None
    if np.ndim(max_per_query) == 0:
        return as_counts("max_per_query", np.full(n, max_per_query))
    caps = as_counts("max_per_query", max_per_query)
    same_length(p=np.empty(n), max_per_query=caps)
    return caps


def greedy_allocation(p: ArrayLike, budget: int, *, max_per_query: ArrayLike | int | None = None) -> IntArray:
    """Spend ``budget`` samples where each one raises the expected pass rate most.

    One sample at a time goes to argmax_i p_i (1 − p_i)^{k_i}, the gain in 1 − (1 − p_i)^k
    from query i's next sample; with p clipped to [1e-6, 1 − 1e-6] every query stays eligible.
    Because the gains shrink with k, this greedy choice maximizes Σ_i 1 − (1 − p_i)^{k_i}
    exactly. A heap keeps each step O(log N). Ties go to the lower index.

    Args:
        p: Predicted capabilities.
        budget: Total samples to hand out (>= 0).
        max_per_query: Cap per query (e.g. the pooled samples available), an int or one per query.
            When every query is capped, the rest of the budget stays unspent.

    Returns:
        Samples per query (int64), summing to at most ``budget``.

    Examples:
        >>> greedy_allocation([0.9, 0.1], 3).tolist()
        [1, 2]
    """
    pa = np.clip(as_probabilities("p", p), _CLIP, 1.0 - _CLIP)
    budget = check_int_at_least("budget", budget, 0)
    caps = _caps(max_per_query, len(pa))
    heap = [(-float(g), i) for i, g in enumerate(pa.tolist()) if caps is None or caps[i] > 0]
    heapq.heapify(heap)
    decay = (1.0 - pa).tolist()
    counts = [0] * len(pa)
    cap_list = None if caps is None else caps.tolist()
    for _ in range(budget):
        if not heap:
            break
        negative_gain, i = heap[0]
        counts[i] += 1
        if cap_list is not None and counts[i] >= cap_list[i]:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (negative_gain * decay[i], i))
    return np.array(counts, dtype=np.int64)


def uniform_allocation(
    n_queries: int, budget: int, *, max_per_query: ArrayLike | int | None = None
) -> IntArray:
    """Spread ``budget`` evenly: budget // N each, the remainder one apiece to the first queries.

    Caps are applied after spreading (what a capped query cannot take is not moved elsewhere).

    Examples:
        >>> uniform_allocation(3, 7).tolist()
        [3, 2, 2]
    """
    n_queries = check_positive_int("n_queries", n_queries)
    budget = check_int_at_least("budget", budget, 0)
    base, remainder = divmod(budget, n_queries)
    allocation = np.full(n_queries, base, dtype=np.int64)
    allocation[:remainder] += 1
    caps = _caps(max_per_query, n_queries)
    return allocation if caps is None else np.minimum(allocation, caps)
