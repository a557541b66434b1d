"""Offline vLLM: batch sampling for harvesting labels, and hidden-state features for probes.

:class:`VLLMBackend` wraps ``vllm.LLM`` as a :class:`capgate.Backend`: each query becomes one
request with ``SamplingParams(n=k)``, so the engine samples the k responses of a query together
and batches queries with each other. Its async twin runs the blocking engine in a worker thread.

:class:`VLLMFeaturizer` computes probe features with vLLM:

* ``layers="last"`` runs the model with vLLM's pooling runner (``runner="pooling"``,
  ``convert="embed"``, pooler ``LAST`` or ``MEAN`` without normalization), which returns the
  final hidden state (after the model's output norm) of the last prompt token, or its mean.
* ``layers=[i, j, ...]`` uses vLLM's ``extract_hidden_states`` speculative method with the
  ``ExampleHiddenStatesConnector``, which writes the states entering layers ``i, j, ...`` (index
  ``num_hidden_layers`` = the last layer's output, *not* normalized) to safetensors files; they
  are averaged over the chosen layers. That connector uses CUDA streams: it needs a GPU.

Either way the :class:`~capgate.features.FeatureSpec` records ``source="vllm"``, so a probe
trained on vLLM features is served only on vLLM features of the same spec, never mixed with
transformers features (whose layer indexing and numerics differ slightly).

vllm (and torch) are imported only when an engine is built; install the ``vllm`` extra.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

import numpy as np

from capgate.adapters.backends._usage import logaddexp as _logaddexp
from capgate.backend import ChatMessage, Generation, Prompt, SamplingParams, TokenLogprob, as_messages

if TYPE_CHECKING:
    from capgate.backend import EndpointKind
from capgate.errors import BackendError

__all__ = [
    "Pooling",
    "VLLMBackend",
    "VLLMFeaturizer",
    "feature_spec_fields",
    "parse_request_output",
    "pool_hidden_states",
    "vllm_sampling_kwargs",
]

Pooling: TypeAlias = Literal["last", "mean"]
"""``"last"``: the last prompt token's state; ``"mean"``: the mean over the prompt's tokens."""


def vllm_sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for capgate's :class:`~capgate.SamplingParams`.

    ``logprobs`` is vLLM's count of alternatives per position (it also returns the sampled token):
    ``top_logprobs`` when logprobs are wanted, else ``None``.

    Example:
        >>> vllm_sampling_kwargs(SamplingParams(n=8, seed=3, logprobs=True, top_logprobs=5))["logprobs"]
        5
    """
    want_logprobs = params.logprobs or params.top_logprobs > 0
    kwargs: dict[str, Any] = {
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "seed": params.seed,
        "logprobs": params.top_logprobs if want_logprobs else None,
    }
    if params.stop:
        kwargs["stop"] = list(params.stop)
    return kwargs


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -1e4


def parse_request_output(output: Any) -> list[Generation]:
    """Turn one ``vllm.RequestOutput`` (duck-typed) into capgate :class:`~capgate.Generation` s.

    Per-token logprobs map into ``Generation.tokens``: the sampled token (its decoded text and
    log-probability) and, in ``top``, every alternative vLLM returned, keyed by decoded text
    (alternatives that decode to the same text have their probabilities added).

    Raises:
        BackendError: The output lacks the expected fields.
    """
    try:
        prompt_tokens = len(output.prompt_token_ids or [])
        gens: list[Generation] = []
        for completion in sorted(output.outputs, key=lambda c: c.index):
            token_ids = list(completion.token_ids)
            tokens: list[TokenLogprob] | None = None
            if completion.logprobs is not None:
                tokens = []
                for token_id, position in zip(token_ids, completion.logprobs, strict=False):
                    position = position or {}
                    chosen = position.get(token_id)
                    top: dict[str, float] = {}
                    for alt in position.values():
                        text = alt.decoded_token if alt.decoded_token is not None else ""
                        lp = float(alt.logprob)
                        top[text] = lp if text not in top else _logaddexp(top[text], lp)
                    token_text = chosen.decoded_token if chosen is not None and chosen.decoded_token else ""
                    logprob = float(chosen.logprob) if chosen is not None else -math.inf
                    tokens.append(TokenLogprob(token=token_text, logprob=logprob, top=top))
            mean = sum(_finite(t.logprob) for t in tokens) / len(tokens) if tokens else None
            gens.append(
                Generation(
                    text=completion.text,
                    n_tokens=len(token_ids),
                    prompt_tokens=prompt_tokens,
                    mean_logprob=mean,
                    tokens=tokens,
                    finish_reason=completion.finish_reason,
                )
            )
        return gens
    except (AttributeError, TypeError, ValueError) as exc:
        raise BackendError(f"unexpected vLLM output: {type(exc).__name__}: {exc}") from exc


