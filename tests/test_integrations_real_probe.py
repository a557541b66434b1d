"""The integrations acting on the real probe: ``capgate.guard``, the LangGraph subgraph and the
LangChain middleware, each gated by ``load_estimator("default")`` (the embedded SmolLM2 with the
shipped probe) instead of a stub estimator.

The policies are built from the probe's own estimates of the questions below (band edges at the
midpoints between them), so that each band holds at least one question whatever the probe's
exact outputs; each integration must then take exactly the action ``policy.decide`` takes on the
standalone estimate, with the same p, and call the answering function or model only to answer.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import capgate
from capgate import Estimate, Gated
from capgate.adapters.agents.langchain import CapabilityGate
from capgate.adapters.agents.langgraph import capability_subgraph, read_decision
from capgate.estimators import CapabilityEstimator
from capgate.policies import (
    AbstainAction,
    AbstainBand,
    AnswerBand,
    ClarifyBand,
    EscalateBand,
    Policy,
)

pytestmark = pytest.mark.slow

_TRIVIA = (
    "Answer the following question with just the answer (a name, number or short phrase), "
    "without explanation.\n\nQuestion: {q}\nAnswer:"
)

QUESTIONS: tuple[str, ...] = (
    "Calculate 1 + 7 =\nAnswer with only the final number.",
    "Calculate 12 + 30 =",
    _TRIVIA.format(q="According to Greek legend, who was the wife of Odysseus?"),
    _TRIVIA.format(q="Tewkesbury Mustard is mentioned in which Shakespeare play?"),
)
"""Easy arithmetic and hard trivia, in the prompt formats of ``sdk/assets/default_labels.jsonl``."""

ANSWER_TEXT = "The model's answer."
CLARIFY_QUESTION = "Which numbers do you mean exactly?"
ABSTAIN_MESSAGE = "Not answering (p={p:.3f})."


@pytest.fixture(scope="module")
def estimator(default_model_dir: Path) -> CapabilityEstimator:
    """The real default estimator, loaded once for this module (model from the session cache)."""
    return capgate.load_estimator("default", device="cpu")


@pytest.fixture(scope="module")
def standalone(estimator: CapabilityEstimator) -> dict[str, Estimate]:
    """The probe's estimate of each question, asked directly (one query per call, as a gate asks)."""
    estimates = {q: estimator.estimate_one(q) for q in QUESTIONS}
    for q, e in estimates.items():
        assert e.usable, (q, e)
        assert e.method == "probe", (q, e)
    return estimates


def make_policy(
    standalone: dict[str, Estimate], middle: Callable[[float], ClarifyBand | EscalateBand]
) -> Policy:
    """Abstain / ``middle(below)`` / answer, with edges at midpoints between the measured estimates.

    The two lowest questions fall in the abstain band, the second highest in ``middle`` and the
    highest in the answer band, whatever the probe's values, provided they are distinct.
    """
    p = sorted(float(e.p) for e in standalone.values() if e.p is not None)
    assert len(p) == len(QUESTIONS) == 4
    assert p[1] < p[2] < p[3], f"the probe must tell the questions apart; got {p}"
    low, high = (p[1] + p[2]) / 2, (p[2] + p[3]) / 2
    return Policy(
        name="real-probe",
        bands=[AbstainBand(below=low, message=ABSTAIN_MESSAGE), middle(high), AnswerBand()],
        on_degraded=AbstainAction(message="No estimate, no answer."),
    )


def expected_actions(policy: Policy, standalone: dict[str, Estimate]) -> dict[str, str]:
    actions = {q: policy.decide(e).action for q, e in standalone.items()}
    assert len(set(actions.values())) >= 2, actions
    return actions


def assert_same_decision(decision: Any, policy: Policy, estimate: Estimate) -> None:
    """``decision`` (a Decision or its JSON) is what ``policy`` decides on the standalone estimate."""
    decision = read_decision(decision)
    assert decision is not None
    assert decision.action == policy.decide(estimate).action
    assert decision.estimate.p == pytest.approx(estimate.p, abs=1e-6)
    assert decision.estimate.method == "probe"
    assert not decision.degraded
    assert decision.policy == policy.name


# --------------------------------------------------------------------------- guard


def guarded(kind: str, policy: Policy, estimator: CapabilityEstimator, calls: list[str]) -> Any:
    if kind == "sync":

        def ask(prompt: str) -> str:
            calls.append(prompt)
            return ANSWER_TEXT

        return capgate.guard(policy=policy, estimator=estimator)(ask)

    async def aask(prompt: str) -> str:
        await asyncio.sleep(0)
        calls.append(prompt)
        return ANSWER_TEXT

    return capgate.guard(policy=policy, estimator=estimator)(aask)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_guard_acts_on_the_real_probe_estimate(
    kind: str, estimator: CapabilityEstimator, standalone: dict[str, Estimate]
) -> None:
    policy = make_policy(standalone, lambda below: ClarifyBand(below=below, question=CLARIFY_QUESTION))
    expected = expected_actions(policy, standalone)
    calls: list[str] = []
    ask = guarded(kind, policy, estimator, calls)
    for q in QUESTIONS:
        result = ask(q)
        if kind == "async":
            result = asyncio.run(result)
        decision = ask.stats.last_decision
        assert_same_decision(decision, policy, standalone[q])
        if expected[q] == "answer":
            assert result == ANSWER_TEXT
            assert calls[-1] == q
        else:
            assert isinstance(result, Gated)
            assert result.action == expected[q]
            assert result.estimate.p == pytest.approx(standalone[q].p, abs=1e-6)
            assert result.message == decision.message
            assert q not in calls
    assert calls == [q for q in QUESTIONS if expected[q] == "answer"]
    assert ask.stats.calls == len(QUESTIONS)
    assert ask.stats.actions == Counter(expected.values())


