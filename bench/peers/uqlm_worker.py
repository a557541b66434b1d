"""uqlm's scorers on capgate's queries, run inside ``.venv-uqlm`` (``scripts/peers-setup.sh``).

Driven by ``bench/peers_bench.py``; not imported by capgate. Reads ``--input`` (JSON lines:
``id``, ``prompt``), appends one JSON line per query to ``--out`` after each batch (a killed run
resumes: ids already in ``--out`` are skipped). Modes, each through uqlm's public API:

* ``whitebox``: ``WhiteBoxUQ(llm, scorers=...).generate_and_score(prompts, num_responses=k)``:
  one generation per query (plus one P(True) call when ``p_true`` is among the scorers, and k
  sampled responses when ``monte_carlo_probability`` is), logprobs from the server.
* ``blackbox``: ``BlackBoxUQ(llm, scorers=["exact_match"]).generate_and_score(prompts, k)``:
  one original response plus k sampled ones, raw strings compared as uqlm compares them.
* ``rescore``: ``BlackBoxUQ(scorers=["exact_match"]).score(responses, sampled_responses)`` on
  answers the caller already extracted (``--input`` lines carry ``response``, ``sampled``).
* ``panel``: ``LLMPanel(judges=[llm] * 3, scoring_templates=--templates).score(prompts, responses)``:
  the model judges its own answer (``--input`` lines carry ``response``: the white-box run's), one
  judge per uqlm template (true_false_uncertain, continuous, likert) and their average.
* ``ensemble``: ``UQEnsemble`` of the offline components, tuned on the train split (see
  :func:`run_ensemble`).

The LLM is LangChain's ``ChatOpenAI`` against an OpenAI-compatible server (vLLM). Prompts go as
one user message (a list of ``HumanMessage``), so uqlm adds no system prompt of its own: the
model sees what capgate's harvest sent it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from _jsonl import append_rows, read_rows


def clean(value: Any) -> Any:
    """JSON-safe floats (NaN -> None)."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if hasattr(value, "item"):
        return clean(value.item())
    return value


def make_llm(args: argparse.Namespace) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=args.model,
        base_url=args.base_url,
        api_key="none",
        temperature=args.temperature,
        top_p=1.0,
        max_tokens=args.max_tokens,
        logprobs=True,
        timeout=600,
        max_retries=2,
    )


def count_logprob_tokens(logprob: list[dict[str, Any]]) -> int:
    """Generated tokens in one response's logprobs (uqlm's per-token dicts)."""
    return sum(1 for t in logprob if t.get("logprob") is not None and not math.isnan(t["logprob"]))


