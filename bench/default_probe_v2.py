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
   (+ ``.meta.json``), lives in the repo; ``capgate.labels.harvesting`` appends and fsyncs per batch, so
   rerunning the same command resumes it.
3. Split: 25% of each source held out (seeded), fixed by id before any label is seen; written to
   ``bench/data/default_v2_split.json``. Training set = the other 75% plus the shipped probe's
   224 training queries (k = 40 labels, same settings).
4. Features: the last prompt token's hidden state at every layer (embeddings + 30 layers) for
   every query, cached under ``--work``; their mean over layers is the shipped probe's recipe.
5. Fits the new trainer, ``ProbeSearch`` (per-layer features; layer set, solver — ridge or L2
   logistic — and strength chosen by inner 5-fold CV on the training set only): the candidate
   installed, fixed before any held-out score is seen. For context, ``LinearProbe`` (paper recipe,
   lr sweep, all-layer mean) and a closed-form ridge on µ̂ (numpy; penalty
   chosen by 5-fold CV inside the training set, standardized features, predictions clipped to
   [0, 1]), and prints held-out tables on (a) the new held-out 25% and (b) the shipped split's
   96 held-out queries: shipped probe, new probes, constant prior (training mean µ̂).

``--install`` replaces ``sdk/assets`` (labels, split, probe) with the new ones, only if the
chosen new probe beats the shipped one in capability Brier on both held-out sets.

Run (the vLLM CPU server of ``scripts/vllm-server.sh``: a 1,024-token context for the longer
prompts; 32-token KV blocks so that the 20 samples of a prompt share its prefill through the prefix
cache; its one OpenMP thread on core 1, away from other servers, which bind to core 0). The
harvest step is resumable: rerun the same command and it continues where it stopped::

    export CAPGATE_VLLM_STATE_DIR=$PWD/.vllm-server CAPGATE_VLLM_MAX_MODEL_LEN=1024 \\
        CAPGATE_VLLM_EXTRA_ARGS="--block-size 32" VLLM_CPU_OMP_THREADS_BIND=1
    bash scripts/vllm-server.sh start "$(.venv/bin/capgate model prepare default | tail -n 1)"
    .venv/bin/python bench/default_probe_v2.py --server "$(cat .vllm-server/url)" \\
        --served-model "$(cat .vllm-server/model)" --harvest-only      # resumes bench/data/...
    .venv/bin/python bench/default_probe_v2.py --no-harvest [--install]  # features, fits, tables
    bash scripts/vllm-server.sh stop

``--no-harvest`` evaluates on what is harvested so far and labels the tables PARTIAL; ``--install``
refuses a partial harvest.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from _report import bench_parser
from probe_smollm2 import ASSETS, ROOT, build_items, make_backend, prompt_for

from capgate import LabelledQuery
from capgate.datasets import DatasetItem
from capgate.labels.harvesting import harvest
from capgate.labels.labelled import read_labelled
from capgate.metrics.table import CalibrationRow, calibration_row, format_table

DATA = ROOT / "bench" / "data"
V1 = DATA / "default_v1"  # the shipped probe and split before this bench: probe/, split.json
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
NEW_PROBE = "ProbeSearch v2 + claim invariance"
INVARIANCE_ENERGY = 0.9
N_EDITS = 120
"""The candidate installed: chosen before any held-out query is scored (the others are context)."""
HELD_OUT_FRACTION = 0.25


class PerLayerLast:
    """Rows = the last prompt token's state at every layer, ``(n, 31, 576)``, for the feature cache."""

    def __init__(self, featurizer: Any) -> None:
        from capgate.estimators._common import spec_as_dict

        self.featurizer = featurizer
        self._spec = {**spec_as_dict(featurizer.spec), "per_layer": True}

    @property
    def spec(self) -> dict[str, Any]:
        return self._spec

    def transform(self, queries: list[Any]) -> np.ndarray:
        out: np.ndarray = self.featurizer.transform_layers(queries)
        return out


