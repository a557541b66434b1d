"""``capgate probe featurize|fit|eval`` end to end on a toy featurizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _probe_helpers import CharCountFeaturizer, linear_capability, random_queries
from typer.testing import CliRunner

from capgate.cli import app
from capgate.estimators import LinearProbe
from capgate.estimators.feature_store import load_features

FEATURIZER = "_probe_helpers:CharCountFeaturizer"
runner = CliRunner()


def write_labels(path: Path, queries: list[str], correct: np.ndarray, k: int, offset: int = 0) -> Path:
    with path.open("w") as fh:
        for i, (q, c) in enumerate(zip(queries, correct, strict=True)):
            fh.write(json.dumps({"id": f"q{offset + i}", "question": q, "k": k, "correct": int(c)}) + "\n")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probe-cli")
    queries = random_queries(700, 40)
    mu = linear_capability(CharCountFeaturizer().transform(queries), 41)
    correct = np.random.default_rng(42).binomial(16, mu)
    write_labels(root / "train.jsonl", queries[:500], correct[:500], 16)
    write_labels(root / "test.jsonl", queries[500:], correct[500:], 16, offset=500)
    return root


def invoke(*args: str | Path) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def featurize(labels: Path, out: Path, *more: str) -> tuple[int, str, str]:
    """``capgate probe featurize`` of ``labels`` into ``out`` with the toy featurizer."""
    return invoke("probe", "featurize", "--labels", labels, "--out", out, "--featurizer", FEATURIZER, *more)


def fit(labels: Path, out: Path, *more: str | Path) -> tuple[int, str, str]:
    """``capgate probe fit`` on ``labels`` into ``out``; ``more``: the features' source and settings."""
    return invoke("probe", "fit", "--labels", labels, "--out", out, *more)


def evaluate(probe: Path, labels: Path, *more: str | Path) -> tuple[int, str, str]:
    """``capgate probe eval`` of ``probe`` on ``labels``."""
    return invoke("probe", "eval", "--probe", probe, "--labels", labels, *more)


def test_featurize_fit_eval(data: Path, tmp_path: Path) -> None:
    train, test, probe_dir = data / "train.jsonl", data / "test.jsonl", tmp_path / "probe"
    code, out, _ = featurize(train, tmp_path / "train.npz", "--batch-size", "64")
    assert code == 0, out
    assert "wrote" in out
    stored = load_features(tmp_path / "train.npz")
    assert stored.ids[:2] == ["q0", "q1"]
    assert stored.spec == CharCountFeaturizer().spec
    code, out, _ = featurize(test, tmp_path / "test.npz")
    assert code == 0, out

    code, out, _ = fit(train, probe_dir, "--features", tmp_path / "train.npz", "--lr", "0.01", "--seed", "3")
    assert code == 0, out
    assert "fitted on 450 queries" in out
    probe = LinearProbe.load(probe_dir)
    assert probe.training_["source"] == str(train)
    assert probe.feature_spec_ == CharCountFeaturizer().spec
    assert probe.random_state == 3

    code, out, _ = evaluate(
        probe_dir, test, "--features", tmp_path / "test.npz", "--json-out", tmp_path / "eval.json"
    )
    assert code == 0, out
    for column in ("cap. Brier", "ECE", "AUROC", "Spearman"):
        assert column in out
    for row in ("probe", "uniform-random", "constant-prior"):
        assert row in out
    rows = {r["source"]: r for r in json.loads((tmp_path / "eval.json").read_text())["rows"]}
    assert rows["probe"]["n"] == 200
    assert rows["probe"]["capability_brier"] < rows["constant-prior"]["capability_brier"] / 3
    assert rows["probe"]["capability_brier"] < rows["uniform-random"]["capability_brier"] / 5
    assert rows["probe"]["spearman"] > 0.8
    assert rows["constant-prior"]["auroc"] == 0.5

    # featurizing on the fly gives the same numbers as the stored features
    code, out, _ = evaluate(probe_dir, test, "--featurizer", FEATURIZER, "--json")
    assert code == 0, out
    assert json.loads(out)["rows"] == list(rows.values())


