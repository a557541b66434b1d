"""Learn from traffic (issue 26 targets): replay held-out queries as traffic, calibrate, score the next.

**Traffic.** The held-out split of the embedded SmolLM2-135M-Instruct's harvested labels
(``sdk/assets/default_labels.jsonl`` + ``default_split.json``: 356 queries from basic_arithmetic,
GSM8K, TriviaQA, ARC and MMLU, each with µ̂ measured on k = 20 or 40 samples at temperature 0.7).
The shipped default probe was fitted on the 1,004 queries of that split's ``train`` list
(``sdk/assets/default_probe/probe.json``: ``training.n``); none of them is replayed, and the
bench refuses a label file whose replayed queries share an id or a prompt with them. ``--labels``
/ ``--split`` replay another label file (its ``test`` list), e.g. queries no-one here has seen.

**Replays.** Each seeded replay ``r`` splits the replayed queries (per source, seeded) into a
*learning pool* and the *next traffic* (``--next-share``, default 40%): the next traffic is never
seen by the learner. The learner's traffic is the learning pool in seeded shuffled rounds (a
query recurs, as in production), 1,000 decisions long; each decision's outcome is a binary draw
from its query's µ̂ (seeded). After 100, 300 and 1,000 outcomes the loop calibrates on the log
and scores the next traffic:

* capability Brier vs µ̂ of the learned estimator and of the starting one, mean over replays
  with a 95% interval (two-stage bootstrap: replays, then each replay's next queries);
* AUROC vs µ̂ (every sampled response an example: ``capgate.metrics.auroc(p, correct, k=k)``),
  beside the shipped default probe's on the same next traffic;
* risk/coverage of the calibrated policy on the next traffic: the answered share's error rate
  (1 − mean µ̂ of the answered queries) against the stated ``--risk``, the share of replays
  within it (to hold in at least 1 − ``--delta`` of them), coverage beside the ungated accuracy.

**Starting estimators.** (a) the shipped default probe (``capgate.load_estimator()``); (b) the
verbalized estimator on an OpenAI-compatible server (``--server URL --served-model NAME``, the CI
vLLM server), each query's estimate computed once and cached (fingerprinted, ``bench/_cache.py``);
(c) a flat prior: p = 0.5 for every query (``--prior``), the estimate of a user with nothing.

**Features.** The embedded model's reader features (the featurizer ``capgate.load_estimator()``
builds, float32 pass) of every replayed prompt, computed once into
``bench/results/learn_from_traffic/features.npz`` (``capgate.estimators.feature_store``:
resumable, refused if the reader's spec changes). The replay serves them by prompt, so the loop
runs the real estimators and gate without a model pass per decision.

Run: ``python bench/learn_from_traffic.py [--features-only] [--replays R] [--server URL
--served-model NAME]``. The last line is ``learn: after N outcomes Brier A -> B (start: S); risk R
at coverage C``. ``--smoke``: one replay to 100 outcomes, the probe and flat starts, on synthetic
reader features with the shipped probe's spec (no model pass), into a temporary folder (the test
suite runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _report import bench_parser

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "sdk" / "assets"
WORK = ROOT / "bench" / "results" / "learn_from_traffic"


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Query:
    """One replayed query: its prompt (as the reader reads it) and its measured capability."""

    id: str
    prompt: str
    correct: int
    k: int
    source: str

    @property
    def mu(self) -> float:
        """µ̂ = correct / k."""
        return self.correct / self.k


def shipped_training() -> tuple[set[str], set[str]]:
    """Ids and prompts of the queries the shipped default probe was fitted on."""
    from capgate.labels.labelled import iter_labelled

    train = set(json.loads((ASSETS / "default_split.json").read_text(encoding="utf-8"))["train"])
    prompts = {
        str((record.model_extra or {}).get("prompt", record.question))
        for _, record in iter_labelled(ASSETS / "default_labels.jsonl")
        if record.id in train
    }
    return train, prompts


def load_traffic(labels: Path, split: Path) -> list[Query]:
    """The ``test`` queries of ``split`` from ``labels``, checked apart from the shipped probe's training.

    Raises:
        SystemExit: A replayed query is one the shipped probe was fitted on (by id or prompt), a
            record has no prompt, or the split names ids the labels lack.
    """
    from capgate.demo.live import question_source
    from capgate.labels.labelled import iter_labelled

    held_out = json.loads(split.read_text(encoding="utf-8"))["test"]
    wanted = set(held_out)
    records = {r.id: r for _, r in iter_labelled(labels) if r.id in wanted}
    missing = sorted(wanted - set(records))
    if missing:
        raise SystemExit(f"error: {split}: {len(missing)} test ids are not in {labels}, e.g. {missing[0]!r}")
    train_ids, train_prompts = shipped_training()
    queries: list[Query] = []
    for qid in sorted(wanted):
        record = records[qid]
        prompt = (record.model_extra or {}).get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise SystemExit(f"error: {labels}: record {qid!r} has no 'prompt' field (the reader's input)")
        if qid in train_ids or prompt in train_prompts:
            raise SystemExit(
                f"error: {labels}: replayed query {qid!r} is one the shipped default probe was fitted on; "
                "scoring on it would flatter start (a)"
            )
        queries.append(Query(qid, prompt, int(record.correct), int(record.k), question_source(record)))
    return queries


# --------------------------------------------------------------------------- reader features


class SyntheticReader:
    """Seeded random features with the shipped probe's spec (a smoke run's stand-in for the reader)."""

    def __init__(self) -> None:
        from capgate.estimators import LinearProbe
        from capgate.loading import default_probe_path

        self.spec = dict(LinearProbe.load(default_probe_path()).feature_spec_ or {})

    def transform(self, queries: Sequence[Any]) -> npt.NDArray[np.float32]:
        rng = np.random.default_rng([len(str(q)) for q in queries])
        return rng.normal(size=(len(queries), int(self.spec["dim"]))).astype(np.float32)


def reader_features(queries: Sequence[Query], path: Path, *, synthetic: bool = False) -> Any:
    """The embedded model's reader features of ``queries`` (float32 pass), cached at ``path``.

    Resumable (``featurize_to``: finished batches kept under ``<path>.parts/``); a cache written by
    a reader of another spec (model, weights, layers, pooling, template) is refused.
    """
    from capgate.estimators.feature_store import featurize_to, load_features, spec_path

    if synthetic:
        return featurize_to(path, [q.id for q in queries], [q.prompt for q in queries], SyntheticReader())
    if path.exists() and spec_path(path).exists():
        stored = load_features(path)
        if {q.id for q in queries} <= set(stored.ids):
            _check_reader_spec(stored.spec)
            return stored
    import capgate

    estimator = capgate.load_estimator("default", device="cpu", dtype="float32", batch_size=8)
    path.parent.mkdir(parents=True, exist_ok=True)

    def progress(done: int, total: int) -> None:
        print(f"  features: {done}/{total}", file=sys.stderr, flush=True)

    return featurize_to(
        path,
        [q.id for q in queries],
        [q.prompt for q in queries],
        estimator.featurizer,
        batch_size=8,
        on_batch=progress,
    )


def _check_reader_spec(spec: dict[str, Any]) -> None:
    """The cached features must be what the shipped probe reads (its spec, the pass's dtype aside)."""
    from capgate.estimators import LinearProbe
    from capgate.estimators.probe import check_spec_match
    from capgate.loading import default_probe_path

    check_spec_match(LinearProbe.load(default_probe_path()).feature_spec_, spec)


class CachedReader:
    """A :class:`~capgate.estimators.probe.Featurizer` serving cached reader features by prompt.

    Its ``spec`` is the cached features' spec (the embedded reader's), so a probe fitted on the
    live reader accepts it, and a probe fitted on it is loadable over the live reader.
    """

    def __init__(self, stored: Any, queries: Sequence[Query]) -> None:
        rows = stored.rows_for([q.id for q in queries])
        self._rows = {q.prompt: rows[i] for i, q in enumerate(queries)}
        self._spec = dict(stored.spec)

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self._spec)

    def transform(self, queries: Sequence[Any]) -> npt.NDArray[np.float32]:
        out = []
        for i, query in enumerate(queries):
            row = self._rows.get(query) if isinstance(query, str) else None
            if row is None:
                raise KeyError(f"query {i} of this batch has no cached reader features")
            out.append(row)
        return np.stack(out).astype(np.float32)


