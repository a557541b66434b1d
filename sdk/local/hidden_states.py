"""Hidden-state features of queries, the input of capgate's linear capability probes.

The default feature is the paper's (arXiv 2602.13540): run the model over the query as it reads
it before answering (chat template with the generation prompt) and take the hidden state of the
*last prompt token*, averaged over *all layers including the embeddings* (the ``L + 1`` states
that ``output_hidden_states`` returns). Options: average a subset of those states instead, or
pool over all prompt tokens (a masked mean) instead of taking the last one.

A :class:`FeatureSpec` records everything that determines the features (model, weights, layers,
pooling, template, width, source), so a probe trained on one spec refuses another. torch and
transformers are imported only when features are computed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias, get_args

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from capgate.core.backend import Prompt
from capgate.local._coalesce import Coalescer
from capgate.local._reader import Reader
from capgate.local.models import LoadedModel
from capgate.local.prefill import keep_prefill, prefill_cache, reusable

__all__ = [
    "MAX_BATCH_TOKENS",
    "MAX_PADDING",
    "FeatureDType",
    "FeatureSpec",
    "HiddenStateFeaturizer",
    "Pooling",
    "ReadDType",
]

Pooling: TypeAlias = Literal["last", "mean"]
"""``"last"``: the last prompt token's state; ``"mean"``: the mean over the prompt's tokens."""

ReadDType: TypeAlias = Literal["float32", "bfloat16", "float16", "bf16-mixed"]
"""The number format of the reader's forward pass that made the features (``"bf16-mixed"``:
float32 with bfloat16 MLP matmuls, see :mod:`capgate.local._reader`)."""

FeatureDType: TypeAlias = Literal["auto", "float32", "bfloat16", "float16", "bf16-mixed"]
"""A featurizer's pass dtype: ``"auto"`` is the loaded model's own."""

_FEATURE_DTYPES: tuple[str, ...] = get_args(FeatureDType)


class FeatureSpec(BaseModel):
    """What a feature vector is: enough to refuse features from another model or recipe.

    Attributes:
        model_id: The model's id (hub id, converted name or folder).
        weights_fingerprint: Digest of the weights (see :func:`capgate.local.models.weights_fingerprint`).
        layers: ``"all"`` (embeddings and every layer), or the indices of the hidden states
            averaged, where 0 is the embeddings and ``i`` the output of layer ``i``.
        pooling: ``"last"`` prompt token, or ``"mean"`` over the prompt's tokens.
        chat_template: Whether the query went through the chat template (with the generation prompt).
        dim: Width of the feature vector.
        source: What computed the hidden states.
        dtype: The number format of the forward pass (a probe's spec: the one it was fitted on).
            A float32 spec is written without it, so older probes' specs read the same. A probe
            fitted in one dtype refuses features of another unless ``dtype`` is ignored
            (``load_estimator`` ignores it for a fast path the probe records as checked, or on request).

    Examples:
        >>> spec = FeatureSpec(model_id="m", weights_fingerprint="sha256:0", dim=576)
        >>> spec.layers, spec.pooling, spec.chat_template, spec.dtype
        ('all', 'last', True, 'float32')
        >>> "dtype" in spec.model_dump(), spec.model_copy(update={"dtype": "bfloat16"}).model_dump()["dtype"]
        (False, 'bfloat16')
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str = Field(min_length=1)
    weights_fingerprint: str = Field(min_length=1)
    layers: Literal["all"] | tuple[int, ...] = "all"
    pooling: Pooling = "last"
    chat_template: bool = True
    dim: int = Field(ge=1)
    source: Literal["transformers", "vllm"] = "transformers"
    dtype: ReadDType = "float32"

    @model_serializer(mode="wrap")
    def _drop_float32(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("dtype") == "float32":
            del data["dtype"]
        return data

    @field_validator("layers")
    @classmethod
    def _check_layers(cls, value: Literal["all"] | tuple[int, ...]) -> Literal["all"] | tuple[int, ...]:
        if value == "all":
            return value
        if not value:
            raise ValueError("layers must be 'all' or a non-empty list of hidden-state indices; got []")
        if any(i < 0 for i in value):
            raise ValueError(
                f"layers in a FeatureSpec are non-negative hidden-state indices; got {list(value)}"
            )
        if len(set(value)) != len(value) or list(value) != sorted(value):
            raise ValueError(f"layers must be sorted and distinct; got {list(value)}")
        return value


MAX_BATCH_TOKENS = 8192
"""Most padded tokens in one forward pass (rows × the longest row): short queries batch up to
``batch_size``, long ones in smaller passes, so memory stays bounded."""


MAX_PADDING = 0.2
"""Most share of padding in a forward pass before the next longer query starts a new one (a padded
position costs what a real one does; one pass of 32 of SmolLM2's held-out prompts is 60% padding)."""


class HiddenStateFeaturizer:
    """Turns queries into hidden-state feature vectors of a loaded model.

    The pass runs the model only up to the deepest hidden state read, keeps only the states (for
    ``"last"`` pooling, only the position it pools) and batches queries of similar lengths (left
    padded, positions counting real tokens: a padded row reads what the query alone reads). With
    the model's shared prefill on (a sampling backend of the same model exists,
    :mod:`capgate.local.prefill`), the pass is the model's full one in its own dtype, which the
    answer's generation continues.

    Args:
        loaded: The model, from :func:`capgate.local.models.load_model`.
        layers: ``"all"`` or hidden-state indices to average (0 = embeddings, ``i`` = layer ``i``;
            negative indices count from the last layer, ``-1`` being the final one).
        pooling: ``"last"`` (the last prompt token) or ``"mean"`` (masked mean over the prompt).
        chat_template: Apply the chat template with the generation prompt (the default, and what
            the sampling backend does); without it the message texts are read as plain text.
        batch_size: Most queries per forward pass (see also :data:`MAX_BATCH_TOKENS`); concurrent
            :meth:`transform` calls share passes (up to 32 queries, see :mod:`capgate.local._coalesce`).
        dtype: The number format of the pass, recorded in the spec: ``"auto"`` (the model's own),
            ``"float32"``, ``"bfloat16"``, ``"float16"`` (another than the model's runs a copy of the
            layers read; bfloat16 is fast on some CPUs, see :func:`capgate.local.models.bf16_pays_off`),
            or ``"bf16-mixed"`` (float32 with bfloat16 MLP matmuls: closer to float32, most of the speed).

    Examples:
        >>> from capgate.local.models import load_model
        >>> featurizer = HiddenStateFeaturizer(load_model("default", device="cpu"))
        >>> featurizer.transform(["What is 2+3?"]).shape
        (1, 576)
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        layers: Literal["all"] | Sequence[int] = "all",
        pooling: Pooling = "last",
        chat_template: bool = True,
        batch_size: int = 32,
        dtype: FeatureDType = "auto",
    ) -> None:
        if not isinstance(loaded, LoadedModel):
            raise TypeError(f"loaded must be a capgate.local.models.LoadedModel; got {type(loaded).__name__}")
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean'; got {pooling!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
        if dtype not in _FEATURE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(map(repr, _FEATURE_DTYPES))}; got {dtype!r}")
        self.loaded = loaded
        self.layers = layers
        self.pooling = pooling
        self.chat_template = chat_template
        self.batch_size = batch_size
        self.dtype: ReadDType = loaded.dtype if dtype == "auto" else dtype  # type: ignore[assignment]
        self.layer_indices: tuple[int, ...] = self._resolve_layers(layers)
        self._readers: dict[tuple[int, ...], Reader] = {}
        self._readers_lock = threading.Lock()
        self._coalescer: Coalescer[list[int], tuple[np.ndarray, str]] = Coalescer(self._features)

    def __repr__(self) -> str:
        return (
            f"HiddenStateFeaturizer(model={self.loaded.model_id!r}, layers={self.layers!r}, "
            f"pooling={self.pooling!r}, chat_template={self.chat_template!r}, "
            f"batch_size={self.batch_size!r}, dtype={self.dtype!r})"
        )

    def _resolve_layers(self, layers: Literal["all"] | Sequence[int]) -> tuple[int, ...]:
        n_states = self.loaded.num_hidden_layers + 1
        if isinstance(layers, str):
            if layers != "all":
                raise ValueError(f"layers must be 'all' or a list of ints; got {layers!r}")
            return tuple(range(n_states))
        resolved: set[int] = set()
        for index in layers:
            if isinstance(index, bool) or not isinstance(index, int):
                raise ValueError(f"layers must hold ints; got {index!r}")
            if not -n_states <= index < n_states:
                raise ValueError(
                    f"layer index {index} is out of range: the model has {n_states} hidden states "
                    f"(0 = embeddings .. {n_states - 1})"
                )
            resolved.add(index % n_states)
        if not resolved:
            raise ValueError("layers must be 'all' or a non-empty list of ints; got []")
        return tuple(sorted(resolved))

    def _uses_all_layers(self) -> bool:
        return len(self.layer_indices) == self.loaded.num_hidden_layers + 1

    @property
    def spec(self) -> FeatureSpec:
        """The :class:`FeatureSpec` of the features this featurizer produces."""
        return FeatureSpec(
            model_id=self.loaded.model_id,
            weights_fingerprint=self.loaded.weights_fingerprint,
            layers="all" if self._uses_all_layers() else self.layer_indices,
            pooling=self.pooling,
            chat_template=self.chat_template,
            dim=self.loaded.hidden_size,
            source="transformers",
            dtype=self.dtype,
        )

    def transform(self, queries: Sequence[Prompt]) -> np.ndarray:
        """Feature vectors of ``queries``: float32, shape ``(len(queries), spec.dim)``, each row the
        mean of the pooled hidden states in ``layer_indices``.

        Raises:
            ValueError: A query encodes to no tokens, or ``queries`` is a bare string.
        """
        return self.transform_with_details(queries)[0]

    def transform_with_details(self, queries: Sequence[Prompt]) -> tuple[np.ndarray, dict[str, Any]]:
        """:meth:`transform`'s features and ``{"dtype": ...}``: the pass's dtype (:attr:`dtype`, or the
        model's own when the pass was the shared prefill)."""
        encoded = self._encode(queries)
        if not encoded:
            return np.empty((0, self.loaded.hidden_size), dtype=np.float32), {"dtype": self.dtype}
        # Concurrent calls share batched passes; a call's rows come from one batch, so one dtype.
        rows = self._coalescer(encoded)
        return np.stack([row for row, _ in rows]), {"dtype": rows[0][1]}

    def transform_layers(
        self, queries: Sequence[Prompt], *, poolings: Sequence[Pooling] | None = None
    ) -> np.ndarray:
        """Pooled hidden states per layer, one forward pass: shape ``(n, len(layer_indices), dim)``;
        with ``poolings``, pooled each of those ways: ``(n, len(poolings), len(layer_indices), dim)``.

        ``out[:, j]`` is hidden state ``layer_indices[j]`` pooled; the mean over a subset ``S`` is what
        a featurizer with ``layers=S`` returns from :meth:`transform`, so a trainer can choose layers
        from one pass (:class:`capgate.estimators.ProbeSearch`).

        Examples:
            >>> from capgate.local.models import load_model
            >>> featurizer = HiddenStateFeaturizer(load_model("default", device="cpu"), layers=[3, 4])
            >>> featurizer.transform_layers(["What is 2+3?"]).shape
            (1, 2, 576)
            >>> featurizer.transform_layers(["What is 2+3?"], poolings=["last", "mean"]).shape
            (1, 2, 2, 576)

        Raises:
            ValueError: A query encodes to no tokens, or ``queries`` is a bare string.
        """
        if poolings is None:
            return self._run(self._encode(queries), (self.pooling,), stacked=True)[0][:, 0]
        for pooling in poolings:
            if pooling not in ("last", "mean"):
                raise ValueError(f"poolings must hold 'last' or 'mean'; got {pooling!r}")
        return self._run(self._encode(queries), tuple(poolings), stacked=True)[0]

    def _encode(self, queries: Sequence[Prompt]) -> list[list[int]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of queries; wrap a single query in a list")
        encoded = [self.loaded.prompt_ids(q, chat_template=self.chat_template) for q in queries]
        for index, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"queries[{index}] encodes to no tokens")
        return encoded

    def _features(self, encoded: list[list[int]]) -> list[tuple[np.ndarray, str]]:
        """The coalescer's batch function: per encoded query, its :meth:`transform` row and dtype."""
        features, dtype = self._run(encoded, (self.pooling,), stacked=False)
        return [(row, dtype) for row in features]

    def _reader(self) -> Reader:
        """The reader of :attr:`layer_indices` in :attr:`dtype`, built once (a copy of layers may be made)."""
        import torch

        key = self.layer_indices
        with self._readers_lock:
            reader = self._readers.get(key)
            if reader is None:
                mixed = self.dtype == "bf16-mixed"
                reader = self._readers[key] = Reader(
                    self.loaded.model,
                    self.loaded.num_hidden_layers,
                    key,
                    torch.float32 if mixed else getattr(torch, self.dtype),
                    mixed=mixed,
                )
            return reader

    def _run(
        self, encoded: list[list[int]], poolings: tuple[Pooling, ...], *, stacked: bool
    ) -> tuple[np.ndarray, str]:
        import torch

        width = (len(poolings), len(self.layer_indices)) if stacked else ()
        features = np.empty((len(encoded), *width, self.loaded.hidden_size), dtype=np.float32)
        # The shared prefill needs the model's full pass in its own dtype (the answer continues it).
        shared = prefill_cache(self.loaded)
        dtype = self.loaded.dtype if shared.enabled else self.dtype
        with torch.inference_mode():
            for chunk in self._chunks(encoded):
                pooled = self._batch([encoded[i] for i in chunk], poolings, shared=shared.enabled)
                if stacked:  # pooled holds each pooling's layers in turn
                    features[chunk] = torch.stack(pooled, dim=1).reshape(len(chunk), *width, -1).cpu().numpy()
                else:
                    total = pooled[0].clone()
                    for state in pooled[1:]:
                        total += state
                    features[chunk] = (total / len(pooled)).cpu().numpy()
        return features, dtype

    def _chunks(self, encoded: list[list[int]]) -> list[list[int]]:
        """Indices of ``encoded`` per forward pass, by length, within ``batch_size`` rows,
        :data:`MAX_BATCH_TOKENS` and :data:`MAX_PADDING`."""
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        chunks: list[list[int]] = []
        tokens = 0  # real tokens in the last chunk
        for index in order:
            width = len(encoded[index])  # the longest so far: the order is by length
            if chunks:
                cells = (len(chunks[-1]) + 1) * width
                padding = 1 - (tokens + width) / cells
                if len(chunks[-1]) < self.batch_size and cells <= MAX_BATCH_TOKENS and padding <= MAX_PADDING:
                    chunks[-1].append(index)
                    tokens += width
                    continue
            chunks.append([index])
            tokens = width
        return chunks

    def _batch(self, batch: list[list[int]], poolings: tuple[Pooling, ...], *, shared: bool) -> list[Any]:
        """The pooled float32 states ``(len(batch), dim)``: per pooling, each of ``layer_indices``."""
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.loaded.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
        device = self.loaded.model.device
        input_ids, mask, position_ids = input_ids.to(device), mask.to(device), position_ids.to(device)
        last_only = all(pooling == "last" for pooling in poolings)
        if shared:
            states = self._shared_pass(batch, input_ids, mask, position_ids)
        else:
            states = self._reader().states(input_ids, mask, position_ids, last_only=last_only)
        keep = mask.to(dtype=torch.bool).unsqueeze(-1)
        pooled: list[Any] = []
        for pooling in poolings:
            for index in self.layer_indices:
                state = states[index]
                if pooling == "last":
                    # Slice before casting: only the last position is cast (same values).
                    pooled.append((state if state.dim() == 2 else state[:, -1, :]).float())
                else:
                    full = state.float()
                    # where(), not a product: padded positions may hold non-finite values.
                    summed = torch.where(keep, full, torch.zeros_like(full)).sum(dim=1)
                    pooled.append(summed / keep.sum(dim=1).clamp(min=1))
        return pooled

    def _shared_pass(
        self, batch: list[list[int]], input_ids: Any, mask: Any, position_ids: Any
    ) -> dict[int, Any]:
        """The model's full pass, keeping its KV cache and last logits for the answer (the shared prefill)."""
        outputs = self.loaded.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            output_hidden_states=True,
            use_cache=True,
            logits_to_keep=1,  # the last position's logits only: what an answer's first token needs
        )
        if reusable(outputs.cache):
            keep_prefill(prefill_cache(self.loaded), batch, outputs.cache, outputs.logits)
        return {index: outputs.hidden_states[index] for index in self.layer_indices}
