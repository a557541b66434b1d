"""Adaptive sampling on real pools: tuned on one set, scored once on a fresh one, against fixed-N.

Data (real harvested pools of the embedded SmolLM2-135M-Instruct; every query has 40 graded
samples, each with its extracted answer, its grade, its mean token log-probability):

* **tuning pools**: ``sdk/assets/default_labels.jsonl`` (320 queries: basic_arithmetic easy /
  medium / hard, TriviaQA; plain short-answer prompts; reproduce with ``bench/probe_smollm2.py``);
* **fresh pools**: ``bench/data/cas_fresh_pools.jsonl`` (330 new queries: ARC-Easy, MMLU,
  basic_arithmetic with a new seed; answer prompt asking for a ``[confidence=X%]`` tag; see
  ``bench/cas_fresh_pools.py`` for the provenance), never used to choose anything.

Protocol. Every setting (ε of the paper's rule; margin, futility level and batch size of capgate's
rule; the Beta level of Adaptive-Consistency) is chosen on the tuning pools only, with the only
per-response confidence they have, exp(mean token log-prob): for each rule family, the setting
with the fewest mean samples whose accuracy is within 0.5 points of weighted fixed-N = 40 on the
tuning pools. The shipped default is the family that wins there. The fresh pools are then scored
once with those settings. Budget-matched rows pick, per target budget B, the setting whose
*tuning* mean samples is nearest B, and compare on the fresh pools with fixed-N majority at the
same mean samples (linear interpolation between integer N; the better of weighted and unweighted).

Method. Fixed-N is read off the prefix votes of each order directly (the first N samples' vote,
with the loop's tie rule). Every adaptive run replays a query's pool in a seeded random order
(the same ``--orders`` orders,
default 20, for every method: paired), through ``capgate.cas.replay`` (the loop
``adaptive_sample`` runs live). A query counts as solved when the vote winner is correct. Gaps
carry a paired bootstrap 95% interval over queries (2,000 resamples of per-query mean
accuracies). Per-response confidence sources on the fresh pools: ``tag`` (the verbalized
``[confidence=X%]``; replies without a parsable tag count as unknown), ``logprob``
(exp(mean token log-prob)), ``none`` (plain vote). The headline uses ``logprob``, the source the
settings were tuned with.

Budget across a batch (fresh pools), at every B = 2..20 samples per query: one total budget B·Q
over all Q queries, spent by (a) uniform fixed-N, (b) the up-front greedy p(1−p)^k allocation of
``capgate budget`` (``greedy_allocation``), (c) ``capgate.cas.BatchAllocator`` (adaptive: a prior
per query, the votes so far as evidence; rounds of half the batch, ``batch_adaptive_sample``'s
default), each prior in turn: the **installed** default probe (``sdk/assets/default_probe``), the
**v1** probe it replaced (``bench/data/default_v1/probe``, rows kept beside so the effect of the
better prior shows) and a **flat** prior (p = 1). All vote with logprob weights. Nothing here is
tuned. Target, fixed before the run: the installed probe's allocator at least as accurate as
uniform and as the flat prior at every B, read on the paired mean gap over queries (≥ 0 is met);
the 95% paired bootstrap interval says whether a shortfall is distinguishable from order noise.
The bench also prints each prior's calibration and spread per source (mean p vs mean µ̂, Brier,
Spearman with µ̂) and where each allocator spends (mean samples by µ̂ group and source; µ̂ from all
40 samples, read after the fact).

Cached estimates carry the fingerprint of the probe that made them (``bench/_cache.py``,
``capgate.estimators.fingerprint``): the installed probe's in ``bench/data/cas_fresh_probe.json``
(the probe on the plain short-answer form of each fresh question, written every 16 queries so a
killed run resumes), v1's in ``bench/data/cas_fresh_probe_v1.json``. A cache whose fingerprint is
not the installed probe's is refused, naming the file and both fingerprints; ``--recompute``
recomputes it instead.

Run: ``.venv/bin/python bench/cas_bench.py`` (a few minutes on two cores); ``--part batch`` runs
only the batch-budget part (no tuning grid); ``--smoke`` runs every part on the first 24 queries of
each pool set, one order, the probe cache copied into a temporary folder (the test suite runs it).
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _report import bench_parser

from capgate.cas import (
    DEFAULT_STOP,
    BatchAllocator,
    beta_consensus,
    beta_futility,
    cas_confidence_gap,
    cas_frequency_gap,
    replay,
    stop_after_samples,
)
from capgate.cas.stop import StopFn
from capgate.estimators.fingerprint import probe_fingerprint
from capgate.labels.labelled import iter_labelled
from capgate.metrics import greedy_allocation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cache import installed_probe, probe_description, read_estimates, write_estimates

ROOT = Path(__file__).resolve().parents[1]
TUNING = ROOT / "sdk" / "assets" / "default_labels.jsonl"
FRESH = ROOT / "bench" / "data" / "cas_fresh_pools.jsonl"
PROBE_CACHE = ROOT / "bench" / "data" / "cas_fresh_probe.json"  # the installed probe's estimates
PROBE_V1_CACHE = ROOT / "bench" / "data" / "cas_fresh_probe_v1.json"  # the v1 probe's (kept beside)
V1_PROBE = ROOT / "bench" / "data" / "default_v1" / "probe"
CAP = 40
TOLERANCE = 0.5  # points of accuracy below weighted fixed-N = 40 a tuned setting may give up


@dataclass
class Pools:
    name: str
    ids: list[str]
    answers: list[list[str | None]]
    correct: list[list[bool]]
    confidence: dict[str, list[list[float | None]]]  # source -> per query, per sample

    def __len__(self) -> int:
        return len(self.ids)


def load_pools(path: Path, name: str, *, limit: int | None = None) -> Pools:
    ids, answers, correct = [], [], []
    conf: dict[str, list[list[float | None]]] = {"tag": [], "logprob": [], "none": []}
    for _, record in iter_labelled(path):
        if len(record.samples) < CAP:
            continue
        if limit is not None and len(ids) >= limit:
            break
        samples = record.samples[:CAP]
        ids.append(record.id)
        answers.append([s.answer for s in samples])
        correct.append([s.correct for s in samples])
        conf["tag"].append([s.confidence for s in samples])
        conf["logprob"].append(
            [None if s.mean_logprob is None else math.exp(s.mean_logprob) for s in samples]
        )
        conf["none"].append([None] * len(samples))
    return Pools(name, ids, answers, correct, conf)


@dataclass
class Scored:
    """Per-query mean accuracy and mean samples over the orders."""

    label: str
    acc: np.ndarray
    samples: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.acc.mean() * 100.0)

    @property
    def mean_samples(self) -> float:
        return float(self.samples.mean())


def orders_for(pools: Pools, orders: int) -> list[list[np.ndarray]]:
    """The same seeded permutations for every method (paired comparisons)."""
    return [
        [np.random.default_rng([r, q]).permutation(CAP) for q in range(len(pools))] for r in range(orders)
    ]


def winner(weights: dict[str, float], votes: dict[str, int]) -> str | None:
    return min(weights, key=lambda a: (-weights[a], -votes[a], a)) if weights else None


def fixed_n_curve(pools: Pools, source: str, perms: list[list[np.ndarray]]) -> np.ndarray:
    """acc[q, n-1]: mean over orders of "the weighted vote of the first n samples is correct"."""
    out = np.zeros((len(pools), CAP))
    for order in perms:
        for q, perm in enumerate(order):
            votes: dict[str, int] = {}
            weights: dict[str, float] = {}
            first_correct: dict[str, bool] = {}
            for n, j in enumerate(perm):
                a = pools.answers[q][j]
                if a is not None:
                    c = pools.confidence[source][q][j]
                    votes[a] = votes.get(a, 0) + 1
                    weights[a] = weights.get(a, 0.0) + (0.5 if c is None else c)
                    first_correct.setdefault(a, pools.correct[q][j])
                w = winner(weights, votes)
                out[q, n] += w is not None and first_correct[w]
    return out / len(perms)


def fixed_at(curve: np.ndarray, n: float) -> float:
    """Accuracy (%) of fixed-N at a real-valued mean N (linear between integer N)."""
    lo = max(1, min(CAP, math.floor(n)))
    hi = max(1, min(CAP, math.ceil(n)))
    a_lo, a_hi = curve[:, lo - 1].mean(), curve[:, hi - 1].mean()
    return float((a_lo + (n - lo) * (a_hi - a_lo) if hi > lo else a_lo) * 100.0)


def score_rule(
    pools: Pools,
    source: str,
    perms: list[list[np.ndarray]],
    make: Callable[[], StopFn],
    batch: int,
    label: str,
) -> Scored:
    acc = np.zeros(len(pools))
    used = np.zeros(len(pools))
    for r, order in enumerate(perms):
        for q, perm in enumerate(order):
            items = [
                (pools.answers[q][j], pools.correct[q][j], pools.confidence[source][q][j], 0) for j in perm
            ]
            result = replay(
                items,
                stop=make() | stop_after_samples(CAP),
                batch_size=batch,
                max_samples=CAP,
                seed=np.random.default_rng([r, q]),
            )
            acc[q] += bool(result.correct)
            used[q] += result.samples_used
    return Scored(label, acc / len(perms), used / len(perms))


def bootstrap(diff: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(reps, len(diff)))
    means = diff[idx].mean(axis=1) * 100.0
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# ------------------------------------------------------------------ the rule families and grids


@dataclass(frozen=True)
class Setting:
    family: str
    label: str
    make: Callable[[], StopFn]
    batch: int
    weighted: bool = True


def _min(rule: StopFn, n: int) -> StopFn:
    return rule if n == 1 else stop_after_samples(n) & rule


def grid() -> list[Setting]:
    """The tuning grid: batch size 1 or 4, and with batch 1 a minimum of 1 or 4 samples."""
    out: list[Setting] = []
    for batch, least in ((1, 1), (1, 4), (4, 1)):
        tail = f", batch {batch}" + (f", min {least}" if least > 1 else "")
        for eps in (-4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0):
            out.append(
                Setting(
                    "paper",
                    f"cas_frequency_gap(ε={eps:g}){tail}",
                    lambda e=eps, n=least: _min(cas_frequency_gap(e), n),
                    batch,
                )
            )
        for margin in (0.1, 0.3, 0.5, 0.7, 0.9):
            for fut in (None, 0.05, 0.1, 0.2):

                def make(m: float = margin, f: float | None = fut, n: int = least) -> StopFn:
                    rule = cas_confidence_gap(margin=m) | beta_consensus(0.95)
                    return _min(rule | beta_futility(f) if f is not None else rule, n)

                fl = f" ∨ futility {fut:g}" if fut is not None else ""
                out.append(Setting("capgate", f"gap(margin={margin:g}) ∨ Beta 0.95{fl}{tail}", make, batch))
    for level in (0.7, 0.8, 0.9, 0.95):
        for fut in (None, 0.05, 0.1):

            def make_ac(t: float = level, f: float | None = fut) -> StopFn:
                rule = beta_consensus(t)
                return rule | beta_futility(f) if f is not None else rule

            fl = f" ∨ futility {fut:g}" if fut is not None else ""
            out.append(Setting("adaptive-consistency", f"Beta {level:g}{fl}", make_ac, 1, weighted=False))
    return out


def choose(results: dict[Setting, Scored], family: str, reference: float) -> Setting | None:
    ok = [(s, r) for s, r in results.items() if s.family == family and r.accuracy >= reference - TOLERANCE]
    if not ok:
        return None
    return min(ok, key=lambda sr: (sr[1].mean_samples, -sr[1].accuracy))[0]


# ------------------------------------------------------------------ batch budget


def probe_estimates(pools: Pools, *, recompute: bool = False, chunk: int = 16) -> np.ndarray:
    """The installed default probe's estimates of the fresh queries (plain short-answer prompts).

    Cached in ``PROBE_CACHE`` with the probe's fingerprint, written after every ``chunk`` queries
    (a killed run resumes). A cache written by another probe is refused (``StaleCacheError``
    naming the file and both fingerprints), or with ``recompute`` started afresh.
    """
    folder, fingerprint = installed_probe()
    cached = read_estimates(PROBE_CACHE, fingerprint, on_mismatch="recompute" if recompute else "refuse")
    todo = [i for i in pools.ids if i not in cached]
    if todo:
        sys.path.insert(0, str(ROOT / "bench"))
        from cas_fresh_pools import build_fresh
        from probe_smollm2 import prompt_for

        from capgate import load_estimator

        items = {item.id: item for item in build_fresh(7)}
        estimator = load_estimator("default", device="cpu")
        for start in range(0, len(todo), chunk):
            batch = todo[start : start + chunk]
            estimates = estimator.estimate([prompt_for(items[i]) for i in batch])
            cached.update({i: e.p for i, e in zip(batch, estimates, strict=True)})
            write_estimates(
                PROBE_CACHE,
                fingerprint,
                cached,
                about="installed default probe (sdk/assets/default_probe), plain short-answer prompt "
                "(probe_smollm2.prompt_for) of each fresh query",
                description=probe_description(folder),
            )
            print(f"  probe estimates: {len(cached)}/{len(pools)}", file=sys.stderr, flush=True)
    missing = [i for i in pools.ids if cached.get(i) is None]
    if missing:
        raise SystemExit(
            f"the installed probe gave no estimate for {len(missing)} fresh queries: {missing[:5]}"
        )
    return np.asarray([cached[i] for i in pools.ids])


def v1_probe_estimates(pools: Pools) -> np.ndarray | None:
    """The v1 probe's estimates (``PROBE_V1_CACHE``, checked against ``bench/data/default_v1/probe``),
    or None when the cache is absent."""
    if not PROBE_V1_CACHE.exists():
        return None
    cached = read_estimates(PROBE_V1_CACHE, probe_fingerprint(V1_PROBE))
    missing = [i for i in pools.ids if cached.get(i) is None]
    if missing:
        raise SystemExit(f"{PROBE_V1_CACHE} has no estimate for {len(missing)} fresh queries: {missing[:5]}")
    return np.asarray([cached[i] for i in pools.ids])


BATCH_BUDGETS = tuple(range(2, 21))


def source_of(query_id: str) -> str:
    """The fresh pools' source of a query, from its id (MMLU, arithmetic, else ARC-Easy)."""
    if query_id.startswith("mmlu_"):
        return "MMLU"
    if re.match(r"q\d+_", query_id):
        return "arithmetic"
    return "ARC-Easy"


