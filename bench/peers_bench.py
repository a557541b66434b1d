"""Side by side with the peers: uqlm and LM-Polygraph on capgate's held-out queries, capgate's metrics.

The queries are the default probe's split of the embedded SmolLM2-135M-Instruct
(``sdk/assets/default_split.json`` + ``default_labels.jsonl``: the v1 harvest's 320 queries, µ̂
from k=40, and the v2 harvest's 1,040, µ̂ from k=20, all sampled at temperature 0.7, 24 tokens;
1,004 train / 356 held-out). Every method scores the exact prompt the labels were sampled under
(capgate's verbalized and P(True) judge the bare question, as in ``bench/estimators_smollm2.py``).
Each peer runs in its own venv (``scripts/peers-setup.sh``) through its own public API, in
``bench/peers/*_worker.py``:

* uqlm 0.6.7 (API-style: LangChain ``ChatOpenAI`` against the vLLM CPU server serving the same
  model folder, T=0.7, 24 tokens): ``WhiteBoxUQ`` sequence_probability (length-normalized: the
  normalized token probability), min_probability, mean/min_token_negentropy and
  probability_margin (top-15 logprobs), all from one generation; ``WhiteBoxUQ`` p_true (one
  generation + one judging call); ``BlackBoxUQ`` exact_match over 1 + k responses (raw strings,
  as uqlm compares them), and the same responses rescored by uqlm after capgate's task grader
  extracted their final answers (``BlackBoxUQ.score``); with ``--uqlm-panel``, ``LLMPanel`` with
  the model judging its own white-box answer (true_false_uncertain, continuous and likert templates
  and their average); ``WhiteBoxUQ`` monte_carlo_probability (1 + k generations with logprobs);
  last, ``UQEnsemble`` of every offline component (exact_match, min_probability,
  sequence_probability, monte_carlo_probability on those generations, plus the model as its own
  judge, whose score is also a row: uqlm's LLMJudge) with its weights tuned by
  ``tune_from_graded`` on the train queries' responses as capgate's grader grades them.
* LM-Polygraph 0.7.0 (white-box: the local HF folder ``capgate model prepare default`` prints,
  transformers on CPU, greedy, 24 tokens): MaximumSequenceProbability, Perplexity,
  MeanTokenEntropy (one generation); SelfCertainty, RenyiNeg, FisherRao, Mean(Conditional)
  PointwiseMutualInformation, BoostedProbSequence (a second greedy run); MahalanobisDistanceSeq,
  RDESeq and PPLMDSeq on the last-layer sequence embedding, fitted on the train split's embeddings
  (cross-fitted on train, see the worker); Verbalized2S (a follow-up asking the probability),
  Verbalized1S and Linguistic1S (guess + stated confidence) with the prompts of LM-Polygraph's own
  benchmark configs; with ``--polygraph-sampled``, its sampling estimators over 10 samples per
  query (PTrue, PTrueSampling, PTrueEmpirical, LexicalSimilarity, MonteCarlo(Normalized)Sequence
  Entropy, EigenScore: about 7-9 s per query on this 2-core CPU).
* capgate: the default probe (live on CPU, timed), the constant prior (train mean µ̂), and the
  verbalized, P(True) and Consistency(k=5) estimates of ``bench/estimators_smollm2.py``: with
  ``--run-capgate-baselines`` the bench runs it on the same server, over the same queries as the
  peers' black-box rows (held-out + the ``--peer-train`` subsample), caching in
  ``--capgate-results``; without it, the table reads whatever that folder holds.

Every raw score gets capgate's metrics (``bench/peers_table.py``), raw and after an isotonic
map fitted on the train split only, plus its cost per held-out query. ``--peer-train N`` runs
uqlm, LM-Polygraph and capgate's black-box baselines on the held-out queries plus a seeded
N of the train queries (they are slow on a 2-core CPU); the table says how many train queries
each isotonic map was fitted on. The probe and LM-Polygraph run at ``--threads`` torch threads
(default 1: on a shared CPU, oversubscribed threads slow both several-fold). Outputs are cached as
JSON lines in ``--results`` (a killed run resumes; ``--skip uqlm,polygraph,probe`` only prints the
table from the caches). Start a server first::

    bash scripts/peers-setup.sh
    CAPGATE_VLLM_STATE_DIR=$PWD/.vllm-peers CAPGATE_VLLM_MAX_MODEL_LEN=1024 \\
        bash scripts/vllm-server.sh start "$(.venv/bin/capgate model prepare default | tail -n 1)"
    .venv/bin/python bench/peers_bench.py --peer-train 300 --run-capgate-baselines
    CAPGATE_VLLM_STATE_DIR=$PWD/.vllm-peers bash scripts/vllm-server.sh stop
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cache import check_jsonl, installed_probe, probe_description
from _report import bench_parser
from estimators_smollm2 import CONSISTENCY_K, Record, forward_passes, read_records, read_split
from peers_table import Cost, Labels, MethodScores, format_table, headline, score_methods

from capgate import Estimate
from capgate.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "sdk" / "assets"
WORKERS = Path(__file__).resolve().parent / "peers"
POLYGRAPH_SAMPLES = 10  # LM-Polygraph's SamplingGenerationCalculator default
PTRUE_EMPIRICAL_SAMPLES = 10  # PTrueEmpirical's default num_samples
WB_SCORERS = (
    "sequence_probability",
    "min_probability",
    "mean_token_negentropy",
    "min_token_negentropy",
    "probability_margin",
)
NOT_RUN = (
    "uqlm semantic_negentropy, noncontradiction, entailment, semantic_sets_confidence (black-box) and "
    "semantic_negentropy, semantic_density (white-box): an NLI model (microsoft/deberta-large-mnli) "
    "from the HF hub; so also UQEnsemble's default (BS Detector) components, whose noncontradiction is NLI "
    "(the ensemble of the offline components is run)",
    "uqlm cosine_sim, consistency_and_confidence: a sentence-transformers model (all-MiniLM-L6-v2) "
    "from the hub; uqlm bert_score: roberta-large from the hub",
    "uqlm LLMJudge / LLMPanel with a judge other than the model itself: the only local model is the 135M "
    "under test (the model judging its own answers is run: uqlm's LLMJudge as the ensemble's judge, "
    "and LLMPanel's three templates with --uqlm-panel)",
    "LM-Polygraph SemanticEntropy(Token), NumSemSets, EigValLaplacian, DegMat, Eccentricity, LabelProb, "
    "KernelLanguageEntropy, LUQ, SemanticDensity, ClaimConditionedProbability: an NLI model from the hub; "
    "SAR, TokenSAR, SentenceSAR, CocoaMSP/PPL/MTE: a cross-encoder / sentence-similarity model from the hub; "
    "Focus: an IDF table built from a hub dataset",
    "LM-Polygraph AttentionScore, RAUQ, CSL: attention weights, which this model's SDPA attention does not "
    "return (the estimators fail on the empty tuple)",
    "LM-Polygraph RelativeMahalanobisDistanceSeq and PPLMDSeq's RMD variant: the embeddings of a "
    "background corpus, which LM-Polygraph's benchmark takes from the hub (a C4 sample); "
    "MaximumTokenProbability, TokenEntropy and the other token-level estimators: not sequence scores; "
    "the ensemble estimators (EPT*/PET*/EPS*/PES*): an ensemble of models",
)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Written whole, then renamed into place (a worker never reads half a file)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def read_jsonl(path: Path) -> dict[str, dict[str, Any]]:
    """Lines by id; a line cut short by a kill is skipped (the worker cuts it off and recomputes it)."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "id" not in row:
            raise DataError("no 'id'", path=path, line=number, field="id")
        out[str(row["id"])] = row
    return out


