"""OpenAI Agents SDK integration: a capability input guardrail, and a triage agent that hands off.

* :func:`capability_guardrail` builds an ``InputGuardrail``: it estimates the capability of the
  agent's model on the run's input and applies the policy. ``answer`` (and ``resample``,
  ``route``: a guardrail cannot redraw or switch models; see the triage agent) passes;
  ``abstain``, ``clarify`` and ``escalate`` trip the wire (the SDK raises
  ``InputGuardrailTripwireTriggered``) with a :class:`CapabilityCheck` (the
  :class:`~capgate.Decision` and its message) in ``output_info``.
* :func:`capability_triage` builds a triage ``Agent`` in front of yours, whose model is capgate's
  decision (no LLM call): the run is handed off (a real SDK handoff) to your agent on ``answer``,
  to the named agent on ``escalate`` (the policy's ``to:``, e.g. a human-review agent or a
  stronger model), or to the agent of the model choice a ``route`` picks by predicted capability
  (the gate's ``routes``, as the LangChain router does; a choice of *model* is
  ``agent.clone(model=...)``). ``abstain``, ``clarify`` and an ``escalate`` with no agent wired
  trip its blocking guardrail as above. It serves ``run``, ``run_sync`` and ``run_streamed``.

Execution modes (the SDK's ``run_in_parallel``), and their cost:

* ``run_in_parallel=True`` (the SDK default): the model call starts while capgate estimates, so
  gating adds no latency to an answered run; a tripped run has spent the model's tokens (the SDK
  cancels the call when the wire trips, but a hosted model bills what it generated). This is
  capgate's speculative gating (``speculative=True`` elsewhere) in the SDK's own terms.
* ``run_in_parallel=False``: the estimate runs first; a tripped run spends nothing on the model,
  every run waits for the estimate. The triage agent always decides first.

An estimator that raises, hangs past ``estimate_timeout_s`` (default here
:data:`DEFAULT_ESTIMATE_TIMEOUT_S`; ``None`` waits forever) or returns an unavailable estimate
gives a degraded decision that the policy's ``on_degraded`` acts on: never a crash of the run.
A wrong setting (a target mismatch, no estimator) raises :class:`~capgate.errors.SettingsError`.
In shadow mode (``mode="shadow"``) nothing trips: the decision is made in a worker thread beside
the run (it outlives ``Runner.run_sync``'s loop) and logged; ``gate.flush()`` waits for it.

The target is known: the decision records the agent's model (``agent.model``, a name or a model
object's ``model``), and an estimator of another model's capability is refused as for
:func:`capgate.guard` unless ``allow_other_target=True`` (recorded in each decision).

Decisions are written to the gate's ``log`` and traced as elsewhere (OpenTelemetry spans under the
current one); each decision is also a ``capgate.decision`` custom span in the SDK's own trace,
under the guardrail's span.

No output guardrail is offered: capgate's estimators predict capability from the *query* (a probe
on the prompt, verbalized confidence, P(True) to "are you able to answer?"); none scores a given
response, and the SDK draws one response per run, so there are no samples to vote over. An output
guardrail would re-estimate the input after the answer is paid for.

Install with ``pip install 'capgate[openai-agents]'``.

Example:
    >>> from agents import Agent, InputGuardrailTripwireTriggered, Runner
    >>> from capgate.estimators import ConstantPrior
    >>> guard = capability_guardrail(estimator=ConstantPrior.from_mean(0.1, n_train=1),
    ...                              run_in_parallel=False)  # blocking: the model is not called
    >>> agent = Agent(name="helper", model="gpt-4o-mini", input_guardrails=[guard])
    >>> try:
    ...     Runner.run_sync(agent, "Next week's lottery numbers?")
    ... except InputGuardrailTripwireTriggered as tripped:
    ...     print(tripped.guardrail_result.output.output_info.message)
    I can't answer this reliably (estimated chance of a correct answer: 10%).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from agents import (
    Agent,
    AgentOutputSchemaBase,
    GuardrailFunctionOutput,
    Handoff,
    InputGuardrail,
    ModelSettings,
    RunContextWrapper,
    Tool,
    Usage,
)
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.tracing import custom_span
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from capgate._types import Decision, Estimate
from capgate.backend import ChatMessage, Prompt
from capgate.errors import SettingsError
from capgate.gate import Gate, GateOptions, Verdict
from capgate.gate.flow import Assess, Flow, Record, adrive, drive
from capgate.messages import content_text, query_hash

__all__ = [
    "DEFAULT_ESTIMATE_TIMEOUT_S",
    "CapabilityCheck",
    "CapabilityGuardrail",
    "capability_guardrail",
    "capability_triage",
    "target_of",
]

DEFAULT_ESTIMATE_TIMEOUT_S = 30.0
"""The guardrail's deadline on one estimate when none is given: a hung estimator never hangs a run."""

