"""What the LangGraph and LangChain adapters share: human-in-the-loop schemas, the texts shown to
a model or a human, message conversion, tool-call queries and the tool-call gate.

Decisions and estimates travel through graph state as plain JSON dicts
(``Decision.model_dump(mode="json")``), so that any checkpointer stores them without a custom
serializer and a graph resumed in a new process reads them back with :func:`read_decision`.

Requires ``langchain-core`` (installed with either extra, ``capgate[langgraph]`` or
``capgate[langchain]``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from pydantic import BaseModel, ConfigDict, Field, model_validator

from capgate.backend import ChatMessage
from capgate.decision.types import Decision
from capgate.gate import Gate, Verdict

__all__ = [
    "ESCALATION_REJECTED",
    "TOOL_ABSTAINED",
    "TOOL_CALL_TEXT",
    "TOOL_CLARIFIED",
    "TOOL_REJECTED",
    "ClarifyRequest",
    "ClarifyResponse",
    "EscalationRequest",
    "EscalationResponse",
    "ToolCallGate",
    "ask_human",
    "messages_to_query",
    "read_decision",
    "tool_call_query",
]

# --------------------------------------------------------------------------- texts

TOOL_CALL_TEXT = "Proposed tool call: {name}({args})"
"""How a proposed tool call reads in the query given to the capability estimator."""

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


# --------------------------------------------------------------------------- human-in-the-loop


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


def _interrupt_supports_schema() -> bool:
    from langgraph.types import interrupt

    return "response_schema" in inspect.signature(interrupt).parameters


def ask_human(payload: BaseModel, schema: type[BaseModel]) -> Any:
    """Pause the graph with ``payload`` (as JSON) until it resumes with a value valid for ``schema``.

    The schema is attached to the interrupt (LangGraph's ``response_schema``, where the installed
    version has it) so that clients can render a form; the resume value is validated either way.
    """
    from langgraph.types import interrupt

    value = payload.model_dump(mode="json")
    if _interrupt_supports_schema():
        answer = interrupt(value, response_schema=schema)
    else:  # pragma: no cover - older langgraph
        answer = interrupt({**value, "response_schema": schema.model_json_schema()})
    return schema.model_validate(answer)


# --------------------------------------------------------------------------- messages and queries


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content if p is not None
        )
    return str(content)


def _call_text(call: Mapping[str, Any]) -> str:
    args = json.dumps(call.get("args", {}), ensure_ascii=False, sort_keys=True, default=str)
    return TOOL_CALL_TEXT.format(name=call.get("name", "?"), args=args)


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def messages_to_query(messages: Sequence[BaseMessage | Mapping[str, Any]]) -> list[ChatMessage]:
    """A conversation as a capgate query: ``{role, content}`` messages, tool calls written out.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> messages_to_query([HumanMessage("2+2?"), AIMessage("4")])
        [{'role': 'user', 'content': '2+2?'}, {'role': 'assistant', 'content': '4'}]
    """
    out: list[ChatMessage] = []
    for i, message in enumerate(messages):
        if isinstance(message, Mapping):
            role = str(message.get("role", message.get("type", "")))
            content = message.get("content", "")
            calls: Sequence[Mapping[str, Any]] = message.get("tool_calls") or []
        else:
            role = message.type
            content = message.content
            calls = message.tool_calls if isinstance(message, AIMessage) else []
        mapped = _ROLES.get(role, role)
        if mapped not in ("user", "assistant", "system", "tool"):
            raise TypeError(f"messages[{i}]: cannot turn a {role!r} message into a query")
        text = _text(content)
        if calls:
            text = "\n".join([t for t in (text,) if t] + [_call_text(c) for c in calls])
        out.append({"role": mapped, "content": text})  # type: ignore[typeddict-item]
    return out


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
    query = messages_to_query(history)
    text = _text(proposer.content) if proposer is not None else ""
    query.append({"role": "assistant", "content": "\n".join([t for t in (text,) if t] + [_call_text(call)])})
    return query


def read_decision(value: Decision | Mapping[str, Any] | None) -> Decision | None:
    """A decision stored in graph state (a JSON dict) as a :class:`~capgate.decision.Decision`."""
    if value is None or isinstance(value, Decision):
        return value
    return Decision.model_validate(value)


# --------------------------------------------------------------------------- gating tool calls

ToolResult = Any  # ToolMessage | Command
Execute = Callable[[Any], ToolResult]
AExecute = Callable[[Any], Awaitable[ToolResult]]


class ToolCallGate:
    """Gate each proposed tool call before it runs: run it, ask the user, escalate for approval,
    or abstain, as the policy decides for that tool.

    Use it as LangGraph's ``ToolNode(tools, wrap_tool_call=g, awrap_tool_call=g.acall)``; the
    LangChain :class:`~capgate.adapters.langchain.CapabilityGate` middleware uses it in
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

    A decision made here is remade when the graph resumes after an interrupt (LangGraph re-runs
    the node), so use a deterministic estimator (a probe) or store decisions in state first.

    Args:
        gate: The gate (its policy's ``tools:`` overrides select per-tool rules).
        decisions_key: State key of the stored per-call decisions.
        messages_key: State key of the conversation.
    """

    def __init__(
        self,
        gate: Gate,
        *,
        decisions_key: str = "capgate_tool_decisions",
        messages_key: str = "messages",
    ) -> None:
        if not isinstance(gate, Gate):
            raise TypeError(f"`gate` must be a capgate Gate; got {gate!r}")
        self.gate = gate
        self.decisions_key = decisions_key
        self.messages_key = messages_key

    def __repr__(self) -> str:
        return f"ToolCallGate({self.gate!r})"

    # ---------------------------------------------------------------- pure parts

    def _state(self, request: Any) -> Mapping[str, Any]:
        state = request.state
        if isinstance(state, Mapping):
            return state
        return dict(getattr(state, "__dict__", {}))

    def _stored(self, request: Any) -> tuple[Decision, bool] | None:
        table = self._state(request).get(self.decisions_key) or {}
        record = table.get(request.tool_call["id"]) if isinstance(table, Mapping) else None
        if record is None:
            return None
        return Decision.model_validate(record["decision"]), bool(record.get("voted", False))

    def _query(self, request: Any) -> list[ChatMessage]:
        messages = self._state(request).get(self.messages_key) or []
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
        if decision.action == "resample":
            raise ValueError(
                f"the policy chose 'resample' for tool {tool!r}, but a tool node cannot redraw the "
                "model's proposal; gate tool calls with capgate.adapters.langchain.CapabilityGate "
                "(which resamples in wrap_model_call) or give this tool another action"
            )
        message = decision.message or decision.reason
        if decision.action == "abstain":
            return self._message(request, TOOL_ABSTAINED.format(tool=tool, message=message), status="error")
        decision_json = decision.model_dump(mode="json")
        if decision.action == "clarify":
            reply: ClarifyResponse = ask_human(
                ClarifyRequest(question=message, decision=decision_json, tool_call=dict(call)),
                ClarifyResponse,
            )
            text = TOOL_CLARIFIED.format(tool=tool, question=message, answer=reply.answer)
            return self._message(request, text, status="error")
        review: EscalationResponse = ask_human(
            EscalationRequest(
                summary=message,
                to=_escalate_to(self.gate, decision),
                decision=decision_json,
                query=[dict(m) for m in self._query(request)],
                tool_call=dict(call),
            ),
            EscalationResponse,
        )
        if review.decision == "approve":
            return None
        if review.decision == "reply":
            return self._message(request, review.message or "", status="success")
        return self._message(
            request, TOOL_REJECTED.format(tool=tool, reason=_reason(review.message)), status="error"
        )

    # ---------------------------------------------------------------- I/O

    def __call__(self, request: Any, execute: Execute) -> ToolResult:
        """Sync wrapper (LangGraph's ``wrap_tool_call`` signature)."""
        stored = self._stored(request)
        if stored is None:
            verdict = self.gate.assess(self._query(request), tool=request.tool_call["name"])
            self.gate.record(verdict, samples_used=0)
            stored = (verdict.decision, False)
        result = self._act(request, *stored)
        return execute(request) if result is None else result

    async def acall(self, request: Any, execute: AExecute) -> ToolResult:
        """Async wrapper (LangGraph's ``awrap_tool_call`` signature)."""
        stored = self._stored(request)
        if stored is None:
            verdict = await self.gate.aassess(self._query(request), tool=request.tool_call["name"])
            await self.gate.arecord(verdict, samples_used=0)
            stored = (verdict.decision, False)
        result = self._act(request, *stored)
        return await execute(request) if result is None else result


def _escalate_to(gate: Gate, decision: Decision) -> str | None:
    """The ``to`` of the escalate action that made ``decision`` (its policy looked up by name)."""
    from capgate.policies import EscalateAction

    try:
        policy = gate.resolve_policy()
    except Exception:  # pragma: no cover - a policy that loaded once loads again
        return None
    if policy.name != decision.policy:
        return None
    spec = policy.match(decision.estimate, step=decision.step, tool=decision.tool).spec
    return spec.to if isinstance(spec, EscalateAction) else None


def record_tool_decisions(verdicts: Mapping[str, Verdict], *, voted: bool) -> dict[str, dict[str, Any]]:
    """Per-call decisions as stored in state under ``ToolCallGate.decisions_key``."""
    return {
        call_id: {"decision": v.decision.model_dump(mode="json"), "voted": voted}
        for call_id, v in verdicts.items()
    }
