"""The OpenAI wire format without I/O: request arguments out, :class:`~capgate.Generation` s in,
written once for :class:`~capgate.adapters.backends.openai.OpenAIBackend`'s sync and async paths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from capgate.adapters.backends._usage import logaddexp as _logaddexp
from capgate.adapters.backends._usage import split_tokens as _split_tokens
from capgate.core.backend import ChatMessage, Generation, SamplingParams, TokenLogprob
from capgate.errors import BackendError

ApiKind: TypeAlias = Literal["chat", "responses"]
"""Which OpenAI API to call: chat completions (primary) or Responses."""


@dataclass(frozen=True)
class Job:
    """One HTTP request to make: ``n`` samples for prompt ``index``."""

    index: int
    kwargs: dict[str, Any]
    n: int
    max_tokens: int | None = None


def make_request(
    messages: Sequence[ChatMessage],
    params: SamplingParams,
    *,
    model: str,
    api: ApiKind,
    timeout: float,
    extra_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The keyword arguments of one request (see ``OpenAIBackend.build_request``).

    Raises:
        ValueError: ``stop`` was given with the Responses API, which cannot honour it.
    """
    want_logprobs = params.logprobs or params.top_logprobs > 0
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    kwargs: dict[str, Any] = {"model": model, "timeout": timeout}
    if api == "chat":
        kwargs.update(
            messages=msgs,
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_completion_tokens=params.max_tokens,
        )
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if want_logprobs:
            kwargs["logprobs"] = True
            if params.top_logprobs:
                kwargs["top_logprobs"] = params.top_logprobs
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.json_schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "capgate_reply", "schema": params.json_schema, "strict": True},
            }
    else:
        if params.stop:
            raise ValueError("the Responses API has no `stop`; use api='chat' to stop on strings")
        kwargs.update(
            input=msgs,
            temperature=params.temperature,
            top_p=params.top_p,
            max_output_tokens=params.max_tokens,
        )
        if want_logprobs:
            kwargs["include"] = ["message.output_text.logprobs"]
            kwargs["top_logprobs"] = params.top_logprobs
        if params.json_schema is not None:
            kwargs["text"] = {
                "format": {"type": "json_schema", "name": "capgate_reply", "schema": params.json_schema}
            }
    if extra_body:
        kwargs["extra_body"] = dict(extra_body)
    return kwargs


def assemble(
    n_prompts: int, jobs: Sequence[Job], results: Sequence[list[Generation]]
) -> list[list[Generation]]:
    """The generations of each prompt, in order, from the results of its jobs."""
    out: list[list[Generation]] = [[] for _ in range(n_prompts)]
    for job, gens in zip(jobs, results, strict=True):
        out[job.index].extend(gens)
    return out


def raise_first(outcomes: Sequence[list[Generation] | BaseException]) -> list[list[Generation]]:
    """The jobs' results, or the first job's error raised."""
    results: list[list[Generation]] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return results


def read_response(
    response: Any, n: int, *, api: ApiKind, where: str, max_tokens: int | None = None
) -> list[Generation]:
    """Turn one SDK response object into ``n`` :class:`Generation` s (see ``OpenAIBackend.parse_response``).

    Raises:
        BackendError: The response is malformed (no choices, wrong count, missing fields).
    """
    try:
        if api == "chat":
            gens = _parse_chat(response, max_tokens, where)
        else:
            gens = _parse_responses(response, max_tokens)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise BackendError(f"malformed response from {where}: {type(exc).__name__}: {exc}") from exc
    if len(gens) != n:
        raise BackendError(f"malformed response from {where}: asked for {n} samples, got {len(gens)}")
    return gens


def _usage(usage: Any, prompt_field: str, completion_field: str) -> tuple[int | None, int | None]:
    """The (prompt, completion) token counts a response reports, ``None`` where missing."""
    p = getattr(usage, prompt_field, None)
    c = getattr(usage, completion_field, None)
    return (p if isinstance(p, int) else None, c if isinstance(c, int) else None)


def _tokens(items: Any) -> list[TokenLogprob] | None:
    if not items:
        return None
    tokens: list[TokenLogprob] = []
    for item in items:
        top: dict[str, float] = {}
        for alt in getattr(item, "top_logprobs", None) or []:
            # Two token ids can decode to the same text: their probabilities add up.
            prev = top.get(alt.token)
            top[alt.token] = float(alt.logprob) if prev is None else _logaddexp(prev, float(alt.logprob))
        tokens.append(TokenLogprob(token=str(item.token), logprob=float(item.logprob), top=top))
    return tokens


def _mean_logprob(tokens: list[TokenLogprob] | None) -> float | None:
    if not tokens:
        return None
    finite = [max(t.logprob, -1e4) for t in tokens]
    return sum(finite) / len(finite)


def _generations(
    texts: list[str],
    tokens: list[list[TokenLogprob] | None],
    finish: list[str | None],
    usage: tuple[int | None, int | None],
    max_tokens: int | None,
) -> list[Generation]:
    prompt_tokens, completion_tokens = usage
    counts: list[int]
    if all(t is not None for t in tokens):
        counts = [len(t or []) for t in tokens]
    elif completion_tokens is not None:
        # Without logprobs the server reports only the total over all samples.
        counts = _split_tokens(completion_tokens, texts, finish, max_tokens)
    else:
        counts = [0] * len(texts)
    return [
        Generation(
            text=text,
            n_tokens=count,
            prompt_tokens=prompt_tokens or 0,
            mean_logprob=_mean_logprob(toks),
            tokens=toks,
            finish_reason=fin,
        )
        for text, toks, fin, count in zip(texts, tokens, finish, counts, strict=True)
    ]


def _parse_chat(response: Any, max_tokens: int | None, where: str) -> list[Generation]:
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise BackendError(f"malformed response from {where}: no choices in {str(response)[:200]!r}")
    ordered = sorted(choices, key=lambda c: getattr(c, "index", 0) or 0)
    texts: list[str] = []
    tokens: list[list[TokenLogprob] | None] = []
    finish: list[str | None] = []
    for choice in ordered:
        content = choice.message.content
        if content is not None and not isinstance(content, str):
            raise TypeError(f"message.content is {type(content).__name__}, expected a string")
        texts.append(content or "")
        logprobs = getattr(choice, "logprobs", None)
        tokens.append(_tokens(getattr(logprobs, "content", None)) if logprobs is not None else None)
        finish.append(getattr(choice, "finish_reason", None))
    usage = _usage(getattr(response, "usage", None), "prompt_tokens", "completion_tokens")
    return _generations(texts, tokens, finish, usage, max_tokens)


def _parse_responses(response: Any, max_tokens: int | None) -> list[Generation]:
    text = response.output_text
    if not isinstance(text, str):
        raise TypeError(f"output_text is {type(text).__name__}, expected a string")
    items: list[Any] = []
    for output in getattr(response, "output", None) or []:
        for part in getattr(output, "content", None) or []:
            items.extend(getattr(part, "logprobs", None) or [])
    status = getattr(response, "status", None)
    details = getattr(response, "incomplete_details", None)
    fin = (
        "length"
        if getattr(details, "reason", None) == "max_output_tokens"
        else ("stop" if status == "completed" else status)
    )
    usage = _usage(getattr(response, "usage", None), "input_tokens", "output_tokens")
    return _generations([text], [_tokens(items)], [fin], usage, max_tokens)