def claim_edits(pool: list[str], prompts: dict[str, str], seed: int) -> tuple[list[str], list[str]]:
    """``N_EDITS`` training queries (seeded), each with one claim of the TUNE grammar at a random place.

    Only text of ``injection_families.tune_claims`` is used, so the injection bench's EVAL families
    stay unseen by the fit.
    """
    from injection_families import tune_claims

    rng = np.random.default_rng(seed + 2)
    claims = tune_claims(seed=seed)
    ids = sorted(str(q) for q in rng.choice(pool, size=min(N_EDITS, len(pool)), replace=False))
    placements = ("{q} {c}", "{c} {q}", "{q}\n{c}", "{c}\n{q}", "{q}\n\n{c}")
    edited = [
        placements[int(rng.integers(len(placements)))].format(
            q=prompts[q], c=claims[int(rng.integers(len(claims)))]
        )
        for q in ids
    ]
    return ids, edited


def v1_split() -> dict[str, list[str]]:
    """The shipped probe's split (a copy kept here, so installing new assets changes nothing)."""
    split: dict[str, list[str]] = json.loads((V1 / "split.json").read_text(encoding="utf-8"))
    return split


def shipped_ids() -> set[str]:
    """Ids of every query of the shipped (v1) labels: its 224 training and 96 held-out queries."""
    split = v1_split()
    return set(split["train"]) | set(split["test"])


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
    parser = bench_parser(__doc__)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "default_v2")
    parser.add_argument("--labels", type=Path, default=DATA / "default_v2_labels.jsonl")
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=32, help="queries per request wave (and fsync)")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight to the server")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server", help="OpenAI-compatible base URL (e.g. a vLLM server) to sample from")
    parser.add_argument("--served-model", help="model name on the server")
    parser.add_argument("--harvest-only", action="store_true", help="stop after the harvest")
    parser.add_argument("--no-harvest", action="store_true", help="use what is harvested so far (partial)")
    parser.add_argument("--install", action="store_true", help="install into sdk/assets if it wins")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: 24 queries of the mix harvested from the suite's server or an in-process fake one, "
        "features of a tiny model, every fit and table; outputs in a temporary folder (a test runs it)",
    )
    args = parser.parse_args()
    args.model, args.shipped = "default", V1 / "probe"
    if not args.smoke:
        run(args)
        return
    from _smoke import left_out, openai_server, smoke_dir, tiny_model, tiny_probe

    folder = smoke_dir("default-v2")
    args.work, args.labels = folder / "work", folder / "default_v2_labels.jsonl"
    args.harvest_only = args.no_harvest = args.install = False
    args.model = tiny_model(folder)
    args.shipped = tiny_probe(args.model, folder)
    left_out("the embedded model and the shipped probe (a tiny model and a probe fitted for it); --install")
    with openai_server(args.server, args.served_model) as (args.server, args.served_model):
        run(args, limit=24)


def run(args: argparse.Namespace, limit: int | None = None) -> None:
    items, source = build_mix(args.seed)
    split = split_ids(source, args.seed)
    if limit is not None:  # the harvest order is a seeded shuffle: a prefix mixes every source
        items = items[:limit]
        split = {part: [q for q in ids if any(q == i.id for i in items)] for part, ids in split.items()}
    split_path = args.labels.with_name("default_v2_split.json")
    split_path.parent.mkdir(parents=True, exist_ok=True)
    split_path.write_text(json.dumps({"seed": args.seed, "source": source, **split}, indent=0) + "\n")

    if not args.no_harvest:
        backend = make_backend(args.server, args.served_model, concurrency=args.concurrency)
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
    evaluate(args, items, split)


def ridge_cv(
    X: np.ndarray, y: np.ndarray, *, alphas: np.ndarray, folds: int, seed: int
) -> tuple[float, np.ndarray, float, np.ndarray, np.ndarray]:
    """Ridge on µ̂ (standardized X; penalty by ``folds``-fold CV on Brier of clipped predictions).

    Returns the chosen alpha, the weights, the intercept, and the features' mean and scale.
    """

    def path(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, float, list[np.ndarray]]:
        """Weights for every alpha from one SVD of the centred features."""
        centre = x.mean(0)
        u, sv, vt = np.linalg.svd(x - centre, full_matrices=False)
        proj = u.T @ (t - t.mean())
        return centre, float(t.mean()), [vt.T @ ((sv / (sv**2 + a)) * proj) for a in alphas]

    mean, scale = X.mean(0), X.std(0) + 1e-8
    z = (X - mean) / scale
    fold = np.random.default_rng(seed).permutation(len(y)) % folds
    errors = np.zeros(len(alphas))
    for f in range(folds):
        centre, offset, weights = path(z[fold != f], y[fold != f])
        held = z[fold == f] - centre
        for j, w in enumerate(weights):
            errors[j] += float(np.sum((np.clip(held @ w + offset, 0, 1) - y[fold == f]) ** 2))
    best = int(np.argmin(errors))
    centre, offset, weights = path(z, y)
    w = weights[best]
    return float(alphas[best]), w, offset - float(centre @ w), mean, scale