@dataclass
class Spent:
    """Per query: mean accuracy and mean samples over the orders, of one way to spend a batch budget."""

    acc: np.ndarray
    samples: np.ndarray


def batch_allocations(
    pools: Pools, priors: dict[str, np.ndarray], perms: list[list[np.ndarray]], per_query: int
) -> dict[str, Spent]:
    """Spend ``per_query · Q`` samples over the batch: uniform fixed-N, and per prior (label ->
    estimates) the greedy up-front allocation and the adaptive ``BatchAllocator``."""
    n_q = len(pools)
    total = per_query * n_q
    greedy = {
        label: np.asarray(greedy_allocation(p, total, max_per_query=CAP), dtype=int)
        for label, p in priors.items()
        if label != FLAT
    }
    keys = ["uniform", *(f"greedy, {label}" for label in greedy), *(f"adaptive, {label}" for label in priors)]
    acc = {k: np.zeros(n_q) for k in keys}
    used = {k: np.zeros(n_q) for k in keys}

    def vote(q: int, perm: np.ndarray, k: int) -> bool:
        votes: dict[str, int] = {}
        weights: dict[str, float] = {}
        first: dict[str, bool] = {}
        for j in perm[:k]:
            a = pools.answers[q][j]
            if a is None:
                continue
            c = pools.confidence["logprob"][q][j]
            votes[a] = votes.get(a, 0) + 1
            weights[a] = weights.get(a, 0.0) + (0.5 if c is None else c)
            first.setdefault(a, pools.correct[q][j])
        w = winner(weights, votes)
        return w is not None and first[w]

    for order in perms:
        for q, perm in enumerate(order):
            acc["uniform"][q] += vote(q, perm, per_query)
            used["uniform"][q] += per_query
            for label, alloc_g in greedy.items():
                acc[f"greedy, {label}"][q] += vote(q, perm, int(alloc_g[q]))
                used[f"greedy, {label}"][q] += int(alloc_g[q])
        for label, prior in priors.items():
            key = f"adaptive, {label}"
            alloc = BatchAllocator(list(map(float, prior)), total, max_per_query=CAP)
            step = max(1, math.ceil(n_q / 2))  # batch_adaptive_sample's default round
            while chosen := alloc.next_queries(step):
                for q in chosen:
                    j = order[q][alloc.drawn[q]]
                    alloc.observe(q, pools.answers[q][j], pools.confidence["logprob"][q][j])
            for q in range(n_q):
                a = alloc.answer(q)
                acc[key][q] += a is not None and next(
                    pools.correct[q][j] for j in order[q][: alloc.drawn[q]] if pools.answers[q][j] == a
                )
                used[key][q] += alloc.drawn[q]
    return {k: Spent(acc[k] / len(perms), used[k] / len(perms)) for k in keys}