def worker(venv: str, script: str, *args: str) -> None:
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"error: {python} not found: run `bash scripts/peers-setup.sh` first")
    # No hub on this machine: fail at once instead of waiting on network time-outs.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([str(python), str(WORKERS / script), *args], check=True, env=env)


def server_of(args: argparse.Namespace) -> tuple[str, str]:
    if args.server:
        return args.server, args.served_model
    state = Path(args.vllm_state)
    try:
        return (state / "url").read_text().strip(), (state / "model").read_text().strip()
    except FileNotFoundError:
        raise SystemExit(
            f"error: no server state in {state} (url, model): start one, or pass --server"
        ) from None


# ---------------------------------------------------------------------- runs


def run_uqlm(
    args: argparse.Namespace, records: dict[str, Record], ids: list[str], test: list[str], model_dir: str
) -> None:
    from capgate.grading import grader_for

    url, model = server_of(args)
    res: Path = args.results
    peer_items = res / "items-uqlm.jsonl"
    write_jsonl(peer_items, [{"id": i, "prompt": records[i].prompt} for i in ids])
    common = ["--input", str(peer_items), "--base-url", url, "--model", model]

    def uqlm(mode: str, out: Path, *more: str) -> None:
        worker(".venv-uqlm", "uqlm_worker.py", "--mode", mode, "--out", str(out), *more)

    def whitebox(out: str, scorers: str, *more: str) -> None:
        uqlm("whitebox", res / out, "--scorers", scorers, *more, *common)

    whitebox("uqlm-whitebox.jsonl", ",".join(WB_SCORERS))
    whitebox("uqlm-ptrue.jsonl", "p_true")
    bb = res / f"uqlm-blackbox-k{args.k}.jsonl"
    uqlm("blackbox", bb, "-k", str(args.k), "--tokenizer", model_dir, *common)
    # The same responses with their final answers extracted by capgate's task grader.
    raw = read_jsonl(bb)
    rows = []
    for i in [i for i in ids if i in raw]:
        extract = grader_for(records[i].kind).extract
        texts = [raw[i]["response"], *raw[i]["sampled"]]
        answers = [extract(t) for t in texts]
        # No extracted answer never agrees with anything (as in capgate's Consistency).
        keyed = [a if a is not None else f"<no answer {j}>" for j, a in enumerate(answers)]
        rows.append({"id": i, "response": keyed[0], "sampled": keyed[1:]})
    extracted = res / "uqlm-extracted-in.jsonl"
    write_jsonl(extracted, rows)
    uqlm("rescore", res / f"uqlm-blackbox-k{args.k}-extracted.jsonl", "--input", str(extracted))
    if args.uqlm_panel:
        # the model judging its own white-box answers (LLMPanel, one judge per template)
        answered = read_jsonl(res / "uqlm-whitebox.jsonl")
        panel_in = res / "uqlm-panel-in.jsonl"
        judged = [i for i in ids if i in answered]
        write_jsonl(
            panel_in,
            [{"id": i, "prompt": records[i].prompt, "response": answered[i]["response"]} for i in judged],
        )
        uqlm("panel", res / "uqlm-panel.jsonl", "--input", str(panel_in), "--base-url", url, "--model", model)
    # the costliest white-box scorer last: 1 + k generations with logprobs
    mcp = res / f"uqlm-mcp-k{args.k}.jsonl"
    whitebox(mcp.name, "monte_carlo_probability", "-k", str(args.k))
    # uqlm's ensemble of its offline components on those generations, tuned on the train queries'
    # original responses as capgate's grader grades them
    generated = read_jsonl(mcp)
    items = dataset_items(args.labels, set(generated))
    train_ids = set(ids) - set(test)
    rows = []
    for i in [i for i in ids if i in generated]:
        g = generated[i]
        row = {k: g[k] for k in ("id", "response", "sampled", "logprob", "sampled_logprob")}
        row |= {"prompt": records[i].prompt, "split": "train" if i in train_ids else "test"}
        if i in train_ids:
            row["correct"] = grader_for(items[i]).grade(g["response"], items[i])
        rows.append(row)
    ensemble_in = res / "uqlm-ensemble-in.jsonl"
    write_jsonl(ensemble_in, rows)
    out = res / f"uqlm-ensemble-k{args.k}.jsonl"
    uqlm("ensemble", out, "--input", str(ensemble_in), "--base-url", url, "--model", model)


