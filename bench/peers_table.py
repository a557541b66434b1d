"""The table of ``bench/peers_bench.py``: every method scored with capgate's own metrics.

Each method brings raw scores for the train and the held-out queries (NaN: no score), which
way they point (a confidence or an uncertainty), whether the raw score already is a capability
estimate in [0, 1], and its cost per held-out query. :func:`score_method` computes

* raw: capability Brier, ECE, AUROC and Spearman of the raw score (Brier and ECE only where the
  raw score is a probability; AUROC and Spearman only need its order, so an uncertainty is
  negated and ranked);
* isotonic: the same four after an isotonic map (``capgate.estimators.IsotonicCalibrator``)
  fitted on the train queries' (score, µ̂) pairs only and applied to the held-out scores. A
  score that is not a probability is first put on [0, 1] by its position among the train
  scores (piecewise-linear, fitted on train only, order-preserving), which the isotonic map
  then turns into a capability estimate.

Metrics are computed on the held-out queries that have a score (``n`` says how many).
:func:`format_table` renders markdown; :func:`headline` is the bench's last line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from capgate.estimators import IsotonicCalibrator
from capgate.metrics import auroc, capability_brier, expected_calibration_error, spearman

FloatArray = npt.NDArray[np.float64]
Direction = Literal["confidence", "uncertainty"]
Family = Literal["capgate", "peer"]


@dataclass(frozen=True)
class Cost:
    """Mean cost per held-out query."""

    generations: float
    generated_tokens: float
    forward_passes: float
    wall_s: float


@dataclass(frozen=True)
class MethodScores:
    """One method's raw scores, aligned with the label arrays (NaN: no score for that query)."""

    name: str
    family: Family
    sees: str
    train: FloatArray
    test: FloatArray
    direction: Direction
    probability: bool
    cost: Cost
    calibrate: bool = True


@dataclass(frozen=True)
class Labels:
    """µ̂ of the train queries; correct counts and k of the held-out ones."""

    train_mu: FloatArray
    test_correct: npt.NDArray[np.int64]
    test_k: npt.NDArray[np.int64]

    @property
    def test_mu(self) -> FloatArray:
        return self.test_correct / self.test_k


@dataclass(frozen=True)
class Metrics:
    brier: float
    ece: float
    auroc: float
    spearman: float


NAN_METRICS = Metrics(math.nan, math.nan, math.nan, math.nan)


@dataclass(frozen=True)
class PeerRow:
    name: str
    family: Family
    sees: str
    n: int
    n_train: int
    raw: Metrics
    isotonic: Metrics
    cost: Cost


def _check(method: MethodScores, labels: Labels) -> None:
    if method.train.shape != labels.train_mu.shape:
        raise ValueError(
            f"{method.name}: {method.train.shape[0]} train scores for {labels.train_mu.shape[0]} train labels"
        )
    if method.test.shape != labels.test_correct.shape:
        raise ValueError(
            f"{method.name}: {method.test.shape[0]} held-out scores for {labels.test_correct.shape[0]} labels"
        )
    if method.probability:
        for part, values in (("train", method.train), ("held-out", method.test)):
            finite = values[~np.isnan(values)]
            if finite.size and (finite.min() < 0.0 or finite.max() > 1.0):
                raise ValueError(
                    f"{method.name}: raw {part} scores must lie in [0, 1] (probability=True); "
                    f"got [{finite.min():.4g}, {finite.max():.4g}]"
                )


def _metrics(p: FloatArray, correct: npt.NDArray[np.int64], k: npt.NDArray[np.int64]) -> Metrics:
    mu = correct / k
    return Metrics(
        brier=capability_brier(p, mu),
        ece=expected_calibration_error(p, mu),
        auroc=auroc(p, correct, k=k),
        spearman=spearman(p, mu),
    )


def train_quantile_map(train_confidence: FloatArray, confidence: FloatArray) -> FloatArray:
    """Position of each confidence among the train confidences, in (0, 1), order-preserving.

    Piecewise-linear between the distinct train values (each at its mean plotting position
    ``(rank - 0.5) / n``), clipped outside their range.
    """
    n = train_confidence.size
    if n == 0:
        raise ValueError("no train scores to fit the map on")
    order = np.sort(train_confidence)
    positions = (np.arange(n) + 0.5) / n
    knots, first = np.unique(order, return_index=True)
    counts = np.diff(np.append(first, n))
    mean_pos = np.add.reduceat(positions, first) / counts
    if knots.size == 1:
        return np.full(confidence.shape, 0.5)
    return np.asarray(np.interp(confidence, knots, mean_pos), dtype=np.float64)


def _rank_unit(values: FloatArray) -> FloatArray:
    """Average ranks scaled into (0, 1): same order (ties kept) as ``values``."""
    from capgate.metrics import rankdata

    return rankdata(values) / (values.size + 1)


