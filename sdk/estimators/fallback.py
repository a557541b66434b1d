"""A chain of estimators: the first usable estimate wins.

Each query goes to the first estimator, those it could not estimate to the next, and so on. The
answering estimator's estimate is returned, with its ``method``, plus ``details["answered_by"]``,
``details["attempts"]`` (method and reason of each estimator that failed before it) and the cost
of all attempts. An estimate from a later link is marked ``degraded`` with a reason, so a policy
can tell it from a first-choice one. If every link fails the result is unavailable, listing every
reason, and the policy's fail-safe acts on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capgate._util.drive import Steps, adrive, drive
from capgate.core.backend import Prompt
from capgate.core.types import Cost, Estimate
from capgate.estimators._sampling import describe_error
from capgate.estimators.base import CapabilityEstimator

__all__ = ["FallbackChain"]


class FallbackChain(CapabilityEstimator):
    """Try estimators in order; the first usable estimate wins.

    Args:
        estimators: Two or more estimators, most preferred first.

    Examples:
        >>> from capgate import Estimate
        >>> class Down(CapabilityEstimator):
        ...     method = "probe"
        ...     def estimate(self, queries):
        ...         return [Estimate.unavailable("probe", "server down") for _ in queries]
        >>> class Half(CapabilityEstimator):
        ...     method = "constant"
        ...     def estimate(self, queries):
        ...         return [Estimate(p=0.5, method="constant") for _ in queries]
        >>> e = FallbackChain([Down(), Half()]).estimate_one("2+2?")
        >>> e.p, e.method, e.details["attempts"]
        (0.5, 'constant', [{'method': 'probe', 'reason': 'server down'}])
    """

    method = "fallback"

    def __init__(self, estimators: Sequence[CapabilityEstimator]) -> None:
        estimators = list(estimators)
        if len(estimators) < 2:
            raise ValueError(f"`estimators` needs at least two estimators; got {len(estimators)}")
        for est in estimators:
            if not isinstance(est, CapabilityEstimator):
                raise TypeError(f"every link must be a CapabilityEstimator; got {type(est).__name__}")
        self.estimators = estimators

    @staticmethod
    def _checked(est: CapabilityEstimator, got: Any, n: int) -> list[Estimate]:
        if not isinstance(got, list) or len(got) != n or not all(isinstance(e, Estimate) for e in got):
            count = len(got) if isinstance(got, list) else type(got).__name__
            reason = f"{type(est).__name__} returned {count} results for {n} queries"
            return [Estimate.unavailable(est.method, reason) for _ in range(n)]
        return got

    def _merge(self, pos: int, winner: Estimate, attempts: list[dict[str, str]], cost: Cost) -> Estimate:
        details = {**winner.details, "answered_by": winner.method, "attempts": attempts}
        if pos == 0:
            return winner.model_copy(update={"details": details, "cost": cost})
        failed = "; ".join(f"{a['method']}: {a['reason']}" for a in attempts)
        reason = f"fallback to {winner.method} (link {pos + 1}) after {failed}"
        if winner.reason:
            reason += f"; {winner.method} itself: {winner.reason}"
        return winner.model_copy(
            update={"details": details, "cost": cost, "degraded": True, "reason": reason}
        )

    def _all_failed(self, attempts: list[dict[str, str]], cost: Cost) -> Estimate:
        failed = "; ".join(f"{a['method']}: {a['reason']}" for a in attempts)
        return Estimate.unavailable(
            self.method, f"every estimator failed: {failed}", cost=cost, attempts=attempts
        )

    def _steps(self, queries: Sequence[Prompt]) -> Steps[list[Estimate]]:
        """The chain without its calls: yields ``(link, queries)``, receives the link's answer."""
        n = len(queries)
        results: list[Estimate | None] = [None] * n
        attempts: list[list[dict[str, str]]] = [[] for _ in range(n)]
        costs = [Cost() for _ in range(n)]
        pending = list(range(n))
        for pos, est in enumerate(self.estimators):
            if not pending:
                break
            answer = yield est, [queries[i] for i in pending]
            still: list[int] = []
            for i, got in zip(pending, self._checked(est, answer, len(pending)), strict=True):
                costs[i] = costs[i] + got.cost
                if got.usable:
                    results[i] = self._merge(pos, got, attempts[i], costs[i])
                else:
                    attempts[i].append({"method": got.method, "reason": got.reason or "unavailable"})
                    still.append(i)
            pending = still
        return [
            r if r is not None else self._all_failed(attempts[i], costs[i]) for i, r in enumerate(results)
        ]

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Estimate each query with the first estimator that can (blocking)."""
        return drive(self._steps(queries), _ask)

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """Async twin of :meth:`estimate`: each link's ``aestimate`` in turn."""
        return await adrive(self._steps(queries), _aask)

    @property
    def thread_safe_estimate(self) -> bool:
        """True when every link's is."""
        return all(est.thread_safe_estimate for est in self.estimators)


def _crashed(est: CapabilityEstimator, exc: Exception, n: int) -> list[Estimate]:
    return [Estimate.unavailable(est.method, f"raised {describe_error(exc)}") for _ in range(n)]


def _ask(request: tuple[CapabilityEstimator, list[Prompt]]) -> Any:
    est, queries = request
    try:
        return est.estimate(queries)
    except Exception as exc:
        return _crashed(est, exc, len(queries))


async def _aask(request: tuple[CapabilityEstimator, list[Prompt]]) -> Any:
    est, queries = request
    try:
        return await est.aestimate(queries)
    except Exception as exc:
        return _crashed(est, exc, len(queries))
