"""Cross-fitting and the time split: no map is ever scored on an outcome it was fitted on.

The planted-leak tests run the same checks on a deliberately leaking fold generator or split
and require them to fail: the checks can see a leak, so their passing on the real code means it
has none.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _learn_traffic import log_traffic

import capgate.learn._crossfit as crossfit_module
from capgate.decision import DecisionLog
from capgate.learn import calibrate, cross_fit, fold_blocks, time_split
from capgate.learn._crossfit import map_fitter


def _noise(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Distinct confidences and outcomes that carry no signal at all (Brier floor 0.25)."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.linspace(0.01, 0.99, n)), (rng.random(n) < 0.5).astype(float)


def _leaky_blocks(n: int, n_splits: int, groups: object = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """A planted leak: every fit also sees the block it predicts."""
    return [(np.arange(n, dtype=np.int64), block) for _, block in fold_blocks(n, n_splits)]


def test_the_held_out_part_is_the_latest_share() -> None:
    split = time_split(100, 0.3)
    assert split.train.tolist() == list(range(70))
    assert split.holdout.tolist() == list(range(70, 100))
    assert len(time_split(3, 0.01).holdout) == 1
    assert len(time_split(3, 0.99).train) == 1
    with pytest.raises(ValueError, match="holdout"):
        time_split(10, 1.0)


def test_blocks_are_contiguous_and_cover_every_row_once() -> None:
    blocks = fold_blocks(23, 5)
    predicted = np.concatenate([b for _, b in blocks])
    assert sorted(predicted.tolist()) == list(range(23))
    for fitted, block in blocks:
        assert np.all(np.diff(block) == 1)
        assert set(fitted.tolist()).isdisjoint(block.tolist())


def _scored_rows_fitted_on(n: int = 60) -> list[int]:
    """Rows whose prediction came from a fit that saw them (should be none)."""
    seen: list[tuple[set[int], np.ndarray]] = []

    def spy(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        seen.append((set(train.tolist()), test))
        return np.zeros(len(test))

    cross_fit(spy, n, n_splits=4)
    return [int(i) for fitted, test in seen for i in test if int(i) in fitted]


def _crossfit_noise_excess() -> float:
    """Cross-fitted isotonic Brier on pure noise minus the outcomes' variance (the in-sample
    Brier of their mean). A fit scored on its own rows is a least-squares fit that contains the
    constant, so it can only come out at or below that variance: the excess is then <= 0."""
    p, y = _noise(400)
    brier = float(np.mean((cross_fit(map_fitter("isotonic", p, y), len(p)).predictions - y) ** 2))
    return brier - float(y.var())


def test_cross_fitting_never_scores_a_fit_on_its_own_rows() -> None:
    assert _scored_rows_fitted_on() == []
    # On pure noise a map that never saw the scored rows does worse than their mean would.
    assert _crossfit_noise_excess() > 0


def test_planted_leak_makes_the_cross_fitting_checks_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crossfit_module, "fold_blocks", _leaky_blocks)
    assert _scored_rows_fitted_on() != []
    with pytest.raises(AssertionError):
        assert _crossfit_noise_excess() > 0


def _held_out_fitted_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[set[float], set[float], dict]:
    """Run calibrate on noise, recording every confidence a map was fitted on; returns those,
    the held-out confidences, and the summary."""
    import capgate.learn._calibrate as calibrate_module

    fitted_on: set[float] = set()
    real_fit = calibrate_module.fit_map

    def spy_fit(kind: str, p: np.ndarray, y: np.ndarray):  # type: ignore[no-untyped-def]
        fitted_on.update(p.tolist())
        return real_fit(kind, p, y)

    monkeypatch.setattr(calibrate_module, "fit_map", spy_fit)
    monkeypatch.setattr(crossfit_module, "fit_map", spy_fit)
    p, y = _noise(200, seed=3)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        log_traffic(log, p, y)
        result = calibrate(log, out=tmp_path / "cal")
    held_out = set(p[-result.summary["n_holdout"] :].tolist())
    return fitted_on, held_out, result.summary


def test_no_map_is_fitted_on_a_held_out_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fitted_on, held_out, summary = _held_out_fitted_on(tmp_path, monkeypatch)
    assert fitted_on
    assert fitted_on.isdisjoint(held_out)
    iso = next(r for r in summary["table"] if r["candidate"] == "isotonic")
    assert iso["brier"] > 0.235
    assert iso["crossfit_brier"] > 0.235


def test_planted_leak_in_the_time_split_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import capgate.learn._calibrate as calibrate_module

    real = calibrate_module.time_split

    def leaky(n: int, holdout: float, groups: object = None) -> crossfit_module.Split:
        split = real(n, holdout)
        return crossfit_module.Split(train=np.arange(n, dtype=np.int64), holdout=split.holdout)

    monkeypatch.setattr(calibrate_module, "time_split", leaky)
    fitted_on, held_out, _ = _held_out_fitted_on(tmp_path, monkeypatch)
    with pytest.raises(AssertionError):
        assert fitted_on.isdisjoint(held_out)


def _recurring(n: int = 300, n_queries: int = 40, seed: int = 0) -> np.ndarray:
    """Traffic whose queries recur, in a random order (as production traffic does)."""
    return np.random.default_rng(seed).integers(0, n_queries, size=n).astype(str)


def _shared(train: np.ndarray, test: np.ndarray, groups: np.ndarray) -> set[str]:
    return set(groups[train].tolist()) & set(groups[test].tolist())


def test_a_recurring_query_is_never_on_both_sides_of_a_split_or_a_fold() -> None:
    """A fit that memorizes queries (a probe on their features) must be scored on queries it
    never saw, as the next traffic's new queries will be."""
    groups = _recurring()
    split = time_split(len(groups), 0.3, groups)
    assert _shared(split.train, split.holdout, groups) == set()
    assert abs(len(split.holdout) - 90) < 40  # about the share asked for, in whole queries
    last_seen = {g: int(np.flatnonzero(groups == g).max()) for g in set(groups.tolist())}
    by_recency = sorted(last_seen, key=last_seen.__getitem__, reverse=True)
    held = set(groups[split.holdout].tolist())
    assert held == set(by_recency[: len(held)])  # the most recently seen queries, whole
    for fitted, block in fold_blocks(len(groups), 5, groups):
        assert _shared(fitted, block, groups) == set()
    predicted = np.concatenate([b for _, b in fold_blocks(len(groups), 5, groups)])
    assert sorted(predicted.tolist()) == list(range(len(groups)))


