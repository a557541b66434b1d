"""Consistency: agreement among k_c sampled answers."""

from __future__ import annotations

import asyncio

import pytest
from _fakes import AsyncScriptedBackend, ScriptedBackend, gen

from capgate import BackendError, SamplingParams
from capgate.estimators import Consistency


def votes(*texts: str) -> ScriptedBackend:
    return ScriptedBackend(lambda q, p: [gen(t, n_tokens=4, prompt_tokens=12) for t in texts[: p.n]])


def test_share_of_the_most_frequent_normalized_answer_and_cost() -> None:
    backend = votes("The answer is \\boxed{4}.", "4", "Answer: 4", "5", "\\boxed{ 5 }")
    est = Consistency(backend, k_c=5).estimate_one("2+2?")
    assert est.p == pytest.approx(0.6)
    assert est.details["majority"] == "4"
    assert est.details["answers"] == ["4", "4", "4", "5", "5"]
    # k_c samples in one request: the prompt read once, every sampled token counted.
    assert est.cost.calls == 1
    assert est.cost.prompt_tokens == 12
    assert est.cost.completion_tokens == 20
    ((prompts, params),) = backend.calls
    assert params.n == 5
    assert prompts == ["2+2?"]


def test_unextractable_samples_count_against_agreement() -> None:
    est = Consistency(votes("4", "   ", "4", "", "..."), k_c=5).estimate_one("2+2?")
    assert est.p == pytest.approx(0.4)


def test_custom_extractor_is_used_and_its_errors_are_contained() -> None:
    def extract(text: str) -> str | None:
        if text == "crash":
            raise ValueError("unparsable")
        return text.split()[-1]

    est = Consistency(votes("x = 1", "y = 1", "crash"), k_c=3, extract=extract).estimate_one("q")
    assert est.p == pytest.approx(2 / 3)
    assert "ValueError: unparsable" in est.details["extract_errors"][0]


def test_nothing_extractable_is_unavailable() -> None:
    est = Consistency(votes("", " ", "\n"), k_c=3).estimate_one("q")
    assert est.p is None
    assert "no answer could be extracted" in (est.reason or "")
    assert est.cost.completion_tokens == 12  # the cost is still reported


def test_backend_error_is_unavailable() -> None:
    est = Consistency(ScriptedBackend(lambda q, p: BackendError("down")), k_c=3).estimate_one("q")
    assert est.p is None
    assert "down" in (est.reason or "")


def test_params_are_kept_but_n_is_k_c() -> None:
    backend = votes("a", "a", "a")
    Consistency(backend, k_c=3, params=SamplingParams(temperature=0.6, seed=4, max_tokens=9)).estimate_one(
        "q"
    )
    params = backend.calls[0][1]
    assert (params.n, params.temperature, params.seed, params.max_tokens) == (3, 0.6, 4, 9)


def test_async_matches_sync() -> None:
    def respond(q: str, p: SamplingParams) -> list[object]:
        return [gen(t) for t in (["1", "1", "2"] if "a" in q else ["x", "y", "z"])]

    sync = Consistency(ScriptedBackend(respond), k_c=3).estimate(["a", "b"])  # type: ignore[arg-type]
    got = asyncio.run(Consistency(AsyncScriptedBackend(respond), k_c=3).aestimate(["a", "b"]))  # type: ignore[arg-type]
    assert [e.p for e in got] == [e.p for e in sync] == pytest.approx([2 / 3, 1 / 3])


def test_k_c_is_checked() -> None:
    with pytest.raises(ValueError, match="k_c"):
        Consistency(votes("a"), k_c=1)
