"""The demo's verbalized part and the C3RL adapter capgate ships for the embedded model: the adapter
is small and names its base, merges into a model that reads its own tag, and that model states a
confidence that follows the kind of question (what bench/c3rl.py measured), shown beside the probe."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import DemoRun
from safetensors import safe_open

from capgate.assets import C3RL_SMOLLM2_ADAPTER
from capgate.demo.verbalized import FAMILIES, VerbalizedReport, VerbalizedRow
from capgate.grading import NumericGrader
from capgate.local.lora import ADAPTER_WEIGHTS, read_provenance
from capgate.train.synthetic import HELD_OUT_FAMILY


def row(family: str, correct: bool, stated: float | None) -> VerbalizedRow:
    return VerbalizedRow(question="q", family=family, answer="1", correct=correct, stated=stated, probe=0.5)


def test_the_report_counts_tags_and_means_by_outcome() -> None:
    report = VerbalizedReport("m", [row("a", True, 0.9), row("a", True, 0.7), row("b", False, 0.1),
                                    row("b", False, None)])  # fmt: skip
    assert report.tag_rate == 0.75
    assert report.mean_stated(correct=True) == pytest.approx(0.8)
    assert report.mean_stated(correct=False) == pytest.approx(0.1)
    assert VerbalizedReport("m").tag_rate == 0.0
    assert VerbalizedReport("m", [row("a", True, None)]).mean_stated(correct=True) is None
    assert json.loads(json.dumps(report.to_dict()))["rows"][3]["stated"] is None


def test_the_tag_rate_counts_the_models_answers_not_the_questions() -> None:
    """A model that tags every other answer it writes tags 50% of its answers, whatever the
    estimator's retries: the demo asks once a question, so each row is one answer."""
    import re

    from capgate import Generation
    from capgate.demo.verbalized import run_verbalized
    from capgate.estimators import VerbalizedConfidence

    texts: list[str] = []

    def generate(prompts: list[Any], params: Any) -> list[list[Generation]]:
        out = []
        for prompt in prompts:
            a, op, b = re.search(r"What is (\d+) ([-+*]) (\d+)", str(prompt)).groups()  # type: ignore[union-attr]
            answer = str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
            texts.append(answer if len(texts) % 2 == 0 else f"{answer} [confidence=80%]")
            out.append([Generation(text=texts[-1], n_tokens=3)])
        return out

    backend = SimpleNamespace(model_id="stand-in", generate=generate)
    report = run_verbalized(VerbalizedConfidence(backend, tag=True), per_family=2, seed=0)
    assert len(texts) == len(report.rows) == 2 * len(FAMILIES)
    assert report.tag_rate == sum("[confidence=" in t for t in texts) / len(texts) == 0.5
    assert all(r.correct is True for r in report.rows if r.stated is not None)


def test_the_shipped_adapter_is_small_half_precision_and_names_its_base(default_model_dir: Path) -> None:
    from capgate.local.models import weights_fingerprint

    adapter = C3RL_SMOLLM2_ADAPTER
    weights = adapter / ADAPTER_WEIGHTS
    assert weights.stat().st_size < 3_000_000
    with safe_open(str(weights), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}  # noqa: SIM118
    provenance = read_provenance(adapter)
    assert provenance is not None
    assert provenance.c3rl is True
    assert provenance.base_weights_fingerprint == weights_fingerprint(default_model_dir)


def test_default_c3rl_is_the_embedded_model_with_the_adapter_merged_in(default_model_dir: Path) -> None:
    from capgate.adapters.backends.transformers import trained_to_state_confidence
    from capgate.local.lora import adapter_digest
    from capgate.local.models import prepare_model, weights_fingerprint

    folder = prepare_model("default-c3rl")
    assert folder.name == f"{default_model_dir.name}-c3rl-{adapter_digest(C3RL_SMOLLM2_ADAPTER)[:16]}"
    assert prepare_model("default-c3rl") == folder  # merged once, then found
    meta = json.loads((folder / "capgate_model.json").read_text())
    provenance = read_provenance(C3RL_SMOLLM2_ADAPTER)
    assert provenance is not None
    assert meta["model_id"] == provenance.model_id
    assert meta["source"]["base_weights_fingerprint"] == weights_fingerprint(default_model_dir)
    assert weights_fingerprint(folder) != weights_fingerprint(default_model_dir)
    assert trained_to_state_confidence("default-c3rl") is True
    assert trained_to_state_confidence("default") is False


@pytest.mark.slow
def test_the_verbalized_part_shows_the_trained_models_own_confidence(demo_run: DemoRun) -> None:
    part = demo_run.figures["verbalized"]
    rows = part["rows"]
    assert [r["family"] for r in rows] == [f for f in FAMILIES for _ in range(2)]
    assert "+c3rl-" in part["model_id"]
    grader = NumericGrader()
    for r in rows:  # each question's grade, redone from its text
        a, op, b = r["question"].removeprefix("What is ").removesuffix("?").split()
        truth = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        if r["stated"] is None:  # no tag: no answer read, no grade
            assert r["correct"] is None, r
        else:
            assert r["correct"] == (r["answer"] is not None and grader.extract(r["answer"]) == str(truth)), r
        assert r["probe"] is not None
        assert 0.0 <= r["probe"] <= 1.0
    tagged = [r for r in rows if r["stated"] is not None]
    assert part["tag_rate"] == len(tagged) / len(rows) >= 0.9  # bench: 1.00 on 480 answers
    # what the bench measured: sure of one-digit sums, unsure of two-digit products and the held-out family
    by_family = {f: [r["stated"] for r in tagged if r["family"] == f] for f in FAMILIES}
    assert min(by_family["add_1d"]) > max(by_family["mul_2d"] + by_family[HELD_OUT_FAMILY])
