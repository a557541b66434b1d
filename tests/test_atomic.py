"""capgate._util.atomic: a failed write leaves the target as it was and no temporary file behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from capgate._util.atomic import atomic_open, atomic_path, atomic_write_bytes, atomic_write_json


def test_writers_replace_the_target_and_leave_only_it(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.json"
    atomic_write_json(target, {"b": 1, "a": 2})
    assert target.read_text(encoding="utf-8") == json.dumps({"a": 2, "b": 1}, indent=2) + "\n"
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]


def _write_then_fail(target: Path) -> None:
    with atomic_open(target) as handle:
        handle.write(b"half")
        raise RuntimeError("boom")


def _fail_before_writing(target: Path, seen: list[Path]) -> None:
    with atomic_path(target, suffix=".npz") as tmp:
        seen.append(tmp)
        raise RuntimeError("boom")


def test_a_failing_write_keeps_the_old_file_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"):
        _write_then_fail(target)
    seen: list[Path] = []
    with pytest.raises(RuntimeError, match="boom"):
        _fail_before_writing(target, seen)
    assert seen[0].parent == tmp_path
    assert seen[0].name.startswith(".a.bin.")
    assert seen[0].suffix == ".npz"
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_json_refuses_nan_when_asked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        atomic_write_json(tmp_path / "x.json", {"p": float("nan")}, allow_nan=False)
    assert list(tmp_path.iterdir()) == []


def test_an_atomic_write_gives_the_mode_a_plain_write_would(tmp_path: Path) -> None:
    """A new file takes 0666 less the umask (a probe or model folder is shared, say with a server);
    a replaced file keeps its own mode (the temporary file mkstemp makes is 0600)."""
    old_umask = os.umask(0o022)
    try:
        new = tmp_path / "new.json"
        atomic_write_json(new, {"a": 1})
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        kept = tmp_path / "kept.json"
        kept.write_text("{}")
        kept.chmod(0o640)
        atomic_write_json(kept, {"a": 2})
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640
        assert json.loads(kept.read_text()) == {"a": 2}
    finally:
        os.umask(old_umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "new.json"]  # no temporary left
