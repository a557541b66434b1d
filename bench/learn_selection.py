"""How often ``capgate.learn.calibrate`` replaces the previous estimator, wrongly and rightly.

**What.** Synthetic windows of logged traffic (one decision a minute, binary outcomes), each
calibrated by the real ``calibrate`` (SQLite log, isotonic and Platt candidates, 30% held out,
``probe=False``: no features):

* *no signal*: the previous estimator is calibrated (p ~ U(0.4, 0.6), the outcome a draw from p)
  and then the outcomes are shuffled, so no map can beat it on new traffic: every replacement
  is a false one;
* *overconfident*: the truth is p**3 for logged p ~ U(0, 1), so a map should replace it.

For each window size it prints the share of windows where a candidate replaced the previous
estimator, with a 95% Wilson interval, for the selection level as shipped. ``--level`` compares
another one-sided level (before the Bonferroni correction over the challengers, which
``select`` applies).

Run: ``python bench/learn_selection.py [--windows 100] [--sizes 100,300,500]``. Last line:
``selection: false replacement A% / B% / C%, true D% / E% / F% at N``. ``--smoke``: 2 windows of
100 decisions per kind (the test suite runs it).
"""

from __future__ import annotations

import math
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from _report import bench_parser

START = datetime(2026, 1, 1, tzinfo=UTC)


def _window(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if kind == "no signal":
        p = rng.uniform(0.4, 0.6, n)
        y = rng.permutation((rng.random(n) < p).astype(float))
    else:
        p = rng.uniform(0.0, 1.0, n)
        y = (rng.random(n) < p**3).astype(float)
    return p, y


def replaced(kind: str, n: int, seed: int, folder: Path, level: float) -> bool:
    """Whether ``calibrate`` kept a candidate other than the previous estimator on one window."""
    from capgate import Decision, Estimate
    from capgate.decision import DecisionLog
    from capgate.learn import calibrate

    p, y = _window(kind, n, np.random.default_rng([seed, n, kind == "no signal"]))
    path = folder / f"{kind.replace(' ', '-')}-{n}-{seed}"
    with DecisionLog(f"{path}.sqlite3") as log:
        for i, (pi, yi) in enumerate(zip(p, y, strict=True)):
            d = Decision(action="answer", estimate=Estimate(p=float(pi), method="verbalized"), reason="sim",
                         target="m", created_at=START + timedelta(minutes=i))  # fmt: skip
            log.record(d)
            log.record_outcome(d.id, correct=bool(yi))
        result = calibrate(log, out=path, probe=False, seed=seed, selection_level=level)
    return result.kind != "identity"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a share ``k / n``."""
    if n == 0:
        return math.nan, math.nan
    phat = k / n
    centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main(argv: list[str] | None = None) -> None:
    from capgate.learn import SELECTION_LEVEL

    parser = bench_parser(__doc__)
    parser.add_argument("--windows", type=int, default=100)
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 300, 500])
    parser.add_argument("--level", type=float, default=SELECTION_LEVEL)
    parser.add_argument("--smoke", action="store_true", help="2 windows of 100 (the test suite runs it)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.windows, args.sizes = 2, [100]
    print(f"windows: {args.windows} per size and kind; sizes {args.sizes}; calibrate(probe=False), 30% "
          f"held out; one-sided level {args.level} (Bonferroni over the challengers)")  # fmt: skip
    shares: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="capgate-selection-") as tmp:
        print(f"{'kind':<14} {'N':>5} {'replaced':>9} {'share':>7}  95% interval")
        for kind in ("no signal", "overconfident"):
            for n in args.sizes:
                k = sum(replaced(kind, n, seed, Path(tmp), args.level) for seed in range(args.windows))
                low, high = wilson(k, args.windows)
                shares.setdefault(kind, []).append(k / args.windows)
                print(f"{kind:<14} {n:>5} {k:>5}/{args.windows:<3} {k / args.windows:>7.1%}  "
                      f"[{low:.1%}, {high:.1%}]", flush=True)  # fmt: skip
    false = " / ".join(f"{s:.0%}" for s in shares["no signal"])
    true = " / ".join(f"{s:.0%}" for s in shares["overconfident"])
    sizes = " / ".join(str(n) for n in args.sizes)
    print(f"selection: false replacement {false}, true {true} at {sizes} outcomes")


if __name__ == "__main__":
    sys.exit(main())
