"""Human in the loop, shared by the LangGraph and LangChain integrations: the interrupt schemas,
the texts shown to a model or a human, acting on a decision, tool-call queries, the tool-call gate.

Decisions and estimates travel through graph state as JSON dicts (``Decision.model_dump(mode="json")``);
a decision is self-contained (sampling plan, hand-off target, texts), so a graph resumed in a new
process acts on it with :func:`read_decision` alone, without the policy file. Requires
``langchain-core`` (installed with either extra, ``capgate[langgraph]`` or ``capgate[langchain]``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, Unpack

from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from pydantic import BaseModel, ConfigDict, Field, model_validator

from capgate.core.backend import ChatMessage
from capgate.core.messages import chat_messages, content_text, tool_call_text
from capgate.core.types import Decision
from capgate.gate import Gate, GateOptions, Verdict
from capgate.gate.flow import Assess, Flow, Invoke, Record, adrive, drive

__all__ = [
    "ESCALATION_REJECTED",
    "TOOL_ABSTAINED",
    "TOOL_CLARIFIED",
    "TOOL_REJECTED",
    "ClarifyRequest",
    "ClarifyResponse",
    "EscalationRequest",
    "EscalationResponse",
    "ToolCallGate",
    "ask_clarification",
    "ask_human",
    "ask_review",
    "decision_records",
    "read_decision",
    "review_reply",
    "tool_call_query",
]

_ResponseT = TypeVar("_ResponseT", bound=BaseModel)


TOOL_ABSTAINED = "The tool call {tool} was not run: {message}"
"""Tool result the model sees when the policy abstains on a tool call."""

TOOL_CLARIFIED = (
    "The tool call {tool} was not run. The user was asked: {question} The user answered: {answer}"
)
"""Tool result the model sees after the user answered a clarifying question about a tool call."""

TOOL_REJECTED = "A human reviewer rejected the tool call {tool}; it was not run.{reason}"
"""Tool result the model sees when a reviewer rejects an escalated tool call."""

ESCALATION_REJECTED = "A human reviewer declined to have this answered.{reason}"
"""Reply to the user when a reviewer rejects an escalated model step."""


def _reason(message: str | None) -> str:
    return f" Reason: {message}" if message else ""


class ClarifyRequest(BaseModel):
    """What an interrupt for a clarifying question carries (JSON in the interrupt's value).

    Attributes:
        kind: Always ``"clarify"``.
        question: The question to put to the user.
        decision: The decision (JSON) that asked for it.
        tool_call: The proposed tool call, when a tool call is being gated.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["clarify"] = "clarify"
    question: str
    decision: dict[str, Any]
    tool_call: dict[str, Any] | None = None


class ClarifyResponse(BaseModel):
    """The user's answer to a clarifying question: resume with ``Command(resume={"answer": ...})``.

    Attributes:
        answer: What the user said.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer: str = Field(min_length=1)


class EscalationRequest(BaseModel):
    """What an interrupt for a human hand-off carries (JSON in the interrupt's value).

    Attributes:
        kind: Always ``"escalate"``.
        summary: The hand-off note for the reviewer.
        to: Who should take it (the policy's ``to``), if set.
        decision: The decision (JSON) that escalated.
        query: The conversation (chat messages) the decision was made on.
        tool_call: The proposed tool call, when a tool call is being gated.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["escalate"] = "escalate"
    summary: str
    to: str | None = None
    decision: dict[str, Any]
    query: list[dict[str, Any]] | str
    tool_call: dict[str, Any] | None = None


class EscalationResponse(BaseModel):
    """The reviewer's verdict: resume with ``Command(resume={"decision": ..., ...})``.

    Attributes:
        decision: ``"reply"`` (the reviewer's ``message`` is the answer, or the tool's result),
            ``"approve"`` (let the model answer / run the tool), or ``"reject"`` (decline).
        message: The reply (required for ``reply``), or the reason for a rejection.
        reviewer: Who decided, for the record.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Literal["reply", "approve", "reject"]
    message: str | None = None
    reviewer: str | None = None

    @model_validator(mode="after")
    def _reply_has_message(self) -> EscalationResponse:
        if self.decision == "reply" and not self.message:
            raise ValueError("a 'reply' needs the reply text in `message`")
        return self


def ask_human(payload: BaseModel, schema: type[_ResponseT]) -> _ResponseT:
    """Pause the graph with ``payload`` (as JSON) until it resumes with a value valid for ``schema``.

    The schema is attached to the interrupt (LangGraph's ``response_schema``, where the installed
    version has it) so that clients can render a form; the resume value is validated either way.
    """
    from langgraph.types import interrupt

    value = payload.model_dump(mode="json")
    if "response_schema" in inspect.signature(interrupt).parameters:
        answer = interrupt(value, response_schema=schema)
    else:  # pragma: no cover - older langgraph
        answer = interrupt({**value, "response_schema": schema.model_json_schema()})
    return schema.model_validate(answer)


def ask_clarification(verdict: Verdict, *, tool_call: Mapping[str, Any] | None = None) -> ClarifyResponse:
    """Pause for the user's answer to the decision's clarifying question (an ``interrupt``)."""
    decision = verdict.decision
    request = ClarifyRequest(
        question=decision.text,
        decision=decision.model_dump(mode="json"),
        tool_call=dict(tool_call) if tool_call is not None else None,
    )
    return ask_human(request, ClarifyResponse)


def ask_review(verdict: Verdict, *, tool_call: Mapping[str, Any] | None = None) -> EscalationResponse:
    """Pause for a reviewer's verdict on an escalated decision (an ``interrupt``); the request
    carries the decision's summary and its hand-off target ``to``."""
    decision = verdict.decision
    request = EscalationRequest(
        summary=decision.text,
        to=decision.to,
        decision=decision.model_dump(mode="json"),
        query=verdict.query if isinstance(verdict.query, str) else [dict(m) for m in verdict.query],
        tool_call=dict(tool_call) if tool_call is not None else None,
    )
    return ask_human(request, EscalationResponse)


def review_reply(review: EscalationResponse) -> str:
    """What the user is told after a review that did not approve: the reply, or the rejection."""
    if review.decision == "reply":
        return review.message or ""
    return ESCALATION_REJECTED.format(reason=_reason(review.message))


def decision_records(verdict: Verdict) -> dict[str, Any]:
    """The estimate and the decision as JSON, under the state keys the integrations use."""
    return {
        "capgate_estimate": verdict.estimate.model_dump(mode="json"),
        "capgate_decision": verdict.decision.model_dump(mode="json"),
    }


def read_decision(value: Decision | Mapping[str, Any] | None) -> Decision | None:
    """A decision stored in graph state (a JSON dict) as a :class:`~capgate.Decision`."""
    if value is None or isinstance(value, Decision):
        return value
    return Decision.model_validate(value)


def tool_call_query(messages: Sequence[BaseMessage], call: Mapping[str, Any]) -> list[ChatMessage]:
    """The query for gating one proposed tool call: the conversation before the message that
    proposes it, then that message's text with only this call written out."""
    history = list(messages)
    proposer: BaseMessage | None = None
    call_id = call.get("id")
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, AIMessage) and any(c.get("id") == call_id for c in message.tool_calls):
            proposer = message
            history = history[:index]
            break
    query = chat_messages(history, where="messages")
    text = content_text(proposer.content) if proposer is not None else ""
    query.append(
        {"role": "assistant", "content": "\n".join([t for t in (text,) if t] + [tool_call_text(call)])}
    )
    return query


ToolResult = Any  # ToolMessage | Command
Execute = Callable[[Any], ToolResult]
AExecute = Callable[[Any], Awaitable[ToolResult]]


def state_value(state: Any, key: str, default: Any = None) -> Any:
    """``state[key]``: a mapping's item, else the attribute (a dataclass or Pydantic state, as
    LangGraph allows)."""
    return state.get(key, default) if isinstance(state, Mapping) else getattr(state, key, default)


class ToolCallGate:
    """Gate each proposed tool call before it runs: run it, ask the user, escalate for approval,
    or abstain, as the policy decides for that tool.

    Use it as LangGraph's ``ToolNode(tools, wrap_tool_call=g, awrap_tool_call=g.acall)``; the
    LangChain :class:`~capgate.adapters.agents.langchain.CapabilityGate` middleware uses it in
    ``wrap_tool_call``. The decision for a call is read from state (``decisions_key``, written when
    the call was proposed, e.g. by the middleware's ``wrap_model_call``) or, if absent, made here
    from the conversation plus the proposed call, with ``tool=`` the tool's name.

    * ``answer``: the tool runs.
    * ``abstain``: the tool does not run; the model gets :data:`TOOL_ABSTAINED`.
    * ``clarify``: an interrupt asks the user (:class:`ClarifyRequest` / :class:`ClarifyResponse`);
      the tool does not run and the model gets :data:`TOOL_CLARIFIED` with the answer.
    * ``escalate``: an interrupt asks a reviewer (:class:`EscalationRequest` /
      :class:`EscalationResponse`): ``approve`` runs the tool, ``reject`` returns
      :data:`TOOL_REJECTED`, ``reply`` returns the reviewer's text as the tool's result.
    * ``resample``: only the model can redraw a proposal, so a call the model step already chose
      by vote (recorded in state) runs; a resample decided here raises ``ValueError`` (gate tool
      calls where the model is called, with the middleware).

    A decision made here is remade, and logged again under a new id, when the graph resumes after
    an interrupt (LangGraph re-runs the node), so use a deterministic estimator (a probe) or store
    decisions in state first. In a ``ToolNode``, one message's tool calls run as one task: when a
    later call asks for review, the calls before it that ran are run again on resume. For tools
    with side effects, gate with the middleware (each tool call is its own task there).

    Args:
        gate: A ready gate (or give the settings instead); its policy's ``tools:`` overrides
            select per-tool rules.
        decisions_key: State key of the stored per-call decisions.
        messages_key: State key of the conversation.
        **settings: The gate settings (:class:`~capgate.gate.GateOptions`), as for
            :func:`capgate.guard`; ``tool`` is replaced by each call's tool name. ``on_block``
            ``"return"`` gives the model a tool result saying why the tool did not run;
            ``"raise"`` raises the matching :class:`~capgate.GateBlocked` instead.

    Raises:
        SettingsError: A bad setting, or ``gate=`` together with settings.
    """

    def __init__(
        self,
        *,
        gate: Gate | None = None,
        decisions_key: str = "capgate_tool_decisions",
        messages_key: str = "messages",
        **settings: Unpack[GateOptions],
    ) -> None:
        self.gate = Gate.coerce(gate, **settings)
        self.decisions_key = decisions_key
        self.messages_key = messages_key

    def __repr__(self) -> str:
        return f"ToolCallGate(gate={self.gate!r})"

    def _stored(self, request: Any) -> tuple[Decision, bool] | None:
        table = state_value(request.state, self.decisions_key) or {}
        record = table.get(request.tool_call["id"]) if isinstance(table, Mapping) else None
        if record is None:
            return None
        return Decision.model_validate(record["decision"]), bool(record.get("voted", False))

    def _query(self, request: Any) -> list[ChatMessage]:
        messages = state_value(request.state, self.messages_key) or []
        return tool_call_query(messages, request.tool_call)

    def _message(self, request: Any, content: str, *, status: Literal["success", "error"]) -> ToolMessage:
        call: ToolCall = request.tool_call
        return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"], status=status)

    def _act(self, request: Any, decision: Decision, voted: bool) -> ToolResult | None:
        """The result for a decision that needs no tool run, or ``None`` to run the tool."""
        call: ToolCall = request.tool_call
        tool = call["name"]
        if decision.action == "answer" or (decision.action == "resample" and voted):
            return None
        if decision.action == "route":
            raise ValueError(
                f"the policy chose 'route' for tool {tool!r}, but routing picks a model for a model "
                "step, not for a tool call; give this tool another action"
            )
        if decision.action == "resample":
            raise ValueError(
                f"the policy chose 'resample' for tool {tool!r}, but a tool node cannot redraw the "
                "model's proposal; gate tool calls with capgate.adapters.agents.langchain.CapabilityGate "
                "(which resamples in wrap_model_call) or give this tool another action"
            )
        verdict = Verdict(decision=decision, query=self._query(request))
        self.gate.block(verdict)  # raises with on_block="raise"
        if decision.action == "abstain":
            text = TOOL_ABSTAINED.format(tool=tool, message=decision.text)
            return self._message(request, text, status="error")
        if decision.action == "clarify":
            reply = ask_clarification(verdict, tool_call=call)
            text = TOOL_CLARIFIED.format(tool=tool, question=decision.text, answer=reply.answer)
            return self._message(request, text, status="error")
        review = ask_review(verdict, tool_call=call)
        if review.decision == "approve":
            return None
        if review.decision == "reply":
            return self._message(request, review.message or "", status="success")
        return self._message(
            request, TOOL_REJECTED.format(tool=tool, reason=_reason(review.message)), status="error"
        )

    def _flow(self, request: Any, execute: Invoke) -> Flow[ToolResult]:
        stored = self._stored(request)
        if stored is None:
            gate = self.gate.with_options(tool=request.tool_call["name"])
            verdict = yield Assess(gate, self._query(request))
            yield Record(gate, verdict, samples_used=0)
            stored = (verdict.decision, False)
        result = self._act(request, *stored)
        return (yield execute) if result is None else result

    def __call__(self, request: Any, execute: Execute) -> ToolResult:
        """Sync wrapper (LangGraph's ``wrap_tool_call`` signature)."""
        return drive(self._flow(request, Invoke(lambda: execute(request))))

    async def acall(self, request: Any, execute: AExecute) -> ToolResult:
        """Async wrapper (LangGraph's ``awrap_tool_call`` signature)."""
        return await adrive(self._flow(request, Invoke(lambda: execute(request))))


def record_tool_decisions(verdicts: Mapping[str, Verdict], *, voted: bool) -> dict[str, dict[str, Any]]:
    """Per-call decisions as stored in state under ``ToolCallGate.decisions_key``."""
    return {
        call_id: {"decision": v.decision.model_dump(mode="json"), "voted": voted}
        for call_id, v in verdicts.items()
    }
