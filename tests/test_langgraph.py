"""LangGraph integration, end to end with real langgraph, a real model (the embedded default model
through capgate.adapters.backends.transformers.load_backend) and real checkpointers (in memory and
SqliteSaver across a SIGKILL). The capability estimator is a small deterministic one that picks
the policy branch."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _agent_scaffolding import gated_tool_graph
from _estimators import KeywordEstimator
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from pydantic import ValidationError

from capgate import Gate, SamplingParams
from capgate.adapters.agents.hitl import TOOL_ABSTAINED, TOOL_REJECTED
from capgate.adapters.agents.langchain import CapgateChatModel
from capgate.adapters.agents.langgraph import (
    CapabilityState,
    ToolCallGate,
    capability_node,
    capability_subgraph,
    decision_branch,
    read_decision,
)
from capgate.policies import Policy

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
MARKERS = {"ABSTAIN": 0.1, "CLARIFY": 0.3, "ESCALATE": 0.5, "RESAMPLE": 0.7}
POLICY = Policy.model_validate(
    {
        "name": "graph-test",
        "bands": [
            {"below": 0.2, "action": "abstain"},
            {"below": 0.4, "action": "clarify", "question": "Which city do you mean?"},
            {"below": 0.6, "action": "escalate", "to": "tier-2"},
            {"below": 0.8, "action": "resample", "max_samples": 4, "batch_size": 2},
            {"action": "answer"},
        ],
        "on_degraded": "abstain",
    }
)


@pytest.fixture(scope="module")
def model(default_model_dir: Path) -> CapgateChatModel:
    from capgate.adapters.backends.transformers import load_backend

    return CapgateChatModel(
        backend=load_backend("default"), params=SamplingParams(max_tokens=16, temperature=0.8, seed=None)
    )


class Answerer:
    """The answer node: one real model call per invocation, counted."""

    def __init__(self, model: CapgateChatModel) -> None:
        self.model = model
        self.calls = 0

    def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {"messages": [self.model.invoke(state["messages"])]}


def _app(model: CapgateChatModel, **kwargs: Any) -> tuple[Any, Answerer, KeywordEstimator]:
    estimator = KeywordEstimator(MARKERS)
    answer = Answerer(model)
    graph = capability_subgraph(answer, policy=POLICY, estimator=estimator, **kwargs)
    return graph.compile(checkpointer=InMemorySaver()), answer, estimator


def _config(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def test_answer_runs_the_real_model_and_records_the_decision(model: CapgateChatModel) -> None:
    app, answer, _ = _app(model)
    out = app.invoke({"messages": [HumanMessage("What is the capital of France?")]}, _config("a"))
    assert answer.calls == 1
    reply = out["messages"][-1]
    assert isinstance(reply, AIMessage)
    assert reply.content.strip()
    assert reply.usage_metadata["output_tokens"] > 0
    decision = read_decision(out["capgate_decision"])
    assert decision is not None
    assert decision.action == "answer"
    assert out["capgate_estimate"]["p"] == 0.9


def test_abstain_never_calls_the_model(model: CapgateChatModel) -> None:
    app, answer, _ = _app(model)
    out = app.invoke({"messages": [HumanMessage("ABSTAIN: tomorrow's lottery numbers?")]}, _config("b"))
    assert answer.calls == 0
    assert out["messages"][-1].content.startswith("I'm not confident I can answer this correctly")


def test_clarify_interrupts_then_reestimates_with_the_answer(model: CapgateChatModel) -> None:
    app, answer, estimator = _app(model)
    config = _config("c")
    out = app.invoke({"messages": [HumanMessage("CLARIFY: what is the population?")]}, config)
    (pending,) = out["__interrupt__"]
    assert pending.value["kind"] == "clarify"
    assert pending.value["question"] == "Which city do you mean?"
    assert pending.value["decision"]["action"] == "clarify"
    assert "answer" in json.dumps(pending.response_schema)  # the ClarifyResponse schema for clients
    assert answer.calls == 0
    # A resume value that does not fit the schema is refused and the interrupt stays pending.
    with pytest.raises(ValidationError):
        app.invoke(Command(resume={"reply": "Paris"}), config)
    assert app.get_state(config).next == ("clarify",)
    out = app.invoke(Command(resume={"answer": "I mean Paris, France."}), config)
    kinds = [(m.type, m.content) for m in out["messages"][:3]]
    assert kinds == [
        ("human", "CLARIFY: what is the population?"),
        ("ai", "Which city do you mean?"),
        ("human", "I mean Paris, France."),
    ]
    assert estimator.calls == 2  # estimated again with the clarification (no marker now: answer)
    assert answer.calls == 1
    assert isinstance(out["messages"][-1], AIMessage)
    assert out["capgate_human"] == {"answer": "I mean Paris, France."}


@pytest.mark.parametrize(
    ("resume", "expect_model"),
    [
        ({"decision": "approve", "reviewer": "bob"}, True),
        ({"decision": "reject", "message": "policy question"}, False),
        ({"decision": "reply", "message": "Our refund window is 30 days."}, False),
    ],
)
def test_escalate_reviewer_verdicts(
    model: CapgateChatModel, resume: dict[str, str], expect_model: bool
) -> None:
    app, answer, _ = _app(model)
    config = _config(f"e-{resume['decision']}")
    out = app.invoke({"messages": [HumanMessage("ESCALATE: may I return a used item?")]}, config)
    (pending,) = out["__interrupt__"]
    assert pending.value["kind"] == "escalate"
    assert pending.value["to"] == "tier-2"
    assert pending.value["query"] == [{"role": "user", "content": "ESCALATE: may I return a used item?"}]
    assert "Escalated for human review" in pending.value["summary"]
    out = app.invoke(Command(resume=resume), config)
    assert answer.calls == int(expect_model)
    last = out["messages"][-1].content
    if resume["decision"] == "reject":
        assert last == "A human reviewer declined to have this answered. Reason: policy question"
    elif resume["decision"] == "reply":
        assert last == "Our refund window is 30 days."
    assert out["capgate_human"]["decision"] == resume["decision"]


def test_escalation_reply_needs_text(model: CapgateChatModel) -> None:
    app, _, _ = _app(model)
    config = _config("e-bad")
    app.invoke({"messages": [HumanMessage("ESCALATE")]}, config)
    with pytest.raises(ValidationError, match="needs the reply text"):
        app.invoke(Command(resume={"decision": "reply"}), config)
    assert app.get_state(config).next == ("escalate",)


def test_resample_votes_over_real_model_samples(model: CapgateChatModel) -> None:
    first_word = lambda text: (text.split() or [None])[0]  # noqa: E731
    app, answer, _ = _app(model, extract=lambda t: (first_word(t) or "").strip(".,!").lower() or None)
    out = app.invoke({"messages": [HumanMessage("RESAMPLE: name a primary colour.")]}, _config("r"))
    cas = out["capgate_cas"]
    assert cas["samples_used"] == answer.calls
    assert 2 <= cas["samples_used"] <= 4
    assert sum(cas["votes"].values()) <= cas["samples_used"]
    if cas["answer"] is not None:
        winner = out["messages"][-1].content
        assert first_word(winner).strip(".,!").lower() == cas["answer"]
        assert cas["votes"][cas["answer"]] == max(cas["votes"].values())


def test_async_graph_uses_async_estimation(model: CapgateChatModel) -> None:
    app, answer, estimator = _app(model)

    async def go() -> dict[str, Any]:
        return await app.ainvoke({"messages": [HumanMessage("Name a planet.")]}, _config("async"))

    out = asyncio.run(go())
    assert (estimator.calls, estimator.acalls) == (0, 1)
    assert answer.calls == 1
    assert isinstance(out["messages"][-1], AIMessage)


def test_capability_node_and_router_in_a_custom_graph(model: CapgateChatModel) -> None:
    class State(CapabilityState, total=False):
        question: str
        reply: str

    estimator = KeywordEstimator(MARKERS)
    gate = Gate(policy=POLICY, estimator=estimator)

    def reply(state: State) -> dict[str, Any]:
        return {"reply": model.invoke(state["question"]).content}

    graph = StateGraph(State)
    graph.add_node("gate", capability_node(gate=gate.with_options(step="qa"), query="question"))
    graph.add_node("reply", reply)
    graph.add_node("decline", lambda s: {"reply": "declined"})
    graph.add_edge(START, "gate")
    graph.add_conditional_edges(
        "gate",
        decision_branch(),
        {
            "answer": "reply",
            "abstain": "decline",
            "clarify": "decline",
            "escalate": "decline",
            "resample": "reply",
        },
    )
    graph.add_edge("reply", END)
    graph.add_edge("decline", END)
    app = graph.compile()
    assert app.invoke({"question": "ABSTAIN please"})["reply"] == "declined"
    out = app.invoke({"question": "Say hello."})
    assert out["reply"].strip()
    assert out["capgate_decision"]["step"] == "qa"
    assert estimator.seen == ["ABSTAIN please", "Say hello."]
    assert gate.stats.actions == {"abstain": 1, "answer": 1}


def test_escalation_survives_sigkill_and_resumes_in_a_new_process(tmp_path: Path) -> None:
    db = str(tmp_path / "checkpoints.sqlite")
    script = str(HERE / "_langgraph_escalation_proc.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen(
        [sys.executable, script, "start", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert first.stdout is not None
        line = first.stdout.readline()
        assert line.startswith("PENDING "), line
        interrupt_id = line.split()[1]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    second = subprocess.run(
        [sys.executable, script, "resume", db],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    result = json.loads(second.stdout.strip().splitlines()[-1])
    assert result["next_before"] == ["escalate"]
    assert result["pending"][0]["kind"] == "escalate"
    assert result["pending"][0]["decision"]["action"] == "escalate"
    assert interrupt_id  # the id printed by the killed process
    assert result["estimator_calls"] == 0  # the decision came from the checkpoint, not re-estimated
    assert result["human"] == {"decision": "approve", "message": None, "reviewer": "alice"}
    messages = result["messages"]
    assert messages[0] == ["human", "Can I get a refund on a used item?"]
    assert messages[-1][0] == "ai"
    assert messages[-1][1].strip()  # the real model answered after the approval
    assert len(messages) == 2


# --------------------------------------------------------------------------- tool gating


TOOL_POLICY = Policy.model_validate(
    {
        "name": "tool-test",
        "bands": [{"action": "answer"}],
        "on_degraded": "abstain",
        "tools": {
            "lookup": {
                "bands": [
                    {"below": 0.2, "action": "abstain", "message": "too risky"},
                    {"below": 0.4, "action": "clarify", "question": "Look up which spelling?"},
                    {"below": 0.6, "action": "escalate", "to": "approvals"},
                    {"action": "answer"},
                ]
            }
        },
    }
)


def _tool_app(model: CapgateChatModel) -> tuple[Any, list[str], KeywordEstimator]:
    looked_up: list[str] = []

    @tool
    def lookup(term: str) -> str:
        """Look a term up in the encyclopedia."""
        looked_up.append(term)
        return f"encyclopedia entry for {term}"

    estimator = KeywordEstimator(MARKERS)
    gate = ToolCallGate(gate=Gate(policy=TOOL_POLICY, estimator=estimator))
    bound = model.bind_tools([lookup], tool_choice="lookup")
    graph = gated_tool_graph(bound, lookup, gate, CapabilityState)
    return graph.compile(checkpointer=InMemorySaver()), looked_up, estimator


def test_tool_call_runs_when_the_policy_answers(model: CapgateChatModel) -> None:
    app, looked_up, estimator = _tool_app(model)
    out = app.invoke({"messages": [HumanMessage("Who wrote Hamlet?")]}, _config("t1"))
    proposal, result = out["messages"][-2], out["messages"][-1]
    assert proposal.tool_calls[0]["name"] == "lookup"
    term = proposal.tool_calls[0]["args"]["term"]
    assert looked_up == [term]
    assert isinstance(result, ToolMessage)
    assert result.content == f"encyclopedia entry for {term}"
    # The estimator judged the conversation plus the proposed call.
    assert estimator.seen[-1][-1]["content"].startswith("Proposed tool call: lookup(")


def test_tool_call_abstain_and_escalation(model: CapgateChatModel) -> None:
    app, looked_up, _ = _tool_app(model)
    out = app.invoke({"messages": [HumanMessage("ABSTAIN who wrote Hamlet?")]}, _config("t2"))
    assert looked_up == []
    assert out["messages"][-1].content == TOOL_ABSTAINED.format(tool="lookup", message="too risky")
    assert out["messages"][-1].status == "error"

    config = _config("t3")
    out = app.invoke({"messages": [HumanMessage("ESCALATE who wrote Hamlet?")]}, config)
    (pending,) = out["__interrupt__"]
    assert pending.value["tool_call"]["name"] == "lookup"
    assert pending.value["to"] == "approvals"
    out = app.invoke(Command(resume={"decision": "reject", "message": "not now"}), config)
    assert looked_up == []
    assert out["messages"][-1].content == TOOL_REJECTED.format(tool="lookup", reason=" Reason: not now")

    config = _config("t4")
    app.invoke({"messages": [HumanMessage("ESCALATE who wrote Hamlet?")]}, config)
    out = app.invoke(Command(resume={"decision": "approve"}), config)
    assert len(looked_up) == 1
    assert out["messages"][-1].content.startswith("encyclopedia entry for")


def test_tool_call_clarify_asks_the_user(model: CapgateChatModel) -> None:
    app, looked_up, _ = _tool_app(model)
    config = _config("t5")
    out = app.invoke({"messages": [HumanMessage("CLARIFY who wrote Hamlet?")]}, config)
    assert out["__interrupt__"][0].value["question"] == "Look up which spelling?"
    out = app.invoke(Command(resume={"answer": "Hamlet, the play"}), config)
    assert looked_up == []
    assert out["messages"][-1].content.endswith("The user answered: Hamlet, the play")


def test_subgraph_takes_tool_and_on_block(model: CapgateChatModel) -> None:
    from capgate import Abstained

    app, answer, _ = _app(model, tool="search", step="qa")
    out = app.invoke({"messages": [HumanMessage("What is 2 + 2?")]}, _config("settings"))
    decision = read_decision(out["capgate_decision"])
    assert decision is not None
    assert (decision.tool, decision.step) == ("search", "qa")
    raising, answer, _ = _app(model, on_block="raise")
    with pytest.raises(Abstained):
        raising.invoke({"messages": [HumanMessage("ABSTAIN: lottery")]}, _config("raise"))
    assert answer.calls == 0


def test_a_stored_resample_decision_is_acted_on_without_its_policy(model: CapgateChatModel) -> None:
    """The subgraph samples a decision read from state by the decision's own plan: a graph whose
    gate has a policy with no resample band at all still resamples it."""
    app, answer, _ = _app(model)
    out = app.invoke({"messages": [HumanMessage("RESAMPLE: 2 + 2?")]}, _config("stored"))
    stored = read_decision(out["capgate_decision"])
    assert stored is not None
    assert stored.plan is not None
    assert stored.plan.max_samples == 4

    class State(CapabilityState, total=False):
        pass

    other = capability_subgraph(answer, policy="conservative", estimator=KeywordEstimator({}))
    graph = StateGraph(State)
    resample = other.nodes["resample"].runnable
    graph.add_node("resample", resample)
    graph.add_edge(START, "resample")
    graph.add_edge("resample", END)
    calls_before = answer.calls
    done = graph.compile().invoke(
        {"messages": [HumanMessage("RESAMPLE: 2 + 2?")], "capgate_decision": stored.model_dump(mode="json")}
    )
    assert done["capgate_cas"]["decision_id"] == stored.id
    assert 1 <= answer.calls - calls_before == done["capgate_cas"]["samples_used"] <= 4
