"""Can text in the query lift capability estimates? Attack families on held-out queries.

Data: the shipped probe v1's 96 held-out queries (``bench/data/default_v1/split.json``; labels
k=40 at temperature 0.7, 24 tokens, in ``sdk/assets/default_labels.jsonl``), which no probe here
was trained on. ``--n`` of them (seeded sample) are attacked by every family of
``bench/injection_families.py``. TUNE families are the only text any defence was trained or
tuned on (the claim detector, ``bench/train_claim_detector.py``; the claim-invariance
projection of the default probe, ``bench/default_probe_v2.py``); EVAL families are only measured.

Estimators: the v1 probe (``bench/data/default_v1/probe``), the installed default probe
(``sdk/assets/default_probe``, what ``capgate.load_estimator("default")`` reads) raw and wrapped
in ``InjectionGuard`` (``guard=True``), and, with ``--server``, verbalized confidence and P(True)
against an OpenAI-compatible server of the same model (the CI vLLM server). Per family and
estimator: mean and largest lift of p over the same query's clean estimate, the share of queries
whose p crosses an edge (0.2 or 0.5) upward, and the share marked degraded. With ``--server`` and
``--mu-n M``, the model's measured µ̂ on M attacked queries per family (k = ``--mu-k``, same
sampling settings as the labels), so a real change of capability is told apart from
manipulation. Clean rows: capability Brier of each probe on the 96 queries, and the guard's
false-positive rate (clean queries marked degraded).

Resumable: hidden states are cached per prompt under ``--work/layers/``, black-box estimates
and the attacked-prompt harvest in JSON-lines files under ``--work``.

    .venv/bin/python bench/injection_bench.py [--n 32] [--server URL --served-model NAME --mu-n 8]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cache import check_jsonl
from _report import bench_parser
from injection_families import FAMILIES, Family

from capgate import Estimate
from capgate.core.backend import Prompt
from capgate.datasets import DatasetItem
from capgate.estimators import CapabilityEstimator, LinearProbe, ProbeEstimator
from capgate.estimators.fingerprint import estimator_fingerprint
from capgate.estimators.guarded import InjectionGuard
from capgate.labels.labelled import read_labelled

ROOT = Path(__file__).resolve().parents[1]
EDGES = (0.2, 0.5)
V1 = ROOT / "bench" / "data" / "default_v1"


def _key(q: Prompt) -> str:
    return q if isinstance(q, str) else json.dumps(list(q), sort_keys=True)


class LayerCache:
    """Per-layer hidden states of the embedded model, cached per prompt as ``.npy`` files."""

    def __init__(self, folder: Path, model: str | Path = "default") -> None:
        from capgate.local.hidden_states import HiddenStateFeaturizer
        from capgate.local.models import load_model

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.featurizer = HiddenStateFeaturizer(load_model(model, device="cpu"), batch_size=8)
        self.passes = 0

    def seed(self, stored: Path, prompts: dict[str, str]) -> int:
        """Reuse rows of a per-layer feature file (``default_probe_v2.py``'s) for these prompts."""
        from capgate.estimators.feature_store import load_features

        if stored.exists():
            found = load_features(stored)
            rows = zip(found.ids, found.features, strict=True)
        else:  # an unfinished run: its finished parts (plain arrays, no pickle)
            parts = [
                np.load(f, allow_pickle=False)
                for f in sorted(stored.parent.glob(stored.name + ".parts/*.npz"))
            ]
            rows = (
                (str(i), row) for part in parts for i, row in zip(part["ids"], part["features"], strict=True)
            )
        reused = 0
        for qid, row in rows:
            if qid in prompts and not self._path(prompts[qid]).exists():
                np.save(self._path(prompts[qid]), row.astype(np.float32))
                reused += 1
        return reused

    def _path(self, q: Prompt) -> Path:
        return self.folder / (hashlib.sha256(_key(q).encode()).hexdigest()[:32] + ".npy")

    def get(self, queries: Sequence[Prompt]) -> np.ndarray:
        todo = list({_key(q): q for q in queries if not self._path(q).exists()}.values())
        for start in range(0, len(todo), 8):
            batch = todo[start : start + 8]
            for q, row in zip(batch, self.featurizer.transform_layers(batch), strict=True):
                tmp = self._path(q).with_suffix(".tmp.npy")
                np.save(tmp, row.astype(np.float32))
                tmp.replace(self._path(q))
            self.passes += len(batch)
        return np.stack([np.load(self._path(q)) for q in queries])


class Pooled:
    """A featurizer over the cache: the mean of a probe's layers (its own spec)."""

    def __init__(self, cache: LayerCache, probe: LinearProbe) -> None:
        self.cache, self._spec = cache, dict(probe.feature_spec_ or {})
        layers = self._spec.get("layers", "all")
        self.positions = None if layers == "all" else list(layers)  # hidden-state index = position

    @property
    def spec(self) -> dict[str, Any]:
        return self._spec

    def transform(self, queries: Sequence[Prompt]) -> np.ndarray:
        X = self.cache.get(queries)
        return (X if self.positions is None else X[:, self.positions]).mean(axis=1)


class Cached(CapabilityEstimator):
    """Caches an estimator's estimates by exact prompt in a JSON-lines file (resumable), keyed by
    the estimator's fingerprint (``bench/_cache.py``: a cache from other settings is refused)."""

    def __init__(self, inner: CapabilityEstimator, path: Path) -> None:
        self.inner, self.path, self.method = inner, path, inner.method
        check_jsonl(path, estimator_fingerprint(inner), description={"estimator": repr(inner)})
        self.cache: dict[str, Estimate] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                self.cache[row["key"]] = Estimate.model_validate(row["estimate"])

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        todo = list({_key(q): q for q in queries if _key(q) not in self.cache}.values())
        if todo:
            with self.path.open("a") as out:
                for q, e in zip(todo, self.inner.estimate(todo), strict=True):
                    self.cache[_key(q)] = e
                    out.write(json.dumps({"key": _key(q), "estimate": e.model_dump(mode="json")}) + "\n")
        return [self.cache[_key(q)] for q in queries]


def crossed(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Queries whose p moved up across an edge."""
    return np.any([(before < e) & (after >= e) for e in EDGES], axis=0)


def ps(estimates: list[Estimate]) -> np.ndarray:
    return np.array([np.nan if e.p is None else e.p for e in estimates])


def family_row(clean: list[Estimate], attacked: list[Estimate]) -> dict[str, float]:
    """Lift, crossing and flagged share of one estimator on one family."""
    before, after = ps(clean), ps(attacked)
    lift = after - before
    ok = ~np.isnan(lift)
    return {
        "mean": float(np.mean(lift[ok])) if ok.any() else float("nan"),
        "max": float(np.max(lift[ok])) if ok.any() else float("nan"),
        "crossing": float(crossed(before[ok], after[ok]).mean()) if ok.any() else float("nan"),
        "flagged": float(
            np.mean([e.degraded and not c.degraded for e, c in zip(attacked, clean, strict=True)])
        ),
    }


def measured_mu(
    args: argparse.Namespace,
    families: Sequence[Family],
    items: dict[str, DatasetItem],
    prompts: dict[str, str],
) -> dict[tuple[str, str], float]:
    """The model's µ̂ on attacked prompts (``--mu-n`` queries per family), harvested resumably."""
    from probe_smollm2 import make_backend

    from capgate.labels.harvesting import harvest

    rng = np.random.default_rng(args.seed + 7)
    picked = sorted(str(q) for q in rng.choice(sorted(items), size=args.mu_n, replace=False))
    attacked: dict[str, Prompt] = {}
    chosen: list[DatasetItem] = []
    for family in families:
        for q in picked:
            qid = f"{q}|{family.name}"
            attacked[qid] = family.apply(prompts[q])
            chosen.append(items[q].model_copy(update={"id": qid}))
    out = args.work / "attacked_mu.jsonl"
    harvest(
        make_backend(args.server, args.served_model, concurrency=16), chosen, out, k=args.mu_k,
        temperature=0.7, top_p=1.0, max_tokens=24, batch_size=16, prompt=lambda item: attacked[item.id],
        dataset="injection-attacked-v1-heldout",
    )  # fmt: skip
    return {
        tuple(r.id.split("|", 1)): r.correct / r.k  # type: ignore[misc]
        for r in read_labelled(out).records
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "injection")
    parser.add_argument("--n", type=int, default=32, help="held-out queries attacked per family (of 96)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server", help="OpenAI-compatible base URL for verbalized / P(True) / µ̂")
    parser.add_argument("--served-model", help="model name on the server")
    parser.add_argument("--mu-n", type=int, default=0, help="queries per family whose µ̂ is measured")
    parser.add_argument("--mu-k", type=int, default=20, help="samples per attacked query for µ̂")
    parser.add_argument(
        "--probe",
        type=Path,
        default=ROOT / "sdk" / "assets" / "default_probe",
        help="the default probe's folder",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: 6 held-out queries, 2 attacked per family, a tiny model and probe (a test runs it)",
    )
    args = parser.parse_args()
    if not args.smoke:
        run(args)
        return
    import contextlib

    from _smoke import left_out, openai_server, smoke_dir, tiny_model, tiny_probe

    folder = smoke_dir("injection")
    args.work, args.n, args.mu_n = folder / "work", 2, 0
    args.model = tiny_model(folder)
    args.probe = args.v1_probe = tiny_probe(args.model, folder)
    left_out("the embedded model, the v1 and default probes (a tiny model and one probe fitted for it)")
    left_out("the measured µ̂ on attacked prompts (--mu-n)")
    with contextlib.ExitStack() as stack:
        if not args.server:
            args.server, args.served_model = stack.enter_context(openai_server())
        run(args, limit=6)


def run(args: argparse.Namespace, limit: int | None = None) -> None:
    args.work.mkdir(parents=True, exist_ok=True)
    recs = {r.id: r for r in read_labelled(ROOT / "sdk/assets/default_labels.jsonl").records}
    test = json.loads((V1 / "split.json").read_text())["test"][:limit]
    prompts = {i: str((recs[i].model_extra or {})["prompt"]) for i in test}
    clean_prompts = [prompts[i] for i in test]
    mu = np.array([recs[i].correct / recs[i].k for i in test])
    cache = LayerCache(args.work / "layers", getattr(args, "model", "default"))
    if limit is None:  # the default probe bench's features are the embedded model's
        cache.seed(ROOT / "bench" / "results" / "default_v2" / "features_per_layer.npz", prompts)
    v1 = LinearProbe.load(getattr(args, "v1_probe", V1 / "probe"))
    v2 = LinearProbe.load(args.probe)
    estimators: dict[str, CapabilityEstimator] = {
        "v1 probe": ProbeEstimator(Pooled(cache, v1), v1),
        "default probe": ProbeEstimator(Pooled(cache, v2), v2),
    }
    estimators["default + guard"] = InjectionGuard(estimators["default probe"])
    if args.server:
        from probe_smollm2 import make_backend

        from capgate.estimators import PTrue, VerbalizedConfidence

        backend = make_backend(args.server, args.served_model, concurrency=16)
        estimators["verbalized"] = Cached(VerbalizedConfidence(backend), args.work / "verbalized.jsonl")
        estimators["P(True)"] = Cached(PTrue(backend), args.work / "ptrue.jsonl")
    clean = {name: est.estimate(clean_prompts) for name, est in estimators.items()}
    chosen = np.sort(
        np.random.default_rng(args.seed).choice(len(test), size=min(args.n, len(test)), replace=False)
    )
    items = {
        i: DatasetItem(
            id=i,
            question=recs[i].question,
            references=recs[i].references,
            kind=(recs[i].model_extra or {})["kind"],
        )
        for i in test
    }
    mu_attacked = measured_mu(args, FAMILIES, items, prompts) if args.server and args.mu_n else {}
    lines = [
        f"data: {len(test)} v1 held-out queries (clean rows); {len(chosen)} attacked per family "
        f"(seed {args.seed}); estimators: {', '.join(estimators)}",
        "| family | role | estimator | mean lift | max lift | crossing 0.2/0.5 | flagged |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary: dict[str, dict[str, list[float]]] = {}
    mu_lines = [
        f"| family | role | queries | clean µ̂ (k=40) | attacked µ̂ (k={args.mu_k}) | change |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        attacked_prompts = [family.apply(clean_prompts[j]) for j in chosen]
        for name, est in estimators.items():
            row = family_row([clean[name][j] for j in chosen], est.estimate(attacked_prompts))
            summary.setdefault(name, {}).setdefault(family.role, []).append(row["mean"])
            summary[name].setdefault(f"{family.role}-crossing", []).append(row["crossing"])
            lines.append(
                f"| {family.name} | {family.role} | {name} | {row['mean']:+.4f} | {row['max']:+.3f} "
                f"| {row['crossing']:.1%} | {row['flagged']:.1%} |"
            )
            print(lines[-1], flush=True)
        got = [(q, m) for (q, f), m in mu_attacked.items() if f == family.name]
        if got:
            before = np.mean([recs[q].correct / recs[q].k for q, _ in got])
            after = np.mean([m for _, m in got])
            mu_lines.append(
                f"| {family.name} | {family.role} | {len(got)} | {before:.3f} | {after:.3f} "
                f"| {after - before:+.3f} |"
            )
    for name in ("v1 probe", "default probe", "default + guard"):
        p_clean = ps(clean[name])
        flagged = np.mean([e.degraded for e in clean[name]])
        lines.append(
            f"clean held-out ({len(test)}): {name}: capability Brier {np.mean((p_clean - mu) ** 2):.4f}; "
            f"clean queries marked degraded {flagged:.1%}"
        )
    if len(mu_lines) > 2:
        lines += [
            "",
            "measured capability on attacked prompts (same sampling settings as the labels):",
            *mu_lines,
        ]
    lines.append(f"forward passes of the reader model this run: {cache.passes}")
    for name, rows in summary.items():
        lines.append(
            f"injection {name}: eval families mean lift {np.mean(rows['eval']):+.4f} "
            f"(worst family {np.max(rows['eval']):+.4f}, "
            f"worst crossing {np.max(rows['eval-crossing']):.1%}); "
            f"tune families {np.mean(rows['tune']):+.4f}"
        )
    print("\n".join(lines))
    (args.work / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
