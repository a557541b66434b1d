"""Generation that continues from a shared prefill (see :mod:`capgate.local.prefill`).

``model.generate`` starts with one forward pass over the (left-padded) prompt batch into an empty
KV cache. When every row's prompt has a live :class:`~capgate.local.prefill.PrefillEntry`, that pass
is served from the entries: their keys and values, left-padded with zeros (padding is masked), go
into generate's own cache and their last logits are returned. Everything after it (processors,
sampling and its RNG draws, stopping) is generate's own code, so the tokens are the same.

A thin wrapper around the model's ``forward``, installed once per model, serves only a call
staged by the same thread for exactly these input ids into an empty cache, and delegates every
other call unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from capgate.local.models import LoadedModel
from capgate.local.prefill import PrefillEntry, prefill_cache

_INSTALL_LOCK = threading.Lock()
_WRAPPED = "_capgate_prefill_wrapper"


@dataclass
class Staged:
    """A batch's prefill, assembled: what generate's first forward pass returns."""

    input_ids: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor


class _Local(threading.local):
    staged: Staged | None = None


_LOCAL = _Local()


def _pad_cat(parts: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Left-pad each ``(1, heads, tokens, dim)`` part to ``width`` tokens with zeros and stack rows."""
    first = parts[0]
    if len(parts) == 1 and first.shape[2] == width:
        return first
    out = first.new_zeros((len(parts), first.shape[1], width, first.shape[3]))
    for row, part in enumerate(parts):
        out[row, :, width - part.shape[2] :, :] = part[0]
    return out


def stage_prefill(
    loaded: LoadedModel, batch: Sequence[Sequence[int]], input_ids: torch.Tensor
) -> Staged | None:
    """The batch's assembled prefill if every row's prompt has a live entry, else ``None``."""
    cache = prefill_cache(loaded)
    if not cache.enabled:
        return None
    entries: list[PrefillEntry] = []
    for ids in batch:
        entry = cache.get(ids)
        if entry is None:
            return None
        entries.append(entry)
    width = input_ids.shape[1]
    layers = len(entries[0].keys)
    device = input_ids.device
    keys = [_pad_cat([e.keys[i] for e in entries], width).to(device) for i in range(layers)]
    values = [_pad_cat([e.values[i] for e in entries], width).to(device) for i in range(layers)]
    logits = torch.cat([e.logits for e in entries], dim=0).to(device)
    return Staged(input_ids=input_ids, keys=keys, values=values, logits=logits)


def _serve(staged: Staged, kwargs: dict[str, Any]) -> CausalLMOutputWithPast | None:
    cache = kwargs.get("cache")
    ids = kwargs.get("input_ids")
    if type(cache) is not DynamicCache or ids is None or not torch.equal(ids, staged.input_ids):
        return None  # only generate's own fresh dynamic cache, for exactly these ids
    if cache.get_seq_length() != 0:
        return None
    for index, (keys, values) in enumerate(zip(staged.keys, staged.values, strict=True)):
        cache.update(keys, values, index)
    return CausalLMOutputWithPast(logits=staged.logits, cache=cache)


def _install(model: Any) -> None:
    with _INSTALL_LOCK:
        if getattr(model, _WRAPPED, False):
            return
        original = model.forward

        @functools.wraps(original)  # keeps the signature generate inspects (logits_to_keep...)
        def forward(*args: Any, **kwargs: Any) -> Any:
            staged = _LOCAL.staged
            if staged is not None and not args:
                _LOCAL.staged = None  # one-shot: only generate's first pass may be served
                served = _serve(staged, kwargs)
                if served is not None:
                    return served
            return original(*args, **kwargs)

        model.forward = forward
        setattr(model, _WRAPPED, True)


@contextlib.contextmanager
def reuse_prefill(model: Any, staged: Staged | None) -> Iterator[None]:
    """Within the block, this thread's next forward pass of ``model`` is served by ``staged``."""
    if staged is None:
        yield
        return
    _install(model)
    _LOCAL.staged = staged
    try:
        yield
    finally:
        _LOCAL.staged = None
