"""capgate's cache directory and the hashes that identify model weights (no torch, no transformers).

Re-exported by :mod:`capgate.local.models`, which prepares and loads models with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from capgate._util.atomic import atomic_write_json
from capgate.errors import DataError

CACHE_ENV = "CAPGATE_CACHE_DIR"
"""Environment variable that overrides capgate's cache directory."""

MODEL_METADATA_FILE = "capgate_model.json"
"""Written into every folder capgate converts: model id, weights fingerprint, source."""

_HASH_CACHE_FILE = "file-sha256.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def cache_dir() -> Path:
    """capgate's cache directory (``$CAPGATE_CACHE_DIR``, else the platform's user cache dir).

    Examples:
        >>> isinstance(cache_dir(), Path)
        True
    """
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("capgate", appauthor=False))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file's contents, read in blocks and never cached: for integrity checks
    (:func:`cached_file_sha256` remembers digests by path, size and mtime)."""
    with Path(path).open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def cached_file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file's contents, computed once per (path, size, mtime) and remembered
    in the capgate cache; a Hugging Face hub cache link to a blob named by its sha256 is read by name.

    Examples:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     _ = f.write(b"abc"); f.flush()
        ...     cached_file_sha256(f.name)[:12]
        'ba7816bf8f01'
    """
    resolved = Path(path).resolve(strict=True)
    if resolved.parent.name == "blobs" and _HEX64.fullmatch(resolved.name) and Path(path).is_symlink():
        return resolved.name
    stat = resolved.stat()
    key = str(resolved)
    store = cache_dir() / _HASH_CACHE_FILE
    known = _read_json(store)
    known = known if isinstance(known, dict) else {}
    entry = known.get(key)
    if (
        isinstance(entry, dict)
        and entry.get("size") == stat.st_size
        and entry.get("mtime_ns") == stat.st_mtime_ns
    ):
        digest = entry.get("sha256")
        if isinstance(digest, str) and _HEX64.fullmatch(digest):
            return digest
    digest = sha256_file(resolved)
    known[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
    with contextlib.suppress(OSError):  # a read-only cache only costs a re-hash next time
        atomic_write_json(store, known)
    return digest


def weights_fingerprint(folder: str | os.PathLike[str]) -> str:
    """A deterministic digest of a model folder's weights: the one its ``capgate_model.json``
    records (``"gguf-sha256:<sha256 of the GGUF>"`` for a converted GGUF), else
    ``"safetensors-sha256:<hex>"`` over the sorted names and hashes of its ``*.safetensors`` files.

    Raises:
        DataError: The folder holds no ``*.safetensors`` weights.

    Examples:
        >>> from capgate.local.models import prepare_model
        >>> weights_fingerprint(prepare_model("default")).startswith("gguf-sha256:")
        True
    """
    root = Path(folder)
    meta = _read_json(root / MODEL_METADATA_FILE)
    if isinstance(meta, dict) and isinstance(meta.get("weights_fingerprint"), str):
        return str(meta["weights_fingerprint"])
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise DataError(
            "expected *.safetensors weights in the model folder; found none "
            "(capgate loads safetensors only, never pickled .bin weights)",
            path=root,
        )
    combined = hashlib.sha256()
    for file in files:
        combined.update(f"{file.name}\0{cached_file_sha256(file)}\n".encode())
    return f"safetensors-sha256:{combined.hexdigest()}"


def check_weight_files(folder: str | os.PathLike[str]) -> None:
    """Check that a sharded model's index names only ``.safetensors`` files inside its folder.

    Raises:
        DataError: ``model.safetensors.index.json`` is not a JSON object with a ``weight_map``
            of file names, or names a file outside the folder (``../x``, an absolute path) or
            not a ``.safetensors`` file.
    """
    index = Path(folder) / "model.safetensors.index.json"
    if not index.exists():
        return
    meta = _read_json(index)
    weight_map = meta.get("weight_map") if isinstance(meta, dict) else None
    if not isinstance(weight_map, dict):
        raise DataError("expected a JSON object with a 'weight_map' object", path=index, field="weight_map")
    for name, shard in weight_map.items():
        if not (isinstance(shard, str) and shard.endswith(".safetensors")):
            raise DataError(f"expected a .safetensors file name; got {shard!r}", path=index, field=name)
        if Path(shard).name != shard or shard.startswith(".") or "\\" in shard:
            raise DataError(f"names a file outside the model folder: {shard!r}", path=index, field=name)
