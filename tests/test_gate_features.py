"""Features kept for learning (issue 26 §1, the gate's side): a probe's features ride along with its
estimates, and a gate with ``log_features`` writes each logged decision's reader features to its log
(a non-probe estimator's are computed beside the call, never delaying or failing it)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from _estimators import KeywordEstimator
from _probe_helpers import CharCountFeaturizer, linear_capability, random_queries, sampled_mu_hat

from capgate import Decision, Estimate, Gate, SettingsError, guard
from capgate.core.backend import Prompt
from capgate.decision import DecisionLog
from capgate.estimators import LinearProbe, ProbeEstimator


def _fitted_probe(featurizer: CharCountFeaturizer | None = None) -> ProbeEstimator:
    featurizer = featurizer or CharCountFeaturizer(dim=8, seed=3)
    queries = random_queries(120, seed=1)
    mu = linear_capability(featurizer.transform(queries), seed=2)
    probe = ProbeEstimator(featurizer, LinearProbe(lr=0.05, validation_fraction=None, max_epochs=30))
    return probe.fit(queries, sampled_mu_hat(mu, k=8, seed=4))


# --------------------------------------------------------------------------- the side channel


def test_a_probe_estimate_carries_the_features_it_was_made_from_and_they_are_never_serialized() -> None:
    featurizer = CharCountFeaturizer(dim=8, seed=3)
    probe = _fitted_probe(featurizer)
    queries = ["how many legs has a spider?", "prove that there are infinitely many primes"]
    estimates = probe.estimate(queries)
    expected = featurizer.transform(queries)
    for estimate, row in zip(estimates, expected, strict=True):
        carried = estimate.features()
        assert carried is not None
        assert carried.vector.dtype == np.float32
        np.testing.assert_array_equal(carried.vector, row)
        assert carried.spec == featurizer.spec  # the featurizer's spec, as a dict
        dumped = estimate.model_dump_json()
        assert "features" not in dumped
        assert str(float(row[0]))[:6] not in dumped
        # equality is about the estimate, not what rides along with it
        assert estimate == Estimate.model_validate_json(dumped)
    # each estimate owns its row (a copy), not a view that keeps the batch alive
    assert estimates[0].features().vector.base is None  # type: ignore[union-attr]


def test_a_copied_estimate_keeps_its_features_and_a_plain_one_has_none() -> None:
    estimate = Estimate(p=0.4, method="probe").with_features([0.5, -1.0], {"model_id": "m", "dim": 2})
    moved = estimate.model_copy(update={"p": 0.6, "method": "probe+isotonic"})  # as Recalibrated does
    assert moved.features() is not None
    assert moved.features().vector.tolist() == [0.5, -1.0]  # type: ignore[union-attr]
    assert Estimate(p=0.4, method="verbalized").features() is None


def test_a_degraded_probe_estimate_carries_no_features() -> None:
    class Broken(CharCountFeaturizer):
        def transform(self, queries):  # type: ignore[no-untyped-def]
            out = super().transform(queries)
            out[:] = np.nan
            return out

    probe = _fitted_probe()
    probe.featurizer = Broken(dim=8, seed=3)
    (estimate,) = probe.estimate(["what is 2 + 2?"])
    assert estimate.degraded
    assert estimate.features() is None


# --------------------------------------------------------------------------- decision fields


def test_a_decision_records_its_calibration_version_and_what_it_was_made_beside() -> None:
    estimate = Estimate(p=0.3, method="probe")
    plain = Decision(action="abstain", estimate=estimate, reason="low")
    assert plain.calibration is None
    assert plain.beside is None
    candidate = Decision(
        action="answer",
        estimate=estimate,
        reason="ok",
        shadow=True,
        calibration="cal-0123456789ab",
        beside=plain.id,
    )
    data = json.loads(candidate.model_dump_json())
    assert data["calibration"] == "cal-0123456789ab"
    assert data["beside"] == plain.id
    assert Decision.model_validate(data) == candidate
    # a decision stored before these fields existed still loads
    old = json.loads(plain.model_dump_json())
    del old["calibration"], old["beside"]
    assert Decision.model_validate(old).calibration is None


# --------------------------------------------------------------------------- the gate's log_features


WAIT_S = 30.0


class HeldReader(CharCountFeaturizer):
    """A feature reader that waits for the test's release (or raises, or returns NaN)."""

    def __init__(self, *, hold: bool = False, fail: str | None = None) -> None:
        super().__init__(dim=8, seed=5)
        self.fail = fail
        self.release = threading.Event()
        self.started = threading.Event()
        if not hold:
            self.release.set()

    def transform(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float32]:
        self.started.set()
        assert self.release.wait(WAIT_S)
        if self.fail == "raise":
            raise RuntimeError(f"reader exploded on {queries[0]}")  # the text must not reach the log
        out = super().transform(queries)
        if self.fail == "nan":
            out[:] = np.nan
        return out


