"""LangChain 1.x middleware, end to end: real ``create_agent``, the embedded default model behind
:class:`CapgateChatModel` (a real BaseChatModel over a capgate backend), real tools and a real
checkpointer. The capability estimator is a small deterministic one that picks the policy branch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _agent_scaffolding import ForceFirstTool
from _estimators import KeywordEstimator
from _fakes import CountingBackend as Counting
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from capgate import Gate, SamplingParams
from capgate.adapters.agents.langchain import CapabilityGate, CapgateChatModel
from capgate.policies import load_policy

pytestmark = pytest.mark.slow

MARKERS = {"ABSTAIN": 0.1, "CLARIFY": 0.3, "ESCALATE": 0.5, "RESAMPLE": 0.7, "NOEST": None}
POLICY = load_policy(Path(__file__).parent / "data" / "policies" / "agent-test.yaml")


@pytest.fixture
def backend(real_backend: Any) -> Counting:
    return Counting(real_backend)


def _model(backend: Counting) -> CapgateChatModel:
    return CapgateChatModel(backend=backend, params=SamplingParams(max_tokens=16, temperature=0.8))


def _agent(backend: Counting, *, tools: Sequence[Any] = (), extra: Sequence[Any] = (), **gate: Any) -> Any:
    middleware = CapabilityGate(
        policy=POLICY, estimator=gate.pop("estimator", KeywordEstimator(MARKERS)), **gate
    )
    agent = create_agent(
        _model(backend), tools=list(tools), middleware=[middleware, *extra], checkpointer=InMemorySaver()
    )
    return agent, middleware


def _ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def _config(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def test_answer_lets_the_real_model_reply(backend: Counting) -> None:
    agent, gate = _agent(backend)
    out = agent.invoke(_ask("What is the capital of Italy?"), _config("a"))
    assert backend.calls == 1
    reply = out["messages"][-1]
    assert isinstance(reply, AIMessage)
    assert reply.content.strip()
    assert out["capgate_decision"]["action"] == "answer"
    assert gate.gate.stats.actions == {"answer": 1}


def test_abstain_jumps_to_end_without_the_model(backend: Counting) -> None:
    agent, _ = _agent(backend)
    out = agent.invoke(_ask("ABSTAIN: next week's lottery numbers"), _config("b"))
    assert backend.calls == 0
    assert [m.type for m in out["messages"]] == ["human", "ai"]
    assert out["messages"][-1].content == "Not answering that (p=0.10)."
    degraded = agent.invoke(_ask("NOEST"), _config("b2"))
    assert degraded["messages"][-1].content == "No estimate, no answer."
    assert degraded["capgate_decision"]["degraded"] is True


def test_clarify_interrupts_and_the_answer_joins_the_conversation(backend: Counting) -> None:
    agent, gate = _agent(backend)
    config = _config("c")
    out = agent.invoke(_ask("CLARIFY: what is the capital?"), config)
    assert out["__interrupt__"][0].value["question"] == "Which country do you mean?"
    assert backend.calls == 0
    out = agent.invoke(Command(resume={"answer": "Spain."}), config)
    assert [(m.type, m.content) for m in out["messages"][:3]] == [
        ("human", "CLARIFY: what is the capital?"),
        ("ai", "Which country do you mean?"),
        ("human", "Spain."),
    ]
    assert backend.calls == 1
    assert isinstance(out["messages"][-1], AIMessage)
    # The step was estimated again with the clarification in it (no marker: answer).
    assert gate.gate.stats.actions == {"clarify": 1, "answer": 1}


def test_clarify_rounds_are_bounded(backend: Counting) -> None:
    agent, _ = _agent(backend, estimator=KeywordEstimator(MARKERS, whole=True), max_clarifications=1)
    config = _config("c2")
    agent.invoke(_ask("CLARIFY: what is the capital?"), config)
    out = agent.invoke(Command(resume={"answer": "a country"}), config)
    # Still unclear after one round: the question is put in the chat and the run ends.
    assert out["messages"][-1].content == "Which country do you mean?"
    assert "__interrupt__" not in out
    assert backend.calls == 0


@pytest.mark.parametrize("verdict", ["approve", "reply", "reject"])
def test_escalate_interrupts_for_a_reviewer(backend: Counting, verdict: str) -> None:
    agent, _ = _agent(backend)
    config = _config(f"e-{verdict}")
    out = agent.invoke(_ask("ESCALATE: can I cancel my contract early?"), config)
    value = out["__interrupt__"][0].value
    assert (value["kind"], value["to"]) == ("escalate", "tier-2")
    resume = {"decision": verdict, "message": "Yes, with a fee." if verdict != "approve" else None}
    out = agent.invoke(Command(resume=resume), config)
    assert backend.calls == (1 if verdict == "approve" else 0)
    last = out["messages"][-1].content
    if verdict == "reply":
        assert last == "Yes, with a fee."
    if verdict == "reject":
        assert last == "A human reviewer declined to have this answered. Reason: Yes, with a fee."
    assert out["capgate_human"]["decision"] == verdict


def test_resample_calls_the_model_repeatedly_under_cas(backend: Counting) -> None:
    agent, gate = _agent(backend, extract=lambda t: (t.split() or [""])[0].strip(".,!").lower() or None)
    out = agent.invoke(_ask("RESAMPLE: name a colour."), _config("r"))
    cas = gate.gate.stats.last_cas
    assert cas is not None
    assert backend.calls == cas.samples_used
    assert 2 <= cas.samples_used <= 4
    reply = out["messages"][-1]
    assert isinstance(reply, AIMessage)
    assert len([m for m in out["messages"] if isinstance(m, AIMessage)]) == 1  # only the winner is kept
    if cas.answer is not None:
        assert reply.content.split()[0].strip(".,!").lower() == cas.answer


def _lookup() -> tuple[Any, list[str]]:
    looked_up: list[str] = []

    @tool
    def lookup(term: str) -> str:
        """Look a term up in the encyclopedia."""
        looked_up.append(term)
        return f"encyclopedia entry for {term}"

    return lookup, looked_up


def test_tool_call_is_gated_before_it_runs(backend: Counting) -> None:
    lookup, looked_up = _lookup()
    # The tool-call estimate reads the last user turn: the marker in the question picks the branch.
    agent, _ = _agent(backend, tools=[lookup], extra=[ForceFirstTool()])
    config = _config("t-answer")
    out = agent.invoke(_ask("Who wrote Hamlet?"), config)
    assert len(looked_up) == 1  # answered: the tool ran
    assert isinstance(out["messages"][-1], AIMessage)
    stored = out["capgate_tool_decisions"]
    assert [r["decision"]["tool"] for r in stored.values()] == ["lookup"]

    lookup2, looked_up2 = _lookup()
    agent2, _ = _agent(
        backend, tools=[lookup2], extra=[ForceFirstTool()], estimator=KeywordEstimator({"Hamlet": 0.5})
    )
    config = _config("t-approve")
    out = agent2.invoke(_ask("Who wrote Hamlet?"), config)
    # The model step itself was escalated too (p=0.5 for the question): approve it first.
    assert out["__interrupt__"][0].value["tool_call"] is None
    out = agent2.invoke(Command(resume={"decision": "approve"}), config)
    value = out["__interrupt__"][0].value
    assert value["tool_call"]["name"] == "lookup"
    assert value["to"] == "approvals"
    assert looked_up2 == []
    out = agent2.invoke(Command(resume={"decision": "reject", "message": "no lookups today"}), config)
    assert looked_up2 == []
    rejected = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert rejected[-1].content.endswith("Reason: no lookups today")


def test_tool_resample_redraws_the_proposal(backend: Counting) -> None:
    lookup, looked_up = _lookup()
    estimator = KeywordEstimator({"Proposed tool call": 0.7}, whole=True)
    agent, gate = _agent(backend, tools=[lookup], extra=[ForceFirstTool()], estimator=estimator)
    out = agent.invoke(_ask("Who painted the Mona Lisa?"), _config("t-resample"))
    records = list(out["capgate_tool_decisions"].values())
    assert records[0]["voted"] is True
    assert records[0]["decision"]["action"] == "resample"
    assert gate.gate.stats.last_cas is not None
    assert gate.gate.stats.last_cas.samples_used >= 2
    assert len(looked_up) == 1  # the voted proposal ran once


def test_async_agent_uses_the_async_hooks(backend: Counting) -> None:
    lookup, looked_up = _lookup()
    estimator = KeywordEstimator(MARKERS)
    agent, _ = _agent(backend, tools=[lookup], extra=[ForceFirstTool()], estimator=estimator)

    async def go() -> dict[str, Any]:
        return await agent.ainvoke(_ask("Who wrote Faust?"), _config("async"))

    out = asyncio.run(go())
    assert estimator.calls == 0
    assert estimator.acalls >= 2  # the model steps and the proposed tool call
    assert len(looked_up) == 1
    assert isinstance(out["messages"][-1], AIMessage)


def test_constructor_checks_arguments_at_once() -> None:
    with pytest.raises(ValueError, match="`max_clarifications` must be a non-negative integer; got -1"):
        CapabilityGate(max_clarifications=-1)
    with pytest.raises(ValueError, match="`step` must be a non-empty string or None; got ''"):
        CapabilityGate(step="")
    with pytest.raises(ValueError, match="`gate_tools` must be True or False; got 'yes'"):
        CapabilityGate(gate_tools="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`estimator` must be a capgate CapabilityEstimator"):
        CapabilityGate(estimator="probe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either gate= or"):
        CapabilityGate(gate=Gate(), policy="conservative")
    with pytest.raises(TypeError):
        CapabilityGate(POLICY)  # type: ignore[misc]


def test_chat_model_parses_json_tool_calls_and_counts_tokens(backend: Counting) -> None:
    model = _model(backend)
    text = model.invoke([HumanMessage("Say the word 'blue'.")])
    assert text.usage_metadata["input_tokens"] > 0
    parsed = CapgateChatModel._parse_call(
        'Sure. {"tool": "lookup", "args": {"term": "x"}}', [{"name": "lookup"}]
    )
    assert parsed is not None
    assert (parsed["name"], parsed["args"]) == ("lookup", {"term": "x"})
    assert CapgateChatModel._parse_call('{"tool": "other", "args": {}}', [{"name": "lookup"}]) is None
    assert CapgateChatModel._argument("integer", " 42 apples") == 42
    with pytest.raises(ValueError, match="not a bound tool"):
        CapgateChatModel._forced([{"function": {"name": "lookup"}}], "search")


def test_every_integration_takes_the_same_settings(backend: Counting) -> None:
    """tool= and on_block= work on the middleware as on guard; on_block="raise" raises the block."""
    from capgate import Abstained

    agent, middleware = _agent(backend, tool="lookup", step="chat")
    out = agent.invoke(_ask("What is 2 + 2?"), _config("settings"))
    decision = out["capgate_decision"]
    assert (decision["tool"], decision["step"]) == ("lookup", "chat")
    assert middleware.stats is middleware.gate.stats
    raising, _ = _agent(backend, on_block="raise")
    with pytest.raises(Abstained) as blocked:
        raising.invoke(_ask("ABSTAIN: lottery"), _config("raise"))
    assert blocked.value.decision.action == "abstain"
    assert backend.calls == 1  # only the answered question reached the model
