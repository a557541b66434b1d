"""The OpenAI Agents SDK integration: real ``Runner.run`` / ``run_sync`` runs of the SDK.

The unit tests drive the SDK's runner with a model of their own (the SDK's ``Model`` interface)
that counts its calls, so "in blocking mode the model is not called" is checked by the count; the
``slow`` tests run the same against the CI vLLM server (``OpenAIChatCompletionsModel`` over
``AsyncOpenAI``), counting the server's requests.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import (
    Agent,
    Handoff,
    InputGuardrailTripwireTriggered,
    ModelResponse,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    Usage,
    set_trace_processors,
)
from agents.models.interface import Model
from agents.tracing import TracingProcessor
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseCompletedEvent, ResponseOutputMessage, ResponseOutputText

from capgate import Estimate
from capgate.adapters.agents.openai_agents import (
    CapabilityCheck,
    capability_guardrail,
    capability_triage,
    target_of,
)
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.errors import SettingsError
from capgate.estimators import CapabilityEstimator
from capgate.policies import load_policy
from tests._ci_server import ci_vllm_server
from tests._estimators import KeywordEstimator

WAIT_S = 10.0
MARKERS = {"LOW": 0.1, "MID": 0.5, "HIGH": 0.75, "NONE": None}
ROUTED = load_policy(Path(__file__).parent / "data" / "policies" / "router.yaml")


class CountingModel(Model):
    """An Agents SDK model that answers ``reply`` after ``delay_s``, counting started/finished calls."""

    def __init__(self, reply: str = "4", *, model: str = "counting-model", delay_s: float = 0.0) -> None:
        self.reply, self.model, self.delay_s = reply, model, delay_s
        self.started = 0
        self.finished = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.started += 1
        await asyncio.sleep(self.delay_s)
        self.finished += 1
        text = ResponseOutputText(text=self.reply, type="output_text", annotations=[], logprobs=[])
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        got = await self.get_response()
        response = Response(
            id="resp_1", created_at=0, model=self.model, object="response", output=got.output,
            tool_choice="none", tools=[], top_p=None, parallel_tool_calls=False, status="completed",
        )  # fmt: skip
        yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)


class Raising(CapabilityEstimator):
    method = "raising"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        raise RuntimeError("probe server down")


class Hanging(CapabilityEstimator):
    method = "hanging"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        time.sleep(30)
        raise AssertionError("unreachable")

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")


class Slow(KeywordEstimator):
    """A keyword estimator that takes ``delay_s`` (as a remote estimate does)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(MARKERS)
        self.delay_s = delay_s

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        await asyncio.sleep(self.delay_s)
        return await super().aestimate(queries)


class OfModel(KeywordEstimator):
    """A keyword estimator that says whose capability it predicts (as a probe does)."""

    def __init__(self, target: str) -> None:
        super().__init__(MARKERS)
        self._target = target

    @property
    def target_model(self) -> str | None:
        return self._target


