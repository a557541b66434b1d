"""The docstring examples of the remote-path modules run and give what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "capgate.errors",
    "capgate.adapters.backends.openai",
    "capgate.adapters.backends.vllm",
    "capgate.estimators._parsing",
    "capgate.estimators.verbalized",
    "capgate.estimators.ptrue",
    "capgate.estimators.consistency",
    "capgate.estimators.fallback",
    "capgate.estimators.jsonl",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