FLAT = "flat prior (p = 1)"


def prior_diagnostics(pools: Pools, priors: dict[str, np.ndarray]) -> None:
    """How each prior describes the fresh pools: calibration (mean p vs mean µ̂, Brier), spread,
    rank agreement with µ̂ (Spearman), per source. µ̂ = correct share of a query's 40 samples."""
    mu = np.array([np.mean(c) for c in pools.correct])
    sources = np.array([source_of(i) for i in pools.ids])
    rows = []
    for label, p in priors.items():
        if label == FLAT:
            continue
        for name in ("all", *sorted(set(sources))):
            m = np.ones(len(mu), bool) if name == "all" else sources == name
            rank_p, rank_mu = _ranks(p[m]), _ranks(mu[m])
            rho = float(np.corrcoef(rank_p, rank_mu)[0, 1]) if np.std(rank_mu) > 0 else float("nan")
            q10, q50, q90 = np.percentile(p[m], [10, 50, 90])
            rows.append(
                (
                    label,
                    name,
                    str(int(m.sum())),
                    f"{mu[m].mean():.3f}",
                    f"{p[m].mean():.3f}",
                    f"{np.mean((p[m] - mu[m]) ** 2):.4f}",
                    f"{np.mean((mu[m].mean() - mu[m]) ** 2):.4f}",
                    f"{p[m].std():.3f}",
                    f"{q10:.3f} / {q50:.3f} / {q90:.3f}",
                    f"{rho:+.2f}",
                )
            )
    table(
        rows,
        (
            "prior",
            "source",
            "queries",
            "mean µ̂",
            "mean p",
            "Brier (p vs µ̂)",
            "Brier of the constant mean µ̂",
            "sd of p",
            "p at 10 / 50 / 90 %",
            "Spearman(p, µ̂)",
        ),
    )


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for value in np.unique(x):  # average ranks of ties
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def batch_part(
    pools: Pools, perms: list[list[np.ndarray]], priors: dict[str, np.ndarray], label: str
) -> None:
    """One budget over the batch at every B in ``BATCH_BUDGETS``: accuracy table, paired gaps of
    the installed probe's allocator (``label``) vs uniform and vs the flat prior, and where each
    allocator spends."""
    print("### The priors on the fresh pools\n")
    prior_diagnostics(pools, priors)
    results = {b: batch_allocations(pools, priors, perms, b) for b in BATCH_BUDGETS}
    keys = list(results[BATCH_BUDGETS[0]])
    print("\n### Accuracy % at B mean samples per query (one budget B·Q over the batch)\n")
    table(
        [(str(b), *(f"{r[k].acc.mean() * 100:.2f}" for k in keys)) for b, r in results.items()],
        ("B", *keys),
    )
    mine, flat = f"adaptive, {label}", f"adaptive, {FLAT}"
    others = [k for k in keys if k.startswith("adaptive, ") and k not in (mine, flat)]
    gaps = [("uniform", mine), (flat, mine), *(("uniform", k) for k in others), *((k, mine) for k in others)]
    print(
        f"\n### Paired gaps (points; 95% paired bootstrap over the {len(pools)} queries, 2,000 resamples)\n"
    )
    rows = []
    fails: dict[str, list[int]] = {"uniform": [], flat: []}
    significant: dict[str, list[int]] = {"uniform": [], flat: []}
    for b, r in results.items():
        cells = [str(b)]
        for base, new in gaps:
            d = r[new].acc - r[base].acc
            lo, hi = bootstrap(d)
            cells.append(f"{d.mean() * 100:+.2f} [{lo:+.2f}, {hi:+.2f}]")
            if new == mine and base in fails:
                if d.mean() < 0:
                    fails[base].append(b)
                if hi < 0:
                    significant[base].append(b)
        rows.append(tuple(cells))
    table(rows, ("B", *(f"{new.removeprefix('adaptive, ')} − {base}" for base, new in gaps)))
    mu = np.array([np.mean(c) for c in pools.correct])
    groups = {
        "µ̂ = 0": mu == 0,
        "0 < µ̂ < 0.5": (mu > 0) & (mu < 0.5),
        "0.5 ≤ µ̂ < 1": (mu >= 0.5) & (mu < 1),
        "µ̂ = 1": mu == 1,
    }
    sources = np.array([source_of(i) for i in pools.ids])
    groups.update({s: sources == s for s in sorted(set(sources))})
    groups = {g: m for g, m in groups.items() if m.any()}
    print(
        "\n### Where the samples go: per group, mean samples per query / accuracy % (groups by µ̂ "
        "from all 40 samples, read after the fact, never used by any allocator)\n"
    )
    rows = []
    for b in (3, 5, 8, 10, 12, 20):
        for k in keys:
            r = results[b][k]
            rows.append(
                (
                    str(b),
                    k,
                    *(f"{r.samples[m].mean():.1f} / {r.acc[m].mean() * 100:.1f}" for m in groups.values()),
                )
            )
    table(rows, ("B", "allocator", *(f"{g} ({int(m.sum())})" for g, m in groups.items())))
    for base in ("uniform", flat):
        print(
            f"\ntarget: {label} allocator ≥ {base} at every B = {BATCH_BUDGETS[0]}..{BATCH_BUDGETS[-1]}: "
            + ("met" if not fails[base] else f"NOT met at B = {fails[base]}")
            + (
                f"; significantly below (95% interval under 0) at B = {significant[base]}"
                if significant[base]
                else ""
            )
        )


