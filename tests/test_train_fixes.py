"""``as_counts`` (``capgate._util.validate``): infinite, NaN and out-of-range counts are refused with
a message naming the value and its index, never a wrapped-round int64 or an empty ``[]``."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from capgate._util.atomic import atomic_write_json
from capgate._util.validate import as_correct_and_k, as_counts
from capgate.train.trainer import MANIFEST_FILE, _replace_folder


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, float("inf")], r"`c` must hold whole numbers; got inf at index 1"),
        ([1.0, float("-inf")], r"`c` must hold whole numbers; got -inf at index 1"),
        ([2.0, float("nan")], r"`c` must hold whole numbers; got nan at index 1"),
        ([1.0, 2.5], r"`c` must hold whole numbers; got 2.5 at index 1"),
        ([1.0, 1e19], r"`c` must hold counts within int64's range; got 1e\+19 at index 1"),
        ([-1e19], r"`c` must hold counts within int64's range; got -1e\+19 at index 0"),
        (np.array([3, 2**63], dtype=np.uint64), r"within int64's range; got 9223372036854775808 at index 1"),
    ],
)
def test_as_counts_names_a_value_that_is_no_count(values: object, message: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast" either
        with pytest.raises(ValueError, match=message):
            as_counts("c", values)  # type: ignore[arg-type]


def test_as_counts_keeps_the_counts_it_accepts() -> None:
    assert as_counts("c", [0.0, 3.0, 2.0**62]).tolist() == [0, 3, 2**62]
    assert as_counts("c", np.array([5, 2**63 - 1], dtype=np.uint64)).tolist() == [5, 2**63 - 1]
    assert as_counts("c", [True, False]).tolist() == [1, 0]
    with pytest.raises(ValueError, match=r"`k` must hold counts within int64's range; got 1e\+19"):
        as_correct_and_k([1], [1e19], 1)


def test_a_folder_put_in_place_is_synced_to_disk_before_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adapter/, model/ and warm_start/ are fsynced (files and folder) before manifest.json, whose
    presence means done, is written: a crash then cannot leave a truncated file in a "done" run."""
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        info = os.fstat(fd)
        synced.append((info.st_dev, info.st_ino))
        real_fsync(fd)

    def write(tmp: Path) -> None:
        (tmp / "sub").mkdir(parents=True)
        (tmp / "adapter_model.safetensors").write_bytes(b"weights")
        (tmp / "sub" / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(os, "fsync", record)
    (tmp_path / "adapter").mkdir()  # a rerun's old folder is replaced
    _replace_folder(tmp_path / "adapter", write)
    atomic_write_json(tmp_path / MANIFEST_FILE, {"done": True})
    final = tmp_path / "adapter"
    assert (final / "sub" / "tokenizer.json").read_text() == "{}"
    manifest = os.stat(tmp_path / MANIFEST_FILE)
    at = synced.index((manifest.st_dev, manifest.st_ino))
    for path in (final / "adapter_model.safetensors", final / "sub" / "tokenizer.json", final):
        info = os.stat(path)
        assert (info.st_dev, info.st_ino) in synced[:at], path
