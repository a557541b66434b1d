"""Input checks shared by all of capgate: one place says what a valid input or setting is.

Arrays (metrics, labels) and settings (counts, budgets, bounds) are checked here, so every message
reads the same way: what was expected and what was got (``"`n` must be a positive integer; got 0"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ValidationError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
SettingsT = TypeVar("SettingsT", bound=BaseModel)


def settings_of(model: type[SettingsT], **values: Any) -> SettingsT:
    """``model(**values)``: settings checked by the pydantic model that declares them (the one
    place their bounds live), a bad one raising :class:`ValueError` naming it and its value.

    Examples:
        >>> from capgate.core.plans import ConfidenceGap
        >>> settings_of(ConfidenceGap, scale=0)
        Traceback (most recent call last):
        ...
        ValueError: `scale`: input should be greater than 0; got 0
    """
    try:
        return model(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = ".".join(str(part) for part in error["loc"])
        message = error["msg"][:1].lower() + error["msg"][1:]
        raise ValueError(f"`{name}`: {message}; got {error.get('input')!r}") from None


def _one_dimensional(name: str, array: NDArray[Any]) -> NDArray[Any]:
    """``array`` as 1-D (a scalar becomes length 1); rejects other shapes and empty input."""
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional; got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"`{name}` must not be empty")
    return array


def as_float_array(name: str, values: ArrayLike) -> FloatArray:
    """A 1-D float64 copy-free view of ``values``; rejects empty, NaN and infinite input."""
    array: FloatArray = _one_dimensional(name, np.asarray(values, dtype=np.float64))
    if not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"`{name}` must be finite; got {array[bad]} at index {bad}")
    return array


def as_probabilities(name: str, values: ArrayLike) -> FloatArray:
    """Like :func:`as_float_array`, and every value must lie in [0, 1]."""
    array = as_float_array(name, values)
    outside = (array < 0.0) | (array > 1.0)
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        raise ValueError(f"`{name}` must lie in [0, 1]; got {array[bad]} at index {bad}")
    return array


def as_counts(name: str, values: ArrayLike, *, minimum: int = 0) -> IntArray:
    """A 1-D int64 array of counts >= ``minimum``; rejects fractional, infinite and NaN values and
    values too large for int64."""
    raw = _one_dimensional(name, np.asarray(values))
    if raw.dtype.kind == "f":
        not_whole = ~np.isfinite(raw) | (raw != np.round(raw))
        if not_whole.any():
            bad = int(np.flatnonzero(not_whole)[0])
            raise ValueError(f"`{name}` must hold whole numbers; got {raw[bad]} at index {bad}")
        outside = (raw >= 2.0**63) | (raw < -(2.0**63))
    elif raw.dtype.kind == "u":
        outside = raw > np.iinfo(np.int64).max
    elif raw.dtype.kind in "ib":
        outside = np.zeros(raw.shape, dtype=bool)
    else:
        raise ValueError(f"`{name}` must hold integers; got dtype {raw.dtype}")
    if outside.any():  # astype(np.int64) would wrap them round silently
        bad = int(np.flatnonzero(outside)[0])
        raise ValueError(f"`{name}` must hold counts within int64's range; got {raw[bad]} at index {bad}")
    array = raw.astype(np.int64)
    if (array < minimum).any():
        bad = int(np.flatnonzero(array < minimum)[0])
        raise ValueError(f"`{name}` must be >= {minimum}; got {array[bad]} at index {bad}")
    return array


def same_length(**arrays: Any) -> int:
    """Check that all arrays have the same length and return it."""
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        described = ", ".join(f"`{n}` has {m}" for n, m in lengths.items())
        raise ValueError(f"inputs must have the same length; {described}")
    return next(iter(lengths.values()))


def check_positive_int(name: str, value: int) -> int:
    """A positive integer setting (bins, k, budgets)."""
    return check_int_at_least(name, value, 1, "a positive integer")


def check_int_at_least(name: str, value: int, minimum: int, what: str | None = None) -> int:
    """An integer setting >= ``minimum`` (bools and floats refused), as a plain ``int``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"`{name}` must be {what or f'an integer >= {minimum}'}; got {value!r}")
    return int(value)


def check_positive_number(name: str, value: float) -> float:
    """A finite number > 0 (a timeout, a rate), as a plain ``float``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not 0 < value < np.inf:
        raise ValueError(f"`{name}` must be a positive number; got {value!r}")
    return float(value)


def check_non_negative_number(name: str, value: float) -> float:
    """A finite number >= 0 (a latency, a penalty), as a plain ``float``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not 0 <= value < np.inf:
        raise ValueError(f"`{name}` must be a non-negative number; got {value!r}")
    return float(value)


def check_unit_interval(name: str, value: float, *, open_ends: bool = False) -> float:
    """A number in [0, 1] (in (0, 1) with ``open_ends``), as a plain ``float``."""
    return check_number_in(name, value, 0.0, 1.0, open_ends=open_ends)


def check_number_in(name: str, value: float, low: float, high: float, *, open_ends: bool = False) -> float:
    """A number in [low, high] (in (low, high) with ``open_ends``), as a plain ``float``."""
    ok = isinstance(value, int | float | np.number) and not isinstance(value, bool)
    inside = ok and ((low < value < high) if open_ends else (low <= value <= high))
    if not inside:
        interval = f"({low:g}, {high:g})" if open_ends else f"[{low:g}, {high:g}]"
        raise ValueError(f"`{name}` must be a number in {interval}; got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """A setting that must be one of ``choices`` (a ``Literal`` option such as a mode or a solver)."""
    if value not in choices:
        *most, last = (repr(choice) for choice in choices)
        listed = f"{', '.join(most)} or {last}" if most else last
        raise ValueError(f"`{name}` must be {listed}; got {value!r}")


def as_correct_and_k(correct: ArrayLike, k: ArrayLike | int, n: int) -> tuple[IntArray, IntArray]:
    """Counts of correct responses and of sampled responses, broadcast to length ``n``."""
    c = as_counts("correct", correct)
    ks = as_counts("k", np.broadcast_to(np.asarray(k), (n,)) if np.ndim(k) == 0 else k, minimum=1)
    same_length(correct=c, k=ks)
    if (c > ks).any():
        bad = int(np.flatnonzero(c > ks)[0])
        raise ValueError(f"`correct` must be <= `k`; got correct={c[bad]}, k={ks[bad]} at index {bad}")
    return c, ks