class VLLMBackend:
    """Offline vLLM engine as a capgate backend (batch sampling for harvesting).

    Args:
        model: Hub id or local Hugging Face folder.
        dtype: Weights dtype (``"auto"``, ``"float32"``, ``"bfloat16"``...).
        max_model_len: Context length to allocate for (smaller saves KV-cache memory).
        seed: Engine seed (per-request ``SamplingParams.seed`` still wins).
        enforce_eager: Skip graph capture (faster start, slower steps; useful on CPU).
        llm_kwargs: Further ``vllm.LLM`` arguments (``gpu_memory_utilization``, ``tensor_parallel_size``...).

    Example:
        >>> backend = VLLMBackend("HuggingFaceTB/SmolLM2-135M-Instruct")  # builds nothing yet
        >>> backend.model_id
        'HuggingFaceTB/SmolLM2-135M-Instruct'
    """

    endpoint: ClassVar[EndpointKind] = "vllm"
    """How this backend reaches its model (:func:`capgate.backend.backend_endpoint`)."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ValueError("`model` must be a hub id or a folder; got ''")
        self.model = model
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.seed = seed
        self.enforce_eager = enforce_eager
        self.llm_kwargs = dict(llm_kwargs or {})
        self._llm: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_llm(cls, llm: Any, *, model_id: str) -> VLLMBackend:
        """Wrap an already-built ``vllm.LLM``."""
        backend = cls(model_id)
        backend._llm = llm
        return backend

    def __repr__(self) -> str:
        return (
            f"VLLMBackend(model={self.model!r}, dtype={self.dtype!r}, max_model_len={self.max_model_len!r})"
        )

    @property
    def model_id(self) -> str:
        """The model's hub id or folder."""
        return self.model

    def engine_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments this backend builds its engine with."""
        kwargs: dict[str, Any] = {"model": self.model, "dtype": self.dtype, "seed": self.seed}
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.enforce_eager:
            kwargs["enforce_eager"] = True
        kwargs.update(self.llm_kwargs)
        return kwargs

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` engine, built on first use."""
        if self._llm is None:
            from vllm import LLM

            self._llm = LLM(**self.engine_kwargs())
        return self._llm

    def _sampling_params(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmSamplingParams

        return VllmSamplingParams(**vllm_sampling_kwargs(params))

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Sample ``params.n`` responses per prompt: one ``SamplingParams(n=...)`` request each.

        Raises:
            BackendError: The engine failed or returned something unexpected.
        """
        if not prompts:
            return []
        conversations: list[list[ChatMessage]] = [as_messages(p) for p in prompts]
        sampling = self._sampling_params(params)
        with self._lock:  # the offline engine is not thread-safe
            try:
                outputs = self.llm.chat(conversations, sampling_params=sampling, use_tqdm=False)
            except (RuntimeError, ValueError) as exc:
                raise BackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise BackendError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        results = [parse_request_output(o) for o in outputs]
        for got in results:
            if len(got) != params.n:
                raise BackendError(f"vLLM returned {len(got)} samples where n={params.n}")
        return results

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Async twin of :meth:`generate` (the offline engine runs in a worker thread)."""
        return await asyncio.to_thread(self.generate, prompts, params)


# ------------------------------------------------------------------------------ features


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


def _folder_fingerprint(folder: Path) -> str:
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


class VLLMFeaturizer:
    """Probe features of queries computed by vLLM (see the module docstring for the two modes).

    Args:
        model: Local Hugging Face folder (hub ids work too when ``weights_fingerprint`` is given).
        layers: ``"last"`` (pooling runner: final, normalized hidden state) or hidden-state
            indices for ``extract_hidden_states`` (``i`` = the state entering layer ``i``;
            ``num_hidden_layers`` = the last layer's output before the norm). GPU only.
        pooling: ``"last"`` prompt token or ``"mean"`` over the prompt.
        chat_template: Render the query with the chat template and generation prompt.
        weights_fingerprint: Digest of the weights for the spec; default:
            :func:`capgate.models.weights_fingerprint` of the folder (the same sha256 over its
            safetensors where that module is not installed).
        dtype: Engine dtype.
        max_model_len: Context length to allocate for.
        llm_kwargs: Further ``vllm.LLM`` arguments.
    """

    def __init__(
        self,
        model: str,
        *,
        layers: Literal["last"] | Sequence[int] = "last",
        pooling: Pooling = "last",
        chat_template: bool = True,
        weights_fingerprint: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if pooling not in ("last", "mean"):
            raise ValueError(f"`pooling` must be 'last' or 'mean'; got {pooling!r}")
        bad_layers = layers != "last" and (
            isinstance(layers, str) or not layers or not all(isinstance(i, int) and i >= 0 for i in layers)
        )
        if bad_layers:
            raise ValueError(f"`layers` must be 'last' or non-negative hidden-state indices; got {layers!r}")
        self.model = model
        self.layers = layers
        self.pooling: Pooling = pooling
        self.chat_template = chat_template
        self.weights_fingerprint = weights_fingerprint
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.llm_kwargs = dict(llm_kwargs or {})
        self._llm: Any = None
        self._storage: tempfile.TemporaryDirectory[str] | None = None
        self._lock = threading.Lock()

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

    def engine_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments for this featurizer's mode (no engine is built)."""
        kwargs: dict[str, Any] = {"model": self.model, "dtype": self.dtype}
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        if self.layers == "last":
            kwargs.update(
                runner="pooling",
                convert="embed",
                pooler_config={
                    "pooling_type": "LAST" if self.pooling == "last" else "MEAN",
                    "use_activation": False,
                },
            )
        else:
            if self._storage is None:
                self._storage = tempfile.TemporaryDirectory(prefix="capgate-vllm-hidden-")
            kwargs.update(
                enable_chunked_prefill=False,
                speculative_config={
                    "method": "extract_hidden_states",
                    "num_speculative_tokens": 1,
                    "draft_model_config": {
                        "hf_config": {"eagle_aux_hidden_state_layer_ids": sorted(set(self.layers))}
                    },
                },
                kv_transfer_config={
                    "kv_connector": "ExampleHiddenStatesConnector",
                    "kv_role": "kv_producer",
                    "kv_connector_extra_config": {"shared_storage_path": self._storage.name},
                },
            )
        kwargs.update(self.llm_kwargs)
        return kwargs

    @property
    def spec(self) -> Any:
        """The ``capgate.features.FeatureSpec`` of these features (``source="vllm"``)."""
        import importlib

        config = self._config()
        layers: Literal["all"] | tuple[int, ...] = (
            (int(config["num_hidden_layers"]),) if self.layers == "last" else tuple(sorted(set(self.layers)))
        )
        fields = feature_spec_fields(
            model_id=self.model,
            weights_fingerprint=self.weights_fingerprint or _folder_fingerprint(Path(self.model)),
            layers=layers,
            pooling=self.pooling,
            chat_template=self.chat_template,
            dim=int(config["hidden_size"]),
        )
        return importlib.import_module("capgate.features").FeatureSpec(**fields)

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` engine, built on first use."""
        if self._llm is None:
            from vllm import LLM

            self._llm = LLM(**self.engine_kwargs())
        return self._llm

    def _token_prompts(self, queries: Sequence[Prompt]) -> list[dict[str, list[int]]]:
        tokenizer = self.llm.get_tokenizer()
        prompts: list[dict[str, list[int]]] = []
        for query in queries:
            messages = as_messages(query)
            if self.chat_template:
                ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
                if isinstance(ids, Mapping):  # newer tokenizers return a BatchEncoding
                    ids = ids["input_ids"]
            else:
                ids = tokenizer.encode("\n".join(m["content"] for m in messages))
            prompts.append({"prompt_token_ids": [int(i) for i in ids]})
        return prompts

    def transform(self, queries: Sequence[Prompt]) -> np.ndarray:
        """Feature vectors of ``queries``: float32, shape ``(len(queries), dim)``."""
        if not queries:
            return np.zeros((0, int(self._config()["hidden_size"])), dtype=np.float32)
        with self._lock:
            prompts = self._token_prompts(queries)
            if self.layers == "last":
                outputs = self.llm.embed(prompts, use_tqdm=False)
                return np.asarray([o.outputs.embedding for o in outputs], dtype=np.float32)
            return self._extract(prompts)

    def _extract(self, prompts: list[dict[str, list[int]]]) -> np.ndarray:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )

        outputs = self.llm.generate(prompts, VllmSamplingParams(max_tokens=1), use_tqdm=False)
        rows: list[np.ndarray] = []
        for prompt, output in zip(prompts, outputs, strict=True):
            params = output.kv_transfer_params or {}
            path = params.get("hidden_states_path")
            if not path:
                raise BackendError(
                    "vLLM returned no hidden_states_path: is the extract_hidden_states connector set?"
                )
            data = load_hidden_states(path)
            try:
                states = data["hidden_states"].float().numpy()
            finally:
                cleanup_hidden_states(path)
            rows.append(pool_hidden_states(states, len(prompt["prompt_token_ids"]), self.pooling))
        return np.stack(rows).astype(np.float32)