# ------------------------------------------------------------------ printing


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def frontier(
    pools: Pools, perms: list[list[np.ndarray]], chosen: dict[str, Setting]
) -> tuple[dict[str, Scored], dict[str, np.ndarray]]:
    curves = {s: fixed_n_curve(pools, s, perms) for s in ("logprob", "none")}
    ref = Scored("weighted N=40", curves["logprob"][:, CAP - 1], np.full(len(pools), float(CAP)))
    rows: list[tuple[str, ...]] = []
    scored: dict[str, Scored] = {"ref": ref}

    def row(s: Scored) -> tuple[str, ...]:
        lo, hi = bootstrap(s.acc - ref.acc)
        return (
            s.label,
            f"{s.accuracy:.2f}",
            f"{s.mean_samples:.2f}",
            f"{CAP / s.mean_samples:.2f}×",
            f"{s.accuracy - ref.accuracy:+.2f} [{lo:+.2f}, {hi:+.2f}]",
        )

    for n in (1, 2, 3, 5, 10, 20, 40):
        for source, name in (("none", "unweighted"), ("logprob", "weighted")):
            s = Scored(f"fixed-N {name}, N={n}", curves[source][:, n - 1], np.full(len(pools), float(n)))
            rows.append(row(s))
    for family, setting in chosen.items():
        s = score_rule(
            pools,
            "none" if not setting.weighted else "logprob",
            perms,
            setting.make,
            setting.batch,
            f"{family}: {setting.label}",
        )
        scored[family] = s
        rows.append(row(s))
    if "tag" in pools.confidence and any(c is not None for qc in pools.confidence["tag"] for c in qc):
        for family in ("paper", "capgate", "shipped default"):
            setting = chosen[family]
            s = score_rule(
                pools,
                "tag",
                perms,
                setting.make,
                setting.batch,
                f"{family} (tag confidence): {setting.label}",
            )
            rows.append(row(s))
    setting = chosen["shipped default"]
    s = score_rule(
        pools, "none", perms, setting.make, setting.batch, "shipped default (no confidence: Beta only)"
    )
    rows.append(row(s))
    table(rows, ("method", "accuracy %", "samples/query", "vs N=40", "gap vs weighted N=40 (pts, 95% CI)"))
    print(f"\nfixed-N majority on the {pools.name} pools, N = 1..40 (accuracy %):\n")
    table(
        [
            (
                str(n),
                f"{curves['none'][:, n - 1].mean() * 100:.2f}",
                f"{curves['logprob'][:, n - 1].mean() * 100:.2f}",
            )
            for n in range(1, CAP + 1)
        ],
        ("N", "unweighted", "weighted (logprob)"),
    )
    return scored, curves


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def run_batch(fresh: Pools, perms: list[list[np.ndarray]], *, recompute: bool) -> None:
    """The batch-budget part with the installed probe, the v1 probe (if its cache is there) and a
    flat prior, each labelled with its probe version and fingerprint."""
    folder, fingerprint = installed_probe()
    v1_fingerprint = probe_fingerprint(V1_PROBE)
    label = "probe v1 (installed)" if fingerprint == v1_fingerprint else "installed probe"
    training = probe_description(folder)
    print(
        f"{label}: {fingerprint} ({training['folder']}, trained on {training['trained_on']}, "
        f"n = {training['n_train']}); estimates cached in {_shown(PROBE_CACHE)}"
    )
    priors = {label: probe_estimates(fresh, recompute=recompute)}
    v1 = v1_probe_estimates(fresh) if fingerprint != v1_fingerprint else None
    if v1 is not None:
        priors["probe v1"] = v1
        print(
            f"probe v1: {v1_fingerprint} (bench/data/default_v1/probe); "
            f"estimates in {PROBE_V1_CACHE.relative_to(ROOT)}"
        )
    priors[FLAT] = np.ones(len(fresh))
    print()
    batch_part(fresh, perms, priors, label)


