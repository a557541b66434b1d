"""The adaptive sampling loop: draw batches, vote, stop by a rule.

:func:`adaptive_sample` (sync, over :class:`~capgate.Backend`) and :func:`aadaptive_sample`
(async, over :class:`~capgate.AsyncBackend`) both drive one I/O-free plan, :func:`sampling_plan`,
which yields each batch to draw and receives the backend's rows; the bookkeeping lives once in
``_LoopCore``, which :func:`replay` also drives over a pre-drawn pool of graded samples.

Each round draws ``b`` responses (the first ``initial_batch`` if given, e.g. the budget a
capability estimate suggests), groups their answers and asks the stop rule, never past
``max_samples``. The answer is the confidence-weighted vote winner (ties: more raw votes, then
the answer text).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from capgate._util.drive import Steps, adrive, drive, twin_of
from capgate._util.validate import check_positive_int, check_unit_interval
from capgate.cas._state import UNKNOWN_CONFIDENCE_WEIGHT, _Tally
from capgate.cas.confidence import (
    DEFAULT_CONFIDENCE,
    ConfidenceSource,
    ignoring_tags,
    plants_confidence,
    strip_confidence_tag,
)
from capgate.cas.stop import StopFn, StopRule, beta_consensus, cas_frequency_gap, fired_rule, rule_name
from capgate.core.backend import AsyncBackend, Backend, Generation, Prompt, SamplingParams
from capgate.core.types import Extractor, Sample

__all__ = [
    "DEFAULT_STOP",
    "CASResult",
    "DrawnSample",
    "PoolItem",
    "StopReason",
    "aadaptive_sample",
    "adaptive_sample",
    "replay",
    "sample_confidence",
    "sampling_plan",
]

StopReason: TypeAlias = Literal["rule", "max_samples", "pool_exhausted"]
"""Why sampling ended: the stop rule fired, the ``max_samples`` cap was reached, or (replay only)
the pre-drawn pool ran out first."""

PoolItem: TypeAlias = tuple[str | None, bool, float | None, int]
"""One pre-drawn sample for :func:`replay`: (answer, correct, confidence, n_tokens)."""

DEFAULT_STOP: StopRule = cas_frequency_gap(-1.0) | beta_consensus(0.95)
"""Stop by the CAS paper's rule (with probability σ(c1 − c2 + 1), seeded) or, failing
confidences, by the Beta vote rule; the ``max_samples`` cap bounds both. ε = −1 won on the tuning
pools of ``bench/cas_bench.py`` (``bench/RESULTS.md`` has the figures, also on fresh pools)."""


class DrawnSample(BaseModel):
    """One response the loop drew, as it was counted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer: str | None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    n_tokens: int = Field(ge=0)
    correct: bool | None = None
    text: str | None = None


