"""Fail closed in enforce mode: an estimator that raises or returns garbage gives a degraded
decision naming what went wrong (the policy's ``on_degraded`` acts and the log keeps it), never
the gated call's failure and never a made-up value; misconfiguration and interrupts still raise.

Real guarded functions, gates, a LangGraph node and the decision log; the estimators are small
deliberately broken ones."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator

import capgate
from capgate import Estimate, Gate, Gated, NotFittedError, ProbeMismatchError, SettingsError
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator
from capgate.gate.flow import AssessEach, perform
from capgate.policies import Policy

POLICY = Policy.model_validate(
    {
        "name": "fail-closed",
        "bands": [{"below": 0.5, "action": "abstain"}, {"action": "answer"}],
        "on_degraded": {"action": "escalate", "to": "on-call"},
    }
)


class Raising(CapabilityEstimator):
    method = "raising"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise ConnectionError("probe server down")


class Returning(CapabilityEstimator):
    """Returns ``value`` in place of one Estimate per query."""

    method = "returning"

    def __init__(self, value: Any) -> None:
        self.value = value

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        return self.value  # type: ignore[no-any-return]


class Misconfigured(CapabilityEstimator):
    method = "misconfigured"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise SettingsError("the probe reads layer 40 of a 30-layer model")


class Unfitted(CapabilityEstimator):
    method = "unfitted"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise NotFittedError("this LinearProbe is not fitted yet; call fit() first")


class Mismatched(CapabilityEstimator):
    method = "mismatched"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise ProbeMismatchError("the probe was fitted on another reader")


class TimingOut(CapabilityEstimator):
    """Its own client times out (a TimeoutError of its own), well within the gate's deadline."""

    method = "timing-out"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise TimeoutError("read timed out")

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        await asyncio.sleep(0)
        raise TimeoutError("read timed out")


class Interrupted(BaseException):
    """Not an Exception (like KeyboardInterrupt): never turned into a decision."""


class Interrupting(CapabilityEstimator):
    method = "interrupting"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise Interrupted