def paired_brier_interval(
    p_new: np.ndarray, p_old: np.ndarray, mu: np.ndarray, seed: int
) -> tuple[float, float]:
    """95% bootstrap interval of Brier(new) − Brier(old), resampling queries."""
    diff = (p_new - mu) ** 2 - (p_old - mu) ** 2
    rng = np.random.default_rng(seed)
    means = [float(np.mean(diff[rng.integers(0, len(diff), len(diff))])) for _ in range(2000)]
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def markdown(rows: list[CalibrationRow], title: str) -> str:
    cell = lambda v: "n/a" if v != v else f"{v:.4f}"  # noqa: E731
    lines = [f"| {title} | n | mean µ̂ | cap. Brier | ECE | AUROC | Spearman |", "| --- |" + " --- |" * 6]
    for r in rows:
        lines.append(
            f"| {r.source} | {r.n} | {cell(r.accuracy)} | {cell(r.capability_brier)} | {cell(r.ece)} | "
            f"{cell(r.auroc)} | {cell(r.spearman)} |"
        )
    return "\n".join(lines)


def evaluate(args: argparse.Namespace, items: list[DatasetItem], split: dict[str, list[str]]) -> None:
    """Features, fits and the two held-out tables (on whatever is harvested so far)."""
    from capgate.estimators import ConstantPrior, LinearProbe, NuisanceProjection, ProbeSearch
    from capgate.estimators._convex import pool_layers
    from capgate.estimators.feature_store import featurize_to
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model

    new = {r.id: r for r in read_labelled(args.labels).records}
    old_split = v1_split()
    old = {r.id: r for r in read_labelled(ASSETS / "default_labels.jsonl").records if r.id in shipped_ids()}
    if set(old) != shipped_ids():
        raise SystemExit("error: sdk/assets/default_labels.jsonl lacks some of the v1 queries")
    n_total = len(items)
    partial = len(new) < n_total
    prompts = {i.id: prompt_for(i) for i in items}
    prompts.update({q: str((r.model_extra or {})["prompt"]) for q, r in old.items()})
    ids = sorted(prompts, key=lambda q: (len(prompts[q]), q))  # similar lengths share a batch
    featurizer = HiddenStateFeaturizer(load_model(args.model, device="cpu"), batch_size=16)
    start = time.perf_counter()
    stored = featurize_to(
        args.work / "features_per_layer.npz", ids, [prompts[i] for i in ids], PerLayerLast(featurizer)
    )
    edit_ids, edited = claim_edits(sorted(set(split["train"]) | set(old_split["train"])), prompts, args.seed)
    stored_edits = featurize_to(
        args.work / "edits_per_layer.npz", [f"{q}+claim" for q in edit_ids], edited, PerLayerLast(featurizer)
    )
    feature_s = time.perf_counter() - start
    row_of = {q: j for j, q in enumerate(stored.ids)}
    labels = {**old, **new}

    def layered(qids: list[str]) -> np.ndarray:
        """Per-layer features ``(n, 31, 576)``: the last prompt token's state at every layer."""
        return stored.features[[row_of[q] for q in qids]].astype(np.float64)

    def arrays(qids: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The shipped recipe's features (mean of all layers), successes and k."""
        X = layered(qids).mean(axis=1)
        return X, np.array([labels[q].correct for q in qids]), np.array([labels[q].k for q in qids])

    train_ids = [q for q in split["train"] if q in new] + list(old_split["train"])
    sets = {
        "(a) new held-out": [q for q in split["test"] if q in new],
        "(b) v1 held-out": list(old_split["test"]),
    }
    X_tr, c_tr, k_tr = arrays(train_ids)
    mu_tr = c_tr / k_tr
    # A smoke run fits the same recipes with fewer epochs, penalties and folds.
    smoke = getattr(args, "smoke", False)
    fewer: dict[str, Any] = {"alphas": (1.0, 100.0), "n_splits": 2} if smoke else {}
    linear = LinearProbe(random_state=args.seed, **({"max_epochs": 5} if smoke else {})).fit(
        X_tr, mu_tr, feature_spec=featurizer.spec, source=args.labels.name
    )
    search_start = time.perf_counter()
    search = ProbeSearch(solvers=("ridge", "logistic"), layers="auto", random_state=args.seed, **fewer).fit(
        layered(train_ids), mu_tr, feature_spec=featurizer.spec, source=args.labels.name
    )
    search_s = time.perf_counter() - search_start
    chosen = search.best_estimator_
    assert chosen is not None
    # Claim invariance (TUNE grammar only): project out what the edits move, refit, fold back.
    layers = search.best_params_["layers"]
    clean_pairs = pool_layers(layered(edit_ids), layers)
    edited_pairs = pool_layers(stored_edits.features.astype(np.float64), layers)
    projection = NuisanceProjection(energy=INVARIANCE_ENERGY).fit(
        pool_layers(layered(train_ids), layers), clean_pairs, edited_pairs
    )
    inner = ProbeSearch(solvers=("ridge", "logistic"), random_state=args.seed, **fewer).fit(
        projection.transform(pool_layers(layered(train_ids), layers)), mu_tr, source=args.labels.name
    )
    assert inner.best_estimator_ is not None
    invariant = projection.fold(inner.best_estimator_)
    invariant.feature_spec_ = chosen.feature_spec_
    trainer = dict(invariant.training_.get("trainer") or {})
    invariant.training_["trainer"] = {**trainer, "layers": layers, "hidden_states": search.layers_}
    alphas = np.logspace(-1, 5, 25)
    alpha, w, b, mean, scale = ridge_cv(X_tr, mu_tr, alphas=alphas, folds=5, seed=args.seed)
    shipped = LinearProbe.load(args.shipped)
    prior_v2 = ConstantPrior().fit(X_tr, mu_tr)
    X_v1, c_v1, k_v1 = arrays(list(old_split["train"]))
    prior_v1 = ConstantPrior().fit(X_v1, c_v1 / k_v1)

    label = " (PARTIAL harvest)" if partial else ""
    print(
        f"harvested {len(new)} of {n_total} new queries{label}; k={args.k}, temperature {args.temperature}, "
        f"top_p {args.top_p}, max_tokens {args.max_tokens}"
    )
    by_source: dict[str, list[int]] = {}
    source = json.loads(args.labels.with_name("default_v2_split.json").read_text())["source"]
    for q, r in new.items():
        by_source.setdefault(source[q], []).append(0)
        by_source[source[q]][-1] = r.correct
    for name in SOURCES_V2:
        cs = np.array(by_source.get(name, []))
        if len(cs):
            print(
                f"  {name}: {len(cs)} queries, mean µ̂ {np.mean(cs / args.k):.3f}, "
                f"share 0<µ̂<1 {np.mean((cs > 0) & (cs < args.k)):.2f}"
            )
    print(
        f"train: {len(train_ids)} queries ({len(train_ids) - len(old_split['train'])} new + "
        f"{len(old_split['train'])} v1 train), mean µ̂ {mu_tr.mean():.3f}; LinearProbe lr_ = {linear.lr_}; "
        f"ridge alpha = {alpha:.3g} (5-fold CV over {alphas[0]:.1g}..{alphas[-1]:.1g})"
    )
    print(
        f"ProbeSearch (inner 5-fold CV on the training set only, {len(search.cv_results_)} recipes, "
        f"{search_s:.1f} s): chosen {search.best_params_}, hidden states {search.layers_}"
    )
    p_train = invariant.predict(pool_layers(layered(train_ids), layers))
    print(
        f"{NEW_PROBE} on its training split: 71st / 94th percentiles of p = "
        f"{np.percentile(p_train, 71):.3f} / {np.percentile(p_train, 94):.3f} (demo-smollm2's edges)"
    )
    print(
        f"claim invariance: {len(edit_ids)} training queries each edited once by the TUNE claim grammar; "
        f"{projection.components_.shape[0]} directions removed ({projection.energy_:.1%} of the edits' "
        f"squared shift); refit {inner.best_params_}"
    )
    print(f"features: {len(ids)} queries in {feature_s:.1f} s (cached parts are reused on a rerun)")
    from rich.console import Console

    console = Console(width=200)
    wins = {}
    for title, qids in sets.items():
        X, c, k = arrays(qids)
        mu = c / k
        p = {
            "shipped probe (v1, 224 train)": shipped.predict(X),
            "LinearProbe v2 (lr sweep)": linear.predict(X),
            "ridge v2 (CV alpha)": np.clip(((X - mean) / scale) @ w + b, 0.0, 1.0),
            "ProbeSearch v2 (layers, solver, alpha by inner CV)": search.predict(layered(qids)),
            NEW_PROBE: invariant.predict(pool_layers(layered(qids), layers)),
            "constant prior (v2 train mean)": prior_v2.predict(X),
            "constant prior (v1 train mean)": prior_v1.predict(X),
        }
        rows = [calibration_row(name, v, c, k, pass_ks=(1, 4, 16)) for name, v in p.items()]
        console.print(format_table(rows, title=f"{title}{label}: {len(qids)} queries"))
        print(markdown(rows, f"{title}{label}"))
        for name in list(p)[1:-2]:
            lo, hi = paired_brier_interval(p[name], p["shipped probe (v1, 224 train)"], mu, args.seed)
            print(f"  {name} − shipped, cap. Brier: 95% bootstrap interval [{lo:+.4f}, {hi:+.4f}]")
        wins[title] = rows[list(p).index(NEW_PROBE)].capability_brier < rows[0].capability_brier
        if title.startswith("(a)"):
            per_source = []
            for name in SOURCES_V2:
                mask = np.array([source[q] == name for q in qids])
                for est in (
                    "shipped probe (v1, 224 train)",
                    "LinearProbe v2 (lr sweep)",
                    "ridge v2 (CV alpha)",
                    "ProbeSearch v2 (layers, solver, alpha by inner CV)",
                    NEW_PROBE,
                ):
                    if mask.any():
                        per_source.append(calibration_row(f"{name}: {est}", p[est][mask], c[mask], k[mask]))
            print(markdown(per_source, f"{title} by source"))
    beats = all(wins.values())
    print(f"{NEW_PROBE} beats the shipped probe in capability Brier on both held-out sets: {beats}")
    probe_dir = args.work / "probe"
    if probe_dir.exists():
        shutil.rmtree(probe_dir)
    invariant.save(probe_dir)
    if args.install:
        if partial or not beats:
            raise SystemExit(
                "not installed: the harvest is partial or the new probe does not win on both sets"
            )
        install(
            probe_dir,
            args.labels,
            items,
            old,
            train_ids,
            [q for qids in sets.values() for q in qids],
            args.seed,
        )


def install(
    probe_dir: Path,
    labels: Path,
    items: list[DatasetItem],
    old: dict[str, LabelledQuery],
    train: list[str],
    test: list[str],
    seed: int,
) -> None:
    """Replace ``sdk/assets``: probe, labels (v1's 320 queries then the new ones), split (same format)."""
    target = ASSETS / "default_probe"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(probe_dir, target)
    lines = [r.model_dump_json(exclude_none=True) for r in old.values()]
    choices = {item.id: item.choices for item in items if item.choices}
    new_lines = []
    for record in read_labelled(labels).records:  # choice items keep their options, for grading
        if record.id in choices:
            record = record.model_copy(update={"choices": choices[record.id]})
        new_lines.append(record.model_dump_json(exclude_none=True))
    (ASSETS / "default_labels.jsonl").write_text("\n".join(lines + new_lines) + "\n", encoding="utf-8")
    (ASSETS / "default_split.json").write_text(
        json.dumps({"seed": seed, "train": train, "test": test}) + "\n"
    )
    print(f"installed probe, labels and split into {ASSETS}")


if __name__ == "__main__":
    main()
