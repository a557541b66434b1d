"""What every bench's ``--smoke`` run shares: a temporary output folder and a tiny model.

A smoke run takes the bench's own code path in seconds, on tiny or synthetic data, and writes
only under a temporary folder (never ``bench/RESULTS.md``, ``bench/RELIABILITY.md`` or the
committed caches in ``bench/data``). ``tests/test_bench_smoke.py`` runs every bench's smoke mode.

The tiny model is a random-weight 2-layer, 32-wide Llama with the embedded SmolLM2's tokenizer and
chat template, built from a config (the test suite's ``tiny_model_dir``, passed in through
``CAPGATE_BENCH_TINY_MODEL``; built here into the temporary folder when that is not set).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TINY_MODEL_ENV = "CAPGATE_BENCH_TINY_MODEL"
TINY_PROBE_ENV = "CAPGATE_BENCH_TINY_PROBE"  # a probe tiny_probe built for that model (the test's, shared)


def smoke_dir(bench: str) -> Path:
    """A fresh temporary folder for one smoke run's outputs (printed, so a reader can look)."""
    folder = Path(tempfile.mkdtemp(prefix=f"capgate-smoke-{bench}-"))
    print(f"smoke run: outputs under {folder}")
    return folder


def left_out(what: str) -> None:
    """Say what a smoke run could not exercise (an optional service it cannot reach)."""
    print(f"smoke run: left out {what}")


def tiny_model(folder: Path | None = None) -> Path:
    """The tiny random-weight model's folder: ``$CAPGATE_BENCH_TINY_MODEL``, else built into ``folder``."""
    given = os.environ.get(TINY_MODEL_ENV)
    if given:
        return Path(given)
    from capgate.local.tiny import build_tiny_model

    out = (folder or Path(tempfile.mkdtemp(prefix="capgate-smoke-"))) / "tiny-llama"
    return build_tiny_model(out, lm_head_std=None)


def postgres_url(given: str | None = None) -> str | None:
    """The PostgreSQL server a smoke run may use (``given``, else the test suite's), or None.

    A smoke run never starts a server of its own; without one it says what it left out.
    """
    url = given or os.environ.get("CAPGATE_TEST_POSTGRES_URL")
    if not url:
        left_out("PostgreSQL (no --postgres and no $CAPGATE_TEST_POSTGRES_URL): SQLite only")
    return url


# ------------------------------------------------------------------ a fake OpenAI-compatible server

_REPLIES = ("The answer is 42. [confidence=80%]", "I think 7. [confidence=40%]", "Answer: B [confidence=95%]")


def _alternative(token: str, rank: int) -> str:
    """The token at ``rank`` among a position's top log-probs: the token itself, then Yes and No (so
    P(True) reads a probability off them), then fillers."""
    return token if rank == 0 else ("Yes", "No")[rank - 1] if rank <= 2 else f"alt{rank}"


def _completion(body: dict[str, Any], index: int) -> dict[str, Any]:
    n = int(body.get("n") or 1)
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    chat = "messages" in body
    choices = []
    # A request that asks for a \\boxed{P} confidence (verbalized confidence) gets one, varied by call.
    boxed = "boxed" in json.dumps(body.get("messages") or body.get("prompt") or "")
    for i in range(n):
        reply = _REPLIES[(index + i) % len(_REPLIES)]
        if boxed:
            reply = f"\\boxed{{{(index + i) % 9 / 10 + 0.1:.1f}}}"
        text = " ".join(reply.split()[:max_tokens])
        tokens = text.split()
        choice: dict[str, Any] = {"index": i, "finish_reason": "stop", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if body.get("logprobs"):
            top = int(body.get("top_logprobs") or 0)
            if chat:
                choice["logprobs"] = {
                    "content": [
                        {
                            "token": t,
                            "logprob": -0.1 * (j + 1),
                            "bytes": None,
                            "top_logprobs": [
                                {
                                    "token": _alternative(t, a),
                                    "logprob": -0.1 * (j + 1) - a - (index % 4) * 0.5 * (a == 2),
                                    "bytes": None,
                                }
                                for a in range(top)
                            ],
                        }
                        for j, t in enumerate(tokens)
                    ]
                }
            else:
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": [-0.1 * (j + 1) for j in range(len(tokens))],
                    "top_logprobs": [{t: -0.1 * (j + 1)} for j, t in enumerate(tokens)],
                    "text_offset": list(range(len(tokens))),
                }
        choices.append(choice)
    used = sum(len(text.split()) for text in (c.get("text") or c["message"]["content"] for c in choices))
    return {
        "id": f"smoke-{index}",
        "object": "chat.completion" if chat else "text_completion",
        "created": 0,
        "model": str(body.get("model") or FAKE_MODEL),
        "choices": choices,
        "usage": {"prompt_tokens": 11, "completion_tokens": used, "total_tokens": 11 + used},
    }


FAKE_MODEL = "smoke-model"


@contextlib.contextmanager
def fake_openai_server() -> Iterator[tuple[str, str]]:
    """An in-process OpenAI-compatible server on 127.0.0.1 (canned replies with a confidence tag and
    log-probs when asked, Yes and No among the top ones; ``\\boxed{P}`` to a request that asks for it):
    ``with fake_openai_server() as (base_url, model): ...``."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    count = itertools.count()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(
                {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model", "max_model_len": 2048}]}
            )

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(_completion(json.loads(raw or b"{}"), next(count)))

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", FAKE_MODEL
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def openai_server(base_url: str | None = None, model: str | None = None) -> Iterator[tuple[str, str]]:
    """The server a smoke run talks to: the one given, else the test suite's vLLM server
    ($CAPGATE_TEST_VLLM_URL / $CAPGATE_TEST_VLLM_MODEL), else :func:`fake_openai_server` (said)."""
    url = base_url or os.environ.get("CAPGATE_TEST_VLLM_URL")
    name = model or os.environ.get("CAPGATE_TEST_VLLM_MODEL")
    if url and name:
        print(f"smoke run: server {name} at {url}")
        yield url, name
        return
    left_out("a real vLLM server (no $CAPGATE_TEST_VLLM_URL): canned replies from an in-process fake one")
    with fake_openai_server() as pair:
        yield pair


def tiny_probe(model: Path, folder: Path) -> Path:
    """A linear probe for the tiny model (its hidden state 1, last prompt token), fitted for two epochs
    on a few prompts with made-up capabilities and saved in ``folder / "probe"``; or
    ``$CAPGATE_BENCH_TINY_PROBE``, one built by this function for ``$CAPGATE_BENCH_TINY_MODEL``."""
    given = os.environ.get(TINY_PROBE_ENV)
    if given and str(model) == os.environ.get(TINY_MODEL_ENV):
        return Path(given)
    import numpy as np

    from capgate.estimators import LinearProbe
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model

    out = folder / "probe"
    if (out / "probe.json").is_file():
        return out
    featurizer = HiddenStateFeaturizer(load_model(model, device="cpu"), layers=[1])
    prompts = [f"What is {a} + {a + 3}?" for a in range(24)]
    X = featurizer.transform(prompts)
    mu = np.random.default_rng(0).uniform(size=len(prompts))
    probe = LinearProbe(lr=1e-3, max_epochs=2, validation_fraction=None)
    probe.fit(X, mu, feature_spec=featurizer.spec).save(out)
    return out
