"""A real C3RL run on a tiny random-weight Llama: rewards reach TRL, outputs load back, a killed run
resumes, and the refusals (no class spread, labels of another model, an --out holding another run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trl  # noqa: F401  - the train extra (trl, peft), installed by scripts/setup.sh: a missing one fails, never skips
from safetensors.torch import load_file

from capgate.core.types import LabelledQuery, Sample
from capgate.errors import DataError
from capgate.labels import meta_path
from capgate.local.models import weights_fingerprint
from capgate.train.config import C3RLTrainConfig
from capgate.train.data import load_examples, split_examples
from capgate.train.synthetic import arithmetic_items, arithmetic_prompt, tagged_arithmetic_prompt
from capgate.train.trainer import _last_good_checkpoint, trained_model_id

FAST = {
    "warm_start_steps": 3, "warm_start_batch_size": 4, "steps": 2, "prompts_per_step": 2,
    "num_generations": 2, "max_completion_length": 8, "save_steps": 1, "eval_fraction": 0.25,
    "eval_max": 3, "lora_r": 4, "lora_alpha": 8, "device": "cpu",
}  # fmt: skip


def write_labels(
    path: Path, model_dir: Path, *, classes: tuple[int, ...] = (4, 2, 0), prompt: Any = arithmetic_prompt
) -> Path:
    """Labels as harvest writes them (k=4), cycling through ``classes`` correct counts, with the
    settings file naming ``model_dir``'s weights."""
    items = arithmetic_items(2, families=["add_1d", "mul_1d", "add_2d", "mul_2d"], seed=0)
    lines = []
    for index, item in enumerate(items):
        correct = classes[index % len(classes)]
        samples = [
            Sample(answer=item.references[0] if i < correct else "0", correct=i < correct) for i in range(4)
        ]
        record = LabelledQuery.model_validate(
            {"id": item.id, "question": item.question, "references": item.references, "k": 4,
             "correct": correct, "samples": samples, "kind": item.kind, "prompt": prompt(item)}
        )  # fmt: skip
        lines.append(record.model_dump_json(exclude_none=True))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    meta = {
        "model_id": str(model_dir.resolve()),
        "weights_fingerprint": weights_fingerprint(model_dir),
        "k": 4,
    }
    meta_path(path).write_text(json.dumps(meta), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from capgate.train.trainer import train_c3rl

    work = tmp_path_factory.mktemp("c3rl")
    labels = write_labels(work / "labels.jsonl", tiny_model_dir)
    return train_c3rl(labels, tiny_model_dir, work / "run", config=C3RLTrainConfig(**FAST), progress=False)


def test_a_short_run_writes_adapter_merged_model_and_manifest(trained: Any, tiny_model_dir: Path) -> None:
    manifest = json.loads((trained.out / "manifest.json").read_text())
    assert manifest == trained.manifest
    assert manifest["base_weights_fingerprint"] == weights_fingerprint(tiny_model_dir)
    assert manifest["config"]["rewards"] == {"alpha": 0.5, "beta": 0.5, "threshold": 0.5,
                                             "format_penalty": 1.0, "brier": 0.0}  # fmt: skip
    # the questions trained on (3 all_right, 3 partly, 2 all_wrong less the 2 held out)
    assert manifest["labels"]["spread"] == {"all_right": 3, "partly": 1, "all_wrong": 2}
    assert manifest["labels"]["spread_held_out"] == {"all_right": 0, "partly": 2, "all_wrong": 0}
    assert len(manifest["data_sha256"]) == 64
    assert manifest["seed"] == 0
    assert manifest["warm_start"]["steps"] == 3
    assert manifest["warm_start"]["rows"] > 0
    assert manifest["grpo"]["steps"] == 2
    # every reward term reached the trainer and was logged separately, each step
    history = manifest["grpo"]["reward_history"]
    assert len(history) == 2
    for term in ("correctness", "calibration", "reference", "format"):
        assert all(f"rewards/c3rl_{term}/mean" in entry for entry in history)
    # a random model writes no well-formed tag: the format term is its penalty
    assert all(entry["rewards/c3rl_format/mean"] == pytest.approx(-1.0) for entry in history)
    evaluation = manifest["evaluation"]
    assert evaluation["held_out_questions"] == 2
    assert set(evaluation) >= {"base", "trained"}
    assert evaluation["trained"]["n_completions"] == 4
    assert manifest["trained_model"]["weights_fingerprint"] != manifest["base_weights_fingerprint"]


def test_the_outputs_load_back(trained: Any) -> None:
    from peft import PeftConfig

    from capgate.adapters.backends.transformers import load_backend
    from capgate.core.backend import SamplingParams

    assert PeftConfig.from_pretrained(str(trained.adapter)).r == 4
    backend = load_backend(trained.model, device="cpu")
    assert backend.model_id == trained.manifest["trained_model"]["model_id"]
    assert backend.loaded.weights_fingerprint == trained.manifest["trained_model"]["weights_fingerprint"]
    # the id names the saved adapter's weights: base, labels digest, LoRA weights digest
    saved = load_file(str(trained.adapter / "adapter_model.safetensors"))
    base_id, data_sha = trained.manifest["base_model"]["model_id"], trained.manifest["data_sha256"]
    assert backend.model_id == trained_model_id(base_id, data_sha, saved)
    [[answer]] = backend.generate(["What is 2 + 2?"], SamplingParams(max_tokens=4, seed=0))
    assert answer.n_tokens >= 1


def test_the_adapter_merges_without_peft_into_the_same_model(
    trained: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """capgate's own merge of the run's adapter (how the shipped adapter reaches users) gives the
    logits PEFT's merge gave, and keeps the run's name and its C3RL mark."""
    import torch
    from transformers import AutoModelForCausalLM

    from capgate.local.lora import merge_lora

    merged = merge_lora(tiny_model_dir, trained.adapter, tmp_path / "merged")
    meta = json.loads((merged / "capgate_model.json").read_text())
    assert meta["model_id"] == trained.manifest["trained_model"]["model_id"]
    assert meta["source"]["c3rl"] is True
    ids = torch.tensor([[1, 17, 42, 99, 7]])
    ours, peft_merged, base = (
        AutoModelForCausalLM.from_pretrained(str(folder))
        for folder in (merged, trained.model, tiny_model_dir)
    )
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, peft_merged(ids).logits, atol=1e-5, rtol=1e-5)
        # the adapter moved the model: a merge that dropped it would not pass the check above
        assert (ours(ids).logits - base(ids).logits).abs().max() > 1e-3


def test_load_estimator_reads_a_trained_folders_own_tag(trained: Any, tiny_model_dir: Path) -> None:
    """``method="verbalized"`` (the installed ``capgate.estimators`` entry point) on the run's
    ``model/`` folder reads the tag the model was trained to state; on its base, it asks."""
    import capgate
    from capgate.estimators import VerbalizedConfidence

    estimator = capgate.load_estimator(trained.model, method="verbalized", device="cpu")
    assert isinstance(estimator, VerbalizedConfidence)
    assert estimator.tag is True
    assert estimator.backend.model_id == trained.manifest["trained_model"]["model_id"]
    base = capgate.load_estimator(tiny_model_dir, method="verbalized", device="cpu")
    assert isinstance(base, VerbalizedConfidence)
    assert base.tag is False
    estimate = estimator.estimate_one("What is 2 + 2? Answer with just the number.")
    assert estimate.method == "verbalized"  # a random tiny model rarely tags: usable or named
    assert estimate.usable or estimate.reason
    with pytest.raises(
        ValueError, match=r"no estimator method 'psychic' is installed.*known: probe, verbalized"
    ):
        capgate.load_estimator(trained.model, method="psychic")
    with pytest.raises(ValueError, match="`probe` is for method='probe'"):
        capgate.load_estimator(trained.model, method="verbalized", probe=tiny_model_dir)  # type: ignore[call-overload]


def test_a_finished_run_is_returned_not_retrained(trained: Any, tiny_model_dir: Path) -> None:
    from capgate.train.trainer import train_c3rl

    labels = Path(trained.manifest["labels"]["path"])
    again = train_c3rl(labels, tiny_model_dir, trained.out, config=C3RLTrainConfig(**FAST), progress=False)
    assert again.manifest == trained.manifest


def test_refuses_labels_without_all_three_classes(tiny_model_dir: Path, tmp_path: Path) -> None:
    from capgate.train.trainer import train_c3rl

    labels = write_labels(tmp_path / "l.jsonl", tiny_model_dir, classes=(4, 2))
    with pytest.raises(DataError, match=r"no all_wrong questions \(4 all_right, 4 partly, 0 all_wrong\)"):
        train_c3rl(labels, tiny_model_dir, tmp_path / "run", config=C3RLTrainConfig(**FAST))
    assert not (tmp_path / "run").exists()


def test_refuses_labels_of_another_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from capgate.train.trainer import train_c3rl

    labels = write_labels(tmp_path / "l.jsonl", tiny_model_dir)
    meta = json.loads(meta_path(labels).read_text())
    meta_path(labels).write_text(json.dumps({**meta, "weights_fingerprint": "safetensors-sha256:0"}))
    with pytest.raises(DataError, match="harvested from weights safetensors-sha256:0, not from this model's"):
        train_c3rl(labels, tiny_model_dir, tmp_path / "run", config=C3RLTrainConfig(**FAST))
    # without a fingerprint, the model id is compared
    meta_path(labels).write_text(json.dumps({"model_id": "someone/else"}))
    with pytest.raises(DataError, match="harvested from model 'someone/else'"):
        train_c3rl(labels, tiny_model_dir, tmp_path / "run", config=C3RLTrainConfig(**FAST))
    meta_path(labels).unlink()
    with pytest.raises(DataError, match="no harvest settings next to the labels"):
        train_c3rl(labels, tiny_model_dir, tmp_path / "run", config=C3RLTrainConfig(**FAST))
    assert not (tmp_path / "run").exists()


def test_refuses_labels_graded_with_their_tag(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The prompt asked for the tag and the harvest named no confidence source: the tag was graded
    as the answer. Refused before anything is written, naming the settings file and the setting."""
    from capgate.train.trainer import train_c3rl

    labels = write_labels(tmp_path / "l.jsonl", tiny_model_dir, prompt=tagged_arithmetic_prompt)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # (the old code went on: refused here, not trained)
    with pytest.raises(
        DataError, match=r"l\.jsonl\.meta\.json: field 'confidence': the harvest named no confidence source"
    ):
        train_c3rl(labels, tiny_model_dir, out, config=C3RLTrainConfig(**FAST))
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def _seed_holding_out(examples: list[Any], index: int, *, held: bool) -> int:
    """The first seed whose split (FAST's eval settings) holds ``examples[index]`` out (or keeps it)."""
    for seed in range(100):
        _, held_out = split_examples(examples, eval_fraction=0.25, eval_max=3, seed=seed)
        if (examples[index] in held_out) is held:
            return seed
    raise AssertionError("no such seed")


@pytest.mark.filterwarnings("ignore:.*kept no answer texts")
def test_the_spread_is_checked_on_the_questions_left_to_train_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from capgate.train.trainer import train_c3rl

    labels = write_labels(tmp_path / "l.jsonl", tiny_model_dir, classes=(4, 2, 4, 2, 4, 2, 4, 0))
    seed = _seed_holding_out(load_examples(labels), 7, held=True)  # the one all_wrong question
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # (the old code went on: refused here, not trained)
    with pytest.raises(DataError, match=r"left to train on once 2 questions are held out .* no all_wrong"):
        train_c3rl(labels, tiny_model_dir, out, config=C3RLTrainConfig(**{**FAST, "seed": seed}))


def test_the_manifest_counts_the_training_split_and_says_the_warm_start_had_no_texts(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Labels without kept texts: a warning naming the settings file, and the manifest records that
    the warm start answers with extracted answers. The spread counts the questions trained on."""
    from capgate.train import trainer

    labels = write_labels(tmp_path / "l.jsonl", tiny_model_dir, classes=(4, 2, 4, 2, 4, 2, 4, 0))
    seed = _seed_holding_out(load_examples(labels), 7, held=False)
    monkeypatch.setattr(trainer, "_run", lambda *args, manifest, **kwargs: manifest)  # no training
    with pytest.warns(
        UserWarning, match=r"kept no answer texts \(keep_text is not true in .*l\.jsonl\.meta\.json"
    ):
        manifest: Any = trainer.train_c3rl(
            labels, tiny_model_dir, tmp_path / "run", config=C3RLTrainConfig(**{**FAST, "seed": seed})
        )
    assert manifest["labels"]["spread"] == {"all_right": 3, "partly": 2, "all_wrong": 1}
    assert sum(manifest["labels"]["spread_held_out"].values()) == 2
    assert manifest["labels"]["warm_start_answers"] == {"own_texts": 0, "extracted": 6}
    assert manifest["labels"]["harvest"]["keep_text"] is None


def test_a_checkpoint_with_an_unreadable_trainer_state_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """A kill while transformers writes trainer_state.json leaves it truncated: resume from the one
    before, warning with the file's path, instead of failing on it at every rerun."""
    for step, state in [(2, '{"global_step": 2}'), (4, '{"global_step": 4}'), (6, '{"best_metric": nu')]:
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-8").mkdir()  # killed before its state was written
    with pytest.warns(UserWarning, match=r"checkpoint-6/trainer_state\.json: unreadable trainer state"):
        assert _last_good_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_refuses_an_out_holding_another_run_or_other_files(
    trained: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from capgate.train.trainer import train_c3rl

    labels = Path(trained.manifest["labels"]["path"])
    other = C3RLTrainConfig(**{**FAST, "seed": 1})
    with pytest.raises(DataError, match="holds another C3RL run \\(its config differ"):
        train_c3rl(labels, tiny_model_dir, trained.out, config=other)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not a C3RL run's folder"):
        train_c3rl(labels, tiny_model_dir, tmp_path, config=C3RLTrainConfig(**FAST))


KILLED_RUN = """
import sys, time
from capgate.train.config import C3RLTrainConfig
from capgate.train.trainer import train_c3rl
config = C3RLTrainConfig.model_validate_json(sys.argv[4])
train_c3rl(sys.argv[1], sys.argv[2], sys.argv[3], config=config, progress=False)
"""


def test_the_trained_id_changes_with_any_adapter_weight() -> None:
    import torch

    state = {"a.lora_A.weight": torch.zeros(2, 3), "a.lora_B.weight": torch.ones(3, 2)}
    same = trained_model_id("m", "ab" * 32, {k: v.clone() for k, v in reversed(state.items())})
    assert same == trained_model_id("m", "ab" * 32, state) == f"m+c3rl-abababab-{same[-8:]}"
    nudged = {**state, "a.lora_A.weight": torch.zeros(2, 3).index_fill_(1, torch.tensor([2]), 1e-7)}
    assert trained_model_id("m", "ab" * 32, nudged) != same
    assert trained_model_id("m", "ab" * 32, {k: v.half() for k, v in state.items()}) != same
    assert trained_model_id("m", "cd" * 32, state) != same


def test_a_killed_run_resumes_from_its_last_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    from capgate.train.trainer import train_c3rl

    labels = write_labels(tmp_path / "l.jsonl", tiny_model_dir)
    config = C3RLTrainConfig(**{**FAST, "steps": 16, "save_steps": 2})
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_RUN,
            str(labels),
            str(tiny_model_dir),
            str(out),
            config.model_dump_json(),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    try:
        while not (out / "grpo" / "checkpoint-4" / "trainer_state.json").is_file():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint-4 within 120 s"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "manifest.json").exists()
    run = train_c3rl(labels, tiny_model_dir, out, config=config, progress=False)
    assert run.manifest["resumed"] is True
    resumed_from = run.manifest["grpo"]["resumed_from"]
    assert resumed_from is not None
    assert int(resumed_from.split("-")[1]) >= 4
    assert run.manifest["grpo"]["steps"] == 16
    # one logged step each, the ones before the checkpoint restored from it, not run again
    assert [entry["step"] for entry in run.manifest["grpo"]["reward_history"]] == list(range(1, 17))


def test_the_command_line_trains_and_refuses_with_a_one_line_error(
    trained: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from capgate.cli import app

    runner = CliRunner()
    labels = Path(trained.manifest["labels"]["path"])
    settings = tmp_path / "settings.yaml"
    settings.write_text("\n".join(f"{key}: {value}" for key, value in FAST.items()) + "\n")
    args = [
        "train",
        "c3rl",
        "--labels",
        str(labels),
        "--model",
        str(tiny_model_dir),
        "--config",
        str(settings),
    ]
    # the finished run is found again: same settings from the file
    done = runner.invoke(app, [*args, "--out", str(trained.out), "--no-progress"])
    assert done.exit_code == 0, done.output
    assert f"{trained.out}: 2 GRPO steps; merged model {trained.model}" in done.output
    # an override changes the settings: the run folder is another run's
    other = runner.invoke(app, [*args, "--out", str(trained.out), "--seed", "3"])
    assert other.exit_code == 2
    assert "holds another C3RL run" in other.output
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "x"), "--brier", "-1"])
    assert bad.exit_code == 2
    settings.write_text("stepz: 3\n")
    typo = runner.invoke(app, [*args, "--out", str(tmp_path / "x")])
    assert typo.exit_code == 2
    assert "bad training settings" in typo.output
    assert "stepz" in typo.output