TRIAGE_INSTRUCTIONS = (
    "capgate triage: hands the conversation to the agent predicted capable of it (no model call)."
)
"""The triage agent's instructions (capgate's decision model does not read them)."""

_BLOCKING = ("abstain", "clarify", "escalate")
_ERROR_TEXT = 200


@dataclass(frozen=True)
class CapabilityCheck:
    """What the guardrail found: its ``output_info``.

    Attributes:
        decision: The gate's decision (in shadow mode: the stand-in ``answer``; the real one is
            logged when made).
        message: The text for the user or the human (abstain message, clarifying question,
            escalation summary) when the decision blocks, else ``None``.
        handoff: The agent the triage hands the run to, if any.
    """

    decision: Decision
    message: str | None = None
    handoff: str | None = None

    @property
    def action(self) -> str:
        """The decision's action."""
        return self.decision.action


@dataclass
class CapabilityGuardrail(InputGuardrail[Any]):
    """An ``InputGuardrail`` that knows its :class:`~capgate.Gate` (its stats, log, ``flush``)."""

    gate: Gate | None = None


def target_of(agent: Agent[Any]) -> str | None:
    """The model an agent's calls go to: ``agent.model`` as a name, or a model object's ``model``
    (``OpenAIChatCompletionsModel``, ``OpenAIResponsesModel``); ``None`` when the run config picks.
    """
    model = agent.model
    if isinstance(model, str):
        return model or None
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


def _item_message(item: Any) -> ChatMessage | None:
    """A Responses input item as a chat message (``None``: not text, e.g. reasoning)."""
    get = item.get if isinstance(item, Mapping) else lambda key, default=None: getattr(item, key, default)
    kind, role = get("type"), get("role")
    if role is not None:
        mapped = {"developer": "system"}.get(str(role), str(role))
        if mapped in ("user", "assistant", "system"):
            return {"role": mapped, "content": content_text(get("content"), "input")}  # type: ignore[return-value]
    if kind == "function_call":
        return {"role": "assistant", "content": f"Proposed tool call: {get('name')}({get('arguments')})"}
    if kind == "function_call_output":
        output = get("output")
        return {
            "role": "tool",
            "content": output if isinstance(output, str) else json.dumps(output, default=str),
        }
    return None


def _run_query(value: str | Sequence[TResponseInputItem]) -> Prompt:
    """The query of a run's input: the string, or its text items as chat messages."""
    if isinstance(value, str):
        return value
    messages = [m for m in (_item_message(item) for item in value) if m is not None]
    if not messages:
        raise SettingsError(f"the run's input has no text message to estimate; got {list(value)!r}")
    return messages


def _failure(gate: Gate, query: Prompt, error: Exception) -> Verdict:
    """The degraded decision of an estimate that raised (the policy's ``on_degraded``)."""
    text = str(error)[:_ERROR_TEXT]
    reason = f"the estimator raised {type(error).__name__}" + (f": {text}" if text else "")
    method = getattr(gate.settings.estimator, "method", None) or "unknown"
    return gate.decide_on(query, [Estimate.unavailable(method, reason)], None)


def _check_flow(gate: Gate, query: Prompt) -> Flow[Verdict]:
    try:
        verdict: Verdict = yield Assess(gate, query)
    except SettingsError:
        raise
    except Exception as exc:  # never the run's failure: a degraded decision naming it
        verdict = _failure(gate, query, exc)
    yield Record(gate, verdict)
    return verdict


class _Checker:
    """The gate, its view per target model, and the decision made on a run's input."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._views: dict[str | None, Gate] = {}

    def view(self, agent: Agent[Any]) -> Gate:
        """The gate for ``agent``'s model (its target checked against the estimator's).

        Raises:
            SettingsError: The gate names another target, or the estimator predicts another model.
        """
        target = target_of(agent)
        if target not in self._views:
            own = self.gate.settings.target
            if target is not None and own is not None and own != target:
                raise SettingsError(
                    f"the gate's target is {own!r} but agent {agent.name!r} calls {target!r}; "
                    "drop target= (the agent's model is read) or gate the right agent"
                )
            self._views[target] = (
                self.gate if target in (None, own) else self.gate.with_options(target=target)
            )
        return self._views[target]

    async def check(self, agent: Agent[Any], value: str | Sequence[TResponseInputItem]) -> Verdict:
        gate = self.view(agent)
        query = _run_query(value)
        if gate.in_shadow():  # decided in a worker thread: it outlives the run's event loop
            return drive(_check_flow(gate, query))
        return await adrive(_check_flow(gate, query))


def _traced(verdict: Verdict, tripped: bool, handoff: str | None = None) -> None:
    d = verdict.decision
    data = {
        "decision_id": d.id, "action": d.action, "p": d.estimate.p, "degraded": d.degraded,
        "reason": d.reason, "target": d.target, "to": d.to, "route": d.route, "shadow": d.shadow,
        "tripped": tripped, "handoff": handoff,
    }  # fmt: skip
    with custom_span("capgate.decision", data=data):
        pass


def _output(gate: Gate, verdict: Verdict, handoff: str | None = None) -> GuardrailFunctionOutput:
    """The guardrail's output: a blocking action trips the wire unless the run is handed off."""
    tripped = verdict.action in _BLOCKING and handoff is None
    message = gate.block(verdict).message if tripped else None
    _traced(verdict, tripped, handoff)
    return GuardrailFunctionOutput(CapabilityCheck(verdict.decision, message, handoff), tripped)