def test_without_groups_recurring_queries_leak_across_the_split() -> None:
    """The planted leak: the same traffic split by time alone shares queries between the sides,
    so the check above can fail."""
    groups = _recurring()
    split = time_split(len(groups), 0.3)
    assert _shared(split.train, split.holdout, groups) != set()
    assert any(_shared(a, b, groups) for a, b in fold_blocks(len(groups), 5))


def test_thresholds_are_tested_over_queries_when_queries_recur(tmp_path: Path) -> None:
    """A recurring query's outcomes are not independent trials: Learn-then-Test then counts
    queries (each its mean outcome), not outcomes, and says so; distinct queries keep the test
    over outcomes."""
    from datetime import timedelta

    from _learn_traffic import START

    from capgate import Decision, Estimate

    rng = np.random.default_rng(5)
    n_queries, rounds = 60, 8
    mu = rng.uniform(0.0, 1.0, n_queries)
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        i = 0
        for _ in range(rounds):
            for q in rng.permutation(n_queries):
                estimate = Estimate(p=float(mu[q]), method="verbalized")
                d = Decision(action="answer", estimate=estimate, reason="test", target="m",
                             created_at=START + timedelta(minutes=i))  # fmt: skip
                log.record(d, query=f"question {q}")
                log.record_outcome(d.id, correct=bool(rng.random() < mu[q]))
                i += 1
        result = calibrate(log, out=tmp_path / "cal", risk=0.2, delta=0.1, probe=False)
    said = [n for n in result.notes if "distinct queries" in n]
    assert said
    assert f"over {n_queries} distinct queries" in said[0]
    assert f"not the {n_queries * rounds} outcomes" in said[0]
    with DecisionLog(tmp_path / "distinct.sqlite3") as log:
        p, y = _noise(200, seed=4)
        log_traffic(log, p, y)
        plain = calibrate(log, out=tmp_path / "plain", risk=0.4, delta=0.1, probe=False)
    assert not [n for n in plain.notes if "distinct queries" in n]


