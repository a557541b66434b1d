"""One C3RL run: checks, a supervised warm start, GRPO with a LoRA adapter, merge, manifest.

``train_c3rl(labels, model, out)`` (and ``capgate train c3rl``) writes into ``out``:

- ``run.json``: what this folder trains (base fingerprint, data hash, settings); a rerun with the
  same ones resumes, any other is refused;
- ``warm_start/``: the adapter after the warm start (a rerun skips the warm start);
- ``grpo/checkpoint-N/``: TRL checkpoints every ``save_steps`` (a killed run resumes from the last);
- ``adapter/``: the final LoRA adapter (PEFT format, plus ``capgate_adapter.json``: the base
  fingerprint it needs, so :func:`capgate.local.lora.merge_lora` can merge it without PEFT);
- ``model/``: the base model with the adapter merged in, a plain transformers folder that
  :func:`capgate.local.models.load_model`, capgate's transformers backend and vLLM load;
- ``manifest.json``: base fingerprint, reward and training settings, data hash, steps, seed,
  timings and the evaluation on held-out labelled questions. Written last: its presence means done.

TRL, PEFT, torch and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capgate._util.atomic import atomic_write_json, fsync_dir, fsync_files
from capgate.errors import DataError, MissingExtraError
from capgate.local.lora import ADAPTER_PROVENANCE
from capgate.local.models import MODEL_METADATA_FILE, prepare_model, weights_fingerprint
from capgate.local.weights import sha256_file
from capgate.train.config import C3RLTrainConfig
from capgate.train.data import (
    LabelledExample,
    check_labels_harvest,
    check_labels_model,
    check_spread,
    grpo_rows,
    load_examples,
    split_examples,
    warm_answer_sources,
    warm_start_rows,
)
from capgate.train.evaluate import sample_completions, summarize
from capgate.train.rewards import REFERENCE_CLASSES, c3rl_reward_functions
from capgate.train.warm_start import warm_start

__all__ = ["MANIFEST_FILE", "RUN_FILE", "C3RLRun", "train_c3rl"]

RUN_FILE = "run.json"
MANIFEST_FILE = "manifest.json"
FORMAT = "capgate.train.c3rl"
VERSION = 1


@dataclass(frozen=True)
class C3RLRun:
    """What :func:`train_c3rl` wrote.

    Attributes:
        out: The run's folder.
        adapter: The LoRA adapter folder.
        model: The merged model folder (load it like any model folder).
        manifest: The manifest's contents.
    """

    out: Path
    adapter: Path
    model: Path
    manifest: dict[str, Any]


def trained_model_id(base_id: str, data_sha256: str, adapter: dict[str, Any]) -> str:
    """The trained model's id: the base's, then the labels' and the LoRA weights' digests (8 hex
    each), so two runs on the same labels with other settings or another seed never share one."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(adapter):
        tensor = adapter[name].detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype, bit for bit
    return f"{base_id}+c3rl-{data_sha256[:8]}-{digest.hexdigest()[:8]}"


def _model_id(name: str, folder: Path) -> str:
    """The id :func:`capgate.local.models.load_model` gives this model (what a harvest records)."""
    try:
        meta = json.loads((folder / MODEL_METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("model_id"), str):
        return str(meta["model_id"])
    if name != "default" and not Path(name).expanduser().exists():
        return name  # a hub id
    return str(folder.resolve())


def _claim_out(out: Path, identity: dict[str, Any]) -> bool:
    """Make ``out`` this run's folder; ``True`` when it already was (a resume).

    Raises:
        DataError: ``out`` holds another run, or files that are no C3RL run.
    """
    run_file = out / RUN_FILE
    if run_file.is_file():
        try:
            saved = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"unreadable run file: {exc}", path=run_file) from None
        differs = [key for key in identity if saved.get(key) != identity[key]]
        if differs:
            raise DataError(
                f"--out holds another C3RL run (its {', '.join(differs)} differ from this one's); "
                "rerun with the same model, labels and settings to resume it, or choose another --out",
                path=out,
            )
        return True
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(
            "--out exists and is not a C3RL run's folder (no run.json): choose an empty or new folder",
            path=out,
        )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_file, identity)
    return False


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but torch sees no CUDA device; use 'cpu' or 'auto'")
    return device


