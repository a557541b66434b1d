"""The OpenAI-compatible backend.

The short import path of :mod:`capgate.adapters.backends.openai`, where the code lives.
"""

from capgate.adapters.backends.openai import *  # noqa: F403
from capgate.adapters.backends.openai import __all__ as __all__
