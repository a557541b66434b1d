"""capgate in LangChain's own hooks, with the installed LangChain 1.5: ``HumanInTheLoopMiddleware``'s
``when`` predicate, ``langchain_core.decisions.BaseDecisionModel``, ``ModelRouterMiddleware``.

The approval tests drive a real ``create_agent`` with the embedded model behind
:class:`CapgateChatModel` (its tool-call path fills the arguments by generation); the routing test
routes between the embedded model run in-process (transformers) and the same model served by the
CI vLLM server, each choice with the real shipped probe as its estimator."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _agent_scaffolding import ForceFirstTool
from _ci_server import ci_vllm_server
from _estimators import KeywordEstimator
from _fakes import AsyncCountingBackend as Counting
from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    InterruptOnConfig,
    ModelChoice,
)
from langchain_core.decisions import BaseDecisionModel, Box, Choice, Noul, Score
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from capgate import Estimate, SamplingParams, SettingsError
from capgate.adapters.agents.langchain import (
    CapabilityApproval,
    CapabilityUnavailableError,
    CapgateChatModel,
    CapgateDecisionModel,
    choose_model_by_capability,
)
from capgate.decision import DecisionLog
from capgate.policies import Policy

POLICY = Policy.model_validate(
    {
        "name": "hooks",
        "bands": [
            {"below": 0.4, "action": "abstain"},
            {"below": 0.7, "action": "clarify"},
            {"action": "answer"},
        ],
        "on_degraded": "abstain",
        "tools": {"lookup": 0.8},  # the lookup tool's edge: 0.8
    }
)
TABLE = {"HARD": 0.75, "EASY": 0.95, "NOEST": None}


def test_the_installed_langchain_has_the_hooks_capgate_uses() -> None:
    assert "when" in InterruptOnConfig.__annotations__
    assert issubclass(CapgateDecisionModel, BaseDecisionModel)


# --------------------------------------------------------------------------- the decision model


def test_a_noul_is_the_capability_estimate() -> None:
    model = CapgateDecisionModel(policy=POLICY, estimator=KeywordEstimator(TABLE))
    question = Noul(instructions="Will the model answer this correctly?")
    out = model.invoke({"state": "HARD: integrate x^x", "questions": {"ok": question}})
    assert out.nouls["ok"].noul == pytest.approx(0.75)
    assert out.request_id == model.gate.stats.last_decision.id  # type: ignore[union-attr]
    out = model.invoke({"state": [HumanMessage("EASY: 2 + 2")], "questions": {"ok": question}})
    assert out.nouls["ok"].noul == pytest.approx(0.95)


def test_a_score_puts_the_estimate_on_the_rubric() -> None:
    model = CapgateDecisionModel(policy=POLICY, estimator=KeywordEstimator(TABLE))
    rubric = Score(instructions="How capable?", criteria=["fails", "unsure", "succeeds"])
    out = model.invoke({"state": {"messages": [HumanMessage("HARD")]}, "questions": {"s": rubric}})
    answer = out.scores["s"]
    p = 0.75
    assert answer.score == pytest.approx(2 * p)
    assert answer.probabilities == pytest.approx({0: (1 - p) ** 2, 1: 2 * p * (1 - p), 2: p**2})
    assert answer.legend == {0: "fails", 1: "unsure", 2: "succeeds"}
    assert answer.confidence == pytest.approx(max(answer.probabilities.values()))


def test_no_estimate_is_an_error_never_a_guess() -> None:
    model = CapgateDecisionModel(policy=POLICY, estimator=KeywordEstimator(TABLE))
    with pytest.raises(CapabilityUnavailableError, match="NOEST"):
        model.invoke({"state": "NOEST question", "questions": {"ok": Noul(instructions="ok?")}})
    with pytest.raises(ValueError, match="Noul, Score and Choice"):
        model.invoke({"state": "q", "questions": {"where": Box(instructions="find the cat")}})


def test_a_choice_routes_to_the_cheapest_capable_model_else_the_strongest() -> None:
    routes = {
        "small": KeywordEstimator({"HARD": 0.3, "MID": 0.5}, default=0.9),
        "large": KeywordEstimator({"HARD": 0.6}, default=0.95),
    }
    model = CapgateDecisionModel(policy=POLICY, routes=routes, edge=0.5)
    choice = Choice(instructions="Which model?", criteria={"small": "cheap", "large": "strong"})
    picks = {}
    for text in ("easy one", "MID one", "HARD one"):
        answer = model.invoke({"state": text, "questions": {"m": choice}}).choices["m"]
        picks[text] = (answer.choice, answer.confidence)
        assert sum(answer.probabilities.values()) == 1.0
    assert picks == {"easy one": ("small", 0.9), "MID one": ("small", 0.5), "HARD one": ("large", 0.6)}
    assert routes["large"].calls == 1  # the strong model is estimated only when the small one fails


def test_the_async_decision_model_answers_alike() -> None:
    model = CapgateDecisionModel(policy=POLICY, estimator=KeywordEstimator(TABLE))
    out = asyncio.run(model.ainvoke({"state": "HARD", "questions": {"ok": Noul(instructions="ok?")}}))
    assert out.nouls["ok"].noul == pytest.approx(0.75)


def test_a_shadow_gate_decision_model_decides_in_earnest(tmp_path: Path) -> None:
    """Its answer is the estimate: a shadow gate's stand-in has none, so it decides in enforce mode."""
    log = DecisionLog(tmp_path / "log.sqlite3")
    model = CapgateDecisionModel(policy=POLICY, estimator=KeywordEstimator(TABLE), mode="shadow", log=log)
    out = model.invoke({"state": "HARD: integrate x^x", "questions": {"ok": Noul(instructions="ok?")}})
    assert out.nouls["ok"].noul == pytest.approx(0.75)
    (logged,) = log.decisions()
    assert (logged.decision.id, logged.decision.shadow) == (out.request_id, False)


