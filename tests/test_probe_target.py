"""Reader and target: a probe records whose capability its labels measure, refuses labels of
another target, and a gate refuses calls to another model than the probe's target."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _estimators import KeywordEstimator
from _fakes import ScriptedBackend, gen
from _probe_helpers import CharCountFeaturizer, linear_capability, random_queries
from typer.testing import CliRunner

from capgate import Estimate, Gate, SettingsError
from capgate.cli import app
from capgate.datasets import DatasetItem
from capgate.errors import DataError, ProbeMismatchError
from capgate.estimators import LinearProbe, ProbeEstimator, ProbeTarget, check_target_match
from capgate.labels.harvesting import harvest, meta_path

FEATURIZER = "_probe_helpers:CharCountFeaturizer"
runner = CliRunner()


def _labels(path: Path, n: int, seed: int, target: dict[str, object] | None) -> Path:
    queries = random_queries(n, seed)
    mu = linear_capability(CharCountFeaturizer().transform(queries), seed + 1)
    correct = np.random.default_rng(seed + 2).binomial(16, mu)
    with path.open("w") as fh:
        for i, (q, c) in enumerate(zip(queries, correct, strict=True)):
            fh.write(json.dumps({"id": f"q{i}", "question": q, "k": 16, "correct": int(c)}) + "\n")
    if target is not None:
        settings = {
            "format": "capgate.labels.harvesting",
            "version": 1,
            "k": 16,
            "temperature": 0.7,
            **target,
        }
        meta_path(path).write_text(json.dumps(settings))
    return path


def test_harvest_records_the_target_and_the_probe_keeps_it(tmp_path: Path) -> None:
    backend = ScriptedBackend(lambda text, params: [gen("4")] * params.n)
    items = [
        DatasetItem(id=f"i{n}", question=f"{n} + 0 =", references=[str(n)], kind="numeric") for n in range(3)
    ]
    harvest(backend, items, tmp_path / "labels.jsonl", k=2, temperature=0.4, max_tokens=9, progress=False)
    target = ProbeTarget.from_harvest(tmp_path / "labels.jsonl")
    assert target is not None
    assert (target.model, target.temperature, target.max_tokens, target.k) == ("scripted", 0.4, 9, 2)
    assert target.endpoint == "other"  # a test double says nothing of how it is reached

    X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    probe = LinearProbe(lr=5e-2, max_epochs=5).fit(X, np.full(40, 0.3), target=target)
    assert probe.target_ == target
    loaded = LinearProbe.load(probe.save(tmp_path / "probe"))
    assert loaded.target_ == target
    assert json.loads((tmp_path / "probe" / "probe.json").read_text())["target"]["model"] == "scripted"
    assert ProbeEstimator(CharCountFeaturizer(), loaded).target_model == "scripted"


def test_backends_say_how_they_reach_their_model() -> None:
    from capgate.adapters.backends.function import FunctionBackend
    from capgate.adapters.backends.openai import OpenAIBackend
    from capgate.core.backend import backend_endpoint

    assert backend_endpoint(OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key="x")) == (
        "openai",
        "http://127.0.0.1:9/v1",
    )
    assert backend_endpoint(FunctionBackend(lambda p: "x")) == ("function", None)
    assert backend_endpoint(object()) == ("other", None)


def test_target_mismatch_names_every_differing_field() -> None:
    a = ProbeTarget(model="gpt-oss-20b", endpoint="openai", temperature=1.0, max_tokens=512)
    check_target_match(a, a.model_copy(update={"k": 5, "dataset": "other"}))  # same target
    check_target_match(a, None)
    with pytest.raises(ProbeMismatchError, match=r"model: 'gpt-oss-20b' here, 'smollm2' there.*temperature"):
        check_target_match(a, a.model_copy(update={"model": "smollm2", "temperature": 0.2}))


def test_broken_target_records_are_located(tmp_path: Path) -> None:
    labels = tmp_path / "l.jsonl"
    labels.write_text("")
    meta_path(labels).write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        ProbeTarget.from_harvest(labels)
    meta_path(labels).write_text(json.dumps({"k": 3}))
    with pytest.raises(DataError, match="field 'model_id'"):
        ProbeTarget.from_harvest(labels)


def test_cli_fit_records_the_target_and_eval_refuses_another(tmp_path: Path) -> None:
    train = _labels(tmp_path / "train.jsonl", 300, 1, {"model_id": "target-a", "endpoint": "openai"})
    other = _labels(tmp_path / "other.jsonl", 100, 5, {"model_id": "target-b", "endpoint": "openai"})
    same = _labels(tmp_path / "same.jsonl", 100, 7, {"model_id": "target-a", "endpoint": "openai"})
    result = runner.invoke(
        app,
        ["probe", "fit", "--labels", str(train), "--out", str(tmp_path / "p"), "--featurizer", FEATURIZER],
    )
    assert result.exit_code == 0, result.output
    assert "target target-a" in result.stdout
    assert LinearProbe.load(tmp_path / "p").target_ == ProbeTarget.from_harvest(train)
    base = ["probe", "eval", "--probe", str(tmp_path / "p"), "--featurizer", FEATURIZER, "--labels"]
    refused = runner.invoke(app, [*base, str(other)])
    assert refused.exit_code == 2
    assert "model: 'target-a' here, 'target-b' there" in refused.stderr
    assert runner.invoke(app, [*base, str(same)]).exit_code == 0
    assert runner.invoke(app, [*base, str(other), "--ignore-target"]).exit_code == 0


class _Targeted(KeywordEstimator):
    @property
    def target_model(self) -> str | None:
        return "gpt-oss-20b"


def test_a_gate_refuses_calls_to_another_model_than_the_estimators_target() -> None:
    estimator = _Targeted({}, default=0.9)
    ok = Gate(estimator=estimator, target="gpt-oss-20b")
    assert ok.assess("q").decision.target == "gpt-oss-20b"
    assert Gate(estimator=estimator).assess("q").decision.target == "gpt-oss-20b"  # recorded anyway
    with pytest.raises(SettingsError, match=r"predicts the capability of 'gpt-oss-20b'.*go to 'gpt-4o'"):
        Gate(estimator=estimator, target="gpt-4o")
    with pytest.raises(SettingsError, match="allow_other_target"):
        ok.with_options(target="gpt-4o")
    overridden = Gate(estimator=estimator, target="gpt-4o", allow_other_target=True).assess("q").decision
    assert overridden.target == "gpt-4o"
    assert overridden.target_override is True
    assert "predicts 'gpt-oss-20b''s capability (allow_other_target)" in overridden.reason
    # An estimator without a target (verbalized, P(True)...) judges whatever model it is asked about.
    assert Gate(estimator=KeywordEstimator({}), target="gpt-4o").assess("q").decision.target == "gpt-4o"
    assert Estimate(p=0.5, method="m").p == 0.5


def test_harvest_cli_takes_an_openai_compatible_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "l.jsonl")
    base = ["harvest", "basic_arithmetic:easy", "--out", out, "--limit", "1", "--no-progress"]
    missing = runner.invoke(app, [*base, "--base-url", "http://127.0.0.1:9/v1"])
    assert missing.exit_code == 2
    assert "--base-url needs --served-model" in missing.stderr
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    unset = runner.invoke(
        app, [*base, "--base-url", "http://x/v1", "--served-model", "m", "--api-key-env", "NO_SUCH_KEY_VAR"]
    )
    assert unset.exit_code == 2
    assert "'NO_SUCH_KEY_VAR' is not set" in unset.stderr
    alone = runner.invoke(app, [*base, "--served-model", "m"])
    assert alone.exit_code == 2
    assert "need --base-url" in alone.stderr
