"""Hidden-state features of queries, the input of capgate's linear capability probes.

The default feature is the paper's (arXiv 2602.13540): run the model over the query as it reads
it before answering (chat template with the generation prompt) and take the hidden state of the
*last prompt token*, averaged over *all layers including the embeddings* (the ``L + 1`` states
that ``output_hidden_states`` returns). Options: average a subset of those states instead, or
pool over all prompt tokens (a masked mean) instead of taking the last one.

A :class:`FeatureSpec` records everything that determines the features (model, weights,
layers, pooling, template, width, source), so a probe trained on one spec refuses another.

torch and transformers are imported only when features are computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from capgate._coalesce import Coalescer
from capgate._prefill import keep_prefill, prefill_cache, reusable
from capgate.backend import Prompt
from capgate.models import LoadedModel

__all__ = ["FeatureSpec", "HiddenStateFeaturizer", "Pooling"]

Pooling: TypeAlias = Literal["last", "mean"]
"""``"last"``: the last prompt token's state; ``"mean"``: the mean over the prompt's tokens."""


class FeatureSpec(BaseModel):
    """What a feature vector is: enough to refuse features from another model or recipe.

    Attributes:
        model_id: The model's id (hub id, converted name or folder).
        weights_fingerprint: Digest of the weights (see :func:`capgate.models.weights_fingerprint`).
        layers: ``"all"`` (embeddings and every layer), or the indices of the hidden states
            averaged, where 0 is the embeddings and ``i`` the output of layer ``i``.
        pooling: ``"last"`` prompt token, or ``"mean"`` over the prompt's tokens.
        chat_template: Whether the query went through the chat template (with the generation prompt).
        dim: Width of the feature vector.
        source: What computed the hidden states.

    Example:
        >>> spec = FeatureSpec(model_id="m", weights_fingerprint="sha256:0", dim=576)
        >>> spec.layers, spec.pooling, spec.chat_template
        ('all', 'last', True)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str = Field(min_length=1)
    weights_fingerprint: str = Field(min_length=1)
    layers: Literal["all"] | tuple[int, ...] = "all"
    pooling: Pooling = "last"
    chat_template: bool = True
    dim: int = Field(ge=1)
    source: Literal["transformers", "vllm"] = "transformers"

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


