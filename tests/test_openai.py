"""OpenAIBackend without I/O: settings, request building, response parsing, retry decisions.

The I/O paths are tested against a real vLLM server (test_vllm_server.py) and, for faults, an
in-process fault server (test_openai_faults.py).
"""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion

from capgate import AsyncBackend, Backend, BackendError, SamplingParams
from capgate.adapters.backends._openai_retry import retry_after_s as _retry_after_s
from capgate.adapters.backends._usage import apportion as _apportion
from capgate.adapters.backends._usage import split_tokens as _split_tokens
from capgate.adapters.backends.openai import OpenAIBackend, is_retryable


def _http() -> Any:
    """The HTTP library this openai release is built on (httpx, or httpx2 in newer ones)."""
    for name in ("httpx2", "httpx"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise AssertionError("no httpx")


def status_error(cls: type[Exception], code: int, headers: dict[str, str] | None = None) -> Exception:
    http = _http()
    response = http.Response(code, headers=headers or {}, request=http.Request("POST", "http://x/v1"))
    return cls("failed", response=response, body=None)  # type: ignore[call-arg]


def local(**kwargs: Any) -> OpenAIBackend:
    return OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", **kwargs)


def test_implements_both_protocols() -> None:
    backend = local()
    assert isinstance(backend, Backend)
    assert isinstance(backend, AsyncBackend)
    assert backend.model_id == "m"
    assert "OpenAIBackend(model='m'" in repr(backend)


def test_base_url_and_key_from_arguments_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1234/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    env = OpenAIBackend("m")
    assert env.base_url_ == "http://127.0.0.1:1234/v1"
    assert env._api_key == "sk-env"
    explicit = OpenAIBackend("m", base_url="http://127.0.0.1:1/v1", api_key="sk-arg")
    assert explicit.base_url_ == "http://127.0.0.1:1/v1"
    assert explicit._api_key == "sk-arg"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert OpenAIBackend("m")._api_key == "EMPTY"  # a local server needs no key
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIBackend("m")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"api": "completions"}, "api"),
        ({"backoff_initial": -1.0}, "back-off"),
    ],
)
def test_settings_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        local(**kwargs)
    with pytest.raises(ValueError, match="model"):
        OpenAIBackend("", base_url="http://x/v1")


def test_chat_request_carries_every_sampling_setting() -> None:
    backend = local(timeout=12.5, extra_body={"top_k": 5})
    params = SamplingParams(
        n=4, temperature=0.3, top_p=0.9, max_tokens=77, seed=3, logprobs=True, top_logprobs=7, stop=("\n\n",)
    )
    kwargs = backend.build_request([{"role": "user", "content": "Hi"}], params)
    assert kwargs == {
        "model": "m",
        "timeout": 12.5,
        "messages": [{"role": "user", "content": "Hi"}],
        "n": 4,
        "temperature": 0.3,
        "top_p": 0.9,
        "max_completion_tokens": 77,
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 7,
        "stop": ["\n\n"],
        "extra_body": {"top_k": 5},
    }
    plain = backend.build_request([{"role": "user", "content": "Hi"}], SamplingParams())
    assert "seed" not in plain
    assert "logprobs" not in plain
    assert "stop" not in plain


def test_responses_request_has_no_n_and_refuses_stop() -> None:
    backend = local(api="responses")
    kwargs = backend.build_request(
        [{"role": "user", "content": "Hi"}], SamplingParams(n=3, logprobs=True, top_logprobs=2)
    )
    assert "n" not in kwargs
    assert kwargs["input"] == [{"role": "user", "content": "Hi"}]
    assert kwargs["include"] == ["message.output_text.logprobs"]
    assert kwargs["top_logprobs"] == 2
    jobs = backend._jobs(["a", "b"], SamplingParams(n=3))
    assert [job.index for job in jobs] == [0, 0, 0, 1, 1, 1]  # n single-sample requests per prompt
    with pytest.raises(ValueError, match="stop"):
        backend.build_request([{"role": "user", "content": "Hi"}], SamplingParams(stop=("x",)))


def chat(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> Any:
    return ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": choices,
            "usage": usage or {"prompt_tokens": 9, "completion_tokens": 10, "total_tokens": 19},
        }
    )


def choice(
    index: int, text: str, logprobs: list[tuple[str, float, list[tuple[str, float]]]] | None = None
) -> dict[str, Any]:
    lp = None
    if logprobs is not None:
        lp = {
            "content": [
                {
                    "token": t,
                    "logprob": v,
                    "bytes": None,
                    "top_logprobs": [{"token": a, "logprob": b, "bytes": None} for a, b in top],
                }
                for t, v, top in logprobs
            ]
        }
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
        "logprobs": lp,
    }


