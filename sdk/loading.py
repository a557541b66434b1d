"""``load_estimator``: a ready capability estimator from a model name and a saved probe."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypedDict, Unpack, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capgate._util.extras import require_extra
from capgate._util.validate import check_positive_int
from capgate.errors import DataError, ProbeMismatchError

if TYPE_CHECKING:
    from capgate.estimators.base import CapabilityEstimator
    from capgate.estimators.guarded import InjectionGuard
    from capgate.estimators.probe import Featurizer, LinearProbe, ProbeEstimator
    from capgate.learn import Calibration
    from capgate.local.hidden_states import FeatureDType
    from capgate.local.models import Device

__all__ = [
    "DEFAULT_PROBE",
    "FAST_PATH_MAX_ABS_DP",
    "FAST_PATH_MAX_BRIER_DELTA",
    "FastPathCheck",
    "default_probe_path",
    "load_estimator",
    "recorded_fast_paths",
]

FAST_PATH_MAX_ABS_DP = 0.01
"""Largest |p_fast - p_float32| over the checked queries for a fast path to be used."""

FAST_PATH_MAX_BRIER_DELTA = 0.0005
"""Largest change of the capability Brier score (fast vs float32) for a fast path to be used."""

_FAST_PATH_KEY = "fast_path"
"""Where a probe's saved ``validation`` metadata keeps its fast-path checks, by dtype."""

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


class FastPathCheck(BaseModel):
    """A probe's estimates in a fast number format checked against float32 on labelled queries.

    ``passed`` when the largest |Δp| is at most :data:`FAST_PATH_MAX_ABS_DP` and the capability
    Brier moves by at most :data:`FAST_PATH_MAX_BRIER_DELTA`. Recorded in the probe's metadata
    (``validation["fast_path"][dtype]``, see :meth:`record`), it lets ``load_estimator`` choose
    that format by itself.

    Examples:
        >>> check = FastPathCheck.of([0.2, 0.9], [0.203, 0.903], [0.0, 1.0], dtype="bfloat16", split="demo")
        >>> check.passed, round(check.max_abs_dp, 3)
        (True, 0.003)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["bfloat16", "float16", "bf16-mixed"]
    n: int = Field(ge=1)
    max_abs_dp: float = Field(ge=0)
    brier_float32: float = Field(ge=0, le=1)
    brier_fast: float = Field(ge=0, le=1)
    split: str = Field(min_length=1)

    @property
    def brier_delta(self) -> float:
        """Capability Brier of the fast path minus float32's."""
        return self.brier_fast - self.brier_float32

    @property
    def passed(self) -> bool:
        """Within both tolerances."""
        return self.max_abs_dp <= FAST_PATH_MAX_ABS_DP and abs(self.brier_delta) <= FAST_PATH_MAX_BRIER_DELTA

    @classmethod
    def of(cls, p_float32: Any, p_fast: Any, mu_hat: Any, *, dtype: str, split: str) -> FastPathCheck:
        """The check of paired predictions ``p_float32``, ``p_fast`` against capability ``mu_hat``."""
        from capgate._util.validate import as_probabilities, same_length
        from capgate.metrics import capability_brier

        ref = as_probabilities("p_float32", p_float32)
        fast = as_probabilities("p_fast", p_fast)
        mu = as_probabilities("mu_hat", mu_hat)
        same_length(p_float32=ref, p_fast=fast, mu_hat=mu)
        return cls(
            dtype=dtype,
            n=len(ref),
            max_abs_dp=float(abs(fast - ref).max()),
            brier_float32=float(capability_brier(ref, mu)),
            brier_fast=float(capability_brier(fast, mu)),
            split=split,
        )

    def record(self, probe: LinearProbe) -> None:
        """Keep this check in ``probe``'s validation metadata (saved by ``probe.save``)."""
        validation: dict[str, Any] = probe.validation_
        checks = dict(validation.get(_FAST_PATH_KEY) or {})
        checks[self.dtype] = self.model_dump(mode="json")
        validation[_FAST_PATH_KEY] = checks


