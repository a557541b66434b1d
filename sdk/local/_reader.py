"""The probe's reader pass: a causal LM's hidden states, computed only up to the deepest one read.

A probe reads a few hidden states (the default one state 26 of SmolLM2's 31). :class:`Reader` runs
the model's own decoder (embeddings, mask and position code, layers, unchanged) and stops right
after the deepest state asked for, so its states are a full pass's with ``output_hidden_states=True``:
state 0 the embeddings, state ``i`` the output of layer ``i``; the last state (the final norm's
output) runs the whole decoder. The stop is a forward hook on each decoder layer, installed once per
layer list and active only in the context running a reader pass: another thread using the same
model (a sampling backend generating) never meets it.

A reader in another dtype than the model's runs a copy of the decoder in that dtype, holding only
the layers it runs (buffers, such as rotary frequencies, keep their dtype). A *mixed* reader
(``"bf16-mixed"``) runs a float32 copy whose ``mlp`` linears (gate, up, down) take bfloat16 weights
and bfloat16-rounded inputs, returning float32; all else (embeddings, norms, attention, residual
stream) stays float32. On the shipped probe that keeps the estimates within the fast-path check's
tolerance where a pure bfloat16 pass does not. torch is imported when a reader is built.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


class _StopReadingError(Exception):
    """Raised by the hook of the deepest layer read: the rest of the pass is not needed."""


@dataclass
class _Capture:
    layers: Any
    wanted: frozenset[int]
    stop: int
    last_only: bool
    states: dict[int, Any] = field(default_factory=dict)

    def record(self, index: int, hidden: Any) -> None:
        if index in self.wanted:
            # A copy of the last position only, when that is all the pooling reads: frees the rest.
            self.states[index] = hidden[:, -1, :].clone() if self.last_only else hidden
        if index == self.stop:
            raise _StopReadingError


_ACTIVE: ContextVar[_Capture | None] = ContextVar("capgate_reader_capture", default=None)
_HOOKED: weakref.WeakSet[Any] = weakref.WeakSet()
_HOOK_LOCK = threading.Lock()


def decoder_of(model: Any, num_hidden_layers: int) -> tuple[Any, Any] | None:
    """The model's decoder and its list of ``num_hidden_layers`` layers, or ``None`` if not found."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if decoder is None or layers is None or len(layers) != num_hidden_layers:
        return None
    return decoder, layers


def _install_hooks(layers: Any) -> None:
    """Hooks on every layer of ``layers`` that record and stop, for this list's captures only."""
    with _HOOK_LOCK:
        if layers in _HOOKED:
            return
        owner = weakref.ref(layers)

        def first_input(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            capture = _ACTIVE.get()
            if capture is not None and capture.layers is owner():
                capture.record(0, args[0] if args else kwargs["hidden_states"])

        def output_of(position: int) -> Any:
            def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
                capture = _ACTIVE.get()
                if capture is not None and capture.layers is owner():
                    capture.record(position + 1, output[0] if isinstance(output, tuple) else output)

            return hook

        layers[0].register_forward_pre_hook(first_input, with_kwargs=True)
        for position, layer in enumerate(layers):
            layer.register_forward_hook(output_of(position))
        _HOOKED.add(layers)


def _decoder_copy(decoder: Any, layers: Any, keep: int, dtype: Any) -> tuple[Any, Any]:
    """``decoder`` in ``dtype`` with only its first ``keep`` layers (buffers keep their dtype)."""
    import torch

    dropped = {id(layer): layer for layer in list(layers)[keep:]}  # shared, not copied, then let go
    clone = copy.deepcopy(decoder, memo=dict(dropped))
    clone.layers = torch.nn.ModuleList(list(clone.layers)[:keep])
    buffers = {name: buffer.dtype for name, buffer in clone.named_buffers()}
    clone.to(dtype)
    for name, buffer in list(clone.named_buffers()):
        if buffer.dtype != buffers[name]:
            owner_name, _, attr = name.rpartition(".")
            owner = clone.get_submodule(owner_name) if owner_name else clone
            setattr(owner, attr, buffer.to(buffers[name]))
    clone.eval()
    return clone, clone.layers


@functools.cache
def _bf16_linear_class() -> Any:
    """The bfloat16 stand-in of an ``nn.Linear`` (a class built once, torch imported lazily)."""
    import torch

    class BFloat16Linear(torch.nn.Module):
        """A linear layer with bfloat16 weights: inputs rounded to bfloat16, output (and the bias
        added after the matmul) in the input's dtype."""

        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.weight = torch.nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
            bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().clone(), False)
            self.bias = bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.nn.functional.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
            return out if self.bias is None else out + self.bias

    return BFloat16Linear