def test_fit_with_validation_labels_and_on_the_fly_features(data: Path, tmp_path: Path) -> None:
    train, test, probe_dir = data / "train.jsonl", data / "test.jsonl", tmp_path / "probe"
    code, out, _ = fit(
        train,
        probe_dir,
        "--val-labels",
        test,
        "--featurizer",
        FEATURIZER,
        "--lr",
        "0.001,0.01",
        "--max-epochs",
        "30",
    )
    assert code == 0, out
    probe = LinearProbe.load(probe_dir)
    assert probe.training_["n"] == 500
    assert probe.validation_["n"] == 200
    assert set(probe.lr_sweep_) == {0.001, 0.01}


def test_fit_reports_training_warnings_on_stderr(data: Path, tmp_path: Path) -> None:
    train, probe_dir = data / "train.jsonl", tmp_path / "probe"
    code, _, err = fit(train, probe_dir, "--featurizer", FEATURIZER, "--lr", "0.0001", "--max-epochs", "2")
    assert code == 0
    assert "warning: LinearProbe stopped at max_epochs=2 while the validation loss was still falling" in err


def test_eval_refuses_features_from_another_model(data: Path, tmp_path: Path) -> None:
    from capgate.estimators.feature_store import save_features

    train, test, probe_dir = data / "train.jsonl", data / "test.jsonl", tmp_path / "probe"
    featurize(train, tmp_path / "train.npz")
    fit(train, probe_dir, "--features", tmp_path / "train.npz", "--lr", "0.01", "--max-epochs", "5")
    other = CharCountFeaturizer(seed=4)
    rows = [json.loads(line) for line in test.read_text().splitlines()]
    ids, questions = [row["id"] for row in rows], [row["question"] for row in rows]
    save_features(tmp_path / "other.npz", ids, other.transform(questions), other.spec)
    code, _, err = evaluate(probe_dir, test, "--features", tmp_path / "other.npz")
    assert code == 2
    assert err.startswith("error: probe does not match the featurizer: weights_fingerprint: probe has")
    code, _, err = evaluate(
        probe_dir, test, "--features", tmp_path / "other.npz", "--ignore-spec-field", "weights_fingerprint"
    )
    assert code == 0, err


def test_bad_input_exits_2_with_a_located_error(data: Path, tmp_path: Path) -> None:
    train, test = data / "train.jsonl", data / "test.jsonl"
    features, out, noq = tmp_path / "test.npz", tmp_path / "p", tmp_path / "noq.jsonl"
    noq.write_text('{"id": "a", "k": 2, "correct": 1}\n\n{"id": "b", "k": 2, "correct": 0}\n')
    code, _, err = featurize(noq, out)
    assert code == 2
    assert err.strip() == (
        f"error: {noq}:1: field 'question': no question text to featurize (give --features instead)"
    )
    featurize(test, features)
    refusals = [
        (["fit", "--labels", train, "--out", out],
         "give exactly one of --features, --model, --featurizer; got none"),
        (["fit", "--labels", train, "--features", features, "--out", out],
         "field 'id': 500 of 500 ids have no features in"),
        (["fit", "--labels", train, "--featurizer", "nowhere:thing", "--out", out],
         "cannot import 'nowhere'"),
        (["fit", "--labels", train, "--featurizer", FEATURIZER, "--out", out, "--lr", "fast"],
         "--lr must be 'sweep' or comma-separated numbers; got 'fast'"),
        (["eval", "--probe", tmp_path / "missing", "--labels", test, "--features", features],
         "no saved capgate.linear_probe here"),
    ]  # fmt: skip
    for args, message in refusals:
        code, _, err = invoke("probe", *args)
        assert code == 2, (args, err)
        assert message in err, (args, err)
