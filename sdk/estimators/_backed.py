"""The base of the estimators that query a model through a backend, and the helpers they share."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence

from capgate.core.backend import Generation, Prompt
from capgate.core.types import Estimate
from capgate.estimators._sampling import (
    AnyBackend,
    QueryState,
    Round,
    Steps,
    arun_steps,
    check_backend,
    failed_call_estimate,
    run_steps,
)
from capgate.estimators.base import CapabilityEstimator


def one_round_plan(
    method: str, round_: Round, read: Callable[[list[Generation], QueryState], Estimate]
) -> Steps:
    """A plan of one round (none without prompts): a failed prompt gets :func:`failed_call_estimate`,
    a sampled one ``read(samples, state)`` (their cost already in ``state``)."""
    if not round_.prompts:
        return []
    result = yield round_
    estimates: list[Estimate] = []
    for outcome in result.outcomes:
        if isinstance(outcome, BaseException):
            estimates.append(failed_call_estimate(method, outcome, result.latency_s))
            continue
        state = QueryState()
        state.add(outcome, result.latency_s)
        estimates.append(read(outcome, state))
    return estimates


def check_template(template: str) -> str:
    """``template`` itself, once it is known to contain a ``{question}`` placeholder."""
    if "{question}" not in template:
        raise ValueError("`template` must contain a {question} placeholder")
    return template


class BackendEstimator(CapabilityEstimator):
    """Base of the estimators that query a ``backend``: :meth:`estimate` and :meth:`aestimate` drive
    the subclass's plan (:meth:`_steps`) with blocking or non-blocking calls."""

    def __init__(self, backend: AnyBackend) -> None:
        check_backend(backend)
        self.backend = backend

    @abstractmethod
    def _steps(self, queries: Sequence[Prompt]) -> Steps:
        """The estimator's rounds of prompts and how their samples become estimates."""

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Estimate each query by querying the model (blocking)."""
        return run_steps(self._steps(queries), self.backend)

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Async twin of :meth:`estimate` (native when the backend has ``agenerate``)."""
        return await arun_steps(self._steps(queries), self.backend)

    @property
    def thread_safe_estimate(self) -> bool:
        """True when the backend has a sync ``generate`` of its own (capgate's backends do; an
        async-only backend would be run on a private loop, away from its client's)."""
        return callable(getattr(self.backend, "generate", None))
