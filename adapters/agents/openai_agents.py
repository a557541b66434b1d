"""OpenAI Agents SDK integration: a capability input guardrail, and a triage agent that hands off.

* :func:`capability_guardrail` builds an ``InputGuardrail`` that estimates the capability of the
  agent's model on the run's input and applies the policy. ``answer`` passes (so do ``resample``
  and ``route``: a guardrail cannot redraw or switch models; see the triage agent); ``abstain``,
  ``clarify`` and ``escalate`` trip the wire (``InputGuardrailTripwireTriggered``) with a
  :class:`CapabilityCheck` (the :class:`~capgate.Decision` and its message) in ``output_info``.
* :func:`capability_triage` builds a triage ``Agent`` in front of yours whose model is capgate's
  decision (no LLM call): a real SDK handoff to your agent on ``answer``, to the named agent on
  ``escalate`` (the policy's ``to:``, e.g. a human-review agent or a stronger model), or to the
  agent of the model choice a ``route`` picks (the gate's ``routes``, as the LangChain router
  does; a choice of *model* is ``agent.clone(model=...)``). ``abstain``, ``clarify`` and an
  ``escalate`` with no agent wired trip its guardrail as above. It serves ``run``, ``run_sync``
  and ``run_streamed``.

Execution modes (the SDK's ``run_in_parallel``):

* ``True`` (the SDK default): the model call starts while capgate estimates, so gating adds no
  latency to an answered run, but a tripped run has spent the model's tokens (the SDK cancels the
  call; a hosted model bills what it generated). This is capgate's speculative gating, and the
  decision records it (``speculation``, ``discarded`` when the wire trips).
* ``False``: the estimate runs first; a tripped run spends nothing on the model, every run waits.
  The triage agent always decides first.

An estimator that raises, hangs past ``estimate_timeout_s`` (default
:data:`DEFAULT_ESTIMATE_TIMEOUT_S`; ``None`` waits forever) or returns an unavailable estimate
gives a degraded decision for the policy's ``on_degraded``, never a crashed run; a wrong setting
raises :class:`~capgate.errors.SettingsError`. In shadow mode nothing trips: the decision is made
in a worker thread beside the run and logged (``gate.flush()`` waits for it). The agent's model
(:func:`target_of`) is the decision's target; an estimator of another model is refused as for
:func:`capgate.guard` unless ``allow_other_target=True``. Each decision is logged, traced
(OpenTelemetry) and a ``capgate.decision`` custom span under the guardrail's in the SDK's trace.

No output guardrail is offered: capgate's estimators predict capability from the *query*, none
scores a given response, and the SDK draws one response per run (no samples to vote over).

Install with ``pip install 'capgate[openai-agents]'``.

Examples:
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

import itertools
import re
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any, Unpack

from agents import (
    Agent,
    AgentOutputSchemaBase,
    GuardrailFunctionOutput,
    Handoff,
    ModelSettings,
    RunContextWrapper,
    Tool,
    Usage,
    handoff,
)
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam

from capgate.adapters.agents._agents_sdk import (
    BLOCKING,
    DEFAULT_ESTIMATE_TIMEOUT_S,
    CapabilityCheck,
    CapabilityGuardrail,
    Checker,
    coerce,
    output,
    target_of,
)
from capgate.errors import SettingsError
from capgate.gate import Gate, GateOptions, Verdict

__all__ = [
    "DEFAULT_ESTIMATE_TIMEOUT_S",
    "CapabilityCheck",
    "CapabilityGuardrail",
    "capability_guardrail",
    "capability_triage",
    "target_of",
]

TRIAGE_INSTRUCTIONS = (
    "capgate triage: hands the conversation to the agent predicted capable of it (no model call)."
)
"""The triage agent's instructions (capgate's decision model does not read them)."""

_DECISION_LINE = "capgate decision: "


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
        run_in_parallel: Estimate while the model runs (``True``, the SDK default) or first
            (``False``): see the module's execution modes.
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
    checker = Checker(coerce(gate, settings))

    async def capgate_guardrail(
        ctx: RunContextWrapper[Any], agent: Agent[Any], value: str | list[TResponseInputItem]
    ) -> GuardrailFunctionOutput:
        return output(checker.gate, await checker.check(agent, value, parallel=run_in_parallel))

    return CapabilityGuardrail(
        capgate_guardrail, name=name, run_in_parallel=run_in_parallel, gate=checker.gate
    )


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
        name, message = await self.triage.choose(system_instructions, input)
        uid = uuid.uuid4().hex[:16]
        if name is None:
            part = ResponseOutputText(text=message or "", type="output_text", annotations=[], logprobs=[])
            item: Any = ResponseOutputMessage(
                id=f"msg_capgate_{uid}", type="message", role="assistant", status="completed", content=[part]
            )
        else:
            names = {h.tool_name for h in handoffs}
            if name not in names:
                raise SettingsError(f"the triage agent has no handoff {name!r}; it has {sorted(names)}")
            call_id = f"call_capgate_{uid}"
            item = ResponseFunctionToolCall(
                id=call_id, call_id=call_id, type="function_call", name=name, arguments="{}"
            )
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        """The same decision as one completed event (``Runner.run_streamed``); it takes
        :meth:`get_response`'s arguments (the SDK's ``Model`` signature) and passes them on."""
        got = await self.get_response(*args, **kwargs)
        response = Response(
            id=f"resp_capgate_{uuid.uuid4().hex[:16]}", created_at=time.time(), model="capgate-triage",
            object="response", output=got.output, tool_choice="none", tools=[], top_p=None,
            parallel_tool_calls=False, status="completed",
        )  # fmt: skip
        yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)


class _Triage:
    """The triage's state: the agents it hands to and the decisions its guardrail made."""

    def __init__(self, checker: Checker, agent: Agent[Any], escalate_to: Mapping[str, Agent[Any]],
                 routes_to: Mapping[str, Agent[Any]]) -> None:  # fmt: skip
        self.checker, self.agent = checker, agent
        self.escalate_to, self.routes_to = dict(escalate_to), dict(routes_to)
        self.handoffs = _handoffs(agent, self.escalate_to, self.routes_to)
        self._decided: OrderedDict[str, Verdict] = OrderedDict()
        self._runs: weakref.WeakKeyDictionary[RunContextWrapper[Any], Verdict] = weakref.WeakKeyDictionary()

    def remember(self, ctx: RunContextWrapper[Any], verdict: Verdict) -> None:
        self._runs[ctx] = verdict

    def instructions(self, ctx: RunContextWrapper[Any], _: Agent[Any]) -> str:
        """The triage's instructions, naming its run's decision (how the model learns it: a
        model call sees no run context)."""
        verdict = self._runs.pop(ctx, None)
        if verdict is None:
            return TRIAGE_INSTRUCTIONS
        self._decided[verdict.decision.id] = verdict
        while len(self._decided) > 512:
            self._decided.popitem(last=False)
        return f"{TRIAGE_INSTRUCTIONS}\n{_DECISION_LINE}{verdict.decision.id}"

    def destination(self, verdict: Verdict) -> Agent[Any] | None:
        """The agent a verdict hands to (``None``: it blocks)."""
        d = verdict.decision
        if d.action == "escalate":
            return self.escalate_to.get(d.to or "")
        if d.action == "route" and d.route is not None:
            if d.route not in self.routes_to:
                raise SettingsError(
                    f"the policy routed to model choice {d.route!r}, but the triage has no agent for it; "
                    f"pass routes_to={{name: agent}} (has: {sorted(self.routes_to)})"
                )
            return self.routes_to[d.route]
        return None if d.action in BLOCKING else self.agent

    async def choose(
        self, instructions: str | None, value: str | list[TResponseInputItem]
    ) -> tuple[str | None, str | None]:
        """The handoff tool the model calls (its guardrail's decision, made now if there is none),
        or ``None`` and the message when the decision blocks."""
        _, _, decision_id = (instructions or "").rpartition(_DECISION_LINE)
        verdict = self._decided.pop(decision_id, None)
        if verdict is None:
            verdict = await self.checker.check(self.agent, value)
        target = self.destination(verdict)
        if target is None:
            return None, self.checker.gate.block(verdict).message
        return self.handoffs[id(target)].tool_name, None


