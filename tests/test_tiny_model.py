"""capgate.local.tiny: the random-weights model tests and smoke runs build offline."""

from __future__ import annotations

import hashlib
from pathlib import Path

from capgate.local.tiny import build_tiny_model


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_the_same_seed_builds_the_same_model_and_a_built_folder_is_kept(
    tmp_path: Path, default_model_dir: Path
) -> None:
    first = build_tiny_model(tmp_path / "a", tokenizer_from=default_model_dir, seed=7)
    again = build_tiny_model(tmp_path / "b", tokenizer_from=default_model_dir, seed=7)
    other = build_tiny_model(tmp_path / "c", tokenizer_from=default_model_dir, seed=8)
    assert _digest(first) == _digest(again) != _digest(other)
    assert (first / "tokenizer.json").is_file()
    before = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(first, tokenizer_from=default_model_dir, seed=9) == first  # kept as is
    assert (first / "model.safetensors").stat().st_mtime_ns == before
