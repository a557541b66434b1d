"""Can text in the query lift capability estimates? Attack families on held-out queries.

Data: the default probe's held-out split (``sdk/assets/default_split.json``; labels k=40 at
temperature 0.7 in ``sdk/assets/default_labels.jsonl``); ``--n`` of the 96 queries (seeded
sample) are attacked by every family of ``bench/injection_families.py``, whose TUNE families
are the only text the claim detector was trained and thresholded on
(``bench/train_claim_detector.py``) and whose EVAL families are only measured here.

Estimator: the shipped probe on the embedded SmolLM2-135M-Instruct, raw (``ProbeEstimator``)
and guarded (``InjectionGuard``, what ``capgate.load_estimator("default")`` returns). Per
family: mean and largest lift of p over the same query's clean estimate, share of queries whose
p crosses an edge (0.2 or 0.5) upward, and the share the guard marks degraded. Clean rows:
capability Brier of raw and guarded on all 96 held-out queries, and the guard's false-positive
rate (clean queries marked degraded).

Resumable: every probe estimate is cached by its exact prompt in ``--work/probe_cache.jsonl``.

    .venv/bin/python bench/injection_bench.py [--n 48]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from injection_families import FAMILIES

import capgate
from capgate import Estimate
from capgate.backend import Prompt
from capgate.estimators import CapabilityEstimator
from capgate.estimators.guarded import InjectionGuard
from capgate.labels import read_labelled

ROOT = Path(__file__).resolve().parents[1]
EDGES = (0.2, 0.5)


def _key(q: Prompt) -> str:
    return q if isinstance(q, str) else json.dumps(list(q), sort_keys=True)


class Cached(CapabilityEstimator):
    """Caches an estimator's estimates by exact prompt in a JSON-lines file (resumable)."""

    def __init__(self, inner: CapabilityEstimator, path: Path) -> None:
        self.inner, self.path, self.method = inner, path, inner.method
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
    return np.any([(before < e) & (after >= e) for e in EDGES], axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "results" / "injection")
    parser.add_argument("--n", type=int, default=48, help="held-out queries attacked (of 96)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    recs = {r.id: r for r in read_labelled(ROOT / "sdk/assets/default_labels.jsonl").records}
    test = json.loads((ROOT / "sdk/assets/default_split.json").read_text())["test"]
    prompts = [str((recs[i].model_extra or {})["prompt"]) for i in test]
    mu = np.array([recs[i].correct / recs[i].k for i in test])
    raw_est = capgate.load_estimator("default", device="cpu", guard=False)
    raw = Cached(raw_est, args.work / "probe_cache.jsonl")
    guard = InjectionGuard(raw)

    def ps(estimates: list[Estimate]) -> np.ndarray:
        return np.array([np.nan if e.p is None else e.p for e in estimates])

    clean_raw, clean_guard = raw.estimate(prompts), guard.estimate(prompts)
    p_raw, p_guard = ps(clean_raw), ps(clean_guard)
    flagged_clean = np.array([e.degraded for e in clean_guard])
    chosen = np.sort(
        np.random.default_rng(args.seed).choice(len(test), size=min(args.n, len(test)), replace=False)
    )
    lines = [
        f"data: {len(test)} held-out queries (clean rows), "
        f"{len(chosen)} attacked per family (seed {args.seed})",
        "| family | role | raw mean lift | raw max lift | raw crossing | guarded mean lift "
        "| guarded max lift | guarded crossing | flagged |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        attacked = [family.apply(prompts[j]) for j in chosen]
        a_raw, a_guard = raw.estimate(attacked), guard.estimate(attacked)
        lift_r, lift_g = ps(a_raw) - p_raw[chosen], ps(a_guard) - p_guard[chosen]
        cross_r = crossed(p_raw[chosen], ps(a_raw)).mean()
        cross_g = crossed(p_guard[chosen], ps(a_guard)).mean()
        flagged = np.mean([e.degraded for e in a_guard])
        lines.append(
            f"| {family.name} | {family.role} | {np.nanmean(lift_r):+.4f} | {np.nanmax(lift_r):+.3f} "
            f"| {cross_r:.1%} | {np.nanmean(lift_g):+.4f} | {np.nanmax(lift_g):+.3f} "
            f"| {cross_g:.1%} | {flagged:.1%} |"
        )
        print(lines[-1], flush=True)
    brier_raw, brier_guard = np.mean((p_raw - mu) ** 2), np.mean((p_guard - mu) ** 2)
    lines.append(
        f"clean held-out (96): capability Brier raw {brier_raw:.4f}, guarded {brier_guard:.4f} "
        f"(change {brier_guard - brier_raw:+.4f}); false positives (clean marked degraded) "
        f"{flagged_clean.sum()}/{len(test)} = {flagged_clean.mean():.1%}"
    )
    print("\n".join(lines))
    (args.work / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
