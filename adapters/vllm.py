"""The vLLM backend and featurizer.

The short import path of :mod:`capgate.adapters.backends.vllm`, where the code lives.
"""

from capgate.adapters.backends.vllm import *  # noqa: F403
from capgate.adapters.backends.vllm import __all__ as __all__
