"""Fault handling of the OpenAI-compatible backend and the estimators on top of it.

These tests talk to a pure in-process fault-injection server (tests/_fault_server.py) because
they need faults a real server will not produce on demand: 429 then success, 5xx bursts, a hang
past the client time-out, truncated and garbage bodies, garbage completions. Everything else --
sampling n, logprobs, seeds, the estimators end to end -- runs against a real vLLM server in
tests/test_vllm_server.py. Every fault ends in a clear BackendError or a degraded Estimate.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from _fault_server import FaultServer, Hang, Raw, Reply, chat_completion

from capgate import BackendError, SamplingParams
from capgate.adapters.backends.openai import OpenAIBackend
from capgate.estimators import FallbackChain, PTrue, VerbalizedConfidence

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}
RATE_LIMITED = Reply({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"})
OVERLOADED = Reply({"error": {"message": "engine overloaded"}}, status=500)


def backend(server: FaultServer, **kwargs: Any) -> OpenAIBackend:
    settings: dict[str, Any] = {"max_retries": 3, "timeout": 5.0, **FAST, **kwargs}
    return OpenAIBackend("fault-model", base_url=server.url, **settings)


def ok(texts: list[str] | None = None) -> Reply:
    return Reply(chat_completion(texts or ["\\boxed{0.7}"]))


def test_429_then_success_is_retried() -> None:
    with FaultServer(lambda body, i: RATE_LIMITED if i == 0 else ok(["hello"])) as server:
        (got,) = backend(server).generate(["hi"], SamplingParams())
    assert got[0].text == "hello"
    assert len(server.requests) == 2


def test_429_then_success_is_retried_async() -> None:
    with FaultServer(lambda body, i: RATE_LIMITED if i < 2 else ok(["hello"])) as server:
        (got,) = asyncio.run(backend(server).agenerate(["hi"], SamplingParams()))
    assert got[0].text == "hello"
    assert len(server.requests) == 3


def test_5xx_until_retries_run_out_raises_naming_the_error() -> None:
    with (
        FaultServer(lambda body, i: OVERLOADED) as server,
        pytest.raises(BackendError, match=r"HTTP 500 from .*engine overloaded.*after 3 attempts") as info,
    ):
        backend(server, max_retries=2).generate(["hi"], SamplingParams())
    assert len(server.requests) == 3
    assert info.value.retryable
    assert info.value.attempts == 3


def test_5xx_burst_becomes_a_degraded_estimate_naming_the_error() -> None:
    with FaultServer(lambda body, i: OVERLOADED) as server:
        est = VerbalizedConfidence(backend(server, max_retries=2)).estimate_one("What is 2+2?")
        assert len(server.requests) == 3  # the backend's retries, and no estimator re-asking on top
    assert est.p is None
    assert est.degraded
    assert "HTTP 500" in (est.reason or "")
    assert "engine overloaded" in (est.reason or "")


def test_other_4xx_is_not_retried() -> None:
    bad = Reply({"error": {"message": "max_tokens is too large"}}, status=400)
    with (
        FaultServer(lambda body, i: bad) as server,
        pytest.raises(BackendError, match=r"HTTP 400.*max_tokens is too large") as info,
    ):
        backend(server).generate(["hi"], SamplingParams())
    assert len(server.requests) == 1
    assert not info.value.retryable


def test_hang_past_the_timeout_is_retried_then_reported() -> None:
    with FaultServer(lambda body, i: Hang(30)) as server:
        start = time.monotonic()
        with pytest.raises(BackendError, match=r"timed out after 0.3s.*after 2 attempts"):
            backend(server, timeout=0.3, max_retries=1).generate(["hi"], SamplingParams())
        elapsed = time.monotonic() - start
    assert len(server.requests) == 2
    assert elapsed < 25  # it gave up on its own time-out, not the server's 30 s


def test_hang_then_success_recovers_async() -> None:
    with FaultServer(lambda body, i: Hang(30) if i == 0 else ok(["late but fine"])) as server:
        (got,) = asyncio.run(backend(server, timeout=0.3).agenerate(["hi"], SamplingParams()))
    assert got[0].text == "late but fine"


def test_truncated_body_is_retried_as_a_connection_error() -> None:
    cut = Raw(b'{"choices": [{"index": 0, "mess', content_length=400)
    with FaultServer(lambda body, i: cut if i == 0 else ok(["whole"])) as server:
        (got,) = backend(server).generate(["hi"], SamplingParams())
    assert got[0].text == "whole"
    with (
        FaultServer(lambda body, i: cut) as server,
        pytest.raises(BackendError, match=r"could not reach .*RemoteProtocolError"),
    ):
        backend(server, max_retries=1).generate(["hi"], SamplingParams())


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Raw(b"this is not json"), "malformed response .*JSONDecodeError"),
        (Raw(b"<html>gateway</html>", content_type="text/html"), "malformed response .*no choices"),
        (Reply({"unexpected": True}), "malformed response .*no choices"),
        (Reply({"choices": [{"index": 0}]}), "malformed response .*AttributeError"),
        (
            Reply({"choices": [{"index": 0, "message": {"content": 5}}]}),
            "malformed response .*content is int",
        ),
        (Reply(chat_completion(["only one"])), "asked for 3 samples, got 1"),
    ],
)
def test_garbage_bodies_raise_malformed_without_retrying(action: Reply | Raw, message: str) -> None:
    with FaultServer(lambda body, i: action) as server, pytest.raises(BackendError, match=message):
        backend(server).generate(["hi"], SamplingParams(n=3))
    assert len(server.requests) == 1


def test_garbage_completion_text_gives_an_unavailable_verbalized_estimate_after_3_tries() -> None:
    with FaultServer(lambda body, i: ok(["Absolutely! I am certain. 100 percent."])) as server:
        est = VerbalizedConfidence(backend(server), params=SamplingParams(seed=5)).estimate_one("q?")
    assert est.p is None
    assert "after 3 tries" in (est.reason or "")
    assert [r["seed"] for r in server.requests] == [5, 6, 7]
    assert est.cost.calls == 3
    assert est.cost.prompt_tokens == 33


def test_ptrue_without_logprobs_in_the_response_is_unavailable() -> None:
    with FaultServer(lambda body, i: ok(["Yes"])) as server:
        est = PTrue(backend(server)).estimate_one("q?")
    assert est.p is None
    assert "no logprobs" in (est.reason or "")
    assert server.requests[0]["logprobs"] is True
    assert server.requests[0]["top_logprobs"] == 20


def test_fallback_chain_over_a_flaky_server() -> None:
    yes_no = [[("Yes", math.log(0.6), {"Yes": math.log(0.6), "No": math.log(0.2)})]]

    def respond(body: dict[str, Any], i: int) -> Reply:
        if body.get("logprobs"):
            return Reply(chat_completion(["Yes"], logprobs=yes_no))
        return ok(["no idea, sorry"])

    with FaultServer(respond) as server:
        be = backend(server)
        est = FallbackChain([VerbalizedConfidence(be), PTrue(be)]).estimate_one("q?")
    assert est.method == "p_true"
    assert est.p == pytest.approx(0.75)
    assert est.degraded
    assert est.details["attempts"][0]["method"] == "verbalized"
    assert est.cost.calls == 4  # three verbalized tries, one P(True)

    with FaultServer(lambda body, i: OVERLOADED) as server:
        be = backend(server, max_retries=0)
        est = FallbackChain([VerbalizedConfidence(be), PTrue(be)]).estimate_one("q?")
    assert est.p is None
    assert est.method == "fallback"
    assert "verbalized: backend error" in (est.reason or "")
    assert "p_true: backend error" in (est.reason or "")


def test_concurrency_limit_holds_for_sync_and_async_batches() -> None:
    def slow(body: dict[str, Any], i: int) -> Reply:
        time.sleep(0.1)
        return ok(["x"])

    with FaultServer(slow) as server:
        be = backend(server, max_concurrency=2)
        assert len(be.generate([f"q{i}" for i in range(6)], SamplingParams())) == 6
        assert server.max_in_flight <= 2
        assert len(asyncio.run(be.agenerate([f"q{i}" for i in range(6)], SamplingParams()))) == 6
        assert server.max_in_flight <= 2
    assert len(server.requests) == 12


def test_unreachable_server_is_a_clear_error() -> None:
    with FaultServer(lambda body, i: ok()) as server:
        url = server.url
    dead = OpenAIBackend("m", base_url=url, max_retries=1, timeout=2.0, **FAST)
    with pytest.raises(BackendError, match="could not reach"):
        dead.generate(["hi"], SamplingParams())


def test_the_async_path_imports_openai_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ``import openai`` takes seconds: on the loop it would stall every call in flight
    (a shadow gate's own calls included). Concurrent first calls all import it in worker threads."""
    from capgate.adapters.backends import openai as module

    threads: list[str] = []
    real = module._import_openai

    def spy() -> Any:
        import threading

        threads.append(threading.current_thread().name)
        return real()

    monkeypatch.setattr(module, "_OPENAI", [])
    monkeypatch.setattr(module, "_import_openai", spy)

    async def calls() -> list[list[Any]]:
        be = backend(server)
        return await asyncio.gather(*(be.agenerate([f"q{i}"], SamplingParams()) for i in range(4)))

    with FaultServer(lambda body, i: ok(["fine"])) as server:
        got = asyncio.run(calls())
    assert [g[0][0].text for g in got] == ["fine"] * 4
    assert threads
    assert "MainThread" not in threads


