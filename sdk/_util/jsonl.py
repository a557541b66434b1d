"""JSON plumbing shared by the dataset, label and harvest code, and the one converter every
report uses to turn its figures into JSON data (:func:`json_ready`).

Every reader here reports bad input as a :class:`~capgate.errors.DataError` naming the file, the
1-based line and, for validation failures, the field.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path, PurePath
from typing import IO, Any

import numpy as np
from pydantic import BaseModel, ValidationError

from capgate._util.atomic import atomic_open, fsync_dir
from capgate.errors import DataError


def open_text(path: Path) -> IO[str]:
    """Open a ``.jsonl`` or ``.jsonl.gz`` file for reading text (UTF-8)."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def iter_json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file.

    Raises:
        DataError: A line is not valid JSON or not a JSON object.
    """
    try:
        handle = open_text(path)
    except FileNotFoundError:
        raise DataError("file not found", path=path) from None
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"invalid JSON ({exc.msg} at column {exc.colno})", path=path, line=number
                    ) from None
                if not isinstance(obj, dict):
                    raise DataError(
                        f"expected a JSON object; got {type(obj).__name__}", path=path, line=number
                    )
                yield number, obj
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise DataError(f"unreadable file: {exc}", path=path) from None


def open_append_only(path: Path, *, busy: str) -> int:
    """Open ``path`` (made if missing, with its folder) to append to alone: a file descriptor
    holding an exclusive lock, released when it is closed. Not POSIX: no lock is taken.

    Raises:
        DataError: with the message ``busy``, when another process holds the lock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        try:
            import fcntl
        except ModuleNotFoundError:  # pragma: no cover - not POSIX: no advisory locking
            pass
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DataError(busy, path=path) from None
        if created:
            fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_durably(fd: int, data: bytes) -> None:
    """Append ``data`` (whole lines) to a file from :func:`open_append_only`; fsynced on return."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


def cut_torn_tail(fd: int) -> int:
    """Cut off what a killed writer left at the end of an append-only JSON-lines file; return the bytes cut.

    A last line without its newline, or whose text is not JSON, is a write that did not finish,
    so it is truncated (and the truncation fsynced). Only the last line is looked at: a bad line
    before it is damage, for :func:`iter_json_objects` to report.
    """
    with open(fd, "rb", closefd=False) as handle:
        handle.seek(0)
        start, last = 0, b""
        for line in handle:
            start, last = start + len(last), line
    if not last or (last.endswith(b"\n") and (not last.strip() or _is_json(last))):
        return 0
    os.ftruncate(fd, start)
    os.fsync(fd)
    return len(last)


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return False
    return True


def data_error_from_validation(
    exc: ValidationError, *, path: str | Path | None, line: int | None
) -> DataError:
    """Turn pydantic's first validation error into a located :class:`DataError`."""
    first = exc.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in first["loc"]) or None
    message = str(first["msg"])
    if first.get("type") == "value_error":
        message = message.removeprefix("Value error, ")
    elif first.get("type") not in {"missing", "extra_forbidden"} and "input" in first:
        shown = repr(first["input"])
        if len(shown) > 80:
            shown = shown[:77] + "..."
        message = f"{message}; got {shown}"
    return DataError(message, path=path, line=line, field=loc)


def note_unique_id(seen: dict[str, int], item_id: str, *, path: str | Path, line: int) -> None:
    """Record that ``item_id`` is on ``line`` of ``path`` in ``seen``, or raise if an earlier line had it.

    Raises:
        DataError: ``item_id`` is already in ``seen`` (the error names both lines).
    """
    if item_id in seen:
        raise DataError(
            f"duplicate id {item_id!r} (first on line {seen[item_id]})", path=path, line=line, field="id"
        )
    seen[item_id] = line


def atomic_write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write text lines to ``path`` atomically (:func:`~capgate._util.atomic.atomic_open`),
    gzip-compressed if it ends in ``.gz``."""
    with atomic_open(path) as raw:
        sink: IO[bytes] | gzip.GzipFile = raw
        if path.name.endswith(".gz"):
            sink = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
        for line in lines:
            sink.write(line.encode("utf-8"))
            sink.write(b"\n")
        if sink is not raw:
            sink.close()


def json_ready(value: Any) -> Any:
    """``value`` as plain JSON data, the converter behind every report's ``to_dict``: dataclasses
    and pydantic models as dicts, tuples and arrays as lists, numpy scalars as numbers, dates, paths
    and mapping keys as text, and NaN or infinite floats as ``None`` (JSON has no such numbers).

    Examples:
        >>> import numpy as np
        >>> json_ready({1: (float("nan"), np.float64(0.5)), "n": np.int64(3)})
        {'1': [None, 0.5], 'n': 3}
    """
    if isinstance(value, np.generic):  # before float: np.float64 is a float
        return json_ready(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, BaseModel):
        return json_ready(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_ready({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, Mapping):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_ready(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    return value
