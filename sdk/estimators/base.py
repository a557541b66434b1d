"""The interface every capability estimator implements."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence

from capgate._types import Estimate
from capgate.backend import ChatMessage, Prompt, as_messages

__all__ = ["CapabilityEstimator", "query_text"]


def query_text(query: Prompt) -> str:
    """The text of the last user turn of a query (the question being asked)."""
    messages: list[ChatMessage] = as_messages(query)
    for message in reversed(messages):
        if message["role"] == "user":
            return message["content"]
    return messages[-1]["content"] if messages else ""


class CapabilityEstimator(ABC):
    """Predicts the capability µ(x) for queries.

    Subclasses implement :meth:`estimate` (batched). :meth:`aestimate` runs it in a worker
    thread by default; I/O-bound estimators override it with a native async path.
    An estimator never raises for a single bad query: it returns a degraded
    :class:`~capgate.Estimate` naming the reason, and raises only for misuse
    (wrong types, an unfitted model).
    """

    #: Short name recorded in every Estimate this estimator returns.
    method: str = "estimator"

    @property
    def target_model(self) -> str | None:
        """The model whose capability this estimator predicts, when it knows (a probe records it
        from its labels); ``None`` means "whatever model it is asked about"."""
        return None

    @abstractmethod
    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Estimate capability for each query; ``result[i]`` belongs to ``queries[i]``."""

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Async twin of :meth:`estimate`."""
        return await asyncio.to_thread(self.estimate, queries)

    def estimate_one(self, query: Prompt) -> Estimate:
        """Estimate capability for a single query."""
        return self.estimate([query])[0]