def test_an_async_client_closes_with_its_event_loop(caplog: pytest.LogCaptureFixture) -> None:
    """One backend, ``asyncio.run`` twice (a script, a notebook, a test suite): each loop's client
    is closed on that loop when it shuts down, so none is left to be closed on a later loop at
    garbage collection (which failed with "Event loop is closed" and printed a traceback)."""
    import gc

    clients = []
    with FaultServer(lambda body, i: ok(["hello"])) as server:
        be = backend(server)

        async def one() -> str:
            (got,) = await be.agenerate(["hi"], SamplingParams())
            clients.append(be._async_states[asyncio.get_running_loop()][0])
            return got[0].text

        with caplog.at_level("ERROR", logger="asyncio"):
            assert asyncio.run(one()) == "hello"
            assert clients[0].is_closed()  # closed as its loop ended
            assert asyncio.run(one()) == "hello"  # a new loop: a new client
            gc.collect()
    assert clients[1] is not clients[0]
    assert clients[1].is_closed()
    assert not be._async_states  # a closed loop's client is dropped, not kept with its loop
    assert not [r for r in caplog.records if "Event loop is closed" in r.getMessage() or r.exc_info]


def test_aclose_closes_the_running_loops_client() -> None:
    with FaultServer(lambda body, i: ok(["hello"])) as server:
        be = backend(server)

        async def use_then_close() -> Any:
            await be.agenerate(["hi"], SamplingParams())
            loop = asyncio.get_running_loop()
            client = be._async_states[loop][0]
            await be.aclose()
            assert loop not in be._async_states
            return client

        assert asyncio.run(use_then_close()).is_closed()


