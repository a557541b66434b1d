"""@guard fixes: speculative gating's timing and failed calls, token caps under resample, async
callable objects, and a StopIteration kept as itself."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator

import capgate
from capgate import Gated, Generation
from capgate.decision import DecisionLog
from capgate.policies import Policy, load_policy

POLICY = load_policy(Path(__file__).parent / "data" / "policies" / "all-actions.yaml")
CAPPED = Policy.from_yaml_text(
    """
version: 1
name: capped
bands:
  - below: 0.7
    action: resample
    max_samples: 16
    batch_size: 2
    stop: {confidence_gap: null, consensus: null, max_tokens: 50}
  - {action: answer}
on_degraded: abstain
"""
)


REPLY = "4 (the speculative call's reply)"


@pytest.fixture
def call_thread_paused_after_its_result(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The speculative call's thread is switched out right after it hands over its reply."""
    resume = threading.Event()
    original = concurrent.futures.Future.set_result

    def set_result_then_pause(self: concurrent.futures.Future[Any], result: Any) -> None:
        original(self, result)
        carries_reply = result is REPLY or (isinstance(result, tuple) and any(r is REPLY for r in result))
        if carries_reply and not resume.is_set():
            resume.wait(1.0)

    monkeypatch.setattr(concurrent.futures.Future, "set_result", set_result_then_pause)
    yield
    resume.set()


def test_a_speculative_answer_does_not_race_the_calls_timing(
    call_thread_paused_after_its_result: None,
) -> None:
    @capgate.guard(policy="balanced", estimator=KeywordEstimator({}, default=0.95), speculative=True)
    def ask(prompt: str) -> str:
        return REPLY

    assert ask("2+2?") is REPLY
    decision = capgate.last_decision()
    assert decision is not None
    assert decision.speculation is not None
    assert decision.speculation.call_s is not None


def test_a_speculative_call_that_raises_still_logs_its_decision(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite3"

    @capgate.guard(policy="balanced", estimator=KeywordEstimator({}, default=0.95), speculative=True, log=log)
    def ask(prompt: str) -> str:
        raise ConnectionError("model endpoint reset")

    @capgate.guard(gate=ask.gate)
    async def aask(prompt: str) -> str:
        raise ConnectionError("model endpoint reset")

    with pytest.raises(ConnectionError):
        ask("2+2?")
    sync_decision = capgate.last_decision()
    with pytest.raises(ConnectionError):
        asyncio.run(aask("2+2?"))
    ask.gate.flush()
    logged = {d.decision.id: d.decision for d in DecisionLog(log).decisions()}
    assert sync_decision is not None
    assert sync_decision.id in logged
    assert len(logged) == 2
    assert all(d.action == "answer" and d.speculation is not None for d in logged.values())


def test_guard_counts_the_tokens_of_a_returned_generation_for_max_tokens() -> None:
    counter = itertools.count()

    @capgate.guard(policy=CAPPED, estimator=KeywordEstimator({}, default=0.5))
    def ask(prompt: str) -> Generation:
        return Generation(text=f"The answer is {next(counter) % 5}", n_tokens=40)

    ask("Pick a number")
    cas = ask.stats.last_cas
    assert cas is not None
    assert (cas.samples_used, cas.tokens) == (2, 80)


def test_guard_warns_once_when_max_tokens_cannot_hold(caplog: pytest.LogCaptureFixture) -> None:
    counter = itertools.count()

    @capgate.guard(policy=CAPPED, estimator=KeywordEstimator({}, default=0.5))
    def ask(prompt: str) -> str:
        return f"The answer is {next(counter) % 5}"

    with caplog.at_level(logging.WARNING, logger="capgate"):
        ask("Pick a number")
        ask("Pick another")
    warned = [r.getMessage() for r in caplog.records if r.name == "capgate"]
    assert len(warned) == 1
    assert "max_tokens=50" in warned[0]
    assert "ask()" in warned[0]


def test_an_object_with_an_async_call_takes_the_async_path() -> None:
    estimator = KeywordEstimator({"ABSTAIN": 0.1})

    class Model:
        async def __call__(self, prompt: str) -> str:
            await asyncio.sleep(0)
            return "4"

    ask = capgate.guard(policy=POLICY, estimator=estimator)(Model())
    assert inspect.iscoroutinefunction(ask)
    assert asyncio.run(ask("2+2?")) == "4"
    blocked = asyncio.run(ask("ABSTAIN 2+2?"))
    assert isinstance(blocked, Gated)
    assert blocked.action == "abstain"
    assert (estimator.calls, estimator.acalls) == (0, 2)


@pytest.mark.parametrize("query", ["plain", "RESAMPLE", "speculative"])
def test_a_stop_iteration_from_the_guarded_function_reaches_the_caller_as_itself(query: str) -> None:
    @capgate.guard(
        policy=POLICY, estimator=KeywordEstimator({"RESAMPLE": 0.7}), speculative=query == "speculative"
    )
    def ask(prompt: str) -> str:
        return next(iter([]))

    with pytest.raises(StopIteration):
        ask(query)
