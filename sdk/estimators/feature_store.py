"""Precomputed features on disk: fit and evaluate probes without loading a model.

A feature file ``NAME.npz`` holds two arrays, ``ids`` (query ids, unicode) and ``features``
(float32, one row per id: a vector, or one vector per layer); its sidecar ``NAME.spec.json``
holds the feature spec (model id, weights fingerprint, layers, pooling, chat template, dim).
Both load without pickle. :func:`featurize_to` computes such a file resumably.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from capgate._util.atomic import atomic_open
from capgate._util.validate import check_positive_int
from capgate.core.backend import Prompt
from capgate.errors import DataError, ProbeMismatchError
from capgate.estimators._common import read_json, spec_as_dict, write_json
from capgate.estimators.probe import Featurizer, check_spec_match

# spec_as_dict: how a featurizer's spec is recorded, for the CLI that stores features.
__all__ = ["StoredFeatures", "featurize_to", "load_features", "save_features", "spec_as_dict", "spec_path"]

_SPEC_FORMAT = "capgate.local.hidden_states"
_PART_PREFIX = "part-"


def spec_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar JSON of a feature file: ``feats.npz`` → ``feats.spec.json``."""
    p = Path(path)
    return p.with_name(p.name.removesuffix(".npz") + ".spec.json")


def _parts_dir(path: Path) -> Path:
    return path.with_name(path.name + ".parts")


