"""load_estimator: the embedded default model with its shipped probe, offline; refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from capgate import Estimate, ProbeMismatchError, load_estimator
from capgate.estimators import ProbeEstimator
from capgate.estimators.guarded import InjectionGuard
from capgate.labels.labelled import read_labelled
from capgate.loading import default_probe_path
from capgate.metrics import capability_brier

ASSETS = Path(__file__).resolve().parents[1] / "sdk" / "assets"


def test_shipped_probe_metadata_names_the_default_model() -> None:
    meta = json.loads((default_probe_path() / "probe.json").read_text(encoding="utf-8"))
    text = json.dumps(meta)
    assert "SmolLM2-135M-Instruct" in text
    assert "gguf-sha256:" in text


def test_a_model_other_than_default_needs_a_probe() -> None:
    with pytest.raises(ValueError, match="no probe given for model 'some/model'"):
        load_estimator("some/model")


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_a_bad_batch_size_is_named_not_a_probe_mismatch(batch_size: object) -> None:
    with pytest.raises(ValueError, match=r"`batch_size` must be a positive integer") as raised:
        load_estimator("default", device="cpu", batch_size=batch_size)  # type: ignore[arg-type]
    assert not isinstance(raised.value, ProbeMismatchError)  # was: "layers: probe has [26], ..."


@pytest.mark.slow
def test_default_estimator_is_ready_offline_and_beats_the_prior_on_held_out_queries(
    default_model_dir: Path,
) -> None:
    estimator = load_estimator("default", device="cpu")
    assert isinstance(estimator, ProbeEstimator)  # the injection guard is opt-in (guard=True)
    assert isinstance(load_estimator("default", device="cpu", guard=True), InjectionGuard)
    labels = read_labelled(ASSETS / "default_labels.jsonl")
    split = json.loads((ASSETS / "default_split.json").read_text(encoding="utf-8"))
    test_ids = set(split["test"])
    held_out = [r for r in labels.records if r.id in test_ids]
    prompts = [str((r.model_extra or {})["prompt"]) for r in held_out]
    estimates = estimator.estimate(prompts)
    assert all(isinstance(e, Estimate) and e.method == "probe" and e.usable for e in estimates)
    p = np.array([e.p for e in estimates], dtype=float)
    mu = np.array([r.mu_hat for r in held_out])
    train_mean = float(np.mean([r.mu_hat for r in labels.records if r.id not in test_ids]))
    # The shipped probe must carry information beyond the training-set base rate.
    assert capability_brier(p, mu) < capability_brier(np.full_like(mu, train_mean), mu)
    # Batched and one-by-one estimates agree: exactly in float32 (the automatic choice may read in
    # a bfloat16 fast path, checked only to within FAST_PATH_MAX_ABS_DP of float32).
    exact = load_estimator("default", device="cpu", dtype="float32")
    batched = exact.estimate(prompts[:4])
    assert [exact.estimate_one(q).p for q in prompts[:4]] == pytest.approx([e.p for e in batched], abs=1e-5)


@pytest.mark.slow
def test_default_probe_refuses_another_model(tiny_model_dir: Path) -> None:
    with pytest.raises(ProbeMismatchError, match=r"weights_fingerprint|model_id|dim"):
        load_estimator(tiny_model_dir, probe=default_probe_path(), device="cpu")