def _coerce(gate: Gate | None, settings: GateOptions) -> Gate:
    if gate is None and "estimate_timeout_s" not in settings:
        settings = {**settings, "estimate_timeout_s": DEFAULT_ESTIMATE_TIMEOUT_S}
    made = Gate.coerce(gate, **settings)
    if made.on_block != "return":
        raise SettingsError(
            f"`on_block` must be 'return' for the Agents SDK guardrail (a block trips the wire, "
            f"raising InputGuardrailTripwireTriggered); got {made.on_block!r}"
        )
    return made


def capability_guardrail(
    *,
    gate: Gate | None = None,
    run_in_parallel: bool = True,
    name: str = "capgate",
    **settings: Unpack[GateOptions],
) -> CapabilityGuardrail:
    """An input guardrail gating a run by its agent's predicted capability on the input.

    Args:
        gate: A ready :class:`~capgate.Gate` (or give the settings instead).
        run_in_parallel: ``True`` (the SDK default): estimate while the model runs (no added
            latency; a tripped run has spent the model's tokens). ``False``: estimate first (a
            tripped run spends nothing on the model).
        name: The guardrail's name in the SDK's traces.
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`): ``policy``,
            ``estimator``, ``log``, ``mode``, ``allow_other_target``, ``estimate_timeout_s``...

    Returns:
        The guardrail; put it in ``Agent(input_guardrails=[...])``; its gate is ``guardrail.gate``.

    Raises:
        SettingsError: A wrong setting (the message names it); it is a ``ValueError``.
    """
    if not isinstance(run_in_parallel, bool):
        raise SettingsError(f"`run_in_parallel` must be True or False; got {run_in_parallel!r}")
    checker = _Checker(_coerce(gate, settings))

    async def capgate_guardrail(
        ctx: RunContextWrapper[Any], agent: Agent[Any], value: str | list[TResponseInputItem]
    ) -> GuardrailFunctionOutput:
        return _output(checker.gate, await checker.check(agent, value))

    return CapabilityGuardrail(
        capgate_guardrail, name=name, run_in_parallel=run_in_parallel, gate=checker.gate
    )


# --------------------------------------------------------------------------- triage


def _handoff_call(tool: str) -> ResponseFunctionToolCall:
    call_id = f"call_capgate_{uuid.uuid4().hex[:16]}"
    return ResponseFunctionToolCall(
        id=call_id, call_id=call_id, type="function_call", name=tool, arguments="{}"
    )


def _text(message: str) -> ResponseOutputMessage:
    part = ResponseOutputText(text=message, type="output_text", annotations=[], logprobs=[])
    return ResponseOutputMessage(
        id=f"msg_capgate_{uuid.uuid4().hex[:16]}", type="message", role="assistant", status="completed",
        content=[part],
    )  # fmt: skip


class _DecisionModel(Model):
    """The triage agent's model: no LLM call, a handoff to the agent the decision names."""

    def __init__(self, triage: _Triage) -> None:
        self.triage = triage

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        name, message = await self.triage.choose(input)
        if name is None:
            output: Any = _text(message or "")
        else:
            by_agent = {h.agent_name: h.tool_name for h in handoffs}
            if name not in by_agent:
                raise SettingsError(f"the triage agent has no handoff to {name!r}; it has {sorted(by_agent)}")
            output = _handoff_call(by_agent[name])
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """The same decision as one completed event (``Runner.run_streamed``)."""
        got = await self.get_response(
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt,
        )  # fmt: skip
        response = Response(
            id=f"resp_capgate_{uuid.uuid4().hex[:16]}", created_at=time.time(), model="capgate-triage",
            object="response", output=got.output, tool_choice="none", tools=[], top_p=None,
            parallel_tool_calls=False, status="completed",
        )  # fmt: skip
        yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)