# --------------------------------------------------------------------------- starting estimators


def _estimator_base() -> Any:
    from capgate.estimators import CapabilityEstimator

    return CapabilityEstimator


class FlatPrior(_estimator_base()):  # type: ignore[misc]
    """Start (c): the same ``p`` for every query (0.5: an estimate that knows nothing)."""

    method = "flat-prior"

    def __init__(self, *, p: float = 0.5) -> None:
        self.p = p

    def estimate(self, queries: Sequence[Any]) -> list[Any]:
        from capgate import Estimate

        return [Estimate(p=self.p, method=self.method) for _ in queries]


class ReplayedEstimates(_estimator_base()):  # type: ignore[misc]
    """Start (b) replayed: each prompt's estimate as computed once by the live estimator (cached);
    a query it could not estimate stays unavailable (a degraded decision), as it was live."""

    def __init__(self, p_by_prompt: dict[str, float | None], *, method: str) -> None:
        self.p_by_prompt = p_by_prompt
        self.method = method

    def estimate(self, queries: Sequence[Any]) -> list[Any]:
        from capgate import Estimate

        out = []
        for query in queries:
            p = self.p_by_prompt.get(query) if isinstance(query, str) else None
            out.append(
                Estimate(p=p, method=self.method)
                if p is not None
                else Estimate.unavailable(self.method, "the live estimator gave no estimate for this query")
            )
        return out


