"""The @guard decorator: sync and async, bare and called, every action, fail-safe, overrides,
wraps-preservation, return vs raise, statistics and decision logging."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator

import capgate
from capgate import Gate, GateBlocked, Gated
from capgate.decision import DecisionLog
from capgate.gate import (
    UNSET,
    Abstained,
    ClarificationNeeded,
    Escalated,
    ResampleFailed,
    set_default_estimator,
)
from capgate.policies import load_policy

MARKERS = {"ABSTAIN": 0.1, "CLARIFY": 0.3, "ESCALATE": 0.5, "RESAMPLE": 0.7, "NOEST": None}

POLICY = load_policy(Path(__file__).parent / "data" / "policies" / "all-actions.yaml")


@pytest.fixture
def estimator() -> KeywordEstimator:
    return KeywordEstimator(MARKERS)


@pytest.fixture
def no_default_estimator() -> Iterator[None]:
    set_default_estimator(None)
    yield
    set_default_estimator(None)


def run(value: Any) -> Any:
    """Await a coroutine (the async variant of a test) or return a plain value."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def make(kind: str, body: Callable[[str], Any], **settings: Any) -> Any:
    """A guarded function of the given kind (sync or async) around ``body``."""
    if kind == "sync":

        def ask(prompt: str) -> Any:
            return body(prompt)

        return capgate.guard(**settings)(ask)

    async def aask(prompt: str) -> Any:
        await asyncio.sleep(0)
        return body(prompt)

    return capgate.guard(**settings)(aask)


KINDS = ["sync", "async"]


# --------------------------------------------------------------------------- actions


@pytest.mark.parametrize("kind", KINDS)
def test_answer_runs_the_function_once(kind: str, estimator: KeywordEstimator) -> None:
    calls: list[str] = []
    ask = make(kind, lambda p: calls.append(p) or f"answer to {p}", policy=POLICY, estimator=estimator)
    assert run(ask("What is 2+2?")) == "answer to What is 2+2?"
    assert calls == ["What is 2+2?"]
    assert ask.stats.calls == 1
    assert ask.stats.actions == {"answer": 1}
    assert ask.stats.last_decision.action == "answer"
    assert (estimator.calls, estimator.acalls) == ((1, 0) if kind == "sync" else (0, 1))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("marker", "action", "message"),
    [
        ("ABSTAIN", "abstain", "No (p=0.10)."),
        ("CLARIFY", "clarify", "Which one do you mean?"),
        ("ESCALATE", "escalate", None),
    ],
)
def test_blocking_actions_return_gated_without_calling(
    kind: str, marker: str, action: str, message: str | None, estimator: KeywordEstimator
) -> None:
    calls: list[str] = []
    ask = make(kind, lambda p: calls.append(p), policy=POLICY, estimator=estimator)
    result = run(ask(f"{marker}: a question"))
    assert isinstance(result, Gated)
    assert calls == []
    assert result.action == action
    assert result.estimate.p == MARKERS[marker]
    assert result.query == f"{marker}: a question"
    if message is not None:
        assert result.message == message
    else:  # the escalation summary is the policy's default template, rendered
        assert "Escalated for human review by policy 'all-actions'" in result.message
        assert "predicted capability 0.500" in result.message
    assert str(result) == result.message
    assert ask.stats.actions == {action: 1}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("marker", "exc"),
    [("ABSTAIN", Abstained), ("CLARIFY", ClarificationNeeded), ("ESCALATE", Escalated)],
)
def test_on_block_raise_raises_the_action_subclass(
    kind: str, marker: str, exc: type[GateBlocked], estimator: KeywordEstimator
) -> None:
    ask = make(kind, lambda p: "never", policy=POLICY, estimator=estimator, on_block="raise")
    with pytest.raises(exc) as info:
        run(ask(f"{marker} x"))
    assert isinstance(info.value, GateBlocked)
    assert info.value.decision.action == info.value.gated.action
    assert info.value.estimate.p == MARKERS[marker]
    assert str(info.value) == info.value.message


