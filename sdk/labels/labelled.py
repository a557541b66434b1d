"""Reading labelled query files (JSONL), with errors that name file, line and field."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capgate._util.jsonl import iter_json_objects, note_unique_id
from capgate._util.saved import read_saved
from capgate._util.validate import FloatArray, IntArray
from capgate.core.types import LabelledQuery
from capgate.errors import DataError

__all__ = ["LabelledSet", "iter_labelled", "read_labelled"]


def iter_labelled(path: str | Path) -> Iterator[tuple[int, LabelledQuery]]:
    """Yield ``(line_number, record)`` for each non-blank line of a labelled JSONL file.

    Raises:
        DataError: naming file, line and field, for a missing or unreadable file, invalid JSON, a
            non-object line, a record that fails validation, or an id seen on an earlier line.
            ``.gz`` files are read transparently.
    """
    path = Path(path)
    seen: dict[str, int] = {}
    for line_number, raw in iter_json_objects(path):
        record = read_saved(LabelledQuery, raw, path, line=line_number)
        note_unique_id(seen, record.id, path=path, line=line_number)
        yield line_number, record


@dataclass(frozen=True)
class LabelledSet:
    """Labelled queries as arrays, ready for the metrics.

    Attributes:
        path: Where they were read from.
        ids: Query ids, in file order.
        k: Responses sampled per query.
        correct: Correct responses per query.
        confidences: One array of predicted capabilities per requested field.
        records: The validated records.
    """

    path: Path
    ids: list[str]
    k: IntArray
    correct: IntArray
    confidences: dict[str, FloatArray] = field(default_factory=dict)
    records: list[LabelledQuery] = field(default_factory=list, repr=False)

    @property
    def mu_hat(self) -> FloatArray:
        """µ̂ = correct / k per query."""
        return self.correct / self.k

    def __len__(self) -> int:
        return len(self.ids)


def _confidence(record: LabelledQuery, name: str, path: Path, line: int, allow_missing: bool) -> float:
    extra = record.model_extra or {}
    if name not in extra:
        raise DataError("missing confidence field", path=path, line=line, field=name)
    value = extra[name]
    if value is None and allow_missing:
        return math.nan
    if value is None:
        raise DataError(
            "is null (the estimate was unavailable); drop or fill such records explicitly",
            path=path,
            line=line,
            field=name,
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:  # NaN too
        raise DataError(f"must be a number in [0, 1]; got {value!r}", path=path, line=line, field=name)
    return float(value)


def read_labelled(
    path: str | Path, *, confidence: Sequence[str] = (), allow_missing: bool = False
) -> LabelledSet:
    """Read a labelled JSONL file, with the named confidence columns, into arrays.

    Each line is one :class:`~capgate.LabelledQuery` (aliases of the paper's released data are
    accepted). Nothing is silently dropped: any bad record raises.

    Args:
        path: The JSONL file.
        confidence: Fields holding predicted capabilities to read (each must be in [0, 1]).
        allow_missing: Read a ``null`` confidence (an estimate that was unavailable) as NaN
            instead of raising; replaying a policy sends such queries to its fail-safe.

    Raises:
        DataError: naming file, line and field, for bad JSON, a missing or invalid field,
            p outside [0, 1] or NaN, correct > k, a duplicate id, or an empty file.

    Examples:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "l.jsonl"
        >>> _ = f.write_text('{"id": "a", "k": 4, "correct": 3, "conf": 0.7}\\n')
        >>> read_labelled(f, confidence=["conf"]).mu_hat.tolist()
        [0.75]
    """
    path = Path(path)
    ids: list[str] = []
    records: list[LabelledQuery] = []
    columns: dict[str, list[float]] = {name: [] for name in confidence}
    for line, record in iter_labelled(path):
        for name in confidence:
            columns[name].append(_confidence(record, name, path, line, allow_missing))
        ids.append(record.id)
        records.append(record)
    if not records:
        raise DataError("no records (the file is empty)", path=path)
    return LabelledSet(
        path=path,
        ids=ids,
        k=np.array([r.k for r in records], dtype=np.int64),
        correct=np.array([r.correct for r in records], dtype=np.int64),
        confidences={name: np.array(values, dtype=np.float64) for name, values in columns.items()},
        records=records,
    )
