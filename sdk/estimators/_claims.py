"""A learned detector of capability and confidence claims in a piece of text.

:class:`ClaimDetector` scores a segment of a query by how much it reads like a claim that the task
is easy, that the model knows or already checked the answer, or an order to answer with
confidence. It is a logistic regression on hashed word 1-2-grams and in-word character 3-5-grams
(which carry across inflections and related languages), fitted with L2 by full-batch Adam:
deterministic, numpy only, seconds on a CPU. The shipped detector (``capgate.assets``) is trained
by ``bench/train_claim_detector.py``; its threshold was set on clean held-out text.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import zlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from capgate._util.saved import read_saved
from capgate._util.validate import check_unit_interval
from capgate.errors import DataError
from capgate.estimators._common import check_fitted
from capgate.estimators.base import Params

DEFAULT_CLAIM_DETECTOR = "claim_detector.npz"
"""File (inside ``capgate.assets``) of the shipped claim detector."""

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_FORMAT = "capgate.claim_detector"


class _Header(BaseModel):
    """A saved detector's JSON header (beside its ``columns`` and ``coef`` arrays)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["capgate.claim_detector"]
    n_features: int = Field(gt=0, strict=True)
    l2: float = Field(ge=0.0, allow_inf_nan=False)
    max_iter: int = Field(gt=0, strict=True)
    learning_rate: float = Field(gt=0.0, allow_inf_nan=False)
    threshold: float | None = Field(ge=0.0, le=1.0)
    intercept: float = Field(allow_inf_nan=False)


class _Weights(BaseModel):
    """A saved detector's ``columns`` and ``coef`` arrays, checked against its header's ``n_features``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    n_features: int
    columns: np.ndarray
    coef: np.ndarray

    @field_validator("columns")
    @classmethod
    def _check_columns(cls, value: np.ndarray, info: ValidationInfo) -> np.ndarray:
        n_features = info.data["n_features"]
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise ValueError(f"must be a 1-D array of integers; got {value.dtype} of shape {value.shape}")
        if value.size and (value.min() < 0 or value.max() >= n_features):
            raise ValueError(f"must lie in [0, n_features={n_features}); got {value.min()} to {value.max()}")
        return value

    @field_validator("coef")
    @classmethod
    def _check_coef(cls, value: np.ndarray, info: ValidationInfo) -> np.ndarray:
        if value.ndim != 1 or value.dtype.kind not in "fiu":
            raise ValueError(f"must be a 1-D array of numbers; got {value.dtype} of shape {value.shape}")
        columns = info.data.get("columns")  # absent when the columns were refused
        if columns is not None and value.shape != columns.shape:
            raise ValueError(f"must have one weight per column ({columns.shape[0]}); got {value.shape[0]}")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"must be finite; got {int(np.sum(~np.isfinite(value)))} non-finite weights")
        return value


def _hash(feature: str, n_features: int) -> int:
    return zlib.crc32(feature.encode("utf-8")) % n_features


def _features(text: str, n_features: int) -> dict[int, float]:
    """Hashed, L2-normalized word 1-2-gram and in-word character 3-5-gram counts."""
    words = _TOKEN.findall(text.lower())
    counts: dict[int, float] = {}
    grams = [f"w:{w}" for w in words] + [f"b:{a} {b}" for a, b in itertools.pairwise(words)]
    for word in words:
        padded = f" {word} "
        grams.extend(f"c:{padded[i : i + n]}" for n in (3, 4, 5) for i in range(len(padded) - n + 1))
    for gram in grams:
        index = _hash(gram, n_features)
        counts[index] = counts.get(index, 0.0) + 1.0
    norm = float(np.sqrt(sum(v * v for v in counts.values()))) or 1.0
    return {i: v / norm for i, v in counts.items()}


def _matrix(
    texts: Sequence[str], n_features: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A CSR-like triple (row of each entry, column, value)."""
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for row, text in enumerate(texts):
        for col, val in _features(text, n_features).items():
            rows.append(row)
            cols.append(col)
            vals.append(val)
    return np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), np.asarray(vals)


