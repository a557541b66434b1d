"""LangChain 1.x integration: the :class:`CapabilityGate` middleware for ``create_agent``, and
:class:`CapgateChatModel`, a LangChain chat model over any capgate backend.

``CapabilityGate`` gates every model step of an agent by the model's predicted capability:

* ``before_model`` estimates the step (the conversation so far) and applies the policy:
  ``abstain`` ends the run (``jump_to: "end"``) with an AI message carrying the abstain text;
  ``clarify`` and ``escalate`` pause with ``interrupt()`` (a :class:`ClarifyRequest` /
  :class:`EscalationRequest`; resume with ``Command(resume=...)`` holding a
  :class:`ClarifyResponse` / :class:`EscalationResponse`). A clarification joins the conversation
  and the step is estimated again (up to ``max_clarifications`` rounds); an escalation's
  ``reply`` answers the user, ``approve`` lets the model answer, ``reject`` declines.
* ``wrap_model_call`` carries out ``resample``: the model handler is called repeatedly under CAS
  (each call one sample; text answers grouped by ``extract``, tool-call proposals by their exact
  calls) and the winning response is kept. It then gates each proposed tool call (the
  conversation plus the call is the query, ``tool=`` its name; a ``resample`` there redraws the
  proposal the same way) and stores the per-call decisions in state.
* ``wrap_tool_call`` acts on those decisions before a tool runs (:class:`ToolCallGate`): run it,
  ask the user, escalate for approval, or abstain.

Every hook has an async twin (``abefore_model``, ``awrap_model_call``, ``awrap_tool_call``).
Decisions are stored in state as JSON (``capgate_decision``, ``capgate_estimate``,
``capgate_tool_decisions``); ``middleware.gate.stats`` counts what the gate did.

Install with ``pip install 'capgate[langchain]'``.

Example:
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

import asyncio
import json
import re
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import ExtendedModelResponse, hook_config
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.types import Command
from pydantic import ConfigDict, Field

from capgate.adapters._agents import (
    ESCALATION_REJECTED,
    ClarifyRequest,
    ClarifyResponse,
    EscalationRequest,
    EscalationResponse,
    ToolCallGate,
    _escalate_to,
    _reason,
    ask_human,
    messages_to_query,
    read_decision,
    record_tool_decisions,
    tool_call_query,
)
from capgate.backend import AsyncBackend, Backend, ChatMessage, SamplingParams
from capgate.decision.log import DecisionLog, query_hash
from capgate.estimators.base import CapabilityEstimator
from capgate.gate import Extractor, Gate, PolicyLike, Verdict, default_extract

__all__ = [
    "TOOLS_INSTRUCTION",
    "TOOL_ARGUMENT_PROMPT",
    "CapabilityGate",
    "CapabilityGateState",
    "CapgateChatModel",
    "ClarifyRequest",
    "ClarifyResponse",
    "EscalationRequest",
    "EscalationResponse",
    "ToolCallGate",
]

_CALLS_PREFIX = "tool-calls:"


class CapabilityGateState(AgentState[Any]):
    """Agent state with the gate's records (JSON dicts; read with
    :func:`capgate.adapters.langgraph.read_decision`)."""

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


class CapabilityGate(AgentMiddleware[CapabilityGateState, Any]):
    """Gate an agent's model steps and tool calls by the model's predicted capability.

    Args:
        gate: A ready :class:`~capgate.gate.Gate` (or give ``policy`` / ``estimator`` / ...).
        policy: Policy, preset name or policy file path.
        estimator: The capability estimator.
        extract: Answer extractor for resample votes on text answers.
        log: Decision log (a DecisionLog or a path).
        step: Step name passed to the policy for model steps (its ``steps:`` override).
        gate_tools: Also gate proposed tool calls (``wrap_model_call`` decides, ``wrap_tool_call``
            acts).
        max_clarifications: Clarifying questions per model step before the question is put to
            the user as the agent's reply instead of another interrupt.

    Raises:
        ValueError: A setting has a wrong value (the message names it).
    """

    state_schema = CapabilityGateState

    def __init__(
        self,
        *,
        gate: Gate | None = None,
        policy: PolicyLike = "balanced",
        estimator: CapabilityEstimator | None = None,
        extract: Extractor | None = None,
        log: DecisionLog | str | Path | None = None,
        step: str | None = None,
        gate_tools: bool = True,
        max_clarifications: int = 2,
    ) -> None:
        super().__init__()
        if gate is not None:
            if not isinstance(gate, Gate):
                raise ValueError(f"`gate` must be a capgate Gate; got {gate!r}")
            if estimator is not None or extract is not None or log is not None or policy != "balanced":
                raise ValueError("pass either gate= or policy/estimator/extract/log, not both")
            self.gate = gate
        else:
            try:
                self.gate = Gate(policy=policy, estimator=estimator, extract=extract, log=log)
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        if step is not None and not (isinstance(step, str) and step):
            raise ValueError(f"`step` must be a non-empty string or None; got {step!r}")
        if not isinstance(gate_tools, bool):
            raise ValueError(f"`gate_tools` must be True or False; got {gate_tools!r}")
        if (
            isinstance(max_clarifications, bool)
            or not isinstance(max_clarifications, int)
            or max_clarifications < 0
        ):
            raise ValueError(
                f"`max_clarifications` must be a non-negative integer; got {max_clarifications!r}"
            )
        self.step = step
        self.gate_tools = gate_tools
        self.max_clarifications = max_clarifications
        self.tool_gate = ToolCallGate(self.gate)
        self._memo: OrderedDict[tuple[str | None, str], Verdict] = OrderedDict()

    # ------------------------------------------------------------------ shared logic (no I/O)

    @staticmethod
    def _thread() -> str | None:
        try:
            from langgraph.config import get_config

            value = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:
            return None
        return None if value is None else str(value)

    def _remembered(self, query: list[ChatMessage]) -> tuple[tuple[str | None, str], Verdict | None]:
        # LangGraph re-runs a node from its start when it resumes after an interrupt; reusing the
        # verdict keeps the decision (and its id) stable within this process.
        key = (self._thread(), query_hash(query))
        return key, self._memo.get(key)

    def _remember(self, key: tuple[str | None, str], verdict: Verdict) -> None:
        self._memo[key] = verdict
        self._memo.move_to_end(key)
        while len(self._memo) > 512:
            self._memo.popitem(last=False)

    def _records(self, verdict: Verdict) -> dict[str, Any]:
        return {
            "capgate_estimate": verdict.estimate.model_dump(mode="json"),
            "capgate_decision": verdict.decision.model_dump(mode="json"),
        }

    def _outcome(self, verdict: Verdict, added: list[BaseMessage]) -> dict[str, Any] | None:
        """The state update for a model-step verdict that needs no human (or ``None`` to go on)."""
        decision = verdict.decision
        update = self._records(verdict)
        if decision.action in ("answer", "resample"):
            if added:
                update["messages"] = added
            return update
        if decision.action == "abstain":
            update["messages"] = [*added, AIMessage(decision.message or decision.reason)]
            update["jump_to"] = "end"
            return update
        if decision.action == "clarify":  # out of clarification rounds: ask in the chat instead
            update["messages"] = [*added, AIMessage(decision.message or decision.reason)]
            update["jump_to"] = "end"
            return update
        return None

    def _escalated(
        self, verdict: Verdict, added: list[BaseMessage], review: EscalationResponse
    ) -> dict[str, Any]:
        update = self._records(verdict)
        update["capgate_human"] = review.model_dump(mode="json")
        if review.decision == "approve":
            if added:
                update["messages"] = added
            return update
        text = (
            review.message
            if review.decision == "reply"
            else ESCALATION_REJECTED.format(reason=_reason(review.message))
        )
        update["messages"] = [*added, AIMessage(text or "")]
        update["jump_to"] = "end"
        return update

    def _escalation(self, verdict: Verdict) -> EscalationRequest:
        decision = verdict.decision
        query = verdict.query
        return EscalationRequest(
            summary=decision.message or decision.reason,
            to=_escalate_to(self.gate, decision),
            decision=decision.model_dump(mode="json"),
            query=query if isinstance(query, str) else [dict(m) for m in query],
        )

    def _clarification(self, verdict: Verdict) -> tuple[str, ClarifyResponse]:
        decision = verdict.decision
        question = decision.message or decision.reason
        reply: ClarifyResponse = ask_human(
            ClarifyRequest(question=question, decision=decision.model_dump(mode="json")), ClarifyResponse
        )
        return question, reply

    # ------------------------------------------------------------------ before_model

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: CapabilityGateState, runtime: Any) -> dict[str, Any] | None:
        """Estimate the model step and apply the policy (sync)."""
        added: list[BaseMessage] = []
        for round_ in range(self.max_clarifications + 1):
            query = messages_to_query([*state["messages"], *added])
            key, verdict = self._remembered(query)
            if verdict is None:
                verdict = self.gate.assess(query, step=self.step)
                self.gate.record(verdict)
                self._remember(key, verdict)
            if verdict.action == "clarify" and round_ < self.max_clarifications:
                question, reply = self._clarification(verdict)
                added += [AIMessage(question), HumanMessage(reply.answer)]
                continue
            if verdict.action == "escalate":
                review: EscalationResponse = ask_human(self._escalation(verdict), EscalationResponse)
                return self._escalated(verdict, added, review)
            return self._outcome(verdict, added)
        raise AssertionError("unreachable")  # pragma: no cover

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: CapabilityGateState, runtime: Any) -> dict[str, Any] | None:
        """Async twin of :meth:`before_model` (uses the estimator's ``aestimate``)."""
        added: list[BaseMessage] = []
        for round_ in range(self.max_clarifications + 1):
            query = messages_to_query([*state["messages"], *added])
            key, verdict = self._remembered(query)
            if verdict is None:
                verdict = await self.gate.aassess(query, step=self.step)
                await self.gate.arecord(verdict)
                self._remember(key, verdict)
            if verdict.action == "clarify" and round_ < self.max_clarifications:
                question, reply = self._clarification(verdict)
                added += [AIMessage(question), HumanMessage(reply.answer)]
                continue
            if verdict.action == "escalate":
                review: EscalationResponse = ask_human(self._escalation(verdict), EscalationResponse)
                return self._escalated(verdict, added, review)
            return self._outcome(verdict, added)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ wrap_model_call

    def _extract(self, text: str) -> str | None:
        if text.startswith(_CALLS_PREFIX):
            return text
        return (self.gate.extract or default_extract)(text)

    def _step_verdict(self, request: ModelRequest[Any]) -> Verdict | None:
        decision = read_decision(cast("Mapping[str, Any] | None", request.state.get("capgate_decision")))
        if decision is None or decision.action != "resample":
            return None
        from capgate.adapters.langgraph import _plan

        return Verdict(
            decision=decision, query=messages_to_query(request.messages), plan=_plan(self.gate, decision)
        )

    def _tool_verdicts(self, request: ModelRequest[Any], message: AIMessage) -> dict[str, Verdict]:
        history = [*request.messages, message]
        return {
            call["id"] or "": self.gate.assess(tool_call_query(history, call), tool=call["name"])
            for call in message.tool_calls
        }

    async def _atool_verdicts(self, request: ModelRequest[Any], message: AIMessage) -> dict[str, Verdict]:
        history = [*request.messages, message]
        verdicts = await asyncio.gather(
            *(self.gate.aassess(tool_call_query(history, c), tool=c["name"]) for c in message.tool_calls)
        )
        return {call["id"] or "": v for call, v in zip(message.tool_calls, verdicts, strict=True)}

    def _finish(
        self, response: Any, verdicts: Mapping[str, Verdict], voted: bool
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        if not verdicts:
            return response  # type: ignore[no-any-return]
        model_response = response if isinstance(response, ModelResponse) else ModelResponse(result=[response])
        update = {"capgate_tool_decisions": record_tool_decisions(verdicts, voted=voted)}
        return ExtendedModelResponse(model_response=model_response, command=Command(update=update))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Resample the model step under CAS if the policy said so, then gate proposed tool calls."""
        voted = False
        step = self._step_verdict(request)
        if step is not None:
            sampled = self.gate.sample(
                lambda _: handler(request), step, extract=self._extract, to_text=_response_key
            )
            self.gate.record(step, samples_used=sampled.cas.samples_used)
            if sampled.value is None:
                gated = self.gate.block(step, on_block="return", cas=sampled.cas)
                return AIMessage(gated.message)
            response: Any = sampled.value
            voted = True
        else:
            response = handler(request)
        if not self.gate_tools:
            return response  # type: ignore[no-any-return]
        message = _response_message(response)
        if not message.tool_calls:
            return response  # type: ignore[no-any-return]
        verdicts = self._tool_verdicts(request, message)
        redraw = next((v for v in verdicts.values() if v.action == "resample"), None)
        if redraw is not None and not voted:
            sampled = self.gate.sample(
                lambda _: handler(request), redraw, extract=self._extract, to_text=_response_key
            )
            if sampled.value is not None:
                response, voted = sampled.value, True
                message = _response_message(response)
                verdicts = self._tool_verdicts(request, message) if message.tool_calls else {}
        for verdict in verdicts.values():
            self.gate.record(verdict, samples_used=0)
        return self._finish(response, verdicts, voted)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Async twin of :meth:`wrap_model_call` (the draws of one batch run concurrently)."""
        voted = False
        step = self._step_verdict(request)

        async def draw(_: object) -> Any:
            return await handler(request)

        if step is not None:
            sampled = await self.gate.asample(draw, step, extract=self._extract, to_text=_response_key)
            await self.gate.arecord(step, samples_used=sampled.cas.samples_used)
            if sampled.value is None:
                gated = self.gate.block(step, on_block="return", cas=sampled.cas)
                return AIMessage(gated.message)
            response: Any = sampled.value
            voted = True
        else:
            response = await handler(request)
        if not self.gate_tools:
            return response  # type: ignore[no-any-return]
        message = _response_message(response)
        if not message.tool_calls:
            return response  # type: ignore[no-any-return]
        verdicts = await self._atool_verdicts(request, message)
        redraw = next((v for v in verdicts.values() if v.action == "resample"), None)
        if redraw is not None and not voted:
            sampled = await self.gate.asample(draw, redraw, extract=self._extract, to_text=_response_key)
            if sampled.value is not None:
                response, voted = sampled.value, True
                message = _response_message(response)
                verdicts = await self._atool_verdicts(request, message) if message.tool_calls else {}
        for verdict in verdicts.values():
            await self.gate.arecord(verdict, samples_used=0)
        return self._finish(response, verdicts, voted)

    # ------------------------------------------------------------------ wrap_tool_call

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], ToolMessage | Command[Any]]) -> Any:
        """Act on the tool call's decision before it runs (see :class:`ToolCallGate`)."""
        if not self.gate_tools:
            return handler(request)
        return self.tool_gate(request, handler)

    async def awrap_tool_call(
        self, request: Any, handler: Callable[[Any], Awaitable[ToolMessage | Command[Any]]]
    ) -> Any:
        """Async twin of :meth:`wrap_tool_call`."""
        if not self.gate_tools:
            return await handler(request)
        return await self.tool_gate.acall(request, handler)


