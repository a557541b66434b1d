"""Scripted in-memory backends for estimator tests (no model, no network), and decisions to log.

The backends answer deterministically from the prompt text, so batching and one-by-one calls
agree, and record every call so tests can check what was asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from capgate.core.backend import Generation, Prompt, SamplingParams, TokenLogprob, as_messages
from capgate.core.types import Decision, Estimate

Respond = Callable[[str, SamplingParams], list[Generation] | Exception]


def decision(p: float, action: str = "answer", *, method: str = "probe", **fields: Any) -> Decision:
    """A decision on an estimate ``p`` of ``method`` (reason ``"r"``); ``fields``: the rest."""
    return Decision(action=action, estimate=Estimate(p=p, method=method), reason="r", **fields)


def last_user(prompt: Prompt) -> str:
    return [m for m in as_messages(prompt) if m["role"] == "user"][-1]["content"]


def gen(
    text: str, *, n_tokens: int = 3, prompt_tokens: int = 10, tokens: list[TokenLogprob] | None = None
) -> Generation:
    return Generation(text=text, n_tokens=n_tokens, prompt_tokens=prompt_tokens, tokens=tokens)


class ScriptedBackend:
    """A sync backend: ``respond(last user text, params)`` gives the samples or an exception."""

    model_id = "scripted"

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.calls: list[tuple[list[Prompt], SamplingParams]] = []

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append((list(prompts), params))
        out: list[list[Generation]] = []
        for prompt in prompts:
            got = self.respond(last_user(prompt), params)
            if isinstance(got, Exception):
                raise got
            out.append(got)
        return out

    @property
    def prompts_seen(self) -> list[Prompt]:
        return [p for prompts, _ in self.calls for p in prompts]


class AsyncScriptedBackend:
    """The same, async only (``agenerate``)."""

    model_id = "scripted-async"

    def __init__(self, respond: Respond) -> None:
        self.sync = ScriptedBackend(respond)

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        return self.sync.generate(prompts, params)

    @property
    def calls(self) -> list[tuple[list[Prompt], SamplingParams]]:
        return self.sync.calls


class CountingBackend:
    """Delegates to a real backend (sync only) and counts the calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def model_id(self) -> str:
        return str(self.inner.model_id)

    def generate(self, prompts: Sequence[Any], params: SamplingParams) -> list[list[Generation]]:
        self.calls += 1
        return self.inner.generate(prompts, params)  # type: ignore[no-any-return]


class AsyncCountingBackend(CountingBackend):
    """:class:`CountingBackend` with an ``agenerate`` (the sync call, in a thread), also counted."""

    async def agenerate(self, prompts: Sequence[Any], params: SamplingParams) -> list[list[Generation]]:
        self.calls += 1
        return await asyncio.to_thread(self.inner.generate, prompts, params)  # type: ignore[no-any-return]
