"""LangChain 1.x integration: the :class:`CapabilityGate` middleware for ``create_agent``, beside
:class:`~capgate.adapters.agents.chat_model.CapgateChatModel` (a chat model over any capgate
backend) and the pieces for LangChain's own hooks (:mod:`capgate.adapters.agents.langchain_hooks`:
``CapabilityApproval``, ``CapgateDecisionModel``, ``choose_model_by_capability``).

``CapabilityGate`` gates every model step of an agent by the model's predicted capability:

* ``before_model`` estimates the step (the conversation so far) and applies the policy:
  ``abstain`` ends the run (``jump_to: "end"``) with the abstain text as an AI message;
  ``clarify`` and ``escalate`` pause with ``interrupt()`` (a ``ClarifyRequest`` /
  ``EscalationRequest`` of :mod:`capgate.adapters.agents.hitl`; resume with ``Command(resume=...)``
  holding a ``ClarifyResponse`` / ``EscalationResponse``). A clarification joins the conversation
  and the step is estimated again (up to ``max_clarifications`` rounds); an escalation's ``reply``
  answers the user, ``approve`` lets the model answer, ``reject`` declines.
* ``wrap_model_call`` carries out ``resample``: the model handler is called repeatedly under CAS
  (text answers grouped by ``extract``, tool-call proposals by their exact calls) and the winning
  response is kept. It then gates each proposed tool call (the conversation plus the call, with
  ``tool=`` its name; a ``resample`` there redraws the proposal the same way) and stores the
  per-call decisions in state.
* ``wrap_tool_call`` acts on those decisions before a tool runs
  (:class:`~capgate.adapters.agents.hitl.ToolCallGate`).

Every hook has an async twin (``abefore_model``, ``awrap_model_call``, ``awrap_tool_call``) driving
the same I/O-free flow. With ``on_block="raise"`` a blocked step raises the matching
:class:`~capgate.GateBlocked` instead. Decisions are stored in state as JSON (``capgate_decision``,
``capgate_estimate``, ``capgate_tool_decisions``); ``middleware.gate.stats`` counts what the gate
did. The agent's model (:func:`model_target`, read at its model calls; a step decided before the
first one is logged at that call) is each logged decision's ``target``, and an estimator of
another model is refused before the model is called, unless ``allow_other_target=True``.

Install with ``pip install 'capgate[langchain]'``.

Examples:
    >>> from langchain.agents import create_agent
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> from capgate import Estimate
    >>> from capgate.estimators import CapabilityEstimator
    >>> class Low(CapabilityEstimator):
    ...     method = "demo"
    ...     def estimate(self, queries):
    ...         return [Estimate(p=0.1, method=self.method) for _ in queries]
    >>> agent = create_agent(FakeListChatModel(responses=["unused"]),
    ...                      middleware=[CapabilityGate(estimator=Low())])
    >>> agent.invoke({"messages": [{"role": "user", "content": "Next week's lottery numbers?"}]}
    ...              )["messages"][-1].content
    "I can't answer this reliably (estimated chance of a correct answer: 10%)."
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NotRequired, Unpack, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import ExtendedModelResponse, hook_config
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from capgate._util.validate import check_int_at_least
from capgate.adapters.agents import hitl
from capgate.adapters.agents.chat_model import CapgateChatModel
from capgate.adapters.agents.langchain_hooks import (
    CapabilityApproval,
    CapabilityUnavailableError,
    CapgateDecisionModel,
    choose_model_by_capability,
)
from capgate.core.backend import ChatMessage
from capgate.core.messages import as_query, chat_messages, query_hash
from capgate.core.types import Decision, Extractor
from capgate.errors import SettingsError
from capgate.gate import Gate, GateOptions, GateStats, Verdict
from capgate.gate.flow import Assess, AssessEach, Flow, Invoke, Record, Sample, adrive, drive

__all__ = [
    "CapabilityApproval",
    "CapabilityGate",
    "CapabilityGateState",
    "CapabilityUnavailableError",
    "CapgateChatModel",
    "CapgateDecisionModel",
    "choose_model_by_capability",
    "model_target",
]

_CALLS_PREFIX = "tool-calls:"
_CALLS_MODEL = ("answer", "resample", "route")  # step actions the model call carries out

ModelResult = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]


class CapabilityGateState(AgentState[Any]):
    """Agent state with the gate's records (JSON dicts; read with
    :func:`capgate.adapters.agents.langgraph.read_decision`)."""

    capgate_estimate: NotRequired[dict[str, Any] | None]
    capgate_decision: NotRequired[dict[str, Any] | None]
    capgate_tool_decisions: NotRequired[dict[str, dict[str, Any]]]
    capgate_human: NotRequired[dict[str, Any] | None]


def _response_message(response: Any) -> AIMessage:
    result = response.result if isinstance(response, ModelResponse) else [response]
    for message in reversed(result):
        if isinstance(message, AIMessage):
            return message
    raise TypeError(f"the model handler returned no AI message: {response!r}")


def _response_key(response: Any) -> str:
    """What a model response votes as: its exact tool calls, or its text."""
    message = _response_message(response)
    if message.tool_calls:
        calls = [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]
        return _CALLS_PREFIX + json.dumps(calls, sort_keys=True, ensure_ascii=False, default=str)
    return (
        message.text if hasattr(message, "text") and isinstance(message.text, str) else str(message.content)
    )


def model_target(model: Any) -> str | None:
    """The model a LangChain chat model calls: a ``CapgateChatModel``'s backend ``model_id``, else
    the model's ``model_name`` / ``model`` (``ChatOpenAI``...); ``None`` when it has none."""
    name = getattr(model.backend, "model_id", None) if isinstance(model, CapgateChatModel) else None
    name = name or getattr(model, "model_name", None) or getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


