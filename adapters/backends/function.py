"""Plain functions as backends, so that CAS can drive any code that calls a model.

A function drawing one response per call (an LLM client call, a LangGraph node, a LangChain model
handler) becomes a :class:`~capgate.Backend` for :func:`~capgate.cas.adaptive_sample` with
:class:`FunctionBackend` (sync) or :class:`AsyncFunctionBackend` (async), each call one sample.
The backend keeps every value drawn, in order, so the caller gets back the *original* object (a
string, a chat message, a state update) whose answer won the vote, not only its text.

Examples:
    >>> import itertools
    >>> from capgate.cas import adaptive_sample, stop_after_samples
    >>> replies = itertools.cycle(["Paris", "Paris.", "Lyon"])
    >>> backend = FunctionBackend(lambda prompt: next(replies))
    >>> result = adaptive_sample(backend, "Capital of France?", extract=lambda t: t.strip(". "),
    ...                          stop=stop_after_samples(3), batch_size=3, confidence=None)
    >>> result.answer, result.votes, backend.winner(result)
    ('Paris', {'Paris': 2, 'Lyon': 1}, 'Paris')
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

from capgate.cas.drawn import DrawnValues, response_mean_logprob, response_text
from capgate.core.backend import EndpointKind, Generation, Prompt, SamplingParams

__all__ = ["AsyncFunctionBackend", "FunctionBackend", "response_mean_logprob", "response_text"]

T = TypeVar("T")


class _Drawn(DrawnValues[T]):
    """What both function backends share: a name, and the record of what was drawn."""

    endpoint: ClassVar[EndpointKind] = "function"
    """How this backend reaches its model (:func:`capgate.core.backend.backend_endpoint`)."""

    def __init__(
        self,
        *,
        to_text: Callable[[T], str] | None,
        count_tokens: Callable[[T], int] | None,
        model_id: str,
    ) -> None:
        super().__init__(to_text=to_text, count_tokens=count_tokens)
        self._model_id = model_id

    @property
    def model_id(self) -> str:
        """The name given to the function (``"function"`` unless set)."""
        return self._model_id


class FunctionBackend(_Drawn[T]):
    """A function drawing one response per call, seen as a :class:`~capgate.Backend`.

    ``generate`` calls ``draw(prompt)`` ``params.n`` times per prompt, in order. Sampling settings
    (temperature, seed...) are the function's own business: it should *sample*, or every vote will
    agree. Token counts are 0 unless ``count_tokens`` says otherwise (so token-based stop rules
    see nothing).

    Args:
        draw: Draws one response for a prompt; may ignore the prompt (a closure over its call).
        to_text: Reads a drawn value's text (default: :func:`response_text`).
        count_tokens: Reads a drawn value's generated-token count, if known.
        model_id: Name reported as the backend's ``model_id``.

    Attributes:
        drawn: Every value drawn, in draw order (CAS's ``result.samples`` follow the same order).
    """

    def __init__(
        self,
        draw: Callable[[Prompt], T],
        *,
        to_text: Callable[[T], str] | None = None,
        count_tokens: Callable[[T], int] | None = None,
        model_id: str = "function",
    ) -> None:
        if not callable(draw):
            raise TypeError(f"`draw` must be a function prompt -> response; got {draw!r}")
        super().__init__(to_text=to_text, count_tokens=count_tokens, model_id=model_id)
        self.draw = draw

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Call the function ``params.n`` times for each prompt."""
        return [[self.generation(self.draw(prompt)) for _ in range(params.n)] for prompt in prompts]

    def __repr__(self) -> str:
        return f"FunctionBackend({getattr(self.draw, '__name__', repr(self.draw))})"


class AsyncFunctionBackend(_Drawn[T]):
    """An async function drawing one response per call, seen as an :class:`~capgate.AsyncBackend`.

    The draws of one batch run concurrently (``asyncio.gather``) unless ``concurrent=False``;
    ``drawn`` keeps them in call order either way.

    Args:
        draw: Async function drawing one response for a prompt.
        to_text: Reads a drawn value's text (default: :func:`response_text`).
        count_tokens: Reads a drawn value's generated-token count, if known.
        model_id: Name reported as the backend's ``model_id``.
        concurrent: Run the draws of a batch concurrently.

    Examples:
        >>> import asyncio
        >>> from capgate.cas import aadaptive_sample, stop_after_samples
        >>> async def draw(prompt):
        ...     return "42"
        >>> backend = AsyncFunctionBackend(draw)
        >>> r = asyncio.run(aadaptive_sample(backend, "?", extract=str.strip, batch_size=2,
        ...                                  stop=stop_after_samples(2)))
        >>> r.answer, len(backend.drawn)
        ('42', 2)
    """

    def __init__(
        self,
        draw: Callable[[Prompt], Awaitable[T]],
        *,
        to_text: Callable[[T], str] | None = None,
        count_tokens: Callable[[T], int] | None = None,
        model_id: str = "function",
        concurrent: bool = True,
    ) -> None:
        if not callable(draw):
            raise TypeError(f"`draw` must be an async function prompt -> response; got {draw!r}")
        super().__init__(to_text=to_text, count_tokens=count_tokens, model_id=model_id)
        self.draw = draw
        self.concurrent = concurrent

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Await the function ``params.n`` times for each prompt."""
        rows: list[list[Generation]] = []
        for prompt in prompts:
            if self.concurrent:
                values: list[Any] = list(await asyncio.gather(*(self.draw(prompt) for _ in range(params.n))))
            else:
                values = [await self.draw(prompt) for _ in range(params.n)]
            rows.append([self.generation(v) for v in values])
        return rows

    def __repr__(self) -> str:
        return f"AsyncFunctionBackend({getattr(self.draw, '__name__', repr(self.draw))})"