def _mix_bf16_matmuls(layers: Any) -> None:
    """Swap every ``nn.Linear`` of each layer's ``mlp`` for a bfloat16-weights one, in place.

    Raises:
        ValueError: A layer has no ``mlp`` with linear layers.
    """
    import torch

    for index, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        swapped = 0
        for module in list(mlp.modules()) if isinstance(mlp, torch.nn.Module) else []:
            for name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(module, name, _bf16_linear_class()(child))
                    swapped += 1
        if not swapped:
            raise ValueError(
                f"cannot mix bfloat16 matmuls into layer {index} ({type(layer).__name__}): "
                "it has no `mlp` with linear layers"
            )


class Reader:
    """Hidden states ``indices`` of ``model``, computed up to the deepest one, in ``dtype``.

    Args:
        model: A transformers causal LM (float32, bfloat16...).
        num_hidden_layers: Its decoder layers (the hidden states are ``0 .. num_hidden_layers``).
        indices: The hidden-state indices read.
        dtype: The torch dtype of the pass; another than the model's runs a copy of its decoder.
        mixed: Run the layers' MLP matmuls in bfloat16 (see the module), all else in ``dtype``.

    Raises:
        ValueError: ``dtype`` differs from the model's, or ``mixed`` is asked for, but the
            decoder layers (or their MLPs) cannot be found.
    """

    def __init__(
        self, model: Any, num_hidden_layers: int, indices: Sequence[int], dtype: Any, *, mixed: bool = False
    ) -> None:
        self.indices = tuple(sorted(set(indices)))
        self.deepest = self.indices[-1]
        self.dtype = dtype
        self.mixed = mixed
        self.truncated = False
        found = decoder_of(model, num_hidden_layers)
        model_dtype = next(model.parameters()).dtype
        if found is None:
            if dtype != model_dtype or mixed:
                what = f"{dtype} with bfloat16 MLP matmuls" if mixed else str(dtype)
                raise ValueError(
                    f"cannot run {type(model).__name__} in {what} beside its {model_dtype} weights: "
                    "its decoder layers were not found; load the model in that dtype instead"
                )
            self._module: Any = model
            self._layers: Any = None
            return
        decoder, layers = found
        # The last state is the final norm's output: that one needs the whole decoder.
        self.truncated = self.deepest < num_hidden_layers
        if dtype != model_dtype or mixed:
            keep = self.deepest if self.truncated else num_hidden_layers
            decoder, layers = _decoder_copy(decoder, layers, keep, dtype)
            if mixed:
                _mix_bf16_matmuls(layers)
        self._module = decoder
        self._layers = layers
        if self.truncated:
            _install_hooks(layers)

    def states(
        self, input_ids: Any, attention_mask: Any, position_ids: Any, *, last_only: bool
    ) -> dict[int, Any]:
        """The hidden states ``indices`` of a left-padded batch: ``{index: (rows, [tokens,] dim)}``.

        With ``last_only`` each state is the last position's only, ``(rows, dim)``.
        """
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        if not self.truncated:
            outputs = self._module(**inputs, output_hidden_states=True, use_cache=False)
            states = outputs.hidden_states
            return {i: states[i][:, -1, :] if last_only else states[i] for i in self.indices}
        capture = _Capture(self._layers, frozenset(self.indices), self.deepest, last_only)
        token = _ACTIVE.set(capture)
        try:
            self._module(**inputs, use_cache=False)
        except _StopReadingError:
            pass
        else:  # fail closed: the hooks never fired (say, a decoder that skips its layer list)
            raise RuntimeError(
                f"the reader pass of {type(self._module).__name__} ended before state {self.deepest}"
            )
        finally:
            _ACTIVE.reset(token)
        return capture.states