def _features(log: DecisionLog, decision_id: str) -> Any:
    return log.features([decision_id]).get(decision_id)


def test_a_probe_gate_logs_the_features_its_estimate_was_made_from_without_a_second_pass(
    log_location: str | Path,
) -> None:
    """On both stores."""
    featurizer = CharCountFeaturizer(dim=8, seed=3)
    probe = _fitted_probe(featurizer)
    log = DecisionLog(log_location)
    gate = Gate(estimator=probe, log=log, log_features=True)
    query = "how many moons has mars?"
    featurizer.calls.clear()
    verdict = gate.assess(query)
    gate.record(verdict)
    assert gate.flush(WAIT_S)
    assert featurizer.calls == [1]  # the estimate's one pass: the log got its features
    logged = _features(log, verdict.decision.id)
    assert logged is not None
    np.testing.assert_allclose(logged.vector, featurizer.transform([query])[0], rtol=2e-3, atol=1e-3)
    assert logged.spec == featurizer.spec
    assert gate.stats.features_logged == 1
    assert gate.stats.feature_failures == 0


def test_without_log_features_nothing_is_logged_and_no_reader_runs(tmp_path: Path) -> None:
    reader = HeldReader()
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=KeywordEstimator({}), log=log, feature_reader=reader)
    verdict = gate.assess("what is 2 + 2?")
    gate.record(verdict)
    assert gate.flush(WAIT_S)
    assert _features(log, verdict.decision.id) is None
    assert not reader.started.is_set()


def test_a_non_probe_gate_reads_features_beside_the_call_which_never_waits(tmp_path: Path) -> None:
    reader = HeldReader(hold=True)
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=KeywordEstimator({}), log=log, log_features=True, feature_reader=reader)

    @guard(gate=gate)
    def answer(question: str) -> str:
        return "42"

    assert answer("what is six times seven?") == "42"  # returned while the reader is held
    assert reader.started.wait(WAIT_S)
    assert not gate.flush(0.2)
    reader.release.set()
    assert gate.flush(WAIT_S)
    (logged,) = log.decisions()
    features = _features(log, logged.decision.id)
    assert features is not None
    np.testing.assert_allclose(
        features.vector, reader.transform(["what is six times seven?"])[0], rtol=2e-3, atol=1e-3
    )
    assert features.spec == reader.spec
    assert gate.stats.features_logged == 1


@pytest.mark.parametrize("fail", ["raise", "nan"])
def test_a_failing_reader_is_counted_and_never_fails_the_call_nor_leaks_the_text(
    tmp_path: Path, fail: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(
        estimator=KeywordEstimator({}), log=log, log_features=True, feature_reader=HeldReader(fail=fail)
    )
    with caplog.at_level(logging.WARNING, logger="capgate"):
        verdict = gate.assess("my secret passphrase is swordfish")
        gate.record(verdict)
        assert gate.flush(WAIT_S)
    assert verdict.action == "answer"
    assert [d.decision.id for d in log.decisions()] == [verdict.decision.id]
    assert _features(log, verdict.decision.id) is None
    assert gate.stats.feature_failures == 1
    assert gate.stats.features_logged == 0
    assert verdict.decision.id in caplog.text
    for where in (caplog.text, gate.stats.last_beside_error or ""):
        assert "swordfish" not in where


def test_another_reader_than_the_probes_is_read_beside_the_call(tmp_path: Path) -> None:
    probe = _fitted_probe()
    reader = HeldReader()
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=probe, log=log, log_features=True, feature_reader=reader)
    verdict = gate.assess("name a prime above 100")
    gate.record(verdict)
    assert gate.flush(WAIT_S)
    logged = _features(log, verdict.decision.id)
    assert logged is not None
    assert logged.spec == reader.spec  # the reader asked for, not the probe's
    assert reader.started.is_set()


