"""Which SGD learning rate should LinearProbe use?  Prints what it measured, how, and on what data.

Data (synthetic, generated here, seeded): features shaped like LLM hidden states: ``--dim`` dims
driven by ``--n-latent`` latent factors plus noise, per-dimension offsets, and four "massive
activation" dimensions with scales in the hundreds (as real residual streams have). The true
capability is µ = sigmoid(2.5 · s + 0.5), s a unit-variance combination of 8 latent factors; the
training target is µ̂ = Binomial(k=10, µ) / 10, as labelling by sampling gives.

For each learning rate, with and without z-scoring, it fits LinearProbe with the paper's other
settings (SGD momentum 0.9, weight decay 1e-2, batch 32, early stopping on a held-out 10%,
patience 20, at most 200 epochs) and prints the test Brier score against the true µ and against
µ̂, the validation BCE that model selection sees, the kept epoch, epochs run and wall seconds.
The last row of each block is ``lr="sweep"`` (the default): what model selection picks.
Wall time depends on the machine and its load; read it as relative.

Usage: .venv/bin/python bench/probe_lr.py [--dim 2880] [--n-train 3000] [--n-latent 64]; ``--smoke``:
200 rows of 32 dims, one rate each way and the sweep, at most 5 epochs (the test suite runs it).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt

from capgate.estimators.probe import LR_GRID, LinearProbe


def make_data(
    n: int, dim: int, rng: np.random.Generator, n_latent: int = 64
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
    """Hidden-state-like features and their true capability µ."""
    loadings = rng.normal(size=(n_latent, dim)) / np.sqrt(n_latent)
    offsets = rng.normal(scale=2.0, size=dim)
    scales = np.ones(dim)
    massive = rng.choice(dim, size=4, replace=False)
    scales[massive] = rng.uniform(100, 400, size=4)
    direction = np.zeros(n_latent)
    k = min(8, n_latent)
    direction[:k] = rng.normal(size=k)
    direction /= np.linalg.norm(direction)
    latent = rng.normal(size=(n, n_latent))
    X = (latent @ loadings + 0.5 * rng.normal(size=(n, dim))) * scales + offsets
    mu = 1 / (1 + np.exp(-(2.5 * latent @ direction + 0.5)))
    return X.astype(np.float32), mu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=2880)
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--n-latent", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lrs", type=float, nargs="*", help="rates to try on z-scored features")
    parser.add_argument("--raw-lrs", type=float, nargs="*", help="rates to try on raw features")
    parser.add_argument("--smoke", action="store_true", help="tiny data, one rate (a test runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.dim, args.n_train, args.n_test, args.n_latent = 32, 200, 100, 8
        args.lrs, args.raw_lrs = args.lrs or [LR_GRID[0]], args.raw_lrs or [1e-6]
    rng = np.random.default_rng(args.seed)
    X, mu = make_data(args.n_train + args.n_test, args.dim, rng, args.n_latent)
    mu_hat = rng.binomial(10, mu) / 10
    n = args.n_train
    X_tr, y_tr, X_te, mu_te, y_te = X[:n], mu_hat[:n], X[n:], mu[n:], mu_hat[n:]
    prior = y_tr.mean()
    print(f"data: n_train={n} n_test={args.n_test} dim={args.dim} n_latent={args.n_latent} seed={args.seed}")
    brier = {"µ": np.mean((prior - mu_te) ** 2), "µ̂": np.mean((prior - y_te) ** 2)}
    print(f"constant prior: Brier vs µ {brier['µ']:.4f}, vs µ̂ {brier['µ̂']:.4f}")
    print(f"noise floor: Brier(µ, µ̂) on test = {np.mean((mu_te - y_te) ** 2):.4f}")
    header = ("z-score", "lr", "Brier/µ", "Brier/µ̂", "val bce", "epoch", "ran", "s")
    widths = (7, 12, 8, 8, 8, 5, 4, 6)
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    z_grid = (*LR_GRID, 1e-3, 2e-3, 5e-3, 1e-2) if args.lrs is None else tuple(args.lrs)
    raw_grid = (1e-6, *LR_GRID) if args.raw_lrs is None else tuple(args.raw_lrs)
    for standardize, grid in ((True, z_grid), (False, raw_grid)):
        for lr in (*grid, "sweep"):
            t0 = time.perf_counter()
            epochs = {"max_epochs": 5} if args.smoke else {}
            probe = LinearProbe(standardize=standardize, lr=lr, **epochs).fit(X_tr, y_tr)
            dt = time.perf_counter() - t0
            p = probe.predict(X_te)
            label = f"{lr:.0e}" if isinstance(lr, float) else f"{lr}={probe.lr_:.0e}"
            b_mu, b_hat = np.mean((p - mu_te) ** 2), np.mean((p - y_te) ** 2)
            print(
                f"{standardize!s:>7} {label:>12} {b_mu:>8.4f} {b_hat:>8.4f} {probe.validation_['bce']:>8.4f} "
                f"{probe.best_epoch_:>5} {probe.n_epochs_:>4} {dt:>6.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
