"""The calibration artefact: a folder with a content-derived version, written atomically.

``DIR/calibration.json`` names the kind (identity, isotonic, Platt, probe), the target and
estimator method, a SHA-256 for every other file, and the summary (window, counts, held-out table,
thresholds). The version is ``"cal-"`` + 12 hex digits of the SHA-256 of that content (all but the
version and the time of writing): the same wherever it is written. Beside it: ``calibrator.json``
(:class:`~capgate.estimators.Recalibrated`'s format) or ``probe.safetensors`` + ``probe.json`` (a
:class:`~capgate.estimators.LinearProbe`), and ``policy.yaml`` when thresholds were certified. No
pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from capgate._util.atomic import fsync_dir
from capgate.errors import DataError, ProbeMismatchError
from capgate.local.weights import sha256_file

if TYPE_CHECKING:
    from capgate.estimators.base import CapabilityEstimator
    from capgate.estimators.probe import Featurizer
    from capgate.policies import Policy

Kind = Literal["identity", "isotonic", "platt", "probe"]
FORMAT = "capgate.calibration"
FORMAT_VERSION = 1
CALIBRATION_FILE = "calibration.json"
CALIBRATOR_FILE = "calibrator.json"
POLICY_FILE = "policy.yaml"
_IGNORE_SPEC = ("dtype",)  # a reader pass's dtype, as load_estimator allows


def content_version(content: Mapping[str, Any]) -> str:
    """``"cal-"`` + 12 hex digits of the SHA-256 of ``content`` as canonical JSON.

    Examples:
        >>> content_version({"kind": "identity"}) == content_version({"kind": "identity"})
        True
    """
    canonical = json.dumps(dict(content), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "cal-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_calibration(
    out: str | os.PathLike[str],
    *,
    kind: Kind,
    target: str | None,
    method: str,
    summary: Mapping[str, Any],
    write_files: Callable[[Path], None],
) -> str:
    """Write a calibration folder at ``out`` atomically (a hidden temporary folder beside it,
    fsynced, renamed in one step; removed on failure: a killed process leaves at most a hidden
    ``.NAME.tmp-*`` folder, never ``out``); returns its version.

    Args:
        out: The folder to create (it must not exist, or hold this very calibration already).
        kind: What the calibration does.
        target: The target model it was learnt for.
        method: The estimator method whose estimates it maps.
        summary: JSON-able account (window, counts, held-out table, thresholds).
        write_files: Writes the kind's files (and ``policy.yaml``) into the folder it is given.

    Raises:
        DataError: ``out`` exists and holds something else.
    """
    target_dir = Path(out)
    if target_dir.exists() and not (target_dir.is_dir() and not any(target_dir.iterdir())):
        raise DataError(
            "already exists; a calibration folder is written once (choose a new --out)", path=target_dir
        )
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = target_dir.parent / f".{target_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=0o700)
    try:
        write_files(tmp)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        content = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": kind,
            "target": target,
            "method": method,
            "files": files,
            "summary": json.loads(json.dumps(summary)),
        }
        version = content_version(content)
        payload = {**content, "version": version, "written_at": datetime.now(UTC).isoformat()}
        (tmp / CALIBRATION_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", "utf-8")
        for path in tmp.iterdir():
            _fsync_file(path)
        fsync_dir(tmp)
        if target_dir.exists():
            target_dir.rmdir()  # empty (checked above): rename needs it gone
        os.rename(tmp, target_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(target_dir.parent)
    return version


class Calibration:
    """A calibration written by :func:`~capgate.learn.calibrate` (``capgate calibrate``).

    Attributes:
        path: Its folder.
        version: Content-derived id (``"cal-<12 hex>"``), recorded in every decision made under it.
        target: The target model it was learnt for (``None``: the decisions recorded none).
        method: The estimator method whose estimates it maps (an estimator of another method is
            refused by :meth:`apply`).
        kind: ``"identity"`` (the previous estimator was kept), ``"isotonic"``, ``"platt"``, or
            ``"probe"`` (a probe fitted on logged reader features).
        summary: The window, counts, held-out table and thresholds it was chosen on.

    Use :meth:`load`; the constructor only stores what it is given.
    """

    def __init__(
        self,
        *,
        path: Path,
        version: str,
        target: str | None,
        method: str,
        kind: Kind,
        summary: dict[str, Any],
    ) -> None:
        self.path = path
        self.version = version
        self.target = target
        self.method = method
        self.kind = kind
        self.summary = summary

    def __repr__(self) -> str:
        return (
            f"Calibration({self.version!r}, kind={self.kind!r}, method={self.method!r}, "
            f"target={self.target!r})"
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Load a calibration folder, every file checked against its SHA-256 and the version
        against the content.

        Raises:
            DataError: Missing, corrupt or altered files, or a format this capgate cannot read.
        """
        folder = Path(path)
        meta_path = folder / CALIBRATION_FILE
        if not meta_path.is_file():
            raise DataError("not a calibration folder (no calibration.json)", path=folder)
        try:
            payload = json.loads(meta_path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"unreadable: {exc}", path=meta_path) from None
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise DataError(f"expected format {FORMAT!r}", path=meta_path, field="format")
        if not isinstance(payload.get("format_version"), int) or payload["format_version"] > FORMAT_VERSION:
            raise DataError(
                f"written by a newer capgate (this one reads format <= {FORMAT_VERSION})",
                path=meta_path,
                field="format_version",
            )
        kind = payload.get("kind")
        if not isinstance(kind, str) or kind not in get_args(Kind):
            raise DataError(f"unknown kind {kind!r}", path=meta_path, field="kind")
        files = payload.get("files")
        if not isinstance(files, dict):
            raise DataError("expected an object of file hashes", path=meta_path, field="files")
        for name, digest in files.items():
            file = folder / str(name)
            if not file.is_file():
                raise DataError("missing (listed in calibration.json)", path=file)
            if sha256_file(file) != digest:
                raise DataError("does not match the SHA-256 recorded in calibration.json", path=file)
        content = {k: v for k, v in payload.items() if k not in ("version", "written_at")}
        version = payload.get("version")
        if version != content_version(content):
            raise DataError(
                f"version {version!r} does not match the content ({content_version(content)})",
                path=meta_path,
                field="version",
            )
        method, target, summary = payload.get("method"), payload.get("target"), payload.get("summary")
        if not isinstance(method, str) or not method:
            raise DataError("expected the estimator method", path=meta_path, field="method")
        if target is not None and not isinstance(target, str):
            raise DataError("expected a model name or null", path=meta_path, field="target")
        if not isinstance(summary, dict):
            raise DataError("expected an object", path=meta_path, field="summary")
        return cls(
            path=folder, version=version, target=target, method=method, kind=cast(Kind, kind), summary=summary
        )

    @property
    def policy(self) -> Policy | None:
        """The risk-controlled policy written beside the estimator (``None`` when no threshold
        was certified or none was asked for)."""
        file = self.path / POLICY_FILE
        if not file.is_file():
            return None
        from capgate.policies import Policy

        return Policy.from_yaml(file)

    def apply(
        self, estimator: CapabilityEstimator, *, featurizer: Featurizer | None = None
    ) -> CapabilityEstimator:
        """The estimator to gate with under this calibration.

        ``identity``: ``estimator``; ``isotonic``/``platt``: ``estimator`` then the map
        (:class:`~capgate.estimators.Recalibrated`); ``probe``: a
        :class:`~capgate.estimators.ProbeEstimator` of the learnt probe over ``featurizer``, else
        over the first whose spec matches: ``estimator``'s own, the embedded default model's.

        Raises:
            DataError: ``estimator`` is of another method than the calibration maps.
            ProbeMismatchError: No featurizer matching the probe's reader spec.
        """
        if self.kind != "probe" and estimator.method != self.method:
            raise DataError(
                f"calibration {self.version} maps {self.method!r} estimates; refusing to apply it to "
                f"{estimator.method!r}",
                path=self.path,
                field="method",
            )
        if self.kind == "identity":
            return estimator
        if self.kind in ("isotonic", "platt"):
            from capgate.estimators import Recalibrated

            return Recalibrated.load(self.path / CALIBRATOR_FILE, estimator)
        from capgate.estimators.probe import LinearProbe, ProbeEstimator, check_spec_match

        probe = LinearProbe.load(self.path)
        chosen = featurizer if featurizer is not None else _matching_featurizer(probe, estimator)
        check_spec_match(probe.feature_spec_, chosen.spec, ignore=_IGNORE_SPEC)
        return ProbeEstimator(chosen, probe, ignore_spec_fields=_IGNORE_SPEC)


