"""The LangChain middleware.

The short import path of :mod:`capgate.adapters.agents.langchain`, where the code lives.
"""

from capgate.adapters.agents.langchain import *  # noqa: F403
from capgate.adapters.agents.langchain import __all__ as __all__