# --------------------------------------------------------------------------- LangGraph


def langgraph_app(policy: Policy, estimator: CapabilityEstimator) -> tuple[Any, list[str]]:
    calls: list[str] = []

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(str(state["messages"][0].content))
        return {"messages": [AIMessage(ANSWER_TEXT)]}

    graph = capability_subgraph(answer, policy=policy, estimator=estimator)
    return graph.compile(checkpointer=InMemorySaver()), calls


def test_langgraph_subgraph_routes_on_the_real_probe_estimate(
    estimator: CapabilityEstimator, standalone: dict[str, Estimate]
) -> None:
    policy = make_policy(standalone, lambda below: EscalateBand(below=below, to="tier-2"))
    expected = expected_actions(policy, standalone)
    assert "escalate" in expected.values()
    app, calls = langgraph_app(policy, estimator)
    for i, q in enumerate(QUESTIONS):
        config = {"configurable": {"thread_id": f"q{i}"}}
        out = app.invoke({"messages": [("user", q)]}, config)
        assert_same_decision(out["capgate_decision"], policy, standalone[q])
        assert out["capgate_estimate"]["p"] == pytest.approx(standalone[q].p, abs=1e-6)
        if expected[q] == "answer":
            assert "__interrupt__" not in out
            assert out["messages"][-1].content == ANSWER_TEXT
            assert calls[-1] == q
        elif expected[q] == "abstain":
            assert "__interrupt__" not in out
            assert out["messages"][-1].content == ABSTAIN_MESSAGE.format(p=standalone[q].p)
            assert q not in calls
        else:
            (pending,) = out["__interrupt__"]
            assert pending.value["kind"] == "escalate"
            assert pending.value["to"] == "tier-2"
            assert pending.value["decision"]["estimate"]["p"] == pytest.approx(standalone[q].p, abs=1e-6)
            assert q not in calls
            out = app.invoke(Command(resume={"decision": "reply", "message": "A human answers."}), config)
            assert "__interrupt__" not in out
            assert out["messages"][-1].content == "A human answers."
            assert_same_decision(out["capgate_decision"], policy, standalone[q])
            assert q not in calls
    assert calls == [q for q in QUESTIONS if expected[q] == "answer"]


def test_langgraph_escalation_on_the_real_probe_resumes_into_the_answer_node_when_approved(
    estimator: CapabilityEstimator, standalone: dict[str, Estimate]
) -> None:
    policy = make_policy(standalone, lambda below: EscalateBand(below=below, to="tier-2"))
    expected = expected_actions(policy, standalone)
    (q,) = [q for q in QUESTIONS if expected[q] == "escalate"]
    app, calls = langgraph_app(policy, estimator)
    config = {"configurable": {"thread_id": "approve"}}
    out = app.invoke({"messages": [("user", q)]}, config)
    assert out["__interrupt__"][0].value["kind"] == "escalate"
    assert calls == []
    out = app.invoke(Command(resume={"decision": "approve", "reviewer": "ops"}), config)
    assert "__interrupt__" not in out
    assert calls == [q]
    assert out["messages"][-1].content == ANSWER_TEXT
    assert out["capgate_human"]["decision"] == "approve"
    assert_same_decision(out["capgate_decision"], policy, standalone[q])


# --------------------------------------------------------------------------- LangChain


class ModelCalls(BaseCallbackHandler):
    """Counts the chat model's calls during an agent run."""

    def __init__(self) -> None:
        self.calls = 0

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.calls += 1


def test_langchain_middleware_acts_on_the_real_probe_estimate(
    estimator: CapabilityEstimator, standalone: dict[str, Estimate]
) -> None:
    policy = make_policy(standalone, lambda below: ClarifyBand(below=below, question=CLARIFY_QUESTION))
    expected = expected_actions(policy, standalone)
    # max_clarifications=0: a clarifying question becomes the agent's reply (no interrupt).
    middleware = CapabilityGate(policy=policy, estimator=estimator, max_clarifications=0)
    agent = create_agent(FakeListChatModel(responses=[ANSWER_TEXT]), middleware=[middleware])
    replies: dict[str, Callable[[str], str]] = {
        "answer": lambda q: ANSWER_TEXT,
        "clarify": lambda q: CLARIFY_QUESTION,
        "abstain": lambda q: ABSTAIN_MESSAGE.format(p=standalone[q].p),
    }
    for q in QUESTIONS:
        counter = ModelCalls()
        state = agent.invoke({"messages": [{"role": "user", "content": q}]}, {"callbacks": [counter]})
        assert_same_decision(state["capgate_decision"], policy, standalone[q])
        assert_same_decision(middleware.gate.stats.last_decision, policy, standalone[q])
        assert state["messages"][-1].content == replies[expected[q]](q)
        assert len(state["messages"]) == 2
        assert counter.calls == (1 if expected[q] == "answer" else 0)
    assert middleware.gate.stats.calls == len(QUESTIONS)
