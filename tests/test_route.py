"""The ``route`` policy action: validation with located errors, the routing rule, and routing in
``capgate.guard`` and the LangGraph subgraph (real functions and graphs; the estimators are the
small deterministic ones that pick the branch)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator
from langchain_core.messages import AIMessage, HumanMessage

import capgate
from capgate import Decision, Estimate, Gate, RoutePlan, SettingsError
from capgate.adapters.agents.langgraph import capability_subgraph, read_decision
from capgate.decision.analysis.simulate import replay_policy
from capgate.policies import Policy, PolicyError, RouteAction, choose_route, load_policy

ROUTED = load_policy(Path(__file__).parent / "data" / "policies" / "router.yaml")


def _routes() -> dict[str, KeywordEstimator]:
    return {
        "small": KeywordEstimator({"HARD": 0.4}, default=0.85),
        "large": KeywordEstimator({"HARD": 0.7}, default=0.95),
    }


def test_a_route_band_carries_its_plan_with_the_answer_edge() -> None:
    decision = ROUTED.decide(Estimate(p=0.5, method="x"))
    assert decision.action == "route"
    assert decision.route_plan == RoutePlan(choices=("small", "large"), edge=0.8)
    assert decision.route is None  # chosen by the gate, which has the choices' estimators
    explicit = RouteAction(choices=["a", "b"], edge=0.6).plan(0.8)
    assert explicit.edge == 0.6


def test_the_rule_picks_the_cheapest_choice_that_clears_else_the_strongest() -> None:
    plan = RoutePlan(choices=("a", "b", "c"), edge=0.7)
    est = {n: Estimate(p=p, method="x") for n, p in (("a", 0.5), ("b", 0.7), ("c", 0.9))}
    assert choose_route(plan, est)[0] == "b"
    degraded = {
        "a": Estimate.unavailable("x", "down"),
        "b": Estimate(p=0.9, method="x", degraded=True, reason="r"),
    }
    name, filled, reason = choose_route(plan, degraded)
    assert name == "c"  # fail closed: neither a missing nor a degraded estimate clears the edge
    assert filled.p == {"a": None, "b": 0.9}
    assert "strongest" in reason


def test_route_errors_are_located_in_the_policy_file() -> None:
    text = """\
name: bad
bands:
  - below: 0.5
    action: route
    choices: [small, small]
  - action: route
    choices: []
on_degraded: abstain
tools:
  send:
    bands:
      - action: route
        choices: [small]
