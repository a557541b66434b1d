"""LM-Polygraph's estimators on capgate's queries, run inside ``.venv-polygraph``.

Driven by ``bench/peers_bench.py``; not imported by capgate. Through LM-Polygraph's public API
(``WhiteboxModel``, ``UEManager``, ``Dataset``, ``register_default_stat_calculators``, the
estimator classes):

* ``generate``: the local HF folder as a ``WhiteboxModel`` (CPU, float32, chat template applied:
  ``instruct=True``), greedy decoding (LM-Polygraph's default), ``--max-tokens`` new tokens;
  one ``UEManager`` run per batch over ``Dataset(prompts)`` with ``MaximumSequenceProbability``,
  ``Perplexity`` and ``MeanTokenEntropy``; the sequence embedding (``embeddings_decoder``: last
  layer, mean over prompt and generated tokens) is kept for the density estimator. One JSON
  line per query is appended to ``--out`` after each batch (a killed run resumes).
* ``information``: the same greedy pass with LM-Polygraph's other information-based sequence
  estimators that run offline here: ``SelfCertainty``, ``RenyiNeg``, ``FisherRao``,
  ``MeanPointwiseMutualInformation`` and ``MeanConditionalPointwiseMutualInformation`` (one extra
  pass on the answer without the question), ``BoostedProbSequence``.
* ``sampled``: the same model, with LM-Polygraph's sampling-based estimators that run offline:
  ``PTrue`` (its own "is the possible answer true" prompt on the greedy answer),
  ``LexicalSimilarity`` (ROUGE-L between samples), ``MonteCarloSequenceEntropy`` and
  ``MonteCarloNormalizedSequenceEntropy``, over LM-Polygraph's default 10 samples per query
  (``SamplingGenerationCalculator``), drawn at ``--temperature`` (the labels' 0.7);
  ``PTrueSampling`` (the same judging prompt with the samples listed as brainstormed answers: one
  more pass), ``PTrueEmpirical`` (10 sampled one-token judgements of the greedy answer) and
  ``EigenScore`` (the samples' middle-layer last-token embeddings, from the same sampling run).
* ``density``: ``MahalanobisDistanceSeq``, ``RDESeq`` (kernel-PCA + robust covariance) and
  ``PPLMDSeq`` (the mean of the perplexity's and the Mahalanobis distance's ranks among the train
  queries') on those embeddings, fitted on the train ids only: held-out ids are scored by the estimator fitted
  on all train ids; each train id is scored by an estimator fitted on the other folds
  (``--folds``), so the train scores an isotonic map is fitted on are out-of-sample, like the
  held-out ones.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from _jsonl import append_rows, read_rows

ESTIMATORS = {
    "generate": ("MaximumSequenceProbability", "Perplexity", "MeanTokenEntropy"),
    "information": (
        "SelfCertainty",
        "RenyiNeg",
        "FisherRao",
        "MeanPointwiseMutualInformation",
        "MeanConditionalPointwiseMutualInformation",
        "BoostedProbSequence",
    ),
    "sampled": (
        "PTrue",
        "LexicalSimilarity",
        "MonteCarloSequenceEntropy",
        "MonteCarloNormalizedSequenceEntropy",
        "PTrueSampling",
        "PTrueEmpirical",
        "EigenScore",
    ),
}
# The prompt-elicited estimators, with the prompts and settings of LM-Polygraph's own benchmark
# configs (examples/configs/instruct/polygraph_eval_triviaqa_{verb_1s_top1,verb_2s_top1,ling_1s}.yaml
# in IINemo/lm-polygraph, zero-shot here): Verbalized1S and Linguistic1S answer a rewritten prompt
# (the instruction, then "Question: <the query>"); Verbalized2S asks its follow-up after the greedy
# answer to the labels' own prompt.
_GUESS = "Guess: <most likely guess, as short as possible; not a complete sentence, just the guess!>"
_PROBABILITY = (
    "<the probability between 0.0 and 1.0 that your guess is correct, without any extra commentary "
    "whatsoever; just the probability!>"
)
CONFIDENCE_REGEX = r"Probability: (\d+\.\d+)"
EXPRESSIONS = {
    "Almost Certain": 0.95,
    "Highly Likely": 0.9,
    "Very Good Chance": 0.8,
    "We Beleive": 0.75,  # (sic: LM-Polygraph's spelling, which its prompt lists too)
    "Probably": 0.7,
    "Probable": 0.7,
    "Likely": 0.7,
    "Better than Even": 0.6,
    "About Even": 0.5,
    "Probably Not": 0.25,
    "We Doubt": 0.2,
    "Unlikely": 0.2,
    "Little Chance": 0.1,
    "Chances Are Slight": 0.1,
    "Improbable": 0.1,
    "Highly Unlikely": 0.05,
    "Almost No Chance": 0.02,
}
PROMPTED: dict[str, dict[str, Any]] = {
    "verbalized-1s": {
        "estimator": ("Verbalized1S", {"confidence_regex": CONFIDENCE_REGEX}),
        "instruction": "Provide your best guess and the probability that it is correct (0.0 to 1.0) for the "
        "following question. Give ONLY the guess and probability, no other words or explanation. For "
        f"example:\n\n{_GUESS}\nProbability: {_PROBABILITY}",
        "max_new_tokens": 30,
    },
    "linguistic-1s": {
        "estimator": ("Linguistic1S", {"expressions": EXPRESSIONS}),
        "instruction": "Provide your best guess for the following question, and describe how likely it is "
        "that your guess is correct as one of the following expressions:\n\n"
        + "\n".join(EXPRESSIONS)
        + "\n\nGive ONLY the guess and your confidence, no other words or explanation. For example:\n\n"
        f"{_GUESS}\nConfidence: <description of confidence, without any extra commentary whatsoever; just "
        "a short phrase!>",
        "max_new_tokens": 40,
    },
    "verbalized-2s": {
        "estimator": (
            "Verbalized2S",
            {
                "confidence_prompt": "Provide the probability that your guess is correct. Give ONLY the "
                "probability, no other words or explanation.\n\nFor example:\n\nProbability: " + _PROBABILITY,
                "confidence_regex": CONFIDENCE_REGEX,
                "max_new_tokens": 10,
            },
        ),
        "instruction": None,  # the labels' prompt as it is
        "max_new_tokens": None,  # --max-tokens, as the labels
    },
}
PTRUE_EMPIRICAL_SAMPLES = 10  # PTrueEmpirical's default num_samples
DENSITY = ("MahalanobisDistanceSeq", "RDESeq", "PPLMDSeq")


def clean(value: Any) -> Any:
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def prompt_of(mode: str, prompt: str) -> str:
    """The text a mode's model call answers: the labels' prompt, or LM-Polygraph's instruction + it."""
    instruction = PROMPTED.get(mode, {}).get("instruction")
    return prompt if instruction is None else f"{instruction}\n\nQuestion: {prompt}\n"