def test_parse_chat_maps_logprobs_and_orders_choices() -> None:
    response = chat(
        [
            choice(1, "No", [("No", -0.5, [("No", -0.5), ("Yes", -1.0)])]),
            # Two token ids decoding to the same text: their probabilities add up.
            choice(
                0, "Yes!", [("Yes", -0.1, [("Yes", -0.1), ("Yes", -3.0), (" No", -2.5)]), ("!", -0.3, [])]
            ),
        ]
    )
    first, second = local().parse_response(response, 2)
    assert first.text == "Yes!"
    assert first.n_tokens == 2
    assert first.prompt_tokens == 9
    assert first.mean_logprob == pytest.approx(-0.2)
    assert first.tokens is not None
    assert first.tokens[0].top["Yes"] == pytest.approx(math.log(math.exp(-0.1) + math.exp(-3.0)))
    assert first.tokens[0].top[" No"] == -2.5
    assert second.text == "No"
    assert second.finish_reason == "stop"


def test_parse_chat_without_logprobs_splits_the_token_total_by_length() -> None:
    response = chat(
        [choice(0, "aaaa"), choice(1, "a")],
        usage={"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13},
    )
    a, b = local().parse_response(response, 2)
    assert (a.n_tokens, b.n_tokens) == (8, 2)  # split by text length
    assert a.tokens is None
    assert a.mean_logprob is None


def test_parse_errors_are_backend_errors() -> None:
    backend = local()
    with pytest.raises(BackendError, match="asked for 3 samples, got 1"):
        backend.parse_response(chat([choice(0, "x")]), 3)
    with pytest.raises(BackendError, match="no choices"):
        backend.parse_response(SimpleNamespace(choices=[]), 1)


def test_parse_responses_api_output() -> None:
    logprob = SimpleNamespace(
        token="Yes", logprob=-0.2, top_logprobs=[SimpleNamespace(token="No", logprob=-1.8)]
    )
    response = SimpleNamespace(
        output_text="Yes",
        output=[SimpleNamespace(content=[SimpleNamespace(logprobs=[logprob])])],
        status="incomplete",
        incomplete_details=SimpleNamespace(reason="max_output_tokens"),
        usage=SimpleNamespace(input_tokens=21, output_tokens=1),
    )
    (got,) = local(api="responses").parse_response(response, 1)
    assert got.text == "Yes"
    assert got.n_tokens == 1
    assert got.prompt_tokens == 21
    assert got.finish_reason == "length"
    assert got.tokens is not None
    assert got.tokens[0].top == {"No": -1.8}


@pytest.mark.parametrize(
    ("make", "retry"),
    [
        (lambda: status_error(openai.RateLimitError, 429), True),
        (lambda: status_error(openai.InternalServerError, 500), True),
        (lambda: status_error(openai.InternalServerError, 503), True),
        (lambda: status_error(openai.APIStatusError, 408), True),
        (lambda: status_error(openai.BadRequestError, 400), False),
        (lambda: status_error(openai.AuthenticationError, 401), False),
        (lambda: status_error(openai.NotFoundError, 404), False),
        (lambda: status_error(openai.UnprocessableEntityError, 422), False),
        (lambda: openai.APITimeoutError(request=_http().Request("POST", "http://x")), True),
        (lambda: openai.APIConnectionError(request=_http().Request("POST", "http://x")), True),
        (lambda: ValueError("x"), False),
    ],
)
def test_retry_decisions(make: Any, retry: bool) -> None:
    assert is_retryable(make()) is retry


def test_retry_after_header() -> None:
    assert _retry_after_s(status_error(openai.RateLimitError, 429, {"Retry-After": "2.5"})) == 2.5
    assert _retry_after_s(status_error(openai.RateLimitError, 429)) is None
    assert _retry_after_s(ValueError("no response")) is None
    assert _retry_after_s(status_error(openai.RateLimitError, 429, {"Retry-After": "soon-ish"})) is None
    past = _retry_after_s(
        status_error(openai.RateLimitError, 429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    )
    assert past == 0.0


def test_apportion_sums_to_the_total_under_the_cap() -> None:
    assert _apportion(10, [4, 1]) == [8, 2]
    assert _apportion(7, [1, 1, 1]) == [3, 2, 2]
    assert _apportion(5, [0, 0]) == [3, 2]
    assert _apportion(0, []) == []
    assert _apportion(10, [9, 1], cap=6) == [6, 4]
    assert _apportion(30, [1, 1], cap=6) == [6, 6]


def test_split_tokens_uses_the_length_limit_where_it_was_hit() -> None:
    assert _split_tokens(11, ["a"], ["length"], 8) == [11]  # one sample: the total is its count
    assert _split_tokens(20, ["long text", "x", "y"], ["length", "stop", "stop"], 8) == [8, 6, 6]
    counts = _split_tokens(22, ["aaaaaaaaaa", "a", "aaaa"], ["stop", "stop", "stop"], 8)
    assert sum(counts) == 22
    assert max(counts) <= 8


def test_import_is_lazy() -> None:
    import subprocess
    import sys

    code = "import capgate, capgate.adapters.backends.openai, sys; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
