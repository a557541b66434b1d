"""One sample budget shared by a batch of queries, spent where a vote is still open.

:func:`capgate.metrics.greedy_allocation` splits a budget up front from the capability estimates alone.
:class:`BatchAllocator` spends it *adaptively*: every query gets a first sample, then each next
sample goes to the query with the highest priority

    priority_i = p_i · (1 − P(X_i > 1/2)),   X_i ~ Beta(v1_i + 1, v2_i + 1),

where p_i is the capability estimate (the prior: a query the model rarely gets right gains little
from a longer vote) and v1_i, v2_i are the vote counts of its two leading answers so far (the
evidence: 1 − P(X > 1/2) is the posterior chance that the runner-up, not the leader, is the more
frequent answer, i.e. that more samples change the vote's outcome). A query with no answer yet
has v1 = v2 = 0 and an open vote (1/2). Ties go to the lower index. The answer of each query is
its confidence-weighted vote winner, as in :func:`~capgate.cas.adaptive_sample`.

:class:`BatchAllocator` is the I/O-free core (``next_queries`` / ``observe``);
:func:`batch_adaptive_sample` drives it over a :class:`~capgate.Backend`, one ``generate`` call per
round. ``bench/cas_bench.py`` replays it on harvested pools against uniform fixed-N and the
up-front greedy allocation.

Examples:
    >>> alloc = BatchAllocator([0.9, 0.05], budget=6, max_per_query=5)
    >>> alloc.next_queries(2)
    [0, 1]
    >>> alloc.observe(0, "4", 0.9); alloc.observe(1, "7", 0.2)
    >>> alloc.next_queries(1)  # query 0's vote is as open, but its prior is far higher
    [0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from capgate._util.validate import check_int_at_least, check_positive_int
from capgate.cas._state import UNKNOWN_CONFIDENCE_WEIGHT
from capgate.cas.budget import _capabilities
from capgate.cas.confidence import DEFAULT_CONFIDENCE, ConfidenceSource, strip_confidence_tag
from capgate.cas.loop import _batch_params, _confidence_of
from capgate.cas.stop import beta_prob_above_half
from capgate.core.backend import Backend, Prompt, SamplingParams
from capgate.core.types import Estimate, Extractor

__all__ = ["BatchAllocator", "BatchResult", "batch_adaptive_sample"]


class BatchResult(BaseModel):
    """What :func:`batch_adaptive_sample` produced.

    Attributes:
        answers: Per query, the confidence-weighted vote winner (``None`` without an answer).
        samples: Per query, the samples drawn.
        rounds: ``generate`` calls made.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    answers: list[str | None]
    samples: list[int]
    rounds: int = Field(ge=0)