@dataclass(frozen=True)
class StoredFeatures:
    """Features read from disk.

    Attributes:
        path: The ``.npz`` file.
        ids: Query ids, one per row.
        features: Float32 array, shape ``(len(ids), dim)``, or ``(len(ids), n_layers, dim)`` for
            per-layer features (:meth:`~capgate.local.hidden_states.HiddenStateFeaturizer.transform_layers`).
        spec: The feature spec from the sidecar (JSON-able dict).
    """

    path: Path
    ids: list[str]
    features: npt.NDArray[np.float32]
    spec: dict[str, Any]

    def rows_for(
        self, ids: Sequence[str], *, source: str | os.PathLike[str] | None = None
    ) -> npt.NDArray[np.float32]:
        """The feature rows of ``ids``, in that order.

        Raises:
            DataError: An id has no features here (naming the id, and ``source`` if given).
        """
        index = {qid: i for i, qid in enumerate(self.ids)}
        missing = [qid for qid in ids if qid not in index]
        if missing:
            shown = ", ".join(repr(m) for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise DataError(
                f"{len(missing)} of {len(ids)} ids have no features in {self.path}: {shown}",
                path=None if source is None else Path(source),
                field="id",
            )
        rows: npt.NDArray[np.float32] = self.features[[index[qid] for qid in ids]]
        return rows


def save_features(
    path: str | os.PathLike[str], ids: Sequence[str], features: npt.ArrayLike, spec: object
) -> Path:
    """Write ``features`` keyed by ``ids`` to ``path`` (``.npz``) and the spec to its sidecar.

    Examples:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "feats.npz"
        >>> _ = save_features(f, ["a", "b"], [[1, 2], [3, 4]], {"model_id": "m", "dim": 2})
        >>> load_features(f).rows_for(["b"]).tolist()
        [[3.0, 4.0]]
    """
    target = Path(path)
    matrix = np.asarray(features, dtype=np.float32)
    id_list = [str(i) for i in ids]
    spec_dict = spec_as_dict(spec)
    _check_arrays(target, id_list, matrix, spec_dict)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_npz(target, id_list, matrix)
    write_json(
        spec_path(target),
        {"format": _SPEC_FORMAT, "spec": spec_dict, "n": len(id_list), "dim": int(matrix.shape[-1])},
    )
    return target


def _check_arrays(path: Path, ids: list[str], matrix: npt.NDArray[np.float32], spec: dict[str, Any]) -> None:
    if matrix.ndim not in (2, 3) or matrix.shape[0] != len(ids) or matrix.shape[0] == 0:
        raise DataError(
            "features must have shape (n_ids, dim) or (n_ids, n_layers, dim) with "
            f"n_ids = {len(ids)} > 0; got {matrix.shape}",
            path=path,
            field="features",
        )
    seen: set[str] = set()
    for qid in ids:
        if qid in seen:
            raise DataError(f"duplicate id {qid!r}", path=path, field="ids")
        seen.add(qid)
    bad = np.flatnonzero(~np.all(np.isfinite(matrix.reshape(matrix.shape[0], -1)), axis=1))
    if bad.size:
        raise DataError(f"non-finite features for id {ids[int(bad[0])]!r}", path=path, field="features")
    dim = spec.get("dim")
    if isinstance(dim, int) and dim != matrix.shape[-1]:
        raise DataError(f"spec says dim={dim} but features have {matrix.shape[-1]} columns", path=path)


def _write_npz(target: Path, ids: list[str], matrix: npt.NDArray[np.float32]) -> None:
    with atomic_open(target, suffix=".npz") as fh:
        np.savez(fh, ids=np.array(ids, dtype=np.str_), features=matrix)


def _read_npz(path: Path) -> tuple[list[str], npt.NDArray[np.float32]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if "ids" not in data.files or "features" not in data.files:
                raise DataError(
                    f"expected arrays 'ids' and 'features'; found {sorted(data.files)}", path=path
                )
            ids = data["ids"]
            features = data["features"]
    except FileNotFoundError:
        raise DataError("feature file not found", path=path) from None
    except (ValueError, OSError) as exc:  # not an npz, or an object array that would need pickle
        raise DataError(f"cannot read as a feature .npz: {exc}", path=path) from None
    if ids.dtype.kind != "U" or ids.ndim != 1:
        raise DataError(
            f"'ids' must be a 1-D string array; got {ids.dtype} {ids.shape}", path=path, field="ids"
        )
    return ids.tolist(), np.asarray(features, dtype=np.float32)


def load_features(path: str | os.PathLike[str]) -> StoredFeatures:
    """Read a feature file and its sidecar spec (no pickle), checking they agree.

    Raises:
        DataError: Missing files, wrong arrays, duplicate ids, non-finite rows, or a sidecar
            whose ``n``/``dim``/spec disagree with the arrays.
    """
    target = Path(path)
    ids, features = _read_npz(target)
    sidecar = spec_path(target)
    meta = read_json(sidecar, kind=_SPEC_FORMAT)
    spec = meta.get("spec")
    if not isinstance(spec, dict):
        raise DataError(f"expected an object; got {spec!r}", path=sidecar, field="spec")
    _check_arrays(target, ids, features, spec)
    for key, value in (("n", len(ids)), ("dim", int(features.shape[-1]))):
        if meta.get(key) != value:
            raise DataError(
                f"sidecar says {meta.get(key)!r} but {target.name} has {value}", path=sidecar, field=key
            )
    return StoredFeatures(path=target, ids=ids, features=features, spec=spec)


def featurize_to(
    path: str | os.PathLike[str],
    ids: Sequence[str],
    queries: Sequence[Prompt],
    featurizer: Featurizer,
    *,
    batch_size: int = 16,
    on_batch: Callable[[int, int], None] | None = None,
) -> StoredFeatures:
    """Featurize ``queries`` (keyed by ``ids``) into ``path``, resuming an interrupted run.

    Finished batches are written atomically under ``<path>.parts/``, merged into ``path`` and its
    sidecar when all are done (the folder is then removed). A rerun after a crash or kill skips
    every id already featurized; rows ``path`` already has for ``ids`` with the same spec are
    reused (nothing is recomputed if it has them all; else the rewritten file holds exactly ``ids``).

    Args:
        path: The ``.npz`` to write.
        ids: One id per query (unique).
        queries: The queries (text or chat).
        featurizer: Computes the features.
        batch_size: Queries per ``transform`` call (and per part file).
        on_batch: Called with ``(done, total)`` after each batch.

    Raises:
        ProbeMismatchError: The parts (or the existing file) were made by a featurizer with
            another spec.
        ValueError: ``ids`` and ``queries`` differ in length, ids repeat, or the featurizer returns
            a wrongly shaped array.
    """
    target = Path(path)
    id_list = [str(i) for i in ids]
    if len(id_list) != len(queries):
        raise ValueError(f"got {len(id_list)} ids for {len(queries)} queries")
    if len(set(id_list)) != len(id_list):
        raise ValueError("ids must be unique")
    check_positive_int("batch_size", batch_size)
    spec = spec_as_dict(featurizer.spec)

    done: dict[str, npt.NDArray[np.float32]] = {}
    if target.exists() and spec_path(target).exists():
        existing = load_features(target)
        check_spec_match(existing.spec, spec)
        if set(id_list) <= set(existing.ids) and not _parts_dir(target).exists():
            return existing
        wanted = set(id_list)
        done.update(
            (qid, row) for qid, row in zip(existing.ids, existing.features, strict=True) if qid in wanted
        )

    parts = _parts_dir(target)
    parts.mkdir(parents=True, exist_ok=True)
    parts_spec = parts / "spec.json"
    if parts_spec.exists():
        recorded = read_json(parts_spec, kind=_SPEC_FORMAT).get("spec")
        try:
            check_spec_match(recorded if isinstance(recorded, dict) else None, spec)
        except ProbeMismatchError as exc:
            raise ProbeMismatchError(
                f"the unfinished run in {parts} used another featurizer: {exc}"
            ) from None
    else:
        write_json(parts_spec, {"format": _SPEC_FORMAT, "spec": spec})

    numbers = [-1]
    for part in sorted(parts.glob(f"{_PART_PREFIX}*.npz")):
        part_ids, part_rows = _read_npz(part)
        done.update(zip(part_ids, part_rows, strict=True))
        numbers.append(int(part.stem.removeprefix(_PART_PREFIX)))
    next_part = max(numbers) + 1

    todo = [i for i, qid in enumerate(id_list) if qid not in done]
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        rows = np.asarray(featurizer.transform([queries[i] for i in batch]), dtype=np.float32)
        if rows.ndim not in (2, 3) or rows.shape[0] != len(batch):
            raise ValueError(f"featurizer returned shape {rows.shape} for {len(batch)} queries")
        batch_ids = [id_list[i] for i in batch]
        _write_npz(parts / f"{_PART_PREFIX}{next_part:06d}.npz", batch_ids, rows)
        next_part += 1
        done.update(zip(batch_ids, rows, strict=True))
        if on_batch is not None:
            on_batch(len(id_list) - len(todo) + start + len(batch), len(id_list))

    matrix = np.stack([done[qid] for qid in id_list]) if id_list else np.zeros((0, 0), np.float32)
    save_features(target, id_list, matrix, spec)
    shutil.rmtree(parts)
    return load_features(target)
