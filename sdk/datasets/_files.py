"""Reading and writing query datasets as JSON lines."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from pathlib import Path

from capgate._util.jsonl import atomic_write_lines, iter_json_objects, note_unique_id
from capgate._util.saved import read_saved
from capgate._util.validate import check_positive_int
from capgate.datasets._item import DatasetItem
from capgate.errors import DataError


def read_dataset(path: str | Path, *, limit: int | None = None) -> list[DatasetItem]:
    """Read a query dataset from a JSON-lines file (``.jsonl`` or ``.jsonl.gz``).

    Args:
        path: The file; one :class:`DatasetItem` object a line, blank lines ignored.
        limit: Keep only the first ``limit`` items.

    Returns:
        The items, in file order.

    Raises:
        DataError: A line is not JSON, misses or misspells a field, holds a bad value, or
            repeats an id; the error names the file, line and field.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "q.jsonl"
        >>> _ = p.write_text('{"id": "q1", "question": "2+3?", "answer": "5", "kind": "numeric"}\\n')
        >>> read_dataset(p)[0].references
        ['5']
    """
    path = Path(path)
    check_limit(limit)
    items: list[DatasetItem] = []
    first_line: dict[str, int] = {}
    for line, obj in islice(iter_json_objects(path), limit):
        item = read_saved(DatasetItem, obj, path, line=line)
        note_unique_id(first_line, item.id, path=path, line=line)
        items.append(item)
    return items


def write_dataset(items: Iterable[DatasetItem], path: str | Path) -> Path:
    """Write items as a JSON-lines dataset (gzip-compressed if ``path`` ends in ``.gz``), atomically.

    Raises:
        DataError: Two items share an id.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "q.jsonl"
        >>> _ = write_dataset([DatasetItem(id="q1", question="2+3?", references=["5"], kind="numeric")], p)
        >>> read_dataset(p)[0].id
        'q1'
    """
    path = Path(path)
    rows = list(items)
    check_unique_ids((item.id for item in rows), path)
    atomic_write_lines(path, (item.model_dump_json(exclude_defaults=True) for item in rows))
    return path


def check_unique_ids(ids: Iterable[str], path: str | Path) -> None:
    """Refuse a repeated id, naming both items (1-based) and where they come from."""
    seen: dict[str, int] = {}
    for index, item_id in enumerate(ids, start=1):
        if item_id in seen:
            raise DataError(
                f"duplicate id {item_id!r} (items {seen[item_id]} and {index})", path=path, field="id"
            )
        seen[item_id] = index


def check_limit(limit: int | None) -> None:
    """``limit`` is ``None`` or a positive integer."""
    if limit is not None:
        check_positive_int("limit", limit)
