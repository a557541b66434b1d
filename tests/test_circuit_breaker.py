"""The OpenAI-compatible backend's circuit breaker and its honouring of ``Retry-After``, against the
fault-injection server (tests/_fault_server.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from _fault_server import FaultServer, Reply, chat_completion

from capgate import BackendError, SamplingParams
from capgate.adapters.backends._breaker import CircuitBreaker
from capgate.adapters.backends.openai import OpenAIBackend
from capgate.estimators import VerbalizedConfidence

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05, "timeout": 5.0}
DOWN = Reply({"error": {"message": "engine dead"}}, status=503)


def test_breaker_opens_after_consecutive_outages_and_fails_fast() -> None:
    with FaultServer(lambda body, i: DOWN) as server:
        be = OpenAIBackend("m", base_url=server.url, max_retries=9, circuit_failures=3, **FAST)
        with pytest.raises(BackendError, match=r"circuit open: 3 attempts in a row failed .*HTTP 503"):
            be.generate(["hi"], SamplingParams())
        assert len(server.requests) == 3  # the breaker ended the retries early
        start = time.monotonic()
        est = VerbalizedConfidence(be).estimate_one("q?")
        assert time.monotonic() - start < 0.5
        assert len(server.requests) == 3  # nothing more was sent
    assert est.degraded
    assert "circuit open" in (est.reason or "")
    assert be.circuit_ is not None
    assert be.circuit_.opened == 1
    assert be.circuit_.refused == 2


def test_half_open_trial_closes_the_circuit_when_the_server_is_back() -> None:
    def respond(body: dict[str, Any], i: int) -> Reply:
        return DOWN if i < 2 else Reply(chat_completion(["back"]))

    with FaultServer(respond) as server:
        be = OpenAIBackend(
            "m", base_url=server.url, max_retries=5, circuit_failures=2, circuit_cooldown_s=0.2, **FAST
        )
        with pytest.raises(BackendError, match="circuit open"):
            asyncio.run(be.agenerate(["hi"], SamplingParams()))
        time.sleep(0.25)
        (got,) = asyncio.run(be.agenerate(["hi"], SamplingParams()))
    assert got[0].text == "back"
    assert be.circuit_ is not None
    assert not be.circuit_.is_open


def test_a_failed_trial_reopens_the_circuit() -> None:
    breaker = CircuitBreaker(failures=1, cooldown_s=0.05)
    breaker.failed("HTTP 500")
    with pytest.raises(BackendError, match="not calling it for"):
        breaker.admit("srv")
    time.sleep(0.06)
    breaker.admit("srv")  # the trial
    with pytest.raises(BackendError, match=r"trial attempt .* in flight"):
        breaker.admit("srv")
    breaker.failed("HTTP 500")
    assert breaker.is_open
    assert breaker.opened == 2


def test_a_cancelled_attempt_counts_neither_as_an_answer_nor_as_an_outage() -> None:
    """A gate cancels an estimate past its deadline: the server did not answer, so the count of
    outages is not reset, and a cancelled trial leaves the circuit half-open, not closed."""
    breaker = CircuitBreaker(failures=2, cooldown_s=0.05)
    breaker.failed("HTTP 503")
    with pytest.raises(asyncio.CancelledError), breaker.watch("srv", lambda exc: "down"):
        raise asyncio.CancelledError
    breaker.failed("HTTP 503")
    assert breaker.is_open  # two outages in a row, the cancelled attempt between them counted neither way
    time.sleep(0.06)
    with pytest.raises(asyncio.CancelledError), breaker.watch("srv", lambda exc: "down"):  # the trial
        raise asyncio.CancelledError
    breaker.admit("srv")  # the place of the cancelled trial is free: this is the next trial
    with pytest.raises(BackendError, match=r"trial attempt .* in flight"):
        breaker.admit("srv")
    assert breaker.opened == 1


def test_rate_limits_do_not_open_the_circuit_and_retry_after_is_honoured() -> None:
    limited = Reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0.4"})
    stamps: list[float] = []

    def respond(body: dict[str, Any], i: int) -> Reply:
        stamps.append(time.monotonic())
        return limited if i < 3 else Reply(chat_completion(["ok"]))

    with FaultServer(respond) as server:
        be = OpenAIBackend(
            "m", base_url=server.url, max_retries=5, circuit_failures=2, backoff_initial=0.01, backoff_max=5.0
        )
        (got,) = be.generate(["hi"], SamplingParams())
    assert got[0].text == "ok"
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert all(gap >= 0.38 for gap in gaps[:3]), gaps  # waited as asked, not the 0.01 s back-off


def test_disabled_breaker_and_bad_settings() -> None:
    assert OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", circuit_failures=0).circuit_ is None
    with pytest.raises(ValueError, match="failures"):
        OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", circuit_failures=-1)
    with pytest.raises(ValueError, match="cooldown_s"):
        OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", circuit_cooldown_s=0)


def test_a_burst_after_the_cooldown_waits_for_the_trial_instead_of_failing() -> None:
    state = {"down": True}

    def respond(body: dict[str, Any], i: int) -> Reply:
        if state["down"]:
            return DOWN
        time.sleep(0.1)
        return Reply(chat_completion(["back"]))

    with FaultServer(respond) as server:
        be = OpenAIBackend(
            "m", base_url=server.url, max_retries=4, circuit_failures=1, circuit_cooldown_s=0.2,
            backoff_initial=0.05, backoff_max=0.5, timeout=5.0,
        )  # fmt: skip
        with pytest.raises(BackendError, match="circuit open"):
            be.generate(["hi"], SamplingParams())
        state["down"] = False
        time.sleep(0.25)
        got = asyncio.run(be.agenerate([f"q{i}" for i in range(8)], SamplingParams()))
    assert [g[0].text for g in got] == ["back"] * 8  # the others retried once the trial closed it