BROKEN = [
    (Raising(), "the estimator raised ConnectionError: probe server down"),
    (Returning([0.5]), "Returning.estimate returned [0.5] for 1 queries, not one Estimate per query"),
    (Returning([]), "Returning.estimate returned [] for 1 queries"),
    (Returning(None), "Returning.estimate returned None"),
]


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(("estimator", "reason"), BROKEN)
def test_a_broken_estimator_degrades_the_decision_and_on_degraded_acts(
    kind: str, estimator: CapabilityEstimator, reason: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    log = DecisionLog(tmp_path / "log.sqlite3")
    if kind == "sync":

        @capgate.guard(policy=POLICY, estimator=estimator, log=log)
        def ask(prompt: str) -> str:
            calls.append(prompt)
            return "answer"

        result = ask("What is 2+2?")
    else:

        @capgate.guard(policy=POLICY, estimator=estimator, log=log)
        async def aask(prompt: str) -> str:
            calls.append(prompt)
            return "answer"

        with caplog.at_level(logging.WARNING, logger="capgate"):
            result = asyncio.run(aask("What is 2+2?"))
    assert isinstance(result, Gated)
    assert calls == []  # fail closed: the call never ran on a missing estimate
    assert result.action == "escalate"
    assert result.decision.degraded
    assert result.estimate.p is None
    assert reason in (result.estimate.reason or "")
    (logged,) = log.decisions()
    assert logged.decision.degraded
    assert reason in (logged.decision.estimate.reason or "")
    if kind == "async":
        assert f"{reason}" in caplog.text
        assert "the decision is degraded" in caplog.text


def test_a_working_estimator_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate(policy=POLICY, estimator=KeywordEstimator({}, default=0.9))
    with caplog.at_level(logging.WARNING, logger="capgate"):
        assert gate.assess("q").action == "answer"
        assert perform(AssessEach([(gate, "a"), (gate, "b")]))[1].action == "answer"
    assert caplog.records == []


def test_the_gate_and_its_batch_fail_closed_per_query() -> None:
    gate = Gate(policy=POLICY, estimator=Returning([Estimate(p=0.9, method="returning")]))
    verdicts = perform(AssessEach([(gate, "first"), (gate, "second")]))  # one Estimate for two queries
    assert [v.action for v in verdicts] == ["escalate", "escalate"]
    assert all("for 2 queries, not one Estimate per query" in (v.estimate.reason or "") for v in verdicts)
    assert gate.assess("x").action == "answer"  # one query, one Estimate: its own value
    assert gate.stats.degraded == 2


def test_a_route_estimator_that_raises_sends_the_query_to_the_strongest_choice() -> None:
    routed = Policy.model_validate(
        {
            "name": "router",
            "bands": [{"below": 0.8, "action": "route", "choices": ["small", "large"]}, {"action": "answer"}],
            "on_degraded": {"action": "route", "choices": ["large"]},
        }
    )
    gate = Gate(
        policy=routed,
        estimator=KeywordEstimator({}, default=0.5),
        routes={"small": Raising(), "large": KeywordEstimator({}, default=0.6)},
    )
    decision = gate.assess("a question").decision
    assert decision.route == "large"
    assert decision.route_plan is not None
    assert decision.route_plan.p == {"small": None, "large": 0.6}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_misconfiguration_and_interrupts_are_raised_not_degraded(kind: str) -> None:
    cases = [
        (Misconfigured(), SettingsError),
        (Unfitted(), NotFittedError),
        (Mismatched(), ProbeMismatchError),
        (Interrupting(), Interrupted),
    ]
    for estimator, error in cases:
        gate = Gate(policy=POLICY, estimator=estimator)
        call = gate.assess if kind == "sync" else (lambda q, g=gate: asyncio.run(g.aassess(q)))
        with pytest.raises(error):
            call("q")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_estimators_own_time_out_is_its_error_not_the_gates_deadline(kind: str) -> None:
    gate = Gate(policy=POLICY, estimator=TimingOut(), estimate_timeout_s=30.0, max_concurrency=2)
    verdict = gate.assess("q") if kind == "sync" else asyncio.run(gate.aassess("q"))
    assert verdict.action == "escalate"
    assert verdict.estimate.reason == "the estimator raised TimeoutError: read timed out"


def test_a_langgraph_node_fails_closed_too() -> None:
    from langgraph.graph import END, START, StateGraph

    from capgate.adapters.agents.langgraph import CapabilityState, capability_node, read_decision

    class State(CapabilityState, total=False):
        query: str

    graph = StateGraph(State)
    graph.add_node("gate", capability_node(policy=POLICY, estimator=Raising(), query="query"))
    graph.add_edge(START, "gate")
    graph.add_edge("gate", END)
    out = graph.compile().invoke({"query": "What is 2+2?"})
    decision = read_decision(out["capgate_decision"])
    assert decision is not None
    assert decision.action == "escalate"
    assert decision.degraded
    assert "ConnectionError: probe server down" in (decision.estimate.reason or "")


def test_in_shadow_mode_a_misconfiguration_is_a_logged_degraded_decision_never_the_calls_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")

    @capgate.guard(policy=POLICY, estimator=Misconfigured(), log=log, mode="shadow")
    def ask(prompt: str) -> str:
        return "answer"

    with caplog.at_level(logging.WARNING, logger="capgate"):
        assert ask("q") == "answer"
        assert ask.gate.flush(10.0)
    # warned, as a failed estimate is: a shadow rollout with a broken probe must not look healthy
    assert "the shadow decision raised SettingsError" in caplog.text
    (logged,) = log.decisions()
    assert (logged.decision.shadow, logged.decision.degraded) == (True, True)
    assert logged.decision.estimate.reason == (
        "the shadow decision raised SettingsError: the probe reads layer 40 of a 30-layer model"
    )
