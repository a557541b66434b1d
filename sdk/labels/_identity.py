"""Stable names of the callables and graders a harvest records in its settings.

A resumed harvest (a new process) compares them with the file's, so a name must not depend on
the process: never a default ``repr`` with a memory address (``<Exact object at 0x...>``).
"""

from __future__ import annotations

import dataclasses
import re
from functools import partial
from types import MethodType

from capgate.grading import FunctionGrader

_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")
_MAX_DEPTH = 4


def dotted_name(obj: object) -> str:
    """``module.qualname`` of a function or class (for an instance, of its class)."""
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}" if module else str(name)


def stable_identity(obj: object, depth: int = 0) -> str:
    """What ``obj`` is, the same in every process: a value's ``repr``; a function's or class's
    dotted name; a partial's function and arguments; a dataclass's fields (as its ``repr`` shows
    them); an object's own ``repr`` when it has one without an address; else its class's dotted
    name with its attributes."""
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        return repr(obj)
    if depth >= _MAX_DEPTH:
        return dotted_name(type(obj))
    inner = depth + 1
    if isinstance(obj, partial):
        parts = [stable_identity(obj.func, inner), *(stable_identity(a, inner) for a in obj.args)]
        parts += [f"{key}={stable_identity(value, inner)}" for key, value in obj.keywords.items()]
        return f"functools.partial({', '.join(parts)})"
    if isinstance(obj, list | tuple):
        items = ", ".join(stable_identity(value, inner) for value in obj)
        return f"[{items}]" if isinstance(obj, list) else f"({items})"
    if isinstance(obj, set | frozenset):
        return "{" + ", ".join(sorted(stable_identity(value, inner) for value in obj)) + "}"
    if isinstance(obj, dict):
        pairs = (f"{stable_identity(k, inner)}: {stable_identity(v, inner)}" for k, v in obj.items())
        return "{" + ", ".join(pairs) + "}"
    if isinstance(obj, MethodType):
        return f"{stable_identity(obj.__self__, inner)}.{obj.__func__.__name__}"
    if hasattr(obj, "__qualname__"):  # a function, lambda, builtin or class
        return dotted_name(obj)
    if dataclasses.is_dataclass(obj):
        fields = (
            f"{f.name}={stable_identity(getattr(obj, f.name), inner)}"
            for f in dataclasses.fields(obj)
            if f.repr
        )
        return f"{type(obj).__qualname__}({', '.join(fields)})"
    if type(obj).__repr__ is not object.__repr__:
        text = repr(obj)
        if not _ADDRESS.search(text):
            return text
    attributes = getattr(obj, "__dict__", {})
    settings = ", ".join(f"{key}={stable_identity(value, inner)}" for key, value in attributes.items())
    return f"{dotted_name(type(obj))}({settings})"


def grader_identity(grader: object) -> str:
    """A grader as a harvest records it: :func:`stable_identity`, and for a
    :class:`~capgate.grading.FunctionGrader` its name or its function's (a named function by its
    ``__qualname__``, as recorded before)."""
    if isinstance(grader, FunctionGrader):
        fn = grader.fn
        name = grader.name or (fn.__qualname__ if hasattr(fn, "__qualname__") else stable_identity(fn))
        return f"FunctionGrader({name})"
    return stable_identity(grader)