def recorded_fast_paths(probe: LinearProbe) -> dict[str, FastPathCheck]:
    """The fast-path checks saved with ``probe``, by dtype (none: ``{}``).

    Raises:
        DataError: The recorded checks are malformed.
    """
    recorded = (getattr(probe, "validation_", None) or {}).get(_FAST_PATH_KEY)
    if recorded is None:
        return {}
    try:
        if not isinstance(recorded, dict):
            raise TypeError(f"expected an object by dtype; got {type(recorded).__name__}")
        checks = {str(k): FastPathCheck.model_validate(v) for k, v in recorded.items()}
    except (TypeError, ValidationError) as exc:
        raise DataError(f"malformed fast-path check: {exc}", field="validation.fast_path") from None
    for key, check in checks.items():
        if key != check.dtype:
            raise DataError(f"the check under {key!r} is of {check.dtype!r}", field="validation.fast_path")
    return checks


_CPU_FAST_PATHS = ("bfloat16", "bf16-mixed")
"""The CPU's fast reader passes, fastest first: each needs a passed check and a CPU where bfloat16
pays off (:func:`capgate.local.models.bf16_pays_off`)."""


def _feature_dtype(dtype: str, device: str, probe: LinearProbe) -> tuple[str, dict[str, Any]]:
    """The reader pass's dtype (see ``load_estimator``'s ``dtype``) and how it was chosen (each
    estimate's ``details["fast_path"]``, so processes that chose differently can be told apart)."""
    if dtype != "auto":
        return dtype, {"dtype": dtype, "chosen_by": "setting"}
    if device != "cpu":  # the model's own (bfloat16 or float16 on CUDA)
        return "auto", {"dtype": "auto", "chosen_by": f"device {device}: the model's own dtype"}
    from capgate.local import models

    checks = recorded_fast_paths(probe)
    passed = [fast for fast in _CPU_FAST_PATHS if fast in checks and checks[fast].passed]
    choice: dict[str, Any] = {"chosen_by": "auto", "checked_fast_paths": passed}
    if not passed:  # nothing to choose: no timing taken
        return "float32", {"dtype": "float32", **choice}
    native = models.native_bf16_cpu()
    speedup = models.bf16_speedup() if native else None  # measured only when it matters
    chosen = passed[0] if native and speedup is not None and speedup >= models.BF16_PAYS_OFF else "float32"
    return chosen, {
        "dtype": chosen,
        **choice,
        "native_bf16": native,
        "bf16_speedup": speedup,
        "bf16_threshold": models.BF16_PAYS_OFF,
    }


class _ReaderOptions(TypedDict, total=False):
    """The settings of :func:`load_estimator` that never change what it returns."""

    device: Device
    dtype: FeatureDType
    batch_size: int


_Path: TypeAlias = "str | os.PathLike[str]"


# fmt: off
@overload
def load_estimator(
    model: _Path = ..., *, probe: _Path | None = ..., guard: Literal[True], calibration: None = ...,
    method: Literal["probe"] = ..., **options: Unpack[_ReaderOptions],
) -> InjectionGuard: ...
@overload
def load_estimator(
    model: _Path = ..., *, probe: _Path | None = ..., guard: Literal[False] = ..., calibration: None = ...,
    method: Literal["probe"] = ..., **options: Unpack[_ReaderOptions],
) -> ProbeEstimator: ...
@overload
def load_estimator(
    model: _Path = ..., *, probe: _Path | None = ..., guard: bool = ..., calibration: _Path | Calibration,
    method: Literal["probe"] = ..., **options: Unpack[_ReaderOptions],
) -> CapabilityEstimator: ...
@overload
def load_estimator(
    model: _Path = ..., *, method: str, probe: None = ..., guard: bool = ...,
    calibration: _Path | Calibration | None = ..., **options: Unpack[_ReaderOptions],
) -> CapabilityEstimator: ...
# fmt: on


