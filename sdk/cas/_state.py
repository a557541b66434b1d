"""The frozen state every stop rule receives, and the tally that builds it.

The loop keeps one mutable :class:`_Tally` per query and hands each stop rule an immutable
:class:`SamplingState` snapshot, so no rule can disturb the loop's bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from capgate._util.validate import check_int_at_least, check_unit_interval

UNKNOWN_CONFIDENCE_WEIGHT = 0.5
"""Vote weight of a response whose confidence could not be had (no parsable verbalized tag and no
log-probabilities). 0.5 is the weight of an uninformative "coin flip" response: such a vote still
counts, at half the weight of a certain one, and it is *excluded* from the answer's mean confidence
(which averages known confidences only), so an unknown never masquerades as a measured 0.5."""


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SamplingState:
    """What a stop rule sees after a batch: an immutable snapshot of the sampling so far.

    Attributes:
        n_samples: Responses drawn so far (including those without an extractable answer).
        votes: Responses per normalized answer.
        confidences: Per normalized answer, the per-response confidences in draw order
            (``None`` where a response's confidence could not be had).
        tokens: Generated tokens so far.
        elapsed_s: Wall-clock seconds since sampling started (0 in :func:`~capgate.cas.replay`
            unless the pool says otherwise).
        rng: Random generator for stochastic rules; seeded by the loop for reproducibility.
        n_unanswered: Responses from which no answer could be extracted.
        max_samples: The loop's hard cap, if known.
        unknown_weight: Vote weight given to a response of unknown confidence.

    Examples:
        >>> import numpy as np
        >>> s = SamplingState.build(votes={"4": 3, "5": 1},
        ...                         confidences={"4": (0.9, 0.8, None), "5": (0.4,)},
        ...                         rng=np.random.default_rng(0))
        >>> s.n_samples, s.leader, round(s.mean_confidence("4") or 0, 2)
        (4, '4', 0.85)
    """

    n_samples: int = 0
    votes: Mapping[str, int] = field(default_factory=_empty)
    confidences: Mapping[str, tuple[float | None, ...]] = field(default_factory=_empty)
    tokens: int = 0
    elapsed_s: float = 0.0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    n_unanswered: int = 0
    max_samples: int | None = None
    unknown_weight: float = UNKNOWN_CONFIDENCE_WEIGHT

    @classmethod
    def build(
        cls,
        *,
        votes: Mapping[str, int],
        confidences: Mapping[str, tuple[float | None, ...]] | None = None,
        tokens: int = 0,
        elapsed_s: float = 0.0,
        rng: np.random.Generator | None = None,
        n_unanswered: int = 0,
        max_samples: int | None = None,
        unknown_weight: float = UNKNOWN_CONFIDENCE_WEIGHT,
    ) -> SamplingState:
        """A state from plain mappings (``n_samples`` is derived: votes + unanswered).

        Missing per-answer confidences are filled in as unknown (``None``) for each vote.
        """
        conf: dict[str, tuple[float | None, ...]] = {}
        for answer, count in votes.items():
            given = tuple((confidences or {}).get(answer, (None,) * count))
            if len(given) != count:
                raise ValueError(
                    f"answer {answer!r} has {count} votes but {len(given)} confidences; they must match"
                )
            conf[answer] = given
        return cls(
            n_samples=sum(votes.values()) + n_unanswered,
            votes=MappingProxyType(dict(votes)),
            confidences=MappingProxyType(conf),
            tokens=tokens,
            elapsed_s=elapsed_s,
            rng=rng if rng is not None else np.random.default_rng(),
            n_unanswered=n_unanswered,
            max_samples=max_samples,
            unknown_weight=unknown_weight,
        )

    def mean_confidence(self, answer: str) -> float | None:
        """Mean of the *known* confidences of the responses giving ``answer`` (``None`` if none known)."""
        known = [c for c in self.confidences.get(answer, ()) if c is not None]
        return math.fsum(known) / len(known) if known else None

    def weighted_votes(self) -> dict[str, float]:
        """Confidence-weighted vote per answer: the sum of its responses' confidences, an
        unknown confidence counting as :attr:`unknown_weight`."""
        return {
            answer: math.fsum(self.unknown_weight if c is None else c for c in confs)
            for answer, confs in self.confidences.items()
        }

    def ranked(self) -> list[str]:
        """Answers best first: by confidence-weighted vote, then raw votes, then the answer text
        (so ties resolve the same way on every run)."""
        weighted = self.weighted_votes()
        return sorted(weighted, key=lambda a: (-weighted[a], -self.votes.get(a, 0), a))

    @property
    def leader(self) -> str | None:
        """The answer the loop would return now (``None`` before any answer was extracted)."""
        ranked = self.ranked()
        return ranked[0] if ranked else None

    @property
    def n_answered(self) -> int:
        """Responses with an extracted answer."""
        return self.n_samples - self.n_unanswered

    def top_two_counts(self) -> tuple[int, int]:
        """Vote counts of the two most-voted answers (0 for a missing runner-up)."""
        counts = [*sorted(self.votes.values(), reverse=True), 0, 0]
        return counts[0], counts[1]


class _Tally:
    """The mutable accumulator behind :class:`SamplingState`, shared by the sync loop, the async
    loop and :func:`~capgate.cas.replay` (the non-I/O core of all three)."""

    def __init__(self, *, rng: np.random.Generator, max_samples: int, unknown_weight: float) -> None:
        self.rng = rng
        self.max_samples = max_samples
        self.unknown_weight = unknown_weight
        self.n_samples = 0
        self.n_unanswered = 0
        self.tokens = 0
        self.votes: dict[str, int] = {}
        self.confidences: dict[str, list[float | None]] = {}

    def add(self, answer: str | None, confidence: float | None, n_tokens: int) -> None:
        if confidence is not None:
            check_unit_interval("confidence", confidence)
        check_int_at_least("n_tokens", n_tokens, 0)
        self.n_samples += 1
        self.tokens += n_tokens
        if answer is None:
            self.n_unanswered += 1
            return
        self.votes[answer] = self.votes.get(answer, 0) + 1
        self.confidences.setdefault(answer, []).append(confidence)

    def snapshot(self, elapsed_s: float) -> SamplingState:
        return SamplingState.build(
            votes=self.votes,
            confidences={a: tuple(c) for a, c in self.confidences.items()},
            tokens=self.tokens,
            elapsed_s=elapsed_s,
            rng=self.rng,
            n_unanswered=self.n_unanswered,
            max_samples=self.max_samples,
            unknown_weight=self.unknown_weight,
        )
