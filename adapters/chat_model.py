"""The LangChain chat model over any capgate backend.

The short import path of :mod:`capgate.adapters.agents.chat_model`, where the code lives.
"""

from capgate.adapters.agents.chat_model import *  # noqa: F403
from capgate.adapters.agents.chat_model import __all__ as __all__
