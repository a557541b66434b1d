"""``capgate.adapters`` (the ``adapters/`` folder): capgate's bridges to other libraries, in two layers.

* :mod:`capgate.adapters.backends`: backends that estimators, harvests and CAS call *down* into
  (local transformers, OpenAI-compatible servers, vLLM, a plain function).
* :mod:`capgate.adapters.agents`: agent integrations that call *up* into :class:`capgate.Gate`
  (LangGraph, LangChain).

Each adapter has one import path, under its layer (``capgate.adapters.backends.openai``...), and
imports its heavy dependency (transformers, openai, vllm, langgraph, langchain) only when itself
imported, so importing :mod:`capgate.adapters` costs nothing.
"""

__all__: list[str] = []
