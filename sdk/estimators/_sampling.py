"""Plumbing for estimators that query a model through a backend.

An estimator's *plan* is a generator that yields :class:`Round` s and receives :class:`RoundResult` s,
then returns the estimates; :func:`run_steps` drives it with a sync backend and :func:`arun_steps`
with an async one, so the sync and async paths cannot drift apart. A failing request never sinks
the rest of a batch: the sync driver retries a failed batch one prompt at a time, the async driver
sends one call per prompt; the plan receives the exception itself.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from capgate._util.drive import adrive, drive
from capgate.core.backend import (
    AsyncBackend,
    Backend,
    ChatMessage,
    Generation,
    Prompt,
    SamplingParams,
    as_messages,
)
from capgate.core.types import Cost, Estimate

AnyBackend: TypeAlias = Backend | AsyncBackend
"""A backend with ``generate``, ``agenerate`` or both."""

PromptResult: TypeAlias = list[Generation] | BaseException
"""What one prompt of a round produced: its samples, or the error that stopped them."""


@dataclass(frozen=True)
class Round:
    """Prompts to sample in one go, all under the same parameters."""

    prompts: list[Prompt]
    params: SamplingParams


@dataclass(frozen=True)
class RoundResult:
    """The outcome of each prompt of a round (same order) and the round's wall-clock time."""

    outcomes: list[PromptResult]
    latency_s: float = 0.0


Steps: TypeAlias = Generator[Round, RoundResult, list[Estimate]]


def check_backend(backend: object) -> None:
    """Raise ``TypeError`` unless ``backend`` has ``generate`` or ``agenerate``."""
    if not (callable(getattr(backend, "generate", None)) or callable(getattr(backend, "agenerate", None))):
        raise TypeError(
            "backend must implement capgate.Backend (generate) or capgate.AsyncBackend (agenerate); "
            f"got {type(backend).__name__}"
        )


def describe_error(exc: BaseException) -> str:
    """One line naming an error: ``"BackendError: HTTP 500 from ... (after 3 attempts)"``."""
    return f"{type(exc).__name__}: {exc}"


def cost_of(samples: Sequence[Generation], latency_s: float = 0.0) -> Cost:
    """The cost of one request's samples: its prompt read once, every generated token, one call."""
    return Cost(
        prompt_tokens=max((g.prompt_tokens for g in samples), default=0),
        completion_tokens=sum(g.n_tokens for g in samples),
        calls=1,
        latency_s=latency_s,
    )


def wrap_last_user_turn(query: Prompt, render: Any) -> list[ChatMessage]:
    """The query's transcript up to its last user turn, that turn's text passed through ``render``
    (anything after it is dropped: the estimator asks its own question there)."""
    messages = as_messages(query)
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None:
        text = messages[-1]["content"] if messages else ""
        return [{"role": "user", "content": render(text)}]
    head = messages[:last]
    return [*head, {"role": "user", "content": render(messages[last]["content"])}]


def _check_shape(result: Any, n_prompts: int) -> list[PromptResult]:
    if not isinstance(result, list) or len(result) != n_prompts:
        got = len(result) if isinstance(result, list) else type(result).__name__
        raise TypeError(f"backend returned {got} results for {n_prompts} prompts")
    return list(result)


def _sync_generate(
    backend: AnyBackend, prompts: list[Prompt], params: SamplingParams
) -> list[Generation] | Any:
    generate = getattr(backend, "generate", None)
    if callable(generate):
        return generate(prompts, params)
    # An async-only backend: on a private loop in a worker thread (the caller may be in a loop).
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, backend.agenerate(prompts, params)).result()  # type: ignore[union-attr]


def sample_round(backend: AnyBackend, round_: Round) -> RoundResult:
    """Run one round on a sync (or async-only) backend, isolating failing prompts."""
    start = time.perf_counter()
    outcomes: list[PromptResult]
    try:
        outcomes = _check_shape(_sync_generate(backend, round_.prompts, round_.params), len(round_.prompts))
    except Exception as exc:
        if len(round_.prompts) == 1:
            outcomes = [exc]
        else:
            outcomes = []
            for prompt in round_.prompts:
                try:
                    outcomes.extend(_check_shape(_sync_generate(backend, [prompt], round_.params), 1))
                except Exception as one_exc:
                    outcomes.append(one_exc)
    return RoundResult(outcomes=outcomes, latency_s=time.perf_counter() - start)


async def asample_round(backend: AnyBackend, round_: Round) -> RoundResult:
    """Run one round on an async backend (one concurrent call per prompt) or a sync one in a thread."""
    start = time.perf_counter()
    agenerate = getattr(backend, "agenerate", None)
    if not callable(agenerate):
        result = await asyncio.to_thread(sample_round, backend, round_)
        return RoundResult(outcomes=result.outcomes, latency_s=time.perf_counter() - start)

    async def one(prompt: Prompt) -> list[Generation]:
        got = _check_shape(await agenerate([prompt], round_.params), 1)[0]
        if isinstance(got, BaseException):  # pragma: no cover - a backend returning errors as values
            raise got
        return got

    gathered = await asyncio.gather(*(one(p) for p in round_.prompts), return_exceptions=True)
    outcomes: list[PromptResult] = []
    for item in gathered:
        if isinstance(item, BaseException) and not isinstance(item, Exception):
            raise item  # cancellation and the like are not per-query failures
        outcomes.append(item)
    return RoundResult(outcomes=outcomes, latency_s=time.perf_counter() - start)


def run_steps(plan: Steps, backend: AnyBackend) -> list[Estimate]:
    """Drive a plan to completion with blocking calls."""
    return drive(plan, functools.partial(sample_round, backend))


async def arun_steps(plan: Steps, backend: AnyBackend) -> list[Estimate]:
    """Drive a plan to completion without blocking the event loop."""
    return await adrive(plan, functools.partial(asample_round, backend))


@dataclass
class QueryState:
    """Book-keeping of one query while a plan runs: cost so far, failures so far."""

    cost: Cost = field(default_factory=Cost)
    failures: list[str] = field(default_factory=list)
    note: str | None = None

    def add(self, samples: Sequence[Generation], latency_s: float) -> None:
        self.cost = self.cost + cost_of(samples, latency_s)

    def add_failed_call(self, latency_s: float) -> None:
        self.cost = self.cost + Cost(calls=1, latency_s=latency_s)


def failed_call_estimate(method: str, error: BaseException, latency_s: float) -> Estimate:
    """The unavailable estimate of a query whose single backend call failed (cost: one call)."""
    cost = Cost(calls=1, latency_s=latency_s)
    return Estimate.unavailable(method, f"backend error: {describe_error(error)}", cost=cost)
