"""AUROC / AUPRC / rank correlations against brute-force references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capgate.metrics import auprc, auroc, pearson, rankdata, spearman

# Scores from a small grid so that ties are common.
scores = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0])


@st.composite
def soft_labels(draw: st.DrawFn) -> tuple[list[float], list[int], list[int]]:
    n = draw(st.integers(min_value=1, max_value=15))
    p = draw(st.lists(scores, min_size=n, max_size=n))
    k = draw(st.lists(st.integers(min_value=1, max_value=6), min_size=n, max_size=n))
    c = [draw(st.integers(min_value=0, max_value=kk)) for kk in k]
    return p, c, k


def expand(p: list[float], c: list[int], k: list[int]) -> tuple[list[float], list[int]]:
    """One (score, label) pair per sampled response."""
    s: list[float] = []
    y: list[int] = []
    for pi, ci, ki in zip(p, c, k, strict=True):
        s += [pi] * ki
        y += [1] * ci + [0] * (ki - ci)
    return s, y


def brute_auroc(s: list[float], y: list[int]) -> float:
    pos = [a for a, b in zip(s, y, strict=True) if b == 1]
    neg = [a for a, b in zip(s, y, strict=True) if b == 0]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def brute_average_precision(s: list[float], y: list[int]) -> float:
    thresholds = sorted(set(s), reverse=True)
    total_pos = sum(y)
    ap, previous_recall = 0.0, 0.0
    for t in thresholds:
        tp = sum(1 for a, b in zip(s, y, strict=True) if a >= t and b == 1)
        fp = sum(1 for a, b in zip(s, y, strict=True) if a >= t and b == 0)
        recall = tp / total_pos
        ap += (recall - previous_recall) * (tp / (tp + fp))
        previous_recall = recall
    return ap


@settings(max_examples=200, deadline=None)
@given(soft_labels())
def test_auroc_and_auprc_match_brute_force_on_expanded_responses(
    data: tuple[list[float], list[int], list[int]],
) -> None:
    p, c, k = data
    s, y = expand(p, c, k)
    if 0 < sum(y) < len(y):
        assert auroc(p, c, k=k) == pytest.approx(brute_auroc(s, y), abs=1e-12)
        # The expanded 0/1 form gives the same answer as the counted form.
        assert auroc(s, y) == pytest.approx(auroc(p, c, k=k), abs=1e-12)
    else:
        assert np.isnan(auroc(p, c, k=k))
    if sum(y) > 0:
        assert auprc(p, c, k=k) == pytest.approx(brute_average_precision(s, y), abs=1e-12)
    else:
        assert np.isnan(auprc(p, c, k=k))


def test_auroc_known_values() -> None:
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    assert auroc([0.5, 0.5], [1, 0]) == 0.5


def brute_ranks(x: list[float]) -> list[float]:
    return [sum(1 for b in x if b < a) + (sum(1 for b in x if b == a) + 1) / 2 for a in x]


@settings(max_examples=100, deadline=None)
@given(st.lists(scores, min_size=1, max_size=20))
def test_rankdata_averages_ties(x: list[float]) -> None:
    assert rankdata(x).tolist() == pytest.approx(brute_ranks(x))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(scores, scores), min_size=3, max_size=20))
def test_spearman_is_pearson_of_ranks(pairs: list[tuple[float, float]]) -> None:
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    ra, rb = brute_ranks(a), brute_ranks(b)
    if len(set(a)) > 1 and len(set(b)) > 1:
        ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
        cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
        var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
        assert spearman(a, b) == pytest.approx(cov / var, abs=1e-12)
    else:
        assert np.isnan(spearman(a, b))


def test_pearson_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.random(100), rng.random(100)
    assert pearson(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1])