@pytest.mark.parametrize("kind", KINDS)
def test_resample_calls_function_per_sample_and_returns_winning_object(
    kind: str, estimator: KeywordEstimator
) -> None:
    # Each call returns a distinct object; answers group by their first word.
    replies = itertools.cycle(["Paris is right", "Lyon maybe", "Paris again", "Paris!"])
    drawn: list[dict[str, str]] = []

    def body(prompt: str) -> dict[str, str]:
        value = {"content": next(replies)}
        drawn.append(value)
        return value

    ask = make(
        kind,
        body,
        policy=POLICY,
        estimator=estimator,
        extract=lambda t: t.split()[0].strip("!"),
        to_text=lambda v: v["content"],
    )
    result = run(ask("RESAMPLE: capital of France?"))
    cas = ask.stats.last_cas
    assert cas is not None
    assert len(drawn) == cas.samples_used == ask.stats.samples
    assert cas.answer == "Paris"
    assert result is drawn[0]  # the first drawn value with the winning answer, not a copy
    assert 2 <= cas.samples_used <= 6
    assert cas.samples_used % 2 == 0  # batches of 2
    assert ask.stats.actions == {"resample": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_resample_stops_by_the_policy_rule_and_budget(kind: str, estimator: KeywordEstimator) -> None:
    # Unanimous answers: the Beta consensus rule at 0.9 needs 4 agreeing votes (P = 1 - 0.5^5 =
    # 0.97; after 2 it is 1 - 0.5^3 = 0.875), so it fires after the second batch of 2.
    ask = make(kind, lambda p: "42", policy=POLICY, estimator=estimator, extract=str.strip)
    assert run(ask("RESAMPLE sum?")) == "42"
    assert ask.stats.last_cas.samples_used == 4
    assert ask.stats.last_cas.stop_reason == "rule"
    # Disagreeing answers never reach consensus: the budget (max_samples 6) ends it.
    answers = itertools.cycle(["1", "2", "3"])
    ask2 = make(kind, lambda p: next(answers), policy=POLICY, estimator=estimator, extract=str.strip)
    run(ask2("RESAMPLE sum?"))
    assert ask2.stats.last_cas.samples_used == 6
    assert ask2.stats.last_cas.stop_reason == "max_samples"


@pytest.mark.parametrize("kind", KINDS)
def test_resample_without_any_answer_blocks(kind: str, estimator: KeywordEstimator) -> None:
    ask = make(kind, lambda p: "", policy=POLICY, estimator=estimator, extract=lambda t: None)
    result = run(ask("RESAMPLE ?"))
    assert isinstance(result, Gated)
    assert result.action == "resample"
    assert result.cas is not None
    assert result.cas.samples_used == 6
    assert "6 answers" in result.message
    with pytest.raises(ResampleFailed):
        run(ask.with_options(on_block="raise")("RESAMPLE ?"))


# --------------------------------------------------------------------------- fail-safe


@pytest.mark.parametrize("kind", KINDS)
def test_degraded_estimate_follows_on_degraded(kind: str, estimator: KeywordEstimator) -> None:
    calls: list[str] = []
    ask = make(kind, lambda p: calls.append(p), policy=POLICY, estimator=estimator)
    result = run(ask("NOEST: anything"))
    assert isinstance(result, Gated)
    assert calls == []
    assert result.action == "escalate"
    assert result.decision.degraded
    assert result.estimate.p is None
    assert "marker 'NOEST' means no estimate" in result.decision.reason
    assert ask.stats.degraded == 1
    # The balanced preset's fail-safe abstains, with its own message.
    ask2 = make(kind, lambda p: "x", policy="balanced", estimator=estimator)
    blocked = run(ask2("NOEST"))
    assert blocked.action == "abstain"
    assert blocked.decision.degraded
    assert blocked.message == "I can't check my confidence on this right now, so I won't answer it."


# --------------------------------------------------------------------------- overrides


def test_per_call_settings_through_with_options(estimator: KeywordEstimator) -> None:
    """One spelling for per-call settings: ``with_options`` takes every setting guard takes."""
    seen: list[tuple[Any, ...]] = []

    @capgate.guard(policy=POLICY, estimator=estimator, tool="refund")
    def ask(prompt: str, *rest: Any, **extra: Any) -> str:
        seen.append((prompt, rest, extra))
        return "ok"

    # The tool override (abstain below 0.95) applies: p = 0.9 abstains.
    assert isinstance(ask("plain"), Gated)
    # tool=None removes the tool; nothing reaches the function but its own arguments.
    assert ask.with_options(tool=None)("plain") == "ok"
    assert seen == [("plain", (), {})]
    # Not given (UNSET) inherits the gate's tool.
    assert ask.with_options(tool=UNSET)("plain").action == "abstain"
    # Per-call policy: the balanced preset answers p = 0.9 with no tool override.
    assert ask.with_options(policy="balanced")("plain") == "ok"
    # Per-call step of the gate without its tool: the step override (0.95) abstains.
    assert ask.with_options(tool=None, step="draft")("plain").decision.step == "draft"
    # Per-call estimator.
    low = KeywordEstimator({}, default=0.05)
    assert ask.with_options(tool=None, estimator=low)("plain").action == "abstain"
    assert low.calls == 1
    # Per-call on_block.
    with pytest.raises(Abstained):
        ask.with_options(on_block="raise")("plain")
    with pytest.raises(ValueError, match="on_block"):
        ask.with_options(on_block="explode")
    with pytest.raises(ValueError, match="`policy`"):
        ask.with_options(policy=3)
    with pytest.raises(TypeError, match="`to_text`"):
        ask.with_options(to_text="content")
    # A prompt keyword named like a setting reaches the function untouched.
    assert ask.with_options(tool=None)("plain", capgate_step="x") == "ok"
    assert seen[-1] == ("plain", (), {"capgate_step": "x"})


def test_with_options_shares_the_gates_stats_and_log(estimator: KeywordEstimator, tmp_path: Any) -> None:
    @capgate.guard(policy=POLICY, estimator=estimator, log=tmp_path / "log.db")
    def ask(prompt: str) -> str:
        return "ok"

    as_refund = ask.with_options(tool="refund")
    assert as_refund("plain").action == "abstain"
    assert ask("plain") == "ok"
    assert as_refund.gate.stats is ask.gate.stats
    assert as_refund.gate.log is ask.gate.log
    assert ask.stats.calls == 2
    assert len(ask.gate.log) == 2
    assert as_refund.with_options(tool=None)("plain") == "ok"


# --------------------------------------------------------------------------- bare and called


def test_bare_guard_uses_default_estimator(no_default_estimator: None) -> None:
    @capgate.guard
    def ask(prompt: str) -> str:
        return "ok"

    with pytest.raises(ValueError, match="no capability estimator"):
        ask("hello")
    set_default_estimator(KeywordEstimator({"hard": 0.1}))
    assert ask("hello") == "ok"
    assert ask("a hard one").action == "abstain"  # balanced preset by default
    assert ask.gate.resolve_policy().name == "balanced"


def test_bare_guard_on_coroutine_gets_async_path(no_default_estimator: None) -> None:
    est = KeywordEstimator({})
    set_default_estimator(est)

    @capgate.guard
    async def ask(prompt: str) -> str:
        return "ok"

    assert inspect.iscoroutinefunction(ask)
    assert asyncio.run(ask("hi")) == "ok"
    assert (est.calls, est.acalls) == (0, 1)


# --------------------------------------------------------------------------- wraps


@pytest.mark.parametrize("kind", KINDS)
def test_wraps_preserves_name_doc_signature_hints(kind: str, estimator: KeywordEstimator) -> None:
    if kind == "sync":

        def original(prompt: str, *, temperature: float = 0.7) -> str:
            """Ask the model a question."""
            return prompt

    else:

        async def original(prompt: str, *, temperature: float = 0.7) -> str:  # type: ignore[misc]
            """Ask the model a question."""
            return prompt

    wrapped = capgate.guard(estimator=estimator)(original)
    assert wrapped.__name__ == "original"
    assert wrapped.__doc__ == "Ask the model a question."
    assert wrapped.__wrapped__ is original
    assert inspect.signature(wrapped) == inspect.signature(original)
    assert typing.get_type_hints(wrapped) == typing.get_type_hints(original)
    assert inspect.iscoroutinefunction(wrapped) == (kind == "async")
    assert isinstance(wrapped.gate, Gate)
    assert wrapped.stats is wrapped.gate.stats


# --------------------------------------------------------------------------- finding the query


def test_query_from_messages_parameter_and_query_arg(estimator: KeywordEstimator) -> None:
    @capgate.guard(policy=POLICY, estimator=estimator)
    def chat(model: str, messages: list[dict[str, str]]) -> str:
        return model

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ABSTAIN now"}]
    assert chat("m", msgs).action == "abstain"
    assert estimator.seen[-1] == msgs

    @capgate.guard(policy=POLICY, estimator=estimator, query_arg="question")
    def by_name(context: str, question: str) -> str:
        return "ok"

    assert by_name("ABSTAIN", "fine") == "ok"
    assert by_name(context="x", question="ABSTAIN").action == "abstain"

    @capgate.guard(policy=POLICY, estimator=estimator, query_arg=1)
    def by_index(context: str, question: str) -> str:
        return "ok"

    assert by_index("ABSTAIN", "fine") == "ok"

    @capgate.guard(policy=POLICY, estimator=estimator, query_arg=lambda doc, q: f"{q} about {doc}")
    def by_function(doc: str, q: str) -> str:
        return "ok"

    assert by_function("ABSTAIN topic", "summarize").action == "abstain"
    assert estimator.seen[-1] == "summarize about ABSTAIN topic"


def test_query_on_a_method_skips_self(estimator: KeywordEstimator) -> None:
    class Bot:
        @capgate.guard(policy=POLICY, estimator=estimator)
        def reply(self, text: str) -> str:
            return "ok"

    assert Bot().reply("fine") == "ok"
    assert Bot().reply("ABSTAIN").action == "abstain"


def test_bad_queries_and_settings_are_named(estimator: KeywordEstimator) -> None:
    @capgate.guard(policy=POLICY, estimator=estimator)
    def ask(prompt: object) -> str:
        return "ok"

    with pytest.raises(TypeError, match=r"argument 'prompt' of .*ask\(\): expected a prompt string"):
        ask(42)
    with pytest.raises(TypeError, match=r"ask\(\), message 0: expected a chat message"):
        ask([{"content": "no role"}])
    with pytest.raises(ValueError, match="'nope' is not a parameter"):

        @capgate.guard(estimator=estimator, query_arg="nope")
        def f(prompt: str) -> str:
            return ""

    with pytest.raises(ValueError, match="on_block"):
        capgate.guard(on_block="sometimes")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="policy"):
        capgate.guard(policy=0.5)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="estimator"):
        capgate.guard(estimator="probe")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="either gate= or the gate settings"):
        capgate.guard(gate=Gate(estimator=estimator), policy="conservative")