"""
    with pytest.raises(PolicyError) as caught:
        Policy.from_yaml_text(text, source="p.yaml")
    message = str(caught.value)
    assert (
        "p.yaml:5: field 'bands[0].choices': each model choice may be named once; 'small' is repeated"
        in message
    )
    assert "p.yaml:7: field 'bands[1].choices'" in message
    with pytest.raises(PolicyError, match=r"p.yaml:3: field 'bands\[0\].edge': a route action needs `edge`"):
        Policy.from_yaml_text(
            "name: r\nbands:\n  - action: route\n    choices: [a]\non_degraded: abstain\n", source="p.yaml"
        )
    fixed = Policy.from_yaml_text(
        "name: r\nbands:\n  - action: route\n    choices: [a]\n    edge: 0.6\non_degraded: abstain\n"
    )
    assert Policy.from_yaml_text(fixed.to_yaml()) == fixed


def test_a_decision_checks_its_route() -> None:
    est = Estimate(p=0.5, method="x")
    with pytest.raises(ValueError, match="route_plan"):
        Decision(action="route", estimate=est, reason="r")
    with pytest.raises(ValueError, match="not one of the choices"):
        Decision(
            action="route",
            estimate=est,
            reason="r",
            route="z",
            route_plan=RoutePlan(choices=("a",), edge=0.5),
        )
    with pytest.raises(ValueError, match="only a route decision"):
        Decision(action="answer", estimate=est, reason="r", route="a")


def test_guard_calls_the_function_with_the_chosen_route() -> None:
    routes = _routes()

    @capgate.guard(policy=ROUTED, estimator=KeywordEstimator({"HARD": 0.5, "MID": 0.5}), routes=routes)
    def ask(prompt: str, route: str = "default") -> str:
        return f"{route} answered {prompt}"

    assert ask("plain") == "default answered plain"  # p = 0.9: answer, no routing
    assert ask("MID question") == "small answered MID question"  # small predicts 0.85 >= 0.8
    assert ask("HARD question") == "large answered HARD question"  # none clears: the strongest
    decision = ask.stats.last_decision
    assert decision is not None
    assert decision.route == "large"
    assert decision.route_plan is not None
    assert decision.route_plan.p == {"small": 0.4, "large": 0.7}
    assert "none is predicted to reach 0.8" in decision.reason
    assert routes["small"].calls == 2
    assert routes["large"].calls == 1


def test_a_degraded_estimate_routes_by_the_fail_safe() -> None:
    @capgate.guard(policy=ROUTED, estimator=KeywordEstimator({"NOEST": None}), routes=_routes())
    async def ask(prompt: str, route: str = "default") -> str:
        return route

    assert asyncio.run(ask("NOEST q")) == "large"


def test_routing_needs_the_choices_estimators_and_a_route_parameter() -> None:
    @capgate.guard(
        policy=ROUTED, estimator=KeywordEstimator({"MID": 0.5}), routes={"small": KeywordEstimator({})}
    )
    def ask(prompt: str, route: str = "default") -> str:
        return route

    with pytest.raises(SettingsError, match="no estimator for 'large'"):
        ask("MID")

    @capgate.guard(policy=ROUTED, estimator=KeywordEstimator({"MID": 0.5}), routes=_routes())
    def no_route(prompt: str) -> str:
        return prompt

    with pytest.raises(TypeError, match="no `route` parameter"):
        no_route("MID")
    with pytest.raises(SettingsError, match="routes"):
        Gate(routes={"small": "not an estimator"})  # type: ignore[dict-item]


def test_the_langgraph_subgraph_answers_with_the_chosen_model() -> None:
    def answer(state: Any) -> dict[str, Any]:
        decision = read_decision(state.get("capgate_decision"))
        model = decision.route if decision is not None and decision.route else "default"
        return {"messages": [AIMessage(f"{model} says hi")]}

    graph = capability_subgraph(
        answer, policy=ROUTED, estimator=KeywordEstimator({"HARD": 0.5, "MID": 0.5}), routes=_routes()
    )
    app = graph.compile()
    assert app.invoke({"messages": [HumanMessage("MID")]})["messages"][-1].content == "small says hi"
    assert app.invoke({"messages": [HumanMessage("HARD")]})["messages"][-1].content == "large says hi"
    assert app.invoke({"messages": [HumanMessage("plain")]})["messages"][-1].content == "default says hi"


def test_simulate_counts_routed_queries_apart() -> None:
    summary = replay_policy(ROUTED, [0.1, 0.5, 0.9], [0.0, 1.0, 1.0])
    assert summary.rates["route"] == pytest.approx(1 / 3)
    assert summary.coverage == pytest.approx(1 / 3)  # a routed query is another model's answer


def test_the_langchain_middleware_calls_the_chosen_model() -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from capgate.adapters.agents.langchain import CapabilityGate

    def agent(**extra: Any) -> Any:
        gate = CapabilityGate(
            policy=ROUTED, estimator=KeywordEstimator({"HARD": 0.5, "MID": 0.5}), routes=_routes(), **extra
        )
        return create_agent(FakeListChatModel(responses=["the default model"]), middleware=[gate])

    models = {
        "small": FakeListChatModel(responses=["the small model"]),
        "large": FakeListChatModel(responses=["the large model"]),
    }
    routed = agent(models=models)
    replies = {
        q: routed.invoke({"messages": [HumanMessage(q)]})["messages"][-1].content
        for q in ("plain", "MID", "HARD")
    }
    assert replies == {"plain": "the default model", "MID": "the small model", "HARD": "the large model"}
    with pytest.raises(SettingsError, match="no chat model for it"):
        agent().invoke({"messages": [HumanMessage("MID")]})