def dataset_items(labels: Path, ids: set[str]) -> dict[str, Any]:
    """The label file's queries as capgate :class:`~capgate.datasets.DatasetItem` (to grade answers)."""
    from capgate.demo.live import labelled_item
    from capgate.labels.labelled import iter_labelled

    return {r.id: labelled_item(r) for _, r in iter_labelled(labels) if r.id in ids}


def peer_ids(args: argparse.Namespace, train: list[str], test: list[str]) -> list[str]:
    """Held-out ids first, then all train ids or a seeded subsample of ``--peer-train``; with
    ``--peer-limit N``, only the first N of those."""
    keep = list(train)
    if 0 <= args.peer_train < len(train):
        rng = np.random.default_rng(args.seed)
        keep = [train[j] for j in sorted(rng.choice(len(train), args.peer_train, replace=False))]
    ids = [*test, *keep]
    return ids if args.peer_limit < 0 else ids[: args.peer_limit]


def run_polygraph(
    args: argparse.Namespace, records: dict[str, Record], ids: list[str], model_dir: str
) -> None:
    res: Path = args.results
    gen = res / "polygraph.jsonl"
    items = res / "items-polygraph.jsonl"
    write_jsonl(items, [{"id": i, "prompt": records[i].prompt} for i in ids])
    # the greedy pass (whose embeddings the density step reads), the information-based
    # estimators, and with --polygraph-sampled the 10-sample ones: one cache file each
    modes = {"generate": gen, "information": res / "polygraph-information.jsonl"}
    # LM-Polygraph's prompt-elicited estimators, each with the prompt of its own benchmark configs
    modes.update(
        {m: res / f"polygraph-{m}.jsonl" for m in ("verbalized-2s", "verbalized-1s", "linguistic-1s")}
    )
    if args.polygraph_sampled:
        modes["sampled"] = res / "polygraph-sampled.jsonl"
    for mode, out in modes.items():
        worker(
            ".venv-polygraph",
            "polygraph_worker.py",
            "--mode",
            mode,
            "--input",
            str(items),
            "--out",
            str(out),
            "--model-dir",
            model_dir,
            "--threads",
            str(args.threads),
            "--batch-size",
            str(args.polygraph_batch),
        )
    worker(
        ".venv-polygraph",
        "polygraph_worker.py",
        "--mode",
        "density",
        "--input",
        str(gen),
        "--out",
        str(res / "polygraph-density.jsonl"),
        "--split",
        str(args.split),
    )


