"""Reading labelled JSONL: every bad input is named by file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from capgate import DataError, LabelledQuery
from capgate.labels.labelled import read_labelled


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_paper_aliases_and_confidences(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"example_id": "a", "num_samples": 4, "num_correct": 3, "expected_accuracy": 0.75, "conf": 0.6}',
        "",
        '{"id": "b", "k": 2, "correct": 0, "conf": 1}',
    )
    data = read_labelled(path, confidence=["conf"])
    assert data.ids == ["a", "b"]
    assert data.mu_hat.tolist() == [0.75, 0.0]
    assert data.confidences["conf"].tolist() == [0.6, 1.0]


@pytest.mark.parametrize(
    ("line", "where", "message"),
    [
        ('{"id": "a", "k": 4, "correct": 1}', "field 'conf'", "missing confidence field"),
        (
            '{"id": "a", "k": 4, "correct": 1, "conf": 1.5}',
            "field 'conf'",
            "must be a number in [0, 1]; got 1.5",
        ),
        ('{"id": "a", "k": 4, "correct": 1, "conf": NaN}', "field 'conf'", "got nan"),
        ('{"id": "a", "k": 4, "correct": 1, "conf": "high"}', "field 'conf'", "got 'high'"),
        ('{"id": "a", "k": 4, "correct": 1, "conf": null}', "field 'conf'", "is null"),
        ('{"id": "a", "k": 2, "correct": 3, "conf": 0.5}', "", "correct must be <= k"),
        ('{"id": "a", "correct": 1, "conf": 0.5}', "field 'k'", "Field required"),
        ('{"id": "a", "k": 0, "correct": 0, "conf": 0.5}', "field 'k'", "greater than or equal to 1"),
        ('{"id": "a", "k": 4, "correct": 1, "mu_hat": 0.5, "conf": 0.5}', "", "disagrees with correct/k"),
        ("[1, 2]", "", "expected a JSON object; got list"),
        ('{"id": "a", "k": 4,', "", "invalid JSON"),
    ],
)
def test_bad_second_line_is_located(tmp_path: Path, line: str, where: str, message: str) -> None:
    path = write(tmp_path, '{"id": "ok", "k": 4, "correct": 1, "conf": 0.5}', line)
    with pytest.raises(DataError) as info:
        read_labelled(path, confidence=["conf"])
    text = str(info.value)
    assert text.startswith(f"{path}:2")
    assert where in text
    assert message in text
    assert info.value.line == 2


def test_duplicate_ids_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, '{"id": "a", "k": 1, "correct": 1}', '{"id": "a", "k": 1, "correct": 0}')
    with pytest.raises(DataError, match=r":2: field 'id': duplicate id 'a' \(first on line 1\)"):
        read_labelled(path)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no records"):
        read_labelled(write(tmp_path, ""))
    with pytest.raises(DataError, match="file not found"):
        read_labelled(tmp_path / "absent.jsonl")


def test_samples_must_agree_with_counts() -> None:
    with pytest.raises(ValueError, match="samples mark 1 correct but correct=2"):
        LabelledQuery(id="q", k=2, correct=2, samples=[{"correct": True}, {"correct": False}])


def test_allow_missing_reads_null_confidence_as_nan(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"id": "a", "k": 4, "correct": 3, "conf": 0.7}',
        '{"id": "b", "k": 2, "correct": 0, "conf": null}',
    )
    data = read_labelled(path, confidence=["conf"], allow_missing=True)
    assert data.confidences["conf"][0] == 0.7
    assert data.confidences["conf"][1] != data.confidences["conf"][1]  # NaN
    with pytest.raises(DataError, match="is null"):
        read_labelled(path, confidence=["conf"])
    missing_key = write(tmp_path, '{"id": "a", "k": 4, "correct": 3}')
    with pytest.raises(DataError, match="missing confidence field"):
        read_labelled(missing_key, confidence=["conf"], allow_missing=True)
