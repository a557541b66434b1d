"""Throughput of the metrics core.

Measures, on synthetic data generated here (seeded): every capability-calibration metric on
10 million rows (rows/s for each), and the greedy budget allocator at N = 100,000 queries with a
budget of 8N samples (seconds), with the uniform allocator and the exact pooled evaluation beside
it for scale. Run: ``python bench/metrics_bench.py [--rows N]``; ``--smoke`` runs it on 10,000 rows and
1,000 queries, one repetition each (the test suite runs it).
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import numpy as np
from _report import best_time

from capgate import metrics as m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--budget-factor", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="seconds on tiny data (the test suite runs it)")
    args = parser.parse_args()
    repeats = 1 if args.smoke else 3
    if args.smoke:
        args.rows, args.queries = 10_000, 1_000

    rng = np.random.default_rng(0)
    n_rows = args.rows
    k = np.full(n_rows, 100, dtype=np.int64)
    mu_true = rng.beta(2.0, 1.0, n_rows)
    correct = rng.binomial(k, mu_true)
    mu = correct / k
    p = np.clip(mu_true + rng.normal(0, 0.1, n_rows), 0.0, 1.0)

    print(f"capgate metrics bench | numpy {np.__version__} | {platform.processor() or platform.machine()}")
    print(f"data: {n_rows:,} synthetic queries, k=100 samples each, µ ~ Beta(2,1), p = µ + N(0, 0.1) clipped")
    print(f"timing: best of {repeats} runs, wall clock\n")
    cases: list[tuple[str, Callable[[], object]]] = [
        ("capability_brier", lambda: m.capability_brier(p, mu)),
        ("response_brier", lambda: m.response_brier(p, correct, k)),
        ("ece (10 equal-width bins)", lambda: m.expected_calibration_error(p, mu)),
        ("ece (10 equal-mass bins)", lambda: m.expected_calibration_error(p, mu, strategy="quantile")),
        ("reliability_diagram", lambda: m.reliability_diagram(p, mu)),
        ("auroc (response-level)", lambda: m.auroc(p, correct, k=k)),
        ("auprc (response-level)", lambda: m.auprc(p, correct, k=k)),
        ("spearman", lambda: m.spearman(p, mu)),
        ("pearson", lambda: m.pearson(p, mu)),
        ("pass@k MSE, k in 1,4,16,64", lambda: m.pass_at_k_mse(p, k, correct, [1, 4, 16, 64])),
    ]
    print(f"{'metric':<30} {'seconds':>9} {'rows/s':>14}")
    for name, fn in cases:
        seconds = best_time(fn, repeats)
        print(f"{name:<30} {seconds:>9.3f} {n_rows / seconds:>14,.0f}")

    n_queries = args.queries
    budget = args.budget_factor * n_queries
    pq = rng.random(n_queries)
    pool = np.full(n_queries, 100, dtype=np.int64)
    pool_correct = rng.binomial(pool, pq)
    print(f"\nbudget allocation: N={n_queries:,} queries, budget {budget:,} samples, pools of 100")
    print(f"{'step':<30} {'seconds':>9}")
    greedy_seconds = best_time(lambda: m.greedy_allocation(pq, budget, max_per_query=pool), repeats=1)
    print(f"{'greedy_allocation (heap)':<30} {greedy_seconds:>9.3f}")
    allocation = m.greedy_allocation(pq, budget, max_per_query=pool)
    uniform_seconds = best_time(lambda: m.uniform_allocation(n_queries, budget), repeats)
    print(f"{'uniform_allocation':<30} {uniform_seconds:>9.3f}")
    exact_seconds = best_time(lambda: m.expected_success(allocation, pool, pool_correct), repeats)
    print(f"{'expected_success (exact)':<30} {exact_seconds:>9.3f}")


if __name__ == "__main__":
    main()
