"""C3RL on the embedded SmolLM2-135M-Instruct: does it learn to say how sure it is, and mean it?

Protocol (every phase resumes where a killed run stopped; rerun the same command):

1. **labels**: the base model answers graded arithmetic (``capgate.train.synthetic``; the training
   families, i.e. all but ``sub_2d``, on the *train* operand pairs) k=10 times per question, with
   the prompt it is trained and served with (question + "Answer with just the number.", the
   confidence instruction as the system turn), temperature 0.3, at most 24 tokens.
2. **train**: ``capgate.train.train_c3rl``: a supervised warm start (80 steps of 8, the reference
   classes balanced) on the model's own answers ending with ``[confidence=X%]`` (X = the
   question's µ̂ rounded to 5%), then 80 GRPO steps (1 question x 8 answers of at most 24 tokens,
   temperature 0.7, so a group's stated values vary) with a LoRA adapter (the paper's three terms
   and the format penalty, plus the optional Brier term at 0.5).
3. **test pools**: base and trained models each answer the *test* questions (other operand pairs of
   every family, and all of ``sub_2d``, never trained on) k=10 times, same prompt and sampling; the
   stated tags are read (``capgate.cas.verbalized_confidence``).
4. **report**: tag rate; accuracy with a 95% bootstrap interval, and the paired interval of the
   difference; AUROC of the stated confidence against correctness (tagged samples) with a 95%
   bootstrap interval over questions; Brier score against correctness; capability Brier of each
   question's mean stated confidence against the model's own µ̂ from its k=10; Brier skill against
   a constant base rate; the spread of the stated values; CAS (``capgate.cas.replay`` with the
   default stop rule, votes weighted by the tags) against majority vote at equal mean samples.
   Last line: ``c3rl: tag rate A -> B, AUROC C -> D [lo, hi], Brier E -> F (constant G), accuracy H -> I``.

Targets (issue 34): tag rate >= 95%; accuracy not lower (the difference's interval reaches 0 or
above); AUROC >= 0.70 with its interval above 0.5; Brier below the constant base rate.

Run: ``OMP_NUM_THREADS=1 nohup .venv/bin/python bench/c3rl.py > bench/data/c3rl/run.log 2>&1 &``
(one torch thread: on a shared two-core machine two spinning threads per process were slower;
about 30 minutes there with the labels cached: 8-14 min warm start, 15-25 min GRPO (LoRA rank 4
and 16), 3-4 min test pool);
``--ship DIR`` also stores the adapter as the package ships it (float16) and measures the test pool
again through capgate's own merge (run 4 wrote ``sdk/assets/c3rl_smollm2`` so);
``--smoke`` runs every phase in seconds on a tiny random-weight model
(``tests/test_train_bench.py`` runs it); ``--report-only`` recomputes the report from the files.
The labels and test pools land in ``bench/data/c3rl/``, the run (merged model included) in
``$TMPDIR/capgate-c3rl-bench-run``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from capgate.adapters.backends.transformers import load_backend
from capgate.cas import replay, verbalized_confidence
from capgate.core.types import LabelledQuery
from capgate.labels import harvest, meta_path, read_labelled
from capgate.metrics import auroc
from capgate.train.config import C3RLRewardConfig, C3RLTrainConfig
from capgate.train.synthetic import FAMILIES, TRAIN_FAMILIES, arithmetic_items, tagged_arithmetic_prompt
from capgate.train.trainer import train_c3rl

ROOT = Path(__file__).resolve().parent
SAMPLING = {"k": 10, "temperature": 0.3, "max_tokens": 24}
BENCH_CONFIG = C3RLTrainConfig(
    rewards=C3RLRewardConfig(brier=0.5),
    warm_start_steps=80,
    warm_start_batch_size=8,
    warm_start_balance=True,
    warm_start_lr=5e-4,
    steps=80,
    lr=1e-4,
    prompts_per_step=1,
    num_generations=8,
    max_completion_length=24,
    temperature=0.7,
    save_steps=10,
    eval_fraction=0.1,
    eval_max=8,
    lora_r=4,  # run 4: rank 4 (run 3 had 16), so the shipped adapter stays small
    lora_alpha=8,
    device="cpu",
)
SMOKE_CONFIG = C3RLTrainConfig(
    warm_start_steps=2,
    warm_start_batch_size=2,
    steps=2,
    prompts_per_step=1,
    num_generations=2,
    max_completion_length=6,
    temperature=0.5,
    save_steps=1,
    eval_fraction=0.2,
    eval_max=2,
    lora_r=2,
    lora_alpha=4,
    device="cpu",
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tiny_model(folder: Path) -> Path:
    """A random-weight 2-layer Llama with SmolLM2's tokenizer (the smoke run's model; weights as
    initialised, seed 0)."""
    from capgate.local.tiny import build_tiny_model

    return build_tiny_model(folder, seed=0, initializer_range=0.02, lm_head_std=None)


def harvest_pool(model: str | Path, items: list[Any], out: Path, sampling: dict[str, Any]) -> Path:
    backend = load_backend(model, device="cpu")
    started = time.perf_counter()
    report = harvest(
        backend,
        items,
        out,
        prompt=tagged_arithmetic_prompt,
        confidence=verbalized_confidence,
        keep_text=True,
        progress=False,
        batch_size=8,
        seed=0,
        dataset="capgate.train.synthetic",
        **sampling,
    )
    log(
        f"{out.name}: {report.n_new} new + {report.n_resumed} resumed questions, "
        f"{report.n_correct}/{report.n_samples} right this run, {time.perf_counter() - started:.0f} s"
    )
    return out


def force_spread(labels: Path) -> None:
    """Smoke only: a random model gets nothing right, so give its labels a spread by hand."""
    lines = []
    for index, line in enumerate(labels.read_text().splitlines()):
        record = json.loads(line)
        correct = (record["k"], 1, 0)[index % 3]
        for i, sample in enumerate(record["samples"]):
            sample["correct"] = i < correct
            sample["answer"] = record["references"][0] if i < correct else "0"
        record["correct"] = correct
        lines.append(json.dumps(record))
    labels.write_text("\n".join(lines) + "\n")


def bootstrap(stat: Any, n: int, *, seed: int = 0, reps: int = 2000) -> tuple[float, float]:
    """95% percentile interval of ``stat(indices)`` over question resamples (NaNs dropped)."""
    rng = np.random.default_rng(seed)
    values = [stat(rng.integers(0, n, n)) for _ in range(reps)]
    finite = np.array([v for v in values if v is not None and math.isfinite(v)])
    if not len(finite):
        return math.nan, math.nan
    return float(np.quantile(finite, 0.025)), float(np.quantile(finite, 0.975))


def pool_figures(records: list[LabelledQuery]) -> dict[str, Any]:
    """The report's figures for one model's test pool (each question's k samples)."""
    per_q = []
    for r in records:
        samples = r.samples or []
        stated = [s.confidence for s in samples]
        per_q.append(
            (
                np.array([s.correct for s in samples], float),
                np.array([math.nan if c is None else c for c in stated]),
            )
        )
    n = len(per_q)

    def tagged(idx: Any) -> tuple[np.ndarray, np.ndarray]:
        y = np.concatenate([per_q[i][0] for i in idx])
        p = np.concatenate([per_q[i][1] for i in idx])
        keep = ~np.isnan(p)
        return y[keep], p[keep]

    def auroc_of(idx: Any) -> float | None:
        y, p = tagged(idx)
        return float(auroc(p, y.astype(np.int64))) if 0 < y.sum() < len(y) else None

    everything = np.arange(n)
    y_all = np.concatenate([q[0] for q in per_q])
    y, p = tagged(everything)
    figures: dict[str, Any] = {
        "questions": n,
        "samples": len(y_all),
        "tag_rate": len(p) / len(y_all),
        "accuracy": float(y_all.mean()),
        "accuracy_ci": bootstrap(lambda idx: float(np.mean([per_q[i][0].mean() for i in idx])), n),
        "auroc": auroc_of(everything),
        "auroc_ci": bootstrap(auroc_of, n) if len(p) else (math.nan, math.nan),
    }
    if len(p):
        mu = np.array([q[0].mean() for q in per_q])
        mean_stated = np.array([np.nanmean(q[1]) if (~np.isnan(q[1])).any() else np.nan for q in per_q])
        has = ~np.isnan(mean_stated)
        figures |= {
            "brier": float(np.mean((p - y) ** 2)),
            "brier_constant": float(np.mean((y.mean() - y) ** 2)),
            "capability_brier": float(np.mean((mean_stated[has] - mu[has]) ** 2)),
            "capability_brier_constant": float(np.mean((mu[has].mean() - mu[has]) ** 2)),
            "stated_mean": float(p.mean()),
            "stated_std": float(p.std()),
            "stated_values": {
                f"{v:.2f}": int(c) for v, c in zip(*np.unique(p, return_counts=True), strict=True)
            },
        }
        figures["brier_skill"] = (
            1 - figures["brier"] / figures["brier_constant"] if figures["brier_constant"] else None
        )
    return figures


def cas_vs_majority(records: list[LabelledQuery], *, orders: int = 20) -> dict[str, float]:
    """CAS (default stop rule, tag-weighted votes) vs majority vote of the first N samples, at the
    CAS run's mean samples (linear interpolation between whole N), over seeded sample orders."""
    rng = np.random.default_rng(0)
    cas_acc, cas_n, fixed = [], [], {n: [] for n in range(1, 11)}
    for r in records:
        samples = list(r.samples or [])
        for _ in range(orders):
            order = [samples[i] for i in rng.permutation(len(samples))]
            result = replay(order, batch_size=2, initial_batch=2, seed=0)
            cas_acc.append(bool(result.correct))
            cas_n.append(result.samples_used)
            for n in fixed:
                votes: dict[str | None, int] = {}
                for s in order[:n]:
                    votes[s.answer] = votes.get(s.answer, 0) + 1
                winner = max(votes, key=lambda a: (a is not None, votes[a]))
                fixed[n].append(any(s.correct for s in order[:n] if s.answer == winner))
    mean_n = float(np.mean(cas_n))
    low = min(max(math.floor(mean_n), 1), 10)
    high = min(low + 1, 10)
    weight = mean_n - low if high > low else 0.0
    majority = (1 - weight) * np.mean(fixed[low]) + weight * np.mean(fixed[high])
    return {
        "cas_accuracy": float(np.mean(cas_acc)),
        "cas_mean_samples": mean_n,
        "majority_accuracy": float(majority),
    }


def fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def report(base_pool: Path, trained_pool: Path, run: Any) -> str:
    base = read_labelled(base_pool).records
    trained = read_labelled(trained_pool).records
    fb, ft = pool_figures(base), pool_figures(trained)
    acc_b = {r.id: r.correct / r.k for r in base}
    diffs = np.array([r.correct / r.k - acc_b[r.id] for r in trained])
    diff_ci = bootstrap(lambda idx: float(diffs[idx].mean()), len(diffs))
    held_out = [r for r in trained if r.id.split("-")[1] not in TRAIN_FAMILIES]
    rows = [("base", fb), ("trained", ft)]
    if held_out:
        rows.append(("trained, held-out family only", pool_figures(held_out)))
    lines = [
        f"run: {json.dumps({k: run.manifest[k] for k in ('warm_start', 'device')})}",
        f"grpo: {run.manifest['grpo'].get('steps')} steps; labels spread {run.manifest['labels']['spread']}",
    ]
    for name, f in rows:
        g = {key: fmt(f.get(key)) for key in ("tag_rate", "accuracy", "auroc", "brier", "brier_constant",
                                              "brier_skill", "capability_brier", "capability_brier_constant",
                                              "stated_mean", "stated_std")}  # fmt: skip
        acc_ci, auc_ci = (fmt(x) for x in f["accuracy_ci"]), (fmt(x) for x in f["auroc_ci"])
        lines.append(
            f"{name:>30}: questions {f['questions']}, samples {f['samples']}, tag rate {g['tag_rate']}, "
            f"accuracy {g['accuracy']} [{', '.join(acc_ci)}], AUROC {g['auroc']} [{', '.join(auc_ci)}], "
            f"Brier {g['brier']} (constant {g['brier_constant']}, skill {g['brier_skill']}), "
            f"capability Brier {g['capability_brier']} (constant {g['capability_brier_constant']}), "
            f"stated mean {g['stated_mean']} sd {g['stated_std']} values {f.get('stated_values')}"
        )
    lines.append(
        f"accuracy difference trained - base: {diffs.mean():+.3f} [{diff_ci[0]:+.3f}, {diff_ci[1]:+.3f}]"
    )
    if ft["tag_rate"]:
        cas = cas_vs_majority(trained)
        lines.append(
            f"CAS on the trained tags: accuracy {cas['cas_accuracy']:.3f} at "
            f"{cas['cas_mean_samples']:.2f} mean samples; majority vote at the same mean samples "
            f"{cas['majority_accuracy']:.3f}"
        )
    lines.append(
        f"c3rl: tag rate {fb['tag_rate']:.2f} -> {ft['tag_rate']:.2f}, AUROC {fmt(fb['auroc'], 2)} -> "
        f"{fmt(ft['auroc'], 2)} [{fmt(ft['auroc_ci'][0], 2)}, {fmt(ft['auroc_ci'][1], 2)}], Brier "
        f"{fmt(fb.get('brier'))} -> {fmt(ft.get('brier'))} (constant {fmt(ft.get('brier_constant'))}), "
        f"accuracy {fb['accuracy']:.3f} -> {ft['accuracy']:.3f}"
    )
    return "\n".join(lines)


def ship_adapter(run: Any, dest: Path) -> Path:
    """Write ``dest``: the run's adapter as capgate ships it (``capgate.local.lora``): its weights in
    float16, PEFT's config naming the base by capgate's model id, and ``capgate_adapter.json`` (the
    base fingerprint a merge checks, the run's settings and data hash)."""
    from safetensors.torch import load_file, save_file

    from capgate.local.lora import ADAPTER_CONFIG, ADAPTER_PROVENANCE, ADAPTER_WEIGHTS

    manifest = run.manifest
    dest.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(run.adapter / ADAPTER_WEIGHTS))
    save_file({k: v.half().contiguous() for k, v in tensors.items()}, str(dest / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})  # fmt: skip
    config = json.loads((run.adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = manifest["base_model"]["model_id"]
    (dest / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    provenance = {
        "model_id": manifest["trained_model"]["model_id"],
        "base_weights_fingerprint": manifest["base_weights_fingerprint"],
        "base_model_id": manifest["base_model"]["model_id"],
        "c3rl": True,
        "data_sha256": manifest["data_sha256"],
        "weights_dtype": "float16 (trained in float32)",
        "trained_by": "capgate train c3rl, bench/c3rl.py",
        "run": {key: manifest[key] for key in ("config", "warm_start", "seed", "versions") if key in manifest}
        | {"grpo_steps": manifest["grpo"].get("steps"), "labels_spread": manifest["labels"]["spread"]},
    }
    (dest / ADAPTER_PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="Every phase in seconds on a tiny random model.")
    parser.add_argument("--model", help="With --smoke: a tiny model folder to use instead of building one.")
    parser.add_argument("--data", type=Path, help="Where the labels, pools and run go.")
    parser.add_argument("--train-per-family", type=int, default=12)
    parser.add_argument("--test-per-family", type=int, default=6)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--ship", type=Path, help="Also write the trained adapter as capgate ships it (float16) into this "
        "folder, and harvest and report the test pool of the base with it merged in (capgate.local.lora; "
        "with --report-only too: that pool resumes where it stopped).",
    )  # fmt: skip
    args = parser.parse_args(argv)
    data = args.data or (
        Path(tempfile.mkdtemp(prefix="c3rl-smoke-")) if args.smoke else ROOT / "data" / "c3rl"
    )
    data.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        given = args.model or os.environ.get("CAPGATE_BENCH_TINY_MODEL")  # the test suite's tiny model
        model: str | Path = Path(given) if given else tiny_model(data / "tiny-model")
        config, sampling = SMOKE_CONFIG, {"k": 3, "temperature": 0.5, "max_tokens": 4}
        train_items = arithmetic_items(2, families=["add_1d", "mul_2d", "add_2d"], seed=0)
        test_items = arithmetic_items(1, families=["add_1d", "sub_2d"], split="test", seed=0)
        run_dir = data / "run"
    else:
        model, config, sampling = "default", BENCH_CONFIG, SAMPLING
        train_items = arithmetic_items(args.train_per_family, families=TRAIN_FAMILIES, seed=0)
        test_items = arithmetic_items(args.test_per_family, families=list(FAMILIES), split="test", seed=0)
        run_dir = Path(tempfile.gettempdir()) / "capgate-c3rl-bench-run"
    labels = data / "train_labels.jsonl"
    if not args.report_only:
        log(f"phase 1: labels ({len(train_items)} questions x k={sampling['k']})")
        harvest_pool(model, train_items, labels, sampling)
        if args.smoke and not meta_path(labels).with_suffix(".forced").exists():
            force_spread(labels)
            meta_path(labels).with_suffix(".forced").touch()
    log(
        f"phase 2: train ({config.warm_start_steps} warm-start steps, {config.steps} GRPO steps) "
        f"into {run_dir}"
    )
    started = time.perf_counter()
    run = train_c3rl(labels, model, run_dir, config=config, progress=False)
    log(f"trained in {time.perf_counter() - started:.0f} s this run; manifest {run.out / 'manifest.json'}")
    pools = (data / "test_base.jsonl", data / "test_trained.jsonl")
    if not args.report_only:
        log(f"phase 3: test pools ({len(test_items)} questions x k={sampling['k']}, base and trained)")
        harvest_pool(run.model, test_items, pools[1], sampling)
        harvest_pool(model, test_items, pools[0], sampling)
    log("phase 4: report")
    print(report(*pools, run), flush=True)
    if args.ship is not None:
        from capgate.local.lora import merge_lora
        from capgate.local.models import prepare_model

        shipped = ship_adapter(run, args.ship)
        merged = merge_lora(prepare_model(model), shipped, run_dir / "shipped-merged")
        log(f"phase 5: the shipped adapter ({shipped}), merged by capgate into {merged}: its test pool")
        shipped_pool = harvest_pool(merged, test_items, data / "test_shipped.jsonl", sampling)
        print("as shipped (float16 adapter, merged without PEFT):", flush=True)
        print(report(pools[0], shipped_pool, run), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