def _handoffs(
    agent: Agent[Any], escalate_to: Mapping[str, Agent[Any]], routes_to: Mapping[str, Agent[Any]]
) -> dict[int, Handoff[Any, Any]]:
    """One handoff per destination agent (by identity), each with a tool name of its own: a clone
    (``agent.clone(model=...)``) keeps its agent's name, so a second agent of a name gets the
    name suffixed with its ``escalate_to`` / ``routes_to`` key."""
    made: dict[int, Handoff[Any, Any]] = {}
    taken: set[str] = set()
    for key, target in [("", agent), *escalate_to.items(), *routes_to.items()]:
        if id(target) in made:
            continue
        tool = default = Handoff.default_tool_name(target)
        if tool in taken:
            tool = base = f"{default}_{re.sub(r'[^a-zA-Z0-9_]', '_', key).lower()}"
            for n in itertools.count(2):
                if tool not in taken:
                    break
                tool = f"{base}_{n}"
        taken.add(tool)
        made[id(target)] = handoff(target, tool_name_override=None if tool == default else tool)
    return made


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
            Each agent gets a handoff of its own: an agent whose name another one already has
            (a clone) gets the tool ``transfer_to_<name>_<key>``.
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
    checker = Checker(coerce(gate, settings))
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
        target = triage.destination(verdict)
        out = output(checker.gate, verdict, None if target is None else target.name)
        if not out.tripwire_triggered:
            triage.remember(ctx, verdict)
        return out

    guard = CapabilityGuardrail(capgate_triage, name="capgate", run_in_parallel=False, gate=checker.gate)
    targets: list[Agent[Any] | Handoff[Any, Any]] = list(triage.handoffs.values())
    return Agent(
        name=name or f"{agent.name} triage",
        instructions=triage.instructions,
        model=_DecisionModel(triage),
        handoffs=targets,
        input_guardrails=[guard],
    )