def load_estimator(
    model: str | os.PathLike[str] = "default",
    *,
    probe: str | os.PathLike[str] | None = None,
    device: Device = "auto",
    dtype: FeatureDType = "auto",
    batch_size: int = 32,
    guard: bool = False,
    calibration: str | os.PathLike[str] | Calibration | None = None,
    method: str = "probe",
) -> CapabilityEstimator:
    """A saved capability estimator, ready to use: a probe and the reader model it reads.

    The probe is capgate's estimator with learned state on disk (safetensors + JSON); the
    black-box estimators (verbalized, P(True), consistency) have none and are built directly
    over a backend. ``load_estimator("default")`` loads the embedded SmolLM2-135M-Instruct and its
    shipped probe, fully offline; any other reader (an HF hub id or a local folder) needs the folder
    of a probe trained on its features (``capgate probe fit``). The probe's feature spec (model,
    weights fingerprint, layers, pooling, chat template) must match the reader's featurizer, else
    :class:`~capgate.ProbeMismatchError`. The probe's *target* (the model whose capability it
    predicts, possibly a hosted one: a proxy probe) is the estimator's ``target_model``; a gate
    with ``target=`` checks it.

    Args:
        model: ``"default"``, a local model folder, or a Hugging Face model id.
        probe: Folder of a saved probe; required unless ``model`` is ``"default"``.
        device: Where to run the model.
        dtype: Precision. ``"auto"``: on CUDA the model in bfloat16 (float16 where bf16 is
            missing); on the CPU the model in float32, and the reader pass in ``"bfloat16"``, else
            ``"bf16-mixed"`` (float32 with the MLP matmuls in bfloat16), the first whose
            :class:`FastPathCheck` against float32 the probe records as passed (on its held-out
            split, |Δp| <= 0.01 and the capability Brier within ±0.0005), when bfloat16 pays off on
            this CPU (native, and a bfloat16 linear layer at least 1.25x as fast as a float32 one:
            :func:`capgate.local.models.bf16_pays_off`); else float32. An explicit dtype loads the
            model in it and runs the pass in it (``"bf16-mixed"``: the model in float32). Each
            estimate's ``details["dtype"]`` says which dtype its pass used (the model's own when
            the pass was a shared prefill).
        batch_size: Queries per forward pass when featurizing.
        guard: Wrap the probe in :class:`~capgate.estimators.guarded.InjectionGuard`, so
            capability claims and context in the query cannot lift the estimate: such estimates
            come back ``degraded=True`` with a reason. Off by default: the default probe is itself trained
            blind to claims of easiness (:class:`~capgate.estimators.NuisanceProjection`), and the
            guard also flags some task-format asides such as "(A, B, C or D)" (6% of the default
            held-out split; ``bench/injection_bench.py``, bench/RESULTS.md).
        calibration: A calibration learnt from a decision log (``capgate calibrate``'s folder, or
            a loaded :class:`capgate.learn.Calibration`), applied to the probe
            (:meth:`~capgate.learn.Calibration.apply`: a recalibration map, or the probe it
            learnt over this reader's featurizer); the guard, if asked, wraps the result.
        method: ``"probe"`` (the default, above), or another estimator installed under that
            name in the ``capgate.estimators`` entry-point group, loaded over ``model`` with
            ``device`` and ``dtype``. capgate installs ``"verbalized"``:
            :func:`capgate.adapters.backends.transformers.verbalized_estimator` (extra ``local``),
            which reads the ``[confidence=X%]`` tag of a model trained by ``capgate train c3rl``
            (its ``model/`` folder) and asks any other model for its confidence. A recalibration
            map in ``calibration`` applies to it too; ``probe`` and ``batch_size`` do not.

    Raises:
        ValueError: No probe was given for a model other than the default one; ``batch_size`` is
            not a positive integer; or ``method`` names no installed estimator, or is given a probe.
        ProbeMismatchError: The probe was trained on other features.
        DataError: The probe's files, or its recorded fast-path checks, are malformed; or the
            calibration is, or maps another method's estimates.
    """
    if method != "probe":
        return _installed_estimator(method, model, probe=probe, device=device, dtype=dtype, guard=guard,
                                    calibration=calibration)  # fmt: skip
    batch_size = check_positive_int("batch_size", batch_size)
    require_extra("local", "a probe over a local model")
    from capgate.estimators.probe import LinearProbe, ProbeEstimator, check_spec_match
    from capgate.local.hidden_states import FeatureSpec, HiddenStateFeaturizer
    from capgate.local.models import load_model

    if probe is None:
        if str(model) != "default":
            raise ValueError(
                f"no probe given for model {str(model)!r}; pass probe=PATH (see `capgate probe fit`)"
            )
        probe = default_probe_path()
    saved = LinearProbe.load(probe)
    spec = FeatureSpec.model_validate(saved.feature_spec_) if saved.feature_spec_ else None
    recorded_fast_paths(saved)  # a malformed record fails here, whatever the machine
    # bf16-mixed is a pass over a float32 model (its MLP matmuls in bfloat16), not a weights dtype.
    weights = "float32" if dtype == "bf16-mixed" else dtype
    loaded = load_model(model, device=device, dtype=weights)
    feature_dtype, fast_path = _feature_dtype(dtype, loaded.device, saved)
    pooling = spec.pooling if spec is not None else "last"
    chat_template = spec.chat_template if spec is not None else True
    try:  # batch_size is checked above: a ValueError here is the probe's layers
        featurizer = HiddenStateFeaturizer(
            loaded,
            layers=spec.layers if spec is not None else "all",
            pooling=pooling,
            chat_template=chat_template,
            batch_size=batch_size,
            dtype=feature_dtype,  # type: ignore[arg-type]
        )
    except ValueError as exc:  # the probe's layers do not exist in this model: another reader
        reader = HiddenStateFeaturizer(loaded, pooling=pooling, chat_template=chat_template)
        check_spec_match(saved.feature_spec_, reader.spec)  # names model, fingerprint, layers...
        raise ProbeMismatchError(f"the probe does not fit model {str(model)!r}: {exc}") from exc
    # The pass's dtype may differ from the probe's fitting one only as chosen above: on request,
    # or a fast path the probe records as checked; every other field must match.
    ignore = ("dtype",)
    check_spec_match(saved.feature_spec_, featurizer.spec, ignore=ignore)
    estimator: CapabilityEstimator = ProbeEstimator(
        featurizer, saved, ignore_spec_fields=ignore, fast_path=fast_path
    )
    return _wrapped(estimator, calibration, guard, featurizer)