def probe_of(args: argparse.Namespace) -> tuple[Path, str]:
    """The probe the live rows come from: the installed default one, or the smoke run's tiny one."""
    smoke: Path | None = getattr(args, "smoke_probe", None)
    if smoke is None:
        return installed_probe()
    from capgate.estimators.fingerprint import probe_fingerprint

    return smoke, probe_fingerprint(smoke)


def run_probe(
    args: argparse.Namespace, records: dict[str, Record], test: list[str]
) -> dict[str, dict[str, Any]]:
    """The shipped probe, live on CPU, on the held-out prompts (batches of 8), cached with the
    installed probe's fingerprint (``bench/_cache.py``: a cache from another probe is refused)."""
    path: Path = args.results / "probe-live.jsonl"
    folder, fingerprint = probe_of(args)
    check_jsonl(path, fingerprint, description=probe_description(folder))
    cached = read_jsonl(path)
    todo = [i for i in test if i not in cached]
    if todo:
        import torch

        from capgate.loading import load_estimator

        torch.set_num_threads(args.threads)  # as the polygraph worker: oversubscribed threads crawl

        model, probe = getattr(args, "smoke_model", None) or "default", getattr(args, "smoke_probe", None)
        estimator = load_estimator(model, device="cpu", batch_size=8, probe=probe)
        estimator.estimate([records[todo[0]].prompt])  # warm-up, not timed
        for start in range(0, len(todo), 8):
            batch = todo[start : start + 8]
            t0 = time.perf_counter()
            got = estimator.estimate([records[i].prompt for i in batch])
            share = (time.perf_counter() - t0) / len(batch)
            with path.open("a", encoding="utf-8") as handle:
                for i, e in zip(batch, got, strict=True):
                    handle.write(json.dumps({"id": i, "p": e.p, "wall_s": share}) + "\n")
        cached = read_jsonl(path)
    return cached


def capgate_baselines(folder: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Estimates of bench/estimators_smollm2.py by method (its caches), and notes on the files read."""
    out: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for method, pattern in (
        ("verbalized", "verbalized-*.jsonl"),
        ("p_true", "p_true-*.jsonl"),
        ("consistency", "consistency-prompt-*.jsonl"),
    ):
        files = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
        if method != "consistency" and len(files) > 1:
            notes.append(f"{method}: {len(files)} cache files in {folder}; read the newest, {files[-1].name}")
            files = files[-1:]
        merged: dict[str, Any] = {}
        for f in files:
            merged.update(read_jsonl(f))
        if merged:
            out[method] = merged
            notes.append(f"{method}: {len(merged)} estimates from {', '.join(f.name for f in files)}")
    return out, notes


def run_capgate_baselines(args: argparse.Namespace, ids: list[str], test: list[str], seed: int) -> None:
    """bench/estimators_smollm2.py on the peers' queries: held-out + the ``--peer-train`` sample."""
    url, model = server_of(args)
    held_out = set(test)
    train = [i for i in ids if i not in held_out]
    if 0 <= args.capgate_train < len(train):
        train = train[: args.capgate_train]
    split = args.results / f"capgate-split-{len(train)}.json"
    split.write_text(json.dumps({"seed": seed, "train": train, "test": test}), encoding="utf-8")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "estimators_smollm2.py"),
            "--server",
            url,
            "--served-model",
            model,
            "--labels",
            str(args.labels),
            "--split",
            str(split),
            "--verbalized-shots",
            "2",
            "--features",
            "/nonexistent",
            "--results",
            str(args.capgate_results),
        ],
        check=True,
    )


# ---------------------------------------------------------------------- table


def array(rows: dict[str, dict[str, Any]], ids: list[str], get: Any) -> Any:
    return np.array([np.nan if i not in rows or (v := get(rows[i])) is None else float(v) for i in ids])


def mean_cost(rows: dict[str, dict[str, Any]], test: list[str], *, forward: Any = None) -> Cost:
    got = [rows[i] for i in test if i in rows]
    gens = np.mean([r["generations"] for r in got])
    toks = np.mean([r["generated_tokens"] for r in got])
    fwd = np.mean([forward(r) if forward else max(r["generated_tokens"], r["generations"]) for r in got])
    return Cost(float(gens), float(toks), float(fwd), float(np.mean([r["wall_s"] for r in got])))


def summed_cost(parts: dict[str, list[tuple[dict[str, Any], float]]], test: list[str]) -> Cost:
    """:func:`mean_cost` of queries whose cost is a weighted sum of cached rows (``id -> [(row, weight)]``):
    e.g. a judged answer plus its judging call."""
    fields = ("generations", "generated_tokens", "wall_s")
    return mean_cost(
        {i: {f: sum(w * r[f] for r, w in rows) for f in fields} for i, rows in parts.items()}, test
    )