def _voting_extract(extract: Extractor) -> Extractor:
    """``extract`` for text answers; a tool-call proposal votes as its exact calls."""

    def vote(text: str) -> str | None:
        return text if text.startswith(_CALLS_PREFIX) else extract(text)

    return vote


class CapabilityGate(AgentMiddleware[CapabilityGateState, Any]):
    """Gate an agent's model steps and tool calls by the model's predicted capability.

    Args:
        gate: A ready :class:`~capgate.Gate` (or give the settings instead).
        gate_tools: Also gate proposed tool calls (``wrap_model_call`` decides, ``wrap_tool_call``
            acts).
        max_clarifications: Clarifying questions per model step before the question is put to
            the user as the agent's reply instead of another interrupt.
        models: The chat model of each model choice, for a policy that routes (``route``): a
            routed step calls the chosen choice's model (the gate's ``routes`` estimate them).
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`), as for
            :func:`capgate.guard`: ``policy``, ``estimator``, ``step`` and ``tool`` (passed to the
            policy for model steps; tool calls are gated with their own names), ``on_block``
            (``"return"``: the agent replies with the message or pauses with an interrupt;
            ``"raise"``: a :class:`~capgate.GateBlocked`), ``log``, ``extract`` (for votes on
            text answers).

    Raises:
        SettingsError: A setting has a wrong value (the message names it); it is a ``ValueError``.
    """

    state_schema = CapabilityGateState

    def __init__(
        self,
        *,
        gate: Gate | None = None,
        gate_tools: bool = True,
        max_clarifications: int = 2,
        models: Mapping[str, Any] | None = None,
        **settings: Unpack[GateOptions],
    ) -> None:
        super().__init__()
        self.gate = Gate.coerce(gate, **settings)
        self.models = dict(models) if models is not None else {}
        if not isinstance(gate_tools, bool):
            raise SettingsError(f"`gate_tools` must be True or False; got {gate_tools!r}")
        try:
            clarifications = check_int_at_least(
                "max_clarifications", max_clarifications, 0, "a non-negative integer"
            )
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        self.gate_tools = gate_tools
        self.max_clarifications = clarifications
        self.tool_gate = hitl.ToolCallGate(gate=self.gate)
        self._voter = self.gate.with_options(extract=_voting_extract(self.gate.extract))
        self._memo: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._views: dict[str, Gate] = {}
        self._target: str | None = None  # the agent's model, read at its first model call
        self._unlogged: OrderedDict[str, Verdict] = OrderedDict()  # logged at the model call

    def _targeted(self) -> Gate:
        """The gate for the agent's model (its target checked against the estimator's), once a
        model call has shown it; a ``target=`` setting wins."""
        target = self._target
        if target is None or self.gate.settings.target is not None:
            return self.gate
        if target not in self._views:
            self._views[target] = self.gate.with_options(target=target)
        return self._views[target]

    def _see(self, request: ModelRequest[Any]) -> None:
        """Read the agent's model from a model call; an estimator of another model is refused
        before the model is called (``SettingsError``, as for ``guard``)."""
        self._target = model_target(request.model) or self._target
        self._targeted()

    def _stamped(self, verdict: Verdict) -> Verdict:
        """A step verdict decided before the model was known, with the model as its target."""
        gate = self._targeted()
        if verdict.decision.target is not None or gate.settings.target is None:
            return verdict
        target, override = gate.settings.target_check(gate.resolve_estimator())
        update = {"target": target, "target_override": override}
        return Verdict(decision=verdict.decision.model_copy(update=update), query=verdict.query)

    @property
    def stats(self) -> GateStats:
        """What the gate has done so far (model steps and tool calls)."""
        return self.gate.stats

    @staticmethod
    def _thread() -> str | None:
        try:
            from langgraph.config import get_config

            value = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:
            return None
        return None if value is None else str(value)

    def _remembered(self, query: list[ChatMessage]) -> tuple[tuple[str, str] | None, Verdict | None]:
        # LangGraph re-runs a node from its start when it resumes after an interrupt; reusing the
        # verdict keeps the decision (and its id) stable within this process. Only a run on a thread
        # can resume, and the memo keeps only the verdicts of a step paused by an interrupt.
        thread = self._thread()
        if thread is None:
            return None, None
        key = (thread, query_hash(query))
        return key, self._memo.get(key)

    def _remember(self, key: tuple[str, str] | None, verdict: Verdict) -> None:
        if key is None:
            return
        self._memo[key] = verdict
        self._memo.move_to_end(key)
        while len(self._memo) > 512:
            self._memo.popitem(last=False)

    def _outcome(
        self, verdict: Verdict, added: list[BaseMessage], review: hitl.EscalationResponse | None = None
    ) -> dict[str, Any]:
        """The state update for a model-step verdict (and the reviewer's ``review`` of an escalation)."""
        update = hitl.decision_records(verdict)
        reply = None
        if review is not None:
            update["capgate_human"] = review.model_dump(mode="json")
            reply = None if review.decision == "approve" else hitl.review_reply(review)
        elif verdict.action in ("abstain", "clarify"):  # clarify: out of rounds, ask in the chat
            reply = self.gate.block(verdict).message
        if reply is not None:
            update["messages"] = [*added, AIMessage(reply)]
            update["jump_to"] = "end"
        elif added:
            update["messages"] = added
        return update

    def _before_model_flow(self, state: CapabilityGateState) -> Flow[dict[str, Any] | None]:
        keys: list[tuple[str, str]] = []
        try:
            return (yield from self._step_flow(state, keys))
        except GraphInterrupt:
            keys.clear()  # paused: the step re-runs on resume and takes these verdicts again
            raise
        finally:
            for key in keys:  # the step is over: a later run of the same question is decided anew
                self._memo.pop(key, None)

    def _step_flow(
        self, state: CapabilityGateState, keys: list[tuple[str, str]]
    ) -> Flow[dict[str, Any] | None]:
        added: list[BaseMessage] = []
        for round_ in range(self.max_clarifications + 1):
            query = chat_messages([*state["messages"], *added], where="messages")
            key, verdict = self._remembered(query)
            keys += [key] if key is not None else []
            if verdict is None:
                verdict = yield Assess(self._targeted(), query)
                if self._target is None and verdict.pending is None and verdict.action in _CALLS_MODEL:
                    self._unlogged[verdict.decision.id] = verdict  # the model call shows the target
                    while len(self._unlogged) > 512:
                        yield Record(self.gate, self._unlogged.popitem(last=False)[1])
                if verdict.decision.id not in self._unlogged:
                    yield Record(self.gate, verdict)
                self._remember(key, verdict)
            if verdict.action == "clarify" and round_ < self.max_clarifications:
                question = self.gate.block(verdict).message  # raises with on_block="raise"
                reply = hitl.ask_clarification(verdict)
                added += [AIMessage(question), HumanMessage(reply.answer)]
                continue
            if verdict.action == "escalate":
                self.gate.block(verdict)
                return self._outcome(verdict, added, hitl.ask_review(verdict))
            return self._outcome(verdict, added)
        raise AssertionError("unreachable")  # pragma: no cover

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: CapabilityGateState, runtime: Any) -> dict[str, Any] | None:
        """Estimate the model step and apply the policy (sync)."""
        return drive(self._before_model_flow(state))

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: CapabilityGateState, runtime: Any) -> dict[str, Any] | None:
        """Async twin of :meth:`before_model` (uses the estimator's ``aestimate``)."""
        return await adrive(self._before_model_flow(state))

    def _step_verdict(self, request: ModelRequest[Any], decision: Decision | None) -> Verdict | None:
        if decision is None or decision.action != "resample":
            return None
        return self._stamped(Verdict(decision=decision, query=as_query(request.messages, where="messages")))

    def _tool_assessments(self, request: ModelRequest[Any], message: AIMessage) -> AssessEach:
        history = [*request.messages, message]
        return AssessEach(
            [
                (self._targeted().with_options(tool=c["name"]), hitl.tool_call_query(history, c))
                for c in message.tool_calls
            ]
        )

    def _finish(
        self, response: Any, verdicts: Mapping[str, Verdict], voted: bool, stamped: Verdict | None
    ) -> ModelResult:
        update: dict[str, Any] = {}
        if verdicts:
            update["capgate_tool_decisions"] = hitl.record_tool_decisions(verdicts, voted=voted)
        if stamped is not None:  # the step's decision, now with the model it was made for
            update["capgate_decision"] = stamped.decision.model_dump(mode="json")
        if not update:
            return response  # type: ignore[no-any-return]
        model_response = response if isinstance(response, ModelResponse) else ModelResponse(result=[response])
        return ExtendedModelResponse(model_response=model_response, command=Command(update=update))

    def _restamped(self, stored: Decision | None, verdict: Verdict) -> Verdict | None:
        """``verdict`` if stamping gave the step's stored decision its target (state and stats then
        show it too, from the agent's first run on), else ``None``."""
        if stored is None or stored.id != verdict.decision.id or stored.target == verdict.decision.target:
            return None
        stats = self.gate.stats
        if stats.last_decision is not None and stats.last_decision.id == verdict.decision.id:
            stats.last_decision = verdict.decision
        return verdict

    def _model_call_flow(
        self, request: ModelRequest[Any], stored: Decision | None, draw: Invoke
    ) -> Flow[ModelResult]:
        voted = False
        step = self._step_verdict(request, stored)
        unlogged = self._unlogged.pop(stored.id, None) if stored is not None else None
        stamped = None if step is None else self._restamped(stored, step)
        if unlogged is not None and step is None:  # a resample is logged with its samples below
            made = self._stamped(unlogged)
            stamped = self._restamped(stored, made)
            yield Record(self.gate, made)
        if step is not None:
            try:
                sampled = yield Sample(self._voter, step, draw, to_text=_response_key)
            except BaseException:
                if unlogged is not None:  # not logged when it was decided: log it without its samples
                    yield Record(self.gate, step)
                raise
            yield Record(self.gate, step, cas=sampled.cas)
            if sampled.value is None:
                return AIMessage(self.gate.block(step, cas=sampled.cas).message)
            response: Any = sampled.value
            voted = True
        else:
            response = yield draw
        message = _response_message(response) if self.gate_tools else None
        if message is None or not message.tool_calls:
            return self._finish(response, {}, voted, stamped)
        ids = [c["id"] or "" for c in message.tool_calls]
        verdicts = dict(zip(ids, (yield self._tool_assessments(request, message)), strict=True))
        redraw = next((v for v in verdicts.values() if v.action == "resample"), None)
        if redraw is not None and not voted:
            sampled = yield Sample(self._voter, redraw, draw, to_text=_response_key)
            if sampled.value is not None:
                response, voted = sampled.value, True
                message = _response_message(response)
                ids = [c["id"] or "" for c in message.tool_calls]
                found = (yield self._tool_assessments(request, message)) if message.tool_calls else []
                verdicts = dict(zip(ids, found, strict=True))
        for verdict in verdicts.values():
            yield Record(self.gate, verdict, samples_used=0)
        return self._finish(response, verdicts, voted, stamped)

    def _routed(self, request: ModelRequest[Any]) -> tuple[ModelRequest[Any], Decision | None]:
        """The step's stored decision, and the request with the chosen model when it routed it."""
        decision = hitl.read_decision(cast("Mapping[str, Any] | None", request.state.get("capgate_decision")))
        if decision is None or decision.route is None:
            return request, decision
        if decision.route not in self.models:
            raise SettingsError(
                f"the policy routed this step to model choice {decision.route!r}, but the middleware "
                f"has no chat model for it; pass models={{name: chat_model}} (has: {list(self.models)})"
            )
        return request.override(model=self.models[decision.route]), decision

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResult:
        """Resample the model step under CAS if the policy said so, then gate proposed tool calls."""
        self._see(request)
        request, stored = self._routed(request)
        return drive(self._model_call_flow(request, stored, Invoke(lambda: handler(request))))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResult:
        """Async twin of :meth:`wrap_model_call` (the draws of one batch run concurrently)."""
        self._see(request)
        request, stored = self._routed(request)
        return await adrive(self._model_call_flow(request, stored, Invoke(lambda: handler(request))))

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], ToolMessage | Command[Any]]) -> Any:
        """Act on the tool call's decision before it runs (see ``hitl.ToolCallGate``)."""
        return self.tool_gate(request, handler) if self.gate_tools else handler(request)

    async def awrap_tool_call(
        self, request: Any, handler: Callable[[Any], Awaitable[ToolMessage | Command[Any]]]
    ) -> Any:
        """Async twin of :meth:`wrap_tool_call`."""
        return await self.tool_gate.acall(request, handler) if self.gate_tools else await handler(request)
