"""Labelled data with a confidence column, read into arrays for calibration and replay."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from pydantic import ValidationError

from capgate._types import LabelledQuery
from capgate.errors import DataError

__all__ = ["LabelledArrays", "load_labelled"]


@dataclass(frozen=True)
class LabelledArrays:
    """Labelled queries as aligned arrays.

    Attributes:
        ids: Query ids.
        p: Confidence per query; NaN where the file records none (``null``): an unavailable estimate.
        k: Responses sampled per query.
        correct: Responses graded correct per query.
    """

    ids: tuple[str, ...]
    p: NDArray[np.float64]
    k: NDArray[np.int64]
    correct: NDArray[np.int64]

    @property
    def mu_hat(self) -> NDArray[np.float64]:
        """Empirical capability µ̂ = correct / k."""
        return self.correct / self.k


def load_labelled(path: str | Path, confidence: str) -> LabelledArrays:
    """Read a JSONL file of labelled queries and one confidence field.

    Each line is a :class:`~capgate.LabelledQuery` (``example_id`` / ``num_samples`` /
    ``num_correct`` are accepted as aliases) with a numeric ``confidence`` field in [0, 1], or
    ``null`` for a query whose estimate was unavailable. Blank lines are skipped.

    Args:
        path: The JSONL file.
        confidence: Name of the confidence field (``probe_conf_raw``...).

    Returns:
        The aligned arrays.

    Raises:
        DataError: A bad line, named by file, line and field.
    """
    ids: list[str] = []
    seen: dict[str, int] = {}
    p: list[float] = []
    k: list[int] = []
    correct: list[int] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read labelled data: {exc}", path=path) from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"not valid JSON: {exc.msg}", path=path, line=number) from None
        if not isinstance(row, dict):
            raise DataError(f"expected a JSON object; got {type(row).__name__}", path=path, line=number)
        try:
            query = LabelledQuery.model_validate(row)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(part) for part in err["loc"]) or None
            raise DataError(
                str(err["msg"]).removeprefix("Value error, "), path=path, line=number, field=field
            ) from None
        if confidence not in row:
            keys = ", ".join(sorted(row))
            raise DataError(f"missing (keys on this line: {keys})", path=path, line=number, field=confidence)
        value = row[confidence]
        if value is None:
            conf = math.nan
        elif isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
            conf = float(value)
        else:
            raise DataError(
                f"must be a number in [0, 1] or null; got {value!r}", path=path, line=number, field=confidence
            )
        if query.id in seen:
            raise DataError(
                f"duplicate id {query.id!r} (first on line {seen[query.id]})",
                path=path,
                line=number,
                field="id",
            )
        seen[query.id] = number
        ids.append(query.id)
        p.append(conf)
        k.append(query.k)
        correct.append(query.correct)
    if not ids:
        raise DataError("no labelled queries in the file", path=path)
    return LabelledArrays(
        ids=tuple(ids),
        p=np.asarray(p, dtype=np.float64),
        k=np.asarray(k, dtype=np.int64),
        correct=np.asarray(correct, dtype=np.int64),
    )
