"""Risk-controlled thresholds: how often the guarantee is violated, and how much they answer.

For each data set, calibration sets are drawn repeatedly (seeded) and ``calibrate_threshold`` picks
the answer threshold λ̂; the table reports, over the repetitions, the frequency of a selective risk
above alpha at λ̂ (the guarantee says <= delta), how often a threshold was certified at all, the
mean coverage (0 when none was certified) against the best coverage any threshold with true risk
<= alpha reaches, and the time per calibration.

Data:
* synthetic: confidence C ~ Beta(5, 1.5), capability µ(C) (calibrated µ = C; overconfident µ = C^2;
  "inverted top": µ = 0.75 above C = 0.97, else min(1, C + 0.08)), µ̂ from 10 sampled responses;
  2000 calibration queries a draw; the population risk R(λ) is computed by quadrature.
* MATH-500 (sdk/assets): the 500 queries with their Probe-MATH confidence and µ̂ from 100
  responses, as the population: 300 calibration queries drawn with replacement each time, risk of
  λ̂ computed over all 500.

Run: ``python bench/risk_control_bench.py [--reps 200] [--delta 0.1]``; ``--smoke`` runs every row
with 3 draws (the test suite runs it).
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from capgate.decision.analysis.risk import calibrate_threshold
from capgate.labels.labelled import read_labelled

Array = NDArray[np.float64]
ROOT = Path(__file__).resolve().parents[1]
METHODS = [
    ("binomial", "sampled", "fallback"),
    ("binomial", "sampled", "fixed-sequence"),
    ("hoeffding-bentkus", "expected", "fallback"),
]


class Population:
    """Draws calibration sets and knows the true selective risk and coverage of a threshold."""

    def __init__(
        self,
        draw: Callable[[np.random.Generator], tuple[Array, Array]],
        risk: Callable[[float], float],
        coverage: Callable[[float], float],
    ) -> None:
        self.draw, self.risk, self.coverage = draw, risk, coverage

    def best_coverage(self, alpha: float) -> float:
        return max((self.coverage(t) for t in np.linspace(0, 1, 1001) if self.risk(t) <= alpha), default=0.0)


def synthetic(mu: Callable[[Array], Array], n: int = 2000, k: int = 10) -> Population:
    grid = (np.arange(400_000) + 0.5) / 400_000
    dens = grid**4 * (1 - grid) ** 0.5
    mass = np.cumsum(dens[::-1])[::-1]
    loss = np.cumsum((dens * (1 - mu(grid)))[::-1])[::-1]

    def at(lam: float) -> int:
        return int(np.searchsorted(grid, lam))

    def draw(rng: np.random.Generator) -> tuple[Array, Array]:
        conf = rng.beta(5, 1.5, size=n)
        return conf, rng.binomial(k, mu(conf)) / k

    return Population(
        draw,
        lambda lam: 0.0 if at(lam) >= grid.size else float(loss[at(lam)] / mass[at(lam)]),
        lambda lam: 0.0 if at(lam) >= grid.size else float(mass[at(lam)] / mass[0]),
    )


def math500(n: int = 300) -> Population:
    data = read_labelled(
        ROOT / "sdk/assets/math500_gpt-oss-20b_probe-math.jsonl", confidence=["probe_conf_raw"]
    )
    conf, mu = data.confidences["probe_conf_raw"], data.mu_hat

    def draw(rng: np.random.Generator) -> tuple[Array, Array]:
        idx = rng.integers(0, conf.size, size=n)
        return conf[idx], mu[idx]

    def risk(lam: float) -> float:
        answered = conf >= lam
        return float((1 - mu[answered]).mean()) if answered.any() else 0.0

    return Population(draw, risk, lambda lam: float((conf >= lam).mean()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--smoke", action="store_true", help="3 draws per row (the test suite runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.reps = 3
    populations = [
        ("synthetic calibrated", 0.10, synthetic(lambda c: c)),
        ("synthetic overconfident", 0.15, synthetic(lambda c: c**2)),
        (
            "synthetic inverted top",
            0.10,
            synthetic(lambda c: np.where(c > 0.97, 0.75, np.minimum(1.0, c + 0.08))),
        ),
        ("MATH-500 probe (n=300)", 0.03, math500()),
        ("MATH-500 probe (n=300)", 0.05, math500()),
    ]
    print(f"capgate risk control: {args.reps} calibration draws per row, delta = {args.delta}")
    print(f"python {platform.python_version()} on {platform.machine()}, numpy {np.__version__}\n")
    header = f"{'data':<26}{'alpha':>6}  {'p-value / loss / procedure':<40}{'viol.':>7}{'found':>7}"
    header += f"{'cover':>7}{'best':>7}{'ms':>7}"
    print(header)
    for name, alpha, population in populations:
        best = population.best_coverage(alpha)
        for pvalue, loss, procedure in METHODS:
            rng = np.random.default_rng(2024)
            violations = found = 0
            coverage = 0.0
            start = time.perf_counter()
            for rep in range(args.reps):
                conf, mu_hat = population.draw(rng)
                result = calibrate_threshold(
                    conf, mu_hat, alpha=alpha, delta=args.delta, pvalue=pvalue, loss=loss,  # type: ignore[arg-type]
                    procedure=procedure, seed=rep,  # type: ignore[arg-type]
                )  # fmt: skip
                if result.threshold is None:
                    continue
                found += 1
                violations += population.risk(result.threshold) > alpha
                coverage += population.coverage(result.threshold)
            ms = 1000 * (time.perf_counter() - start) / args.reps
            label = f"{pvalue} / {loss} / {procedure}"
            row = (
                f"{name:<26}{alpha:>6.2f}  {label:<40}{violations / args.reps:>7.3f}{found / args.reps:>7.2f}"
            )
            row += f"{coverage / args.reps:>7.3f}{best:>7.3f}{ms:>7.1f}"
            print(row)


if __name__ == "__main__":
    main()
