"""The one linear-probe trainer: :meth:`LinearProbe.fit <capgate.estimators.LinearProbe.fit>` is
:func:`fit_sgd`; :class:`~capgate.estimators.ProbeSearch` searches over :func:`fit_weights`, whose
``"sgd"`` solver is the same :func:`fit_sgd`. Torch (extra ``local``) is needed for SGD and logistic only.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from capgate._util.extras import import_extra
from capgate._util.validate import (
    FloatArray,
    check_int_at_least,
    check_non_negative_number,
    check_positive_int,
    check_positive_number,
    check_unit_interval,
)
from capgate.estimators._convex import fit_logistic, ridge_path, zscore

if TYPE_CHECKING:
    import torch

LearningRate: TypeAlias = float | Sequence[float] | Literal["sweep"]

LR_GRID: tuple[float, ...] = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
"""The learning rates ``lr="sweep"`` tries: the paper's grid (arXiv 2602.13540). ``bench/probe_lr.py``
finds the best rate inside it for z-scored features too (1e-4 to 5e-4 at 1024 to 2880 dimensions,
lower for more correlated features); larger rates (1e-3 to 1e-2) give a worse probe."""

_PRIOR_EPS = 1e-6


class ProbeSettings(Protocol):
    """The SGD settings of a probe (see :class:`~capgate.estimators.probe.LinearProbe`)."""

    standardize: bool
    lr: LearningRate
    momentum: float
    weight_decay: float
    batch_size: int
    max_epochs: int
    patience: int
    validation_fraction: float | None
    random_state: int
    device: str


class TrainingSplit(NamedTuple):
    """The rows of one fit: training, validation (or none), and the z-scoring of the training rows."""

    X_tr: FloatArray
    y_tr: FloatArray
    X_va: FloatArray | None
    y_va: FloatArray | None
    mean: FloatArray | None
    scale: FloatArray | None


@dataclass(frozen=True)
class TrainingRun:
    """The best checkpoint of one training run (one learning rate)."""

    weight: npt.NDArray[np.float32]
    bias: float
    val_loss: float
    best_epoch: int
    epochs_run: int
    diverged: bool


@dataclass(frozen=True)
class SgdFit:
    """What :func:`fit_sgd` learned: the kept run, its learning rate, the sweep, the rows used."""

    run: TrainingRun
    lr: float
    lr_sweep: dict[float, float]
    split: TrainingSplit


def learning_rates(lr: LearningRate) -> tuple[float, ...]:
    """The rates to train at: :data:`LR_GRID` for ``"sweep"``, else the checked rate(s)."""
    if isinstance(lr, str) and lr == "sweep":
        return LR_GRID
    try:
        rates = (lr,) if isinstance(lr, int | float) else tuple(lr)
        if isinstance(lr, str) or not rates:
            raise ValueError
        return tuple(check_positive_number("lr", r) for r in rates)
    except (TypeError, ValueError):
        raise ValueError(
            f"`lr` must be a positive number, a sequence of them or 'sweep'; got {lr!r}"
        ) from None


def check_settings(settings: ProbeSettings) -> tuple[float, ...]:
    """Check the SGD settings (as ``fit`` does, not the constructor); the learning rates to try."""
    for name in ("batch_size", "max_epochs", "patience"):
        check_positive_int(name, getattr(settings, name))
    for name in ("momentum", "weight_decay"):
        check_non_negative_number(name, getattr(settings, name))
    if settings.validation_fraction is not None:
        check_unit_interval("validation_fraction", settings.validation_fraction, open_ends=True)
    check_int_at_least("random_state", settings.random_state, 0)
    return learning_rates(settings.lr)


def _split(
    settings: ProbeSettings, X: FloatArray, y: FloatArray, validation: tuple[FloatArray, FloatArray] | None
) -> TrainingSplit:
    if validation is not None:
        (X_tr, y_tr), (X_va, y_va) = (X, y), validation
    elif settings.validation_fraction is not None:
        n = X.shape[0]
        n_val = round(n * settings.validation_fraction)
        if n_val < 1 or n - n_val < 1:
            raise ValueError(
                f"validation_fraction={settings.validation_fraction} of {n} queries leaves an empty "
                "training or validation split; give more data, X_val/y_val, or validation_fraction=None"
            )
        order = np.random.default_rng(settings.random_state).permutation(n)
        val_idx, tr_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
        X_tr, y_tr, X_va, y_va = X[tr_idx], y[tr_idx], X[val_idx], y[val_idx]
    else:
        return TrainingSplit(X, y, None, None, *(zscore(X) if settings.standardize else (None, None)))
    mean, scale = zscore(X_tr) if settings.standardize else (None, None)
    return TrainingSplit(X_tr, y_tr, X_va, y_va, mean, scale)


def fit_sgd(
    settings: ProbeSettings,
    X: FloatArray,
    y: FloatArray,
    validation: tuple[FloatArray, FloatArray] | None = None,
) -> SgdFit:
    """Train at each learning rate of ``settings``; keep the run with the lowest loss on
    ``validation``, else on ``validation_fraction`` of ``X``, else (none) the last of ``max_epochs``."""
    rates = check_settings(settings)
    split = _split(settings, X, y, validation)
    if split.X_va is None and len(rates) > 1:
        raise ValueError(
            f"a learning-rate sweep ({len(rates)} rates) needs validation data to choose; "
            "give X_val/y_val, set validation_fraction, or pass a single lr"
        )
    runs = {lr: _train(settings, split, lr) for lr in rates}
    best_lr = min(rates, key=lambda r: runs[r].val_loss)
    best = runs[best_lr]
    if best.diverged:
        warnings.warn(
            f"LinearProbe training diverged at lr={best_lr}; kept the last finite checkpoint "
            f"(epoch {best.best_epoch}). Use a smaller lr.",
            RuntimeWarning,
            stacklevel=3,
        )
    elif split.X_va is not None and best.best_epoch == settings.max_epochs:
        warnings.warn(
            f"LinearProbe stopped at max_epochs={settings.max_epochs} while the validation loss was still "
            f"falling (lr={best_lr}); raise max_epochs or lr",
            RuntimeWarning,
            stacklevel=3,
        )
    swept = split.X_va is not None
    return SgdFit(best, best_lr, {lr: run.val_loss for lr, run in runs.items()} if swept else {}, split)


def fit_weights(
    solver: str, z: FloatArray, y: FloatArray, alphas: Sequence[float], sgd: ProbeSettings
) -> list[tuple[FloatArray, float]]:
    """``(w, b)`` fitted on features ``z`` as given, per alpha (one pair for ``"sgd"``, by ``sgd``);
    ``"logistic"`` goes from strong to weak alpha, each fit warm-started from the last."""
    if solver == "ridge":
        w_all, b = ridge_path(z, y, alphas)
        return [(w_all[i], float(b[i])) for i in range(len(alphas))]
    if solver == "logistic":
        out: list[tuple[FloatArray, float]] = [(np.empty(0), 0.0)] * len(alphas)
        init: tuple[FloatArray, float] | None = None
        for i in sorted(range(len(alphas)), key=lambda j: -alphas[j]):
            init = fit_logistic(z, y, float(alphas[i]), init=init)
            out[i] = init
        return out
    run = fit_sgd(sgd, z, y).run
    return [(run.weight.astype(np.float64), run.bias)]


def _train(settings: ProbeSettings, split: TrainingSplit, lr: float) -> TrainingRun:
    """Train one probe at learning rate ``lr``; the checkpoint with the lowest validation loss."""
    torch = import_extra("torch", "local", "fitting a LinearProbe")
    device = torch.device(settings.device)
    if device.type != "cpu":
        return _train_loop(torch, device, settings, split, lr)
    # Minibatches are too small to gain from threads, whose contention slows training many-fold.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_loop(torch, device, settings, split, lr)
    finally:
        torch.set_num_threads(threads)


def _train_loop(
    torch: Any, device: torch.device, settings: ProbeSettings, split: TrainingSplit, lr: float
) -> TrainingRun:
    functional = torch.nn.functional
    X_tr, y_tr, X_va, y_va, mean, scale = split

    def tensor(a: FloatArray, standardized: bool) -> torch.Tensor:
        if standardized and mean is not None and scale is not None:
            a = (a - mean) / scale
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device)

    xt, yt = tensor(X_tr, True), tensor(y_tr, False)
    xv = None if X_va is None else tensor(X_va, True)
    yv = None if y_va is None else tensor(y_va, False)
    generator = torch.Generator().manual_seed(settings.random_state)

    prior = min(max(float(y_tr.mean()), _PRIOR_EPS), 1 - _PRIOR_EPS)
    weight = torch.zeros(X_tr.shape[1], dtype=torch.float32, device=device, requires_grad=True)
    bias = torch.full((1,), math.log(prior / (1 - prior)), dtype=torch.float32, device=device)
    bias.requires_grad_(True)
    optimizer = torch.optim.SGD(
        [
            {"params": [weight], "weight_decay": settings.weight_decay},
            {"params": [bias], "weight_decay": 0.0},
        ],
        lr=lr,
        momentum=settings.momentum,
    )

    def val_loss() -> float:
        if xv is None or yv is None:
            return math.nan
        with torch.no_grad():
            logits = (xv @ weight + bias).double()
            return float(functional.binary_cross_entropy_with_logits(logits, yv.double()).item())

    def snapshot() -> tuple[npt.NDArray[np.float32], float]:
        w = weight.detach().cpu().numpy().astype(np.float32, copy=True)
        return w, float(bias.detach().cpu().numpy()[0])

    best_w, best_b = snapshot()
    best_loss, best_epoch, epochs_run, diverged = val_loss(), 0, 0, False
    n = xt.shape[0]
    for epoch in range(1, settings.max_epochs + 1):
        order = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n, settings.batch_size):
            idx = order[start : start + settings.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = functional.binary_cross_entropy_with_logits(xt[idx] @ weight + bias, yt[idx])
            loss.backward()
            optimizer.step()
        epochs_run = epoch
        if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
            diverged = True
            break
        if xv is None:
            best_w, best_b, best_epoch = (*snapshot(), epoch)
            continue
        current = val_loss()
        if not math.isfinite(current):
            diverged = True
            break
        if current < best_loss:
            best_loss, best_epoch = current, epoch
            best_w, best_b = snapshot()
        elif epoch - best_epoch >= settings.patience:
            break
    return TrainingRun(best_w, best_b, best_loss, best_epoch, epochs_run, diverged)