class BatchAllocator:
    """Adaptive allocation of one sample budget over a batch (see the module docstring).

    Args:
        estimates: Capability estimate per query (float, :class:`~capgate.Estimate` or ``None``).
        budget: Samples to spend in all.
        max_per_query: Most samples any one query gets.
        fill_unavailable: Stand-in for an unavailable estimate; without it one is an error
            naming its index (no silent default).
        unknown_weight: Vote weight of a response of unknown confidence.
    """

    def __init__(
        self,
        estimates: Sequence[float | Estimate | None],
        budget: int,
        *,
        max_per_query: int = 40,
        fill_unavailable: float | None = None,
        unknown_weight: float = UNKNOWN_CONFIDENCE_WEIGHT,
    ) -> None:
        self.budget = check_int_at_least("budget", budget, 0)
        self.max_per_query = check_positive_int("max_per_query", max_per_query)
        self.priors = priors = _capabilities(estimates, fill_unavailable=fill_unavailable)
        self.unknown_weight = unknown_weight
        self.drawn = [0] * len(priors)
        self.pending = [0] * len(priors)
        self.votes: list[dict[str, int]] = [{} for _ in priors]
        self.weights: list[dict[str, float]] = [{} for _ in priors]

    @property
    def spent(self) -> int:
        """Samples handed out so far (observed or pending)."""
        return sum(self.drawn) + sum(self.pending)

    def priority(self, i: int) -> float:
        """p_i · (1 − P(X > 1/2)) for query ``i`` with its current top-two vote counts."""
        counts = [*sorted(self.votes[i].values(), reverse=True), 0, 0]
        return self.priors[i] * (1.0 - beta_prob_above_half(counts[0] + 1, counts[1] + 1))

    def next_queries(self, n: int) -> list[int]:
        """Up to ``n`` query indices to sample next (one sample each), fewer when the budget or
        every query's cap runs out. Queries never sampled come first, in order; a query whose
        sample is still pending (not yet observed) waits for it."""
        left = max(0, min(check_positive_int("n", n), self.budget - self.spent))
        open_ = [
            i for i in range(len(self.priors)) if self.pending[i] == 0 and self.drawn[i] < self.max_per_query
        ]
        chosen = [i for i in open_ if self.drawn[i] == 0][:left]
        taken = set(chosen)
        ranked = sorted((i for i in open_ if i not in taken), key=lambda i: (-self.priority(i), i))
        chosen.extend(ranked[: max(0, left - len(chosen))])
        for i in chosen:
            self.pending[i] += 1
        return chosen

    def observe(self, i: int, answer: str | None, confidence: float | None) -> None:
        """Count one drawn response of query ``i`` (its extracted answer and confidence)."""
        if self.pending[i] > 0:
            self.pending[i] -= 1
        self.drawn[i] += 1
        if answer is None:
            return
        self.votes[i][answer] = self.votes[i].get(answer, 0) + 1
        weight = self.unknown_weight if confidence is None else confidence
        self.weights[i][answer] = self.weights[i].get(answer, 0.0) + weight

    def answer(self, i: int) -> str | None:
        """Query ``i``'s confidence-weighted vote winner (ties: more votes, then the text)."""
        weights, votes = self.weights[i], self.votes[i]
        if not weights:
            return None
        return min(weights, key=lambda a: (-weights[a], -votes[a], a))


def batch_adaptive_sample(
    backend: Backend,
    prompts: Sequence[Prompt],
    estimates: Sequence[float | Estimate | None],
    *,
    budget: int,
    extract: Extractor,
    per_round: int | None = None,
    max_per_query: int = 40,
    confidence: ConfidenceSource | None = DEFAULT_CONFIDENCE,
    params: SamplingParams | None = None,
    fill_unavailable: float | None = None,
) -> BatchResult:
    """Spend ``budget`` samples over ``prompts`` adaptively and vote each query's answer.

    Each round asks :class:`BatchAllocator` for ``per_round`` queries (default: half the batch,
    rounded up, so that the lower-priority half waits) and draws one response for each in a single
    ``generate`` call. A smaller ``per_round`` follows the priorities more closely at the price of
    more rounds.
    """
    if len(prompts) != len(estimates):
        raise ValueError(f"{len(prompts)} prompts but {len(estimates)} estimates; give one per prompt")
    if per_round is None:
        per_round = max(1, math.ceil(len(prompts) / 2))
    per_round = check_positive_int("per_round", per_round)
    alloc = BatchAllocator(estimates, budget, max_per_query=max_per_query, fill_unavailable=fill_unavailable)
    base = params or SamplingParams()
    rounds = 0
    while True:
        chosen = alloc.next_queries(per_round)
        if not chosen:
            break
        rows = backend.generate([prompts[i] for i in chosen], _batch_params(base, 1, alloc.spent))
        rounds += 1
        for i, row in zip(chosen, rows, strict=True):
            if not row:
                raise RuntimeError(f"the backend returned no response for query {i}")
            raw = extract(strip_confidence_tag(row[0].text))
            answer = raw.strip() if isinstance(raw, str) and raw.strip() else None
            alloc.observe(i, answer, _confidence_of(confidence, row[0]))
    return BatchResult(
        answers=[alloc.answer(i) for i in range(len(prompts))], samples=list(alloc.drawn), rounds=rounds
    )
