"""The LangChain middleware and the LangGraph nodes, on fake models (no model, no network): a
decision per run, object graph states, a bounded clarification, an answer node's ``config``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command
from pydantic import BaseModel

from capgate.adapters.agents.langchain import CapabilityGate
from capgate.adapters.agents.langgraph import (
    CapabilityState,
    branch_on_decision,
    capability_node,
    capability_subgraph,
)
from capgate.decision import DecisionLog
from capgate.errors import SettingsError
from capgate.policies import load_policy
from tests._estimators import KeywordEstimator

MARKERS = {"ABSTAIN": 0.1, "CLARIFY": 0.3, "ESCALATE": 0.5, "RESAMPLE": 0.7}
POLICY = load_policy(Path(__file__).parent / "data" / "policies" / "agent-test.yaml")


def _ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def _thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


# --------------------------------------------------------------------------- the middleware


@pytest.mark.parametrize("config", [None, _thread("t")], ids=["no thread", "a thread, no checkpointer"])
def test_each_run_of_the_same_question_is_decided_logged_and_counted(
    tmp_path: Path, config: dict[str, Any] | None
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    estimator = KeywordEstimator(MARKERS)
    gate = CapabilityGate(policy=POLICY, estimator=estimator, log=log)
    agent = create_agent(FakeListChatModel(responses=["4"] * 3), middleware=[gate])
    ids = [agent.invoke(_ask("What is 2 + 2?"), config)["capgate_decision"]["id"] for _ in range(3)]
    assert len(set(ids)) == 3
    assert (estimator.calls, gate.stats.calls, len(log.decisions())) == (3, 3, 3)


def test_a_resumed_escalation_keeps_its_decision() -> None:
    estimator = KeywordEstimator(MARKERS)
    gate = CapabilityGate(policy=POLICY, estimator=estimator)
    agent = create_agent(
        FakeListChatModel(responses=["4"] * 2), middleware=[gate], checkpointer=InMemorySaver()
    )
    out = agent.invoke(_ask("ESCALATE: wire the money?"), _thread("e"))
    pending = out["__interrupt__"][0].value["decision"]["id"]
    out = agent.invoke(Command(resume={"decision": "approve"}), _thread("e"))
    assert out["capgate_decision"]["id"] == pending
    assert out["messages"][-1].content == "4"
    assert (estimator.calls, gate.stats.calls) == (1, 1)
    again = agent.invoke(_ask("ESCALATE: wire the money?"), _thread("f"))  # another run: decided anew
    assert again["__interrupt__"][0].value["decision"]["id"] != pending


# --------------------------------------------------------------------------- LangGraph state


class PydanticState(BaseModel):
    messages: Annotated[list[AnyMessage], add_messages] = []
    capgate_estimate: dict[str, Any] | None = None
    capgate_decision: dict[str, Any] | None = None


@dataclass
class DataclassState:
    messages: Annotated[list[AnyMessage], add_messages] = field(default_factory=list)
    capgate_estimate: dict[str, Any] | None = None
    capgate_decision: dict[str, Any] | None = None


@pytest.mark.parametrize("schema", [PydanticState, DataclassState])
def test_the_node_and_the_branch_read_an_object_state(schema: type[Any]) -> None:
    graph: StateGraph[Any, Any, Any, Any] = StateGraph(schema)
    graph.add_node("estimate", capability_node(policy=POLICY, estimator=KeywordEstimator(MARKERS)))
    graph.add_node("answer", lambda state: {"messages": [AIMessage("4")]})
    graph.add_node("abstain", lambda state: {"messages": [AIMessage("declined")]})
    graph.add_edge(START, "estimate")
    graph.add_conditional_edges("estimate", branch_on_decision, {"answer": "answer", "abstain": "abstain"})
    graph.add_edge("answer", END)
    graph.add_edge("abstain", END)
    app = graph.compile()
    assert app.invoke(_ask("What is 2 + 2?"))["messages"][-1].content == "4"
    out = app.invoke(_ask("ABSTAIN: next week's lottery numbers?"))
    assert (out["messages"][-1].content, out["capgate_decision"]["action"]) == ("declined", "abstain")


# --------------------------------------------------------------------------- the subgraph's clarify


class QuestionState(CapabilityState, total=False):
    question: str


def _done(state: Any) -> dict[str, Any]:
    return {"messages": [AIMessage("done")]}


def test_a_clarification_reaches_a_query_key() -> None:
    estimator = KeywordEstimator(MARKERS)
    graph = capability_subgraph(
        _done, policy=POLICY, estimator=estimator, query="question", state_schema=QuestionState
    )
    app = graph.compile(checkpointer=InMemorySaver())
    out = app.invoke({"question": "CLARIFY: the weather in Paris?", "messages": []}, _thread("q"))
    assert out["__interrupt__"][0].value["question"] == "Which country do you mean?"
    out = app.invoke(Command(resume={"answer": "Paris, France"}), _thread("q"))
    assert "__interrupt__" not in out
    assert out["messages"][-1].content == "done"
    assert estimator.seen[-1] == [
        {"role": "user", "content": "CLARIFY: the weather in Paris?"},
        {"role": "assistant", "content": "Which country do you mean?"},
        {"role": "user", "content": "Paris, France"},
    ]


def test_clarifying_questions_are_bounded_then_the_question_is_the_reply() -> None:
    estimator = KeywordEstimator({}, default=0.3)  # every query: clarify
    app = capability_subgraph(_done, policy=POLICY, estimator=estimator).compile(checkpointer=InMemorySaver())
    out = app.invoke(_ask("The weather?"), _thread("b"))
    asked = 0
    while "__interrupt__" in out and asked < 5:
        asked += 1
        out = app.invoke(Command(resume={"answer": f"answer {asked}"}), _thread("b"))
    assert asked == 2  # max_clarifications, as for the middleware
    assert out["messages"][-1].content == "Which country do you mean?"
    assert estimator.calls == 3
    out = app.invoke(_ask("And tomorrow?"), _thread("b"))  # a new step asks again
    assert "__interrupt__" in out
    once = capability_subgraph(_done, policy=POLICY, estimator=estimator, max_clarifications=0)
    out = once.compile(checkpointer=InMemorySaver()).invoke(_ask("The weather?"), _thread("c"))
    assert "__interrupt__" not in out
    assert out["messages"][-1].content == "Which country do you mean?"
    with pytest.raises(SettingsError, match="max_clarifications"):
        capability_subgraph(_done, policy=POLICY, estimator=estimator, max_clarifications=-1)


# --------------------------------------------------------------------------- the answer node's config


def test_the_resample_path_gives_the_answer_node_its_config() -> None:
    def answer(state: Any, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [AIMessage(f"Paris ({config['configurable']['thread_id']})")]}

    app = capability_subgraph(answer, policy=POLICY, estimator=KeywordEstimator(MARKERS)).compile(
        checkpointer=InMemorySaver()
    )
    for text in ("capital of France?", "RESAMPLE: capital of France?"):
        out = app.invoke(_ask(text), _thread("r"))
        assert out["messages"][-1].content == "Paris (r)"
    assert out["capgate_cas"]["samples_used"] >= 2


def test_an_async_answer_node_gets_its_config_on_every_path() -> None:
    async def answer(state: Any, config: RunnableConfig) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"messages": [AIMessage(f"Paris ({config['configurable']['thread_id']})")]}

    app = capability_subgraph(answer, policy=POLICY, estimator=KeywordEstimator(MARKERS)).compile(
        checkpointer=InMemorySaver()
    )

    async def run(text: str) -> dict[str, Any]:
        return await app.ainvoke(_ask(text), _thread("a"))

    for text in ("capital of France?", "RESAMPLE: capital of France?"):
        assert asyncio.run(run(text))["messages"][-1].content == "Paris (a)"
