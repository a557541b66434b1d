"""A backend for any OpenAI-compatible server: OpenAI itself, vLLM, llama.cpp, SGLang, LiteLLM...

:class:`OpenAIBackend` implements both :class:`capgate.Backend` (``generate``) and
:class:`capgate.AsyncBackend` (``agenerate``), which differ only in how they send and wait.

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
import os
import threading
import weakref
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, ClassVar

from tenacity import AsyncRetrying, Retrying

from capgate._util.extras import require_extra
from capgate._util.validate import check_choice
from capgate.adapters.backends._breaker import CircuitBreaker
from capgate.adapters.backends._openai_retry import (
    as_backend_error,
    is_retryable,
    outage,
    retry_settings,
)
from capgate.adapters.backends._openai_wire import (
    ApiKind,
    Job,
    assemble,
    make_request,
    raise_first,
    read_response,
)
from capgate.core.backend import (
    ChatMessage,
    EndpointKind,
    Generation,
    Prompt,
    SamplingParams,
    as_messages,
)
from capgate.errors import BackendError

__all__ = ["ApiKind", "OpenAIBackend", "is_retryable"]


_OPENAI: list[Any] = []
"""The ``openai`` module, once :func:`_import_openai` has imported it completely."""


def _import_openai() -> Any:
    """``import openai`` (seconds, the first time), run in a worker thread by the async path:
    concurrent callers wait on the import lock in their own threads, never on the event loop."""
    import openai

    if not _OPENAI:
        _OPENAI.append(openai)
    return openai


_LoopClient = tuple[Any, asyncio.Semaphore, AsyncGenerator[None, None]]
"""An event loop's async client, its request slots and what closes the client with the loop."""


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
        max_concurrency: Most requests in flight at once from this backend's sync calls, and
            from its async calls on each event loop (each loop has its own client and slots).
        extra_body: Extra JSON fields sent with every request (server-specific options).
        circuit_failures: Outage attempts in a row (unreachable, time-out, 5xx) that open the
            circuit breaker; 0 disables it. An attempt a caller cancels (a gate's deadline) counts
            neither way: for a server that hangs to open it, keep ``timeout`` below that deadline.
        circuit_cooldown_s: Seconds an open circuit refuses attempts before one trial.

    Raises:
        ValueError: A setting is out of range, or no API key is available for OpenAI itself.
        MissingExtraError: The ``openai`` package is not installed (``capgate[openai]``).

    Examples:
        >>> backend = OpenAIBackend("my-model", base_url="http://127.0.0.1:8000/v1")
        >>> backend.model_id
        'my-model'
        >>> backend.build_request([{"role": "user", "content": "Hi"}], SamplingParams(n=4, seed=1))["n"]
        4
    """

    endpoint: ClassVar[EndpointKind] = "openai"
    """How this backend reaches its model (:func:`capgate.core.backend.backend_endpoint`)."""

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
        check_choice("api", api, ("chat", "responses"))
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
        require_extra("openai", "OpenAIBackend")  # found, not imported: the import costs seconds
        self._lock = threading.Lock()
        self._sync_client: Any = None
        self._sync_slots = threading.BoundedSemaphore(max_concurrency)
        # One async client per event loop (loops in other threads keep their own), made once
        # per loop and dropped when that loop shuts it down. Its own lock: _lock is held while
        # the sync path imports openai (seconds), which must not stall an event loop.
        self._async_lock = threading.Lock()
        self._async_states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )

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

    def build_request(self, messages: Sequence[ChatMessage], params: SamplingParams) -> dict[str, Any]:
        """The keyword arguments of one request for ``messages`` under ``params`` (no I/O).

        For ``api="chat"`` these are ``chat.completions.create`` arguments asking for
        ``params.n`` samples; for ``api="responses"`` they are ``responses.create`` arguments
        for one sample (the caller fans out ``n`` of them).

        Raises:
            ValueError: ``stop`` was given with the Responses API, which cannot honour it.
        """
        return make_request(
            messages, params, model=self.model, api=self.api, timeout=self.timeout, extra_body=self.extra_body
        )

    def _jobs(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Job]:
        jobs: list[Job] = []
        copies, n = (1, params.n) if self.api == "chat" else (params.n, 1)  # the Responses API has no n
        for i, prompt in enumerate(prompts):
            kwargs = self.build_request(as_messages(prompt), params)
            jobs.extend(Job(index=i, kwargs=kwargs, n=n, max_tokens=params.max_tokens) for _ in range(copies))
        return jobs

    def parse_response(self, response: Any, n: int, *, max_tokens: int | None = None) -> list[Generation]:
        """Turn one SDK response object into ``n`` :class:`Generation` s (no I/O).

        Raises:
            BackendError: The response is malformed (no choices, wrong count, missing fields).
        """
        return read_response(response, n, api=self.api, where=self._where, max_tokens=max_tokens)

    def _retry_settings(self) -> dict[str, Any]:
        return retry_settings(
            max_retries=self.max_retries, backoff_initial=self.backoff_initial, backoff_max=self.backoff_max
        )

    def _as_backend_error(self, exc: BaseException, attempts: int) -> BackendError:
        return as_backend_error(exc, attempts, where=self._where, timeout=self.timeout)

    def _client(self) -> Any:
        with self._lock:
            if self._sync_client is None:
                import openai

                self._sync_client = openai.OpenAI(
                    base_url=self.base_url_, api_key=self._api_key, timeout=self.timeout, max_retries=0
                )
            return self._sync_client

    def _watched(self) -> AbstractContextManager[None]:
        if self.circuit_ is None:
            return nullcontext()
        return self.circuit_.watch(self._where, partial(outage, where=self._where, timeout=self.timeout))

    def _send(self, kwargs: dict[str, Any]) -> Any:
        client = self._client()
        with self._sync_slots, self._watched():
            if self.api == "chat":
                return client.chat.completions.create(**kwargs)
            return client.responses.create(**kwargs)

    def _run(self, job: Job) -> list[Generation]:
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
            return assemble(len(prompts), jobs, [self._run(job) for job in jobs])
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
            futures = [pool.submit(self._run, job) for job in jobs]
        # Every job has run (the pool waits for them all); the first failed one, in job order, raises.
        return assemble(len(prompts), jobs, [future.result() for future in futures])

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

    def _loop_state(self, loop: asyncio.AbstractEventLoop) -> _LoopClient | None:
        with self._async_lock:
            return self._async_states.get(loop)

    def _forget(self, client: Any) -> None:
        """Drop the entry of ``client`` (its loop is closing it), so no closed loop is kept."""
        with self._async_lock:
            for loop, state in list(self._async_states.items()):
                if state[0] is client:
                    del self._async_states[loop]

    async def _aclient(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._loop_state(loop)
        if state is None:
            # The first import of openai takes seconds: in a thread, so that it never stalls the
            # event loop (and every call in flight on it, a shadow gate's own calls included).
            openai = _OPENAI[0] if _OPENAI else await asyncio.to_thread(_import_openai)
            # Concurrent first calls all waited for the import: the first one back makes the
            # loop's client and slots, the others use them (a replaced client would be closed
            # under its requests, and each would have its own max_concurrency slots).
            state = self._loop_state(loop)
            if state is None:
                client = openai.AsyncOpenAI(
                    base_url=self.base_url_, api_key=self._api_key, timeout=self.timeout, max_retries=0
                )
                keeper = _closed_with_loop(client, partial(self._forget, client))
                await anext(keeper)  # started on this loop: its shutdown (asyncio.run's end) closes it
                state = (client, asyncio.Semaphore(self.max_concurrency), keeper)
                with self._async_lock:
                    self._async_states[loop] = state
        return state[0], state[1]

    async def _asend(self, kwargs: dict[str, Any]) -> Any:
        client, slots = await self._aclient()
        async with slots:
            with self._watched():
                if self.api == "chat":
                    return await client.chat.completions.create(**kwargs)
                return await client.responses.create(**kwargs)

    async def _arun(self, job: Job) -> list[Generation]:
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
        return assemble(len(prompts), jobs, raise_first(outcomes))

    async def aclose(self) -> None:
        """Close the async HTTP client of the running event loop, if any."""
        loop = asyncio.get_running_loop()
        with self._async_lock:
            state = self._async_states.pop(loop, None)
        if state is not None:
            await state[2].aclose()  # closes the client


async def _closed_with_loop(client: Any, forget: Callable[[], None]) -> AsyncGenerator[None, None]:
    """Closes ``client`` on its own loop when the loop shuts its async generators down (as
    ``asyncio.run`` does), after ``forget`` drops it from its backend. Otherwise a client outliving
    its loop (``asyncio.run`` called twice with one backend) is closed on another loop when
    collected: "Event loop is closed"."""
    try:
        yield
    finally:
        forget()
        await client.close()
