"""Reader features and calibration versions in the decision log (schema 4), on both stores:
features round-trip as float16 under their spec's hash, unknown decisions are skipped, bad vectors
are refused without quoting a value, and each decision keeps its calibration version and the
decision a candidate's shadow decision was made beside."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
from _postgres import execute, fetch

from capgate import DataError, Estimate
from capgate.decision import Decision, DecisionLog, LoggedFeatures
from capgate.decision.store.features import spec_json, spec_sha256

SPEC = {"model_id": "tiny", "weights_fingerprint": "sha256:0", "layers": "all", "pooling": "last", "dim": 64}


def make(**kw: object) -> Decision:
    return Decision(action="answer", estimate=Estimate(p=0.7, method="probe"), reason="test", **kw)


def test_features_round_trip_as_float16_with_their_spec(log_location: str | Path) -> None:
    rng = np.random.default_rng(0)
    decisions = [make() for _ in range(5)]
    vectors = {d.id: rng.normal(0, 3, 64) for d in decisions}
    with DecisionLog(log_location) as log:
        for d in decisions:
            log.record(d)
        written = log.record_features(
            [(i, v) for i, v in vectors.items()] + [("nope", vectors[decisions[0].id])], SPEC
        )
        assert written == 5  # the unknown decision is skipped
        got = log.features([*vectors, "nope", decisions[0].id])
        assert log.features_count() == 5
        assert log.features_count(spec_sha256=spec_sha256(SPEC)) == 5
        assert log.features_count(spec_sha256="0" * 64) == 0
    assert set(got) == set(vectors)
    for decision_id, vector in vectors.items():
        f = got[decision_id]
        assert isinstance(f, LoggedFeatures)
        assert f.spec == SPEC
        assert f.spec_sha256 == spec_sha256(SPEC)
        assert f.vector.dtype == np.float32
        assert f.vector.shape == (64,)
        np.testing.assert_allclose(f.vector, vector, rtol=1e-3, atol=1e-3)  # float16: ~3 digits
        assert np.array_equal(f.vector, vector.astype(np.float16).astype(np.float32))
    # stored compactly: 2 bytes per dimension, the spec once
    rows = fetch(log_location, "SELECT encoding, dim, data FROM features")
    assert {(r[0], r[1], len(bytes(r[2]))) for r in rows} == {("float16", 64, 128)}
    assert fetch(log_location, "SELECT spec_sha256, spec_json FROM feature_specs") == [
        (spec_sha256(SPEC), spec_json(SPEC))
    ]


def test_features_are_written_once_and_a_second_record_keeps_the_first(log_location: str | Path) -> None:
    d = make()
    with DecisionLog(log_location) as log:
        log.record(d)
        assert log.record_features([(d.id, [1.0, 2.0, 3.0])], SPEC) == 1
        assert log.record_features([(d.id, [9.0, 9.0, 9.0])], {**SPEC, "dim": 3}) == 0
        assert log.record_features([], SPEC) == 0
        assert log.features([d.id])[d.id].vector.tolist() == [1.0, 2.0, 3.0]
        assert log.features([]) == {}


def test_many_ids_are_read_in_chunks(log_location: str | Path) -> None:
    decisions = [make() for _ in range(1_100)]
    with DecisionLog(log_location) as log:
        for d in decisions:
            log.record(d)
        rows = [(d.id, np.full(4, i % 7, dtype=np.float32)) for i, d in enumerate(decisions)]
        assert log.record_features(rows, SPEC) == 1_100
        got = log.features([d.id for d in decisions])
    assert len(got) == 1_100
    assert all(got[d.id].vector[0] == i % 7 for i, d in enumerate(decisions))


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (np.array([4242.5, np.nan, 1.0]), "1 of 3 values are not finite"),
        (np.array([4242.5, 1e6, -1e6]), "2 of 3 values are not finite"),  # beyond float16
        (np.array([[4242.5, 1.0]]), "shape (1, 2)"),
        (np.array([]), "shape (0,)"),
    ],
)
def test_bad_vectors_are_refused_naming_the_decision_never_a_value(
    log_location: str | Path, bad: np.ndarray, what: str
) -> None:
    good, wrong = make(), make()
    with DecisionLog(log_location) as log:
        log.record(good)
        log.record(wrong)
        with pytest.raises(ValueError, match="features for decision") as info:
            log.record_features([(good.id, [1.0, 2.0]), (wrong.id, bad)], SPEC)
        assert log.features([good.id, wrong.id]) == {}  # nothing written: one transaction
    message = str(info.value)
    assert wrong.id in message
    assert what in message
    message = message.replace(wrong.id, "<id>")  # a random id may hold "4242" itself (seen once in CI)
    assert "4242" not in message
    assert "1000000" not in message
    assert "e+06" not in message


def test_a_corrupted_vector_is_a_data_error_naming_the_decision(log_location: str | Path) -> None:
    d = make()
    with DecisionLog(log_location) as log:
        log.record(d)
        log.record_features([(d.id, [4242.5, 1.0, 2.0])], SPEC)
        assert log.integrity_check() == "ok"
        execute(log_location, "UPDATE features SET dim = 5")
        assert log.integrity_check() == "1 feature vectors of an unknown encoding or the wrong size"
        with pytest.raises(DataError, match=f"features for decision {d.id}: 6 bytes for dim 5") as info:
            log.features([d.id])
        assert "4242" not in str(info.value)
        execute(log_location, "UPDATE features SET dim = 3, encoding = 'pca8'")
        with pytest.raises(DataError, match="unknown encoding 'pca8'"):
            log.features([d.id])


def test_a_feature_spec_model_is_stored_as_its_json() -> None:
    from capgate.local.hidden_states import FeatureSpec

    spec = FeatureSpec(model_id="m", weights_fingerprint="sha256:0", dim=8)
    assert spec_sha256(spec) == spec_sha256(spec.model_dump(mode="json"))
    with pytest.raises(TypeError, match="must be a mapping"):
        spec_json(["not", "a", "mapping"])
    with pytest.raises(TypeError, match="plain JSON"):
        spec_json({"dim": float("nan")})


def test_the_sqlite_file_holding_features_is_user_only(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "decisions.sqlite3"
    d = make()
    with DecisionLog(path) as log:
        log.record(d)
        log.record_features([(d.id, [0.25] * 16)], SPEC)
        files = [p for p in path.parent.iterdir() if p.name.startswith(path.name)]
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}  # while open: -wal, -shm too
    assert path.name in modes
    if os.name == "posix":
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert {name: mode & 0o077 for name, mode in modes.items()} == dict.fromkeys(modes, 0)


def test_each_decision_keeps_its_calibration_version_and_what_it_was_made_beside(
    log_location: str | Path,
) -> None:
    enforced = make(calibration="cal-0123456789ab")
    candidate = Decision(
        action="abstain",
        estimate=Estimate(p=0.2, method="probe"),
        reason="candidate",
        shadow=True,
        calibration="cal-ba9876543210",
        beside=enforced.id,
    )
    plain = make()
    with DecisionLog(log_location) as log:
        for d in (enforced, candidate, plain):
            log.record(d)
        got = {r.id: r for r in log.decisions()}
    assert (got[enforced.id].calibration, got[enforced.id].beside) == ("cal-0123456789ab", None)
    assert (got[candidate.id].calibration, got[candidate.id].beside) == ("cal-ba9876543210", enforced.id)
    assert (got[plain.id].calibration, got[plain.id].beside) == (None, None)
    assert got[candidate.id].decision == candidate
    assert sorted(fetch(log_location, "SELECT id, calibration, beside FROM decisions")) == sorted(
        [
            (enforced.id, "cal-0123456789ab", None),
            (candidate.id, "cal-ba9876543210", enforced.id),
            (plain.id, None, None),
        ]
    )
