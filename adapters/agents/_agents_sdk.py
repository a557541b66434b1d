"""The Agents SDK guardrail's machinery (:mod:`capgate.adapters.agents.openai_agents` is the
public module): the run's input as a capgate query, the gate per target model, the decision flow
(a failed estimate becomes a degraded decision) and the guardrail's output."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents import Agent, GuardrailFunctionOutput, InputGuardrail
from agents.items import TResponseInputItem
from agents.tracing import custom_span

from capgate.core.backend import ChatMessage, Prompt
from capgate.core.messages import content_text
from capgate.core.types import Decision, Estimate, Speculation
from capgate.errors import SettingsError
from capgate.gate import Gate, GateOptions, Verdict
from capgate.gate.flow import Assess, Flow, Record, adrive, drive, failure_reason

DEFAULT_ESTIMATE_TIMEOUT_S = 30.0
"""The guardrail's deadline on one estimate when none is given: a hung estimator never hangs a run."""

BLOCKING = ("abstain", "clarify", "escalate")


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


def item_message(item: Any) -> ChatMessage | None:
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


def run_query(value: str | Sequence[TResponseInputItem]) -> Prompt:
    """The query of a run's input: the string, or its text items as chat messages."""
    if isinstance(value, str):
        return value
    messages = [m for m in (item_message(item) for item in value) if m is not None]
    if not messages:
        raise SettingsError(f"the run's input has no text message to estimate; got {list(value)!r}")
    return messages


def failure(gate: Gate, query: Prompt, error: Exception) -> Verdict:
    """The degraded decision when the gate could not decide (the policy's ``on_degraded``); an
    estimator's own failure is already a degraded decision from the gate (fail closed)."""
    reason = failure_reason(error, by="the gate")
    method = getattr(gate.settings.estimator, "method", None) or "unknown"
    return gate.decide_on(query, [Estimate.unavailable(method, reason)], None)


def check_flow(gate: Gate, query: Prompt, *, parallel: bool = False) -> Flow[Verdict]:
    """Decide on a run's input and log it; ``parallel``: the model call started with the estimate
    (the decision records the speculation: discarded when it trips)."""
    try:
        verdict: Verdict = yield Assess(gate, query)
    except SettingsError:
        raise
    except Exception as exc:  # never the run's failure: a degraded decision naming it
        verdict = failure(gate, query, exc)
    if parallel and verdict.pending is None:
        speculation = Speculation(discarded=verdict.action in BLOCKING)
        decision = verdict.decision.model_copy(update={"speculation": speculation})
        verdict = Verdict(decision=decision, query=verdict.query)
    yield Record(gate, verdict)
    return verdict


class Checker:
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

    async def check(
        self, agent: Agent[Any], value: str | Sequence[TResponseInputItem], *, parallel: bool = False
    ) -> Verdict:
        gate = self.view(agent)
        query = run_query(value)
        if gate.in_shadow():  # decided in a worker thread: it outlives the run's event loop
            return drive(check_flow(gate, query))
        return await adrive(check_flow(gate, query, parallel=parallel))


def traced(verdict: Verdict, tripped: bool, handoff: str | None = None) -> None:
    d = verdict.decision
    data = {
        "decision_id": d.id, "action": d.action, "p": d.estimate.p, "degraded": d.degraded,
        "reason": d.reason, "target": d.target, "to": d.to, "route": d.route, "shadow": d.shadow,
        "tripped": tripped, "handoff": handoff,
    }  # fmt: skip
    with custom_span("capgate.decision", data=data):
        pass


def output(gate: Gate, verdict: Verdict, handoff: str | None = None) -> GuardrailFunctionOutput:
    """The guardrail's output: a blocking action trips the wire unless the run is handed off."""
    tripped = verdict.action in BLOCKING and handoff is None
    message = gate.block(verdict).message if tripped else None
    traced(verdict, tripped, handoff)
    return GuardrailFunctionOutput(CapabilityCheck(verdict.decision, message, handoff), tripped)


def coerce(gate: Gate | None, settings: GateOptions) -> Gate:
    if gate is None and "estimate_timeout_s" not in settings:
        settings = {**settings, "estimate_timeout_s": DEFAULT_ESTIMATE_TIMEOUT_S}
    made = Gate.coerce(gate, **settings)
    if made.on_block != "return":
        raise SettingsError(
            f"`on_block` must be 'return' for the Agents SDK guardrail (a block trips the wire, "
            f"raising InputGuardrailTripwireTriggered); got {made.on_block!r}"
        )
    return made