class CASResult(BaseModel):
    """What adaptive sampling produced for one query.

    Attributes:
        answer: The confidence-weighted vote winner (``None`` if no response had an answer).
        samples_used: Responses drawn.
        tokens: Tokens generated.
        votes: Responses per answer.
        vote_shares: Each answer's share of the responses that had an answer.
        weighted_votes: Each answer's confidence-weighted vote.
        mean_confidence: Each answer's mean known per-response confidence (``None`` if none known).
        stop_reason: Why sampling ended.
        stopped_by: The rule that ended it (its repr: for a composite rule, the part that fired,
            e.g. ``beta_consensus(threshold=0.95)``), or the cap.
        batches: Batches drawn.
        elapsed_s: Wall-clock seconds (0 for :func:`replay`).
        correct: Replay only: whether the winner is correct (``None`` live, or with no winner).
        samples: The drawn responses in order (``text`` kept only with ``keep_text=True``).
        tags_ignored: True when the prompt's user or tool turns dictate a confidence tag
            (:func:`~capgate.cas.plants_confidence`), so verbalized tags were not read.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer: str | None
    samples_used: int = Field(ge=0)
    tokens: int = Field(ge=0)
    votes: dict[str, int]
    vote_shares: dict[str, float]
    weighted_votes: dict[str, float]
    mean_confidence: dict[str, float | None]
    stop_reason: StopReason
    stopped_by: str
    batches: int = Field(ge=0)
    elapsed_s: float = Field(ge=0.0)
    correct: bool | None = None
    samples: tuple[DrawnSample, ...] = ()
    tags_ignored: bool = False


class _LoopCore:
    """Everything but I/O: batch sizes, counting, the stop decision and the result."""

    def __init__(
        self,
        stop: StopFn,
        batch_size: int,
        max_samples: int,
        initial_batch: int | None,
        seed: int | np.random.Generator | None,
        unknown_weight: float,
    ) -> None:
        if not callable(stop):
            raise TypeError(f"`stop` must be a stop rule or a function state -> bool; got {stop!r}")
        check_positive_int("batch_size", batch_size)
        check_positive_int("max_samples", max_samples)
        if initial_batch is not None:
            check_positive_int("initial_batch", initial_batch)
        check_unit_interval("unknown_weight", unknown_weight)
        self.stop = stop
        self.batch_size = batch_size
        self.max_samples = max_samples
        self.initial_batch = initial_batch
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.tally = _Tally(rng=rng, max_samples=max_samples, unknown_weight=float(unknown_weight))
        self.samples: list[DrawnSample] = []
        self.batches = 0
        self.fired: StopFn | None = None
        self.tags_ignored = False

    def next_batch_size(self) -> int:
        wanted = self.initial_batch if (self.batches == 0 and self.initial_batch) else self.batch_size
        return max(0, min(wanted, self.max_samples - self.tally.n_samples))

    def absorb(self, sample: DrawnSample) -> None:
        self.tally.add(sample.answer, sample.confidence, sample.n_tokens)
        self.samples.append(sample)

    def end_batch(self, elapsed_s: float) -> StopReason | None:
        """Close a batch; the reason to stop now, or ``None`` to draw another."""
        self.batches += 1
        state = self.tally.snapshot(elapsed_s)
        self.fired = fired_rule(self.stop, state)
        if self.fired is not None:
            return "rule"
        if self.tally.n_samples >= self.max_samples:
            return "max_samples"
        return None

    def result(self, reason: StopReason, elapsed_s: float) -> CASResult:
        state = self.tally.snapshot(elapsed_s)
        winner = state.leader
        answered = state.n_answered
        correct: bool | None = None
        if winner is not None:
            flags = [s.correct for s in self.samples if s.answer == winner]
            correct = flags[0] if flags else None
        if reason == "rule":
            stopped_by = rule_name(self.fired if self.fired is not None else self.stop)
        elif reason == "max_samples":
            stopped_by = f"max_samples={self.max_samples}"
        else:
            stopped_by = f"pool of {self.tally.n_samples}"
        return CASResult(
            answer=winner,
            samples_used=state.n_samples,
            tokens=state.tokens,
            votes=dict(state.votes),
            vote_shares={a: v / answered for a, v in state.votes.items()} if answered else {},
            weighted_votes=state.weighted_votes(),
            mean_confidence={a: state.mean_confidence(a) for a in state.votes},
            stop_reason=reason,
            stopped_by=stopped_by,
            batches=self.batches,
            elapsed_s=elapsed_s,
            correct=correct,
            samples=tuple(self.samples),
            tags_ignored=self.tags_ignored,
        )


def _confidence_of(source: ConfidenceSource | None, generation: Generation) -> float | None:
    """``source(generation)`` (``None`` without a source), checked to be in [0, 1] or ``None``."""
    conf = source(generation) if source is not None else None
    if conf is not None and not (math.isfinite(conf) and 0.0 <= conf <= 1.0):
        raise ValueError(
            f"confidence source {source!r} returned {conf!r}; expected a value in [0, 1] or None"
        )
    return conf


def _drawn(
    generation: Generation, *, extract: Extractor, confidence: ConfidenceSource | None, keep_text: bool
) -> DrawnSample:
    raw = extract(strip_confidence_tag(generation.text))
    if raw is not None and not isinstance(raw, str):
        raise TypeError(f"`extract` must return a string or None; it returned {type(raw).__name__} {raw!r}")
    answer = raw.strip() if raw is not None and raw.strip() else None
    return DrawnSample(
        answer=answer,
        confidence=_confidence_of(confidence, generation),
        n_tokens=generation.n_tokens,
        text=generation.text if keep_text else None,
    )


def _batch_params(params: SamplingParams, n: int, drawn: int) -> SamplingParams:
    """``params`` for a batch of ``n``; a fixed seed is offset by ``drawn`` (or every batch would repeat)."""
    update: dict[str, object] = {"n": n}
    if params.seed is not None:
        update["seed"] = params.seed + drawn
    return params.model_copy(update=update)


def _first_row(rows: list[list[Generation]], n: int) -> list[Generation]:
    if not rows or not rows[0]:
        raise RuntimeError(
            f"the backend returned no generations for a batch of {n}; cannot continue sampling"
        )
    return rows[0][:n]


def sampling_plan(
    prompt: Prompt,
    *,
    extract: Extractor,
    stop: StopFn = DEFAULT_STOP,
    batch_size: int = 4,
    max_samples: int = 40,
    initial_batch: int | None = None,
    confidence: ConfidenceSource | None = DEFAULT_CONFIDENCE,
    params: SamplingParams | None = None,
    seed: int | np.random.Generator | None = None,
    unknown_weight: float = UNKNOWN_CONFIDENCE_WEIGHT,
    keep_text: bool = False,
) -> Steps[CASResult]:
    """The loop of :func:`adaptive_sample` without its I/O: yields each batch to draw, gets its rows."""
    core = _LoopCore(stop, batch_size, max_samples, initial_batch, seed, unknown_weight)
    if confidence is not None and plants_confidence(prompt):  # an injected tag must not steer the vote
        confidence = ignoring_tags(confidence)
        core.tags_ignored = True
    base = params or SamplingParams()
    start = time.monotonic()
    while True:
        n = core.next_batch_size()
        rows = yield [prompt], _batch_params(base, n, core.tally.n_samples)
        for generation in _first_row(rows, n):
            core.absorb(_drawn(generation, extract=extract, confidence=confidence, keep_text=keep_text))
        reason = core.end_batch(time.monotonic() - start)
        if reason is not None:
            return core.result(reason, time.monotonic() - start)


@twin_of(sampling_plan)
def adaptive_sample(backend: Backend, *args: Any, **kwargs: Any) -> CASResult:
    """Sample ``prompt`` in batches until ``stop`` says so (or ``max_samples``), then vote.

    Args:
        backend: The model to sample from.
        prompt: The query (add :func:`~capgate.cas.with_confidence_instruction` for verbalized
            confidence).
        extract: Maps a response text (its confidence tag removed) to a normalized answer, or
            ``None`` when it has none; responses group by that form.
        stop: A stop rule or a function ``SamplingState -> bool``, asked after every batch.
        batch_size: Responses per batch after the first.
        max_samples: Hard cap on responses drawn.
        initial_batch: Size of the first batch (e.g. :func:`~capgate.cas.samples_for_target`);
            defaults to ``batch_size``.
        confidence: Per-response confidence source, or ``None`` for plain majority voting.
        params: Sampling parameters (``n`` is set per batch; a ``seed`` is offset per batch).
        seed: Seed (or generator) of the RNG handed to stochastic stop rules.
        unknown_weight: Vote weight of a response whose confidence is ``None``.
        keep_text: Keep response texts in ``result.samples``.

    Returns:
        The vote winner and the accounting of how it was reached.

    Examples:
        >>> from capgate.core.backend import Generation
        >>> class Fixed:
        ...     model_id = "fixed"
        ...     def generate(self, prompts, params):
        ...         return [[Generation(text="4 [confidence=90%]", n_tokens=5)] * params.n]
        >>> r = adaptive_sample(Fixed(), "2+2?", extract=lambda t: t.split()[0], batch_size=2, seed=0)
        >>> r.answer, r.samples_used, r.stop_reason
        ('4', 2, 'rule')
    """
    return drive(sampling_plan(*args, **kwargs), lambda request: backend.generate(*request))


@twin_of(sampling_plan)
async def aadaptive_sample(backend: AsyncBackend, *args: Any, **kwargs: Any) -> CASResult:
    """Async twin of :func:`adaptive_sample` over an :class:`~capgate.AsyncBackend`.

    Examples:
        >>> import asyncio
        >>> from capgate.core.backend import Generation
        >>> class Fixed:
        ...     model_id = "fixed"
        ...     async def agenerate(self, prompts, params):
        ...         return [[Generation(text="4 [confidence=90%]", n_tokens=5)] * params.n]
        >>> asyncio.run(aadaptive_sample(Fixed(), "2+2?", extract=str.strip)).samples_used
        4
    """
    return await adrive(sampling_plan(*args, **kwargs), lambda request: backend.agenerate(*request))


def sample_confidence(sample: Sample) -> float | None:
    """A graded sample's confidence: its own (e.g. a verbalized tag) if stored, else exp(mean token
    log-prob), else unknown: the order :data:`~capgate.cas.DEFAULT_CONFIDENCE` uses.

    Examples:
        >>> round(sample_confidence(Sample(answer="4", correct=True, mean_logprob=-0.1)), 4)
        0.9048
    """
    if sample.confidence is None and sample.mean_logprob is not None:
        return math.exp(sample.mean_logprob)
    return sample.confidence


def _pool_item(item: PoolItem | Sample, index: int) -> DrawnSample:
    if isinstance(item, Sample):
        return DrawnSample(
            answer=item.answer,
            confidence=sample_confidence(item),
            n_tokens=item.n_tokens or 0,
            correct=item.correct,
        )
    if not (isinstance(item, tuple | list) and len(item) == 4):
        raise ValueError(
            f"pool[{index}] must be (answer, correct, confidence, n_tokens) or a capgate.Sample; got {item!r}"
        )
    answer, correct, conf, n_tokens = item
    if answer is not None and not isinstance(answer, str):
        raise ValueError(f"pool[{index}]: answer must be a string or None; got {answer!r}")
    if not isinstance(correct, bool | np.bool_):
        raise ValueError(f"pool[{index}]: correct must be a bool; got {correct!r}")
    if conf is not None and not (isinstance(conf, int | float) and 0.0 <= conf <= 1.0):
        raise ValueError(f"pool[{index}]: confidence must be in [0, 1] or None; got {conf!r}")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int | np.integer) or n_tokens < 0:
        raise ValueError(f"pool[{index}]: n_tokens must be a non-negative integer; got {n_tokens!r}")
    return DrawnSample(
        answer=answer,
        confidence=None if conf is None else float(conf),
        n_tokens=int(n_tokens),
        correct=bool(correct),
    )


def replay(
    pool: Sequence[PoolItem | Sample],
    *,
    stop: StopFn = DEFAULT_STOP,
    batch_size: int = 4,
    max_samples: int | None = None,
    initial_batch: int | None = None,
    seed: int | np.random.Generator | None = None,
    unknown_weight: float = UNKNOWN_CONFIDENCE_WEIGHT,
) -> CASResult:
    """Run the sampling loop over pre-drawn, graded samples, taken in the given order.

    The same batching, counting and stop decisions as :func:`adaptive_sample` (whose arguments
    these are too), with no model: the benchmark replays harvested pools (shuffle them first for a
    random draw order). ``result.correct`` is the ``correct`` flag of the winner's first drawn
    response (responses grouped under one normalized answer are graded alike by construction).

    Args:
        pool: ``(answer, correct, confidence, n_tokens)`` tuples or :class:`~capgate.Sample` s (a
            sample's confidence is :func:`sample_confidence`).
        max_samples: Cap (defaults to the pool size); a pool that runs out first ends with
            ``stop_reason="pool_exhausted"``.

    Examples:
        >>> pool = [("12", True, 0.9, 100), ("12", True, 0.8, 90), ("13", False, 0.3, 120)]
        >>> r = replay(pool, batch_size=1, seed=0)
        >>> r.answer, r.correct, r.samples_used, r.tokens
        ('12', True, 1, 100)
    """
    items = [_pool_item(item, i) for i, item in enumerate(pool)]
    if not items:
        raise ValueError("replay needs a non-empty pool of samples")
    cap = len(items) if max_samples is None else max_samples
    core = _LoopCore(stop, batch_size, cap, initial_batch, seed, unknown_weight)
    position = 0
    while True:
        n = core.next_batch_size()
        batch = items[position : position + n]
        position += len(batch)
        for sample in batch:
            core.absorb(sample)
        reason = core.end_batch(0.0)
        if reason is not None:
            return core.result(reason, 0.0)
        if position >= len(items):
            return core.result("pool_exhausted", 0.0)
