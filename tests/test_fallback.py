"""FallbackChain: the first usable estimate wins; the rest is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from capgate import Cost, Estimate
from capgate.core.backend import Prompt
from capgate.estimators import CapabilityEstimator, FallbackChain


class Fixed(CapabilityEstimator):
    """Answers ``p`` for queries containing ``knows``, else is unavailable; counts its calls."""

    def __init__(self, method: str, p: float, knows: str = "", *, crash: bool = False) -> None:
        self.method = method
        self.p = p
        self.knows = knows
        self.crash = crash
        self.seen: list[Prompt] = []

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        if self.crash:
            raise RuntimeError(f"{self.method} exploded")
        self.seen.extend(queries)
        cost = Cost(calls=1, completion_tokens=2)
        return [
            Estimate(p=self.p, method=self.method, cost=cost)
            if self.knows in str(q)
            else Estimate.unavailable(self.method, f"{self.method} cannot", cost=cost)
            for q in queries
        ]


def test_first_usable_wins_and_later_links_see_only_the_rest() -> None:
    first, second = Fixed("probe", 0.9, knows="math"), Fixed("verbalized", 0.4)
    a, b = FallbackChain([first, second]).estimate(["math q", "other q"])
    assert (a.p, a.method, a.degraded) == (0.9, "probe", False)
    assert a.details["answered_by"] == "probe"
    assert a.details["attempts"] == []
    assert (b.p, b.method, b.degraded) == (0.4, "verbalized", True)
    assert b.details["attempts"] == [{"method": "probe", "reason": "probe cannot"}]
    assert "probe cannot" in (b.reason or "")
    assert "fallback to verbalized" in (b.reason or "")
    assert b.cost.calls == 2
    assert b.cost.completion_tokens == 4
    assert second.seen == ["other q"]


def test_all_failing_is_unavailable_listing_every_reason() -> None:
    est = FallbackChain([Fixed("a", 0.1, knows="zzz"), Fixed("b", 0.2, knows="zzz")]).estimate_one("q")
    assert est.p is None
    assert est.degraded
    assert est.method == "fallback"
    assert "a: a cannot" in (est.reason or "")
    assert "b: b cannot" in (est.reason or "")
    assert [x["method"] for x in est.details["attempts"]] == ["a", "b"]
    assert est.cost.calls == 2


def test_a_crashing_link_is_recorded_and_skipped() -> None:
    est = FallbackChain([Fixed("boom", 0.1, crash=True), Fixed("ok", 0.7)]).estimate_one("q")
    assert est.p == 0.7
    assert "RuntimeError: boom exploded" in est.details["attempts"][0]["reason"]


def test_async_matches_sync() -> None:
    chain = FallbackChain([Fixed("probe", 0.9, knows="math"), Fixed("verbalized", 0.4)])
    sync = chain.estimate(["math", "x"])
    got = asyncio.run(chain.aestimate(["math", "x"]))
    assert [(e.p, e.method, e.degraded) for e in got] == [(e.p, e.method, e.degraded) for e in sync]


def test_needs_two_estimators() -> None:
    with pytest.raises(ValueError, match="at least two"):
        FallbackChain([Fixed("a", 0.1)])
    with pytest.raises(TypeError, match="CapabilityEstimator"):
        FallbackChain([Fixed("a", 0.1), "nope"])  # type: ignore[list-item]
