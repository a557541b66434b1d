"""Token accounting of an OpenAI-compatible response: per-sample counts from a request's total.

Servers report usage per request, not per sample; these helpers split it (exactly for one sample,
by text length for several) and combine log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def logaddexp(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def apportion(total: int, weights: Sequence[int], cap: int | None = None) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder), none above ``cap``.

    The parts sum to ``total`` unless the cap makes that impossible (then each part is ``cap``).
    """
    if not weights:
        return []
    if cap is not None:
        total = min(total, cap * len(weights))
    counts = [0] * len(weights)
    free = list(range(len(weights)))
    left = total
    while left > 0 and free:
        weight_sum = sum(weights[i] for i in free)
        shares = {i: left * (weights[i] / weight_sum if weight_sum > 0 else 1 / len(free)) for i in free}
        give = {i: int(shares[i]) for i in free}
        for i in sorted(free, key=lambda i: shares[i] - give[i], reverse=True)[: left - sum(give.values())]:
            give[i] += 1
        for i in free:
            room = give[i] if cap is None else min(give[i], cap - counts[i])
            counts[i] += room
            left -= room
        free = [i for i in free if cap is None or counts[i] < cap]
        if cap is None:
            break
    return counts


def split_tokens(
    total: int, texts: Sequence[str], finish: Sequence[str | None], max_tokens: int | None
) -> list[int]:
    """Per-sample token counts from a request's total when the server gave no per-sample count.

    Samples cut by the length limit used exactly ``max_tokens``; the rest of the total is split
    by text length, none above ``max_tokens``. Exact for one sample, an estimate for several.
    """
    if len(texts) == 1:
        return [total]
    counts = [0] * len(texts)
    free: list[int] = []
    for i, reason in enumerate(finish):
        if reason == "length" and max_tokens is not None:
            counts[i] = max_tokens
        else:
            free.append(i)
    rest = apportion(max(0, total - sum(counts)), [len(texts[i]) for i in free], max_tokens)
    for i, count in zip(free, rest, strict=True):
        counts[i] = count
    return counts
