"""Reader features kept beside logged decisions, for learning from outcomes (opt-in).

A gate with ``log_features=True`` writes beside each decision the feature vector its probe's
reader computed (:meth:`DecisionLog.record_features`), so that ``capgate calibrate`` can fit a
probe on the user's own traffic. A vector is stored as little-endian float16 (``encoding =
"float16"``, two bytes per dimension), keyed by decision id and tagged with the SHA-256 of its
reader's feature spec (canonical JSON; the spec stored once, table ``feature_specs``).

**Features are as sensitive as the query text** (hidden states can be inverted to recover much of
a prompt), and protected alike: written only when turned on, a user-only SQLite file (0600 in a
0700 folder), no error message quoting a value (only ids, shapes and counts). In PostgreSQL, grant
the ``features`` table as ``decisions.query_text`` (see the README's decision-log section).

Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> from capgate import Estimate
    >>> from capgate.decision import Decision, DecisionLog
    >>> log = DecisionLog(os.path.join(tempfile.mkdtemp(), "d.sqlite3"))
    >>> d = Decision(action="answer", estimate=Estimate(p=0.9, method="probe"), reason="r")
    >>> _ = log.record(d)
    >>> log.record_features([(d.id, np.array([0.5, -1.25, 3.0]))], {"model_id": "m", "dim": 3})
    1
    >>> got = log.features([d.id])[d.id]
    >>> got.vector.tolist(), got.spec["model_id"]
    ([0.5, -1.25, 3.0], 'm')
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from capgate.decision.store._store import read_in
from capgate.errors import DataError

if TYPE_CHECKING:
    from capgate.decision.store._store import Store

__all__ = ["ENCODING", "FeatureLog", "LoggedFeatures", "spec_json", "spec_sha256"]

ENCODING = "float16"
"""How vectors are stored: little-endian IEEE half precision, ``dim`` of them."""
_DTYPE = np.dtype("<f2")

_INSERT_SPEC = (
    "INSERT INTO feature_specs (spec_sha256, spec_json) VALUES (?, ?) ON CONFLICT (spec_sha256) DO NOTHING"
)
_INSERT_FEATURES = (
    "INSERT INTO features (decision_id, spec_sha256, encoding, dim, data, recorded_at)"
    " SELECT id, CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS {blob}), CAST(? AS {time})"
    " FROM decisions WHERE id = ? ON CONFLICT (decision_id) DO NOTHING"
)
_SELECT = (
    "SELECT f.decision_id, f.spec_sha256, f.encoding, f.dim, f.data, s.spec_json"
    " FROM features f JOIN feature_specs s ON s.spec_sha256 = f.spec_sha256 WHERE f.decision_id IN ({ids})"
)


@dataclass(frozen=True)
class LoggedFeatures:
    """A decision's logged reader features.

    Attributes:
        spec: The reader's feature spec, as it was recorded (a JSON object).
        spec_sha256: SHA-256 of the spec's canonical JSON (:func:`spec_sha256`).
        vector: The feature vector, float32 (stored as float16: about 3 significant digits).
    """

    spec: dict[str, Any]
    spec_sha256: str
    vector: np.ndarray = field(repr=False, compare=False)


def spec_json(spec: Mapping[str, Any] | Any) -> str:
    """The canonical JSON of a feature spec (a mapping, or a pydantic model such as
    :class:`~capgate.local.hidden_states.FeatureSpec`): sorted keys, no spaces.

    Examples:
        >>> spec_json({"dim": 3, "model_id": "m"})
        '{"dim":3,"model_id":"m"}'
    """
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump(mode="json")
    if not isinstance(spec, Mapping):
        raise TypeError(f"a feature spec must be a mapping (or a pydantic model); got {type(spec).__name__}")
    try:
        return json.dumps(
            dict(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a feature spec must be plain JSON (str keys, finite numbers): {exc}") from None


def spec_sha256(spec: Mapping[str, Any] | Any) -> str:
    """SHA-256 (hex) of a feature spec's canonical JSON: the tag stored with each vector.

    Examples:
        >>> spec_sha256({"dim": 3, "model_id": "m"}) == spec_sha256({"model_id": "m", "dim": 3})
        True
    """
    return hashlib.sha256(spec_json(spec).encode()).hexdigest()


def encode(decision_id: str, vector: Any) -> tuple[int, bytes]:
    """A vector as (dim, float16 bytes); a ``ValueError`` naming the decision, never a value."""
    try:
        array = np.asarray(vector, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"features for decision {decision_id}: not an array of numbers") from None
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"features for decision {decision_id}: expected a non-empty 1-D vector; got shape {array.shape}"
        )
    with np.errstate(over="ignore"):  # beyond float16's range becomes inf, refused below
        half = array.astype(_DTYPE)
    bad = int(np.count_nonzero(~np.isfinite(half)))
    if bad:
        raise ValueError(
            f"features for decision {decision_id}: {bad} of {array.size} values are not finite, or "
            "beyond float16's range (|x| > 65504): not stored"
        )
    return int(array.size), half.tobytes()


def decode(decision_id: str, encoding: str, dim: int, data: bytes, location: str) -> np.ndarray:
    """A stored vector as float32; a :class:`DataError` naming the decision if it is malformed."""
    if encoding != ENCODING:
        raise DataError(
            f"features for decision {decision_id}: unknown encoding {encoding!r} (expected {ENCODING!r})",
            path=location,
            field="features.encoding",
        )
    raw = bytes(data)
    if len(raw) != dim * _DTYPE.itemsize:
        raise DataError(
            f"features for decision {decision_id}: {len(raw)} bytes for dim {dim} "
            f"(expected {dim * _DTYPE.itemsize})",
            path=location,
            field="features.data",
        )
    return np.frombuffer(raw, dtype=_DTYPE).astype(np.float32)


class FeatureLog:
    """The features part of :class:`~capgate.decision.DecisionLog` (a mixin over its ``store``)."""

    store: Store

    def record_features(self, rows: Sequence[tuple[str, Any]], spec: Mapping[str, Any] | Any) -> int:
        """Store reader features beside logged decisions; returns how many rows were written.

        Args:
            rows: ``(decision_id, vector)`` pairs; each vector 1-D, finite, within float16's range.
            spec: The reader's feature spec (a mapping, or a
                :class:`~capgate.local.hidden_states.FeatureSpec`), stored once under its SHA-256.

        Rows whose decision is not in the log, or already has features (the first is kept), are
        skipped. One transaction for all rows.

        Raises:
            ValueError: A vector that is not 1-D, not finite, or beyond float16's range (the
                message names the decision, never a value); nothing is written then.
            LogUnavailableError: The store could not be written.
        """
        text = spec_json(spec)
        sha = hashlib.sha256(text.encode()).hexdigest()
        now = datetime.now(UTC).isoformat()
        params: list[tuple[Any, ...]] = []
        for decision_id, vector in rows:
            dim, data = encode(str(decision_id), vector)
            params.append((sha, ENCODING, dim, data, now, str(decision_id)))
        if not params:
            return 0
        dialect = self.store.dialect
        batches: list[tuple[str, Sequence[Sequence[Any]]]] = [
            (_INSERT_SPEC, [(sha, text)]),
            (dialect.render(_INSERT_FEATURES), params),
        ]
        return int(self.store.write_all(batches)[1])

    def features(self, ids: Sequence[str]) -> dict[str, LoggedFeatures]:
        """The logged features of these decisions, by decision id (ids without features are absent).

        Raises:
            DataError: A stored vector is malformed (the message names the decision).
            LogUnavailableError: The store could not be read.
        """
        specs: dict[str, dict[str, Any]] = {}
        found: dict[str, LoggedFeatures] = {}
        for decision_id, sha, encoding, dim, data, text in read_in(
            self.store, _SELECT, [str(i) for i in ids]
        ):
            if sha not in specs:
                specs[sha] = json.loads(text)
            vector = decode(decision_id, encoding, int(dim), data, self.store.location)
            found[decision_id] = LoggedFeatures(spec=dict(specs[sha]), spec_sha256=sha, vector=vector)
        return found

    def features_count(self, *, spec_sha256: str | None = None) -> int:
        """How many decisions have logged features (only with this spec's SHA-256, if given)."""
        if spec_sha256 is None:
            return int(self.store.read("SELECT COUNT(*) FROM features")[0][0])
        sql = "SELECT COUNT(*) FROM features WHERE spec_sha256 = ?"
        return int(self.store.read(sql, (spec_sha256,))[0][0])
