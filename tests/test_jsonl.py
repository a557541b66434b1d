"""Running estimators over a labelled JSONL file (capgate.estimators.jsonl)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from capgate import DataError, Estimate
from capgate.core.backend import Prompt
from capgate.estimators import CapabilityEstimator, estimate_jsonl


class Length(CapabilityEstimator):
    method = "length"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self.batches.append(len(queries))
        return [Estimate(p=min(1.0, len(str(q)) / 100), method="length") for q in queries]


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_estimates_every_row_in_batches(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "question": "x" * (10 * i + 10), "k": 4, "correct": i % 5} for i in range(5)]
    rows.append({"example_id": "paper", "question": "y" * 50, "num_samples": 2, "num_correct": 1})
    est = Length()
    pairs = list(estimate_jsonl(est, write(tmp_path / "d.jsonl", rows), batch_size=4))
    assert [r.id for r, _ in pairs] == ["q0", "q1", "q2", "q3", "q4", "paper"]
    assert [e.p for _, e in pairs] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.5]
    assert pairs[-1][0].mu_hat == 0.5
    assert est.batches == [4, 2]


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        ("{not json", None, "invalid JSON"),
        ("[1, 2]", None, "expected a JSON object"),
        ({"id": "a", "question": "q", "k": 2, "correct": 3}, "correct", "correct must be <= k"),
        ({"id": "a", "question": "q", "k": 0, "correct": 0}, "k", "greater than or equal to 1"),
        ({"id": "a", "question": "  ", "k": 2, "correct": 1}, "question", "non-empty question"),
        ({"id": "a", "k": 2, "correct": 1}, "question", "non-empty question"),
        (
            {"id": "ok", "question": "q", "k": 1, "correct": 0},
            "id",
            "duplicate id 'ok' \\(first on line 1\\)",
        ),
    ],
)
def test_bad_rows_are_located_before_any_model_call(
    tmp_path: Path, bad: object, field: str | None, message: str
) -> None:
    good = {"id": "ok", "question": "fine", "k": 1, "correct": 1}
    path = write(tmp_path / "bad.jsonl", [good, "", bad])
    est = Length()
    with pytest.raises(DataError, match=message) as info:
        list(estimate_jsonl(est, path))
    assert info.value.line == 3
    assert info.value.path == str(path)
    assert info.value.field == field
    assert est.batches == []


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", [{"id": "a", "question": "q", "k": 1, "correct": 0}, "", "  "])
    est = Length()
    assert [r.id for r, _ in estimate_jsonl(est, path)] == ["a"]
    assert est.batches == [1]


def test_batch_size_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        list(estimate_jsonl(Length(), tmp_path / "x.jsonl", batch_size=0))
