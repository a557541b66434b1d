"""PTrue: reading P(Yes) at the first answer token."""

from __future__ import annotations

import asyncio
import math

import pytest
from _fakes import AsyncScriptedBackend, ScriptedBackend, gen

from capgate import BackendError, SamplingParams
from capgate.core.backend import TokenLogprob, as_messages
from capgate.estimators import PTrue, read_p_true


def tok(token: str, top: dict[str, float]) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=top.get(token, -1.0), top=top)


def test_softmax_over_yes_and_no_variants() -> None:
    top = {
        "Yes": math.log(0.5),
        " yes": math.log(0.1),
        "YES": math.log(0.05),
        "No": math.log(0.2),
        " no.": math.log(0.05),
    }
    p, why, details = read_p_true([tok("Yes", top)])
    assert why == ""
    assert p == pytest.approx(0.65 / 0.9)
    assert details["p_yes"] == pytest.approx(0.65)
    assert details["p_no"] == pytest.approx(0.25)


def test_first_answer_token_is_after_reasoning_and_whitespace() -> None:
    tokens = [
        tok("<think>", {"<think>": 0.0}),
        tok("No", {"No": -0.01}),  # inside the reasoning: ignored
        tok("</think>", {"</think>": 0.0}),
        tok("\n", {"\n": -0.1}),
        tok("Yes", {"Yes": math.log(0.9), "No": math.log(0.1)}),
    ]
    p, _, details = read_p_true(tokens)
    assert p == pytest.approx(0.9)
    assert details["position"] == 4


@pytest.mark.parametrize(
    ("tokens", "reason_part"),
    [
        (None, "no logprobs"),
        ([], "no logprobs"),
        ([tok("The", {"The": -0.5, "I": -1.0})], "neither Yes nor No"),
        ([tok("<think>", {}), tok("hmm", {})], "did not close"),
        ([tok(" ", {" ": -0.1})], "no answer token"),
    ],
)
def test_degraded_cases(tokens: list[TokenLogprob] | None, reason_part: str) -> None:
    p, why, _ = read_p_true(tokens)
    assert p is None
    assert reason_part in why


@pytest.mark.parametrize(("word", "logprob"), [("Yes", -0.001), ("No", -0.001), ("Yes", -3.0)])
def test_an_answer_token_without_alternatives_gives_no_estimate(word: str, logprob: float) -> None:
    # A server that returns logprobs but ignores top_logprobs: no 0.5 from the top-k floor.
    lone = TokenLogprob(token=word, logprob=logprob, top={})
    backend = ScriptedBackend(lambda q, p: [gen(word, n_tokens=1, tokens=[lone])])
    est = PTrue(backend).estimate_one("What is 2+2?")
    assert est.p is None
    assert est.degraded
    assert "no alternatives" in (est.reason or "")
    assert "top_logprobs" in (est.reason or "")


def test_only_one_word_present_is_bounded_by_the_topk_floor() -> None:
    p, _, details = read_p_true([tok("Yes", {"Yes": math.log(0.6), "Sure": math.log(0.01)})])
    assert details["bounded"] == "no"
    assert p == pytest.approx(0.6 / 0.61)
    assert 0.0 < p < 1.0


def test_estimator_requests_logprobs_and_reports_cost() -> None:
    top = {"Yes": math.log(0.3), "No": math.log(0.6)}
    backend = ScriptedBackend(lambda q, p: [gen("No", n_tokens=1, prompt_tokens=40, tokens=[tok("No", top)])])
    est = PTrue(backend, top_logprobs=5).estimate_one("What is 2+2?")
    assert est.p == pytest.approx(1 / 3)
    assert est.method == "p_true"
    assert est.cost.calls == 1
    assert est.cost.prompt_tokens == 40
    assert est.cost.completion_tokens == 1
    ((prompts, params),) = backend.calls
    assert params.logprobs
    assert params.top_logprobs == 5
    assert params.temperature == 0.0
    assert params.n == 1
    content = as_messages(prompts[0])[-1]["content"]
    assert (
        "Are you able to answer the question correctly? Answer with only a single word: Yes or No." in content
    )
    assert "What is 2+2?" in content


def test_no_logprobs_from_backend_is_unavailable() -> None:
    est = PTrue(ScriptedBackend(lambda q, p: [gen("Yes")])).estimate_one("q?")
    assert est.p is None
    assert est.degraded
    assert "no logprobs" in (est.reason or "")


def test_backend_error_is_unavailable_naming_it() -> None:
    est = PTrue(ScriptedBackend(lambda q, p: BackendError("HTTP 500 from x"))).estimate_one("q?")
    assert est.p is None
    assert "HTTP 500" in (est.reason or "")


def test_async_matches_sync() -> None:
    def respond(q: str, p: SamplingParams) -> list[object]:
        yes = 0.8 if "easy" in q else 0.2
        return [gen("Yes", tokens=[tok("Yes", {"Yes": math.log(yes), "No": math.log(1 - yes)})])]

    queries = ["easy", "hard"]
    sync = PTrue(ScriptedBackend(respond)).estimate(queries)  # type: ignore[arg-type]
    got = asyncio.run(PTrue(AsyncScriptedBackend(respond)).aestimate(queries))  # type: ignore[arg-type]
    assert [e.p for e in got] == [e.p for e in sync]
    assert [e.p for e in got] == pytest.approx([0.8, 0.2])


def test_settings_are_checked() -> None:
    backend = ScriptedBackend(lambda q, p: [gen("")])
    with pytest.raises(ValueError, match="top_logprobs"):
        PTrue(backend, top_logprobs=0)
    with pytest.raises(ValueError, match="max_tokens"):
        PTrue(backend, max_tokens=0)
