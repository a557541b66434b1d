"""AssessEach: the queries that share an estimator are estimated in one batched call."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from capgate import Estimate, Gate
from capgate.core.backend import Prompt
from capgate.estimators import CapabilityEstimator
from capgate.gate.flow import AssessEach, aperform, perform


class Counting(CapabilityEstimator):
    method = "counting"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self.batches.append(len(queries))
        return [Estimate(p=0.9 if "easy" in str(q) else 0.1, method=self.method) for q in queries]


def test_one_batched_estimate_per_estimator_and_verdicts_in_order() -> None:
    shared, other = Counting(), Counting()
    gate = Gate(policy="balanced", estimator=shared)
    items = [
        (gate.with_options(tool="a"), "easy one"),
        (Gate(policy="balanced", estimator=other), "hard one"),
        (gate.with_options(tool="b"), "hard two"),
        (gate, "easy three"),
    ]
    for verdicts in (perform(AssessEach(items)), asyncio.run(aperform(AssessEach(items)))):
        assert [v.action for v in verdicts] == ["answer", "abstain", "abstain", "answer"]
        assert [v.query for v in verdicts] == [q for _, q in items]
        assert verdicts[0].decision.tool == "a"
    assert shared.batches == [3, 3]
    assert other.batches == [1, 1]
    assert gate.stats.calls == 6


def test_a_compound_effect_is_run_by_a_driver_not_by_itself() -> None:
    with pytest.raises(TypeError, match="run by a flow driver"):
        AssessEach([]).run()