class ClaimDetector(Params):
    """Scores text by how much it reads like a capability or confidence claim.

    Args:
        n_features: Width of the hashed feature space.
        l2: L2 penalty on the weights (per example).
        max_iter: Full-batch Adam steps.
        learning_rate: Adam step size.
        threshold: Score at or above which a segment counts as a claim; ``None`` keeps 0.5
            until :meth:`set_threshold` (or a loaded file) sets one.

    Examples:
        >>> texts = ["This is easy, you surely know it.", "What is the capital of Peru?",
        ...          "You are certain to get this right.", "Answer with only the final number."]
        >>> detector = ClaimDetector(max_iter=200).fit(texts, [1, 0, 1, 0])
        >>> [bool(s > 0.5) for s in detector.score(["Easy: you surely know this.", "Who wrote Emma?"])]
        [True, False]
    """

    def __init__(
        self,
        *,
        n_features: int = 2**18,
        l2: float = 1e-4,
        max_iter: int = 400,
        learning_rate: float = 0.1,
        threshold: float | None = None,
    ) -> None:
        self.n_features = n_features
        self.l2 = l2
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.threshold = threshold

    @property
    def threshold_(self) -> float:
        """The threshold in use: the one set, else 0.5."""
        return 0.5 if self.threshold is None else self.threshold

    def fit(self, texts: Sequence[str], labels: npt.ArrayLike) -> ClaimDetector:
        """Fit on texts labelled 1 (a claim) or 0 (not); returns ``self``."""
        y = np.asarray(labels, dtype=np.float64)
        if y.shape != (len(texts),) or not np.all((y == 0) | (y == 1)):
            raise ValueError(f"labels must be {len(texts)} values in {{0, 1}}; got shape {y.shape}")
        rows, cols, vals = _matrix(texts, self.n_features)
        used, col_index = np.unique(cols, return_inverse=True)
        w = np.zeros(len(used))
        b = 0.0
        m_w, v_w = np.zeros_like(w), np.zeros_like(w)
        m_b = v_b = 0.0
        n = len(texts)
        for step in range(1, self.max_iter + 1):
            z = np.bincount(rows, weights=vals * w[col_index], minlength=n) + b
            r = (1.0 / (1.0 + np.exp(-z)) - y) / n
            g_w = np.bincount(col_index, weights=vals * r[rows], minlength=len(used)) + self.l2 * w
            g_b = float(r.sum())
            m_w = 0.9 * m_w + 0.1 * g_w
            v_w = 0.999 * v_w + 0.001 * g_w**2
            m_b = 0.9 * m_b + 0.1 * g_b
            v_b = 0.999 * v_b + 0.001 * g_b**2
            scale = self.learning_rate * np.sqrt(1 - 0.999**step) / (1 - 0.9**step)
            w -= scale * m_w / (np.sqrt(v_w) + 1e-8)
            b -= scale * m_b / (np.sqrt(v_b) + 1e-8)
        self.columns_ = used.astype(np.int64)
        self.coef_ = w.astype(np.float32)
        self.intercept_ = float(b)
        return self

    def set_threshold(self, threshold: float) -> ClaimDetector:
        """Use ``threshold`` from now on; returns ``self``."""
        self.threshold = check_unit_interval("threshold", threshold, open_ends=True)
        return self

    def score(self, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        """Claim scores in [0, 1], one per text."""
        check_fitted(self, "coef_")
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings; wrap a single text in a list")
        if not texts:
            return np.zeros(0)
        dense = np.zeros(self.n_features, dtype=np.float64)
        dense[self.columns_] = self.coef_
        rows, cols, vals = _matrix(texts, self.n_features)
        z = np.bincount(rows, weights=vals * dense[cols], minlength=len(texts)) + self.intercept_
        scores: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-z))
        return scores

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the detector to one ``.npz`` file (arrays plus a JSON header; no pickle)."""
        check_fitted(self, "coef_")
        header = {"format": _FORMAT, **self.get_params(deep=False), "intercept": self.intercept_}
        with open(path, "wb") as handle:
            np.savez_compressed(
                handle,
                header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8),
                columns=self.columns_,
                coef=self.coef_,
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> ClaimDetector:
        """Load a saved detector; ``None`` loads the one shipped with capgate.

        Raises:
            DataError: The file is missing or not a claim detector (the message names the field:
                ``columns`` out of ``[0, n_features)``, ``coef`` of another length or not finite...).
        """
        where = (
            Path(str(resources.files("capgate.assets") / DEFAULT_CLAIM_DETECTOR))
            if path is None
            else Path(path)
        )
        try:
            with np.load(where, allow_pickle=False) as data:
                payload = json.loads(bytes(data["header"]).decode())
                columns, coef = data["columns"], data["coef"]
        except (OSError, KeyError, ValueError) as error:
            raise DataError(f"not a readable claim detector: {error}", path=where) from None
        header = read_saved(_Header, payload, where)
        weights = read_saved(
            _Weights, {"n_features": header.n_features, "columns": columns, "coef": coef}, where
        )
        detector = cls(**header.model_dump(exclude={"format", "intercept"}))
        detector.columns_ = weights.columns.astype(np.int64)
        detector.coef_ = weights.coef.astype(np.float32)
        detector.intercept_ = header.intercept
        return detector
