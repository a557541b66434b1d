"""Precomputed features on disk: format, validation, and resumable featurization."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from _probe_helpers import CharCountFeaturizer, random_queries

from capgate import DataError, ProbeMismatchError
from capgate.core.backend import Prompt
from capgate.estimators.feature_store import featurize_to, load_features, save_features, spec_path

SPEC = {"model_id": "m", "weights_fingerprint": "f", "dim": 3}


def test_round_trip_without_pickle(tmp_path: Path) -> None:
    X = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    save_features(tmp_path / "f.npz", ["a", "b/c", "d é", "e"], X, SPEC)
    with np.load(tmp_path / "f.npz", allow_pickle=False) as raw:
        assert sorted(raw.files) == ["features", "ids"]
        assert raw["ids"].dtype.kind == "U"
    stored = load_features(tmp_path / "f.npz")
    assert stored.ids == ["a", "b/c", "d é", "e"]
    assert stored.features.tobytes() == X.tobytes()
    assert stored.spec == SPEC
    np.testing.assert_array_equal(stored.rows_for(["e", "a"]), X[[3, 0]])
    assert json.loads(spec_path(tmp_path / "f.npz").read_text())["spec"] == SPEC


def test_missing_ids_are_named(tmp_path: Path) -> None:
    save_features(tmp_path / "f.npz", ["a", "b"], np.zeros((2, 3)), SPEC)
    with pytest.raises(
        DataError, match=r"labels.jsonl: field 'id': 2 of 3 ids have no features in .*'x', 'y'"
    ):
        load_features(tmp_path / "f.npz").rows_for(["a", "x", "y"], source="labels.jsonl")


@pytest.mark.parametrize(
    ("ids", "X", "message"),
    [
        (["a", "a"], np.zeros((2, 3)), "duplicate id 'a'"),
        (["a", "b"], np.zeros((3, 3)), r"shape \(n_ids, dim\)"),
        (["a", "b"], np.array([[0, 0, 0], [0, np.nan, 0]]), "non-finite features for id 'b'"),
        (["a", "b"], np.zeros((2, 4)), "spec says dim=3 but features have 4 columns"),
    ],
)
def test_bad_arrays_are_refused(tmp_path: Path, ids: list[str], X: np.ndarray, message: str) -> None:
    with pytest.raises(DataError, match=message):
        save_features(tmp_path / "f.npz", ids, X, SPEC)


def test_corrupt_or_mismatched_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="feature file not found"):
        load_features(tmp_path / "none.npz")
    np.savez(tmp_path / "obj.npz", ids=np.array(["a"], dtype=object), features=np.zeros((1, 3)))
    with pytest.raises(DataError, match=r"cannot read as a feature \.npz"):
        load_features(tmp_path / "obj.npz")  # object arrays would need pickle
    np.savez(tmp_path / "keys.npz", x=np.zeros(2))
    with pytest.raises(DataError, match="expected arrays 'ids' and 'features'"):
        load_features(tmp_path / "keys.npz")
    save_features(tmp_path / "f.npz", ["a", "b"], np.zeros((2, 3)), SPEC)
    sidecar = spec_path(tmp_path / "f.npz")
    meta = json.loads(sidecar.read_text())
    meta["n"] = 5
    sidecar.write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"f.spec.json: field 'n': sidecar says 5 but f.npz has 2"):
        load_features(tmp_path / "f.npz")
    sidecar.unlink()
    with pytest.raises(DataError, match="not found"):
        load_features(tmp_path / "f.npz")


class CountingFeaturizer(CharCountFeaturizer):
    """Records every query it featurizes; raises KeyboardInterrupt on call number ``fail_on``."""

    def __init__(self, fail_on: int | None = None) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.fail_on = fail_on

    def transform(self, queries: Sequence[Prompt]) -> npt.NDArray[np.float32]:
        if self.fail_on is not None and len(self.calls) + 1 == self.fail_on:
            raise KeyboardInterrupt
        self.seen.extend(str(q) for q in queries)
        return super().transform(queries)


def test_featurize_to_matches_direct_transform(tmp_path: Path) -> None:
    queries = random_queries(23, 1)
    ids = [f"q{i}" for i in range(23)]
    stored = featurize_to(tmp_path / "f.npz", ids, queries, CharCountFeaturizer(), batch_size=5)
    np.testing.assert_array_equal(stored.features, CharCountFeaturizer().transform(queries))
    assert stored.ids == ids
    assert not (tmp_path / "f.npz.parts").exists()


def test_interrupted_featurization_resumes_without_redoing_work(tmp_path: Path) -> None:
    queries = random_queries(23, 2)
    ids = [f"q{i}" for i in range(23)]
    with pytest.raises(KeyboardInterrupt):
        featurize_to(tmp_path / "f.npz", ids, queries, CountingFeaturizer(fail_on=3), batch_size=5)
    assert not (tmp_path / "f.npz").exists()
    assert len(list((tmp_path / "f.npz.parts").glob("part-*.npz"))) == 2
    resumed = CountingFeaturizer()
    stored = featurize_to(tmp_path / "f.npz", ids, queries, resumed, batch_size=5)
    assert resumed.seen == queries[10:]  # only what was missing, nothing twice
    np.testing.assert_array_equal(stored.features, CharCountFeaturizer().transform(queries))
    again = CountingFeaturizer()
    featurize_to(tmp_path / "f.npz", ids, queries, again, batch_size=5)
    assert again.seen == []  # complete: nothing recomputed


def test_extending_a_feature_file_reuses_its_rows(tmp_path: Path) -> None:
    queries = random_queries(12, 3)
    ids = [f"q{i}" for i in range(12)]
    featurize_to(tmp_path / "f.npz", ids[:8], queries[:8], CharCountFeaturizer())
    more = CountingFeaturizer()
    stored = featurize_to(tmp_path / "f.npz", ids, queries, more)
    assert more.seen == queries[8:]
    assert stored.ids == ids


def test_resuming_with_another_featurizer_is_refused(tmp_path: Path) -> None:
    queries = random_queries(10, 4)
    ids = [f"q{i}" for i in range(10)]
    with pytest.raises(KeyboardInterrupt):
        featurize_to(tmp_path / "f.npz", ids, queries, CountingFeaturizer(fail_on=2), batch_size=4)
    with pytest.raises(
        ProbeMismatchError, match=r"unfinished run .* used another featurizer.*weights_fingerprint"
    ):
        featurize_to(tmp_path / "f.npz", ids, queries, CharCountFeaturizer(seed=9), batch_size=4)


def test_featurize_to_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="got 2 ids for 1 queries"):
        featurize_to(tmp_path / "f.npz", ["a", "b"], ["q"], CharCountFeaturizer())
    with pytest.raises(ValueError, match="ids must be unique"):
        featurize_to(tmp_path / "f.npz", ["a", "a"], ["q", "r"], CharCountFeaturizer())
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        featurize_to(tmp_path / "f.npz", ["a"], ["q"], CharCountFeaturizer(), batch_size=0)


SLOW_RUN = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from _probe_helpers import CharCountFeaturizer, random_queries
    from capgate.estimators.feature_store import featurize_to

    class Slow(CharCountFeaturizer):
        def transform(self, queries):
            time.sleep(0.05)
            return super().transform(queries)

    queries = random_queries(200, 5)
    featurize_to({out!r}, [f"q{{i}}" for i in range(200)], queries, Slow(), batch_size=2)
    """
)


def test_a_killed_featurization_resumes_from_its_parts(tmp_path: Path) -> None:
    out = tmp_path / "f.npz"
    script = SLOW_RUN.format(tests=str(Path(__file__).parent), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script])
    parts = tmp_path / "f.npz.parts"
    try:
        for _ in range(1200):  # wait (up to a minute) until a few batches are on disk
            if parts.exists() and len(list(parts.glob("part-*.npz"))) >= 3:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    finished_parts = list(parts.glob("part-*.npz"))
    assert len(finished_parts) >= 3
    assert not out.exists()
    queries = random_queries(200, 5)
    resumed = CountingFeaturizer()
    stored = featurize_to(out, [f"q{i}" for i in range(200)], queries, resumed, batch_size=50)
    assert len(resumed.seen) <= 200 - 2 * len(finished_parts)
    assert len(set(resumed.seen)) == len(resumed.seen)
    np.testing.assert_array_equal(stored.features, CharCountFeaturizer().transform(queries))
