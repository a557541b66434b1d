"""A small deterministic capability estimator for driving policy branches in tests.

It is not the LLM: the tests that use it still call real functions, graphs and models; this only
decides which policy band fires, by looking for a marker word in the query's last user turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from capgate import Estimate
from capgate.core.backend import Prompt
from capgate.estimators import CapabilityEstimator, query_text


class KeywordEstimator(CapabilityEstimator):
    """p from the first marker word found in the query's last user turn (else ``default``).

    A marker mapped to ``None`` yields an unavailable (degraded) estimate. Every call is counted
    (``calls``, ``acalls``) and the queries seen are kept, so tests can check what was estimated.
    """

    method = "keyword"

    def __init__(
        self, table: Mapping[str, float | None], *, default: float = 0.9, whole: bool = False
    ) -> None:
        self.table = dict(table)
        self.default = default
        self.whole = whole
        self.calls = 0
        self.acalls = 0
        self.seen: list[Prompt] = []

    def _one(self, query: Prompt) -> Estimate:
        text = str(query) if self.whole else query_text(query)
        for marker, p in self.table.items():
            if marker in text:
                if p is None:
                    return Estimate.unavailable(self.method, f"marker {marker!r} means no estimate")
                return Estimate(p=p, method=self.method, details={"marker": marker})
        return Estimate(p=self.default, method=self.method)

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self.calls += 1
        self.seen.extend(queries)
        return [self._one(q) for q in queries]

    async def aestimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self.acalls += 1
        await asyncio.sleep(0)
        self.seen.extend(queries)
        return [self._one(q) for q in queries]