def test_settings_are_checked_at_once() -> None:
    with pytest.raises(SettingsError, match="edge"):
        CapgateDecisionModel(policy=POLICY, edge=1.5)
    with pytest.raises(SettingsError, match="routes"):
        choose_model_by_capability(
            {"a": "unused", "b": "unused"}, policy=POLICY, routes={"a": KeywordEstimator({})}
        )
    no_answer = Policy(name="never", bands=[{"action": "abstain"}], on_degraded="abstain")
    model = CapgateDecisionModel(
        policy=no_answer, estimator=KeywordEstimator(TABLE), routes={"a": KeywordEstimator({})}
    )
    with pytest.raises(SettingsError, match="answer edge"):
        model.invoke({"state": "q", "questions": {"m": Choice(instructions="?", criteria={"a": None})}})


# --------------------------------------------------------------------------- approval (real agent)


def _approval_agent(backend: Any, when: CapabilityApproval) -> tuple[Any, list[str]]:
    looked_up: list[str] = []

    @tool
    def lookup(term: str) -> str:
        """Look a term up in the encyclopedia."""
        looked_up.append(term)
        return f"encyclopedia entry for {term}"

    config = InterruptOnConfig(allowed_decisions=["approve", "reject"], when=when)
    model = CapgateChatModel(backend=backend, params=SamplingParams(max_tokens=12, temperature=0.0))
    agent = create_agent(
        model,
        tools=[lookup],
        middleware=[ForceFirstTool(), HumanInTheLoopMiddleware(interrupt_on={"lookup": config})],
        checkpointer=InMemorySaver(),
    )
    return agent, looked_up


@pytest.mark.slow
def test_a_tool_call_asks_for_approval_only_below_the_edge(real_backend: Any) -> None:
    when = CapabilityApproval(policy=POLICY, estimator=KeywordEstimator(TABLE))
    agent, looked_up = _approval_agent(Counting(real_backend), when)

    out = agent.invoke(
        {"messages": [HumanMessage("EASY: look up Paris")]}, {"configurable": {"thread_id": "e"}}
    )
    assert "__interrupt__" not in out  # p = 0.95 >= the lookup edge 0.8: no human asked
    assert len(looked_up) == 1
    assert when.last_verdict is not None
    assert when.last_verdict.decision.tool == "lookup"

    config = {"configurable": {"thread_id": "h"}}
    # p = 0.75: an answer for the model step (balanced edge 0.7), but below the tool's edge 0.8
    out = agent.invoke({"messages": [HumanMessage("HARD: look up Hamlet")]}, config)
    (request,) = out["__interrupt__"][0].value["action_requests"]
    assert request["name"] == "lookup"
    assert len(looked_up) == 1
    out = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert len(looked_up) == 2  # approved: the same call ran (the predicate did not flip on resume)
    assert isinstance(out["messages"][-1], AIMessage)


@pytest.mark.slow
def test_no_estimate_asks_for_approval(real_backend: Any) -> None:
    class Raising(KeywordEstimator):
        def estimate(self, queries: Any) -> list[Estimate]:
            raise ConnectionError("probe server down")

    for estimator, thread in ((KeywordEstimator(TABLE), "n"), (Raising(TABLE), "r")):
        agent, looked_up = _approval_agent(
            Counting(real_backend), CapabilityApproval(policy=POLICY, estimator=estimator)
        )
        config = {"configurable": {"thread_id": thread}}
        out = agent.invoke({"messages": [HumanMessage("NOEST: look up Rome")]}, config)
        assert out["__interrupt__"][0].value["action_requests"][0]["name"] == "lookup"
        out = agent.invoke(Command(resume={"decisions": [{"type": "reject", "message": "no"}]}), config)
        assert looked_up == []


# --------------------------------------------------------------------------- routing (real, two servings)