class HiddenStateFeaturizer:
    """Turns queries into hidden-state feature vectors of a loaded model.

    Args:
        loaded: The model, from :func:`capgate.models.load_model`.
        layers: ``"all"`` or hidden-state indices to average (0 = embeddings, ``i`` = layer ``i``;
            negative indices count from the last layer, ``-1`` being the final one).
        pooling: ``"last"`` (the last prompt token) or ``"mean"`` (masked mean over the prompt).
        chat_template: Apply the chat template with the generation prompt (the default, and what
            the sampling backend does); without it the message texts are read as plain text.
        batch_size: Queries per forward pass.

    Example:
        >>> from capgate.models import load_model
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
        batch_size: int = 8,
    ) -> None:
        if not isinstance(loaded, LoadedModel):
            raise TypeError(f"loaded must be a capgate.models.LoadedModel; got {type(loaded).__name__}")
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean'; got {pooling!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
        self.loaded = loaded
        self.layers = layers
        self.pooling = pooling
        self.chat_template = chat_template
        self.batch_size = batch_size
        self.layer_indices: tuple[int, ...] = self._resolve_layers(layers)
        self._coalescer: Coalescer[list[int], np.ndarray] = Coalescer(self._features)

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
        )

    def transform(self, queries: Sequence[Prompt]) -> np.ndarray:
        """Feature vectors of ``queries``: float32, shape ``(len(queries), spec.dim)``.

        Each row is the mean of the pooled hidden states in ``layer_indices``.

        Raises:
            ValueError: A query encodes to no tokens, or ``queries`` is a bare string.
        """
        encoded = self._encode(queries)
        if not encoded:
            return np.empty((0, self.loaded.hidden_size), dtype=np.float32)
        # Concurrent calls (a fan-out's threads) share batched forward passes.
        return np.stack(self._coalescer(encoded))

    def transform_layers(
        self, queries: Sequence[Prompt], *, poolings: Sequence[Pooling] | None = None
    ) -> np.ndarray:
        """Pooled hidden states per layer, one forward pass: shape ``(n, len(layer_indices), dim)``.

        With ``poolings``, every hidden state is pooled each of those ways in the same pass, and
        the shape is ``(n, len(poolings), len(layer_indices), dim)``.

        ``out[:, j]`` is the pooled state of hidden state ``layer_indices[j]``; the mean over any
        subset ``S`` of them is what a featurizer with ``layers=S`` (same pooling and template)
        returns from :meth:`transform`, which lets a trainer choose layers from one pass
        (see :class:`capgate.estimators.ProbeSearch`).

        Example:
            >>> from capgate.models import load_model
            >>> featurizer = HiddenStateFeaturizer(load_model("default", device="cpu"), layers=[3, 4])
            >>> featurizer.transform_layers(["What is 2+3?"]).shape
            (1, 2, 576)
            >>> featurizer.transform_layers(["What is 2+3?"], poolings=["last", "mean"]).shape
            (1, 2, 2, 576)

        Raises:
            ValueError: A query encodes to no tokens, or ``queries`` is a bare string.
        """
        if poolings is None:
            return self._run(self._encode(queries), (self.pooling,), stacked=True)[:, 0]
        for pooling in poolings:
            if pooling not in ("last", "mean"):
                raise ValueError(f"poolings must hold 'last' or 'mean'; got {pooling!r}")
        return self._run(self._encode(queries), tuple(poolings), stacked=True)

    def _encode(self, queries: Sequence[Prompt]) -> list[list[int]]:
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of queries; wrap a single query in a list")
        encoded = [self.loaded.prompt_ids(q, chat_template=self.chat_template) for q in queries]
        for index, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"queries[{index}] encodes to no tokens")
        return encoded

    def _features(self, encoded: list[list[int]]) -> np.ndarray:
        """The coalescer's batch function: one row per encoded query (the :meth:`transform` rows)."""
        return self._run(encoded, (self.pooling,), stacked=False)

    def _run(self, encoded: list[list[int]], poolings: tuple[Pooling, ...], *, stacked: bool) -> np.ndarray:
        import torch

        width = (len(poolings), len(self.layer_indices)) if stacked else ()
        features = np.empty((len(encoded), *width, self.loaded.hidden_size), dtype=np.float32)
        # Similar lengths share a batch: less padding, same results.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                pooled = self._batch([encoded[i] for i in chunk], poolings)
                if stacked:
                    n_layers = len(self.layer_indices)
                    per_pooling = [
                        torch.stack(pooled[j * n_layers : (j + 1) * n_layers], dim=1)
                        for j in range(len(poolings))
                    ]
                    features[chunk] = torch.stack(per_pooling, dim=1).cpu().numpy()
                else:
                    total = pooled[0].clone()
                    for state in pooled[1:]:
                        total += state
                    features[chunk] = (total / len(pooled)).cpu().numpy()
        return features

    def _batch(self, batch: list[list[int]], poolings: tuple[Pooling, ...]) -> list[Any]:
        """The pooled float32 states ``(len(batch), dim)``: per pooling, each of ``layer_indices``."""
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.loaded.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
        # Left padding: positions count real tokens only, so a padded row sees the same
        # positions as the query alone.
        position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
        device = self.loaded.model.device
        # The same pass fills the KV cache when the model may answer next (the shared prefill).
        shared = prefill_cache(self.loaded)
        outputs = self.loaded.model(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=position_ids.to(device),
            output_hidden_states=True,
            use_cache=shared.enabled,
            logits_to_keep=1,  # the last position's logits only: what an answer's first token needs
        )
        if shared.enabled and reusable(outputs.cache):
            keep_prefill(shared, batch, outputs.cache, outputs.logits)
        states = outputs.hidden_states
        keep = mask.to(device=device, dtype=torch.bool).unsqueeze(-1)
        pooled: list[Any] = []
        for pooling in poolings:
            for index in self.layer_indices:
                if pooling == "last":
                    # Slice before casting: only the last position is cast (same values).
                    pooled.append(states[index][:, -1, :].float())
                else:
                    state = states[index].float()
                    # where(), not a product: padded positions may hold non-finite values.
                    summed = torch.where(keep, state, torch.zeros_like(state)).sum(dim=1)
                    pooled.append(summed / keep.sum(dim=1).clamp(min=1))
        return pooled
