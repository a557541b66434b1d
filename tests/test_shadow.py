"""Shadow mode: the gate decides and logs beside the call, which proceeds as if answered.

The estimators here block on events the test controls, so "the call did not wait for the estimate"
is shown by the call returning while its estimate is still held, not by a timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _estimators import KeywordEstimator

import capgate
from capgate import Estimate, Gate, SettingsError
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.estimators import CapabilityEstimator
from capgate.policies import load_policy

WAIT_S = 30.0  # a bound on every wait, so a regression fails instead of hanging


class Held(CapabilityEstimator):
    """Estimates p (or fails, or returns garbage) only once the test releases it."""

    method = "held"

    def __init__(self, p: float = 0.05, *, fail: str | None = None, hold: bool = True) -> None:
        self.p = p
        self.fail = fail
        self.hold = hold
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self.started.set()
        assert self.release.wait(WAIT_S)
        if self.fail == "raise":
            raise RuntimeError("estimator exploded")
        if self.fail == "garbage":
            return ["not an estimate"]  # type: ignore[list-item]
        return [Estimate(p=self.p, method=self.method) for _ in queries]


def _only(log: DecisionLog) -> Any:
    (logged,) = log.decisions()
    return logged


def test_assess_in_shadow_is_a_stand_in_answer_and_the_log_gets_what_it_would_have_done(
    tmp_path: Path,
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(policy="balanced", estimator=Held(0.05, hold=False), mode="shadow", log=log)
    verdict = gate.assess("What will the lottery draw next week?")
    assert verdict.action == "answer"
    assert verdict.decision.shadow
    assert verdict.pending is not None
    gate.record(verdict, samples_used=1)
    assert gate.flush(WAIT_S)
    logged = _only(log)
    assert logged.decision.id == verdict.decision.id  # the id the integration holds
    assert logged.decision.shadow is True
    assert logged.decision.action == "abstain"  # what it would have done
    assert logged.samples_used == 1
    assert gate.stats.actions == {"answer": 1}
    assert gate.stats.shadow_actions == {"abstain": 1}


def test_a_policy_file_puts_the_gate_in_shadow_and_the_gate_setting_overrides_it(tmp_path: Path) -> None:
    text = load_policy("balanced").to_yaml() + "mode: shadow\n"
    path = tmp_path / "shadowed.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_policy(path).mode == "shadow"
    estimator = KeywordEstimator({"hard": 0.05})
    assert Gate(policy=path, estimator=estimator).assess("hard").decision.shadow
    enforced = Gate(policy=path, estimator=estimator, mode="enforce").assess("hard")
    assert (enforced.action, enforced.decision.shadow) == ("abstain", False)
    assert Gate(policy="balanced", estimator=estimator, mode="shadow").in_shadow()
    with pytest.raises(SettingsError, match="`mode` must be one of"):
        Gate(mode="loud")  # type: ignore[arg-type]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("mode: shadow", "mode: loud"), encoding="utf-8")
    with pytest.raises(capgate.policies.PolicyError, match="mode"):
        load_policy(bad)


def test_a_guarded_call_in_shadow_never_waits_for_its_estimate(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    held = Held(0.05)

    @capgate.guard(policy="balanced", estimator=held, mode="shadow", log=log)
    def ask(prompt: str) -> str:
        return "42"

    assert ask("What will the lottery draw next week?") == "42"  # returned while the estimate is held
    assert held.started.wait(WAIT_S)
    assert log.count() == 0  # not decided yet: nothing is logged before the decision exists
    held.release.set()
    assert ask.gate.flush(WAIT_S)
    assert _only(log).decision.action == "abstain"
    assert ask.stats.shadow_actions == {"abstain": 1}


@pytest.mark.parametrize("fail", ["raise", "garbage", "late"])
def test_a_failing_or_hanging_estimator_never_fails_the_call(tmp_path: Path, fail: str) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    held = Held(0.05, fail=None if fail == "late" else fail, hold=fail == "late")
    timeout = {"estimate_timeout_s": 0.2} if fail == "late" else {}

    @capgate.guard(policy="balanced", estimator=held, mode="shadow", log=log, **timeout)
    def ask(prompt: str) -> str:
        return "42"

    assert ask("anything") == "42"
    assert ask.gate.flush(WAIT_S)
    held.release.set()
    logged = _only(log).decision
    assert logged.shadow
    assert logged.degraded
    assert logged.action == "abstain"  # the balanced policy's on_degraded
    expected = {
        "raise": "RuntimeError: estimator exploded",
        "garbage": "not one Estimate per query",
        "late": "0.2s",
    }
    assert expected[fail] in logged.estimate.reason


def test_an_async_guarded_call_in_shadow_never_waits_and_survives_a_raise(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")

    class AsyncHeld(CapabilityEstimator):
        method = "async-held"

        def __init__(self) -> None:
            self.gate: asyncio.Event | None = None

        def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            raise AssertionError("the async path must use aestimate")

        async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            assert self.gate is not None
            await asyncio.wait_for(self.gate.wait(), WAIT_S)
            if "boom" in str(queries[0]):
                raise ValueError("async estimator exploded")
            return [Estimate(p=0.05, method=self.method)]

    estimator = AsyncHeld()

    @capgate.guard(policy="balanced", estimator=estimator, mode="shadow", log=log)
    async def ask(prompt: str) -> str:
        return "42"

    async def main() -> None:
        estimator.gate = asyncio.Event()
        assert await ask("hard?") == "42"  # returned while the estimate waits
        assert await ask("boom") == "42"
        assert log.count() == 0
        estimator.gate.set()
        await ask.gate.aflush()

    asyncio.run(main())
    by_reason = sorted(d.decision.estimate.reason or "" for d in log.decisions())
    assert len(by_reason) == 2
    assert any("ValueError: async estimator exploded" in r for r in by_reason)
    assert ask.stats.actions == {"answer": 2}
    assert ask.stats.shadow_actions == {"abstain": 2}


def test_tool_calls_in_shadow_are_decided_one_by_one_beside_the_call() -> None:
    from capgate.gate.flow import AssessEach, perform

    estimator = KeywordEstimator({"hard": 0.05})
    shadow = Gate(policy="balanced", estimator=estimator, mode="shadow")
    enforce = Gate(policy="balanced", estimator=estimator)
    verdicts = perform(AssessEach([(shadow, "hard one"), (enforce, "hard two"), (enforce, "easy")]))
    assert [v.action for v in verdicts] == ["answer", "abstain", "answer"]
    assert [v.decision.shadow for v in verdicts] == [True, False, False]
    assert shadow.flush(WAIT_S)
    assert shadow.stats.shadow_actions == {"abstain": 1}


@pytest.mark.slow
def test_a_langgraph_subgraph_in_shadow_answers_and_logs_the_would_be_abstain(
    default_model_dir: Path, tmp_path: Path
) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from capgate import SamplingParams
    from capgate.adapters.agents.langchain import CapgateChatModel
    from capgate.adapters.agents.langgraph import capability_subgraph, read_decision
    from capgate.adapters.backends.transformers import load_backend

    model = CapgateChatModel(backend=load_backend("default"), params=SamplingParams(max_tokens=8))
    calls: list[int] = []

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        return {"messages": [model.invoke(state["messages"])]}

    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(policy="balanced", estimator=KeywordEstimator({"lottery": 0.05}), mode="shadow", log=log)
    app = capability_subgraph(answer, gate=gate).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "shadow"}}
    out = app.invoke({"messages": [HumanMessage("Next week's lottery numbers?")]}, config)
    assert calls == [1]  # the model answered: shadow mode never blocks
    held = read_decision(out["capgate_decision"])
    assert held is not None
    assert (held.shadow, held.action) == (True, "answer")
    assert gate.flush(WAIT_S)
    logged = log.get(held.id).decision  # the state's decision id finds the logged one
    assert (logged.action, logged.shadow) == ("abstain", True)


@pytest.mark.slow
def test_the_langchain_middleware_in_shadow_lets_the_real_agent_answer(
    real_backend: Any, tmp_path: Path
) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from capgate import SamplingParams
    from capgate.adapters.agents.langchain import CapabilityGate, CapgateChatModel

    log = DecisionLog(tmp_path / "log.sqlite3")
    middleware = CapabilityGate(
        policy="balanced", estimator=KeywordEstimator({"lottery": 0.05}), mode="shadow", log=log
    )
    model = CapgateChatModel(backend=real_backend, params=SamplingParams(max_tokens=8))
    agent = create_agent(model, tools=[], middleware=[middleware], checkpointer=InMemorySaver())
    out = agent.invoke(
        {"messages": [HumanMessage("Next week's lottery numbers?")]}, {"configurable": {"thread_id": "s"}}
    )
    assert isinstance(out["messages"][-1], AIMessage)  # the model replied
    assert out["capgate_decision"]["shadow"] is True
    assert middleware.gate.flush(WAIT_S)
    logged = log.get(out["capgate_decision"]["id"]).decision
    assert (logged.action, logged.shadow) == ("abstain", True)
    assert middleware.gate.stats.shadow_actions == {"abstain": 1}


# --------------------------------------------------------------------------- speculative gating


def test_speculative_gating_returns_the_calls_own_result_on_answer_and_discards_it_on_a_block(
    tmp_path: Path,
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    calls: list[str] = []
    call_started = threading.Event()

    class WaitsForTheCall(CapabilityEstimator):
        """Answers only once the call is running: proves the two were started together."""

        method = "waits"

        def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
            assert call_started.wait(WAIT_S)
            return [Estimate(p=0.05 if "hard" in str(queries[0]) else 0.95, method=self.method)]

    @capgate.guard(policy="balanced", estimator=WaitsForTheCall(), speculative=True, log=log)
    def ask(prompt: str) -> str:
        calls.append(prompt)
        call_started.set()
        return f"reply to {prompt}"

    assert ask("easy") == "reply to easy"
    call_started.clear()  # the estimate waits for this call to have started too
    blocked = ask("hard")
    assert isinstance(blocked, capgate.Gated)  # the call ran, but its result never leaks
    assert blocked.action == "abstain"
    assert "reply to hard" not in str(blocked)
    assert calls == ["easy", "hard"]
    by_action = {d.decision.action: d.decision.speculation for d in log.decisions()}
    assert by_action["answer"] is not None
    assert by_action["answer"].discarded is False
    assert by_action["abstain"] is not None
    assert by_action["abstain"].discarded is True

    @capgate.guard(policy="balanced", estimator=WaitsForTheCall(), speculative=True)
    def broken(prompt: str) -> str:
        call_started.set()
        raise ValueError("the call's own error")

    with pytest.raises(ValueError, match="the call's own error"):
        broken("easy")
    assert isinstance(broken("hard"), capgate.Gated)  # a blocked call's error is dropped with it
    with pytest.raises(SettingsError, match="`speculative`"):
        Gate(speculative="yes")  # type: ignore[arg-type]


def test_an_async_speculative_call_is_cancelled_when_the_gate_blocks() -> None:
    cancelled: list[str] = []

    @capgate.guard(policy="balanced", estimator=KeywordEstimator({"hard": 0.05}), speculative=True)
    async def ask(prompt: str) -> str:
        try:
            await asyncio.sleep(0 if "easy" in prompt else WAIT_S)
        except asyncio.CancelledError:
            cancelled.append(prompt)
            raise
        return f"reply to {prompt}"

    async def main() -> tuple[Any, Any]:
        return await ask("easy"), await ask("hard")

    easy, hard = asyncio.run(main())
    assert easy == "reply to easy"
    assert isinstance(hard, capgate.Gated)
    assert cancelled == ["hard"]
    speculation = hard.decision.speculation
    assert speculation is not None
    assert (speculation.discarded, speculation.cancelled) == (True, True)