@pytest.fixture(scope="module")
def server_backend() -> Any:
    from capgate.adapters.backends.openai import OpenAIBackend

    url, model = ci_vllm_server()
    return OpenAIBackend(model, base_url=url, timeout=180.0, max_retries=2)


@pytest.mark.slow
def test_the_router_sends_each_run_to_the_cheapest_capable_serving(
    real_backend: Any, server_backend: Any
) -> None:
    import capgate

    probe = capgate.load_estimator("default")
    easy, hard = "Calculate 12 + 30 =", "Who was the 19th president of Bolivia?"
    p_easy, p_hard = (e.p for e in probe.estimate([easy, hard]))
    assert p_easy is not None
    assert p_hard is not None
    assert p_easy > p_hard  # the shipped probe tells them apart; the edge goes between them
    edge = (p_easy + p_hard) / 2
    local, server = Counting(real_backend), Counting(server_backend)
    params = SamplingParams(max_tokens=12, temperature=0.0)
    router = choose_model_by_capability(
        {
            "local": ModelChoice(model=CapgateChatModel(backend=local, params=params), criteria="in-process"),
            "server": ModelChoice(model=CapgateChatModel(backend=server, params=params), criteria="vLLM"),
        },
        policy=POLICY,
        routes={"local": probe, "server": probe},  # the same weights, served two ways
        edge=edge,
    )
    agent = create_agent(CapgateChatModel(backend=local, params=params), middleware=[router])

    out = agent.invoke({"messages": [HumanMessage(easy)]})
    assert out["model_route"].choice == "local"
    assert out["model_route"].confidence == pytest.approx(p_easy, abs=1e-6)
    assert (local.calls, server.calls) == (1, 0)

    out = agent.invoke({"messages": [HumanMessage(hard)]})
    assert out["model_route"].choice == "server"  # below the edge on both: the strongest
    assert (local.calls, server.calls) == (1, 1)
    assert isinstance(out["messages"][-1], AIMessage)
    assert out["messages"][-1].content


def _request(text: str, call_id: str = "c1") -> Any:
    from langgraph.prebuilt.tool_node import ToolCallRequest

    call = {"name": "lookup", "args": {"term": text}, "id": call_id, "type": "tool_call"}
    messages = [HumanMessage(text), AIMessage("", tool_calls=[call])]
    return ToolCallRequest(tool_call=call, tool=None, state={"messages": messages}, runtime=None)


def test_in_shadow_mode_the_predicate_never_asks_and_logs_the_decision(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    when = CapabilityApproval(policy=POLICY, estimator=KeywordEstimator(TABLE), mode="shadow", log=log)
    assert when(_request("EASY", "a")) is False  # the stand-in decision has no estimate: not a reason
    assert when(_request("HARD", "b")) is False  # 0.75 < 0.8, but in shadow mode the call proceeds
    assert when.gate.flush(10.0)
    logged = sorted((d.decision.estimate.p, d.decision.shadow) for d in log.decisions())
    assert logged == [(0.75, True), (0.95, True)]


def test_the_predicate_compares_the_tools_edge_and_fails_closed() -> None:
    when = CapabilityApproval(policy=POLICY, estimator=KeywordEstimator(TABLE))
    assert when(_request("EASY", "a")) is False  # 0.95 >= 0.8 (the lookup override's edge)
    assert when(_request("HARD", "b")) is True  # 0.75 < 0.8
    assert when(_request("NOEST", "c")) is True  # no estimate: a human decides
    assert (
        CapabilityApproval(policy=POLICY, estimator=KeywordEstimator(TABLE), edge=0.7)(_request("HARD"))
        is False
    )
    import capgate

    previous = capgate.default_estimator()
    capgate.set_default_estimator(None)
    try:
        with pytest.raises(SettingsError, match="no capability estimator"):
            CapabilityApproval(policy=POLICY)(_request("EASY"))  # misconfigured: raised, not asked
    finally:
        capgate.set_default_estimator(previous)


def test_no_decision_leaves_no_verdict_of_another_call(tmp_path: Path) -> None:
    from capgate import LogUnavailableError

    class DownAfterOne(DecisionLog):
        writes = 0

        def record(self, *args: Any, **kwargs: Any) -> Any:
            DownAfterOne.writes += 1
            if DownAfterOne.writes > 1:
                raise LogUnavailableError("down", location=self.location)
            return super().record(*args, **kwargs)

    log = DownAfterOne(tmp_path / "log.sqlite3", fail_closed=True)
    when = CapabilityApproval(policy=POLICY, estimator=KeywordEstimator(TABLE), log=log)
    assert when(_request("EASY", "a")) is False
    assert when.last_verdict is not None
    assert when.last_verdict.estimate.p == 0.95
    assert when(_request("HARD", "b")) is True  # the log is down (fail closed): a human decides
    assert when.last_verdict is None  # not call a's verdict
