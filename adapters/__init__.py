"""Backends and framework integrations for capgate.

Each adapter module imports its heavy dependency (transformers, openai, vllm, langgraph,
langchain) lazily, so importing :mod:`capgate.adapters` itself costs nothing.
"""

__all__: list[str] = []
