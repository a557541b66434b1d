"""Adaptive sampling on real pooled samples: fixed-N majority vs Adaptive-Consistency vs CAS.

Data: harvested pools of a real model's answers on real questions (default: the labels shipped
for the embedded SmolLM2-135M-Instruct, ``sdk/assets/default_labels.jsonl``: basic_arithmetic
easy/medium/hard and TriviaQA, k = 40 graded samples per query, each with its extracted answer,
correctness and mean token log-probability; reproduce with ``bench/probe_smollm2.py``).

Method: every run replays a query's pool in a random order (``capgate.cas.replay``, the same loop
``adaptive_sample`` runs live), averaged over ``--orders`` seeded orders (default 20):

* fixed-N majority, N = 5, 10, 20, 40 (votes unweighted);
* Adaptive-Consistency: one sample at a time, stop when P(X > 0.5) >= 0.95 for
  X ~ Beta(v1 + 1, v2 + 1) (``beta_consensus(0.95)``), at most 40;
* CAS: one sample at a time, confidence-weighted vote, stop when σ(s·(c1 − c2 − ε)) >= 0.5
  (``cas_confidence_gap()`` defaults), at most 40. The per-response confidence is the token-
  logprob confidence exp(mean token log-prob) stored with each sample.

* the same two with ``beta_futility(0.05)`` added: give up once even the leading answer is
  unlikely (posterior < 0.05) to hold a majority of the responses. Added after the first run of
  this bench showed consensus rules sampling to the cap on queries where no majority forms; its
  level mirrors the consensus level 0.95 and was not tuned (see the sweep).

A query counts as solved when the vote winner is a correct answer. Printed: accuracy (%),
mean samples per query, and each method's samples ratio against fixed N = 40 with its accuracy
gap in points. A sensitivity sweep of the stop thresholds follows, labelled as such (choosing a
setting from it on the same data would be tuning on the test set).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from capgate.cas import (
    beta_consensus,
    beta_futility,
    cas_confidence_gap,
    replay,
    stop_after_samples,
    stop_never,
)
from capgate.cas.stop import StopFn
from capgate.labels import iter_labelled

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LABELS = ROOT / "sdk" / "assets" / "default_labels.jsonl"
PoolItem = tuple[str | None, bool, float | None, int]


def load_pools(path: Path) -> list[list[PoolItem]]:
    pools = []
    for _, record in iter_labelled(path):
        if not record.samples:
            continue
        pools.append(
            [
                (
                    s.answer,
                    s.correct,
                    None if s.mean_logprob is None else math.exp(s.mean_logprob),
                    s.n_tokens or 0,
                )
                for s in record.samples
            ]
        )
    return pools


def run(
    pools: list[list[PoolItem]], orders: int, stop: Callable[[], StopFn], *, cap: int, weighted: bool
) -> tuple[float, float]:
    """Mean accuracy and mean samples per query over ``orders`` random orders."""
    solved = np.zeros(orders)
    used = np.zeros(orders)
    for r in range(orders):
        rng = np.random.default_rng(1000 + r)
        for pool in pools:
            order = rng.permutation(len(pool))
            drawn = [pool[i] if weighted else (pool[i][0], pool[i][1], None, pool[i][3]) for i in order]
            result = replay(drawn, stop=stop(), batch_size=1, max_samples=min(cap, len(drawn)), seed=r)
            solved[r] += bool(result.correct)
            used[r] += result.samples_used
    n = len(pools)
    return float(np.mean(solved) / n * 100.0), float(np.mean(used) / n)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--labels", type=Path, default=DEFAULT_LABELS)
    parser.add_argument("--orders", type=int, default=20)
    parser.add_argument("--max-samples", type=int, default=40)
    args = parser.parse_args()
    pools = load_pools(args.labels)
    if not pools:
        raise SystemExit(f"{args.labels}: no query has per-sample records")
    sizes = {len(p) for p in pools}
    cap = args.max_samples
    if min(sizes) < cap:
        raise SystemExit(f"{args.labels}: pools of {min(sizes)} samples; need >= {cap}")
    answered = np.mean([sum(a is not None for a, *_ in p) / len(p) for p in pools])
    mu = np.mean([sum(c for _, c, *_ in p) / len(p) for p in pools])
    print(
        f"data: {args.labels.name}: {len(pools)} queries, {min(sizes)} pooled samples each; "
        f"mean µ̂ {mu:.3f}; share of samples with an extractable answer {answered:.2f}"
    )
    print(
        f"method: replay in {args.orders} random orders per query (seeded), one sample per step, cap {cap}\n"
    )

    rows: list[tuple[str, float, float]] = []
    for n in (5, 10, 20, 40):
        acc, used = run(pools, args.orders, lambda: stop_never(), cap=n, weighted=False)
        rows.append((f"fixed-N majority, N={n}", acc, used))
    acc, used = run(
        pools, args.orders, lambda: beta_consensus(0.95) | stop_after_samples(cap), cap=cap, weighted=False
    )
    rows.append(("Adaptive-Consistency (Beta, 0.95)", acc, used))
    acc, used = run(
        pools, args.orders, lambda: cas_confidence_gap() | stop_after_samples(cap), cap=cap, weighted=True
    )
    rows.append(("CAS (confidence gap, defaults)", acc, used))
    acc, used = run(
        pools, args.orders, lambda: cas_confidence_gap() | beta_consensus(0.95) | stop_after_samples(cap),
        cap=cap, weighted=True,
    )  # fmt: skip
    rows.append(("CAS | Beta (capgate default stop)", acc, used))
    acc, used = run(
        pools, args.orders, lambda: beta_consensus(0.95) | beta_futility(0.05) | stop_after_samples(cap),
        cap=cap, weighted=False,
    )  # fmt: skip
    rows.append(("Adaptive-Consistency | futility 0.05", acc, used))
    acc, used = run(
        pools, args.orders,
        lambda: cas_confidence_gap() | beta_consensus(0.95) | beta_futility(0.05) | stop_after_samples(cap),
        cap=cap, weighted=True,
    )  # fmt: skip
    rows.append(("CAS | Beta | futility 0.05", acc, used))

    ref_acc, ref_used = rows[3][1], rows[3][2]
    print(
        f"{'method':<36} {'accuracy %':>10} {'samples/query':>14} "
        f"{'vs N=40: samples ratio':>24} {'acc gap (pts)':>14}"
    )
    for name, acc, used in rows:
        print(f"{name:<36} {acc:>10.2f} {used:>14.2f} {ref_used / used:>23.2f}x {acc - ref_acc:>+14.2f}")
    target = [
        (n, ref_used / u, a - ref_acc) for n, a, u in rows[4:] if ref_used / u >= 3 and a - ref_acc >= -0.5
    ]
    verdict = ", ".join(f"{n} ({r:.1f}x, {g:+.2f} pts)" for n, r, g in target) or "none"
    print(f"\nmeets the target (>= 3x fewer samples than N=40 within 0.5 points of its accuracy): {verdict}")

    print("\nsensitivity of the stop thresholds (same data; not a tuned result):")
    print(f"{'rule':<44} {'accuracy %':>10} {'samples/query':>14} {'ratio':>7}")
    for threshold in (0.8, 0.9, 0.99):
        acc, used = run(
            pools,
            args.orders,
            lambda t=threshold: beta_consensus(t) | stop_after_samples(cap),
            cap=cap,
            weighted=False,
        )
        print(f"{f'beta_consensus({threshold})':<44} {acc:>10.2f} {used:>14.2f} {ref_used / used:>6.2f}x")
    for level in (0.01, 0.1, 0.2):
        acc, used = run(
            pools, args.orders,
            lambda t=level: (
                cas_confidence_gap() | beta_consensus(0.95) | beta_futility(t) | stop_after_samples(cap)
            ),
            cap=cap, weighted=True,
        )  # fmt: skip
        name = f"CAS | Beta | beta_futility({level})"
        print(f"{name:<44} {acc:>10.2f} {used:>14.2f} {ref_used / used:>6.2f}x")
    for margin in (0.3, 0.7, 0.9):
        acc, used = run(
            pools, args.orders, lambda m=margin: cas_confidence_gap(margin=m) | stop_after_samples(cap),
            cap=cap, weighted=True,
        )  # fmt: skip
        print(
            f"{f'cas_confidence_gap(margin={margin})':<44} {acc:>10.2f} {used:>14.2f} "
            f"{ref_used / used:>6.2f}x"
        )


if __name__ == "__main__":
    main()
