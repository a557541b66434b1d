"""The function backend.

The short import path of :mod:`capgate.adapters.backends.function`, where the code lives.
"""

from capgate.adapters.backends.function import *  # noqa: F403
from capgate.adapters.backends.function import __all__ as __all__