def build_methods(
    args: argparse.Namespace, train: list[str], test: list[str], mu_train: Any
) -> tuple[list[MethodScores], list[str]]:
    res: Path = args.results
    methods: list[MethodScores] = []
    notes: list[str] = []

    def add(
        name: str,
        family: str,
        sees: str,
        rows: dict[str, dict[str, Any]],
        get: Any,
        *,
        direction: str = "confidence",
        probability: bool = True,
        cost: Cost | None = None,
        calibrate: bool = True,
        forward: Any = None,
    ) -> None:
        if not rows:
            notes.append(f"{name}: no cached outputs (not run)")
            return
        train_scores, test_scores = array(rows, train, get), array(rows, test, get)
        n_train, n_test = int(np.isfinite(train_scores).sum()), sum(i in rows for i in test)
        if calibrate and not n_train:
            notes.append(
                f"{name}: no train query has a score ({n_test}/{len(test)} held-out run), so no isotonic "
                "map: left out of the table"
            )
            return
        methods.append(
            MethodScores(
                name,
                family,
                sees,
                train_scores,
                test_scores,
                direction,  # type: ignore[arg-type]
                probability,
                cost or mean_cost(rows, test, forward=forward),
                calibrate,
            )
        )

    # capgate
    prior = float(np.mean(mu_train))
    const = {i: {"p": prior} for i in [*train, *test]}
    add(
        "Constant prior",
        "capgate",
        "nothing (train mean µ̂)",
        const,
        lambda r: r["p"],
        cost=Cost(0, 0, 0, 0),
        calibrate=False,
    )
    if (res / "probe-live.jsonl").exists():  # written by the installed probe, or refused
        check_jsonl(res / "probe-live.jsonl", probe_of(args)[1])
    probe = read_jsonl(res / "probe-live.jsonl")
    add(
        "Probe",
        "capgate",
        "query only",
        probe,
        lambda r: r["p"],
        cost=Cost(0, 0, 1, float(np.mean([probe[i]["wall_s"] for i in test if i in probe] or [np.nan]))),
        calibrate=False,
    )
    base, base_notes = capgate_baselines(args.capgate_results)
    notes.extend(f"capgate {n}" for n in base_notes)
    for name, key, sees, n_per in (
        ("Verbalized", "verbalized", "question (judges itself, 1 reply)", 1),
        ("P(True)", "p_true", "question (1 token)", 1),
        (f"Consistency(k={CONSISTENCY_K})", "consistency", f"query + {CONSISTENCY_K} answers", CONSISTENCY_K),
    ):
        rows = base.get(key, {})
        est = {i: Estimate.model_validate(r["estimate"]) for i, r in rows.items()}
        cost = None
        have = [i for i in test if i in est]
        if have:
            cost = Cost(
                float(np.mean([est[i].cost.calls * n_per for i in have])),
                float(np.mean([est[i].cost.completion_tokens for i in have])),
                float(np.mean([forward_passes(est[i], n_per) for i in have])),
                float(np.mean([rows[i]["wall_s"] for i in have])),
            )
        add(name, "capgate", sees, {i: {"p": e.p} for i, e in est.items()}, lambda r: r["p"], cost=cost)
    # uqlm
    wb = read_jsonl(res / "uqlm-whitebox.jsonl")
    for s in WB_SCORERS:
        add(f"uqlm {s}", "peer", "query + 1 answer", wb, lambda r, s=s: r["scores"][s])
    mc = read_jsonl(res / f"uqlm-mcp-k{args.k}.jsonl")
    add(
        f"uqlm monte_carlo_probability (k={args.k})",
        "peer",
        f"query + {1 + args.k} answers (logprobs)",
        mc,
        lambda r: r["scores"]["monte_carlo_probability"],
    )
    panel = read_jsonl(res / "uqlm-panel.jsonl")
    judged = {i: {**wb[i], "panel": panel[i]} for i in panel if i in wb}

    def judged_cost(share: float) -> Cost:
        """The judged white-box answer plus ``share`` of the panel's judging (its judges run one
        after another, so one template's share of the wall time is 1/templates)."""
        return summed_cost({i: [(wb[i], 1.0), (panel[i], share)] for i in judged}, test)

    templates = list(next(iter(panel.values()))["scores"]) if panel else []
    for key in templates:  # each template's judge, then their average
        whole = key == "avg"
        add(
            f"uqlm LLMPanel self-judge ({'average of the judges' if whole else key})",
            "peer",
            "query + 1 answer (+1 judging call" + (" per template)" if whole else ")"),
            judged,
            lambda r, key=key: r["panel"]["scores"][key],
            cost=judged_cost(1.0 if whole else 1.0 / (len(templates) - 1)) if judged else None,
        )
    ens = read_jsonl(res / f"uqlm-ensemble-k{args.k}.jsonl")
    both = {i: (mc[i], ens[i]) for i in ens if i in mc}
    # the ensemble's self-judge component (uqlm's default true_false_uncertain judge), on its own: the
    # judged answer is the first of those generations; its cost that answer plus the judging call
    if both:
        add(
            "uqlm LLMJudge self-judge (true_false_uncertain)",
            "peer",
            "query + 1 answer (+1 judging call)",
            {i: e for i, (_, e) in both.items()},
            lambda r: r["scores"].get("judge_1"),
            # one of the 1 + k generations (their mean) plus the judging call
            cost=summed_cost(
                {i: [(m, 1.0 / m["generations"]), (e, 1.0)] for i, (m, e) in both.items()}, test
            ),
        )
    add(
        f"uqlm UQEnsemble (k={args.k}, tuned on train)",
        "peer",
        f"query + {1 + args.k} answers (logprobs) + 1 judging call",
        {i: e for i, (_, e) in both.items()},
        lambda r: r["scores"]["ensemble"],
        cost=summed_cost({i: [(m, 1.0), (e, 1.0)] for i, (m, e) in both.items()}, test) if both else None,
    )
    pt = read_jsonl(res / "uqlm-ptrue.jsonl")
    add("uqlm p_true", "peer", "query + 1 answer (+1 judging call)", pt, lambda r: r["scores"]["p_true"])
    bb = read_jsonl(res / f"uqlm-blackbox-k{args.k}.jsonl")
    sees_k = f"query + {1 + args.k} answers"
    add(f"uqlm exact_match (k={args.k}, raw text)", "peer", sees_k, bb, lambda r: r["scores"]["exact_match"])
    ex = read_jsonl(res / f"uqlm-blackbox-k{args.k}-extracted.jsonl")
    if bb and ex:
        add(
            f"uqlm exact_match (k={args.k}, capgate-extracted answers)",
            "peer",
            sees_k,
            ex,
            lambda r: r["scores"]["exact_match"],
            cost=mean_cost(bb, test),
        )
    # LM-Polygraph
    pg = read_jsonl(res / "polygraph.jsonl")
    add(
        "Polygraph MaximumSequenceProbability",
        "peer",
        "query + 1 greedy answer",
        pg,
        lambda r: (
            None
            if r["uncertainty"]["MaximumSequenceProbability"] is None
            else float(np.exp(-r["uncertainty"]["MaximumSequenceProbability"]))
        ),
    )
    add(
        "Polygraph Perplexity",
        "peer",
        "query + 1 greedy answer",
        pg,
        lambda r: (
            None if r["uncertainty"]["Perplexity"] is None else float(np.exp(-r["uncertainty"]["Perplexity"]))
        ),
    )
    add(
        "Polygraph MeanTokenEntropy",
        "peer",
        "query + 1 greedy answer",
        pg,
        lambda r: r["uncertainty"]["MeanTokenEntropy"],
        direction="uncertainty",
        probability=False,
    )

    def add_uncertainties(
        rows: dict[str, dict[str, Any]], names: dict[str, str], sees: str, cost: Cost | None = None
    ) -> None:
        for name, key in names.items():
            add(
                name,
                "peer",
                sees,
                rows,
                lambda r, key=key: r["uncertainty"][key],
                direction="uncertainty",
                probability=False,
                cost=cost,
                forward=lambda r: r["forward_passes"],
            )

    # the information-based estimators, named as the worker wrote them
    info = read_jsonl(res / "polygraph-information.jsonl")
    keys = list(next(iter(info.values()))["uncertainty"]) if info else []
    add_uncertainties(info, {f"Polygraph {k}": k for k in keys}, "query + 1 greedy answer")
    sampled = read_jsonl(res / "polygraph-sampled.jsonl")

    def sampled_cost(needs: str) -> Cost | None:
        """What one sampling estimator needs of the shared run: its generations, tokens and passes,
        and the run's wall time shared out by forward passes (they run in one UEManager pass)."""
        parts = []
        for i in test:
            if i not in sampled:
                continue
            r = sampled[i]
            # the greedy / sample token split (rows from before the worker stored it: the mean per
            # generation of the 1 greedy answer + 10 samples, an estimate)
            extra = PTRUE_EMPIRICAL_SAMPLES
            greedy = r.get("greedy_tokens", (r["generated_tokens"] - extra) / (1 + POLYGRAPH_SAMPLES))
            samples = r.get("sample_tokens", r["generated_tokens"] - extra - greedy)
            gens, toks, fwd = {
                "ptrue": (1, greedy, greedy + 1),
                "ptrue_sampling": (1 + POLYGRAPH_SAMPLES, greedy + samples, greedy + samples + 1),
                "ptrue_empirical": (1 + extra, greedy + extra, greedy + 1),
                "samples": (POLYGRAPH_SAMPLES, samples, samples),
            }[needs]
            parts.append((gens, toks, fwd, r["wall_s"] * fwd / r["forward_passes"]))
        return Cost(*(float(np.mean(c)) for c in zip(*parts, strict=True))) if parts else None

    def p_true_like(key: str, transform: Any) -> Any:
        return lambda r: (
            None if r["uncertainty"].get(key) is None else transform(float(r["uncertainty"][key]))
        )

    for name, key, sees, needs, transform in (
        ("PTrue", "PTrue", "query + 1 greedy answer (+1 judging pass)", "ptrue", lambda u: float(np.exp(-u))),
        (
            "PTrueSampling",
            "PTrueSampling",
            "query + 1 greedy answer + 10 samples (+1 judging pass)",
            "ptrue_sampling",
            lambda u: float(np.exp(-u)),
        ),
        (
            "PTrueEmpirical",
            "PTrueEmpirical",
            "query + 1 greedy answer (+10 sampled one-token judgements)",
            "ptrue_empirical",
            lambda u: 1.0 - u,
        ),
    ):
        add(f"Polygraph {name}", "peer", sees, sampled, p_true_like(key, transform), cost=sampled_cost(needs))
    from_samples = sampled_cost("samples")
    add_uncertainties(
        sampled,
        {
            "Polygraph LexicalSimilarity (ROUGE-L)": "LexicalSimilarity_rougeL",
            "Polygraph MonteCarloSequenceEntropy": "MonteCarloSequenceEntropy",
            "Polygraph MonteCarloNormalizedSequenceEntropy": "MonteCarloNormalizedSequenceEntropy",
        },
        "query + 10 samples",
        from_samples,
    )
    add_uncertainties(
        sampled, {"Polygraph EigenScore": "EigenScore"}, "query + 10 samples (hidden states)", from_samples
    )
    # the prompt-elicited estimators (LM-Polygraph's own prompts): 1 - uncertainty is the stated
    # confidence; a reply without a parsable one has no score (the note says how many)
    for name, mode, key, sees in (
        (
            "Polygraph Verbalized1S",
            "verbalized-1s",
            "Verbalized1S",
            "question (guess + probability, 1 reply)",
        ),
        ("Polygraph Linguistic1S", "linguistic-1s", "Linguistic1S", "question (guess + phrase, 1 reply)"),
        (
            "Polygraph Verbalized2S",
            "verbalized-2s",
            "Verbalized2S",
            "query + 1 greedy answer (+1 follow-up reply)",
        ),
    ):
        rows = read_jsonl(res / f"polygraph-{mode}.jsonl")
        scored = [i for i in test if i in rows and rows[i]["uncertainty"][key] is not None]
        have = [i for i in test if i in rows]
        if have and len(scored) < len(have):
            notes.append(
                f"{name}: a parsable confidence in {len(scored)} of {len(have)} held-out replies "
                "(LM-Polygraph scores the rest NaN; metrics are on the parsed ones)"
            )
        if have and not scored:
            notes.append(f"{name}: left out of the table (no held-out reply stated a confidence)")
            continue
        add(
            name,
            "peer",
            sees,
            rows,
            lambda r, key=key: None if r["uncertainty"][key] is None else 1.0 - float(r["uncertainty"][key]),
            forward=lambda r: r.get("forward_passes", r["generated_tokens"]),
        )
    md = read_jsonl(res / "polygraph-density.jsonl")
    for name, key in (
        ("Polygraph MahalanobisDistanceSeq", "MahalanobisDistanceSeq_decoder"),
        ("Polygraph RDESeq", "RDESeq_decoder"),
        ("Polygraph PPLMDSeq", "PPLMDSeq_decoder"),
    ):
        if pg and any(key in r["uncertainty"] for r in md.values()):
            add(
                name,
                "peer",
                "query + 1 greedy answer (hidden states)",
                md,
                lambda r, key=key: r["uncertainty"].get(key),
                direction="uncertainty",
                probability=False,
                cost=mean_cost(pg, test),
            )
    return methods, notes