def test_estimator_returning_garbage_is_a_degraded_decision() -> None:
    class Broken(KeywordEstimator):
        def estimate(self, queries: Any) -> Any:
            return [0.5]

    @capgate.guard(policy=POLICY, estimator=Broken({}))
    def ask(prompt: str) -> str:
        return "ok"

    result = ask("x")  # fail closed (tests/test_gate_fail_closed.py): on_degraded, never the call
    assert isinstance(result, Gated)
    assert result.action == "escalate"
    assert "Broken.estimate returned [0.5]" in (result.estimate.reason or "")


# --------------------------------------------------------------------------- sharing and logging


def test_shared_gate_counts_across_functions(estimator: KeywordEstimator) -> None:
    gate = Gate(policy=POLICY, estimator=estimator)

    @capgate.guard(gate=gate)
    def a(prompt: str) -> str:
        return "a"

    @capgate.guard(gate=gate)
    async def b(prompt: str) -> str:
        return "b"

    a("x")
    asyncio.run(b("ABSTAIN"))
    assert gate.stats.calls == 2
    assert gate.stats.actions == {"answer": 1, "abstain": 1}
    gate.stats.reset()
    assert gate.stats.calls == 0
    assert gate.stats.last_decision is None


def test_stats_reset_zeroes_every_count() -> None:
    """Every field, the spill count included (reset once forgot it), is back at its default."""
    from capgate.gate import GateStats

    stats = GateStats()
    for spec in fields(stats):
        value = getattr(stats, spec.name)
        if isinstance(value, Counter):
            value["answer"] += 2
        elif spec.name != "_lock":
            setattr(stats, spec.name, 3)
    counters = stats.actions, stats.shadow_actions
    stats.reset()
    assert stats == GateStats()
    assert stats.actions is counters[0]  # cleared in place
    assert stats.shadow_actions is counters[1]


@pytest.mark.parametrize("kind", KINDS)
def test_decisions_are_logged_with_samples_used(
    kind: str, estimator: KeywordEstimator, tmp_path: Path
) -> None:
    path = tmp_path / "decisions.sqlite3"
    ask = make(kind, lambda p: "42", policy=POLICY, estimator=estimator, log=path, extract=str.strip)
    run(ask("fine"))
    run(ask("ABSTAIN"))
    run(ask("RESAMPLE"))
    with DecisionLog(path) as log:
        rows = log.decisions()
    assert [r.decision.action for r in rows] == ["answer", "abstain", "resample"]
    assert [r.samples_used for r in rows] == [1, 0, 4]
    assert rows[2].id == ask.stats.last_decision.id
    assert all(r.query_sha256 for r in rows)