def main() -> None:
    global PROBE_CACHE  # a smoke run reads and writes a copy in its temporary folder
    parser = bench_parser(__doc__)
    parser.add_argument("--orders", type=int, default=20, help="orders per query for every scored row")
    parser.add_argument(
        "--grid-orders", type=int, default=5, help="orders per query while searching the tuning grid"
    )
    parser.add_argument("--tuning", type=Path, default=TUNING)
    parser.add_argument("--fresh", type=Path, default=FRESH)
    parser.add_argument(
        "--part",
        choices=("all", "batch"),
        default="all",
        help="'batch': only the one-budget-over-the-batch part on the fresh pools (no tuning grid)",
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help=f"recompute the probe estimates when {PROBE_CACHE.name} was written by another probe "
        "than the installed one (without it, such a cache is refused)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every part on 24 queries per pool set, one order, caches in a temp folder (a test runs it)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    if args.smoke:
        from _smoke import smoke_dir

        folder = smoke_dir("cas")
        if PROBE_CACHE.exists():
            shutil.copy(PROBE_CACHE, folder / PROBE_CACHE.name)
        PROBE_CACHE = folder / PROBE_CACHE.name
        args.orders, args.grid_orders, args.smoke_queries = 1, 1, 24
    if args.part == "batch":
        fresh = load_pools(args.fresh, "fresh", limit=getattr(args, "smoke_queries", None))
        print(f"fresh pools: {len(fresh)} queries × {CAP} samples; {args.orders} seeded orders per query\n")
        run_batch(fresh, orders_for(fresh, args.orders), recompute=args.recompute)
        print(f"({time.perf_counter() - started:.0f} s)")
        return
    tuning = load_pools(args.tuning, "tuning", limit=getattr(args, "smoke_queries", None))
    fresh = load_pools(args.fresh, "fresh", limit=getattr(args, "smoke_queries", None))
    for pools in (tuning, fresh):
        mu = np.array([np.mean(c) for c in pools.correct])
        tags = np.mean([c is not None for qc in pools.confidence["tag"] for c in qc])
        print(
            f"{pools.name} pools: {len(pools)} queries × {CAP} samples; mean µ̂ {mu.mean():.3f}; "
            f"share 0 < µ̂ < 1: {np.mean((mu > 0) & (mu < 1)):.2f}; replies with a parsable tag: {tags:.2f}"
        )
    print(f"method: {args.orders} seeded orders per query, paired across methods; cap {CAP}\n")

    # ---- tuning
    t_perms = orders_for(tuning, args.orders)
    g_perms = t_perms[: args.grid_orders]
    t_ref = float(fixed_n_curve(tuning, "logprob", g_perms)[:, CAP - 1].mean() * 100.0)
    results: dict[Setting, Scored] = {}
    for setting in grid():
        source = "logprob" if setting.weighted else "none"
        results[setting] = score_rule(tuning, source, g_perms, setting.make, setting.batch, setting.label)
    chosen: dict[str, Setting] = {}
    print(
        f"## Tuning pools: grid of {len(results)} settings, {args.grid_orders} orders each; weighted "
        f"fixed-N=40 {t_ref:.2f}%; per family, the fewest samples within {TOLERANCE} pts\n"
    )
    rows = []
    for family in ("adaptive-consistency", "paper", "capgate"):
        pick = choose(results, family, t_ref)
        if pick is None:
            print(f"{family}: no setting within {TOLERANCE} points on the tuning pools")
            continue
        chosen[family] = pick
        r = results[pick]
        rows.append(
            (family, pick.label, f"{r.accuracy:.2f}", f"{r.mean_samples:.2f}", f"{CAP / r.mean_samples:.2f}×")
        )
    table(rows, ("family", "chosen setting", "accuracy %", "samples/query", "vs N=40"))
    cas_families = [f for f in ("paper", "capgate") if f in chosen]
    default = min(cas_families, key=lambda f: results[chosen[f]].mean_samples)
    print(f"\nwinner on the tuning pools: {default}: {chosen[default].label}")
    chosen["shipped default"] = Setting(
        "shipped default", f"DEFAULT_STOP = {DEFAULT_STOP!r}, batch 4", lambda: DEFAULT_STOP, 4
    )
    # The shipped default must run as policies sample (batches of 4, the ResampleAction default)
    # and stay valid for any budget (no minimum): the winner family's choice under that shape.
    shaped = {s: r for s, r in results.items() if s.family == default and s.batch == 4}
    live = choose(shaped, default, t_ref)
    print(
        f"the winner's choice at the policy default (batch 4, no minimum): "
        f"{live.label if live else 'none within the tolerance'}"
    )
    print(
        f"shipped default (that setting; Beta 0.95 kept for replies without a confidence): {DEFAULT_STOP!r}"
    )
    if live is None or repr(live.make()) not in repr(DEFAULT_STOP):
        print("NOTE: the shipped default differs from the tuning pools' choice; update DEFAULT_STOP")
    print()

    print("## Frontier on the tuning pools (the data the settings were chosen on)\n")
    frontier(tuning, t_perms, chosen)

    # ---- fresh
    print("\n## Frontier on the fresh pools (scored once, settings from the tuning pools)\n")
    f_perms = orders_for(fresh, args.orders)
    scored, curves = frontier(fresh, f_perms, chosen)

    def best_fixed(n: float) -> float:
        """The better of weighted and unweighted fixed-N majority (over the whole set) at mean n."""
        return max(fixed_at(curves["logprob"], n), fixed_at(curves["none"], n))

    print("\n## Budget-matched on the fresh pools: setting whose tuning mean samples is nearest B\n")
    rows = []
    worst = math.inf
    for budget in (2, 3, 4, 5, 6, 8, 10, 12, 15, 20):
        for family in cas_families:
            pick = min(
                (s for s in results if s.family == family),
                key=lambda s: abs(results[s].mean_samples - budget),
            )
            s = score_rule(fresh, "logprob", f_perms, pick.make, pick.batch, pick.label)
            fixed = best_fixed(s.mean_samples)
            worst = min(worst, s.accuracy - fixed)
            rows.append(
                (
                    str(budget),
                    family,
                    pick.label,
                    f"{s.mean_samples:.2f}",
                    f"{s.accuracy:.2f}",
                    f"{fixed:.2f}",
                    f"{s.accuracy - fixed:+.2f}",
                )
            )
    table(
        rows,
        (
            "B",
            "family",
            "setting (chosen on tuning)",
            "fresh samples/q",
            "CAS acc %",
            "fixed-N acc % at same samples",
            "diff",
        ),
    )

    print("\n## One budget over the batch (fresh pools)\n")
    run_batch(fresh, f_perms, recompute=args.recompute)

    ref = scored["ref"]
    best = scored["shipped default"]
    lo, hi = bootstrap(best.acc - ref.acc)
    at_equal = best.accuracy - best_fixed(best.mean_samples)
    ratio = CAP / best.mean_samples
    meets = ratio >= 3 and best.accuracy - ref.accuracy >= -0.5 and worst >= 0
    print(
        f"\ntargets on the fresh pools: ≥ 3× fewer samples with gap ≥ −0.5 pts: "
        f"{'met' if ratio >= 3 and best.accuracy - ref.accuracy >= -0.5 else 'NOT met'}; "
        f"CAS ≥ fixed-N at every budget 2..20: {'met' if worst >= 0 else 'NOT met'} "
        f"(worst {worst:+.2f} pts)"
        f"{'' if meets else ' — reported as measured'}"
    )
    print(f"({time.perf_counter() - started:.0f} s)")
    print(
        f"CAS fresh pools: {ratio:.2f}× fewer samples than weighted fixed-N=40 at "
        f"{best.accuracy - ref.accuracy:+.2f} points "
        f"(95% CI [{lo:+.2f}, {hi:+.2f}]); at equal mean samples CAS beats fixed-N by {at_equal:+.2f} points"
    )


if __name__ == "__main__":
    main()
