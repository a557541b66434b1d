"""Reference estimators every real one must beat: uniform random and the constant prior.

Both take ``X`` as a sequence of queries or an array with one row per query (features, ids):
the constant prior ignores it, the uniform baseline hashes each entry into its draw.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from capgate._util.saved import read_saved
from capgate._util.validate import FloatArray, check_positive_int
from capgate.core.backend import Prompt, as_messages
from capgate.core.types import Estimate
from capgate.estimators._common import as_vector, check_fitted, check_weights, n_rows, read_json, write_json
from capgate.estimators.base import CapabilityEstimator

__all__ = ["ConstantPrior", "UniformRandom"]

_UNIFORM_FORMAT = "capgate.uniform_random"
_PRIOR_FORMAT = "capgate.constant_prior"


def _entry_bytes(entry: object) -> bytes:
    """A canonical byte string for one query (text or chat) or one feature row."""
    if isinstance(entry, np.generic) and not isinstance(entry, str):
        entry = np.asarray(entry)
    if isinstance(entry, np.ndarray):
        row = np.ascontiguousarray(entry)
        return f"array:{row.dtype.str}:{row.shape}:".encode() + row.tobytes()
    if isinstance(entry, str | Sequence):
        # A bare question and the one-turn chat asking it are the same query.
        messages = as_messages(entry)
        return b"chat:" + json.dumps(messages, sort_keys=True, ensure_ascii=False).encode("utf-8")
    raise TypeError(f"expected a query (text or chat messages) or a feature row; got {type(entry).__name__}")


class UniformRandom(CapabilityEstimator):
    """The paper's "Uniform" baseline: a capability drawn from U(0, 1), ignoring the query.

    Each query's draw is a keyed hash of the query and ``random_state``: reproducible, independent
    of batching and order, uniform across distinct queries. It learns nothing: :meth:`fit` only
    checks its arguments, and prediction works without it.

    Args:
        random_state: Seed of the draws.

    Examples:
        >>> u = UniformRandom(random_state=0)
        >>> p = u.predict(["2+2?", "Prove the Riemann hypothesis."])
        >>> bool(((0 <= p) & (p < 1)).all())
        True
        >>> bool((p[::-1] == u.predict(["Prove the Riemann hypothesis.", "2+2?"])).all())  # order-free
        True
    """

    method = "uniform-random"

    def __init__(self, *, random_state: int = 0) -> None:
        self.random_state = random_state

    def fit(self, X: Sequence[Prompt] | npt.ArrayLike, y: npt.ArrayLike) -> UniformRandom:
        """Check ``X`` and ``y`` line up; there is nothing to learn. Returns ``self``."""
        as_vector(y, name="y", n=n_rows(X), unit=True)
        return self

    def predict(self, X: Sequence[Prompt] | npt.ArrayLike) -> FloatArray:
        """One draw in [0, 1) per query (or per row of an array)."""
        if not isinstance(self.random_state, int) or isinstance(self.random_state, bool):
            raise ValueError(f"`random_state` must be an integer; got {self.random_state!r}")
        n = n_rows(X)
        entries: Sequence[Any] = X  # type: ignore[assignment]
        key = self.random_state.to_bytes(16, "little", signed=True)
        out = np.empty(n, dtype=np.float64)
        for i in range(n):
            digest = hashlib.blake2b(_entry_bytes(entries[i]), digest_size=8, key=key).digest()
            out[i] = (int.from_bytes(digest, "little") >> 11) * 2.0**-53
        return out

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """One estimate per query, ``method="uniform-random"``."""
        return [Estimate(p=float(p), method=self.method) for p in self.predict(list(queries))]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the seed as JSON."""
        write_json(Path(path), {"format": _UNIFORM_FORMAT, "random_state": self.random_state})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> UniformRandom:
        """Load what :meth:`save` wrote."""
        file = Path(path)
        saved = read_saved(_SavedUniform, read_json(file, kind=_UNIFORM_FORMAT), file)
        return cls(random_state=saved.random_state)


class ConstantPrior(CapabilityEstimator):
    """Predicts the mean training µ̂ for every query: the best query-blind estimate.

    Attributes:
        prior_: The (weighted) mean of the training µ̂.
        n_train_: How many training queries it was fitted on.

    Examples:
        >>> prior = ConstantPrior().fit(["a", "b", "c", "d"], [1.0, 0.5, 0.5, 0.0])
        >>> prior.predict(["anything"]).tolist(), prior.estimate_one("x").p
        ([0.5], 0.5)
    """

    method = "constant-prior"

    prior_: float | None

    def __init__(self) -> None:
        self.prior_ = None

    def fit(
        self,
        X: Sequence[Prompt] | npt.ArrayLike,
        y: npt.ArrayLike,
        *,
        sample_weight: npt.ArrayLike | None = None,
    ) -> ConstantPrior:
        """Learn the mean of ``y`` = µ̂ (weighted by ``sample_weight``). Returns ``self``."""
        target = as_vector(y, name="y", n=n_rows(X), unit=True)
        weights = check_weights(sample_weight, target.shape[0])
        self.prior_ = float(np.clip(np.average(target, weights=weights), 0.0, 1.0))
        self.n_train_ = int(target.shape[0])
        return self

    @classmethod
    def from_mean(cls, prior: float, *, n_train: int) -> ConstantPrior:
        """A fitted prior from a recorded training mean (as a saved probe's training summary holds)."""
        value = as_vector([prior], name="prior", unit=True)[0]
        check_positive_int("n_train", n_train)
        estimator = cls()
        estimator.prior_ = float(value)
        estimator.n_train_ = n_train
        return estimator

    def predict(self, X: Sequence[Prompt] | npt.ArrayLike) -> FloatArray:
        """``prior_`` for every query (or row of an array)."""
        check_fitted(self, "prior_")
        assert self.prior_ is not None
        return np.full(n_rows(X), self.prior_, dtype=np.float64)

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        """One estimate per query, ``method="constant-prior"``."""
        return [Estimate(p=float(p), method=self.method) for p in self.predict(list(queries))]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the prior as JSON."""
        check_fitted(self, "prior_")
        write_json(Path(path), {"format": _PRIOR_FORMAT, "prior": self.prior_, "n_train": self.n_train_})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ConstantPrior:
        """Load what :meth:`save` wrote."""
        file = Path(path)
        saved = read_saved(_SavedPrior, read_json(file, kind=_PRIOR_FORMAT), file)
        return cls.from_mean(saved.prior, n_train=saved.n_train)


class _SavedUniform(BaseModel):
    """The file :meth:`UniformRandom.save` writes."""

    model_config = ConfigDict(strict=True)

    format: str
    random_state: int


class _SavedPrior(BaseModel):
    """The file :meth:`ConstantPrior.save` writes."""

    model_config = ConfigDict(strict=True)

    format: str
    prior: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    n_train: int
