"""The peers workers' resumable JSON-lines caches (stdlib only: imported inside the peer venvs).

A worker appends one line per scored query after each batch and fsyncs it; a kill can leave at
most the last line cut short. :func:`append_rows` first cuts such a partial line off, so the rows
it appends start on a line of their own and a rerun reads every finished row (appending after the
fragment would fuse the next row into it, and every rerun would redo the rows after it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["append_rows", "read_rows"]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every complete row of ``path`` (none if it does not exist); a line cut short is skipped."""
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a killed run: recomputed
            continue
    return rows


def _drop_partial_line(path: Path) -> None:
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append ``rows`` as JSON lines and fsync them (after cutting off a partial last line)."""
    _drop_partial_line(path)
    with path.open("a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
