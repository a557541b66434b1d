"""A backend for any OpenAI-compatible server: OpenAI itself, vLLM, llama.cpp, SGLang, LiteLLM...

:class:`OpenAIBackend` implements both :class:`capgate.Backend` (``generate``) and
:class:`capgate.AsyncBackend` (``agenerate``). As in httpx, everything that does no I/O (building
requests, reading responses, deciding what to retry, wording errors) is written once; the sync and
async paths differ only in how they send a request and wait.

The chat-completions API is the primary path: one request per prompt asks for ``n`` samples at
once and returns per-token ``logprobs``/``top_logprobs``, honours ``seed`` and ``stop``. With
``api="responses"`` the Responses API is used instead; it has no ``n``, so the backend fans out
``n`` concurrent single-sample requests per prompt, and it has no ``seed`` (ignored: sampling is
not reproducible there) and no ``stop`` (refused with ``ValueError``).

Failures: 429, 408 and 5xx responses, time-outs and connection errors are retried (tenacity) with
exponential back-off and jitter (honouring ``Retry-After`` up to ``backoff_max``); other 4xx
responses are not. A circuit breaker (:class:`~capgate.adapters.backends._breaker.CircuitBreaker`)
stops calling a server after ``circuit_failures`` outage attempts in a row, failing fast with a
message saying so, and tries again after ``circuit_cooldown_s``. When the retries run out, or a
response is malformed, the call raises :class:`capgate.BackendError` naming the server, the
status and the message. The openai SDK is imported only when the first request is made (install
the ``openai`` extra).
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)

from capgate.adapters.backends._breaker import CircuitBreaker, CircuitOpenError
from capgate.adapters.backends._usage import logaddexp as _logaddexp
from capgate.adapters.backends._usage import split_tokens as _split_tokens
from capgate.backend import (
    ChatMessage,
    EndpointKind,
    Generation,
    Prompt,
    SamplingParams,
    TokenLogprob,
    as_messages,
)
from capgate.errors import BackendError

__all__ = ["ApiKind", "OpenAIBackend", "is_retryable"]

ApiKind: TypeAlias = Literal["chat", "responses"]
"""Which OpenAI API to call: chat completions (primary) or Responses."""

#: Status codes worth retrying besides 5xx: request time-out and rate limit.
RETRYABLE_STATUS = frozenset({408, 429})


def is_retryable(exc: BaseException) -> bool:
    """Whether an error from the openai SDK is transient: 429/408/5xx, a time-out, a lost connection.

    Other 4xx responses (bad request, authentication, not found...) are not: retrying cannot help.

    Example:
        >>> is_retryable(ValueError("not an API error"))
        False
    """
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return False


def _worth_retrying(exc: BaseException) -> bool:
    """Transient errors, and a circuit breaker's refusal while another caller's trial is in flight."""
    return is_retryable(exc) or (isinstance(exc, CircuitOpenError) and exc.trial_in_flight)


def _retry_after_s(exc: BaseException | None) -> float | None:
    """Seconds asked for by a ``Retry-After`` header on an HTTP error, if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - time.time())


@dataclass(frozen=True)
class _Job:
    """One HTTP request to make: ``n`` samples for prompt ``index``."""

    index: int
    kwargs: dict[str, Any]
    n: int
    max_tokens: int | None = None


@dataclass(frozen=True)
class _Usage:
    prompt_tokens: int | None
    completion_tokens: int | None