def score_method(method: MethodScores, labels: Labels) -> PeerRow:
    """Raw and isotonic metrics of one method on the held-out queries it scores."""
    _check(method, labels)
    sign = 1.0 if method.direction == "confidence" else -1.0
    usable = ~np.isnan(method.test)
    correct, k = labels.test_correct[usable], labels.test_k[usable]
    n = int(usable.sum())
    if n == 0:
        return PeerRow(method.name, method.family, method.sees, 0, 0, NAN_METRICS, NAN_METRICS, method.cost)
    test = method.test[usable]
    if method.probability:
        raw = _metrics(test, correct, k)
    else:
        ranked = _metrics(_rank_unit(sign * test), correct, k)
        raw = Metrics(math.nan, math.nan, ranked.auroc, ranked.spearman)
    isotonic = NAN_METRICS
    n_train = 0
    if method.calibrate:
        fit = ~np.isnan(method.train)
        if not fit.any():
            raise ValueError(f"{method.name}: no train scores to fit the isotonic map on")
        train_c, test_c = sign * method.train[fit], sign * test
        if method.probability and sign > 0:
            x_train, x_test = train_c, test_c
        else:
            x_train, x_test = train_quantile_map(train_c, train_c), train_quantile_map(train_c, test_c)
        calibrator = IsotonicCalibrator().fit(x_train, labels.train_mu[fit])
        isotonic = _metrics(np.clip(calibrator.predict(x_test), 0.0, 1.0), correct, k)
        n_train = int(fit.sum())
    return PeerRow(method.name, method.family, method.sees, n, n_train, raw, isotonic, method.cost)


def score_methods(methods: Sequence[MethodScores], labels: Labels) -> list[PeerRow]:
    """:func:`score_method` for each method, in order."""
    return [score_method(m, labels) for m in methods]


def _cell(value: float, digits: int = 4) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


def format_table(rows: Sequence[PeerRow]) -> str:
    """A markdown table: what each method sees, raw and isotonic metrics (and the train queries the
    isotonic map was fitted on), cost per query."""
    head = (
        "| method | sees | n | Brier raw | ECE raw | AUROC raw | Spearman raw | iso fit on | Brier iso "
        "| ECE iso | AUROC iso | Spearman iso | gens/q | gen tokens/q | fwd passes/q | wall s/q |"
    )
    lines = [head, "|" + " --- |" * 16]
    for r in rows:
        c = r.cost
        lines.append(
            f"| {r.name} | {r.sees} | {r.n} | {_cell(r.raw.brier)} | {_cell(r.raw.ece)} | "
            f"{_cell(r.raw.auroc)} | {_cell(r.raw.spearman)} | {r.n_train or '—'} | "
            f"{_cell(r.isotonic.brier)} | "
            f"{_cell(r.isotonic.ece)} | {_cell(r.isotonic.auroc)} | {_cell(r.isotonic.spearman)} | "
            f"{_cell(c.generations, 2)} | {_cell(c.generated_tokens, 1)} | {_cell(c.forward_passes, 1)} | "
            f"{_cell(c.wall_s, 3)} |"
        )
    return "\n".join(lines)


MIN_COVERAGE = 0.9
"""The share of the held-out queries a peer must score to be named best: a method that scores only
the replies it could parse is measured on a subset the others are not, so it is shown in the table
but not crowned on it."""


def best_peer(rows: Sequence[PeerRow], *, of: int | None = None) -> PeerRow:
    """The peer row with the lowest isotonic Brier (ties: the higher isotonic AUROC).

    With ``of`` (the held-out queries there are), only peers that score at least
    :data:`MIN_COVERAGE` of them are candidates.
    """
    peers = [
        r
        for r in rows
        if r.family == "peer"
        and not math.isnan(r.isotonic.brier)
        and (of is None or r.n >= MIN_COVERAGE * of)
    ]
    if not peers:
        raise ValueError(
            "no peer row has an isotonic Brier score"
            + ("" if of is None else f" on >= {MIN_COVERAGE:.0%} of {of} queries")
        )
    return min(peers, key=lambda r: (r.isotonic.brier, -np.nan_to_num(r.isotonic.auroc, nan=-1.0)))


def headline(rows: Sequence[PeerRow], *, probe: str = "Probe") -> str:
    """The bench's last line: the probe beside the best peer (isotonic) and their cost ratio in wall time.

    The best peer is chosen among those that score (nearly) every query the probe scores.
    """
    found = [r for r in rows if r.name == probe]
    if len(found) != 1:
        raise ValueError(f"expected one row named {probe!r}; got {len(found)}")
    p = found[0]
    b = best_peer(rows, of=p.n)
    ratio = b.cost.wall_s / p.cost.wall_s if p.cost.wall_s > 0 else math.inf
    return (
        f"peers: capgate probe Brier {p.raw.brier:.4f} AUROC {p.raw.auroc:.4f}; "
        f"best peer {b.name} Brier {b.isotonic.brier:.4f} AUROC {b.isotonic.auroc:.4f} (isotonic); "
        f"cost ratio {ratio:.1f}×"
    )
