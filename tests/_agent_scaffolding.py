"""LangChain and LangGraph agent scaffolding shared by the integration tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode


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


def gated_tool_graph(chat: Any, tool: Any, gate: Any, state: type[Any]) -> StateGraph[Any]:
    """``propose`` (the chat model proposes a ``tool`` call) -> ``tools`` (a ToolNode that asks the
    ``gate`` before each call) -> END; not compiled, so a test picks its checkpointer."""

    def propose(current: Any) -> dict[str, Any]:
        return {"messages": [chat.invoke(current["messages"])]}

    graph = StateGraph(state)
    graph.add_node("propose", propose)
    graph.add_node("tools", ToolNode([tool], wrap_tool_call=gate, awrap_tool_call=gate.acall))
    graph.add_edge(START, "propose")
    graph.add_edge("propose", "tools")
    graph.add_edge("tools", END)
    return graph
