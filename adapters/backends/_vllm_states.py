"""A request's saved hidden states: reading the files, and turning them into probe features.

Shared by the server and offline featurizers; re-exported by
:mod:`capgate.adapters.backends.vllm_hidden_states`. Needs no vllm (torch only for bfloat16 files).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias

import numpy as np

from capgate.errors import BackendError
from capgate.local.weights import weights_fingerprint

Pooling: TypeAlias = Literal["last", "mean"]
"""``"last"``: the last prompt token's state; ``"mean"``: the mean over the prompt's tokens."""


def feature_spec_fields(
    *,
    model_id: str,
    weights_fingerprint: str,
    layers: Literal["all"] | Sequence[int],
    pooling: Pooling,
    chat_template: bool,
    dim: int,
) -> dict[str, Any]:
    """The fields of a ``capgate.local.hidden_states.FeatureSpec`` for vLLM-computed features
    (``source="vllm"``).

    Examples:
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

    Examples:
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
    """The weights digest :mod:`capgate.local.models` records
    (:func:`capgate.local.models.weights_fingerprint`)."""
    return weights_fingerprint(folder)


def _model_id(folder: Path, model: str) -> str:
    """The model id :func:`capgate.local.models.load_model` gives the same folder (so specs can match)."""
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

    Examples:
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
        with contextlib.ExitStack() as held:  # the lock, if there is one, is held across the read
            try:
                handle = held.enter_context(open(lock))
            except FileNotFoundError:
                handle = None
            if handle is not None:
                fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                from safetensors.numpy import load_file

                data: dict[str, Any] = load_file(path)
            except (TypeError, ValueError):  # bfloat16 has no numpy dtype
                from safetensors.torch import load_file as load_torch

                data = {k: v.float().numpy() for k, v in load_torch(path).items()}
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
        """The ``capgate.local.hidden_states.FeatureSpec`` of these features (``source="vllm"``).

        Model id and weights fingerprint are what :func:`capgate.local.models.load_model` records for
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
        return importlib.import_module("capgate.local.hidden_states").FeatureSpec(**fields)


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
