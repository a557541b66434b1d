"""bench/peers_table.py: the peers bench's metrics on toy inputs whose values are worked out by hand."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from peers_table import (
    Cost,
    Labels,
    MethodScores,
    best_peer,
    format_table,
    headline,
    score_method,
    train_quantile_map,
)

LABELS = Labels(
    train_mu=np.array([0.0, 0.0, 1.0, 1.0]),
    test_correct=np.array([0, 4]),
    test_k=np.array([4, 4]),
)
COST = Cost(generations=1.0, generated_tokens=10.0, forward_passes=10.0, wall_s=0.5)


def method(
    name: str,
    train: list[float],
    test: list[float],
    *,
    direction: str = "confidence",
    probability: bool = True,
) -> MethodScores:
    return MethodScores(
        name=name,
        family="peer",
        sees="query + 1 answer",
        train=np.array(train, dtype=float),
        test=np.array(test, dtype=float),
        direction=direction,  # type: ignore[arg-type]
        probability=probability,
        cost=COST,
    )


def test_probability_scores_raw_metrics_by_hand() -> None:
    row = score_method(method("p", [0.1, 0.2, 0.7, 0.9], [0.2, 0.6]), LABELS)
    assert (row.n, row.n_train) == (2, 4)
    assert row.raw.brier == pytest.approx((0.2**2 + 0.4**2) / 2)  # 0.1
    assert row.raw.ece == pytest.approx((0.2 + 0.4) / 2)  # two bins, one query each
    assert row.raw.auroc == pytest.approx(1.0)  # the 4 correct samples outrank the 4 wrong ones
    assert row.raw.spearman == pytest.approx(1.0)
    # Isotonic on train: 0 up to 0.2, linear to 1 at 0.7, so 0.2 -> 0 and 0.6 -> 0.8.
    assert row.isotonic.brier == pytest.approx((0.0 + 0.2**2) / 2)


def test_uncertainty_is_negated_mapped_on_train_and_calibrated() -> None:
    row = score_method(
        method("u", [4.0, 3.0, 2.0, 1.0], [3.5, 1.5], direction="uncertainty", probability=False), LABELS
    )
    assert math.isnan(row.raw.brier)
    assert math.isnan(row.raw.ece)
    assert row.raw.auroc == pytest.approx(1.0)
    assert row.isotonic.brier == pytest.approx(0.0)  # 3.5 -> 0, 1.5 -> 1 (train map)
    assert row.isotonic.auroc == pytest.approx(1.0)


def test_isotonic_map_comes_from_train_only() -> None:
    # On train the score falls as µ̂ rises: the monotone map is flat at the train mean 0.5.
    row = score_method(method("anti", [0.9, 0.7, 0.2, 0.1], [0.2, 0.6]), LABELS)
    assert row.isotonic.brier == pytest.approx(0.25)
    assert row.raw.brier == pytest.approx(0.1)


def test_missing_scores_are_left_out_and_counted() -> None:
    row = score_method(method("gap", [0.1, float("nan"), 0.7, 0.9], [float("nan"), 0.6]), LABELS)
    assert (row.n, row.n_train) == (1, 3)
    assert row.raw.brier == pytest.approx(0.4**2)


def test_probability_out_of_range_is_refused_with_the_method_named() -> None:
    with pytest.raises(ValueError, match=r"p2: raw held-out scores must lie in \[0, 1\]"):
        score_method(method("p2", [0.1, 0.2, 0.7, 0.9], [0.2, 1.5]), LABELS)


def test_train_quantile_map_positions_and_ties() -> None:
    q = train_quantile_map(np.array([1.0, 2.0, 2.0, 3.0]), np.array([0.0, 1.0, 2.0, 2.5, 9.0]))
    assert q == pytest.approx([0.125, 0.125, 0.5, 0.6875, 0.875])


def test_headline_best_peer_and_cost_ratio() -> None:
    probe = MethodScores(
        name="Probe",
        family="capgate",
        sees="query only",
        train=np.full(4, np.nan),
        test=np.array([0.1, 0.9]),
        direction="confidence",
        probability=True,
        cost=Cost(0.0, 0.0, 1.0, 0.05),
        calibrate=False,
    )
    rows = [
        score_method(probe, LABELS),
        score_method(method("good", [0.1, 0.2, 0.7, 0.9], [0.2, 0.6]), LABELS),
        score_method(method("anti", [0.9, 0.7, 0.2, 0.1], [0.2, 0.6]), LABELS),
    ]
    assert best_peer(rows).name == "good"
    assert headline(rows) == (
        "peers: capgate probe Brier 0.0100 AUROC 1.0000; best peer good Brier 0.0200 AUROC 1.0000 "
        "(isotonic); cost ratio 10.0×"
    )
    table = format_table(rows)
    assert table.splitlines()[2].startswith("| Probe | query only | 2 | 0.0100 |")
    assert "| — |" in table.splitlines()[2]  # no isotonic map for the probe


def test_a_peer_that_scores_too_few_queries_is_shown_but_not_named_best() -> None:
    labels = Labels(
        train_mu=np.array([0.0, 0.0, 1.0, 1.0]),
        test_correct=np.array([0, 4, 0, 4] * 5),
        test_k=np.full(20, 4),
    )
    probe = MethodScores(
        "Probe",
        "capgate",
        "query only",
        np.full(4, np.nan),
        np.tile([0.1, 0.9], 10),
        "confidence",
        True,
        Cost(0.0, 0.0, 1.0, 0.05),
        calibrate=False,
    )
    perfect_on_two = np.full(20, np.nan)
    perfect_on_two[:2] = [0.0, 1.0]  # a perfect score, but only where its replies parsed
    partial = MethodScores(
        "parsed-only", "peer", "q", np.array([0.1, 0.2, 0.7, 0.9]), perfect_on_two, "confidence", True, COST
    )
    full = MethodScores(
        "every-query",
        "peer",
        "q",
        np.array([0.1, 0.2, 0.7, 0.9]),
        np.tile([0.2, 0.6], 10),
        "confidence",
        True,
        COST,
    )
    rows = [score_method(m, labels) for m in (probe, partial, full)]
    assert rows[1].n == 2
    assert rows[1].isotonic.brier < rows[2].isotonic.brier
    assert best_peer(rows).name == "parsed-only"  # without a coverage floor
    assert best_peer(rows, of=20).name == "every-query"  # 2 of 20 < 90%
    assert "best peer every-query" in headline(rows)
    with pytest.raises(ValueError, match="on >= 90% of 20 queries"):
        best_peer(rows[:2], of=20)