class OpenAIBackend:
    """An OpenAI-compatible chat backend (sync ``generate`` and async ``agenerate``).

    Args:
        model: The model name the server knows (``"gpt-4o-mini"``, the vLLM served name...).
        base_url: Server URL ending in ``/v1``; default ``$OPENAI_BASE_URL``, else OpenAI's.
        api_key: API key; default ``$OPENAI_API_KEY``. A custom ``base_url`` without any key
            sends the placeholder ``"EMPTY"`` (local servers ignore it).
        api: ``"chat"`` (chat completions, primary) or ``"responses"`` (fan-out, see module doc).
        timeout: Seconds one HTTP request may take before it counts as timed out (and is retried).
        max_retries: Retries after the first attempt for transient errors (0 disables them).
        backoff_initial: First back-off in seconds; it doubles each retry, plus jitter.
        backoff_max: Longest wait between two attempts, in seconds (also caps ``Retry-After``).
        max_concurrency: Most requests in flight at once from this backend, sync or async.
        extra_body: Extra JSON fields sent with every request (server-specific options).
        circuit_failures: Outage attempts in a row (unreachable, time-out, 5xx) that open the
            circuit breaker; 0 disables it.
        circuit_cooldown_s: Seconds an open circuit refuses attempts before one trial.

    Raises:
        ValueError: A setting is out of range, or no API key is available for OpenAI itself.

    Example:
        >>> backend = OpenAIBackend("my-model", base_url="http://127.0.0.1:8000/v1")
        >>> backend.model_id
        'my-model'
        >>> backend.build_request([{"role": "user", "content": "Hi"}], SamplingParams(n=4, seed=1))["n"]
        4
    """

    endpoint: ClassVar[EndpointKind] = "openai"
    """How this backend reaches its model (:func:`capgate.backend.backend_endpoint`)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api: ApiKind = "chat",
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        max_concurrency: int = 8,
        extra_body: Mapping[str, Any] | None = None,
        circuit_failures: int = 5,
        circuit_cooldown_s: float = 10.0,
    ) -> None:
        if not model:
            raise ValueError("`model` must be a non-empty model name; got ''")
        if api not in ("chat", "responses"):
            raise ValueError(f"`api` must be 'chat' or 'responses'; got {api!r}")
        if not timeout > 0:
            raise ValueError(f"`timeout` must be positive; got {timeout!r}")
        if max_retries < 0:
            raise ValueError(f"`max_retries` must be >= 0; got {max_retries!r}")
        if backoff_initial < 0 or backoff_max < 0:
            raise ValueError(f"back-off times must be >= 0; got {backoff_initial!r}, {backoff_max!r}")
        if max_concurrency < 1:
            raise ValueError(f"`max_concurrency` must be >= 1; got {max_concurrency!r}")
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.api: ApiKind = api
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body) if extra_body else None
        self.circuit_failures = circuit_failures
        self.circuit_cooldown_s = circuit_cooldown_s
        self.circuit_: CircuitBreaker | None = None
        if circuit_failures != 0:  # CircuitBreaker checks the values
            self.circuit_ = CircuitBreaker(failures=circuit_failures, cooldown_s=circuit_cooldown_s)

        self.base_url_ = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None and self.base_url_ is None:
            raise ValueError(
                "no API key for OpenAI: pass api_key=... or set OPENAI_API_KEY "
                "(or point base_url / OPENAI_BASE_URL at a local server)"
            )
        self._api_key = key or "EMPTY"
        self._lock = threading.Lock()
        self._sync_client: Any = None
        self._sync_slots = threading.BoundedSemaphore(max_concurrency)
        self._async_state: tuple[asyncio.AbstractEventLoop, Any, asyncio.Semaphore] | None = None

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(model={self.model!r}, base_url={self.base_url_!r}, api={self.api!r}, "
            f"timeout={self.timeout!r}, max_retries={self.max_retries!r}, "
            f"max_concurrency={self.max_concurrency!r})"
        )

    @property
    def model_id(self) -> str:
        """The served model name."""
        return self.model

    @property
    def _where(self) -> str:
        return self.base_url_ or "api.openai.com"

    # ------------------------------------------------------------------ requests (no I/O)

    def build_request(self, messages: Sequence[ChatMessage], params: SamplingParams) -> dict[str, Any]:
        """The keyword arguments of one request for ``messages`` under ``params`` (no I/O).

        For ``api="chat"`` these are ``chat.completions.create`` arguments asking for
        ``params.n`` samples; for ``api="responses"`` they are ``responses.create`` arguments
        for one sample (the caller fans out ``n`` of them).

        Raises:
            ValueError: ``stop`` was given with the Responses API, which cannot honour it.
        """
        want_logprobs = params.logprobs or params.top_logprobs > 0
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        kwargs: dict[str, Any] = {"model": self.model, "timeout": self.timeout}
        if self.api == "chat":
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
        if self.extra_body:
            kwargs["extra_body"] = dict(self.extra_body)
        return kwargs

    def _jobs(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[_Job]:
        jobs: list[_Job] = []
        for i, prompt in enumerate(prompts):
            kwargs = self.build_request(as_messages(prompt), params)
            if self.api == "chat":
                jobs.append(_Job(index=i, kwargs=kwargs, n=params.n, max_tokens=params.max_tokens))
            else:
                jobs.extend(
                    _Job(index=i, kwargs=kwargs, n=1, max_tokens=params.max_tokens) for _ in range(params.n)
                )
        return jobs

    def _assemble(
        self, n_prompts: int, jobs: Sequence[_Job], results: Sequence[list[Generation]]
    ) -> list[list[Generation]]:
        out: list[list[Generation]] = [[] for _ in range(n_prompts)]
        for job, gens in zip(jobs, results, strict=True):
            out[job.index].extend(gens)
        return out

    # ------------------------------------------------------------------ responses (no I/O)

    def parse_response(self, response: Any, n: int, *, max_tokens: int | None = None) -> list[Generation]:
        """Turn one SDK response object into ``n`` :class:`Generation` s (no I/O).

        Raises:
            BackendError: The response is malformed (no choices, wrong count, missing fields).
        """
        try:
            if self.api == "chat":
                gens = self._parse_chat(response, max_tokens)
            else:
                gens = self._parse_responses(response, max_tokens)
        except BackendError:
            raise
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            raise BackendError(f"malformed response from {self._where}: {type(exc).__name__}: {exc}") from exc
        if len(gens) != n:
            raise BackendError(
                f"malformed response from {self._where}: asked for {n} samples, got {len(gens)}"
            )
        return gens

    @staticmethod
    def _usage(usage: Any, prompt_field: str, completion_field: str) -> _Usage:
        if usage is None:
            return _Usage(None, None)
        p = getattr(usage, prompt_field, None)
        c = getattr(usage, completion_field, None)
        return _Usage(p if isinstance(p, int) else None, c if isinstance(c, int) else None)

    @staticmethod
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

    @staticmethod
    def _mean_logprob(tokens: list[TokenLogprob] | None) -> float | None:
        if not tokens:
            return None
        finite = [max(t.logprob, -1e4) for t in tokens]
        return sum(finite) / len(finite)

    def _generations(
        self,
        texts: list[str],
        tokens: list[list[TokenLogprob] | None],
        finish: list[str | None],
        usage: _Usage,
        max_tokens: int | None,
    ) -> list[Generation]:
        counts: list[int]
        if all(t is not None for t in tokens):
            counts = [len(t or []) for t in tokens]
        elif usage.completion_tokens is not None:
            # Without logprobs the server reports only the total over all samples.
            counts = _split_tokens(usage.completion_tokens, texts, finish, max_tokens)
        else:
            counts = [0] * len(texts)
        return [
            Generation(
                text=text,
                n_tokens=count,
                prompt_tokens=usage.prompt_tokens or 0,
                mean_logprob=self._mean_logprob(toks),
                tokens=toks,
                finish_reason=fin,
            )
            for text, toks, fin, count in zip(texts, tokens, finish, counts, strict=True)
        ]

    def _parse_chat(self, response: Any, max_tokens: int | None) -> list[Generation]:
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise BackendError(
                f"malformed response from {self._where}: no choices in {str(response)[:200]!r}"
            )
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
            tokens.append(self._tokens(getattr(logprobs, "content", None)) if logprobs is not None else None)
            finish.append(getattr(choice, "finish_reason", None))
        usage = self._usage(getattr(response, "usage", None), "prompt_tokens", "completion_tokens")
        return self._generations(texts, tokens, finish, usage, max_tokens)

    def _parse_responses(self, response: Any, max_tokens: int | None) -> list[Generation]:
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
        usage = self._usage(getattr(response, "usage", None), "input_tokens", "output_tokens")
        toks = self._tokens(items)
        return self._generations([text], [toks], [fin], usage, max_tokens)

    # ------------------------------------------------------------------ retries and errors (no I/O)

    def _wait(self, state: RetryCallState) -> float:
        # Exponential back-off with jitter: initial * 2**(attempt-1), plus up to as much again.
        base = self.backoff_initial * 2.0 ** (state.attempt_number - 1)
        base += random.uniform(0.0, base)
        exc = state.outcome.exception() if state.outcome is not None else None
        asked = _retry_after_s(exc)
        return min(max(base, asked or 0.0), self.backoff_max)

    def _retry_settings(self) -> dict[str, Any]:
        return {
            "stop": stop_after_attempt(self.max_retries + 1),
            "wait": self._wait,
            "retry": retry_if_exception(_worth_retrying),
            "reraise": True,
        }

    def _as_backend_error(self, exc: BaseException, attempts: int) -> BackendError:
        if isinstance(exc, BackendError):
            return exc
        import openai

        retryable = is_retryable(exc)
        status: int | None = None
        if isinstance(exc, openai.APITimeoutError):
            msg = f"request to {self._where} timed out after {self.timeout:g}s"
        elif isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            msg = f"could not reach {self._where}: {type(cause).__name__}: {cause}"
        elif isinstance(exc, openai.APIStatusError):
            msg = f"HTTP {exc.status_code} from {self._where}: {exc.message}"
            status = exc.status_code
        elif isinstance(exc, ValueError):  # the body was not JSON (json.JSONDecodeError)
            msg = f"malformed response from {self._where}: {type(exc).__name__}: {exc}"
        else:
            msg = f"request to {self._where} failed: {type(exc).__name__}: {exc}"
        return BackendError(msg, attempts=attempts, retryable=retryable, status=status)

    # ------------------------------------------------------------------ sync I/O

    def _client(self) -> Any:
        with self._lock:
            if self._sync_client is None:
                import openai

                self._sync_client = openai.OpenAI(
                    base_url=self.base_url_, api_key=self._api_key, timeout=self.timeout, max_retries=0
                )
            return self._sync_client

    def _outage(self, exc: BaseException) -> str | None:
        """What made a failed attempt an outage (unreachable, time-out, 5xx); None if it answered."""
        outage = is_retryable(exc) and getattr(exc, "status_code", None) != 429
        return str(self._as_backend_error(exc, 1)) if outage else None

    def _watched(self) -> AbstractContextManager[None]:
        return self.circuit_.watch(self._where, self._outage) if self.circuit_ else nullcontext()

    def _send(self, kwargs: dict[str, Any]) -> Any:
        client = self._client()
        with self._sync_slots, self._watched():
            if self.api == "chat":
                return client.chat.completions.create(**kwargs)
            return client.responses.create(**kwargs)

    def _run(self, job: _Job) -> list[Generation]:
        retrying = Retrying(**self._retry_settings())
        try:
            for attempt in retrying:
                with attempt:
                    return self.parse_response(self._send(job.kwargs), job.n, max_tokens=job.max_tokens)
        except Exception as exc:
            raise self._as_backend_error(exc, retrying.statistics.get("attempt_number", 1)) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Sample ``params.n`` responses per prompt; requests run concurrently (``max_concurrency``).

        Raises:
            BackendError: A request failed after its retries, or a response was malformed.
        """
        jobs = self._jobs(prompts, params)
        if len(jobs) <= 1:
            return self._assemble(len(prompts), jobs, [self._run(job) for job in jobs])
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
            futures = [pool.submit(self._run, job) for job in jobs]
            outcomes: list[list[Generation] | BaseException] = []
            for future in futures:
                exc = future.exception()
                outcomes.append(exc if exc is not None else future.result())
        return self._assemble(len(prompts), jobs, self._raise_first(outcomes))

    @staticmethod
    def _raise_first(outcomes: Sequence[list[Generation] | BaseException]) -> list[list[Generation]]:
        results: list[list[Generation]] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            results.append(outcome)
        return results

    def close(self) -> None:
        """Close the underlying HTTP client(s)."""
        with self._lock:
            if self._sync_client is not None:
                self._sync_client.close()
                self._sync_client = None

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ async I/O

    def _aclient(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._async_state
        if state is None or state[0] is not loop:
            import openai

            client = openai.AsyncOpenAI(
                base_url=self.base_url_, api_key=self._api_key, timeout=self.timeout, max_retries=0
            )
            state = (loop, client, asyncio.Semaphore(self.max_concurrency))
            self._async_state = state
        return state[1], state[2]

    async def _asend(self, kwargs: dict[str, Any]) -> Any:
        client, slots = self._aclient()
        async with slots:
            with self._watched():
                if self.api == "chat":
                    return await client.chat.completions.create(**kwargs)
                return await client.responses.create(**kwargs)

    async def _arun(self, job: _Job) -> list[Generation]:
        retrying = AsyncRetrying(**self._retry_settings())
        try:
            async for attempt in retrying:
                with attempt:
                    return self.parse_response(
                        await self._asend(job.kwargs), job.n, max_tokens=job.max_tokens
                    )
        except Exception as exc:
            raise self._as_backend_error(exc, retrying.statistics.get("attempt_number", 1)) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Async twin of :meth:`generate`.

        Raises:
            BackendError: A request failed after its retries, or a response was malformed.
        """
        jobs = self._jobs(prompts, params)
        outcomes = await asyncio.gather(*(self._arun(job) for job in jobs), return_exceptions=True)
        return self._assemble(len(prompts), jobs, self._raise_first(outcomes))

    async def aclose(self) -> None:
        """Close the async HTTP client of the running event loop, if any."""
        state = self._async_state
        self._async_state = None
        if state is not None and state[0] is asyncio.get_running_loop():
            await state[1].close()
