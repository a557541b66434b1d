"""``load_estimator``: a ready capability estimator from a model name and a saved probe."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from capgate.errors import DataError, ProbeMismatchError

if TYPE_CHECKING:
    from capgate.estimators.guarded import InjectionGuard
    from capgate.estimators.probe import ProbeEstimator

__all__ = ["DEFAULT_PROBE", "default_probe_path", "load_estimator"]

DEFAULT_PROBE = "default_probe"
"""Folder (inside ``capgate.assets``) of the probe shipped for the embedded default model."""


def default_probe_path() -> Path:
    """Where the probe shipped for the embedded default model lives.

    Raises:
        DataError: The package was installed without its assets.
    """
    path = Path(str(resources.files("capgate.assets") / DEFAULT_PROBE))
    if not (path / "probe.json").is_file():
        raise DataError("the shipped default probe is missing from this installation", path=path)
    return path


@overload
def load_estimator(
    model: str | os.PathLike[str] = "default",
    *,
    probe: str | os.PathLike[str] | None = None,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
    batch_size: int = 8,
    guard: Literal[True],
) -> InjectionGuard: ...


@overload
def load_estimator(
    model: str | os.PathLike[str] = "default",
    *,
    probe: str | os.PathLike[str] | None = None,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
    batch_size: int = 8,
    guard: Literal[False] = ...,
) -> ProbeEstimator: ...


def load_estimator(
    model: str | os.PathLike[str] = "default",
    *,
    probe: str | os.PathLike[str] | None = None,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
    batch_size: int = 8,
    guard: bool = False,
) -> ProbeEstimator | InjectionGuard:
    """A saved capability estimator, ready to use: a probe and the reader model it reads.

    The probe is capgate's estimator with learned state on disk (safetensors + JSON); the
    black-box estimators (verbalized, P(True), consistency) have none and are built directly
    over a backend. ``load_estimator("default")`` loads the embedded SmolLM2-135M-Instruct and
    the probe shipped with capgate for it, fully offline. For any other reader (an HF hub id or a
    local folder), pass the folder of a probe trained on its features (``capgate probe fit``). The
    probe's feature spec (model, weights fingerprint, layers, pooling, chat template) must match
    the reader's featurizer, or loading refuses it with :class:`~capgate.ProbeMismatchError`. The
    probe's *target* (the model whose capability it predicts, possibly a hosted one: a proxy
    probe) is the estimator's ``target_model``; a gate with ``target=`` checks it.

    Args:
        model: ``"default"``, a local model folder, or a Hugging Face model id.
        probe: Folder of a saved probe; required unless ``model`` is ``"default"``.
        device: Where to run the model.
        dtype: Model precision (``"auto"``: float32 on CPU, bfloat16 on CUDA).
        batch_size: Queries per forward pass when featurizing.
        guard: Wrap the probe in :class:`~capgate.estimators.guarded.InjectionGuard`, so
            capability claims and context in the query cannot lift the estimate: such estimates
            come back ``degraded=True`` with a reason. Off by default: the default probe is itself
            trained blind to claims of easiness (:class:`~capgate.estimators.NuisanceProjection`),
            and the guard also flags some task-format asides such as "(A, B, C or D)" (6% of the
            default held-out split; ``bench/injection_bench.py``, bench/RESULTS.md).

    Raises:
        ValueError: No probe was given for a model other than the default one.
        ProbeMismatchError: The probe was trained on other features.
    """
    from capgate.estimators.probe import LinearProbe, ProbeEstimator, check_spec_match
    from capgate.features import FeatureSpec, HiddenStateFeaturizer
    from capgate.models import load_model

    if probe is None:
        if str(model) != "default":
            raise ValueError(
                f"no probe given for model {str(model)!r}; pass probe=PATH (see `capgate probe fit`)"
            )
        probe = default_probe_path()
    saved = LinearProbe.load(probe)
    spec = FeatureSpec.model_validate(saved.feature_spec_) if saved.feature_spec_ else None
    loaded = load_model(model, device=device, dtype=dtype)
    pooling = spec.pooling if spec is not None else "last"
    chat_template = spec.chat_template if spec is not None else True
    try:
        featurizer = HiddenStateFeaturizer(
            loaded,
            layers=spec.layers if spec is not None else "all",
            pooling=pooling,
            chat_template=chat_template,
            batch_size=batch_size,
        )
    except ValueError as exc:  # the probe's layers do not exist in this model: another reader
        reader = HiddenStateFeaturizer(loaded, pooling=pooling, chat_template=chat_template)
        check_spec_match(saved.feature_spec_, reader.spec)  # names model, fingerprint, layers...
        raise ProbeMismatchError(f"the probe does not fit model {str(model)!r}: {exc}") from exc
    check_spec_match(saved.feature_spec_, featurizer.spec)
    estimator = ProbeEstimator(featurizer, saved)
    if not guard:
        return estimator
    from capgate.estimators.guarded import InjectionGuard

    return InjectionGuard(estimator)
