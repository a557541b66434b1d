"""The local transformers backend.

The short import path of :mod:`capgate.adapters.backends.transformers`, where the code lives.
"""

from capgate.adapters.backends.transformers import *  # noqa: F403
from capgate.adapters.backends.transformers import __all__ as __all__