def generate(args: argparse.Namespace) -> None:
    import lm_polygraph.estimators as est
    import torch
    from lm_polygraph import UEManager, WhiteboxModel
    from lm_polygraph.defaults.register_default_stat_calculators import register_default_stat_calculators
    from lm_polygraph.utils.builder_enviroment_stat_calculator import BuilderEnvironmentStatCalculator
    from lm_polygraph.utils.dataset import Dataset
    from lm_polygraph.utils.generation_parameters import GenerationParameters
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    items = read_rows(args.input)
    done = {r["id"] for r in read_rows(args.out)}
    todo = [r for r in items if r["id"] not in done]
    print(f"polygraph {args.mode}: {len(items) - len(todo)} cached, {len(todo)} to score", file=sys.stderr)
    if not todo:
        return
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    hf = AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32).eval()
    sampled = args.mode == "sampled"
    prompted = PROMPTED.get(args.mode)
    max_tokens = (prompted or {}).get("max_new_tokens") or args.max_tokens
    params = GenerationParameters(max_new_tokens=max_tokens, temperature=args.temperature)
    model = WhiteboxModel(
        hf, tokenizer, model_path=args.model_dir, generation_parameters=params, instruct=True
    )
    calculators = register_default_stat_calculators("Whitebox", output_attentions=False)
    for start in range(0, len(todo), args.batch_size):
        batch = todo[start : start + args.batch_size]
        t0 = time.perf_counter()
        if prompted:
            name, kwargs = prompted["estimator"]
            estimators = [getattr(est, name)(**kwargs)]
        else:
            estimators = [getattr(est, name)() for name in ESTIMATORS[args.mode]]
        manager = UEManager(
            Dataset(
                [prompt_of(args.mode, r["prompt"]) for r in batch], [""] * len(batch), batch_size=len(batch)
            ),
            model,
            estimators,
            builder_env_stat_calc=BuilderEnvironmentStatCalculator(model),
            available_stat_calculators=calculators,
            generation_metrics=[],
            ue_metrics=[],
            processors=[],
            ignore_exceptions=False,
            verbose=False,
            max_new_tokens=max_tokens,
            save_stats={"generate": ["embeddings_decoder"], "sampled": ["sample_tokens"]}.get(args.mode, []),
        )
        manager()
        share = (time.perf_counter() - t0) / len(batch)
        stats = manager.stats
        rows = []
        for j, r in enumerate(batch):
            tokens = len(stats["greedy_tokens"][j])
            row: dict[str, Any] = {
                "id": r["id"],
                "uncertainty": {str(e): clean(manager.estimations[e.level, str(e)][j]) for e in estimators},
                "response": stats["greedy_texts"][j],
                "wall_s": share,
            }
            if sampled:  # the greedy answer PTrue judges, plus the samples
                samples = stats["sample_tokens"][j]
                # + PTrueEmpirical's one-token judgements of the greedy answer
                row["generations"] = 1 + len(samples) + PTRUE_EMPIRICAL_SAMPLES
                row["generated_tokens"] = tokens + sum(len(t) for t in samples) + PTRUE_EMPIRICAL_SAMPLES
                # + one judging prompt pass each for PTrue, PTrueSampling and PTrueEmpirical
                # (its one-token samples share one prefill)
                row["forward_passes"] = tokens + sum(len(t) for t in samples) + 3
                row["greedy_tokens"], row["sample_tokens"] = tokens, sum(len(t) for t in samples)
            else:
                row["generations"] = 1
                row["generated_tokens"] = tokens
            if args.mode == "information":  # + the PMI estimators' pass on the bare answer
                row["forward_passes"] = tokens + 1
            if args.mode == "verbalized-2s":  # + the follow-up reply, counted at its cap (upper bound)
                follow_up = PROMPTED[args.mode]["estimator"][1]["max_new_tokens"]
                row["generations"] = 2
                row["generated_tokens"] = row["forward_passes"] = tokens + follow_up
            if args.mode == "generate":
                row["embedding"] = [float(x) for x in stats["embeddings_decoder"][j]]
            rows.append(row)
        append_rows(args.out, rows)
        print(
            f"polygraph {args.mode}: {start + len(batch)}/{len(todo)} ({share:.2f} s/query)", file=sys.stderr
        )