class Spans(TracingProcessor):
    """Keeps the SDK's finished spans (replacing its exporter, so nothing leaves the process)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_trace_start(self, trace: Any) -> None: ...
    def on_trace_end(self, trace: Any) -> None: ...
    def on_span_start(self, span: Any) -> None: ...
    def on_span_end(self, span: Any) -> None:
        self.spans.append(span)

    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


@pytest.fixture(autouse=True)
def sdk_spans() -> Spans:
    spans = Spans()
    set_trace_processors([spans])
    return spans


def tripped(error: InputGuardrailTripwireTriggered) -> CapabilityCheck:
    info = error.guardrail_result.output.output_info
    assert isinstance(info, CapabilityCheck)
    return info


# --------------------------------------------------------------------------- the guardrail


@pytest.mark.parametrize("parallel", [True, False])
def test_answer_passes_in_both_modes(parallel: bool) -> None:
    model = CountingModel()
    guard = capability_guardrail(estimator=KeywordEstimator(MARKERS), run_in_parallel=parallel)
    agent = Agent(name="helper", model=model, input_guardrails=[guard])
    result = Runner.run_sync(agent, "What is 2 + 2?")
    assert result.final_output == "4"
    (check,) = (r.output.output_info for r in result.input_guardrail_results)
    assert check.action == "answer"
    assert check.message is None
    assert (check.decision.speculation is not None) == parallel
    assert check.decision.target == "counting-model"  # the agent's model, read from it
    assert model.finished == 1
    assert guard.gate is not None
    assert guard.gate.stats.calls == 1


def test_blocking_abstain_trips_before_the_model_is_called() -> None:
    model = CountingModel()
    guard = capability_guardrail(estimator=KeywordEstimator(MARKERS), run_in_parallel=False)
    agent = Agent(name="helper", model=model, input_guardrails=[guard])
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        Runner.run_sync(agent, "LOW: next week's lottery numbers?")
    check = tripped(caught.value)
    assert check.action == "abstain"
    assert check.message is not None
    assert "10%" in check.message
    assert model.started == 0  # nothing spent


def test_parallel_abstain_trips_while_the_model_runs_and_cancels_it() -> None:
    model = CountingModel(delay_s=5.0)
    guard = capability_guardrail(estimator=Slow(0.3))
    agent = Agent(name="helper", model=model, input_guardrails=[guard])
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        asyncio.run(Runner.run(agent, "LOW: next week's lottery numbers?"))
    decision = tripped(caught.value).decision
    assert decision.action == "abstain"
    assert decision.speculation is not None
    assert decision.speculation.discarded  # recorded as speculative gating is elsewhere
    assert model.started == 1  # speculative: the call had started (and its tokens may be spent)
    assert model.finished == 0  # the SDK cancelled it when the wire tripped


@pytest.mark.parametrize(("marker", "action"), [("MID", "clarify"), ("HIGH", "escalate")])
def test_clarify_and_escalate_without_a_handoff_trip_with_their_text(marker: str, action: str) -> None:
    model = CountingModel()
    guard = capability_guardrail(
        policy="conservative", estimator=KeywordEstimator(MARKERS), run_in_parallel=False
    )
    agent = Agent(name="helper", model=model, input_guardrails=[guard])
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        Runner.run_sync(agent, f"{marker}: is this contract clause enforceable?")
    check = tripped(caught.value)
    assert check.action == action
    assert check.message
    if action == "escalate":
        assert check.decision.to == "human-review"
        assert check.handoff is None
    assert model.started == 0


@pytest.mark.parametrize("estimator", [Raising(), Hanging(), KeywordEstimator(MARKERS)])
def test_a_failed_hung_or_unavailable_estimate_is_degraded_and_on_degraded_acts(
    estimator: CapabilityEstimator,
) -> None:
    model = CountingModel()
    guard = capability_guardrail(
        policy="conservative", estimator=estimator, estimate_timeout_s=0.3, run_in_parallel=False
    )
    agent = Agent(name="helper", model=model, input_guardrails=[guard])
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:  # not the estimator's error
        Runner.run_sync(agent, "NONE: anything")
    check = tripped(caught.value)
    assert check.decision.degraded
    assert check.action == "escalate"  # conservative's on_degraded
    reason = check.decision.estimate.reason or ""
    if isinstance(estimator, Raising):
        assert "RuntimeError: probe server down" in reason
    elif isinstance(estimator, Hanging):
        assert "0.3" in reason
    assert model.started == 0


def test_shadow_mode_never_trips_and_logs_what_it_would_have_done(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    model = CountingModel()
    guard = capability_guardrail(
        estimator=KeywordEstimator(MARKERS), mode="shadow", log=log, run_in_parallel=False
    )
    agent = Agent(name="helper", model=model, input_guardrails=[guard])
    result = Runner.run_sync(agent, "LOW: next week's lottery numbers?")
    assert result.final_output == "4"
    assert model.finished == 1
    (check,) = (r.output.output_info for r in result.input_guardrail_results)
    assert check.action == "answer"
    assert check.decision.shadow
    assert guard.gate is not None
    assert guard.gate.flush(WAIT_S)
    (logged,) = log.decisions()
    assert logged.decision.id == check.decision.id
    assert (logged.decision.action, logged.decision.shadow) == ("abstain", True)


def test_decisions_are_logged_and_traced_in_the_sdk_trace(tmp_path: Path, sdk_spans: Spans) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    guard = capability_guardrail(estimator=KeywordEstimator(MARKERS), log=log, run_in_parallel=False)
    agent = Agent(name="helper", model=CountingModel(), input_guardrails=[guard])
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        asyncio.run(Runner.run(agent, "LOW: next week's lottery numbers?"))
    decision = tripped(caught.value).decision
    (logged,) = log.decisions()
    assert logged.decision == decision
    (span,) = [s for s in sdk_spans.spans if getattr(s.span_data, "name", None) == "capgate.decision"]
    assert span.span_data.data["decision_id"] == decision.id
    assert span.span_data.data["tripped"] is True
    (parent,) = [s for s in sdk_spans.spans if s.span_id == span.parent_id]
    assert parent.span_data.type == "guardrail"


def test_the_opentelemetry_gate_span_nests_under_the_callers_span() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    guard = capability_guardrail(estimator=KeywordEstimator(MARKERS), run_in_parallel=False)
    agent = Agent(name="helper", model=CountingModel(), input_guardrails=[guard])
    with (
        trace.get_tracer("test").start_as_current_span("caller"),
        pytest.raises(InputGuardrailTripwireTriggered),
    ):
        Runner.run_sync(agent, "LOW: next week's lottery numbers?")
    finished = exporter.get_finished_spans()
    (caller,) = [s for s in finished if s.name == "caller"]
    (gate,) = [s for s in finished if s.name == "capgate.gate"]
    assert gate.attributes is not None
    assert gate.attributes["capgate.action"] == "abstain"
    assert gate.attributes["gen_ai.request.model"] == "counting-model"
    assert gate.context.trace_id == caller.context.trace_id


def test_the_target_is_the_agents_model_and_another_models_estimator_is_refused() -> None:
    guard = capability_guardrail(estimator=OfModel("other-model"), run_in_parallel=False)
    agent = Agent(name="helper", model=CountingModel(model="served-model"), input_guardrails=[guard])
    with pytest.raises(SettingsError, match=r"'other-model'.*'served-model'.*allow_other_target"):
        Runner.run_sync(agent, "What is 2 + 2?")
    allowed = capability_guardrail(
        estimator=OfModel("other-model"), allow_other_target=True, run_in_parallel=False
    )
    agent = Agent(name="helper", model=CountingModel(model="served-model"), input_guardrails=[allowed])
    result = Runner.run_sync(agent, "What is 2 + 2?")
    (check,) = (r.output.output_info for r in result.input_guardrail_results)
    assert (check.decision.target, check.decision.target_override) == ("served-model", True)
    assert "allow_other_target" in check.decision.reason
    assert target_of(Agent(name="a", model="gpt-x")) == "gpt-x"
    assert target_of(Agent(name="a")) is None


def test_bad_settings_are_named() -> None:
    with pytest.raises(SettingsError, match="on_block"):
        capability_guardrail(estimator=KeywordEstimator(MARKERS), on_block="raise")
    with pytest.raises(SettingsError, match="run_in_parallel"):
        capability_guardrail(estimator=KeywordEstimator(MARKERS), run_in_parallel="yes")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=r"routes_to.*'tiny'"):
        capability_triage(
            Agent(name="a"), routes_to={"tiny": Agent(name="t")}, estimator=KeywordEstimator(MARKERS)
        )
    with pytest.raises(SettingsError, match="escalate_to"):
        capability_triage(Agent(name="a"), escalate_to={"x": "not an agent"})  # type: ignore[dict-item]


# --------------------------------------------------------------------------- the triage agent


def _desk() -> tuple[CountingModel, CountingModel, Agent[Any]]:
    main, human = CountingModel("4"), CountingModel("A reviewer will get back to you.")
    helper = Agent(name="helper", model=main)
    reviewer = Agent(name="reviewer", model=human)
    triage = capability_triage(
        helper,
        escalate_to={"human-review": reviewer},
        policy="conservative",
        estimator=KeywordEstimator({**MARKERS, "HIGH": 0.75}),
    )
    return main, human, triage


def test_triage_hands_an_answered_run_to_the_agent() -> None:
    main, human, triage = _desk()
    result = Runner.run_sync(triage, "What is 2 + 2?")
    assert result.last_agent.name == "helper"
    assert result.final_output == "4"
    assert (main.finished, human.started) == (1, 0)
    (check,) = (r.output.output_info for r in result.input_guardrail_results)
    assert (check.action, check.handoff) == ("answer", "helper")


def test_triage_escalates_as_a_handoff_to_the_named_agent() -> None:
    main, human, triage = _desk()
    result = asyncio.run(Runner.run(triage, "HIGH: is this contract clause enforceable?"))
    assert result.last_agent.name == "reviewer"
    assert result.final_output == "A reviewer will get back to you."
    assert (main.started, human.finished) == (0, 1)
    (check,) = (r.output.output_info for r in result.input_guardrail_results)
    assert (check.action, check.decision.to, check.handoff) == ("escalate", "human-review", "reviewer")


def test_triage_trips_on_abstain_and_spends_nothing() -> None:
    main, human, triage = _desk()
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        Runner.run_sync(triage, "LOW: next week's lottery numbers?")
    assert tripped(caught.value).action == "abstain"
    assert (main.started, human.started) == (0, 0)


def test_triage_decides_once_per_run_with_a_session(tmp_path: Path) -> None:
    from agents import SQLiteSession

    estimator = KeywordEstimator(MARKERS)
    main = CountingModel("4")
    log = DecisionLog(tmp_path / "log.sqlite3")
    triage = capability_triage(Agent(name="helper", model=main), estimator=estimator, log=log)
    session = SQLiteSession("conversation")
    for text in ("What is 2 + 2?", "And 3 + 3?"):
        result = Runner.run_sync(triage, text, session=session)
        assert result.last_agent.name == "helper"
    assert estimator.acalls == 2  # one decision per run, though the second saw the history
    assert len(log.decisions()) == 2
    assert main.finished == 2


def test_streamed_runs_are_gated_and_handed_off_too() -> None:
    async def go(text: str) -> Any:
        main, human, triage = _desk()
        streamed = Runner.run_streamed(triage, text)
        async for _ in streamed.stream_events():
            pass
        return streamed, main, human

    streamed, main, human = asyncio.run(go("HIGH: is this contract clause enforceable?"))
    assert streamed.last_agent.name == "reviewer"
    assert (main.started, human.finished) == (0, 1)
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        asyncio.run(go("LOW: next week's lottery numbers?"))
    assert tripped(caught.value).action == "abstain"


def test_triage_routes_to_the_cheapest_capable_agent() -> None:
    small, large = (
        CountingModel("small says 4", model="small-m"),
        CountingModel("large says 4", model="large-m"),
    )
    helper = Agent(name="helper", model=CountingModel(model="small-m"))
    routes = {
        "small": KeywordEstimator({"HARD": 0.4}, default=0.85),
        "large": KeywordEstimator({"HARD": 0.7}, default=0.95),
    }
    triage = capability_triage(
        helper,
        routes_to={"small": Agent(name="small", model=small), "large": Agent(name="large", model=large)},
        policy=ROUTED,
        estimator=KeywordEstimator({"MID": 0.5}),
        routes=routes,
    )
    easy = Runner.run_sync(triage, "MID: what is 2 + 2?")
    assert (easy.last_agent.name, easy.final_output) == ("small", "small says 4")
    hard = Runner.run_sync(triage, "MID: HARD: prove it.")
    assert (hard.last_agent.name, hard.final_output) == ("large", "large says 4")
    (check,) = (r.output.output_info for r in hard.input_guardrail_results)
    assert check.decision.route == "large"
    assert check.handoff == "large"
    assert (small.finished, large.finished) == (1, 1)


def test_triage_hands_to_each_clone_of_an_agent_by_its_own_handoff() -> None:
    """Clones (``agent.clone(model=...)``) keep their agent's name: each still gets its handoff."""
    main, small, large = (
        CountingModel("main says 4"),
        CountingModel("small says 4"),
        CountingModel("large says 4"),
    )
    helper = Agent(name="helper", model=main)
    routes = {
        "small": KeywordEstimator({"HARD": 0.4}, default=0.85),
        "large": KeywordEstimator({"HARD": 0.7}, default=0.95),
    }
    triage = capability_triage(
        helper,
        routes_to={"small": helper.clone(model=small), "large": helper.clone(model=large)},
        policy=ROUTED,
        estimator=KeywordEstimator({"MID": 0.5}),
        routes=routes,
    )
    outputs = [
        Runner.run_sync(triage, q).final_output for q in ("MID: HARD: prove it.", "MID: 2 + 2?", "2 + 2?")
    ]
    assert outputs == ["large says 4", "small says 4", "main says 4"]
    assert (main.finished, small.finished, large.finished) == (1, 1, 1)
    tools = sorted(h.tool_name for h in triage.handoffs if isinstance(h, Handoff))
    assert tools == ["transfer_to_helper", "transfer_to_helper_large", "transfer_to_helper_small"]


