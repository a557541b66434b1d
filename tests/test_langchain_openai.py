"""LangChain with the user's own OpenAI chat model (issue #24 part 2), against the CI vLLM server.

A user's agent is ``create_agent(ChatOpenAI(base_url=..., model=...), tools=[...],
middleware=[CapabilityGate(...)])``; these tests run exactly that (and the LangGraph nodes around
a ``ChatOpenAI`` node) against the server ``scripts/with-vllm-server.sh`` starts. The server runs
with a tool-call parser (``scripts/vllm-server.sh``: ``--enable-auto-tool-choice
--tool-call-parser xlam`` and a chat template that shows SmolLM2 its tools); without it every
request with tools and no ``tool_choice`` is refused with HTTP 400. The model is far too small to
choose a tool on its own, so the tool-call tests force one: with a named ``tool_choice`` (decoded
under the tool's JSON schema), or, to check the parser under "auto", by constraining the reply's
text to the model's own call format. Every request the chat model sends is counted at its HTTP client,
so "nothing was sent" and "one request per sample" are checked on the wire.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from _agent_scaffolding import ForceFirstTool, gated_tool_graph
from _ci_server import ci_vllm_server
from _estimators import KeywordEstimator
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import MessagesState
from pydantic import BaseModel, Field

from capgate import Estimate, SamplingParams
from capgate.adapters.agents.langchain import CapabilityGate, model_target
from capgate.adapters.agents.langgraph import ToolCallGate, capability_subgraph
from capgate.adapters.backends.openai import OpenAIBackend
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator, VerbalizedConfidence
from capgate.policies import Policy, load_policy

pytestmark = pytest.mark.slow

MARKERS = {"ABSTAIN": 0.1, "RESAMPLE": 0.3, "RISKY": 0.5}
POLICY = load_policy(Path(__file__).parent / "data" / "policies" / "hosted-langchain-test.yaml")


def first_word(text: str) -> str | None:
    """The vote of a reply: its first word, lower-cased."""
    return (text.split() or [""])[0].strip(".,!:;\"'").lower() or None


class Server:
    """The CI server, and ``ChatOpenAI`` models pointed at it that count their HTTP requests."""

    def __init__(self) -> None:
        self.url, self.name = ci_vllm_server()
        self.requests = 0
        self._clients: list[httpx.Client] = []
        self._aclients: list[httpx.AsyncClient] = []

    def _count(self, request: httpx.Request) -> None:
        self.requests += 1

    async def _acount(self, request: httpx.Request) -> None:
        self.requests += 1

    def chat(self, **settings: Any) -> ChatOpenAI:
        """A ``ChatOpenAI`` as a user writes it (plus the counting client and short replies).

        No seed: the gate's resample draws one sample per call, and a seeded server would give
        the same reply to every call.
        """
        client = httpx.Client(event_hooks={"request": [self._count]}, timeout=180.0)
        aclient = httpx.AsyncClient(event_hooks={"request": [self._acount]}, timeout=180.0)
        self._clients.append(client)
        self._aclients.append(aclient)
        settings = {"max_tokens": 48, "temperature": 0.8, "max_retries": 0, **settings}
        return ChatOpenAI(
            base_url=self.url, api_key="x", model=self.name,
            http_client=client, http_async_client=aclient, **settings,
        )  # fmt: skip

    def close(self) -> None:
        for client in self._clients:
            client.close()

    async def aclose(self) -> None:
        """Close the async clients (in the event loop that used them)."""
        for client in self._aclients:
            await client.aclose()
        self._aclients.clear()


@pytest.fixture
def server() -> Iterator[Server]:
    found = Server()
    yield found
    found.close()


class LookupArgs(BaseModel):
    # Bounded: a forced call is decoded under this schema, so it always closes within max_tokens
    # (an unbounded term from this tiny model runs past them ~1 time in 5: an invalid call).
    term: str = Field(max_length=24, description="The term to look up.")


def _lookup() -> tuple[Any, list[str]]:
    looked_up: list[str] = []

    @tool(args_schema=LookupArgs)
    def lookup(term: str) -> str:
        """Look a term up in the encyclopedia."""
        looked_up.append(term)
        return f"Encyclopedia entry for {term}."

    return lookup, looked_up


def _ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def test_the_chat_model_names_its_target(server: Server) -> None:
    assert model_target(server.chat()) == server.name


def test_an_agent_with_a_tool_is_gated_and_its_decisions_name_the_model(
    server: Server, tmp_path: Path
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    lookup, _ = _lookup()
    gate = CapabilityGate(policy=POLICY, estimator=KeywordEstimator(MARKERS), log=log)
    agent = create_agent(server.chat(), tools=[lookup], middleware=[gate])

    # The tools go out with no tool_choice ("auto"): the server accepts them (no HTTP 400).
    out = agent.invoke(_ask("What is the capital of France?"))
    assert out["capgate_decision"]["action"] == "answer"
    assert isinstance(out["messages"][-1], AIMessage)
    assert server.requests >= 1
    sent = server.requests

    out = agent.invoke(_ask("ABSTAIN: next week's lottery numbers?"))
    assert out["messages"][-1].content == "Not answering that (p=0.10)."
    assert server.requests == sent  # blocked before the model: nothing sent

    steps = [d.decision for d in log.decisions() if d.decision.tool is None]
    # One step per model call (two if the model chose to call the tool), then the blocked one.
    assert [d.action for d in steps] == ["answer"] * (len(steps) - 1) + ["abstain"]
    assert {d.target for d in steps} == {server.name}


# What SmolLM2 writes when it calls a tool on its own (rare for 135M parameters, so it is made to).
WRITTEN_CALL = r'<tool_call>\[\{"name": "lookup", "arguments": \{"term": "[A-Za-z ]{1,20}"\}\}\]</tool_call>'


class WriteFirstCall(AgentMiddleware):
    """On the first model step, constrain the reply's text to SmolLM2's own tool-call format
    (vLLM's ``structured_outputs`` regex); ``tool_choice`` stays unset ("auto")."""

    def wrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        if not any(isinstance(m, ToolMessage) for m in request.messages):
            settings = {
                **request.model_settings,
                "extra_body": {"structured_outputs": {"regex": WRITTEN_CALL}},
            }
            request = request.override(model_settings=settings)
        return handler(request)


def test_the_server_shows_the_model_its_tools_and_parses_its_calls(server: Server, tmp_path: Path) -> None:
    lookup, looked_up = _lookup()
    question = [HumanMessage("Look up Rome in the encyclopedia.")]
    bare = server.chat(max_tokens=1).invoke(question).usage_metadata
    shown = server.chat(max_tokens=1).bind_tools([lookup]).invoke(question).usage_metadata
    assert bare is not None
    assert shown is not None
    assert shown["input_tokens"] > bare["input_tokens"] + 50  # the chat template lists the tool

    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = CapabilityGate(policy=POLICY, estimator=KeywordEstimator(MARKERS), log=log)
    agent = create_agent(server.chat(), tools=[lookup], middleware=[gate, WriteFirstCall()])
    out = agent.invoke(_ask("Look up Rome in the encyclopedia."))
    # The reply's text was a written call; the server's parser (xlam) made it a tool call.
    proposal = next(m for m in out["messages"] if isinstance(m, AIMessage))
    (call,) = proposal.tool_calls
    assert call["name"] == "lookup"
    assert looked_up == [call["args"]["term"]]  # gated (p = 0.9: answer), then run
    (record,) = out["capgate_tool_decisions"].values()
    assert (record["decision"]["action"], record["decision"]["target"]) == ("answer", server.name)


def test_a_proposed_tool_call_is_gated_before_it_runs(server: Server, tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    lookup, looked_up = _lookup()
    gate = CapabilityGate(policy=POLICY, estimator=KeywordEstimator(MARKERS), log=log)
    agent = create_agent(server.chat(), tools=[lookup], middleware=[gate, ForceFirstTool()])

    # p = 0.5: the step answers (the model proposes a lookup), the lookup itself abstains.
    out = agent.invoke(_ask("RISKY: look up Rome in the encyclopedia."))
    assert looked_up == []  # the tool never ran
    (record,) = out["capgate_tool_decisions"].values()
    decision = record["decision"]
    assert (decision["action"], decision["tool"], decision["target"]) == ("abstain", "lookup", server.name)
    (refused,) = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert "Not running lookup (p=0.50)." in refused.content
    assert server.requests == 2  # the forced proposal, then the reply after the refusal

    # p = 0.9 (no marker): the same proposal runs.
    out = agent.invoke(_ask("Look up Rome in the encyclopedia."))
    assert len(looked_up) == 1
    (ran,) = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert ran.content == f"Encyclopedia entry for {looked_up[0]}."
    tools = [d.decision for d in log.decisions() if d.decision.tool == "lookup"]
    assert [(d.action, d.target) for d in tools] == [("abstain", server.name), ("answer", server.name)]


def test_resample_draws_one_call_per_sample_under_cas(server: Server, tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = CapabilityGate(policy=POLICY, estimator=KeywordEstimator(MARKERS), log=log, extract=first_word)
    agent = create_agent(server.chat(temperature=1.0), middleware=[gate])
    out = agent.invoke(_ask("RESAMPLE: name a primary colour."))
    cas = gate.stats.last_cas
    assert cas is not None
    assert 2 <= cas.samples_used <= 4
    assert server.requests == cas.samples_used  # each sample is one call of the chat model
    assert len([m for m in out["messages"] if isinstance(m, AIMessage)]) == 1  # only the winner is kept
    if cas.answer is not None:
        assert first_word(out["messages"][-1].text) == cas.answer
    (logged,) = log.decisions()
    assert (logged.decision.action, logged.decision.target) == ("resample", server.name)
    assert logged.samples_used == cas.samples_used


class ProposalEstimator(CapabilityEstimator):
    """p = 0.3 for a proposed lookup (the query ends with the call), 0.9 for a model step."""

    method = "proposal"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        def last(query: Prompt) -> str:
            return query if isinstance(query, str) else str(query[-1].get("content", ""))

        return [
            Estimate(p=0.3 if last(q).startswith("Proposed tool call: lookup") else 0.9, method=self.method)
            for q in queries
        ]


def test_a_tool_proposal_is_resampled_by_its_exact_calls(server: Server) -> None:
    lookup, looked_up = _lookup()
    policy = POLICY.model_copy(update={"tools": {}})  # the lookup falls in the resample band
    gate = CapabilityGate(policy=policy, estimator=ProposalEstimator())
    agent = create_agent(server.chat(temperature=1.0), tools=[lookup], middleware=[gate, ForceFirstTool()])
    out = agent.invoke(_ask("Look up Rome in the encyclopedia."))
    (record,) = out["capgate_tool_decisions"].values()
    assert (record["decision"]["action"], record["voted"]) == ("resample", True)
    cas = gate.stats.last_cas
    assert cas is not None
    assert cas.samples_used >= 2
    # The first proposal, the redraws (one call each), then the reply after the tool ran.
    assert server.requests == 1 + cas.samples_used + 1
    assert len(looked_up) == 1  # the voted proposal ran once
    if cas.answer is not None:
        (call,) = json.loads(cas.answer.removeprefix("tool-calls:"))
        assert call == {"name": "lookup", "args": {"term": looked_up[0]}}


def test_the_verbalized_estimator_on_the_same_server_gates_and_resamples(
    server: Server, tmp_path: Path
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    # The hosted-model path as a user wires it: the model rates itself over the same endpoint.
    backend = OpenAIBackend(server.name, base_url=server.url, api_key="x", timeout=180.0, max_retries=2)
    verbalized = VerbalizedConfidence(backend, params=SamplingParams(temperature=0.7, max_tokens=64))
    policy = Policy.model_validate(
        {
            "name": "always-resample",
            "bands": [{"action": "resample", "max_samples": 4, "batch_size": 2}],
            "on_degraded": {"action": "abstain", "message": "No estimate, no answer."},
        }
    )
    gate = CapabilityGate(policy=policy, estimator=verbalized, log=log, extract=first_word)
    agent = create_agent(server.chat(temperature=1.0), middleware=[gate])

    async def run() -> dict[str, Any]:  # the async hooks, the estimator's aestimate
        try:
            return await agent.ainvoke(_ask("What is the capital of France?"))
        finally:
            await server.aclose()

    out = asyncio.run(run())
    (logged,) = log.decisions()
    estimate = logged.decision.estimate
    assert estimate.method == "verbalized"
    assert not estimate.degraded, estimate.reason  # structured output: the rating parses
    assert estimate.p is not None
    assert 0.0 <= estimate.p <= 1.0
    assert (logged.decision.action, logged.decision.target) == ("resample", server.name)
    cas = gate.stats.last_cas
    assert cas is not None
    assert 2 <= cas.samples_used <= 4
    assert server.requests == cas.samples_used  # the estimate's own calls go through the backend
    assert isinstance(out["messages"][-1], AIMessage)


def test_the_langgraph_nodes_gate_a_chat_openai_node(server: Server, tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    chat = server.chat(temperature=1.0)

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [chat.invoke(state["messages"])]}

    # A graph around a plain node cannot see the model: the target is named (read off the model).
    graph = capability_subgraph(
        answer,
        policy=POLICY,
        estimator=KeywordEstimator(MARKERS),
        target=model_target(chat),
        log=log,
        extract=first_word,
    )
    app = graph.compile()
    out = app.invoke(_ask("What is 2 + 2?"))
    assert (out["capgate_decision"]["action"], server.requests) == ("answer", 1)
    out = app.invoke(_ask("ABSTAIN: next week's lottery numbers?"))
    assert (out["messages"][-1].content, server.requests) == ("Not answering that (p=0.10).", 1)
    out = app.invoke(_ask("RESAMPLE: name a primary colour."))
    samples = out["capgate_cas"]["samples_used"]
    assert 2 <= samples <= 4
    assert server.requests == 1 + samples
    assert [(d.decision.action, d.decision.target) for d in log.decisions()] == [
        ("answer", server.name),
        ("abstain", server.name),
        ("resample", server.name),
    ]


def test_a_tool_node_gates_the_chat_models_proposal_before_it_runs(server: Server) -> None:
    lookup, looked_up = _lookup()
    chat = server.chat().bind_tools([lookup], tool_choice="lookup")

    def app(estimator: KeywordEstimator) -> Any:
        gate = ToolCallGate(policy=POLICY, estimator=estimator, target=server.name)
        return gated_tool_graph(chat, lookup, gate, MessagesState).compile()

    out = app(KeywordEstimator(MARKERS)).invoke(_ask("RISKY: look up Rome in the encyclopedia."))
    assert looked_up == []  # p = 0.5 < the lookup's 0.6: refused before it ran
    assert "Not running lookup (p=0.50)." in out["messages"][-1].content
    out = app(KeywordEstimator(MARKERS)).invoke(_ask("Look up Rome in the encyclopedia."))
    assert len(looked_up) == 1
    assert out["messages"][-1].content == f"Encyclopedia entry for {looked_up[0]}."
    assert server.requests == 2  # one proposal each; the gate sent nothing
