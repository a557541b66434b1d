"""The claim detector: fit, score, save/load round trip, and the shipped file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capgate.errors import DataError, NotFittedError
from capgate.estimators._claims import ClaimDetector

TEXTS = ["This is easy, you surely know it.", "What is the capital of Peru?",
         "You are certain to get this right.", "Answer with only the final number."]  # fmt: skip


def test_fit_save_load_round_trips_exactly(tmp_path: Path) -> None:
    detector = ClaimDetector(max_iter=100).fit(TEXTS, [1, 0, 1, 0]).set_threshold(0.4)
    detector.save(tmp_path / "d.npz")
    loaded = ClaimDetector.load(tmp_path / "d.npz")
    assert loaded.threshold_ == 0.4
    np.testing.assert_array_equal(loaded.score(TEXTS), detector.score(TEXTS))


def test_misuse_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NotFittedError):
        ClaimDetector().score(["x"])
    with pytest.raises(ValueError, match="labels must be 2 values"):
        ClaimDetector().fit(["a", "b"], [1, 2])
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(DataError, match="not a readable claim detector"):
        ClaimDetector.load(tmp_path / "bad.npz")


def test_the_shipped_detector_loads_and_scores_deterministically() -> None:
    detector = ClaimDetector.load()
    scores = detector.score(["Answer with only the final number.", "(You definitely know the answer.)"])
    assert scores[0] < detector.threshold_ <= scores[1]
    np.testing.assert_array_equal(scores, detector.score(["Answer with only the final number.",
                                                          "(You definitely know the answer.)"]))  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda h: h.pop("n_features"), "n_features"),  # raised a bare KeyError before
        (lambda h: h.update(l2="strong"), "l2"),
        (lambda h: h.update(threshold=1.5), "threshold"),
        (lambda h: h.update(format="something.else"), "format"),
    ],
)
def test_a_bad_header_names_the_file_and_field(tmp_path: Path, change: Any, field: str) -> None:
    import json

    shipped = ClaimDetector.load()
    shipped.save(tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as data:
        header = json.loads(bytes(data["header"]).decode())
        columns, coef = data["columns"], data["coef"]
    change(header)
    bad = tmp_path / "bad.npz"
    header_bytes = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(bad, header=header_bytes, columns=columns, coef=coef)
    with pytest.raises(DataError, match=rf"bad\.npz: field '{field}'"):
        ClaimDetector.load(bad)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda cols, coef: (cols, coef[:-1]), "coef", "one weight per column"),  # crashed in score()
        (lambda cols, coef: (cols[:, None], coef), "columns", "1-D"),
        (lambda cols, coef: (cols + 64, coef), "columns", r"\[0, n_features=64\)"),  # IndexError in score()
        (lambda cols, coef: (cols - 65, coef), "columns", r"\[0, n_features=64\)"),
        (lambda cols, coef: (cols.astype(np.float64), coef), "columns", "integers"),
        (lambda cols, coef: (cols, np.where(coef == coef[0], np.nan, coef)), "coef", "finite"),  # NaN scores
        (lambda cols, coef: (cols, np.full_like(coef, np.inf)), "coef", "finite"),
    ],
)
def test_corrupt_arrays_name_the_file_and_field(
    tmp_path: Path, change: Any, field: str, message: str
) -> None:
    detector = ClaimDetector(n_features=64, max_iter=5).fit(TEXTS, [1, 0, 1, 0])
    detector.save(tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as data:
        header, columns, coef = data["header"], data["columns"], data["coef"]
    columns, coef = change(columns, coef)
    np.savez(tmp_path / "bad.npz", header=header, columns=columns, coef=coef)
    with pytest.raises(DataError, match=rf"bad\.npz: field '{field}': .*{message}"):
        ClaimDetector.load(tmp_path / "bad.npz")