# --------------------------------------------------------------------------- the CI vLLM server


class Server:
    """The CI server as an Agents SDK model, counting the requests it gets."""

    def __init__(self) -> None:
        url, self.name = ci_vllm_server()
        self.requests = 0

        async def count(request: httpx.Request) -> None:
            self.requests += 1

        client = AsyncOpenAI(
            base_url=url, api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
            http_client=httpx.AsyncClient(event_hooks={"request": [count]}, timeout=120),
        )  # fmt: skip
        self.model = OpenAIChatCompletionsModel(model=self.name, openai_client=client)

    def agent(self, name: str = "helper", **kwargs: Any) -> Agent[Any]:
        kwargs.setdefault("instructions", "Answer in one short sentence.")
        return Agent(name=name, model=self.model, model_settings=ModelSettings(max_tokens=48), **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [True, False])
def test_server_pass_and_trip_in_both_modes(parallel: bool) -> None:
    server = Server()
    guard = capability_guardrail(estimator=KeywordEstimator(MARKERS), run_in_parallel=parallel)
    result = Runner.run_sync(server.agent(input_guardrails=[guard]), "What is the capital of France?")
    assert isinstance(result.final_output, str)
    assert result.final_output.strip()
    (check,) = (r.output.output_info for r in result.input_guardrail_results)
    assert (check.action, check.decision.target) == ("answer", server.name)
    assert server.requests == 1
    with pytest.raises(InputGuardrailTripwireTriggered) as caught:
        Runner.run_sync(server.agent(input_guardrails=[guard]), "LOW: next week's lottery numbers?")
    assert tripped(caught.value).action == "abstain"
    if not parallel:
        assert server.requests == 1  # blocking: the tripped run sent the server nothing


