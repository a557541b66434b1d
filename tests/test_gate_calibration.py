"""A gate under a calibration learnt from its own log (issue 26 §2-3, the gate's side): ``calibration``
swaps in the calibrated estimator and its thresholds and every decision records the version;
``"promoted"`` follows the log's promote/rollback events; ``shadow_calibration`` logs a candidate's
decision beside each enforced one, never delaying or failing the call."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capgate import Decision, Estimate, Gate, SettingsError
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.errors import DataError
from capgate.estimators import CapabilityEstimator, query_text
from capgate.learn import Calibration, calibrate

WAIT_S = 30.0
TARGET = "tests/target-model"


class Marked(CapabilityEstimator):
    """p read from a ``p=0.37`` marker in the query (an overconfident estimator: truth is p³).

    ``hold`` makes it wait for the test's release; ``fail`` makes it raise.
    """

    method = "marked"

    def __init__(self, *, hold: bool = False, fail: bool = False) -> None:
        self.hold = hold
        self.fail = fail
        self.release = threading.Event()
        self.calls = 0

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        self.calls += 1
        if self.hold:
            assert self.release.wait(WAIT_S)
        if self.fail:
            raise RuntimeError("the estimator exploded")
        out = []
        for q in queries:
            found = re.search(r"p=([0-9.]+)", query_text(q))
            out.append(Estimate(p=float(found.group(1)) if found else 0.5, method=self.method))
        return out


def _learn(folder: Path, name: str, *, seed: int, risk: float | None = None) -> Calibration:
    """A calibration learnt by capgate.learn from a log of overconfident ``marked`` estimates."""
    rng = np.random.default_rng(seed)
    with DecisionLog(folder / f"{name}.sqlite3") as log:
        for p in rng.uniform(0.05, 0.95, 300):
            estimate = Estimate(p=float(p), method="marked")
            d = Decision(action="answer", estimate=estimate, reason="t", target=TARGET, policy="balanced")
            log.record(d)
            log.record_outcome(d.id, correct=bool(rng.random() < p**3))
        result = calibrate(log, out=folder / name, risk=risk)
    assert result.kind in ("isotonic", "platt")  # the map beats the overconfident estimates
    return result.calibration


@pytest.fixture(scope="module")
def calibrations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Calibration]:
    folder = tmp_path_factory.mktemp("calibrations")
    found = {
        "plain": _learn(folder, "plain", seed=0),
        "other": _learn(folder, "other", seed=1),
        "thresholds": _learn(folder, "thresholds", seed=2, risk=0.6),
    }
    assert found["thresholds"].policy is not None
    assert found["plain"].policy is None
    assert len({c.version for c in found.values()}) == 3
    return found


def _by_id(log: DecisionLog) -> dict[str, Any]:
    return {logged.decision.id: logged.decision for logged in log.decisions()}


# --------------------------------------------------------------------------- calibration


def test_a_calibrated_gate_decides_on_the_calibrated_estimate_and_records_the_version(
    tmp_path: Path, calibrations: dict[str, Calibration]
) -> None:
    cal = calibrations["plain"]
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=Marked(), target=TARGET, calibration=cal.path, log=log)
    verdict = gate.assess("what is the answer? p=0.60")
    estimate = verdict.decision.estimate
    assert estimate.details["raw_p"] == pytest.approx(0.60)
    expected = Calibration.load(cal.path).apply(Marked()).estimate(["p=0.60"])[0].p
    assert estimate.p == pytest.approx(expected)
    assert estimate.p < 0.5  # the map learnt that 0.6 means about 0.6³
    assert verdict.decision.calibration == cal.version
    assert verdict.decision.target == TARGET
    gate.record(verdict)
    assert _by_id(log)[verdict.decision.id].calibration == cal.version
    # the estimator is built once, so a batch still groups by it
    assert gate.resolve_estimator() is gate.resolve_estimator()


def test_an_uncalibrated_gate_records_no_version_and_keeps_the_estimators_target(tmp_path: Path) -> None:
    gate = Gate(estimator=Marked(), target=TARGET)
    verdict = gate.assess("p=0.60")
    assert verdict.decision.calibration is None
    assert verdict.decision.estimate.p == pytest.approx(0.60)


def test_a_calibration_with_thresholds_brings_its_policy_and_refuses_another(
    tmp_path: Path, calibrations: dict[str, Calibration], caplog: pytest.LogCaptureFixture
) -> None:
    cal = calibrations["thresholds"]
    loaded = Calibration.load(cal.path)
    assert loaded.policy is not None
    gate = Gate(estimator=Marked(), target=TARGET, calibration=loaded)
    assert gate.resolve_policy() == loaded.policy
    assert loaded.policy.name != "conservative"
    with pytest.raises(SettingsError, match=rf"calibration {cal.version} carries thresholds for policy"):
        Gate(estimator=Marked(), target=TARGET, calibration=loaded, policy="conservative")
    # the policy the thresholds were learnt for, named: the calibration's thresholds
    named = Gate(estimator=Marked(), target=TARGET, calibration=loaded, policy=loaded.policy)
    assert named.resolve_policy() == loaded.policy
    # a folder (or "promoted") is read on first use: a live call never raises for it; the gate
    # keeps the policy it names, says so, and still decides under the calibration's estimator
    folder_gate = Gate(estimator=Marked(), target=TARGET, calibration=cal.path, policy="conservative")
    with caplog.at_level(logging.WARNING, logger="capgate"):
        decided = folder_gate.assess("p=0.5").decision
    assert (decided.policy, decided.calibration) == ("conservative", cal.version)
    assert "keeps 'conservative'" in caplog.text
    # without thresholds, the gate's own policy stays
    plain = Gate(
        estimator=Marked(), target=TARGET, calibration=calibrations["plain"].path, policy="conservative"
    )
    assert plain.resolve_policy().name == "conservative"


def test_a_calibration_for_another_target_or_method_is_refused_by_name(
    calibrations: dict[str, Calibration],
) -> None:
    cal = calibrations["plain"]
    gate = Gate(estimator=Marked(), target="another/model", calibration=cal.path)
    with pytest.raises(
        SettingsError, match=rf"{cal.version} was learned for target '{TARGET}'.*another/model"
    ):
        gate.assess("p=0.5")

    class Other(Marked):
        method = "other"

    with pytest.raises(DataError, match="maps 'marked' estimates"):
        Gate(estimator=Other(), target=TARGET, calibration=cal.path).assess("p=0.5")
    with pytest.raises(DataError, match=r"no calibration\.json"):
        Gate(estimator=Marked(), target=TARGET, calibration=cal.path.parent / "missing").assess("p=0.5")


def test_settings_check_the_calibration_keywords_and_what_they_need() -> None:
    with pytest.raises(
        SettingsError, match="`calibration`='promoted' reads the version from the decision log"
    ):
        Gate(estimator=Marked(), calibration="promoted")
    with pytest.raises(SettingsError, match="`shadow_calibration`='candidate' reads the version"):
        Gate(estimator=Marked(), shadow_calibration="candidate")
    with pytest.raises(SettingsError, match="`shadow_calibration`='some/dir' logs its candidate decisions"):
        Gate(estimator=Marked(), shadow_calibration="some/dir")
    with pytest.raises(SettingsError, match="`calibration` takes 'promoted'"):
        Gate(estimator=Marked(), calibration="candidate", log=":memory:")
    with pytest.raises(SettingsError, match="`calibration` must be a calibration folder"):
        Gate(estimator=Marked(), calibration=3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- promote and rollback


def test_promoted_follows_the_logs_promote_and_rollback_events(
    tmp_path: Path, calibrations: dict[str, Calibration]
) -> None:
    first, second = calibrations["plain"], calibrations["other"]
    path = tmp_path / "log.sqlite3"
    log = DecisionLog(path)

    def version() -> str | None:  # a new gate reads the log's version when it first decides
        verdict = Gate(estimator=Marked(), target=TARGET, calibration="promoted", log=path).assess("p=0.6")
        return verdict.decision.calibration

    assert version() is None  # nothing promoted: uncalibrated
    log.record_calibration_event("promote", first.version, str(first.path), target=TARGET)
    assert version() == first.version
    log.record_calibration_event(
        "promote", second.version, str(second.path), target=TARGET, previous=first.version
    )
    assert version() == second.version
    log.record_calibration_event(
        "rollback", first.version, str(first.path), target=TARGET, previous=second.version
    )
    assert version() == first.version
    # promotions of another target are not this gate's
    log.record_calibration_event("promote", second.version, str(second.path), target="another/model")
    assert version() == first.version


def test_promoted_refuses_an_event_whose_folder_holds_another_version(
    tmp_path: Path, calibrations: dict[str, Calibration]
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    log.record_calibration_event(
        "promote", "cal-000000000000", str(calibrations["plain"].path), target=TARGET
    )
    gate = Gate(estimator=Marked(), target=TARGET, calibration="promoted", log=log)
    with pytest.raises(SettingsError, match=r"cal-000000000000 as the promoted calibration.*holds"):
        gate.assess("p=0.5")


# --------------------------------------------------------------------------- candidate in shadow


def test_a_candidate_decides_beside_each_logged_decision_on_the_same_query(
    log_location: str | Path, calibrations: dict[str, Calibration]
) -> None:
    """On both stores."""
    enforced, candidate = calibrations["plain"], calibrations["other"]
    log = DecisionLog(log_location, store_text=True)
    gate = Gate(
        estimator=Marked(),
        target=TARGET,
        log=log,
        calibration=enforced.path,
        shadow_calibration=candidate.path,
    )
    queries = [f"question {i} p=0.{i}5" for i in range(1, 9)]
    verdicts = [gate.assess(q) for q in queries]
    for verdict in verdicts:
        gate.record(verdict)
    assert gate.flush(WAIT_S)
    logged = _by_id(log)
    assert len(logged) == 2 * len(verdicts)
    applied = Calibration.load(candidate.path).apply(Marked())
    for query, verdict in zip(queries, verdicts, strict=True):
        mine = logged[verdict.decision.id]
        assert mine.calibration == enforced.version
        assert not mine.shadow
        (beside,) = [d for d in logged.values() if d.beside == mine.id]
        assert beside.shadow
        assert beside.calibration == candidate.version
        assert beside.target == TARGET
        assert beside.id != mine.id
        assert beside.estimate.p == pytest.approx(applied.estimate([query])[0].p)
    assert gate.stats.candidate_decisions == len(verdicts)
    assert gate.stats.candidate_failures == 0
    assert gate.stats.calls == len(verdicts)  # the candidate's decisions are not the gate's calls
    assert sum(gate.stats.shadow_actions.values()) == 0


def test_a_candidate_never_delays_the_call_and_a_raising_one_is_logged_degraded(
    tmp_path: Path, calibrations: dict[str, Calibration]
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    held = Marked(hold=True)  # the candidate decides over the gate's own estimator: held there only
    gate = Gate(estimator=held, target=TARGET, log=log, shadow_calibration=calibrations["plain"].path)
    held.release.set()  # the enforced estimate itself must not wait...
    verdict = gate.assess("p=0.9")
    held.release.clear()  # ...but the candidate's, made beside the call, does
    gate.record(verdict)  # returns while the candidate's estimate is held
    assert verdict.action == "answer"
    assert not gate.flush(0.2)
    held.release.set()
    assert gate.flush(WAIT_S)
    assert any(d.beside == verdict.decision.id for d in _by_id(log).values())

    failing = Gate(
        estimator=Marked(fail=True),
        target=TARGET,
        log=log,
        shadow_calibration=calibrations["plain"].path,
        mode="shadow",  # the gate's own decision beside the call too: it fails, degraded
    )
    stand_in = failing.assess("p=0.9")
    failing.record(stand_in)
    assert failing.flush(WAIT_S)
    (candidate,) = [d for d in _by_id(log).values() if d.beside == stand_in.decision.id]
    assert candidate.degraded
    assert "RuntimeError" in candidate.estimate.reason
    assert candidate.calibration == calibrations["plain"].version


def test_candidate_follows_the_logs_shadow_event_and_none_means_no_candidate(
    tmp_path: Path, calibrations: dict[str, Calibration]
) -> None:
    cal = calibrations["other"]
    path = tmp_path / "log.sqlite3"
    log = DecisionLog(path)
    gate = Gate(estimator=Marked(), target=TARGET, log=path, shadow_calibration="candidate")
    gate.record(gate.assess("p=0.4"))
    assert gate.flush(WAIT_S)
    assert all(d.beside is None for d in _by_id(log).values())  # none in shadow
    log.record_calibration_event("shadow", cal.version, str(cal.path), target=TARGET)
    gate = Gate(estimator=Marked(), target=TARGET, log=path, shadow_calibration="candidate")
    verdict = gate.assess("p=0.4")
    gate.record(verdict)
    assert gate.flush(WAIT_S)
    (beside,) = [d for d in _by_id(log).values() if d.beside == verdict.decision.id]
    assert beside.calibration == cal.version


def test_a_candidate_that_cannot_load_is_counted_and_never_fails_the_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=Marked(), target=TARGET, log=log, shadow_calibration=tmp_path / "nowhere")
    with caplog.at_level(logging.WARNING, logger="capgate"):
        verdict = gate.assess("a secret question p=0.9")
        gate.record(verdict)
        assert gate.flush(WAIT_S)
    assert list(_by_id(log)) == [verdict.decision.id]
    assert gate.stats.candidate_failures == 1
    assert "DataError" in (gate.stats.last_beside_error or "")
    assert "secret" not in caplog.text
    assert verdict.decision.id in caplog.text
