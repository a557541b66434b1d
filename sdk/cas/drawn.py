"""The responses a resample draws from the caller's own code, kept so the winner can be handed back.

CAS votes on answer *texts*; an agent wants back the *object* its function returned.
:class:`DrawnValues` reads each drawn value as a :class:`~capgate.core.backend.Generation` and
keeps it, in draw order, so :meth:`DrawnValues.winner` returns the first value whose answer won.

Examples:
    >>> drawn = DrawnValues()
    >>> rows = [drawn.generation(v) for v in ["Paris", "Paris.", "Lyon"]]
    >>> rows[1].text, drawn.drawn
    ('Paris.', ['Paris', 'Paris.', 'Lyon'])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

from capgate.cas.loop import CASResult
from capgate.core.backend import Generation

__all__ = ["DrawnValues", "response_mean_logprob", "response_text"]

T = TypeVar("T")


def response_text(value: object) -> str:
    """The text of a drawn response: a string itself, or the string ``content`` / ``text`` of an
    object (a LangChain ``AIMessage``, an OpenAI message).

    Raises:
        TypeError: The value has no text; pass ``to_text=`` to say how to read it.

    Examples:
        >>> response_text("4")
        '4'
    """
    if isinstance(value, str):
        return value
    for attribute in ("content", "text"):
        text = getattr(value, attribute, None)
        if isinstance(text, str):
            return text
    raise TypeError(
        f"cannot read a response text from a {type(value).__name__}; pass to_text= (a function "
        "value -> str) to say how"
    )


def response_mean_logprob(value: object) -> float | None:
    """The ``mean_logprob`` in a LangChain message's ``response_metadata`` (as
    :class:`~capgate.adapters.agents.chat_model.CapgateChatModel` sets it), also as the last message
    of a ``{"messages": [...]}`` state update; ``None`` if absent.

    Examples:
        >>> response_mean_logprob("4") is None
        True
    """
    if isinstance(value, Mapping) and isinstance(value.get("messages"), Sequence) and value["messages"]:
        value = value["messages"][-1]
    metadata = getattr(value, "response_metadata", None)
    found = metadata.get("mean_logprob") if isinstance(metadata, Mapping) else None
    if isinstance(found, int | float) and not isinstance(found, bool) and math.isfinite(found) and found <= 0:
        return float(found)
    return None


class DrawnValues(Generic[T]):
    """Every value drawn for one prompt, in draw order, and the generation each one reads as.

    Args:
        to_text: Reads a drawn value's text (default: :func:`response_text`).
        count_tokens: Reads a drawn value's generated-token count (default: 0, unknown).

    Attributes:
        drawn: Every value drawn, in draw order (CAS's ``result.samples`` follow the same order).
    """

    def __init__(
        self, *, to_text: Callable[[T], str] | None = None, count_tokens: Callable[[T], int] | None = None
    ) -> None:
        self.to_text = to_text
        self.count_tokens = count_tokens
        self.drawn: list[T] = []

    def generation(self, value: T) -> Generation:
        """Keep ``value`` and return it as a generation.

        Raises:
            TypeError: ``to_text`` returned something else than a string, or (without
                ``to_text``) the value has no text.
        """
        text = self.to_text(value) if self.to_text is not None else response_text(value)
        if not isinstance(text, str):
            raise TypeError(f"to_text must return a str; it returned {type(text).__name__}")
        n_tokens = self.count_tokens(value) if self.count_tokens is not None else 0
        self.drawn.append(value)
        return Generation(text=text, n_tokens=n_tokens, mean_logprob=response_mean_logprob(value))

    def winner(self, result: CASResult) -> T | None:
        """The first drawn value whose answer won the vote (``None`` if no response had an answer),
        from ``result``, a sampling run over these values (one prompt).

        Raises:
            ValueError: ``result`` counts other samples than were drawn here.
        """
        if result.answer is None:
            return None
        if len(result.samples) != len(self.drawn):
            raise ValueError(
                f"the result counts {len(result.samples)} samples but {len(self.drawn)} were drawn "
                "here; pass the result of a run over these values and one prompt"
            )
        for sample, value in zip(result.samples, self.drawn, strict=True):
            if sample.answer == result.answer:
                return value
        raise ValueError(f"no drawn sample has the winning answer {result.answer!r}")
