"""The shared prefill: one forward pass over a prompt feeds both the probe and the answer.

:class:`~capgate.local.hidden_states.HiddenStateFeaturizer` keeps what its pass over a templated
prompt produced (the KV cache and the last position's logits) in the model's :class:`PrefillCache`,
keyed by the exact prompt token ids; the transformers sampling backend, on a hit, continues
generation from it instead of running the prompt again. A miss (another prompt, an expired entry)
takes the normal path: results never depend on a hit, only the work done does.

The cache is shared by every copy of a model with the same identity (weights fingerprint, device,
dtype, class, attention implementation), so an estimator and a backend loaded separately share it.
Entries are kept only while a consumer exists (a sampling backend enables its model's cache),
expire after ``ttl_s`` seconds (a resampled prompt reads the same entry until then), and the cache
holds at most ``max_entries`` entries and ``max_bytes`` bytes (oldest dropped first). No torch here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capgate.local.models import LoadedModel

__all__ = ["PrefillCache", "PrefillEntry", "keep_prefill", "prefill_cache", "reusable"]

DEFAULT_TTL_S = 30.0
DEFAULT_MAX_ENTRIES = 64
DEFAULT_MAX_BYTES = 512 << 20


@dataclass(frozen=True)
class PrefillEntry:
    """What one prompt's prefill left behind, without padding (batch dimension 1).

    Attributes:
        keys: Per layer, the keys of the prompt's tokens, ``(1, kv_heads, tokens, head_dim)``.
        values: Per layer, the values, same shape.
        logits: The last prompt position's logits, ``(1, 1, vocab)``.
    """

    keys: tuple[Any, ...]
    values: tuple[Any, ...]
    logits: Any
    nbytes: int = 0
    created: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, keys: Sequence[Any], values: Sequence[Any], logits: Any) -> PrefillEntry:
        """An entry, with its size in bytes counted from its tensors."""
        tensors = [*keys, *values, logits]
        size = sum(int(t.numel()) * int(t.element_size()) for t in tensors)
        return cls(keys=tuple(keys), values=tuple(values), logits=logits, nbytes=size)


class PrefillCache:
    """A bounded, thread-safe map from prompt token ids to :class:`PrefillEntry` (module docstring).

    Args:
        ttl_s: Seconds an entry stays usable after it was made.
        max_entries: Most entries kept (the oldest are dropped first).
        max_bytes: Most bytes of tensors kept (the oldest are dropped first).

    Examples:
        >>> cache = PrefillCache(max_entries=1)
        >>> cache.enabled
        False
        >>> cache.enable()
        >>> cache.put([1, 2], PrefillEntry(keys=(), values=(), logits=None))
        >>> cache.put([3], PrefillEntry(keys=(), values=(), logits=None))
        >>> cache.get([1, 2]) is None, cache.get([3]) is not None, len(cache)
        (True, True, 1)
    """

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.enabled = False
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, ...], PrefillEntry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            self._expire(time.monotonic())
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of tensors held now."""
        return self._bytes

    def enable(self) -> None:
        """Start keeping entries (a consumer, the sampling backend, exists)."""
        self.enabled = True

    def put(self, ids: Sequence[int], entry: PrefillEntry) -> None:
        """Keep ``entry`` for ``ids`` (no-op while disabled or if it alone is too big)."""
        if not self.enabled or entry.nbytes > self.max_bytes:
            return
        key = tuple(ids)
        with self._lock:
            self._drop(key)
            self._entries[key] = entry
            self._bytes += entry.nbytes
            self._expire(time.monotonic())
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, ids: Sequence[int]) -> PrefillEntry | None:
        """The live entry for the prompt ``ids``, or ``None``."""
        with self._lock:
            self._expire(time.monotonic())
            return self._entries.get(tuple(ids))

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.nbytes

    def _expire(self, now: float) -> None:
        # Entries are in insertion order, so the expired ones lead.
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.created < self.ttl_s:
                return
            self._drop(key)


_REGISTRY: dict[tuple[str, ...], PrefillCache] = {}
_REGISTRY_LOCK = threading.Lock()


def _identity(loaded: LoadedModel) -> tuple[str, ...]:
    model = loaded.model
    attention = str(getattr(model.config, "_attn_implementation", None))
    return (loaded.weights_fingerprint, loaded.device, loaded.dtype, type(model).__qualname__, attention)


def prefill_cache(loaded: LoadedModel) -> PrefillCache:
    """The prefill cache shared by every loaded copy of this model (same weights, device, dtype)."""
    key = _identity(loaded)
    with _REGISTRY_LOCK:
        cache = _REGISTRY.get(key)
        if cache is None:
            cache = _REGISTRY[key] = PrefillCache()
        return cache


def reusable(model_cache: Any) -> bool:
    """Whether a forward pass's cache can be kept: a plain dynamic cache of full attention layers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return isinstance(model_cache, DynamicCache) and all(
        type(layer) is DynamicLayer and layer.keys is not None for layer in model_cache.layers
    )


def keep_prefill(cache: PrefillCache, batch: Sequence[Sequence[int]], model_cache: Any, logits: Any) -> None:
    """Keep each row of a left-padded batch's prefill (its cache and last logits) under its ids.

    Args:
        cache: Where to keep the rows.
        batch: The rows' token ids, unpadded; the batch is as wide as its longest row.
        model_cache: The forward pass's dynamic cache.
        logits: The forward pass's last-position logits, ``(rows, 1, vocab)``.
    """
    width = max(len(ids) for ids in batch)
    layers = model_cache.layers
    for row, ids in enumerate(batch):
        start = width - len(ids)
        alone = len(batch) == 1  # the batch's own tensors, no copy

        def cut(tensor: Any, start: int = start, row: int = row, alone: bool = alone) -> Any:
            return tensor if alone else tensor[row : row + 1, :, start:, :].clone()

        entry = PrefillEntry.of(
            [cut(layer.keys) for layer in layers],
            [cut(layer.values) for layer in layers],
            logits if alone else logits[row : row + 1].clone(),
        )
        cache.put(ids, entry)
