"""A LangChain chat model over any capgate backend: :class:`CapgateChatModel`.

Use it to drive a LangChain agent (``create_agent``) with a local model through
:class:`~capgate.adapters.backends.transformers.TransformersBackend`, or any other capgate
backend; the :class:`~capgate.adapters.agents.langchain.CapabilityGate` middleware then gates it.

Install with ``pip install 'capgate[langchain]'``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from capgate.core.backend import AsyncBackend, Backend, ChatMessage, SamplingParams
from capgate.core.messages import chat_messages, content_text

__all__ = ["TOOLS_INSTRUCTION", "TOOL_ARGUMENT_PROMPT", "TOOL_RESULT_TEXT", "CapgateChatModel"]

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

TOOL_RESULT_TEXT = "Result of tool {name}: {result}"
"""How a tool's result reads in the prompt (small chat models know no ``tool`` role)."""

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

    Examples:
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

    @staticmethod
    def _prompt(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]] | None) -> list[ChatMessage]:
        chat: list[ChatMessage] = []
        for i, message in enumerate(messages):
            if isinstance(message, ToolMessage):
                text = TOOL_RESULT_TEXT.format(name=message.name, result=content_text(message.content))
                chat.append({"role": "user", "content": text})
                continue
            chat.extend(chat_messages([message], where=f"messages[{i}]"))
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
        text: str,
        calls: list[dict[str, Any]],
        prompt_tokens: int,
        completion_tokens: int,
        mean_logprob: float | None = None,
    ) -> ChatResult:
        usage = {
            "input_tokens": prompt_tokens,
            "output_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        # mean_logprob lets a resample weigh this response's vote (capgate.cas.LogprobConfidence)
        metadata = {} if mean_logprob is None else {"mean_logprob": mean_logprob}
        message = AIMessage(
            content="" if calls else text, tool_calls=calls, usage_metadata=usage, response_metadata=metadata
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _sample_sync(self, prompts: list[list[ChatMessage]], params: SamplingParams) -> list[Any]:
        if isinstance(self.backend, Backend):
            rows = self.backend.generate(prompts, params)
        elif isinstance(self.backend, AsyncBackend):
            rows = asyncio.run(self.backend.agenerate(prompts, params))
        else:
            raise TypeError(f"`backend` must be a capgate Backend or AsyncBackend; got {self.backend!r}")
        return [row[0] for row in rows]

    async def _sample_async(self, prompts: list[list[ChatMessage]], params: SamplingParams) -> list[Any]:
        if not isinstance(self.backend, AsyncBackend):
            return await asyncio.to_thread(self._sample_sync, prompts, params)
        rows = await self.backend.agenerate(prompts, params)
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
        return self._result(
            text, [parsed] if parsed else [], prompt_tokens, completion_tokens, gens[0].mean_logprob
        )

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
