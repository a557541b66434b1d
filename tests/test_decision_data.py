"""Reading labelled JSONL with a confidence column (capgate.decision._data)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from capgate.decision._data import load_labelled
from capgate.errors import DataError

MATH500 = Path(__file__).resolve().parents[1] / "examples" / "data" / "math500_gpt-oss-20b_probe-math.jsonl"


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "labels.jsonl"
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    return path


def test_reads_the_math500_example_with_its_aliases() -> None:
    data = load_labelled(MATH500, "probe_conf_raw")
    assert len(data.ids) == 500
    assert data.ids[0] == "math500_test_0"
    assert np.all(data.k == 100)
    rows = [json.loads(line) for line in MATH500.read_text(encoding="utf-8").splitlines()]
    assert data.mu_hat == pytest.approx(np.array([r["expected_accuracy"] for r in rows]))
    assert data.p == pytest.approx(np.array([r["probe_conf_raw"] for r in rows]))


def test_null_confidence_is_a_missing_estimate_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"id": "a", "k": 4, "correct": 3, "conf": 0.7},
        "",
        {"id": "b", "k": 2, "correct": 0, "conf": None},
    )
    data = load_labelled(path, "conf")
    assert data.ids == ("a", "b")
    assert data.p[0] == 0.7
    assert math.isnan(data.p[1])
    assert list(data.mu_hat) == [0.75, 0.0]


@pytest.mark.parametrize(
    ("rows", "line", "field", "match"),
    [
        (['{"id": "a", "k": 1, "correct": 1, "conf": 0.5}', "{oops"], 2, None, "not valid JSON"),
        ([[1, 2]], 1, None, "expected a JSON object"),
        ([{"id": "a", "k": 2, "correct": 3, "conf": 0.5}], 1, None, "correct must be <= k"),
        ([{"id": "a", "correct": 1, "conf": 0.5}], 1, "k", "Field required"),
        ([{"id": "a", "k": 2, "correct": 1}], 1, "conf", "missing (keys on this line: correct, id, k)"),
        (
            [{"id": "a", "k": 2, "correct": 1, "conf": 1.5}],
            1,
            "conf",
            "must be a number in [0, 1] or null; got 1.5",
        ),
        ([{"id": "a", "k": 2, "correct": 1, "conf": "high"}], 1, "conf", "got 'high'"),
        ([{"id": "a", "k": 2, "correct": 1, "conf": True}], 1, "conf", "got True"),
        (
            [{"id": "a", "k": 2, "correct": 1, "conf": 0.5}, {"id": "a", "k": 2, "correct": 1, "conf": 0.5}],
            2,
            "id",
            "duplicate id 'a' (first on line 1)",
        ),
    ],
)
def test_bad_lines_are_located(
    tmp_path: Path, rows: list[object], line: int, field: str | None, match: str
) -> None:
    path = write(tmp_path, *rows)
    with pytest.raises(DataError) as info:
        load_labelled(path, "conf")
    assert info.value.path == str(path)
    assert info.value.line == line
    assert info.value.field == field
    assert match in info.value.message


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="no labelled queries"):
        load_labelled(empty, "conf")
    with pytest.raises(DataError, match="cannot read labelled data"):
        load_labelled(tmp_path / "nope.jsonl", "conf")
