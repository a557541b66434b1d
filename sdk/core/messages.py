"""Prompts and chat messages as capgate queries: the one place that normalizes them.

Every integration reads its query through :func:`as_query`: the decorator (a prompt argument),
the LangGraph nodes (graph state) and the LangChain middleware (an agent's messages). Messages may
be mappings (OpenAI style) or objects with ``role`` or ``type`` and ``content`` (LangChain
messages); proposed tool calls are written out as text (:data:`TOOL_CALL_TEXT`) so the capability
estimator sees them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from capgate.core.backend import ChatMessage, Prompt, as_messages
from capgate.errors import MessageError

__all__ = [
    "ROLES",
    "TOOL_CALL_TEXT",
    "as_query",
    "chat_messages",
    "content_text",
    "query_hash",
    "tool_call_text",
]

TOOL_CALL_TEXT = "Proposed tool call: {name}({args})"
"""How a proposed tool call reads in the query given to the capability estimator."""

ROLES: dict[str, str] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
}
"""Message roles (and LangChain message types) and the chat role each becomes."""


def content_text(content: object, where: str = "content") -> str:
    """The text of a message's content: a string, or the text parts of a list of content parts.

    Parts without text (images, audio) are left out; ``None`` (an OpenAI tool-call message) is
    empty text.

    Raises:
        MessageError: The content is neither text nor a list of parts; ``where`` names it.

    Examples:
        >>> content_text([{"type": "text", "text": "What is "}, "2+2?", {"type": "image_url"}])
        'What is 2+2?'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        texts: list[str] = []
        for part in content:
            text = part.get("text") if isinstance(part, Mapping) else part
            if isinstance(text, str):
                texts.append(text)
            elif not isinstance(part, Mapping):
                raise MessageError(f"{where}: message content must be text; got a {type(part).__name__} part")
        return "".join(texts)
    raise MessageError(f"{where}: message content must be text; got {type(content).__name__}")


def tool_call_text(call: Mapping[str, Any]) -> str:
    """One proposed tool call as text (:data:`TOOL_CALL_TEXT`), its arguments as sorted JSON.

    Examples:
        >>> tool_call_text({"name": "refund", "args": {"amount": 5}})
        'Proposed tool call: refund({"amount": 5})'
    """
    args = json.dumps(call.get("args", {}), ensure_ascii=False, sort_keys=True, default=str)
    return TOOL_CALL_TEXT.format(name=call.get("name", "?"), args=args)


def _message(item: object, where: str) -> ChatMessage:
    if isinstance(item, Mapping):
        role, content = item.get("role", item.get("type")), item.get("content")
        calls = item.get("tool_calls") or []
    else:
        role = getattr(item, "role", None) or getattr(item, "type", None)
        content = getattr(item, "content", None)
        calls = getattr(item, "tool_calls", None) or []
    mapped = ROLES.get(str(role)) if role is not None else None
    if mapped is None:
        raise MessageError(f"{where}: expected a chat message with a role in {sorted(ROLES)}; got {item!r}")
    text = content_text(content, where)
    if calls:
        text = "\n".join([t for t in (text,) if t] + [tool_call_text(c) for c in calls])
    return {"role": mapped, "content": text}  # type: ignore[typeddict-item]


def as_query(value: object, *, where: str = "query") -> Prompt:
    """Normalize a prompt to a capgate query: a string, or a list of ``{role, content}`` messages.

    ``human``/``ai`` roles map to ``user``/``assistant`` (:data:`ROLES`) and proposed tool calls
    are written out after the message's text.

    Raises:
        MessageError: Not a string or chat messages; ``where`` names the offending value.

    Examples:
        >>> as_query([{"role": "human", "content": "hi"}])
        [{'role': 'user', 'content': 'hi'}]
    """
    return value if isinstance(value, str) else chat_messages(value, where=where)


def chat_messages(value: object, *, where: str = "messages") -> list[ChatMessage]:
    """Like :func:`as_query`, always as chat messages (a string becomes one user message).

    Examples:
        >>> chat_messages("hi")
        [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [_message(item, f"{where}, message {i}") for i, item in enumerate(value)]
    raise MessageError(
        f"{where}: expected a prompt string or a list of chat messages; got {type(value).__name__}"
    )


def query_hash(query: Prompt) -> str:
    """SHA-256 (hex) of a query, as the decision log stores it.

    The query is normalized to chat messages first, so a bare string and the same text as a single
    user turn hash alike; the hash covers the whole transcript.

    Examples:
        >>> query_hash("hi") == query_hash([{"role": "user", "content": "hi"}])
        True
    """
    canonical = json.dumps(as_messages(query), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