# =========================================================================== chat model

TOOLS_INSTRUCTION = (
    "You can call these tools:\n{tools}\n"
    'To call one, reply with only a JSON object on one line: {{"tool": "<name>", "args": {{...}}}}. '
    "Otherwise reply normally."
)
"""System text :class:`CapgateChatModel` adds when tools are bound (``{tools}``: their JSON schemas)."""

TOOL_ARGUMENT_PROMPT = (
    "{conversation}\n\nYou are calling the tool `{tool}` ({description}) to help with the request above. "
    "Reply with only the value of its argument `{name}`{about}, nothing else."
)
"""Prompt :class:`CapgateChatModel` uses to fill one argument of a forced tool call."""

_JSON_CALL = re.compile(r"\{.*\}", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class CapgateChatModel(BaseChatModel):
    """A LangChain chat model over any capgate :class:`~capgate.Backend` (or async backend).

    Messages become a capgate chat prompt (tool calls and tool results written out as text), one
    response is sampled with ``params``, and token usage is reported. Tools (``bind_tools``) are
    described in a system message and a reply of the form ``{"tool": ..., "args": {...}}`` becomes
    a tool call. A *forced* tool choice (a tool's name, or ``"any"`` / ``"required"`` for the
    first tool) does not trust the model to write JSON: each argument of the tool's schema is
    filled by its own generation (:data:`TOOL_ARGUMENT_PROMPT`; strings as written, numbers
    parsed), so small local models can drive tools too. ``tool_choice="none"`` hides the tools.

    Args:
        backend: The capgate backend (sync ``generate`` and/or async ``agenerate``).
        params: Sampling parameters for each call (``n`` is forced to 1).

    Example:
        >>> from capgate import Generation
        >>> class Echo:
        ...     model_id = "echo"
        ...     def generate(self, prompts, params):
        ...         return [[Generation(text="hi " + p[-1]["content"], n_tokens=2)] for p in prompts]
        >>> CapgateChatModel(backend=Echo()).invoke("there").content
        'hi there'
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: Any = Field(description="A capgate Backend or AsyncBackend.")
    params: SamplingParams = Field(default_factory=lambda: SamplingParams(temperature=0.7, max_tokens=256))

    @property
    def _llm_type(self) -> str:
        return "capgate"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_id": getattr(self.backend, "model_id", None), **self.params.model_dump()}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """Bind tools (OpenAI-style schemas are derived from any LangChain tool form)."""
        schemas = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=schemas, tool_choice=tool_choice, **kwargs)

    # ------------------------------------------------------------------ prompt building (no I/O)

    @staticmethod
    def _prompt(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] | None) -> list[ChatMessage]:
        chat: list[ChatMessage] = []
        for message in messages:
            if isinstance(message, ToolMessage):
                chat.append({"role": "user", "content": f"Result of tool {message.name}: {message.text}"})
                continue
            chat.extend(messages_to_query([message]))
        if tools:
            described = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
            chat.insert(0, {"role": "system", "content": TOOLS_INSTRUCTION.format(tools=described)})
        return chat

    def _sampling(self, stop: list[str] | None) -> SamplingParams:
        update: dict[str, Any] = {"n": 1}
        if stop:
            update["stop"] = tuple(stop)
        return self.params.model_copy(update=update)

    @staticmethod
    def _forced(tools: Sequence[dict[str, Any]], tool_choice: Any) -> dict[str, Any] | None:
        if not tools or tool_choice in (None, False, "auto", "none"):
            return None
        functions: list[dict[str, Any]] = [t.get("function", t) for t in tools]
        if tool_choice in (True, "any", "required"):
            return functions[0]
        name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else tool_choice
        for function in functions:
            if function.get("name") == name:
                return function
        raise ValueError(f"tool_choice names {name!r}, which is not a bound tool")

    @staticmethod
    def _argument_prompts(chat: list[ChatMessage], function: dict[str, Any]) -> list[tuple[str, str, str]]:
        conversation = "\n".join(f"{m['role']}: {m['content']}" for m in chat if m["role"] != "system")
        properties: dict[str, Any] = function.get("parameters", {}).get("properties", {})
        prompts = []
        for name, schema in properties.items():
            about = f" ({schema['description']})" if schema.get("description") else ""
            text = TOOL_ARGUMENT_PROMPT.format(
                conversation=conversation,
                tool=function["name"],
                description=function.get("description", ""),
                name=name,
                about=about,
            )
            prompts.append((name, str(schema.get("type", "string")), text))
        return prompts

    @staticmethod
    def _argument(kind: str, text: str) -> Any:
        value = text.strip().splitlines()[0].strip().strip("`\"'") if text.strip() else ""
        if kind in ("integer", "number"):
            found = _NUMBER.search(value)
            if found is None:
                return value
            number = float(found.group())
            return int(number) if kind == "integer" else number
        if kind == "boolean":
            return value.lower().startswith(("y", "t", "1"))
        return value

    @staticmethod
    def _parse_call(text: str, tools: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        found = _JSON_CALL.search(text)
        if not found or not tools:
            return None
        try:
            data = json.loads(found.group())
        except json.JSONDecodeError:
            return None
        names = {t.get("function", t).get("name") for t in tools}
        if isinstance(data, dict) and data.get("tool") in names and isinstance(data.get("args", {}), dict):
            return {"name": data["tool"], "args": data.get("args", {}), "id": f"call_{uuid.uuid4().hex[:12]}"}
        return None

    @staticmethod
    def _result(
        text: str, calls: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
    ) -> ChatResult:
        usage = {
            "input_tokens": prompt_tokens,
            "output_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        message = AIMessage(content="" if calls else text, tool_calls=calls, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message)])

    # ------------------------------------------------------------------ I/O

    def _sample_sync(self, prompts: list[list[ChatMessage]], params: SamplingParams) -> list[Any]:
        if isinstance(self.backend, Backend):
            rows = self.backend.generate(prompts, params)
        elif isinstance(self.backend, AsyncBackend):
            rows = asyncio.run(self.backend.agenerate(prompts, params))
        else:
            raise TypeError(f"`backend` must be a capgate Backend or AsyncBackend; got {self.backend!r}")
        return [row[0] for row in rows]

    async def _sample_async(self, prompts: list[list[ChatMessage]], params: SamplingParams) -> list[Any]:
        if isinstance(self.backend, AsyncBackend):
            rows = await self.backend.agenerate(prompts, params)
        else:
            rows = await asyncio.to_thread(self._sample_sync, prompts, params)
            return rows
        return [row[0] for row in rows]

    def _finish(
        self, chat: list[ChatMessage], tools: Sequence[dict[str, Any]], forced: Any, gens: list[Any]
    ) -> ChatResult:
        prompt_tokens = sum(g.prompt_tokens for g in gens)
        completion_tokens = sum(g.n_tokens for g in gens)
        if forced is not None:
            kinds = self._argument_prompts(chat, forced)
            args = {
                name: self._argument(kind, g.text) for (name, kind, _), g in zip(kinds, gens, strict=True)
            }
            call = {"name": forced["name"], "args": args, "id": f"call_{uuid.uuid4().hex[:12]}"}
            return self._result("", [call], prompt_tokens, completion_tokens)
        text = gens[0].text
        parsed = self._parse_call(text, tools)
        return self._result(text, [parsed] if parsed else [], prompt_tokens, completion_tokens)

    def _requests(
        self, messages: list[BaseMessage], kwargs: dict[str, Any]
    ) -> tuple[list[ChatMessage], list[dict[str, Any]], Any, list[list[ChatMessage]]]:
        tool_choice = kwargs.get("tool_choice")
        tools: list[dict[str, Any]] = [] if tool_choice == "none" else list(kwargs.get("tools") or [])
        forced = self._forced(tools, tool_choice)
        chat = self._prompt(messages, tools if forced is None else None)
        if forced is None:
            return chat, tools, None, [chat]
        prompts: list[list[ChatMessage]] = [
            [{"role": "user", "content": text}] for _, _, text in self._argument_prompts(chat, forced)
        ]
        return chat, tools, forced, prompts

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chat, tools, forced, prompts = self._requests(messages, kwargs)
        gens = self._sample_sync(prompts, self._sampling(stop)) if prompts else []
        return self._finish(chat, tools, forced, gens)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chat, tools, forced, prompts = self._requests(messages, kwargs)
        gens = await self._sample_async(prompts, self._sampling(stop)) if prompts else []
        return self._finish(chat, tools, forced, gens)
