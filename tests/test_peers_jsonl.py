"""bench/peers/_jsonl.py: a peers worker's cache resumes after a kill that cut its last line short."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "peers"))

from _jsonl import append_rows, read_rows


def test_rows_appended_after_a_cut_line_are_all_read_back(tmp_path: Path) -> None:
    cache = tmp_path / "scores.jsonl"
    append_rows(cache, [{"id": "a", "s": 1}, {"id": "b", "s": 2}])
    with cache.open("a", encoding="utf-8") as handle:  # a kill in the middle of the next row
        handle.write('{"id": "c", "s"')
    assert [r["id"] for r in read_rows(cache)] == ["a", "b"]  # the fragment is not a row
    append_rows(cache, [{"id": "c", "s": 3}, {"id": "d", "s": 4}])  # the rerun redoes c only
    assert [r["id"] for r in read_rows(cache)] == ["a", "b", "c", "d"]
    assert cache.read_text(encoding="utf-8").count("\n") == 4  # no fragment left behind


def test_missing_and_empty_caches_read_as_no_rows(tmp_path: Path) -> None:
    assert read_rows(tmp_path / "none.jsonl") == []
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    append_rows(empty, [{"id": "x"}])
    assert [json.loads(line) for line in empty.read_text().splitlines()] == [{"id": "x"}]
