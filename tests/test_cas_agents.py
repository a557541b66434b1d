"""Resampling inside agents with per-response confidences, so that CAS's confidence-gap rules fire.

LangGraph's subgraph and LangChain's middleware resample through ``Gate.sample``; each drawn
response carries a confidence (a ``[confidence=X%]`` tag in its text, or the ``mean_logprob`` that
:class:`CapgateChatModel` puts in ``response_metadata``). These tests assert *which* stop rule
ended sampling, on the result, in the graph state and in the decision log, for capgate's rule and
the paper's. The scripted backend is deterministic so that the rule that fires is known; one test
runs the real embedded model to check that its log-probabilities reach the vote.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from capgate import Generation, SamplingParams
from capgate.adapters.agents.langchain import CapabilityGate, CapgateChatModel
from capgate.adapters.agents.langgraph import capability_subgraph
from capgate.adapters.backends.function import FunctionBackend, response_mean_logprob
from capgate.decision import DecisionLog
from capgate.policies import Policy

MARKERS = {"RESAMPLE": 0.7}
CAPGATE_RULE = {"confidence_gap": {"rule": "capgate"}}  # deterministic, so the rule that fires is known


def policy(stop: dict[str, Any] | None = None) -> Policy:
    band: dict[str, Any] = {"below": 0.8, "action": "resample", "max_samples": 8, "batch_size": 2}
    if stop is not None:
        band["stop"] = stop
    return Policy.model_validate(
        {"name": "cas-agents", "bands": [band, {"action": "answer"}], "on_degraded": "abstain"}
    )


class Scripted:
    """A backend that replies with the given texts in turn (and counts its calls)."""

    model_id = "scripted"

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = itertools.cycle(texts)
        self.calls = 0

    def generate(self, prompts: Sequence[Any], params: SamplingParams) -> list[list[Generation]]:
        self.calls += 1
        return [[Generation(text=next(self.texts), n_tokens=4) for _ in range(params.n)] for _ in prompts]


def first_word(text: str) -> str | None:
    return (text.split() or [""])[0].strip(".,!").lower() or None


def _graph(backend: Any, *, stop: dict[str, Any] | None = None, log: Path | None = None) -> Any:
    model = CapgateChatModel(backend=backend, params=SamplingParams(max_tokens=16, temperature=0.8))

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = capability_subgraph(
        answer, policy=policy(stop), estimator=KeywordEstimator(MARKERS), extract=first_word, log=log
    )
    return graph.compile(checkpointer=InMemorySaver())


def _ask(app: Any, text: str, thread: str) -> dict[str, Any]:
    return dict(app.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread}}))


def test_langgraph_resample_stops_on_the_confidence_gap_and_logs_it(tmp_path: Path) -> None:
    db = tmp_path / "log.sqlite"
    app = _graph(Scripted(["Blue. [confidence=95%]"]), log=db, stop=CAPGATE_RULE)
    out = _ask(app, "RESAMPLE: name a colour.", "g1")
    cas = out["capgate_cas"]
    # unanimous at 0.95: c1 - c2 = 0.95 >= margin 0.5 after the first batch of two
    assert (cas["answer"], cas["samples_used"]) == ("blue", 2)
    assert cas["stopped_by"].startswith("cas_confidence_gap(")
    with DecisionLog(db) as log:
        (record,) = log.decisions()
    assert record.samples_used == 2
    assert record.decision.stopped_by == cas["stopped_by"]
    assert record.decision.id == cas["decision_id"]


def test_langgraph_unsure_answers_fall_to_the_vote_rule() -> None:
    # the same answer at 0.3: the gap 0.3 < 0.5 never fires; Beta consensus needs 4 agreeing votes
    app = _graph(Scripted(["Blue [confidence=30%]"]), stop=CAPGATE_RULE)
    cas = _ask(app, "RESAMPLE: name a colour.", "g2")["capgate_cas"]
    assert cas["samples_used"] == 4
    assert cas["stopped_by"] == "beta_consensus(threshold=0.95)"


def test_langgraph_paper_rule_fires_and_is_named() -> None:
    # epsilon -5: P_stop = σ(0.9 + 5) > 0.997 after the first batch (seeded by the decision id)
    app = _graph(
        Scripted(["Red [confidence=90%]"]), stop={"confidence_gap": {"rule": "paper", "epsilon": -5}}
    )
    cas = _ask(app, "RESAMPLE: name a colour.", "g3")["capgate_cas"]
    assert cas["stopped_by"] == "cas_frequency_gap(epsilon=-5)"
    assert cas["samples_used"] == 2


def test_langchain_resample_weighs_votes_by_confidence_and_records_the_rule(tmp_path: Path) -> None:
    # two rivals: "red" once at 0.9 against "green" twice at 0.2 per batch pattern; weighted vote
    # prefers red (0.9 + 0.9 > 0.2 + 0.2) although both are drawn equally often.
    backend = Scripted(["Red [confidence=90%]", "Green [confidence=20%]"])
    middleware = CapabilityGate(
        policy=policy(CAPGATE_RULE),
        estimator=KeywordEstimator(MARKERS),
        extract=first_word,
        log=tmp_path / "lc.sqlite",
    )
    model = CapgateChatModel(backend=backend, params=SamplingParams(max_tokens=16))
    agent = create_agent(model, tools=[], middleware=[middleware], checkpointer=InMemorySaver())
    out = agent.invoke(
        {"messages": [HumanMessage("RESAMPLE: a colour")]}, {"configurable": {"thread_id": "l1"}}
    )
    cas = middleware.gate.stats.last_cas
    assert cas is not None
    assert cas.answer == "red"
    assert cas.weighted_votes["red"] > cas.weighted_votes["green"]
    # gap after each batch: 0.9 - 0.2 = 0.7 >= 0.5, so capgate's rule stops after the first batch
    assert cas.samples_used == 2
    assert cas.stopped_by.startswith("cas_confidence_gap(")
    assert out["messages"][-1].content.startswith("Red")
    with DecisionLog(tmp_path / "lc.sqlite") as log:
        (record,) = log.decisions()
    assert record.decision.stopped_by == cas.stopped_by
    assert record.samples_used == 2


@pytest.mark.slow
def test_real_model_log_probabilities_reach_the_vote(default_model_dir: Path) -> None:
    from capgate.adapters.backends.transformers import load_backend

    model = CapgateChatModel(
        backend=load_backend("default"), params=SamplingParams(max_tokens=8, temperature=0.8)
    )
    message = model.invoke("Name a primary colour.")
    mean_logprob = response_mean_logprob(message)
    assert mean_logprob is not None
    assert mean_logprob <= 0
    app = _graph(model.backend)
    cas = _ask(app, "RESAMPLE: name a primary colour.", "real")["capgate_cas"]
    assert 2 <= cas["samples_used"] <= 8
    assert cas["stopped_by"]


def test_function_backend_reads_mean_logprob_from_messages_and_updates() -> None:
    message = AIMessage("4", response_metadata={"mean_logprob": -0.25})
    assert response_mean_logprob(message) == -0.25
    assert response_mean_logprob({"messages": [HumanMessage("q"), message]}) == -0.25
    for bad in ({"mean_logprob": 0.5}, {"mean_logprob": float("nan")}, {"mean_logprob": True}, {}):
        assert response_mean_logprob(AIMessage("4", response_metadata=bad)) is None
    backend = FunctionBackend(lambda _: message)
    (gen,) = backend.generate(["q"], SamplingParams(n=1))[0]
    assert gen.mean_logprob == -0.25