def _counting_openai(built: list[Any]) -> Any:
    """The openai module with an ``AsyncOpenAI`` that records each client it makes."""
    import threading
    import types

    import openai

    lock = threading.Lock()

    def make(**kwargs: Any) -> Any:
        client = openai.AsyncOpenAI(**kwargs)
        with lock:
            built.append(client)
        return client

    return types.SimpleNamespace(AsyncOpenAI=make)


def test_the_first_async_batch_makes_one_client_and_keeps_the_concurrency_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every call of the first batch awaits the import of openai: only the first one back makes the
    loop's client (each making its own replaced and closed the others under their requests, and
    each came with max_concurrency slots of its own)."""
    from capgate.adapters.backends import openai as module

    built: list[Any] = []
    fake = _counting_openai(built)
    monkeypatch.setattr(module, "_OPENAI", [])
    monkeypatch.setattr(module, "_import_openai", lambda: fake)

    def slow(body: dict[str, Any], i: int) -> Reply:
        time.sleep(0.02)
        return ok(["x"])

    with FaultServer(slow) as server:
        be = backend(server, max_concurrency=1, max_retries=0)
        got = asyncio.run(be.agenerate([f"q{i}" for i in range(4)], SamplingParams()))
    assert [g[0].text for g in got] == ["x"] * 4
    assert len(built) == 1
    assert server.max_in_flight == 1
    assert built[0].is_closed()


def test_two_event_loops_in_two_threads_keep_their_own_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """One backend used by two threads, each running its own loop, calls in turn: each loop makes
    one client and keeps it (a shared slot had each call replace, and close, the other's)."""
    import threading

    from capgate.adapters.backends import openai as module

    built: list[Any] = []
    monkeypatch.setattr(module, "_OPENAI", [_counting_openai(built)])
    turns = [threading.Event() for _ in range(6)]
    errors: list[BaseException] = []

    with FaultServer(lambda body, i: ok(["x"])) as server:
        be = backend(server, max_retries=0)

        async def calls(mine: list[int]) -> None:
            for turn in mine:  # calls alternate between the threads: a, b, a, b, a, b
                if turn > 0:
                    assert turns[turn - 1].wait(5)
                try:
                    (got,) = await be.agenerate(["hi"], SamplingParams())
                    assert got[0].text == "x"
                finally:
                    turns[turn].set()

        def thread(mine: list[int]) -> None:
            try:
                asyncio.run(calls(mine))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=thread, args=([0, 2, 4],)),
            threading.Thread(target=thread, args=([1, 3, 5],)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert not errors
    assert len(server.requests) == 6
    assert len(built) == 2  # one client a loop, each kept for all its calls
    assert all(client.is_closed() for client in built)  # each closed as its own loop ended