@pytest.mark.slow
def test_server_escalates_as_a_handoff_and_routes() -> None:
    server = Server()
    reviewer = server.agent("reviewer", instructions="Say that a human reviewer will follow up.")
    triage = capability_triage(
        server.agent(),
        escalate_to={"human-review": reviewer},
        policy="conservative",
        estimator=KeywordEstimator(MARKERS),
    )
    result = Runner.run_sync(triage, "HIGH: is this contract clause enforceable?")
    assert result.last_agent.name == "reviewer"
    assert str(result.final_output).strip()
    assert server.requests == 1  # the triage itself calls no model
    routes = {"small": KeywordEstimator({"HARD": 0.4}, default=0.85), "large": KeywordEstimator({})}
    router = capability_triage(
        server.agent(),
        routes_to={"small": server.agent("small"), "large": server.agent("large")},
        policy=ROUTED,
        estimator=KeywordEstimator({"MID": 0.5}),
        routes=routes,
    )
    routed = Runner.run_sync(router, "MID: HARD: what is 17 * 23?")
    assert routed.last_agent.name == "large"


@pytest.mark.slow
def test_server_shadow_and_a_failing_estimator_never_crash_the_run(tmp_path: Path) -> None:
    server = Server()
    log = DecisionLog(tmp_path / "log.sqlite3")
    shadow = capability_guardrail(estimator=KeywordEstimator(MARKERS), mode="shadow", log=log)
    result = Runner.run_sync(server.agent(input_guardrails=[shadow]), "LOW: what is 2 + 2?")
    assert str(result.final_output).strip()
    assert shadow.gate is not None
    assert shadow.gate.flush(WAIT_S)
    assert [d.decision.action for d in log.decisions()] == ["abstain"]
    for estimator in (Raising(), Hanging()):
        guard = capability_guardrail(estimator=estimator, estimate_timeout_s=0.5, run_in_parallel=False)
        with pytest.raises(InputGuardrailTripwireTriggered) as caught:  # balanced: on_degraded abstains
            Runner.run_sync(server.agent(input_guardrails=[guard]), "What is 2 + 2?")
        assert tripped(caught.value).decision.degraded


def test_a_gate_that_cannot_decide_gives_a_degraded_decision_naming_the_error() -> None:
    """The guardrail's last line (an error from deciding itself, not from the estimator, which
    the gate already turns into a degraded estimate): the same words as the gate's own reasons."""
    from capgate.adapters.agents._agents_sdk import failure
    from capgate.gate import Gate

    gate = Gate(policy="conservative", estimator=KeywordEstimator(MARKERS))
    verdict = failure(gate, "anything", RuntimeError("x" * 300))
    assert verdict.decision.degraded
    assert verdict.action == "escalate"
    reason = verdict.decision.estimate.reason or ""
    assert reason.startswith("the gate raised RuntimeError: " + "x" * 200)
    assert reason.endswith("...")
    assert "x" * 201 not in reason
