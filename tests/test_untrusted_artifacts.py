"""Artifacts from an untrusted folder cannot run code or reach outside it, and the decision log
is private: crafted files (a pickle disguised as safetensors, JSON with unexpected types, path
traversal in referenced file names, YAML tags), the SQLite log's modes, query text kept only
when asked for."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from pathlib import Path

import numpy as np
import pytest

from capgate import DataError, Estimate
from capgate.decision import Decision, DecisionLog, query_hash
from capgate.estimators._linear_probe import META_FILE, WEIGHTS_FILE, LinearProbe
from capgate.estimators.feature_store import load_features, spec_path
from capgate.local.models import check_weight_files, load_model, weights_fingerprint
from capgate.policies import Policy
from capgate.policies._yaml import PolicyError


class _Payload:
    """Unpickling this creates the folder ``marker``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def _pickle_bomb(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(_Payload(marker)))


@pytest.fixture(scope="module")
def saved_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    folder = tmp_path_factory.mktemp("probe")
    LinearProbe(lr=1e-2, validation_fraction=None, max_epochs=3).fit(X, rng.uniform(size=40)).save(folder)
    return folder


def _copy_probe(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in (META_FILE, WEIGHTS_FILE):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def test_a_pickle_disguised_as_safetensors_is_refused_unread(saved_probe: Path, tmp_path: Path) -> None:
    folder = _copy_probe(saved_probe, tmp_path / "evil")
    marker = tmp_path / "code-ran"
    _pickle_bomb(folder / WEIGHTS_FILE, marker)
    meta = json.loads((folder / META_FILE).read_text())
    meta["weights_sha256"] = hashlib.sha256(
        (folder / WEIGHTS_FILE).read_bytes()
    ).hexdigest()  # a consistent fake
    (folder / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DataError, match="not a safetensors file") as info:
        LinearProbe.load(folder)
    assert info.value.path == str(folder / WEIGHTS_FILE)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dim", "3"),
        ("dim", True),
        ("settings", []),
        ("lr", "fast"),
        ("feature_spec", [1]),
        ("target", 7),
        ("lr_sweep", [{"format": []}]),  # found by bench/fuzz_bench.py: was a bare ValueError
        ("lr_sweep", [[0.1, "x"]]),
    ],
)
def test_probe_metadata_with_unexpected_types_names_the_field(
    saved_probe: Path, tmp_path: Path, field: str, value: object
) -> None:
    folder = _copy_probe(saved_probe, tmp_path / "odd")
    meta = json.loads((folder / META_FILE).read_text())
    meta[field] = value
    (folder / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DataError) as info:
        LinearProbe.load(folder)
    assert info.value.field == field
    assert info.value.path == str(folder / META_FILE)


def test_probe_files_are_read_from_their_own_folder_only(saved_probe: Path, tmp_path: Path) -> None:
    """probe.json names no file: a planted reference to a file elsewhere is never followed."""
    outside = tmp_path / "outside.safetensors"
    _pickle_bomb(outside, tmp_path / "code-ran")
    folder = _copy_probe(saved_probe, tmp_path / "probe")
    meta = json.loads((folder / META_FILE).read_text())
    meta["weights_file"] = "../outside.safetensors"
    (folder / META_FILE).write_text(json.dumps(meta))
    probe = LinearProbe.load(folder)
    assert probe.coef_.shape == (3,)
    assert not (tmp_path / "code-ran").exists()


def test_a_feature_file_with_a_pickled_array_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "feats.npz"
    marker = tmp_path / "code-ran"
    np.savez(path, ids=np.array(["a"]), features=np.array([_Payload(marker)], dtype=object))
    spec_path(path).write_text(json.dumps({"format": "capgate-features", "n": 1, "dim": 1, "spec": {}}))
    with pytest.raises(DataError, match=r"cannot read as a feature \.npz") as info:
        load_features(path)
    assert info.value.path == str(path)
    assert not marker.exists()


def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
              "intermediate_size": 8, "vocab_size": 16}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_model_folder_of_pickled_weights_is_refused_before_loading(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    marker = tmp_path / "code-ran"
    _pickle_bomb(folder / "pytorch_model.bin", marker)
    with pytest.raises(DataError, match=r"never pickled \.bin weights"):
        load_model(folder)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("shard", "message"),
    [
        ("../../outside.safetensors", "outside the model folder"),
        ("/etc/outside.safetensors", "outside the model folder"),
        ("sub/inner.safetensors", "outside the model folder"),
        ("pytorch_model.bin", "expected a .safetensors file name"),
        (7, "expected a .safetensors file name"),
    ],
)
def test_a_shard_index_naming_files_outside_the_folder_is_refused(
    tmp_path: Path, shard: object, message: str
) -> None:
    folder = _model_folder(tmp_path)
    (folder / "model-1.safetensors").write_bytes(b"")
    index = {"metadata": {}, "weight_map": {"lm_head.weight": shard}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=message) as info:
        check_weight_files(folder)
    assert info.value.field == "lm_head.weight"
    assert weights_fingerprint(folder).startswith("safetensors-sha256:")  # the folder itself is fine


@pytest.mark.parametrize(
    "text",
    [
        "name: x\nbands: !include ../outside.yaml\non_degraded: abstain\n",
        "name: !!python/object/apply:os.system ['touch code-ran']\nbands: 0.5\non_degraded: abstain\n",
        "name: x\nbands: 0.5\non_degraded: abstain\ninclude: ../outside.yaml\n",
        "name: x\nbands: 0.5\non_degraded: abstain\nsteps: {draft: {include: /etc/passwd}}\n",
    ],
)
def test_policy_files_cannot_include_or_reference_other_files(tmp_path: Path, text: str) -> None:
    """A policy file is self-contained: no tag, key or value makes it read another file."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(path)
    assert info.value.path == str(path)
    assert info.value.line is not None
    assert not (tmp_path / "code-ran").exists()


def _decision() -> Decision:
    return Decision(action="answer", estimate=Estimate(p=0.9, method="probe"), reason="p >= 0.8")


def test_the_decision_log_is_user_only(tmp_path: Path) -> None:
    path = tmp_path / "new-folder" / "decisions.sqlite3"
    with DecisionLog(path) as log:
        log.record(_decision(), query="secret question")
        for file in [path, *path.parent.glob("decisions.sqlite3-*")]:  # -wal, -shm
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o077 == 0


def test_an_existing_log_readable_by_others_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "decisions.sqlite3"
    path.touch(mode=0o644)
    path.chmod(0o644)
    with DecisionLog(path) as log:
        log.record(_decision())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_folder_every_user_may_write_to_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DataError, match="writable by every user") as info:
        DecisionLog(shared / "decisions.sqlite3").record(_decision())
    assert info.value.path == str(shared)
    shared.chmod(0o1777)  # the sticky bit (as /tmp): others cannot replace our file
    with DecisionLog(shared / "decisions.sqlite3") as log:
        log.record(_decision())
        assert len(log) == 1


def test_query_text_is_stored_only_when_asked_for(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "hashed.sqlite3") as log:
        d = _decision()
        log.record(d, query="secret question")
        row = log.get(d.id)
        written = b"".join(f.read_bytes() for f in tmp_path.glob("hashed.sqlite3*"))  # -wal included
    assert row.query_text is None
    assert row.query_sha256 == query_hash("secret question")
    assert b"secret question" not in written
    with DecisionLog(tmp_path / "text.sqlite3", store_text=True) as log:
        d = _decision()
        log.record(d, query="secret question")
        assert log.get(d.id).query_text == "secret question"
