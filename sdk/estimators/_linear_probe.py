""":class:`capgate.estimators.LinearProbe`, the fitted artefact of every probe trainer. Training needs
torch (:mod:`._probe_training`); prediction, saving and loading are numpy + safetensors only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from capgate._util.atomic import atomic_path
from capgate._util.extras import import_extra
from capgate._util.saved import read_saved
from capgate._util.validate import FloatArray
from capgate.errors import DataError
from capgate.estimators._common import (
    as_matrix,
    as_vector,
    brier_and_bce,
    check_fitted,
    json_settings,
    read_json,
    sigmoid,
    spec_as_dict,
    write_json,
)
from capgate.estimators._probe_training import LearningRate, fit_sgd
from capgate.estimators._target import ProbeTarget
from capgate.estimators.base import Params
from capgate.local.weights import sha256_file

FORMAT = "capgate.linear_probe"
FORMAT_VERSION = 1
WEIGHTS_FILE = "probe.safetensors"
META_FILE = "probe.json"
_FINGERPRINT_KEYS = ("weights_fingerprint", "fingerprint")


def spec_fingerprint(spec: Mapping[str, Any] | None) -> str | None:
    """The weights fingerprint recorded in a feature spec, if any."""
    if spec is None:
        return None
    for key in _FINGERPRINT_KEYS:
        value = spec.get(key)
        if isinstance(value, str):
            return value
    return None


class LinearProbe(Params):
    """A linear probe predicting capability µ(x) from a feature vector (a hidden state).

    ``p = sigmoid(w · z + b)`` with ``z`` the z-scored features, fitted with binary cross-entropy
    against the *soft* target µ̂ = correct / k as in the paper (arXiv 2602.13540): SGD with momentum
    0.9, weight decay 1e-2 (on ``w``), batches of 32, early stopping on a validation split keeping
    the checkpoint with the lowest validation loss. Training starts from ``w = 0``, ``b = logit(mean
    µ̂)`` (the constant prior), whose validation loss is measured too, so the kept probe is never
    worse on validation than predicting the training mean.

    Args:
        standardize: Z-score features with the training mean and standard deviation.
        lr: SGD learning rate; a sequence of rates to sweep; or ``"sweep"`` (the default) for
            :data:`LR_GRID`, the paper's 1e-5 to 5e-4. A sweep keeps the probe with the lowest
            validation loss (so it needs validation data); the rate used is ``lr_``. The best rate
            moves with the features' dimension and correlation (``bench/probe_lr.py``), hence the sweep.
        momentum: SGD momentum.
        weight_decay: L2 weight decay on the weights (not the bias).
        batch_size: Minibatch size.
        max_epochs: Most passes over the training data.
        patience: Stop after this many epochs without a lower validation loss.
        validation_fraction: Share of the training data held out for early stopping when no
            ``X_val`` is given to :meth:`fit`; ``None`` trains ``max_epochs`` and keeps the last.
        random_state: Seed of the validation split and the minibatch order; fitting is
            deterministic given it (on one machine and torch build).
        device: Torch device to train on.

    Attributes:
        coef_: Weights ``w`` (float32, shape ``(n_features_in_,)``).
        intercept_: Bias ``b``.
        mean_: Feature means (``None`` when ``standardize=False``).
        scale_: Feature standard deviations, zeros replaced by 1 (``None`` without z-scoring).
        n_features_in_: Feature dimension seen in ``fit``.
        lr_: The learning rate used (resolved from a sweep).
        lr_sweep_: Validation loss per learning rate tried (``{}`` without validation data).
        best_epoch_: Epoch of the kept checkpoint (0 = the initial constant prior).
        n_epochs_: Epochs run before stopping.
        validation_: Validation metrics of the kept probe (``n``, ``bce``, ``brier``), or ``{}``.
        training_: Training-data summary (``n``, ``mean_mu_hat``, ``source``).
        feature_spec_: The feature spec given to ``fit`` as a JSON-able dict, or ``None``: the
            *reader* (the model whose hidden states are the features).
        target_: The *target* (:class:`ProbeTarget`: the model whose capability the probe
            predicts, and the settings its labels were sampled at), or ``None`` if not recorded.

    Examples:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(200, 5)).astype(np.float32)
        >>> mu = 1 / (1 + np.exp(-2 * X[:, 0]))
        >>> probe = LinearProbe(lr=5e-2, max_epochs=50).fit(X, mu)
        >>> bool(np.corrcoef(probe.predict(X), mu)[0, 1] > 0.9)
        True
    """

    coef_: npt.NDArray[np.float32] | None
    intercept_: float | None
    mean_: FloatArray | None
    scale_: FloatArray | None

    def __init__(
        self,
        *,
        standardize: bool = True,
        lr: LearningRate = "sweep",
        momentum: float = 0.9,
        weight_decay: float = 1e-2,
        batch_size: int = 32,
        max_epochs: int = 200,
        patience: int = 20,
        validation_fraction: float | None = 0.1,
        random_state: int = 0,
        device: str = "cpu",
    ) -> None:
        self.standardize = standardize
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.validation_fraction = validation_fraction
        self.random_state = random_state
        self.device = device
        self.coef_ = None
        self.intercept_ = None
        self.mean_ = None
        self.scale_ = None

    def fit(
        self,
        X: npt.ArrayLike,
        y: npt.ArrayLike,
        *,
        X_val: npt.ArrayLike | None = None,
        y_val: npt.ArrayLike | None = None,
        feature_spec: object | None = None,
        source: str | None = None,
        target: ProbeTarget | Mapping[str, Any] | None = None,
    ) -> LinearProbe:
        """Fit the probe on features ``X`` and soft targets ``y`` = µ̂ in [0, 1].

        Args:
            X: Features, shape ``(n_queries, n_features)``.
            y: Empirical capabilities µ̂, shape ``(n_queries,)``.
            X_val: Validation features for early stopping; if omitted, ``validation_fraction``
                of ``X`` is held out (seeded by ``random_state``).
            y_val: Validation targets (required with ``X_val``).
            feature_spec: How the features were made (a pydantic ``FeatureSpec`` or a mapping),
                so that a saved probe refuses a featurizer that does not match.
            source: Where the labels came from (a file name), for the saved training summary.
            target: The model the labels measure (:class:`ProbeTarget`, e.g.
                ``ProbeTarget.from_harvest(labels)``), recorded as ``target_``.

        Returns:
            The fitted probe (``self``).

        Raises:
            ValueError: Bad settings or data (shapes, targets outside [0, 1], a spec whose
                ``dim`` disagrees with ``X``).
            ImportError: torch is not installed.
        """
        X_all = as_matrix(X, name="X")
        y_all = as_vector(y, name="y", n=X_all.shape[0], unit=True)
        spec = None if feature_spec is None else spec_as_dict(feature_spec)
        dim = X_all.shape[1]
        if spec is not None and isinstance(spec.get("dim"), int) and spec["dim"] != dim:
            raise ValueError(f"feature_spec says dim={spec['dim']} but X has {dim} features")
        if (X_val is None) != (y_val is None):
            raise ValueError("give both `X_val` and `y_val`, or neither")
        validation = None
        if X_val is not None:
            X_va = as_matrix(X_val, name="X_val")
            validation = (X_va, as_vector(y_val, name="y_val", n=X_va.shape[0], unit=True))
            if X_va.shape[1] != dim:
                raise ValueError(f"`X_val` has {X_va.shape[1]} features but `X` has {dim}")
        fitted = fit_sgd(self, X_all, y_all, validation)
        run, split = fitted.run, fitted.split
        self._set_state(
            weight=run.weight,
            bias=run.bias,
            mean=split.mean,
            scale=split.scale,
            lr=fitted.lr,
            lr_sweep=fitted.lr_sweep,
            best_epoch=run.best_epoch,
            n_epochs=run.epochs_run,
            feature_spec=spec,
            target=target,
            training={"n": len(split.y_tr), "mean_mu_hat": float(split.y_tr.mean()), "source": source},
        )
        if split.X_va is not None and split.y_va is not None:
            self.validation_ = {"n": len(split.y_va), **brier_and_bce(self.predict(split.X_va), split.y_va)}
        return self

    def _set_state(
        self,
        *,
        weight: npt.NDArray[np.float32],
        bias: float,
        mean: FloatArray | None,
        scale: FloatArray | None,
        lr: float,
        lr_sweep: Mapping[float, float],
        best_epoch: int,
        n_epochs: int,
        feature_spec: dict[str, Any] | None,
        target: object,
        training: dict[str, Any],
        validation: dict[str, Any] | None = None,
    ) -> None:
        """Set the learned state (of every trainer and of a loaded probe)."""
        self.coef_, self.intercept_ = weight, float(bias)
        self.mean_, self.scale_ = mean, scale
        self.n_features_in_ = int(weight.shape[0])
        self.lr_, self.lr_sweep_ = float(lr), dict(lr_sweep)
        self.best_epoch_, self.n_epochs_ = best_epoch, n_epochs
        self.feature_spec_ = feature_spec
        self.target_ = as_target(target)
        self.training_ = training
        self.validation_ = validation or {}

    def _features(self, X: npt.ArrayLike) -> FloatArray:
        check_fitted(self, "coef_")
        array = as_matrix(X, name="X")
        if array.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {array.shape[1]} features but the probe was fitted on {self.n_features_in_}"
            )
        if self.mean_ is not None and self.scale_ is not None:
            array = (array - self.mean_) / self.scale_
        return array

    def decision_function(self, X: npt.ArrayLike) -> FloatArray:
        """The probe's logits ``w · z + b`` (float64), one per row of ``X``."""
        z = self._features(X)
        assert self.coef_ is not None
        assert self.intercept_ is not None
        # A row-wise sum, not BLAS: batched and one-by-one predictions are bitwise equal.
        logits: FloatArray = np.sum(z * self.coef_.astype(np.float64), axis=1) + self.intercept_
        return logits

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        """Predicted capability in [0, 1] (float64), one per row of ``X``.

        Raises:
            NotFittedError: The probe has not been fitted or loaded.
            ValueError: ``X`` is not a finite 2-D array with ``n_features_in_`` columns.
        """
        return sigmoid(self.decision_function(X))

    def metadata(self) -> dict[str, Any]:
        """The JSON saved beside the weights: feature spec, model id, weights fingerprint, dim,
        settings, training summary, validation metrics, target."""
        check_fitted(self, "coef_")
        spec = self.feature_spec_
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model_id": None if spec is None else spec.get("model_id"),
            "weights_fingerprint": spec_fingerprint(spec),
            "dim": self.n_features_in_,
            "feature_spec": spec,
            "settings": json_settings(self.get_params(deep=False)),
            "lr": self.lr_,
            "lr_sweep": [[lr, loss] for lr, loss in self.lr_sweep_.items()],
            "best_epoch": self.best_epoch_,
            "n_epochs": self.n_epochs_,
            "training": self.training_,
            "validation": self.validation_,
            "target": None
            if (target := getattr(self, "target_", None)) is None
            else target.model_dump(mode="json"),
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save to the folder ``path`` (returned): ``probe.safetensors`` (weights, z-score stats) and
        ``probe.json`` (:meth:`metadata` and the SHA-256 of the weights file). No pickle is involved.
        """
        check_fitted(self, "coef_")
        assert self.coef_ is not None
        assert self.intercept_ is not None
        st = import_extra("safetensors.numpy", "local", "saving or loading a probe")
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, np.ndarray[Any, Any]] = {
            "weight": np.ascontiguousarray(self.coef_, dtype=np.float32),
            "bias": np.asarray([self.intercept_], dtype=np.float64),
        }
        if self.mean_ is not None and self.scale_ is not None:
            tensors["mean"] = np.ascontiguousarray(self.mean_, dtype=np.float64)
            tensors["scale"] = np.ascontiguousarray(self.scale_, dtype=np.float64)
        with atomic_path(folder / WEIGHTS_FILE, suffix="") as tmp:
            st.save_file(tensors, str(tmp), metadata={"format": FORMAT})
        meta = self.metadata()
        meta["weights_sha256"] = sha256_file(folder / WEIGHTS_FILE)
        write_json(folder / META_FILE, meta)
        return folder

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LinearProbe:
        """Load a probe saved by :meth:`save` (checks the weights file against its SHA-256).

        Raises:
            DataError: Missing or corrupt files, or metadata that disagrees with the weights.
        """
        folder = Path(path)
        meta_path, weights_path = folder / META_FILE, folder / WEIGHTS_FILE
        payload = read_json(meta_path, kind=FORMAT)
        version = read_saved(_Versioned, payload, meta_path).format_version
        if version > FORMAT_VERSION:
            raise DataError(
                f"saved by a newer capgate (format {version}; this one reads <= {FORMAT_VERSION})",
                path=meta_path,
                field="format_version",
            )
        meta = read_saved(_SavedProbeMeta, payload, meta_path)
        if not weights_path.is_file():
            raise DataError("weights file not found", path=weights_path)
        if sha256_file(weights_path) != meta.weights_sha256:
            raise DataError(
                "weights file does not match the SHA-256 recorded in probe.json", path=weights_path
            )
        st = import_extra("safetensors.numpy", "local", "saving or loading a probe")
        try:
            tensors = st.load_file(str(weights_path))
        except Exception as exc:  # safetensors' own error: a file that is not safetensors (a pickle...)
            raise DataError(f"not a safetensors file: {exc}", path=weights_path) from None
        dim = meta.dim
        settings = dict(meta.settings)
        if isinstance(settings.get("lr"), list):
            settings["lr"] = tuple(settings["lr"])
        try:
            probe = cls(**settings)
        except TypeError as exc:
            raise DataError(f"unknown settings: {exc}", path=meta_path, field="settings") from None

        weight, bias = tensors.get("weight"), tensors.get("bias")
        if weight is None or weight.shape != (dim,) or bias is None or bias.shape != (1,):
            raise DataError(f"expected tensors weight ({dim},) and bias (1,)", path=weights_path)
        mean, scale = tensors.get("mean"), tensors.get("scale")
        if (mean is not None) != bool(settings.get("standardize")) or (scale is None) != (mean is None):
            raise DataError("z-score tensors do not match the 'standardize' setting", path=weights_path)
        if mean is not None and (mean.shape != (dim,) or scale.shape != (dim,)):
            raise DataError(f"expected mean and scale of shape ({dim},)", path=weights_path)
        sweep = meta.lr_sweep
        try:
            lr_sweep = {float(lr): float(loss) for lr, loss in sweep}
        except (TypeError, ValueError, OverflowError):
            msg = f"expected a list of [learning rate, validation loss] pairs; got {sweep!r:.200}"
            raise DataError(msg, path=meta_path, field="lr_sweep") from None
        try:
            target = as_target(meta.target)
        except (TypeError, ValueError) as exc:
            raise DataError(f"not a probe target: {exc}", path=meta_path, field="target") from None
        probe._set_state(
            weight=weight.astype(np.float32, copy=False),
            bias=float(bias[0]),
            mean=None if mean is None else mean.astype(np.float64, copy=False),
            scale=None if scale is None else scale.astype(np.float64, copy=False),
            lr=meta.lr,
            lr_sweep=lr_sweep,
            best_epoch=meta.best_epoch,
            n_epochs=meta.n_epochs,
            feature_spec=meta.feature_spec,
            target=target,
            training=dict(meta.training),
            validation=dict(meta.validation),
        )
        return probe


class _Versioned(BaseModel):
    """Read first, so that a newer format is refused before anything else."""

    model_config = ConfigDict(strict=True)

    format_version: int


class _SavedProbeMeta(_Versioned):
    """``probe.json``, the metadata :meth:`LinearProbe.save` writes beside its safetensors."""

    weights_sha256: str
    dim: int
    settings: dict[str, Any]
    lr_sweep: list[Any]
    lr: float = Field(allow_inf_nan=False)
    best_epoch: int
    n_epochs: int
    feature_spec: dict[str, Any] | None = None
    target: Any = None
    training: dict[str, Any]
    validation: dict[str, Any]


def as_target(value: object) -> ProbeTarget | None:
    """``value`` as a :class:`ProbeTarget` (a mapping is validated), or ``None``."""
    if value is None or isinstance(value, ProbeTarget):
        return value
    if isinstance(value, Mapping):
        return ProbeTarget.model_validate(dict(value))
    raise TypeError(f"`target` must be a ProbeTarget, a mapping or None; got {value!r}")
