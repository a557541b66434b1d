"""A bigger default probe: harvest the embedded SmolLM2 on ~1,000 queries from six benchmarks.

The shipped probe (``bench/probe_smollm2.py``) was fit on 224 queries from two sources. This
bench harvests a larger, broader mix with the same prompts and sampling settings, refits, and
compares the refit with the shipped probe on two held-out sets. Steps, each resumable:

1. Query mix (offline, ``capgate.datasets``; grader = the default of each item's kind):
   ``basic_arithmetic`` easy / medium / hard ×120 each, TriviaQA ×200 (alias match), ARC-Easy
   ×140, ARC-Challenge ×100, MMLU ×140 (option letter), GSM8K ×100 (numeric final answer): 1,040
   queries, a seeded sample of each pool **after** removing the 320 queries of the shipped
   labels (so the shipped probe's 96 held-out queries stay out of every training set here) and
   prompts longer than 2,000 characters (a few long MMLU items; the server runs with a
   1,024-token context). Prompts: ``probe_smollm2.prompt_for`` (bare number / bare answer /
   option letter).
2. Harvest: k = 20 samples per query, temperature 0.7, top_p 1.0, max 24 tokens (the shipped
   labels' settings, so µ̂ means the same thing), through an OpenAI-compatible server
   (``--server``, the vLLM CPU server). Queries go in a seeded shuffled order, so a partial
   harvest is a random subset of every source. The output, ``bench/data/default_v2_labels.jsonl``
   (+ ``.meta.json``), lives in the repo; ``capgate.harvest`` appends and fsyncs per batch, so
   rerunning the same command resumes it.
3. Split: 25% of each source held out (seeded), fixed by id before any label is seen; written to
   ``bench/data/default_v2_split.json``. Training set = the other 75% plus the shipped probe's
   224 training queries (k = 40 labels, same settings).
4. Features (all layers' mean, last prompt token; the shipped probe's recipe) for every query,
   cached under ``--work``.
5. Fits ``LinearProbe`` (paper recipe, lr sweep) and a closed-form ridge on µ̂ (numpy; penalty
   chosen by 5-fold CV inside the training set, standardized features, predictions clipped to
   [0, 1]), and prints held-out tables on (a) the new held-out 25% and (b) the shipped split's
   96 held-out queries: shipped probe, new probes, constant prior (training mean µ̂).

``--install`` replaces ``sdk/assets`` (labels, split, probe) with the new ones, only if the
chosen new probe beats the shipped one in capability Brier on both held-out sets.

Run (the vLLM server as in ``scripts/vllm-server.sh``; ``--harvest-only`` stops after step 2)::

    CAPGATE_VLLM_STATE_DIR=$PWD/.vllm-server CAPGATE_VLLM_MAX_MODEL_LEN=1024 \\
        bash scripts/vllm-server.sh start "$(.venv/bin/capgate model prepare default | tail -n 1)"
    .venv/bin/python bench/default_probe_v2.py --server "$(cat .vllm-server/url)" \\
        --served-model "$(cat .vllm-server/model)" --harvest-only      # resumable
    .venv/bin/python bench/default_probe_v2.py --server "$(cat .vllm-server/url)" \\
        --served-model "$(cat .vllm-server/model)" [--install]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from probe_smollm2 import ASSETS, ROOT, build_items, make_backend, prompt_for

from capgate.datasets import DatasetItem
from capgate.harvest import harvest
from capgate.labels import read_labelled

DATA = ROOT / "bench" / "data"
SOURCES_V2 = {
    "basic_arithmetic:easy": 120,
    "basic_arithmetic:medium": 120,
    "basic_arithmetic:hard": 120,
    "triviaqa": 200,
    "arc_easy": 140,
    "arc_challenge": 100,
    "mmlu": 140,
    "gsm8k": 100,
}
MAX_PROMPT_CHARS = 2000
HELD_OUT_FRACTION = 0.25


def shipped_ids() -> set[str]:
    """Ids of every query in the shipped labels (train and held-out)."""
    return {record.id for record in read_labelled(ASSETS / "default_labels.jsonl").records}


def build_mix(seed: int) -> tuple[list[DatasetItem], dict[str, str]]:
    """The new queries in harvest order (seeded shuffle), and each id's source."""
    excluded = shipped_ids()

    def keep(item: DatasetItem) -> bool:
        return item.id not in excluded and len(prompt_for(item)) <= MAX_PROMPT_CHARS

    items = build_items(1.0, seed, sources=SOURCES_V2, keep=keep)
    names = [name for name, count in SOURCES_V2.items() for _ in range(count)]
    source = {item.id: name for item, name in zip(items, names, strict=True)}
    if len(source) != len(items):
        raise SystemExit("error: the mix has repeated ids across sources")
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[j] for j in order], source


def split_ids(source: dict[str, str], seed: int) -> dict[str, list[str]]:
    """Hold out ``HELD_OUT_FRACTION`` of each source (seeded), by id, before labels exist."""
    rng = np.random.default_rng(seed + 1)
    train: list[str] = []
    test: list[str] = []
    for name in SOURCES_V2:
        ids = sorted(i for i, s in source.items() if s == name)
        order = rng.permutation(len(ids))
        n_test = round(HELD_OUT_FRACTION * len(ids))
        test.extend(ids[j] for j in order[:n_test])
        train.extend(ids[j] for j in order[n_test:])
    return {"train": train, "test": test}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "default_v2")
    parser.add_argument("--labels", type=Path, default=DATA / "default_v2_labels.jsonl")
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server", help="OpenAI-compatible base URL (e.g. a vLLM server) to sample from")
    parser.add_argument("--served-model", help="model name on the server")
    parser.add_argument("--harvest-only", action="store_true", help="stop after the harvest")
    parser.add_argument("--no-harvest", action="store_true", help="use what is harvested so far (partial)")
    parser.add_argument("--install", action="store_true", help="install into sdk/assets if it wins")
    args = parser.parse_args()

    items, source = build_mix(args.seed)
    split = split_ids(source, args.seed)
    DATA.mkdir(parents=True, exist_ok=True)
    split_path = args.labels.with_name("default_v2_split.json")
    split_path.write_text(json.dumps({"seed": args.seed, "source": source, **split}, indent=0) + "\n")

    if not args.no_harvest:
        backend = make_backend(args.server, args.served_model)
        start = time.perf_counter()
        report = harvest(
            backend, items, args.labels, k=args.k, temperature=args.temperature, top_p=args.top_p,
            max_tokens=args.max_tokens, seed=None if args.server else args.seed,
            batch_size=args.batch_size, prompt=prompt_for,
            dataset="smollm2-mix-v2:" + ",".join(f"{n}={c}" for n, c in SOURCES_V2.items()),
        )  # fmt: skip
        elapsed = time.perf_counter() - start
        print(
            f"harvest: {report.n_new} new queries, {report.n_samples} samples in {elapsed:.1f} s = "
            f"{report.n_samples / max(elapsed, 1e-9):.2f} samples/s; {report.n_resumed} resumed"
        )
    if args.harvest_only:
        return


if __name__ == "__main__":
    main()
