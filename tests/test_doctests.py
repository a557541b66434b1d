"""Every example in a public docstring runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

# The remote path's modules (the OpenAI-compatible and vLLM backends, the black-box estimators) must
# keep examples: they are a user's first reading of those estimators.
MUST_HAVE_EXAMPLES = {
    f"capgate.{name}"
    for name in ("errors", "adapters.backends.openai", "adapters.backends.vllm", "estimators._parsing")
} | {f"capgate.estimators.{name}" for name in ("verbalized", "ptrue", "consistency", "fallback", "jsonl")}


def _modules() -> list[str]:
    names = {"capgate", "capgate.adapters", "capgate.policies"}
    for package in ("capgate", "capgate.adapters", "capgate.policies"):
        path = importlib.import_module(package).__path__
        names.update(info.name for info in pkgutil.walk_packages(path, prefix=f"{package}."))
    return sorted(names)


def test_the_modules_that_must_have_examples_exist() -> None:
    assert not MUST_HAVE_EXAMPLES - set(_modules())


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
    assert result.attempted > 0 or name not in MUST_HAVE_EXAMPLES, f"{name} has no examples"
