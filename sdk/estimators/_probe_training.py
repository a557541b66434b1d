"""Training a :class:`~capgate.estimators.probe.LinearProbe`: minibatch SGD with early stopping.

The probe keeps its settings and its learned state; this module holds the torch training loop
(the only part that needs torch, extra ``local``). One call trains one learning rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from capgate.estimators._common import FloatArray

if TYPE_CHECKING:
    import torch

__all__ = ["ProbeSettings", "TrainingRun", "TrainingSplit", "train_probe"]

_PRIOR_EPS = 1e-6


class ProbeSettings(Protocol):
    """The training settings a probe carries (see :class:`~capgate.estimators.probe.LinearProbe`)."""

    momentum: float
    weight_decay: float
    batch_size: int
    max_epochs: int
    patience: int
    random_state: int
    device: str


class TrainingSplit(NamedTuple):
    """The data of one fit: training rows, optional validation rows, and the z-score statistics."""

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


def _require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError(
            "fitting a LinearProbe needs torch; install the extra: pip install 'capgate[local]'"
        ) from None
    return torch


def train_probe(settings: ProbeSettings, split: TrainingSplit, lr: float) -> TrainingRun:
    """Train one probe at learning rate ``lr``; the checkpoint with the lowest validation loss."""
    torch = _require_torch()
    device = torch.device(settings.device)
    if device.type != "cpu":
        return _train_loop(torch, device, settings, split, lr)
    # Minibatches of 32 rows are far too small to gain from threads, and on a loaded machine
    # the thread pool's contention slows training many-fold; use one thread, then restore.
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
