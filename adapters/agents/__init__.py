"""Agent integrations: what calls *up* into :class:`capgate.Gate` from an agent framework.

* :mod:`capgate.adapters.agents.langgraph`: capability node, decision router, gated answer
  subgraph, ``ToolCallGate``.
* :mod:`capgate.adapters.agents.langchain`: the ``CapabilityGate`` middleware for ``create_agent``.
* :mod:`capgate.adapters.agents.langchain_hooks`: capgate in LangChain's own hooks (the
  ``HumanInTheLoopMiddleware`` ``when`` predicate, a ``BaseDecisionModel``, ``ModelRouterMiddleware``).
* :mod:`capgate.adapters.agents.chat_model`: ``CapgateChatModel``, a LangChain chat model over any
  capgate backend.

Every integration takes the same keyword-only settings (``policy``, ``estimator``, ``step``,
``tool``, ``on_block``, ``log``, or ``gate=``) and acts on the :class:`~capgate.Decision` alone.
Each module imports its framework when imported, so this package itself costs nothing.
"""

__all__: list[str] = []