def verbalized_estimates(
    queries: Sequence[Query], server: str, served: str, work: Path
) -> dict[str, float | None]:
    """Start (b): the verbalized estimate of every replayed query from the server, computed once.

    Cached in ``<work>/verbalized-<model>.json`` with the estimator's fingerprint (``bench/_cache``):
    a cache written by another estimator (settings, backend model) is recomputed.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _cache import read_estimates, write_estimates

    from capgate.adapters.backends.openai import OpenAIBackend
    from capgate.estimators import VerbalizedConfidence
    from capgate.estimators.fingerprint import estimator_fingerprint

    backend = OpenAIBackend(served, base_url=server, api_key="none", timeout=300.0, max_concurrency=8)
    estimator = VerbalizedConfidence(backend)
    fingerprint = estimator_fingerprint(estimator)
    path = work / f"verbalized-{served.replace('/', '_')}.json"
    cached = read_estimates(path, fingerprint, on_mismatch="recompute")
    todo = [q for q in queries if q.id not in cached]
    for start in range(0, len(todo), 16):
        batch = todo[start : start + 16]
        for query, estimate in zip(batch, estimator.estimate([q.prompt for q in batch]), strict=True):
            cached[query.id] = estimate.p
        write_estimates(path, fingerprint, cached, about="verbalized estimates of the replayed queries",
                        description={"estimator": "verbalized", "model": served})  # fmt: skip
        print(f"  verbalized: {len(cached)}/{len(queries)}", file=sys.stderr, flush=True)
    return {q.prompt: cached.get(q.id) for q in queries}


# --------------------------------------------------------------------------- replays


@dataclass(frozen=True)
class Replay:
    """One seeded replay: the learner's traffic (indices into the queries, in order, with binary
    outcomes) and the next traffic (indices of queries the learner never sees)."""

    index: int
    stream: npt.NDArray[np.int64]
    outcomes: npt.NDArray[np.bool_]
    next: npt.NDArray[np.int64]


def draw_replay(queries: Sequence[Query], index: int, *, seed: int, next_share: float, n: int) -> Replay:
    """Replay ``index``: a per-source seeded split into learning pool and next traffic; the learning
    pool in seeded shuffled rounds up to ``n`` decisions; each outcome drawn from its query's µ̂."""
    rng = np.random.default_rng([seed, index])
    by_source: dict[str, list[int]] = {}
    for i, query in enumerate(queries):
        by_source.setdefault(query.source, []).append(i)
    pool: list[int] = []
    held: list[int] = []
    for source in sorted(by_source):
        members = np.array(by_source[source])
        rng.shuffle(members)
        cut = round(next_share * len(members))
        held.extend(members[:cut].tolist())
        pool.extend(members[cut:].tolist())
    rounds = -(-n // len(pool))
    stream = np.concatenate([rng.permutation(pool) for _ in range(rounds)])[:n].astype(np.int64)
    mu = np.array([q.mu for q in queries])
    outcomes = rng.random(n) < mu[stream]
    return Replay(index=index, stream=stream, outcomes=outcomes, next=np.array(sorted(held), dtype=np.int64))


# --------------------------------------------------------------------------- the loop

POLICY = "demo-smollm2"  # the shipped preset for the embedded model: the shadow gate's policy
CHECKPOINTS = (100, 300, 1000)


@dataclass
class Scored:
    """What one calibration did on one replay's next traffic."""

    start: str
    replay: int
    n: int
    kind: str  # the calibration kept ("identity", "isotonic", "platt", "probe"), or "refused"
    note: str
    mu: npt.NDArray[np.float64]
    correct: npt.NDArray[np.int64]
    k: npt.NDArray[np.int64]
    p_start: npt.NDArray[np.float64]
    p_learned: npt.NDArray[np.float64]
    p_shipped: npt.NDArray[np.float64]
    answered: npt.NDArray[np.bool_] | None  # None: no risk-controlled policy (nothing certified)
    p_probe: npt.NDArray[np.float64] | None = None  # the learnt probe candidate's, kept or not


def _p(estimator: Any, prompts: list[str]) -> npt.NDArray[np.float64]:
    return np.array([np.nan if e.p is None else e.p for e in estimator.estimate(prompts)], dtype=np.float64)


def run_loop(
    name: str,
    start: Any,
    reader: CachedReader,
    shipped: Any,
    queries: Sequence[Query],
    replay: Replay,
    args: argparse.Namespace,
) -> list[Scored]:
    """One replay from one starting estimator: a shadow gate logs decisions with reader features,
    outcomes arrive in bulk at each checkpoint, ``capgate.learn.calibrate`` learns from the log,
    and the calibration is scored on the next traffic."""
    import shutil

    import capgate
    from capgate import Gate
    from capgate.decision import DecisionLog
    from capgate.estimators import ProbeEstimator
    from capgate.learn import CalibrationRefusedError, calibrate

    folder = args.work / "runs" / f"{name}-r{replay.index}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log = DecisionLog(folder / "decisions.sqlite3")
    is_probe = start.method == "probe"
    gate = Gate(
        policy=POLICY, estimator=start, mode="shadow", log=log, log_features=True,
        feature_reader=None if is_probe else reader,
    )  # fmt: skip
    call = capgate.guard(gate=gate)(lambda prompt: "(the model's answer, replayed)")
    nxt = [queries[i] for i in replay.next]
    prompts = [q.prompt for q in nxt]
    base = {
        "mu": np.array([q.mu for q in nxt]),
        "correct": np.array([q.correct for q in nxt]),
        "k": np.array([q.k for q in nxt]),
        "p_start": _p(start, prompts),
        "p_shipped": _p(shipped, prompts),
    }
    ids: list[str] = []
    scored: list[Scored] = []
    for n in args.checkpoints:
        for t in range(len(ids), n):
            call(queries[replay.stream[t]].prompt)
            decision = capgate.last_decision()
            assert decision is not None
            ids.append(decision.id)
        if not gate.flush(600.0):
            raise SystemExit(f"error: shadow decisions of {name} replay {replay.index} still in flight")
        outcomes = folder / f"outcomes-{n}.jsonl"
        with outcomes.open("w", encoding="utf-8") as sink:  # the outcomes that arrived since
            for t in range(scored[-1].n if scored else 0, n):
                line = {"decision_id": ids[t], "correct": bool(replay.outcomes[t]), "source": "replay"}
                sink.write(json.dumps(line) + "\n")
        log.import_outcomes(outcomes)
        try:
            result = calibrate(
                log, out=folder / f"calibration-{n}", risk=args.risk, delta=args.delta, seed=replay.index
            )
        except CalibrationRefusedError as exc:  # too few outcomes...: the start stays in force
            why = str(exc).splitlines()[0]
            scored.append(Scored(name, replay.index, n, "refused", why, **base, p_learned=base["p_start"],
                                 answered=None))  # fmt: skip
            continue
        cal = result.calibration
        learned = cal.apply(start, featurizer=reader)
        learnt_probe = result.candidates.get("probe")
        p_probe = None
        if learnt_probe is not None:  # the probe fitted on logged features and outcomes, kept or not
            p_probe = _p(ProbeEstimator(reader, learnt_probe, ignore_spec_fields=("dtype",)), prompts)
        answered = None
        if cal.policy is not None:  # a threshold was certified: the gate it makes, on the next traffic
            judge = Gate(policy=cal.policy, estimator=learned)
            answered = np.array([judge.assess(p).action == "answer" for p in prompts])
        scored.append(Scored(name, replay.index, n, result.kind, cal.version, **base,
                             p_learned=_p(learned, prompts), answered=answered, p_probe=p_probe))  # fmt: skip
    log.close()
    kept = ", ".join(f"{s.n}: {s.kind}" for s in scored)
    print(f"  {name} replay {replay.index}: {kept}", file=sys.stderr, flush=True)
    return scored


# --------------------------------------------------------------------------- statistics


def _brier(p: npt.NDArray[np.float64], mu: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Squared errors vs µ̂ (a query without an estimate is left out: NaN)."""
    return np.asarray((p - mu) ** 2, dtype=np.float64)


def two_stage_bootstrap(
    per_replay: Sequence[tuple[npt.NDArray[np.float64], ...]],
    stat: Any,
    *,
    seed: int,
    n_boot: int = 2000,
) -> tuple[float, float, float]:
    """``stat`` of the pooled per-query columns, and its 95% interval: resample the replays, then
    each chosen replay's next-traffic queries (both with replacement).

    ``per_replay``: per replay, a tuple of equally long per-query columns; ``stat(columns)`` maps
    the tuple of concatenated columns to a number.
    """
    rng = np.random.default_rng(seed)
    point = float(stat(tuple(np.concatenate(c) for c in zip(*per_replay, strict=True))))
    draws = np.empty(n_boot)
    for b in range(n_boot):
        chosen = [per_replay[i] for i in rng.integers(0, len(per_replay), len(per_replay))]
        parts = []
        for cols in chosen:
            rows = rng.integers(0, len(cols[0]), len(cols[0]))
            parts.append(tuple(c[rows] for c in cols))
        draws[b] = stat(tuple(np.concatenate(c) for c in zip(*parts, strict=True)))
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return point, float(lo), float(hi)


def _mean_brier(cols: tuple[npt.NDArray[np.float64], ...]) -> float:
    return float(np.nanmean(cols[0]))


def _relative(cols: tuple[npt.NDArray[np.float64], ...]) -> float:
    both = ~(np.isnan(cols[0]) | np.isnan(cols[1]))
    return float(cols[1][both].mean() / cols[0][both].mean() - 1.0)


def auroc_of(p: npt.NDArray[np.float64], s: Scored) -> float:
    """AUROC vs µ̂ on the next traffic (every sampled response an example; queries with an estimate)."""
    from capgate.metrics import auroc

    ok = ~np.isnan(p)
    return float(auroc(p[ok], s.correct[ok], k=s.k[ok]))


@dataclass(frozen=True)
class Row:
    """One start × checkpoint, over the replays."""

    start: str
    n: int
    replays: int
    kinds: dict[str, int]
    brier_start: tuple[float, float, float]
    brier_learned: tuple[float, float, float]
    change: tuple[float, float, float]  # relative change of the Brier, learned vs start
    auroc_learned: float
    auroc_shipped: float
    auroc_ratio: tuple[float, float, float]  # learned / shipped probe's, mean over replays, 95%
    auroc_probe: tuple[float, float, float]  # the learnt probe candidate's / shipped (NaN: none fitted)
    estimated_start: float  # share of the next traffic the start had an estimate for
    estimated_learned: float  # ... and the learned estimator
    probes: int  # replays whose calibration fitted a probe candidate
    certified: int  # replays whose calibration certified a threshold
    coverage: float  # mean over replays (0 where nothing was certified)
    error: float  # mean over replays that answered something
    within_risk: int  # replays whose answered share's error rate is at most the risk (or none answered)
    answering: int  # replays whose calibrated gate answered some of the next traffic
    ungated: float  # mean µ̂ of the next traffic (the ungated accuracy)


def summarize(scored: Sequence[Scored], risk: float, seed: int) -> Row:
    """The row of one start × checkpoint (all ``scored`` share both)."""
    # Both Briers over the queries the start estimated (paired); what the start left without an
    # estimate is counted apart (``estimated``), never scored as if it had been guessed.
    squares = [(_brier(s.p_start, s.mu), np.where(np.isnan(s.p_start), np.nan, _brier(s.p_learned, s.mu)))
               for s in scored]  # fmt: skip
    ratios = np.array([auroc_of(s.p_learned, s) / auroc_of(s.p_shipped, s) for s in scored])
    fitted = [s for s in scored if s.p_probe is not None]
    probe_ratios = np.array(
        [auroc_of(s.p_probe, s) / auroc_of(s.p_shipped, s) for s in fitted if s.p_probe is not None]
    )
    coverage, errors, within = [], [], 0
    for s in scored:
        answered = s.answered if s.answered is not None else np.zeros(len(s.mu), dtype=bool)
        coverage.append(float(answered.mean()))
        if answered.any():
            error = float(1.0 - s.mu[answered].mean())
            errors.append(error)
            within += error <= risk
        else:
            within += 1
    kinds: dict[str, int] = {}
    for s in scored:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    return Row(
        start=scored[0].start,
        n=scored[0].n,
        replays=len(scored),
        kinds=kinds,
        brier_start=two_stage_bootstrap([(a,) for a, _ in squares], _mean_brier, seed=seed),
        brier_learned=two_stage_bootstrap([(b,) for _, b in squares], _mean_brier, seed=seed),
        change=two_stage_bootstrap(squares, _relative, seed=seed),
        auroc_learned=float(np.mean([auroc_of(s.p_learned, s) for s in scored])),
        auroc_shipped=float(np.mean([auroc_of(s.p_shipped, s) for s in scored])),
        auroc_ratio=_mean_interval(ratios, seed),
        auroc_probe=_mean_interval(probe_ratios, seed),
        probes=len(fitted),
        estimated_start=float(np.mean([np.mean(~np.isnan(s.p_start)) for s in scored])),
        estimated_learned=float(np.mean([np.mean(~np.isnan(s.p_learned)) for s in scored])),
        certified=sum(s.answered is not None for s in scored),
        coverage=float(np.mean(coverage)),
        error=float(np.mean(errors)) if errors else float("nan"),
        within_risk=within,
        answering=len(errors),
        ungated=float(np.mean([s.mu.mean() for s in scored])),
    )


def _mean_interval(values: npt.NDArray[np.float64], seed: int) -> tuple[float, float, float]:
    """The mean over replays and its 95% bootstrap interval (NaNs for no values)."""
    if values.size == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    boot = [float(np.nanmean(values[rng.integers(0, values.size, values.size)])) for _ in range(2000)]
    return float(np.nanmean(values)), *map(float, np.percentile(boot, [2.5, 97.5]))


# --------------------------------------------------------------------------- output

STARTS = {"probe": "(a) default probe", "verbalized": "(b) verbalized", "flat": "(c) flat prior"}


def _ci(value: tuple[float, float, float], fmt: str = "{:.4f}") -> str:
    point, lo, hi = (fmt.format(v) for v in value)
    return f"{point} [{lo}, {hi}]"


def print_tables(rows: Sequence[Row], args: argparse.Namespace) -> None:
    """The issue's tables: Brier and AUROC, then risk/coverage; then each target, met or not."""
    head = "{:<20} {:>5}  {:<36} {:<26} {:<26} {:<24} {:<34} {}"
    print()
    print("capability Brier vs µ̂ and AUROC on the next traffic (mean over replays; 95% two-stage bootstrap)")
    columns = (
        "start",
        "N",
        "kept (replays)",
        "Brier start",
        "Brier learned",
        "change",
        "AUROC learned / shipped",
        "learnt probe / shipped",
    )
    print(head.format(*columns))
    for r in rows:
        kept = ", ".join(f"{k} {v}" for k, v in sorted(r.kinds.items(), key=lambda kv: -kv[1]))
        auc = f"{r.auroc_learned:.3f} / {r.auroc_shipped:.3f} = {_ci(r.auroc_ratio, '{:.2f}')}"
        learnt = "-" if not r.probes else f"{_ci(r.auroc_probe, '{:.2f}')} ({r.probes})"
        print(head.format(STARTS[r.start], r.n, kept, _ci(r.brier_start), _ci(r.brier_learned),
                          _ci(r.change, "{:+.1%}"), auc, learnt))  # fmt: skip
    for r in rows:
        if r.estimated_start < 1.0:
            print(f"{STARTS[r.start]}, N={r.n}: the start had an estimate for {r.estimated_start:.0%} of the "
                  f"next traffic (Briers above are over those queries), the learned estimator for "
                  f"{r.estimated_learned:.0%}")  # fmt: skip
    print()
    print(f"risk control on the next traffic: stated risk {args.risk}, delta {args.delta} (the calibrated "
          "policy's answered share; error = 1 - mean µ̂ of the answered queries)")  # fmt: skip
    head = "{:<20} {:>5} {:>10} {:>10} {:>9} {:>17} {:>12} {:>17}"
    columns = ("start", "N", "certified", "answering", "coverage", "error (answered)", "within risk")
    print(head.format(*columns, "ungated accuracy"))
    for r in rows:
        print(head.format(STARTS[r.start], r.n, f"{r.certified}/{r.replays}", f"{r.answering}/{r.replays}",
                          f"{r.coverage:.3f}",
                          "-" if np.isnan(r.error) else f"{r.error:.3f}", f"{r.within_risk}/{r.replays}",
                          f"{r.ungated:.3f}"))  # fmt: skip
    print()
    for r in rows:
        change, name = r.change[0], STARTS[r.start]
        if r.start == "probe":
            verdict = "met" if change <= 0 else "NOT met"
            print(f"target {name}, N={r.n}: learned never worse than the start: Brier change "
                  f"{_ci(r.change, '{:+.1%}')}: {verdict}")  # fmt: skip
        else:
            verdict = "met" if change <= -0.2 else "NOT met"
            print(f"target {name}, N={r.n}: Brier at least 20% below the start: "
                  f"{_ci(r.change, '{:+.1%}')}: {verdict}")  # fmt: skip
            if r.n == max(args.checkpoints):
                verdict = "met" if r.auroc_probe[0] >= 0.9 and r.probes == r.replays else "NOT met"
                print(f"target {name}, N={r.n}: the probe learnt from logged features and outcomes, "
                      f"AUROC at least 90% of the shipped probe's: {_ci(r.auroc_probe, '{:.1%}')} "
                      f"(fitted in {r.probes}/{r.replays} replays; the kept estimator's: "
                      f"{_ci(r.auroc_ratio, '{:.1%}')}): {verdict}")  # fmt: skip
        needed = int(np.ceil((1 - args.delta) * r.replays))
        verdict = "met" if r.within_risk >= needed else "NOT met"
        if verdict == "met" and r.answering < needed:
            verdict = f"met only vacuously: {r.replays - r.answering} replays answered nothing"
        print(f"target {name}, N={r.n}: error <= {args.risk} in >= {needed}/{r.replays} replays: "
              f"{r.within_risk}/{r.replays}: {verdict}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    import time

    parser = bench_parser(__doc__)
    parser.add_argument("--labels", type=Path, default=ASSETS / "default_labels.jsonl")
    parser.add_argument("--split", type=Path, default=ASSETS / "default_split.json")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--features-only", action="store_true", help="compute the features cache and stop")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--next-share", type=float, default=0.4, help="share of queries kept as next traffic")
    parser.add_argument(
        "--checkpoints", type=lambda s: tuple(int(x) for x in s.split(",")), default=CHECKPOINTS
    )
    parser.add_argument(
        "--risk", type=float, default=0.5, help="stated risk: error rate of the answered share"
    )
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--prior", type=float, default=0.5, help="start (c)'s constant p")
    parser.add_argument(
        "--starts", default="probe,verbalized,flat", help="which starts (verbalized needs --server)"
    )
    parser.add_argument(
        "--headline", default="probe", choices=sorted(STARTS), help="the start of the last line"
    )
    parser.add_argument("--server", help="OpenAI-compatible base URL (start (b))")
    parser.add_argument("--served-model", help="model name on the server")
    parser.add_argument(
        "--smoke", action="store_true", help="one short replay, synthetic features (a test runs it)"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        from _smoke import left_out, smoke_dir

        args.work, args.replays, args.checkpoints = smoke_dir("learn"), 1, (100,)
        args.starts = ",".join(s for s in args.starts.split(",") if s != "verbalized")
        left_out("the reader's model pass (synthetic features) and start (b) verbalized")
    queries = load_traffic(args.labels, args.split)
    print(f"traffic: {len(queries)} held-out queries of {args.labels.name} ({args.split.name} test), mean "
          f"µ̂ {np.mean([q.mu for q in queries]):.3f}; none is one the shipped probe was fit on")  # fmt: skip
    stored = reader_features(queries, args.work / f"features-{args.labels.stem}.npz", synthetic=args.smoke)
    print(f"reader features: {len(stored.ids)} x {stored.features.shape[1]} ({stored.path})")
    if args.features_only:
        return
    import torch

    from capgate.estimators import LinearProbe, ProbeEstimator
    from capgate.loading import default_probe_path

    torch.set_num_threads(1)  # calibrate's small SGD fits: one thread is twice as fast on a shared machine
    reader = CachedReader(stored, queries)
    shipped = ProbeEstimator(reader, LinearProbe.load(default_probe_path()), ignore_spec_fields=("dtype",))
    starts: dict[str, Any] = {}
    for name in args.starts.split(","):
        if name == "probe":
            starts[name] = shipped
        elif name == "flat":
            starts[name] = FlatPrior(p=args.prior)
        elif name == "verbalized" and args.server:
            p = verbalized_estimates(queries, args.server, args.served_model or "default", args.work)
            starts[name] = ReplayedEstimates(p, method="verbalized")
        elif name == "verbalized":
            print("start (b) verbalized: not measured (no --server given)")
        else:
            raise SystemExit(f"error: --starts: unknown start {name!r}; choose from {sorted(STARTS)}")
    n = max(args.checkpoints)
    replays = [
        draw_replay(queries, r, seed=args.seed, next_share=args.next_share, n=n) for r in range(args.replays)
    ]
    held = len(replays[0].next)
    print(f"replays: {args.replays} (seed {args.seed}); each: {held} next-traffic queries never seen by "
          f"the learner, a learning pool of {len(queries) - held} queries in seeded rounds, {n} decisions "
          f"with outcomes drawn from µ̂; checkpoints {list(args.checkpoints)}")  # fmt: skip
    rows: list[Row] = []
    for name, start in starts.items():
        began = time.perf_counter()
        scored = [
            s for replay in replays for s in run_loop(name, start, reader, shipped, queries, replay, args)
        ]
        for checkpoint in args.checkpoints:
            rows.append(summarize([s for s in scored if s.n == checkpoint], args.risk, args.seed))
        print(f"{STARTS[name]}: {args.replays} replays in {time.perf_counter() - began:.0f} s", flush=True)
    print_tables(rows, args)
    final = [r for r in rows if r.start == args.headline and r.n == n] or [rows[-1]]
    r = final[0]
    risk = "n/a" if np.isnan(r.error) else f"{r.error:.3f}"  # n/a: nothing answered (coverage 0)
    print(f"learn: after {r.n} outcomes Brier {r.brier_start[0]:.4f} -> {r.brier_learned[0]:.4f} "
          f"(start: {STARTS[r.start]}); risk {risk} at coverage {r.coverage:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