def test_without_a_reader_a_non_probe_gate_uses_the_embedded_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import capgate.gate._features as features_module

    embedded = HeldReader()
    monkeypatch.setattr(features_module, "default_reader", lambda: embedded)
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=KeywordEstimator({}), log=log, log_features=True)
    verdict = gate.assess("what is the capital of peru?")
    gate.record(verdict)
    assert gate.flush(WAIT_S)
    logged = _features(log, verdict.decision.id)
    assert logged is not None
    assert logged.spec == embedded.spec


def test_in_shadow_mode_and_async_the_features_are_keyed_by_the_logged_decision(tmp_path: Path) -> None:
    featurizer = CharCountFeaturizer(dim=8, seed=3)
    probe = _fitted_probe(featurizer)
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=probe, log=log, log_features=True, mode="shadow")

    @guard(gate=gate)
    async def answer(question: str) -> str:
        return "ok"

    async def main() -> None:
        assert await answer("is the sky blue?") == "ok"
        await gate.aflush()

    asyncio.run(main())
    (logged,) = log.decisions()
    assert logged.decision.shadow
    assert _features(log, logged.decision.id) is not None
    assert gate.stats.features_logged == 1


def test_log_features_settings_are_checked() -> None:
    with pytest.raises(
        SettingsError, match="`log_features` writes each decision's features to the decision log"
    ):
        Gate(estimator=KeywordEstimator({}), log_features=True)
    with pytest.raises(SettingsError, match="`feature_reader` must be a featurizer"):
        Gate(estimator=KeywordEstimator({}), feature_reader="smollm2")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="`log_features` must be True or False"):
        Gate(estimator=KeywordEstimator({}), log=":memory:", log_features="yes")  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_embedded_models_features_are_logged_for_a_non_probe_gate(tmp_path: Path) -> None:
    """The real default reader: the embedded model's features under the default probe's spec."""
    from capgate import load_estimator
    from capgate.estimators.feature_store import spec_as_dict

    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=KeywordEstimator({}), log=log, log_features=True)
    queries = ["What is 7 times 8?", "Prove that the square root of 2 is irrational."]
    verdicts = [gate.assess(q) for q in queries]
    for verdict in verdicts:
        gate.record(verdict)
    assert gate.flush(600)
    assert gate.stats.feature_failures == 0, gate.stats.last_beside_error
    default = load_estimator()
    # one query at a time, as the gate reads them: a batch of two pads the shorter query, and
    # where the process chose the bfloat16 fast path (timed, so load-dependent) the padded pass
    # differs from the single one by more than the tolerance (seen: 0.27 under load)
    expected = [default.featurizer.transform([q])[0] for q in queries]
    for verdict, row in zip(verdicts, expected, strict=True):
        logged = _features(log, verdict.decision.id)
        assert logged is not None
        assert logged.spec == spec_as_dict(default.featurizer.spec)
        assert logged.vector.shape == row.shape
        np.testing.assert_allclose(logged.vector, row, rtol=1e-2, atol=1e-2)


def test_a_recalibrated_probe_still_logs_its_own_features_without_a_second_pass(tmp_path: Path) -> None:
    from capgate.estimators import IsotonicCalibrator, Recalibrated

    featurizer = CharCountFeaturizer(dim=8, seed=3)
    probe = _fitted_probe(featurizer)
    queries = random_queries(60, seed=9)
    calibrated = Recalibrated(probe, IsotonicCalibrator()).fit(queries, np.linspace(0, 1, 60))
    log = DecisionLog(tmp_path / "log.sqlite3")
    gate = Gate(estimator=calibrated, log=log, log_features=True)
    featurizer.calls.clear()
    verdict = gate.assess("which planet is largest?")
    gate.record(verdict)
    assert gate.flush(WAIT_S)
    assert featurizer.calls == [1]
    assert verdict.decision.estimate.method == "probe+isotonic"
    assert _features(log, verdict.decision.id) is not None
