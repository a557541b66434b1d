"""The LangGraph integration.

The short import path of :mod:`capgate.adapters.agents.langgraph`, where the code lives.
"""

from capgate.adapters.agents.langgraph import *  # noqa: F403
from capgate.adapters.agents.langgraph import __all__ as __all__