class _Triage:
    """The triage's state: the agents it hands to and the decisions its guardrail made."""

    def __init__(self, checker: _Checker, agent: Agent[Any], escalate_to: Mapping[str, Agent[Any]],
                 routes_to: Mapping[str, Agent[Any]]) -> None:  # fmt: skip
        self.checker, self.agent = checker, agent
        self.escalate_to, self.routes_to = dict(escalate_to), dict(routes_to)
        self._memo: OrderedDict[str, Verdict] = OrderedDict()

    def remember(self, verdict: Verdict) -> None:
        self._memo[query_hash(verdict.query)] = verdict
        while len(self._memo) > 512:
            self._memo.popitem(last=False)

    def destination(self, verdict: Verdict) -> str | None:
        """The agent a verdict hands to (``None``: it blocks)."""
        d = verdict.decision
        if d.action == "escalate":
            wired = self.escalate_to.get(d.to or "")
            return None if wired is None else wired.name
        if d.action == "route" and d.route is not None:
            if d.route not in self.routes_to:
                raise SettingsError(
                    f"the policy routed to model choice {d.route!r}, but the triage has no agent for it; "
                    f"pass routes_to={{name: agent}} (has: {sorted(self.routes_to)})"
                )
            return self.routes_to[d.route].name
        return None if d.action in _BLOCKING else self.agent.name

    async def choose(self, value: str | list[TResponseInputItem]) -> tuple[str | None, str | None]:
        """Where the model hands the run: the guardrail's decision on this input (decided again
        when the model sees another input, e.g. with a session's history)."""
        verdict = self._memo.pop(query_hash(_run_query(value)), None)
        if verdict is None:
            verdict = await self.checker.check(self.agent, value)
        name = self.destination(verdict)
        return name, None if name is not None else self.checker.gate.block(verdict).message


def capability_triage(
    agent: Agent[Any],
    *,
    escalate_to: Mapping[str, Agent[Any]] | None = None,
    routes_to: Mapping[str, Agent[Any]] | None = None,
    gate: Gate | None = None,
    name: str | None = None,
    **settings: Unpack[GateOptions],
) -> Agent[Any]:
    """A triage agent that hands each run to the agent predicted capable of it.

    Args:
        agent: Your agent: it gets the run on ``answer`` (and ``resample``); its model is the
            target whose capability is estimated.
        escalate_to: The agent for each escalation target (the policy's ``to:``, e.g.
            ``{"human-review": reviewer}``); an ``escalate`` to a name not here trips the wire.
        routes_to: The agent of each model choice of the gate's ``routes``, cheapest first.
        gate: A ready :class:`~capgate.Gate` (or give the settings instead).
        name: The triage agent's name (default: ``"<agent> triage"``).
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`).

    Returns:
        The triage agent: run it (``Runner.run(triage, ...)``); ``result.last_agent`` is the agent
        that answered. Its guardrail is ``triage.input_guardrails[0]`` (``.gate``).

    Raises:
        SettingsError: A wrong setting, or a route choice without an agent.
    """
    if not isinstance(agent, Agent):
        raise SettingsError(f"`agent` must be an Agents SDK Agent; got {agent!r}")
    escalate_to, routes_to = dict(escalate_to or {}), dict(routes_to or {})
    for label, wired in (("escalate_to", escalate_to), ("routes_to", routes_to)):
        for key, value in wired.items():
            if not (isinstance(key, str) and key) or not isinstance(value, Agent):
                raise SettingsError(f"`{label}` must map names to Agents; got {key!r}: {value!r}")
    checker = _Checker(_coerce(gate, settings))
    routes = checker.gate.settings.routes or {}
    missing = sorted(set(routes_to) - set(routes))
    if missing:
        raise SettingsError(
            f"each agent in `routes_to` needs a capability estimator in `routes`; none for {missing}"
        )
    checker.view(agent)  # the target check, now rather than at the first run
    triage = _Triage(checker, agent, escalate_to, routes_to)

    async def capgate_triage(
        ctx: RunContextWrapper[Any], _: Agent[Any], value: str | list[TResponseInputItem]
    ) -> GuardrailFunctionOutput:
        verdict = await checker.check(agent, value)
        out = _output(checker.gate, verdict, triage.destination(verdict))
        if not out.tripwire_triggered:
            triage.remember(verdict)
        return out

    guard = CapabilityGuardrail(capgate_triage, name="capgate", run_in_parallel=False, gate=checker.gate)
    targets: list[Agent[Any] | Handoff[Any, Any]] = list(
        {id(a): a for a in (agent, *escalate_to.values(), *routes_to.values())}.values()
    )
    return Agent(
        name=name or f"{agent.name} triage",
        instructions=TRIAGE_INSTRUCTIONS,
        model=_DecisionModel(triage),
        handoffs=targets,
        input_guardrails=[guard],
    )