def smoke(args: argparse.Namespace) -> None:
    """``--smoke``: a small slice of the split, outputs in a temporary folder, capgate's live probe on
    the tiny model and its tiny probe; the peers' workers (their venvs) and the server are left out."""
    from _smoke import left_out, smoke_dir, tiny_model, tiny_probe

    folder = smoke_dir("peers")
    split = json.loads(args.split.read_text(encoding="utf-8"))
    small = folder / "split.json"
    small.write_text(json.dumps({**split, "train": split["train"][:16], "test": split["test"][:8]}))
    args.split, args.results, args.capgate_results = small, folder / "results", None
    args.smoke_model = tiny_model(folder)
    args.smoke_probe = tiny_probe(args.smoke_model, folder)
    args.skip, args.run_capgate_baselines = "uqlm,polygraph", False
    left_out("the peers (uqlm, LM-Polygraph: their venvs and the vLLM server) and capgate's black-box rows")
    left_out("the embedded model and the shipped probe (a tiny model and a probe fitted for it)")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--labels", type=Path, default=ASSETS / "default_labels.jsonl")
    parser.add_argument("--split", type=Path, default=ASSETS / "default_split.json")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "peers")
    parser.add_argument(
        "--capgate-results",
        type=Path,
        default=None,
        help="bench/estimators_smollm2.py's cache folder (default: <--results>/capgate)",
    )
    parser.add_argument(
        "--server", default="", help="OpenAI-compatible base URL (else read from --vllm-state)"
    )
    parser.add_argument("--served-model", default="")
    parser.add_argument("--vllm-state", default=str(ROOT / ".vllm-peers"))
    parser.add_argument("-k", type=int, default=CONSISTENCY_K, help="sampled responses for exact_match")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (probe, polygraph)")
    parser.add_argument(
        "--peer-train",
        type=int,
        default=-1,
        help="run uqlm, LM-Polygraph and capgate's black-box baselines on the held-out queries and a "
        "seeded subsample of this many train queries (default: all; they are slow on a 2-core CPU): "
        "their isotonic maps and the density estimator are fitted on those",
    )
    parser.add_argument(
        "--peer-limit",
        type=int,
        default=-1,
        help="run the peers on only the first N of those queries (held-out first): a shorter run, whose "
        "isotonic maps are fitted on fewer train queries (cached rows beyond N are still read)",
    )
    parser.add_argument("--polygraph-batch", type=int, default=16, help="queries per UEManager run")
    parser.add_argument(
        "--uqlm-panel",
        action="store_true",
        help="also run uqlm's LLMPanel of three self-judges (true_false_uncertain, continuous, likert); "
        "the ensemble's own self-judge (true_false_uncertain) is always in the table. About 4.5 s per query "
        "here: the 135M model often misses the judging format and uqlm retries it up to 5 times",
    )
    parser.add_argument(
        "--polygraph-sampled",
        action="store_true",
        help="also run LM-Polygraph's sampling estimators (PTrue, PTrueSampling, PTrueEmpirical, "
        "LexicalSimilarity, MonteCarlo[Normalized]SequenceEntropy, EigenScore; 10 samples per query): "
        "7-9 s per query on a 2-core CPU",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", default="", help="comma list of uqlm,polygraph,probe to skip running")
    parser.add_argument(
        "--capgate-train",
        type=int,
        default=-1,
        help="with --run-capgate-baselines: only the first N of the peers' train queries (default: all)",
    )
    parser.add_argument(
        "--run-capgate-baselines",
        action="store_true",
        help="run bench/estimators_smollm2.py on the same server and queries (it resumes its caches)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: 16 train / 8 held-out queries, capgate's probe on a tiny model, no peers "
        "(a test runs it)",
    )
    args = parser.parse_args()
    if args.smoke:
        smoke(args)
    args.capgate_results = args.capgate_results or args.results / "capgate"
    skip = set(filter(None, args.skip.split(",")))
    args.results.mkdir(parents=True, exist_ok=True)

    records = read_records(args.labels)
    train, test, split_seed = read_split(args.split, records)
    ids = [*train, *test]
    write_jsonl(args.results / "items.jsonl", [{"id": i, "prompt": records[i].prompt} for i in ids])
    from capgate.local.models import prepare_model

    model_dir = str(getattr(args, "smoke_model", None) or prepare_model("default"))
    if "probe" not in skip:
        run_probe(args, records, test)
    if "polygraph" not in skip:
        run_polygraph(args, records, peer_ids(args, train, test), model_dir)
    if "uqlm" not in skip:
        run_uqlm(args, records, peer_ids(args, train, test), test, model_dir)
    if args.run_capgate_baselines:
        run_capgate_baselines(args, peer_ids(args, train, test), test, split_seed)
    mu_train = np.array([records[i].mu for i in train])
    labels = Labels(
        mu_train, np.array([records[i].correct for i in test]), np.array([records[i].k for i in test])
    )
    methods, notes = build_methods(args, train, test, mu_train)
    rows = score_methods(methods, labels)
    print(f"model: SmolLM2-135M-Instruct ({model_dir})")
    print(
        f"data: {args.labels.name}, split {args.split.name} (seed {split_seed}): {len(train)} train / "
        f"{len(test)} held-out, µ̂ from k={records[test[0]].k}; held-out mean µ̂ {labels.test_mu.mean():.3f}"
    )
    print("metrics on the held-out queries each method scores (n); iso = isotonic map fitted on train only;")
    print("cost per held-out query; wall: capgate probe and LM-Polygraph on local CPU transformers, uqlm and")
    print("capgate's black-box rows through the vLLM CPU server (requests in flight), on a shared 2-core CPU")
    for note in notes:
        print(note)
    print("not run:")
    for line in NOT_RUN:
        print(f"  {line}")
    print(format_table(rows))
    if args.smoke and not any(m.family == "peer" for m in methods):
        print("peers: no headline (no peer row: the peers were left out)")
        return
    print(headline(rows))


if __name__ == "__main__":
    main()
