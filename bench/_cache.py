"""Bench caches of estimates, keyed by the fingerprint of the estimator that wrote them.

Every cache of estimates a bench keeps (the CAS bench's probe priors, the peers bench's live
probe, the injection bench's black-box estimates) records the fingerprint of its estimator
(``capgate.estimators.fingerprint``: the probe's files and reader spec, or an estimator's
settings). Reading one back compares it with the installed estimator's fingerprint: on a
difference the cache is refused with :class:`StaleCacheError` (naming the file, the recorded
and the installed fingerprint), or, where the caller asks for it, treated as empty so the
estimates are recomputed (and the file rewritten with the new fingerprint).

Two shapes:

* a JSON object (``read_estimates``/``write_estimates``): ``{"about", "estimator":
  {"fingerprint", ...description}, "p": {id: p}}``, written atomically;
* a JSON-lines file appended as it goes (``check_jsonl``): the fingerprint lives in a sidecar
  ``<file>.estimator.json`` written when the cache is started.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "StaleCacheError",
    "check_jsonl",
    "installed_probe",
    "probe_description",
    "read_estimates",
    "write_estimates",
]

OnMismatch = Literal["refuse", "recompute"]


class StaleCacheError(RuntimeError):
    """A cache of estimates written by another estimator than the installed one (or by an unknown one)."""

    def __init__(self, path: Path, recorded: str | None, installed: str, hint: str = "") -> None:
        self.path, self.recorded, self.installed = path, recorded, installed
        what = (
            "records no estimator fingerprint" if recorded is None else f"was written by estimator {recorded}"
        )
        super().__init__(
            f"cache of estimates {path} {what}, but the installed estimator is {installed}; "
            f"its estimates describe another estimator. Recompute it (move the file away, or run "
            f"with --recompute where the bench offers it){hint}"
        )


def installed_probe() -> tuple[Path, str]:
    """The installed default probe's folder and fingerprint (no model is loaded)."""
    from capgate.estimators.fingerprint import probe_fingerprint
    from capgate.loading import default_probe_path

    folder = default_probe_path()
    return folder, probe_fingerprint(folder)


def probe_description(folder: Path) -> dict[str, Any]:
    """What a reader of the cache needs besides the fingerprint: the probe's folder and training."""
    meta = json.loads((folder / "probe.json").read_text(encoding="utf-8"))
    training = meta.get("training") or {}
    return {
        "estimator": "probe",
        "folder": _shown(folder),
        "model_id": meta.get("model_id"),
        "layers": (meta.get("feature_spec") or {}).get("layers"),
        "trained_on": training.get("source"),
        "n_train": training.get("n"),
        "weights_sha256": meta.get("weights_sha256"),
    }


def _shown(path: Path) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _recorded(data: Mapping[str, Any]) -> str | None:
    estimator = data.get("estimator")
    value = estimator.get("fingerprint") if isinstance(estimator, Mapping) else None
    return value if isinstance(value, str) else None


def read_estimates(
    path: Path, fingerprint: str, *, on_mismatch: OnMismatch = "refuse"
) -> dict[str, float | None]:
    """Cached estimates by id, if ``path`` was written by the estimator ``fingerprint``.

    A missing file reads as empty. A file recording another fingerprint (or none) raises
    :class:`StaleCacheError`, or with ``on_mismatch="recompute"`` reads as empty (the caller
    recomputes and :func:`write_estimates` replaces it).
    """
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"cache of estimates {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("p"), dict):
        raise ValueError(f"cache of estimates {path} has no 'p' object of estimates by id")
    recorded = _recorded(data)
    if recorded != fingerprint:
        if on_mismatch == "recompute":
            return {}
        raise StaleCacheError(path, recorded, fingerprint)
    out: dict[str, float | None] = {}
    for key, value in data["p"].items():
        if value is not None and not isinstance(value, int | float):
            raise ValueError(f"cache of estimates {path}: estimate of {key!r} is {value!r}, not a number")
        out[str(key)] = None if value is None else float(value)
    return out


def write_estimates(
    path: Path,
    fingerprint: str,
    p: Mapping[str, float | None],
    *,
    about: str,
    description: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write (atomically) the estimates ``p`` by id with the fingerprint of their estimator."""
    data = {
        "about": about,
        "estimator": {"fingerprint": fingerprint, **(description or {})},
        **(extra or {}),
        "p": dict(p),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".estimator.json")


def check_jsonl(
    path: Path,
    fingerprint: str,
    *,
    description: Mapping[str, Any] | None = None,
    on_mismatch: OnMismatch = "refuse",
) -> None:
    """Before reading or appending to the JSON-lines cache ``path``: check its estimator.

    A cache not started yet gets its sidecar (``<file>.estimator.json``) with ``fingerprint``.
    An existing cache whose sidecar records another fingerprint, or that has none (written
    before fingerprints), raises :class:`StaleCacheError`; with ``on_mismatch="recompute"`` it is
    moved aside to ``<file>.stale`` (with its sidecar) and a new one is started.
    """
    sidecar = _sidecar(path)
    if path.exists() and path.stat().st_size > 0:
        recorded = None
        if sidecar.exists():
            try:
                recorded = _recorded(json.loads(sidecar.read_text(encoding="utf-8")))
            except ValueError:
                recorded = None
        if recorded == fingerprint:
            return
        if on_mismatch == "refuse":
            raise StaleCacheError(path, recorded, fingerprint, f" (the fingerprint is in {sidecar.name})")
        os.replace(path, path.with_name(path.name + ".stale"))
        if sidecar.exists():
            os.replace(sidecar, sidecar.with_name(sidecar.name + ".stale"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    sidecar.write_text(
        json.dumps({"estimator": {"fingerprint": fingerprint, **(description or {})}}, indent=1) + "\n",
        encoding="utf-8",
    )