def test_interleaved_recurring_queries_still_make_folds() -> None:
    """Every query seen in the first block used to put all rows in that block: no fold, no
    prediction. Whole queries are spread over the blocks instead."""
    for n_queries in (5, 12):
        groups = np.array([f"q{i % n_queries}" for i in range(100)])
        folds = fold_blocks(100, 5, groups)
        assert len(folds) == 5
        assert sorted(np.concatenate([b for _, b in folds]).tolist()) == list(range(100))
        for fitted, block in folds:
            assert _shared(fitted, block, groups) == set()
        cf = cross_fit(lambda tr, te: np.zeros(len(te)), 100, groups=groups)
        assert not np.isnan(cf.predictions).any()
    assert fold_blocks(10, 5, ["q"] * 10) == []  # one query: nothing to cross-fit on


def _log_recurring(
    log: DecisionLog, estimates: list[tuple[str, float | None, bool]], start_minute: int = 0
) -> None:
    """Record ``(query, estimate or None: degraded, outcome)`` decisions, a minute apart."""
    from datetime import timedelta

    from _learn_traffic import START

    from capgate import Decision, Estimate

    for i, (query, p, correct) in enumerate(estimates):
        estimate = (
            Estimate(p=p, method="verbalized")
            if p is not None
            else Estimate(p=None, method="verbalized", degraded=True, reason="test")
        )
        d = Decision(action="answer", estimate=estimate, reason="test", target="m",
                     created_at=START + timedelta(minutes=start_minute + i))  # fmt: skip
        log.record(d, query=query)
        log.record_outcome(d.id, correct=correct)


def _overconfident_rounds(
    n_queries: int, rounds: int, seed: int, degraded: int = 0
) -> list[tuple[str, float | None, bool]]:
    """Recurring queries in random order each round, estimated overconfidently (p**0.3); the
    first ``degraded`` queries have no estimate."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.0, 1.0, n_queries)
    est = mu**0.3
    return [
        (f"question {q}", None if q < degraded else float(est[q]), bool(rng.random() < mu[q]))
        for _ in range(rounds)
        for q in rng.permutation(n_queries)
    ]


def test_recurring_queries_are_cross_fitted_for_the_veto_and_the_thresholds(tmp_path: Path) -> None:
    """Each candidate map gets a cross-fitted Brier (its veto runs), and Learn-then-Test tests
    the older queries too, not only the held-out ones."""
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        _log_recurring(log, _overconfident_rounds(60, 8, seed=5))
        result = calibrate(log, out=tmp_path / "cal", risk=0.2, delta=0.1, probe=False)
    assert all(row.crossfit_brier is not None for row in result.table)
    assert result.summary["thresholds"]["n"] == 60
    said = [n for n in result.notes if "distinct queries" in n]
    assert "over 60 distinct queries" in said[0]
    assert "not the 480 outcomes:" in said[0]


def test_the_threshold_note_counts_only_the_outcomes_tested(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        _log_recurring(log, _overconfident_rounds(60, 8, seed=5, degraded=6))
        result = calibrate(log, out=tmp_path / "cal", risk=0.2, delta=0.1, probe=False)
    said = next(n for n in result.notes if "distinct queries" in n)
    assert "over 54 distinct queries" in said
    assert "not the 432 outcomes (48 of the 480 had no confidence and were left out)" in said


def test_a_map_whose_cross_fitting_made_no_predictions_does_not_ship(tmp_path: Path) -> None:
    """The older part is one recurring query: no fold, so no cross-fitted Brier. The veto then
    fails (short of both checks, the previous estimator stays) and a note says why."""
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 300)
    y = rng.random(300) < p**4
    rows = [
        ("the same question" if i < 210 else f"question {i}", float(p[i]), bool(y[i])) for i in range(300)
    ]
    with DecisionLog(tmp_path / "log.sqlite3") as log:
        _log_recurring(log, rows)
        result = calibrate(log, out=tmp_path / "cal", probe=False)
    assert result.summary["n_holdout"] == 90
    best = min(result.table[1:], key=lambda r: r.brier)
    assert best.diff_high < 0  # it won the held-out test alone,
    assert best.crossfit_brier is None  # with no cross-fitted check
    assert result.kind == "identity"
    assert any("cross-fitting made no predictions" in n for n in result.notes)