def density(args: argparse.Namespace) -> None:
    import lm_polygraph.estimators as est
    import numpy as np

    rows = {r["id"]: r for r in read_rows(args.input)}
    split = json.loads(args.split.read_text(encoding="utf-8"))
    test = list(split["test"])
    missing = [i for i in test if i not in rows]
    if missing:
        sys.exit(f"error: {args.input}: {len(missing)} held-out ids have no embedding, e.g. {missing[0]!r}")
    train = [i for i in split["train"] if i in rows]  # all, or the subsample the bench generated
    if len(train) < args.folds:
        sys.exit(f"error: {args.input}: {len(train)} train ids have an embedding; need >= {args.folds}")

    def log_likelihoods(ids: list[str]) -> list[list[float]]:
        # Perplexity (what PPLMDSeq reads of them) is minus the mean token log-likelihood, which
        # the greedy run stored; a one-token list with that mean gives PPLMDSeq the same value.
        return [[-rows[i]["uncertainty"]["Perplexity"]] for i in ids]

    def emb(ids: list[str]) -> Any:
        return np.array([rows[i]["embedding"] for i in ids], dtype=np.float32)

    def score(name: str, fit_ids: list[str], score_ids: list[str]) -> tuple[list[float], float]:
        t0 = time.perf_counter()
        estimator = getattr(est, name)(embeddings_type="decoder")  # a fresh, unfitted one
        stats = {"embeddings_decoder": emb(score_ids), "train_embeddings_decoder": emb(fit_ids)}
        if name == "PPLMDSeq":  # + the greedy answers' log-likelihoods, for its perplexity half
            stats["greedy_log_likelihoods"] = log_likelihoods(score_ids)
            stats["train_greedy_log_likelihoods"] = log_likelihoods(fit_ids)
        out = estimator(stats)
        return [clean(x) for x in np.asarray(out)], time.perf_counter() - t0

    rng = np.random.default_rng(args.seed)
    fold = rng.permutation(len(train)) % args.folds
    scores: dict[str, dict[str, Any]] = {i: {} for i in [*train, *test]}
    for name in DENSITY:
        test_scores, fit_s = score(name, train, test)
        for i, value in zip(test, test_scores, strict=True):
            scores[i][f"{name}_decoder"] = value
        for f in range(args.folds):
            held = [i for i, g in zip(train, fold, strict=True) if g == f]
            rest = [i for i, g in zip(train, fold, strict=True) if g != f]
            for i, value in zip(held, score(name, rest, held)[0], strict=True):
                scores[i][f"{name}_decoder"] = value
        print(
            f"polygraph density: {name} fit on {len(train)} train + score {len(test)} in {fit_s:.2f} s",
            file=sys.stderr,
        )
    with args.out.open("w", encoding="utf-8") as handle:
        for i in [*train, *test]:
            handle.write(json.dumps({"id": i, "uncertainty": scores[i]}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", required=True, choices=[*ESTIMATORS, *PROMPTED, "density"])
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", default="")
    parser.add_argument("--split", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.7, help="for the samples (sampled mode)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.mode in ESTIMATORS or args.mode in PROMPTED:
        generate(args)
    else:
        density(args)


if __name__ == "__main__":
    main()
