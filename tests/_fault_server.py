"""A tiny in-process HTTP server on 127.0.0.1 that misbehaves on demand.

Used ONLY for faults a real OpenAI-compatible server will not produce on request: rate limits,
5xx bursts, hangs past the client's time-out, truncated or garbage bodies, slow drips, garbage
completions.
Everything a real server does (sampling, n, logprobs, seeds) is tested against vLLM itself in
tests/test_vllm_server.py. Each request is answered by ``respond(body, index)``; every request
body is recorded. Hangs wait on a stop event, so shutting the server down ends them at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """A JSON reply."""

    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Raw:
    """Raw bytes; ``content_length`` may claim more than is sent (a truncated body)."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"
    content_length: int | None = None


@dataclass(frozen=True)
class Hang:
    """Say nothing for ``seconds`` (or until the server stops), then close."""

    seconds: float


@dataclass(frozen=True)
class Drip:
    """A JSON reply sent ``chunk`` bytes at a time, ``every`` seconds apart (a slow drip: each read
    comes within a client's read time-out, the whole body long after it)."""

    body: Any
    chunk: int = 8
    every: float = 0.2


Action = Reply | Raw | Hang | Drip
Respond = Callable[[dict[str, Any], int], Action]


def chat_completion(
    texts: list[str],
    *,
    logprobs: list[list[tuple[str, float, dict[str, float]]]] | None = None,
    prompt_tokens: int = 11,
    completion_tokens: int | None = None,
) -> dict[str, Any]:
    """A chat.completion body with one choice per text (optionally with per-token logprobs)."""
    choices = []
    for i, text in enumerate(texts):
        choice: dict[str, Any] = {
            "index": i,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "logprobs": None,
        }
        if logprobs is not None:
            choice["logprobs"] = {
                "content": [
                    {
                        "token": t,
                        "logprob": lp,
                        "bytes": None,
                        "top_logprobs": [{"token": a, "logprob": b, "bytes": None} for a, b in top.items()],
                    }
                    for t, lp, top in logprobs[i]
                ]
            }
        choices.append(choice)
    used = completion_tokens if completion_tokens is not None else sum(len(t.split()) for t in texts)
    return {
        "id": "cmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "fault-model",
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": used,
            "total_tokens": prompt_tokens + used,
        },
    }


class FaultServer:
    """Context manager: ``with FaultServer(respond) as server: server.url``."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsable": raw.decode("utf-8", "replace")}
                with server._lock:
                    index = len(server.requests)
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._act(server.respond(body, index))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (time-out): expected
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _act(self, action: Action) -> None:
                if isinstance(action, Hang):
                    server._stop.wait(action.seconds)
                    self.close_connection = True
                    return
                if isinstance(action, Drip):
                    self._drip(action)
                    return
                if isinstance(action, Reply):
                    payload = json.dumps(action.body).encode()
                    status, ctype, length, headers = (
                        action.status,
                        "application/json",
                        len(payload),
                        action.headers,
                    )
                else:
                    payload = action.body
                    status, ctype = action.status, action.content_type
                    length = action.content_length if action.content_length is not None else len(payload)
                    headers = {}
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(length))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                self.close_connection = True

            def _drip(self, action: Drip) -> None:
                payload = json.dumps(action.body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                for start in range(0, len(payload), action.chunk):
                    if server._stop.wait(action.every):
                        break
                    self.wfile.write(payload[start : start + action.chunk])
                    self.wfile.flush()
                self.close_connection = True

        return Handler

    def __enter__(self) -> FaultServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        assert self._httpd is not None
        assert self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