def _replace_folder(final: Path, write: Any) -> None:
    """``write(tmp)``, sync its files and itself to disk, then rename ``tmp`` to ``final`` (a kill or a
    crash never leaves half a folder, or a truncated file, under a manifest written after)."""
    tmp = final.with_name(f".{final.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    fsync_files(tmp)
    fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def _progress_callback(total: int, show: bool) -> Any:
    """A TRL callback drawing one progress bar with the mean of each reward term."""
    from transformers import TrainerCallback

    tqdm = importlib.import_module("tqdm.auto").tqdm

    short = {
        "correctness": "right",
        "calibration": "calib",
        "reference": "ref",
        "format": "fmt",
        "brier": "brier",
    }

    class RewardProgress(TrainerCallback):
        def __init__(self) -> None:
            self.bar: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if show:
                self.bar = tqdm(total=total, initial=state.global_step, desc="c3rl grpo", unit="step")

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if self.bar is None or not logs:
                return
            shown = {
                label: f"{logs[key]:+.2f}"
                for term, label in short.items()
                if (key := f"rewards/c3rl_{term}/mean") in logs
            }
            if "reward" in logs:
                shown["total"] = f"{logs['reward']:+.2f}"
            self.bar.set_postfix(shown, refresh=False)
            self.bar.n = state.global_step
            self.bar.refresh()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.bar is not None:
                self.bar.close()

    return RewardProgress()


@contextlib.contextmanager
def _quiet_deprecations() -> Iterator[None]:
    """Silence transformers' gradient-checkpointing rename warning, which TRL raises every step."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*", category=FutureWarning)
        yield


def _last_good_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint with its trainer state written and readable (a kill mid-save leaves one
    without, or with a truncated one); those after it are removed."""
    found = sorted(
        (p for p in folder.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
    )
    for checkpoint in reversed(found):
        state = checkpoint / "trainer_state.json"
        if state.is_file():
            try:
                if isinstance(json.loads(state.read_text(encoding="utf-8")), dict):
                    return checkpoint
                why = "not a JSON object"
            except (OSError, ValueError) as exc:
                why = str(exc)
            warnings.warn(
                f"{state}: unreadable trainer state ({why}); this checkpoint is removed and the run "
                "resumes from the one before it",
                stacklevel=2,
            )
        shutil.rmtree(checkpoint, ignore_errors=True)
    return None


def _grpo(
    model: Any, tokenizer: Any, train: list[LabelledExample], config: C3RLTrainConfig, out: Path, device: str,
    show: bool,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    import torch
    from datasets import Dataset

    trl = importlib.import_module("trl")
    folder = out / "grpo"
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
    with _quiet_deprecations():
        args = trl.GRPOConfig(
            output_dir=str(folder), max_steps=config.steps, learning_rate=config.lr,
            per_device_train_batch_size=config.prompts_per_step * config.num_generations,
            gradient_accumulation_steps=1, num_generations=config.num_generations,
            max_completion_length=config.max_completion_length, temperature=config.temperature, top_k=0,
            beta=config.kl_beta, logging_steps=1, save_strategy="steps", save_steps=config.save_steps,
            save_total_limit=2, report_to="none", use_cpu=device == "cpu", bf16=bf16, fp16=False,
            gradient_checkpointing=False, seed=config.seed, data_seed=config.seed, disable_tqdm=True,
            remove_unused_columns=False, dataloader_num_workers=0, log_completions=False,
        )  # fmt: skip
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=c3rl_reward_functions(config.rewards),
            args=args,
            train_dataset=Dataset.from_list(grpo_rows(train)),
            processing_class=tokenizer,
            callbacks=[_progress_callback(config.steps, show)],
        )
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our bar shows the logs
    resume = _last_good_checkpoint(folder) if folder.is_dir() else None
    started = time.perf_counter()
    with _quiet_deprecations():
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    history = [
        {key: value for key, value in entry.items() if key.startswith(("rewards/", "reward", "step", "loss"))}
        for entry in trainer.state.log_history
        if "reward" in entry
    ]
    report = {
        "steps": int(trainer.state.global_step),
        "seconds_this_run": time.perf_counter() - started,
        "resumed_from": resume.name if resume else None,
        "reward_history": history,
    }
    return trainer.model, report


def _warm_start(
    model: Any, tokenizer: Any, train: list[LabelledExample], config: C3RLTrainConfig, out: Path, show: bool
) -> dict[str, Any]:
    """Run (or skip, when done before) the warm start; save the adapter to ``out/warm_start``."""
    folder = out / "warm_start"
    report_file = folder / "warm_start.json"
    if report_file.is_file():
        return dict(json.loads(report_file.read_text(encoding="utf-8")))
    rows = warm_start_rows(
        train, confidence=config.warm_start_confidence, seed=config.seed, balance=config.warm_start_balance
    )
    started = time.perf_counter()
    losses: list[float] = []
    if config.warm_start_steps:
        bar = importlib.import_module("tqdm.auto").tqdm(
            total=config.warm_start_steps, desc="c3rl warm start", unit="step", disable=not show
        )
        losses = warm_start(
            model, tokenizer, rows, steps=config.warm_start_steps, lr=config.warm_start_lr,
            batch_size=config.warm_start_batch_size, seed=config.seed,
            on_step=lambda step, loss: _advance(bar, loss),
        )  # fmt: skip
        bar.close()
    report = {
        "steps": config.warm_start_steps,
        "rows": len(rows),
        "confidence": config.warm_start_confidence,
        "balanced": config.warm_start_balance,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "seconds": time.perf_counter() - started,
    }

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        atomic_write_json(tmp / "warm_start.json", report)

    _replace_folder(folder, write)
    return report


def _advance(bar: Any, loss: float) -> None:
    bar.update(1)
    bar.set_postfix(loss=f"{loss:.3f}", refresh=False)


def _evaluate(model: Any, tokenizer: Any, held_out: list[LabelledExample], config: C3RLTrainConfig) -> Any:
    if not held_out:
        return None
    completions = sample_completions(
        model, tokenizer, [e.messages for e in held_out], n=config.num_generations,
        max_new_tokens=config.max_completion_length, temperature=config.temperature, seed=config.seed,
    )  # fmt: skip
    return summarize(completions, [e.item for e in held_out])


def _versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in ("torch", "transformers", "trl", "peft"):
        try:
            found[name] = str(importlib.import_module(name).__version__)
        except (ImportError, AttributeError):
            found[name] = "not installed"
    return found


def train_c3rl(
    labels: str | os.PathLike[str],
    model: str | os.PathLike[str] = "default",
    out: str | os.PathLike[str] = "c3rl",
    *,
    config: C3RLTrainConfig | None = None,
    progress: bool | None = None,
) -> C3RLRun:
    """Train ``model`` with C3RL on ``labels``: warm start, then GRPO with a LoRA adapter.

    Args:
        labels: A labelled JSON-lines file from :func:`capgate.labels.harvest` of *this* model
            (its ``<labels>.meta.json`` names the model), with all three reference classes.
        model: ``"default"``, a model folder, a ``.gguf`` file or a hub id
            (see :func:`capgate.local.models.prepare_model`).
        out: The run's folder (see the module docstring); rerun to resume.
        config: The settings; default :class:`~capgate.train.config.C3RLTrainConfig`.
        progress: Show progress bars (with the reward terms) on stderr; ``None``: when stderr is
            a terminal.

    Returns:
        The folders written and the manifest.

    Raises:
        DataError: Labels without all three reference classes (in the questions left to train on
            once some are held out), labels harvested from another model, labels graded with their
            ``[confidence=X%]`` tag (a harvest with no confidence source), or an ``out`` that holds
            another run or other files.
        ValueError: ``device="cuda"`` without CUDA.
        MissingExtraError: The ``train`` extra (TRL, PEFT) is not installed.
    """
    config = config or C3RLTrainConfig()
    show = sys.stderr.isatty() if progress is None else progress
    labels, out = Path(labels), Path(out)
    name = os.fspath(model)
    folder = prepare_model(name)
    fingerprint, model_id = weights_fingerprint(folder), _model_id(name, folder)
    examples = load_examples(labels)
    check_spread(examples, path=labels)
    harvest_meta = check_labels_model(labels, model_id=model_id, fingerprint=fingerprint)
    limit = harvest_meta.get("max_tokens")
    examples = load_examples(labels, max_tokens=limit if isinstance(limit, int) else None)
    check_labels_harvest(examples, harvest_meta, labels=labels)
    train, held_out = split_examples(
        examples, eval_fraction=config.eval_fraction, eval_max=config.eval_max, seed=config.seed
    )
    spread = check_spread(train, path=labels, held_out=len(held_out))
    missing = [module for module in ("trl", "peft") if importlib.util.find_spec(module) is None]
    if missing:  # before anything is written
        raise MissingExtraError("train", missing, "C3RL training")
    identity = {
        "format": FORMAT, "version": VERSION, "base_weights_fingerprint": fingerprint,
        "data_sha256": sha256_file(labels), "config": config.model_dump(mode="json"),
    }  # fmt: skip
    resumed = _claim_out(out, identity)
    manifest_file = out / MANIFEST_FILE
    if manifest_file.is_file():
        return C3RLRun(
            out, out / "adapter", out / "model", json.loads(manifest_file.read_text(encoding="utf-8"))
        )
    harvest = {key: harvest_meta.get(key) for key in ("model_id", "k", "dataset", "keep_text", "confidence")}
    held_spread = {name: sum(e.reference == name for e in held_out) for name in REFERENCE_CLASSES}
    manifest = {
        **identity,
        "base_model": {"name": name, "model_id": model_id, "weights_fingerprint": fingerprint},
        "labels": {"path": str(labels.resolve()), "sha256": identity["data_sha256"], "n": len(examples),
                   "spread": spread, "harvest": harvest, "warm_start_answers": warm_answer_sources(train),
                   "spread_held_out": held_spread},
        "seed": config.seed,
        "resumed": resumed,
    }  # fmt: skip
    return _run(train, held_out, folder, out, config, show, manifest=manifest)


def _run(
    train: list[LabelledExample], held_out: list[LabelledExample], folder: Path, out: Path,
    config: C3RLTrainConfig, show: bool, manifest: dict[str, Any],
) -> C3RLRun:  # fmt: skip
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    peft = importlib.import_module("peft")
    device = _resolve_device(config.device)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    auto: Any = AutoModelForCausalLM
    base = auto.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True).to(device)
    evaluation_file = out / "evaluation_base.json"
    if not evaluation_file.is_file():
        atomic_write_json(evaluation_file, {"base": _evaluate(base, tokenizer, held_out, config)})
    torch.manual_seed(config.seed)
    if (out / "warm_start" / "warm_start.json").is_file():
        model = peft.PeftModel.from_pretrained(base, str(out / "warm_start"), is_trainable=True)
    else:
        lora = peft.LoraConfig(
            r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0, target_modules="all-linear",
            task_type="CAUSAL_LM",
        )  # fmt: skip
        model = peft.get_peft_model(base, lora)
    manifest["warm_start"] = _warm_start(model, tokenizer, train, config, out, show)
    manifest["grpo"] = {"steps": 0}
    if config.steps:
        model, manifest["grpo"] = _grpo(model, tokenizer, train, config, out, device, show)
    adapter_state = peft.get_peft_model_state_dict(model)
    trained_id = trained_model_id(manifest["base_model"]["model_id"], manifest["data_sha256"], adapter_state)

    def write_adapter(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        atomic_write_json(tmp / ADAPTER_PROVENANCE, {
            "model_id": trained_id, "base_weights_fingerprint": manifest["base_weights_fingerprint"],
            "base_model_id": manifest["base_model"]["model_id"], "data_sha256": manifest["data_sha256"],
            "c3rl": True,
        })  # fmt: skip

    _replace_folder(out / "adapter", write_adapter)
    merged = model.merge_and_unload()
    merged.eval()

    def write_model(tmp: Path) -> None:
        merged.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        atomic_write_json(
            tmp / MODEL_METADATA_FILE,
            {"format": 1, "model_id": trained_id, "source": {
                "c3rl": True, "base_model_id": manifest["base_model"]["model_id"],
                "base_weights_fingerprint": manifest["base_weights_fingerprint"]}},
        )  # fmt: skip

    _replace_folder(out / "model", write_model)
    base_evaluation = json.loads(evaluation_file.read_text(encoding="utf-8"))["base"]
    manifest |= {
        "trained_model": {"model_id": trained_id, "weights_fingerprint": weights_fingerprint(out / "model")},
        "outputs": {"adapter": "adapter", "model": "model"},
        "device": device,
        "versions": _versions(),
        "evaluation": {
            "held_out_questions": len(held_out),
            "samples_per_question": config.num_generations,
            "base": base_evaluation,
            "trained": _evaluate(merged, tokenizer, held_out, config),
        },
    }
    atomic_write_json(out / MANIFEST_FILE, manifest)
    return C3RLRun(out, out / "adapter", out / "model", manifest)
