"""Test doubles for probe tests: a deterministic featurizer and synthetic labelled queries.

``CharCountFeaturizer`` stands in for a model's hidden states: features are a fixed random
projection of a query's character counts, so they are deterministic, depend on the text, and a
capability defined as a linear function of them is exactly learnable by a linear probe.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from capgate.core.backend import Prompt
from capgate.estimators.base import query_text

ALPHABET = string.ascii_lowercase + string.digits + " ?"


class ToySpec(BaseModel):
    """Same shape as the FeatureSpec the local-model featurizer publishes."""

    model_config = ConfigDict(frozen=True)

    model_id: str
    weights_fingerprint: str
    layers: list[int]
    pooling: str
    chat_template: str | None
    dim: int
    source: str


class CharCountFeaturizer:
    """Features: character counts of the query text times a fixed random projection (seeded)."""

    def __init__(
        self, *, dim: int = 12, seed: int = 0, pydantic_spec: bool = False, source: str = "tests"
    ) -> None:
        self.dim = dim
        self.seed = seed
        self.calls: list[int] = []
        self._projection = np.random.default_rng(seed).normal(size=(len(ALPHABET), dim)) / 3.0
        fingerprint = hashlib.sha256(self._projection.tobytes()).hexdigest()[:16]
        fields: dict[str, Any] = {
            "model_id": "tests/char-counts",
            "weights_fingerprint": fingerprint,
            "layers": [0],
            "pooling": "counts",
            "chat_template": None,
            "dim": dim,
            "source": source,
        }
        self._spec: Any = ToySpec(**fields) if pydantic_spec else fields

    @property
    def spec(self) -> Any:
        return self._spec

    def counts(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float64]:
        out = np.zeros((len(queries), len(ALPHABET)))
        for i, query in enumerate(queries):
            for ch in query_text(query).lower():
                j = ALPHABET.find(ch)
                if j >= 0:
                    out[i, j] += 1
        return out

    def transform(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float32]:
        self.calls.append(len(queries))
        return (self.counts(queries) @ self._projection).astype(np.float32)


def random_queries(n: int, seed: int) -> list[str]:
    """``n`` distinct random lower-case questions of varying length."""
    rng = np.random.default_rng(seed)
    letters = np.array(list(string.ascii_lowercase + "     0123456789"))
    out: list[str] = []
    for i in range(n):
        body = "".join(rng.choice(letters, size=int(rng.integers(8, 60))))
        out.append(f"{body}? #{i}")
    return out


def sigmoid(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-z))
    return out


def linear_capability(
    features: npt.NDArray[Any], seed: int, *, strength: float = 2.0
) -> npt.NDArray[np.float64]:
    """A true capability µ = sigmoid(strength · standardized(features) · w), w a random unit vector."""
    x = np.asarray(features, dtype=np.float64)
    w = np.random.default_rng(seed).normal(size=x.shape[1])
    w /= np.linalg.norm(w)
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    return sigmoid(strength * z @ w + 0.3)


def sampled_mu_hat(mu: npt.NDArray[np.float64], k: int, seed: int) -> npt.NDArray[np.float64]:
    """µ̂ = Binomial(k, µ) / k, as labelling by sampling k responses gives."""
    out: npt.NDArray[np.float64] = np.random.default_rng(seed).binomial(k, mu) / k
    return out
