"""Backends: what estimators, harvests and CAS call *down* into to sample a model.

Each implements :class:`capgate.Backend` and/or :class:`capgate.AsyncBackend`:

* :mod:`capgate.adapters.backends.transformers`: :class:`TransformersBackend`, a local HF model
  (``load_backend``).
* :mod:`capgate.adapters.backends.openai`: :class:`OpenAIBackend`, any OpenAI-compatible server.
* :mod:`capgate.adapters.backends.vllm`: :class:`VLLMBackend` (vLLM's offline engine) and its
  featurizer.
* :mod:`capgate.adapters.backends.function`: :class:`FunctionBackend`, any function drawing one
  response.

The names below load their module (and its heavy dependency) on first access, so importing this
package costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capgate.adapters.backends.function import AsyncFunctionBackend, FunctionBackend
    from capgate.adapters.backends.openai import OpenAIBackend
    from capgate.adapters.backends.transformers import TransformersBackend, load_backend
    from capgate.adapters.backends.vllm import VLLMBackend, VLLMFeaturizer

__all__ = [
    "AsyncFunctionBackend",
    "FunctionBackend",
    "OpenAIBackend",
    "TransformersBackend",
    "VLLMBackend",
    "VLLMFeaturizer",
    "load_backend",
]

_WHERE = {
    "AsyncFunctionBackend": "function",
    "FunctionBackend": "function",
    "OpenAIBackend": "openai",
    "TransformersBackend": "transformers",
    "load_backend": "transformers",
    "VLLMBackend": "vllm",
    "VLLMFeaturizer": "vllm",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
