"""The backend interface: anything that can sample responses from a model.

Harvesting labels, estimators that query a model (verbalized, P(True), consistency) and the CAS
sampling loop all talk to a model only through :class:`Backend` (sync) or :class:`AsyncBackend`,
so they run unchanged on the local transformers backend, an OpenAI-compatible server or vLLM.
Implementations live in :mod:`capgate.adapters`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeAlias, TypedDict, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AsyncBackend",
    "Backend",
    "ChatMessage",
    "EndpointKind",
    "Generation",
    "Prompt",
    "SamplingParams",
    "TokenLogprob",
    "as_messages",
    "backend_endpoint",
]


class ChatMessage(TypedDict):
    """One chat message in OpenAI's shape."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


Prompt: TypeAlias = str | Sequence[ChatMessage]
"""A bare user prompt, or a full chat transcript."""


EndpointKind: TypeAlias = Literal["local", "openai", "vllm", "function", "other"]
"""How a backend reaches its model: a local transformers model, an OpenAI-compatible server,
vLLM's offline engine, a plain function, or something else."""


def backend_endpoint(backend: object) -> tuple[EndpointKind, str | None]:
    """How a backend reaches its model: the endpoint kind (its ``endpoint`` attribute, for capgate's
    own backends; else ``"other"``) and, for a server, its ``base_url``."""
    kind = getattr(backend, "endpoint", None)
    if kind in ("local", "openai", "vllm", "function"):
        url = getattr(backend, "base_url", None)
        return kind, url if isinstance(url, str) else None
    return "other", None


def as_messages(prompt: Prompt) -> list[ChatMessage]:
    """Normalize a prompt to a list of chat messages (a bare string becomes one user turn)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(prompt)


class SamplingParams(BaseModel):
    """How to sample. Mirrors the OpenAI chat-completions parameters of the same names.

    Attributes:
        n: Responses per prompt.
        temperature: Sampling temperature (0 = greedy).
        top_p: Nucleus sampling mass.
        max_tokens: Most tokens generated per response.
        seed: Seed for reproducible sampling where the backend supports it.
        logprobs: Return the log-probability of each generated token.
        top_logprobs: Also return this many alternatives per position (requires ``logprobs``).
        stop: Stop strings.
        json_schema: Ask for a reply that is JSON valid for this schema (structured output), where
            the backend supports it (an OpenAI-compatible server: ``response_format``); other
            backends sample free text, so callers still parse defensively.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(default=1, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    stop: tuple[str, ...] = ()
    json_schema: dict[str, Any] | None = None


class TokenLogprob(BaseModel):
    """A generated token, its log-probability and (optionally) the top alternatives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token: str
    logprob: float
    top: dict[str, float] = Field(default_factory=dict)


class Generation(BaseModel):
    """One sampled response.

    Attributes:
        text: The response text.
        n_tokens: Generated tokens.
        prompt_tokens: Tokens in the prompt (after the chat template).
        mean_logprob: Mean token log-probability, if the backend returned logprobs.
        tokens: Per-token log-probabilities, if requested.
        finish_reason: ``"stop"``, ``"length"``... as reported by the backend.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    n_tokens: int = Field(ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    mean_logprob: float | None = None
    tokens: list[TokenLogprob] | None = None
    finish_reason: str | None = None


@runtime_checkable
class Backend(Protocol):
    """A synchronous model backend."""

    @property
    def model_id(self) -> str:
        """Identifier of the served model (hub id, folder or server-side name)."""
        ...

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Sample ``params.n`` responses for each prompt; result ``[i]`` belongs to ``prompts[i]``."""
        ...


@runtime_checkable
class AsyncBackend(Protocol):
    """An asynchronous model backend (same contract as :class:`Backend`)."""

    @property
    def model_id(self) -> str:
        """Identifier of the served model."""
        ...

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Sample ``params.n`` responses for each prompt."""
        ...
