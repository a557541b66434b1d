"""Atomic file and folder writes: a reader sees the old file or the new one, never a half-written mix.

A file is written as a hidden temporary file in the target's folder (created if needed), fsynced,
``os.replace``-d over the target, then the folder is fsynced so the rename itself is durable. If
anything fails before the rename, the temporary file is removed and the target is untouched.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename or a file creation in ``folder`` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):  # not every platform can open a folder
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _new_file_beside(target: Path, suffix: str) -> Path:
    """A new empty hidden file in ``target``'s folder with the mode a plain ``open`` would give the
    target: the existing file's, else 0666 less the umask (``mkstemp`` makes every file 0600)."""
    existing = stat.S_IMODE(target.stat().st_mode) if target.is_file() else None
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if existing is None else existing)
        except FileExistsError:  # pragma: no cover - 48 random bits taken
            continue
        try:
            if existing is not None and hasattr(os, "fchmod"):
                os.fchmod(fd, existing)  # exactly the old file's mode, which the umask may have narrowed
        finally:
            os.close(fd)
        return tmp


def fsync_files(folder: Path) -> None:
    """Sync every file under ``folder`` (its subfolders too) to disk."""
    for file in folder.rglob("*"):
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path to write in place of ``path``; renamed over it when the block succeeds.
    For writers that want a file name rather than a handle (``safetensors.save_file``).

    Examples:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.bin"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_bytes(b"data")
        >>> target.read_bytes()
        b'data'
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_file_beside(target, suffix)
    try:
        yield tmp
        with tmp.open("r+b") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], *, suffix: str = ".tmp") -> Iterator[IO[bytes]]:
    """A binary handle whose content replaces ``path`` atomically when the block succeeds."""
    with atomic_path(path, suffix=suffix) as tmp, tmp.open("wb") as handle:
        yield handle


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    with atomic_open(path) as handle:
        handle.write(data)


def atomic_write_json(path: str | os.PathLike[str], payload: Any, *, allow_nan: bool = True) -> None:
    """Replace ``path`` with ``payload`` as indented, key-sorted JSON (UTF-8, trailing newline).

    Examples:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.json"
        >>> atomic_write_json(target, {"b": 1, "a": [2]})
        >>> print(target.read_text(), end="")
        {
          "a": [
            2
          ],
          "b": 1
        }
    """
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=allow_nan) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_partials(root: Path, name: str) -> None:
    """Delete the ``.partial`` folders of ``name`` left by builds whose process no longer runs."""
    for partial in root.glob(f".{glob.escape(name)}.pid*.partial"):
        match = re.search(r"\.pid(\d+)\.", partial.name)
        if match is None or not _pid_alive(int(match.group(1))):
            shutil.rmtree(partial, ignore_errors=True)


def atomic_folder(final: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` into a fresh hidden folder next to ``final``, then rename it into place.

    If ``final`` already exists it is returned untouched. If ``build`` fails (or the process is
    killed) no ``final`` folder appears; a failed build's folder is removed at once, a killed
    one's on the next call for the same ``final``. The built files and the rename are synced to
    disk, so a crash after the rename cannot leave a truncated file in a folder trusted since.
    """
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_partials(final.parent, final.name)
    prefix = f".{final.name}.pid{os.getpid()}."
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".partial", dir=final.parent))
    try:
        build(tmp)
        fsync_files(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is shared (say, with a vLLM server)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race with another converter: a real failure
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(final.parent)
    return final
