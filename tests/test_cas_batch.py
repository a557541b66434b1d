"""BatchAllocator / batch_adaptive_sample: one budget over a batch, spent where votes are open."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from capgate import Estimate, Generation, SamplingParams
from capgate.cas import BatchAllocator, batch_adaptive_sample, beta_prob_above_half


def test_every_query_gets_a_first_sample_before_any_gets_a_second() -> None:
    alloc = BatchAllocator([0.1, 0.9, 0.5], budget=10)
    assert alloc.next_queries(2) == [0, 1]
    assert alloc.next_queries(5) == [2]  # 0 and 1 wait for their pending samples
    alloc.observe(0, "a", None)
    assert alloc.next_queries(5) == [0]


def test_priority_is_prior_times_the_chance_the_vote_turns() -> None:
    alloc = BatchAllocator([0.8, 0.8, 0.2], budget=100)
    alloc.next_queries(3)
    for i, answers in enumerate((["a"], ["a"], ["a"])):
        for a in answers:
            alloc.observe(i, a, None)
    alloc.observe(1, "b", None)  # query 1 now has a 1-1 tie: its vote is the most open
    assert alloc.priority(1) == pytest.approx(0.8 * (1 - beta_prob_above_half(2, 2)))
    assert alloc.priority(0) == pytest.approx(0.8 * (1 - beta_prob_above_half(2, 1)))
    assert alloc.priority(2) == pytest.approx(0.2 * (1 - beta_prob_above_half(2, 1)))
    assert alloc.next_queries(1) == [1]
    alloc.observe(1, "a", None)
    # unanimous votes close: after five "a" on query 0 its priority falls below query 2's open one
    for _ in range(5):
        alloc.observe(0, "a", None)
    assert alloc.priority(0) < alloc.priority(2) or alloc.priority(0) < 0.8 * 0.02


def test_budget_and_caps_are_respected() -> None:
    alloc = BatchAllocator([0.5, 0.5], budget=7, max_per_query=3)
    handed = []
    while chosen := alloc.next_queries(2):
        handed.extend(chosen)
        for i in chosen:
            alloc.observe(i, "x" if i else None, 0.5)
    assert len(handed) == 6  # both capped at 3 before the budget of 7 is spent
    assert alloc.drawn == [3, 3]
    assert alloc.answer(0) is None
    assert alloc.answer(1) == "x"


def test_a_non_positive_count_is_refused_and_a_spent_budget_hands_out_nothing() -> None:
    alloc = BatchAllocator([0.5] * 4, budget=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="`n` must be a positive integer"):
            alloc.next_queries(bad)  # type: ignore[arg-type]
    assert alloc.spent == 0
    for _ in range(3):  # more responses observed than were handed out: the budget is overspent
        alloc.observe(0, "a", None)
    assert alloc.next_queries(2) == []
    backend = Scripted()
    for bad_round in (0, -2):
        with pytest.raises(ValueError, match="`per_round` must be a positive integer"):
            batch_adaptive_sample(
                backend, ["easy"] * 6, [0.5] * 6, budget=2, extract=str.strip, per_round=bad_round
            )
    assert backend.calls == []


def test_unavailable_estimates_fail_closed_unless_filled() -> None:
    with pytest.raises(ValueError, match=r"estimates\[1\] is unavailable"):
        BatchAllocator([0.5, Estimate.unavailable("probe", "server down")], budget=4)
    alloc = BatchAllocator([0.5, None], budget=4, fill_unavailable=0.2)
    assert alloc.priors == [0.5, 0.2]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="budget"):
            BatchAllocator([0.5], budget=bad)  # type: ignore[arg-type]


def test_weighted_vote_picks_the_confident_answer() -> None:
    alloc = BatchAllocator([0.5], budget=3)
    for answer, conf in (("a", 0.2), ("a", 0.2), ("b", 0.9)):
        alloc.next_queries(1)
        alloc.observe(0, answer, conf)
    assert alloc.answer(0) == "b"


class Scripted:
    """Query "easy" always answers 4; query "split" alternates 1/2; "hard" answers at random."""

    model_id = "scripted"

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.turn = 0

    def generate(self, prompts: Sequence[Any], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append(list(prompts))
        rows = []
        for prompt in prompts:
            self.turn += 1
            text = {"easy": "4", "split": str(1 + self.turn % 2), "hard": str(self.turn)}[prompt]
            rows.append([Generation(text=text, n_tokens=1)])
        return rows


def test_live_batch_spends_the_budget_where_the_vote_is_open() -> None:
    backend = Scripted()
    result = batch_adaptive_sample(
        backend,
        ["easy", "split", "hard"],
        [0.9, 0.6, 0.01],
        budget=15,
        extract=str.strip,
        confidence=None,
        per_round=1,
    )
    assert sum(result.samples) == 15
    assert result.answers[0] == "4"
    assert result.samples[1] > result.samples[0]  # the tie keeps "split" open; "easy" closes
    assert result.samples[2] < result.samples[1]  # the hopeless query (p = 0.01) gets little
    assert result.rounds == len(backend.calls)
    assert all(
        len(set(map(str, call))) == len(call) for call in backend.calls
    )  # one sample per query a round
    with pytest.raises(ValueError, match="one per prompt"):
        batch_adaptive_sample(backend, ["easy"], [0.5, 0.5], budget=2, extract=str.strip)
