"""Bench caches of estimates are keyed by the fingerprint of their estimator (bench/_cache.py,
capgate.estimators.fingerprint): a cache written by another estimator is refused, naming the file
and both fingerprints, or recomputed on request."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import cas_bench
from _cache import StaleCacheError, check_jsonl, read_estimates, write_estimates

from capgate.estimators import LinearProbe, ProbeEstimator
from capgate.estimators.fingerprint import estimator_fingerprint, probe_fingerprint
from capgate.loading import default_probe_path

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "bench" / "data" / "default_v1" / "probe"


class SpecOnly:
    """A featurizer that is never run: the fingerprint reads only its spec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def transform(self, queries: object) -> np.ndarray:
        raise AssertionError("a fingerprint must not featurize")


def test_a_saved_probe_and_the_estimator_loaded_from_it_share_a_fingerprint() -> None:
    probe = LinearProbe.load(default_probe_path())
    estimator = ProbeEstimator(SpecOnly(dict(probe.feature_spec_ or {})), probe)
    assert estimator_fingerprint(estimator) == probe_fingerprint(default_probe_path())


def test_the_fingerprint_tells_probes_and_readers_apart(tmp_path: Path) -> None:
    installed = probe_fingerprint(default_probe_path())
    assert probe_fingerprint(V1) != installed
    probe = LinearProbe.load(default_probe_path())
    other_reader = {**(probe.feature_spec_ or {}), "layers": [25]}
    assert estimator_fingerprint(ProbeEstimator(SpecOnly(other_reader), probe)) != installed
    # the metadata JSON counts too, not only the weights
    copy = tmp_path / "probe"
    copy.mkdir()
    (copy / "probe.safetensors").write_bytes((default_probe_path() / "probe.safetensors").read_bytes())
    meta = json.loads((default_probe_path() / "probe.json").read_text())
    (copy / "probe.json").write_text(json.dumps({**meta, "settings": {**meta["settings"], "lr": 1.0}}))
    assert probe_fingerprint(copy) != installed


def test_non_probe_estimators_are_fingerprinted_by_their_settings() -> None:
    from capgate.estimators import VerbalizedConfidence

    class Backend:
        model = "m"

        def generate(self, prompts: object, params: object) -> list[object]:
            raise AssertionError("a fingerprint must not generate")

    a = estimator_fingerprint(VerbalizedConfidence(Backend()))
    assert a == estimator_fingerprint(VerbalizedConfidence(Backend()))
    Backend.model = "another"
    assert a != estimator_fingerprint(VerbalizedConfidence(Backend()))


def test_a_cache_from_another_estimator_is_refused_naming_file_and_fingerprints(tmp_path: Path) -> None:
    path = tmp_path / "estimates.json"
    write_estimates(path, "probe-sha256:old", {"q1": 0.2}, about="test")
    assert read_estimates(path, "probe-sha256:old") == {"q1": 0.2}
    with pytest.raises(StaleCacheError) as refused:
        read_estimates(path, "probe-sha256:new")
    message = str(refused.value)
    assert str(path) in message
    assert "probe-sha256:old" in message
    assert "probe-sha256:new" in message
    assert read_estimates(path, "probe-sha256:new", on_mismatch="recompute") == {}


def test_a_cache_without_a_fingerprint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps({"about": "before fingerprints", "p": {"q1": 0.5}}))
    with pytest.raises(StaleCacheError, match="records no estimator fingerprint"):
        read_estimates(path, "probe-sha256:new")
    assert read_estimates(tmp_path / "absent.json", "probe-sha256:new") == {}


def test_jsonl_caches_keep_their_fingerprint_in_a_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "probe-live.jsonl"
    check_jsonl(path, "fp-a")
    path.write_text('{"id": "q1", "p": 0.1}\n')
    check_jsonl(path, "fp-a")  # same estimator: accepted
    with pytest.raises(StaleCacheError, match="fp-a") as refused:
        check_jsonl(path, "fp-b")
    assert str(path) in str(refused.value)
    assert "fp-b" in str(refused.value)
    check_jsonl(path, "fp-b", on_mismatch="recompute")
    assert path.read_text() == ""
    assert (tmp_path / "probe-live.jsonl.stale").exists()
    legacy = tmp_path / "legacy.jsonl"
    legacy.write_text('{"id": "q1", "p": 0.1}\n')
    with pytest.raises(StaleCacheError, match="records no estimator fingerprint"):
        check_jsonl(legacy, "fp-a")


def test_the_cas_bench_refuses_probe_estimates_from_another_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The v1 probe's cache standing where the installed probe's belongs: refused before any model loads."""
    stale = tmp_path / "cas_fresh_probe.json"
    stale.write_bytes(cas_bench.PROBE_V1_CACHE.read_bytes())
    monkeypatch.setattr(cas_bench, "PROBE_CACHE", stale)
    pools = cas_bench.Pools("toy", ["NAEP_2009_8_S10+1"], [["A"]], [[True]], {"logprob": [[None]]})
    with pytest.raises(StaleCacheError) as refused:
        cas_bench.probe_estimates(pools)
    message = str(refused.value)
    assert str(stale) in message
    assert probe_fingerprint(V1) in message
    assert probe_fingerprint(default_probe_path()) in message


def test_the_committed_cas_caches_match_the_probes_that_wrote_them() -> None:
    """Installing a new default probe without recomputing the CAS bench's priors fails here."""
    installed = probe_fingerprint(default_probe_path())
    assert len(read_estimates(cas_bench.PROBE_CACHE, installed)) == 330
    assert len(read_estimates(cas_bench.PROBE_V1_CACHE, probe_fingerprint(V1))) == 330


def test_the_injection_bench_refuses_black_box_estimates_from_other_settings(tmp_path: Path) -> None:
    from injection_bench import Cached

    from capgate.estimators import VerbalizedConfidence

    class Backend:
        model = "m"

        def generate(self, prompts: object, params: object) -> list[object]:
            raise AssertionError("a cached estimate must not generate")

    path = tmp_path / "verbalized.jsonl"
    Cached(VerbalizedConfidence(Backend()), path)  # starts the cache with this estimator's fingerprint
    path.write_text('{"key": "q", "estimate": {"p": 0.5, "method": "verbalized"}}\n')
    Backend.model = "another"
    with pytest.raises(StaleCacheError, match=r"verbalized\.jsonl"):
        Cached(VerbalizedConfidence(Backend()), path)
