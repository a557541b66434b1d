"""LangChain agent scaffolding shared by tests/test_langchain.py and tests/test_langchain_hooks.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage


def _tool_choice(request: ModelRequest[Any]) -> str:
    first = not any(isinstance(m, ToolMessage) for m in request.messages)
    return "lookup" if first else "none"


class ForceFirstTool(AgentMiddleware):
    """Require a ``lookup`` call on the first model step, none after a tool result (sync and async)."""

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> Any:
        return handler(request.override(tool_choice=_tool_choice(request)))

    async def awrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        return await handler(request.override(tool_choice=_tool_choice(request)))