ESTIMATOR_ENTRY_POINTS = "capgate.estimators"
"""The entry-point group :func:`load_estimator` looks a ``method`` other than ``"probe"`` up in:
each entry is a callable ``(model, *, device, dtype) -> CapabilityEstimator``."""


def _installed_estimator(
    method: str,
    model: str | os.PathLike[str],
    *,
    probe: object,
    device: str,
    dtype: str,
    guard: bool,
    calibration: str | os.PathLike[str] | Calibration | None,
) -> CapabilityEstimator:
    from importlib.metadata import entry_points

    if probe is not None:
        raise ValueError(f"`probe` is for method='probe'; method={method!r} reads no probe")
    found = {entry.name: entry for entry in entry_points(group=ESTIMATOR_ENTRY_POINTS)}
    if method not in found:
        known = ", ".join(sorted({"probe", *found}))
        raise ValueError(
            f"no estimator method {method!r} is installed (group {ESTIMATOR_ENTRY_POINTS!r}); known: {known}"
        )
    estimator = found[method].load()(model, device=device, dtype=dtype)
    return _wrapped(estimator, calibration, guard, None)


def _wrapped(
    estimator: CapabilityEstimator,
    calibration: str | os.PathLike[str] | Calibration | None,
    guard: bool,
    featurizer: Featurizer | None,
) -> CapabilityEstimator:
    """``estimator`` under its calibration (a learnt probe reads ``featurizer``), then the guard."""
    if calibration is not None:
        from capgate.learn import Calibration

        loaded_cal = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
        estimator = loaded_cal.apply(estimator, featurizer=featurizer if loaded_cal.kind == "probe" else None)
    if not guard:
        return estimator
    from capgate.estimators.guarded import InjectionGuard

    return InjectionGuard(estimator)
