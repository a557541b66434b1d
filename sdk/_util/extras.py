"""Optional dependencies: check that an extra's packages are installed before a feature needs them."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from capgate.errors import MissingExtraError

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "local": ("torch", "transformers", "safetensors"),
    "openai": ("openai",),
    "plots": ("matplotlib",),
}
"""The top-level modules a feature needs from each extra of ``pyproject.toml``."""


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`~capgate.errors.MissingExtraError` naming ``extra`` if any module it brings is
    missing (found without importing them, so the check costs nothing when they are there).

    Examples:
        >>> require_extra("local", "a local model")  # installed here: no error
    """
    missing = [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(extra, missing, what)


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """``module``, imported; if it is missing, :class:`~capgate.errors.MissingExtraError` saying that
    ``what`` needs it and which extra of ``pyproject.toml`` brings it.

    Examples:
        >>> import_extra("json", "local", "reading JSON").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(extra, [module.partition(".")[0]], what) from None