def _matching_featurizer(probe: Any, estimator: Any) -> Featurizer:
    """``estimator``'s featurizer if its spec matches the probe's, else the default model's."""
    from capgate.estimators.probe import check_spec_match

    own = getattr(estimator, "featurizer", None)
    if own is not None:
        try:
            check_spec_match(probe.feature_spec_, own.spec, ignore=_IGNORE_SPEC)
            return own  # type: ignore[no-any-return]
        except ProbeMismatchError:
            pass
    default_meta = Path(str(resources.files("capgate.assets") / "default_probe" / "probe.json"))
    default_spec = json.loads(default_meta.read_text("utf-8")).get("feature_spec") or {}
    spec = probe.feature_spec_ or {}
    same_reader = all(
        spec.get(key) == default_spec.get(key) for key in ("model_id", "weights_fingerprint", "dim")
    )
    if not same_reader:
        raise ProbeMismatchError(
            f"no featurizer for the calibration's probe (reader {spec.get('model_id')!r}): the "
            "estimator has none that matches and the embedded default model is another reader; "
            "pass featurizer= (a featurizer of that reader)"
        )
    from capgate.local.hidden_states import FeatureSpec, HiddenStateFeaturizer
    from capgate.local.models import DEFAULT_MODEL, load_model

    recorded = FeatureSpec.model_validate(spec)
    return HiddenStateFeaturizer(
        load_model(DEFAULT_MODEL),
        layers=recorded.layers,
        pooling=recorded.pooling,
        chat_template=recorded.chat_template,
    )
