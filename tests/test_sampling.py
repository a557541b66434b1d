"""The plan drivers shared by backend-querying estimators (capgate.estimators._sampling)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from _fakes import AsyncScriptedBackend, ScriptedBackend, gen

from capgate import BackendError, Generation, SamplingParams
from capgate.core.backend import Prompt
from capgate.estimators import VerbalizedConfidence
from capgate.estimators._sampling import Round, cost_of, sample_round, wrap_last_user_turn


class BatchFails:
    """Raises for any batch containing 'bad'; answers prompts that are alone or all good."""

    model_id = "batch-fails"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        self.batches.append(len(prompts))
        if any("bad" in str(p) for p in prompts):
            raise BackendError("a bad prompt in the batch")
        return [[gen("\\boxed{0.5}")] for _ in prompts]


def test_sync_round_isolates_the_failing_prompt() -> None:
    backend = BatchFails()
    result = sample_round(backend, Round(["good", "bad", "fine"], SamplingParams()))
    ok1, err, ok2 = result.outcomes
    assert isinstance(ok1, list)
    assert isinstance(ok2, list)
    assert isinstance(err, BackendError)
    assert backend.batches == [3, 1, 1, 1]


def test_wrong_result_count_is_a_per_query_failure() -> None:
    class Short:
        model_id = "short"

        def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
            return []

    est = VerbalizedConfidence(Short()).estimate_one("q")
    assert est.p is None
    assert "0 results for 1 prompts" in (est.reason or "")


def test_async_only_backend_works_from_sync_code_even_inside_a_running_loop() -> None:
    backend = AsyncScriptedBackend(lambda q, p: [gen("\\boxed{0.25}")])
    assert VerbalizedConfidence(backend).estimate_one("q").p == 0.25

    async def inside() -> float | None:
        return VerbalizedConfidence(backend).estimate_one("q").p  # blocking call from a coroutine

    assert asyncio.run(inside()) == 0.25


def test_sync_backend_works_from_async_code() -> None:
    backend = ScriptedBackend(lambda q, p: [gen("\\boxed{0.75}")])
    got = asyncio.run(VerbalizedConfidence(backend).aestimate(["a", "b"]))
    assert [e.p for e in got] == [0.75, 0.75]
    assert len(backend.calls) == 1  # batched, in a worker thread


def test_cost_of_reads_the_prompt_once_and_counts_every_sample() -> None:
    samples = [gen("a", n_tokens=3, prompt_tokens=20), gen("b", n_tokens=5, prompt_tokens=20)]
    cost = cost_of(samples, 0.5)
    assert (cost.prompt_tokens, cost.completion_tokens, cost.calls, cost.latency_s) == (20, 8, 1, 0.5)


def test_wrap_last_user_turn() -> None:
    assert wrap_last_user_turn("hi", str.upper) == [{"role": "user", "content": "HI"}]
    transcript = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "partial"},
    ]
    wrapped = wrap_last_user_turn(transcript, str.upper)  # type: ignore[arg-type]
    assert wrapped == [transcript[0], transcript[1], {"role": "user", "content": "SECOND"}]
    assert wrap_last_user_turn([{"role": "system", "content": "s"}], str.upper) == [
        {"role": "user", "content": "S"}
    ]
