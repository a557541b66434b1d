"""Checks every backend-querying estimator must pass (one suite over all of them).

With a deterministic scripted model: estimates lie in [0, 1] or are unavailable with a reason;
a batch gives the same estimates as one query at a time; the async path gives the same as the
sync one; an empty batch gives an empty list; every estimate reports its cost.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Callable

import pytest
from _fakes import ScriptedBackend, gen

from capgate import SamplingParams
from capgate.core.backend import TokenLogprob
from capgate.estimators import CapabilityEstimator, Consistency, FallbackChain, PTrue, VerbalizedConfidence

QUERIES = ["What is 2+2?", "Name the capital of Peru.", "Prove Fermat's last theorem.", "Say hi."]


def respond(question: str, params: SamplingParams) -> list[object]:
    """A deterministic 'model': its answers depend only on the question and the sampling params."""
    h = int(hashlib.sha256(f"{question}|{params.seed}".encode()).hexdigest(), 16)
    if params.logprobs:
        yes = 0.05 + (h % 90) / 100
        tok = TokenLogprob(
            token="Yes", logprob=math.log(yes), top={"Yes": math.log(yes), "No": math.log(1 - yes)}
        )
        return [gen("Yes", n_tokens=1, tokens=[tok])]
    if params.n > 1:
        return [gen(str((h >> i) % 3)) for i in range(params.n)]
    return [gen(f"\\boxed{{{(h % 101) / 100}}}" if h % 4 else "no idea")]


FACTORIES: dict[str, Callable[[ScriptedBackend], CapabilityEstimator]] = {
    "verbalized": lambda b: VerbalizedConfidence(b, params=SamplingParams(seed=1)),
    "p_true": lambda b: PTrue(b),
    "consistency": lambda b: Consistency(b, k_c=4),
    "fallback": lambda b: FallbackChain([VerbalizedConfidence(b, max_tries=1), PTrue(b)]),
}


@pytest.fixture(params=sorted(FACTORIES))
def estimator(request: pytest.FixtureRequest) -> CapabilityEstimator:
    return FACTORIES[request.param](ScriptedBackend(respond))  # type: ignore[arg-type]


def test_values_are_probabilities_or_unavailable_with_a_reason(estimator: CapabilityEstimator) -> None:
    for est in estimator.estimate(QUERIES):
        if est.p is None:
            assert est.degraded
            assert est.reason
        else:
            assert 0.0 <= est.p <= 1.0
        assert est.cost.calls >= 1
        assert est.cost.completion_tokens >= 1


def test_batch_equals_one_by_one(estimator: CapabilityEstimator) -> None:
    batched = [(e.p, e.method, e.degraded) for e in estimator.estimate(QUERIES)]
    single = [(e.p, e.method, e.degraded) for e in (estimator.estimate_one(q) for q in QUERIES)]
    assert batched == single


def test_async_equals_sync(estimator: CapabilityEstimator) -> None:
    sync = [(e.p, e.method, e.degraded) for e in estimator.estimate(QUERIES)]
    got = [(e.p, e.method, e.degraded) for e in asyncio.run(estimator.aestimate(QUERIES))]
    assert got == sync


def test_empty_batch(estimator: CapabilityEstimator) -> None:
    assert estimator.estimate([]) == []
    assert asyncio.run(estimator.aestimate([])) == []