def token_logprobs(logprob: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One response's logprobs without the top-k alternatives (what uqlm's scorers here read)."""
    return [{"token": t.get("token"), "logprob": clean(t.get("logprob"))} for t in logprob]


ENSEMBLE = ["exact_match", "min_probability", "sequence_probability", "monte_carlo_probability"]


async def run_ensemble(args: argparse.Namespace) -> None:
    """uqlm's ``UQEnsemble`` of every offline component, tuned on the train queries' graded answers.

    ``--input`` lines carry the monte_carlo_probability run's generations (``response``,
    ``sampled``, ``logprob``, ``sampled_logprob``), ``split`` and, for train, ``correct`` (the
    original response graded by the caller). The components: exact_match, min_probability,
    sequence_probability, monte_carlo_probability and the model judging its own answer (uqlm's
    default true_false_uncertain judge). ``UQEnsemble.score`` on the train queries, then
    ``tune_from_graded`` (uqlm's default ROC-AUC objective) fits the weights; the held-out queries
    are scored with those weights, in batches appended to ``--out``. The weights are written to
    ``--out`` + ``.weights.json`` after tuning, so a killed run resumes without tuning again.
    Train rows carry in-sample scores (the weights were fitted on them).
    """
    from uqlm import UQEnsemble

    items = read_rows(args.input)
    done = {r["id"] for r in read_rows(args.out)}
    weights_path = Path(str(args.out) + ".weights.json")
    llm = make_llm(args)

    def ensemble(weights: list[float] | None = None) -> Any:
        return UQEnsemble(llm=llm, scorers=[*ENSEMBLE, llm], weights=weights, use_best=False)

    async def scored(ens: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ensemble's score and each component's (judge_1: the self-judge), per query."""
        result = await ens.score(
            prompts=[r["prompt"] for r in batch],
            responses=[r["response"] for r in batch],
            sampled_responses=[r["sampled"] for r in batch],
            logprobs_results=[r["logprob"] for r in batch],
            sampled_logprobs_results=[r["sampled_logprob"] for r in batch],
            show_progress_bars=False,
        )
        data = result.to_dict()["data"]
        return [
            {"ensemble": clean(data["ensemble_scores"][j])}
            | {name: clean(data[name][j]) for name in ens.component_names}
            for j in range(len(batch))
        ]

    def append(batch: list[dict[str, Any]], scores: list[dict[str, Any]], share: float) -> None:
        # + the judging call, its tokens counted at the cap
        rows = [
            {
                "id": r["id"],
                "scores": v,
                "generations": 1,
                "generated_tokens": args.max_tokens,
                "wall_s": share,
            }
            for r, v in zip(batch, scores, strict=True)
        ]
        append_rows(args.out, rows)

    if weights_path.exists():
        weights = json.loads(weights_path.read_text(encoding="utf-8"))["weights"]
    else:
        train = [r for r in items if r["split"] == "train"]
        t0 = time.perf_counter()
        ens = ensemble()
        components = await scored(ens, train)
        tuned = ens.tune_from_graded([bool(r["correct"]) for r in train], show_progress_bars=False)
        weights = [float(w) for w in ens.weights]
        share = (time.perf_counter() - t0) / len(train)
        in_sample = tuned.to_dict()["data"]["ensemble_scores"]
        append(train, [c | {"ensemble": clean(x)} for c, x in zip(components, in_sample, strict=True)], share)
        weights_path.write_text(
            json.dumps({"components": ens.component_names, "weights": weights}), encoding="utf-8"
        )
        done |= {r["id"] for r in train}
        print(f"uqlm ensemble: tuned on {len(train)} train queries: {weights}", file=sys.stderr)
    todo = [r for r in items if r["id"] not in done]
    ens = ensemble(weights)
    for start in range(0, len(todo), args.batch_size):
        batch = todo[start : start + args.batch_size]
        t0 = time.perf_counter()
        scores = await scored(ens, batch)
        append(batch, scores, (time.perf_counter() - t0) / len(batch))
        print(f"uqlm ensemble: {start + len(batch)}/{len(todo)}", file=sys.stderr)


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


async def run_batch(
    args: argparse.Namespace, batch: list[dict[str, Any]], tokenizer: Any
) -> list[dict[str, Any]]:
    from langchain_core.messages import HumanMessage
    from uqlm import BlackBoxUQ, LLMPanel, WhiteBoxUQ

    if args.mode == "rescore":
        scorer = BlackBoxUQ(scorers=["exact_match"])
        result = scorer.score(
            responses=[r["response"] for r in batch],
            sampled_responses=[r["sampled"] for r in batch],
            show_progress_bars=False,
        )
        data = result.to_dict()["data"]
        return [
            {"id": r["id"], "scores": {"exact_match": clean(data["exact_match"][j])}}
            for j, r in enumerate(batch)
        ]

    llm = make_llm(args)
    if args.mode == "panel":
        templates = args.templates.split(",")
        # the model judges its own answers (uqlm's self-judging use of LLMPanel): one judge per template
        panel = LLMPanel(judges=[llm] * len(templates), scoring_templates=templates)
        result = await panel.score(
            prompts=[r["prompt"] for r in batch],
            responses=[r["response"] for r in batch],
            show_progress_bars=False,
        )
        data = result.to_dict()["data"]
        return [
            {
                "id": r["id"],
                "scores": {t: clean(data[f"judge_{n + 1}"][j]) for n, t in enumerate(templates)}
                | {"avg": clean(data["avg"][j])},
                # the judged answer is the white-box run's (its cost is that row's); + one judging
                # call per template (uqlm retries an unparsable judgement up to 5 times: not counted)
                "generations": len(templates),
                "generated_tokens": len(templates) * args.max_tokens,  # an upper bound, as p_true's
            }
            for j, r in enumerate(batch)
        ]
    prompts = [[HumanMessage(r["prompt"])] for r in batch]
    if args.mode == "whitebox":
        names = args.scorers.split(",")
        wb = WhiteBoxUQ(
            llm=llm, scorers=names, top_k_logprobs=args.top_k_logprobs, sampling_temperature=args.temperature
        )
        # num_responses: the k sampled responses of monte_carlo_probability (unused by the others)
        result = await wb.generate_and_score(prompts, num_responses=args.k, show_progress_bars=False)
        data = result.to_dict()["data"]
        sampled = "monte_carlo_probability" in names
        out = []
        for j, r in enumerate(batch):
            logprob = data.get("logprob", [None] * len(batch))[j] or []
            n_tok = count_logprob_tokens(logprob)
            if sampled:
                n_tok += sum(count_logprob_tokens(lp or []) for lp in data["sampled_logprob"][j])
            row = {
                "id": r["id"],
                "scores": {s: clean(data[s][j]) for s in names},
                "response": data["responses"][j],
                "generations": 1 + (args.k if sampled else 0) + (1 if "p_true" in names else 0),
                # uqlm does not return the judging reply: counted at max_tokens (upper bound)
                "generated_tokens": n_tok + (args.max_tokens if "p_true" in names else 0),
            }
            if sampled:  # kept for the ensemble, which scores these generations again
                row["sampled"] = data["sampled_responses"][j]
                row["logprob"] = token_logprobs(logprob)
                row["sampled_logprob"] = [token_logprobs(lp or []) for lp in data["sampled_logprob"][j]]
            out.append(row)
        return out
    bb = BlackBoxUQ(llm=llm, scorers=["exact_match"], sampling_temperature=args.temperature)
    result = await bb.generate_and_score(prompts, num_responses=args.k, show_progress_bars=False)
    data = result.to_dict()["data"]
    out = []
    for j, r in enumerate(batch):
        texts = [data["responses"][j], *data["sampled_responses"][j]]
        out.append(
            {
                "id": r["id"],
                "scores": {"exact_match": clean(data["exact_match"][j])},
                "response": data["responses"][j],
                "sampled": data["sampled_responses"][j],
                "generations": len(texts),
                "generated_tokens": sum(count_tokens(tokenizer, t) for t in texts),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mode", required=True, choices=["whitebox", "blackbox", "rescore", "panel", "ensemble"]
    )
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base-url", default="")
    parser.add_argument("--model", default="")
    parser.add_argument("--tokenizer", default="", help="HF folder, to count generated tokens (blackbox)")
    parser.add_argument("--scorers", default="sequence_probability,min_probability")
    parser.add_argument("--top-k-logprobs", type=int, default=15)
    parser.add_argument(
        "--templates", default="true_false_uncertain,continuous,likert", help="LLMPanel judges (panel mode)"
    )
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    import uqlm  # noqa: F401  (fail early, in this venv)

    tokenizer = None
    if args.mode == "blackbox":
        # The folder's tokenizer.json through `tokenizers` (its tokenizer_config.json names a
        # transformers 5 class that this venv's transformers < 5 cannot load).
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    asyncio.run(run_ensemble(args) if args.mode == "ensemble" else run_all(args, tokenizer))


async def run_all(args: argparse.Namespace, tokenizer: Any) -> None:
    """Every missing batch, in one event loop (LangChain's async clients are bound to their loop)."""
    items = read_rows(args.input)
    done = {r["id"] for r in read_rows(args.out)}
    todo = [r for r in items if r["id"] not in done]
    print(f"uqlm {args.mode}: {len(items) - len(todo)} cached, {len(todo)} to score", file=sys.stderr)
    for start in range(0, len(todo), args.batch_size):
        batch = todo[start : start + args.batch_size]
        t0 = time.perf_counter()
        rows = await run_batch(args, batch, tokenizer)
        share = (time.perf_counter() - t0) / len(batch)
        append_rows(args.out, [{**row, "wall_s": share} for row in rows])
        print(f"uqlm {args.mode}: {start + len(batch)}/{len(todo)} ({share:.2f} s/query)", file=sys.stderr)


if __name__ == "__main__":
    main()
