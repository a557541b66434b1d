"""Functions as CAS backends: one call per sample, draw order kept, the winner mapped back."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import pytest

from capgate import SamplingParams
from capgate.adapters.backends.function import AsyncFunctionBackend, FunctionBackend, response_text
from capgate.cas import aadaptive_sample, adaptive_sample, stop_after_samples


@dataclass
class Message:
    content: str


def test_generate_calls_once_per_sample_and_keeps_order() -> None:
    prompts: list[object] = []
    counter = itertools.count()

    def draw(prompt: object) -> str:
        prompts.append(prompt)
        return f"answer {next(counter)}"

    backend = FunctionBackend(draw)
    rows = backend.generate(["a", "b"], SamplingParams(n=3))
    assert [[g.text for g in row] for row in rows] == [
        ["answer 0", "answer 1", "answer 2"],
        ["answer 3", "answer 4", "answer 5"],
    ]
    assert prompts == ["a"] * 3 + ["b"] * 3
    assert backend.drawn == [f"answer {i}" for i in range(6)]
    assert all(g.n_tokens == 0 for row in rows for g in row)


def test_winner_is_the_first_drawn_object_with_the_winning_answer() -> None:
    replies = iter([Message("B"), Message("A"), Message("A "), Message("B"), Message("A")])
    backend = FunctionBackend(lambda p: next(replies), count_tokens=lambda m: len(m.content))
    result = adaptive_sample(
        backend, "q", extract=str.strip, stop=stop_after_samples(5), batch_size=5, confidence=None
    )
    assert result.votes == {"A": 3, "B": 2}
    assert result.tokens == 1 + 1 + 2 + 1 + 1
    assert backend.winner(result) is backend.drawn[1]


def test_winner_of_a_foreign_result_is_refused() -> None:
    backend = FunctionBackend(lambda p: "x")
    other = FunctionBackend(lambda p: "x")
    result = adaptive_sample(other, "q", extract=str.strip, stop=stop_after_samples(2), batch_size=2)
    with pytest.raises(ValueError, match="0 were drawn here"):
        backend.winner(result)


def test_no_answer_means_no_winner() -> None:
    backend = FunctionBackend(lambda p: "")
    result = adaptive_sample(backend, "q", extract=lambda t: None, stop=stop_after_samples(2), batch_size=2)
    assert result.answer is None
    assert backend.winner(result) is None


def test_async_backend_draws_a_batch_concurrently() -> None:
    running = 0
    peak = 0

    async def draw(prompt: object) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return "7"

    backend = AsyncFunctionBackend(draw)
    result = asyncio.run(
        aadaptive_sample(backend, "q", extract=str.strip, batch_size=3, stop=stop_after_samples(3))
    )
    assert result.samples_used == 3
    assert peak == 3
    assert backend.winner(result) == "7"
    sequential = AsyncFunctionBackend(draw, concurrent=False)
    peak = 0
    asyncio.run(
        aadaptive_sample(sequential, "q", extract=str.strip, batch_size=3, stop=stop_after_samples(3))
    )
    assert peak == 1


def test_response_text_and_to_text() -> None:
    assert response_text(Message("hi")) == "hi"
    with pytest.raises(TypeError, match="pass to_text="):
        response_text(42)
    backend = FunctionBackend(lambda p: {"text": "z"}, to_text=lambda d: d["text"])
    assert backend.generate(["q"], SamplingParams())[0][0].text == "z"
    bad = FunctionBackend(lambda p: 1, to_text=lambda v: v)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="to_text must return a str"):
        bad.generate(["q"], SamplingParams())
    with pytest.raises(TypeError, match="`draw`"):
        FunctionBackend("not callable")  # type: ignore[arg-type]
