"""Fingerprints of capability estimators: which estimator made a stored estimate.

A cache of estimates is only valid for the estimator that wrote it: record
:func:`estimator_fingerprint` (or :func:`probe_fingerprint` of a saved probe folder) beside it and
compare with the installed estimator's before reading it back.

* A probe's fingerprint hashes its weights file, its metadata JSON (not the record of a later
  bfloat16 check) and the reader's feature spec. A saved folder and the
  :class:`~capgate.estimators.ProbeEstimator` loaded from it (``capgate.load_estimator``) have
  the same fingerprint, so a cache can be checked without loading the reader model.
* Any other estimator's hashes its class and constructor settings (nested estimators by their
  own fingerprint; a backend by its class and model name).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from capgate.errors import DataError
from capgate.estimators._common import read_json, spec_as_dict
from capgate.estimators._linear_probe import META_FILE, WEIGHTS_FILE
from capgate.estimators.probe import ProbeEstimator
from capgate.local.weights import sha256_file

__all__ = ["estimator_fingerprint", "probe_fingerprint"]

_VERSION = "capgate.estimator-fingerprint/1"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def _probe_digest(folder: Path, reader_spec: object | None) -> str:
    weights, meta_path = folder / WEIGHTS_FILE, folder / META_FILE
    for path in (weights, meta_path):
        if not path.is_file():
            raise DataError("not a saved probe: file missing", path=path)
    meta = read_json(meta_path, kind=None, what="probe metadata")
    spec = meta.get("feature_spec") if reader_spec is None else spec_as_dict(reader_spec)
    validation = meta.get("validation")
    if isinstance(validation, dict) and "fast_path" in validation:
        # A later bfloat16 check changes nothing the probe estimates (the reader's dtype is in spec).
        meta = {**meta, "validation": {k: v for k, v in validation.items() if k != "fast_path"}}
    weights_sha = sha256_file(weights)
    return "probe-sha256:" + _digest(_VERSION, "probe", weights_sha, _canonical(meta), _canonical(spec))


def probe_fingerprint(folder: str | os.PathLike[str]) -> str:
    """Fingerprint of a saved probe folder (``probe.safetensors`` + ``probe.json``), read by the
    feature spec it records; equal to :func:`estimator_fingerprint` of the estimator loaded from it.

    Raises:
        DataError: The folder holds no saved probe, or its metadata is not JSON.

    Examples:
        >>> from capgate.loading import default_probe_path
        >>> probe_fingerprint(default_probe_path()).startswith("probe-sha256:")
        True
    """
    return _probe_digest(Path(folder), None)


def _setting(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_setting(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _setting(v) for k, v in value.items()}
    if hasattr(value, "estimate") and callable(value.estimate):
        return estimator_fingerprint(value)
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    model = getattr(value, "model", None)
    return {"class": kind, "model": model} if isinstance(model, str) else {"class": kind}


def estimator_fingerprint(estimator: object) -> str:
    """Fingerprint of a capability estimator (see the module docstring): a probe's from its files saved
    to a temporary folder; any other's settings read back from the attributes of the same names.

    Examples:
        >>> from capgate.estimators import VerbalizedConfidence
        >>> class Echo:
        ...     model = "toy"
        ...     def generate(self, prompts, params): ...
        >>> a = estimator_fingerprint(VerbalizedConfidence(Echo()))
        >>> a == estimator_fingerprint(VerbalizedConfidence(Echo())), a.startswith("VerbalizedConfidence-")
        (True, True)
    """
    if isinstance(estimator, ProbeEstimator):
        with tempfile.TemporaryDirectory(prefix="capgate-fingerprint-") as tmp:
            estimator.probe.save(tmp)
            return _probe_digest(Path(tmp), estimator.featurizer.spec)
    cls = type(estimator)
    settings: dict[str, Any] = {}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if hasattr(estimator, name):
            settings[name] = _setting(getattr(estimator, name))
    kind = f"{cls.__module__}.{cls.__qualname__}"
    return f"{cls.__qualname__}-sha256:" + _digest(_VERSION, kind, _canonical(settings))
