"""The files the recalibration estimators save (read with :func:`capgate._util.saved.read_saved`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class SavedIsotonic(BaseModel):
    """The JSON :meth:`~capgate.estimators.IsotonicCalibrator.to_json` writes."""

    model_config = ConfigDict(strict=True)

    format: str
    out_of_bounds: Literal["clip", "raise"]
    X_thresholds: list[float]
    y_thresholds: list[float]
    X_min: float = Field(allow_inf_nan=False)
    X_max: float = Field(allow_inf_nan=False)

    @field_validator("X_min", "X_max")
    @classmethod
    def _ends_of_the_thresholds(cls, value: float, info: ValidationInfo) -> float:
        """``fit`` writes the first and last fitted confidences: ``X_thresholds[0]`` and ``[-1]``."""
        thresholds = info.data.get("X_thresholds")
        if thresholds:  # none (empty or refused) is refused with X_thresholds itself
            end, which = (thresholds[0], "first") if info.field_name == "X_min" else (thresholds[-1], "last")
            if value != end:
                raise ValueError(f"must equal the {which} of X_thresholds ({end!r}); got {value!r}")
        return value


class SavedPlatt(BaseModel):
    """The JSON :meth:`~capgate.estimators.PlattCalibrator.to_json` writes."""

    model_config = ConfigDict(strict=True)

    format: str
    settings: dict[str, Any]
    coef: float = Field(allow_inf_nan=False)
    intercept: float = Field(allow_inf_nan=False)
    n_iter: int
    converged: bool


class SavedRecalibrated(BaseModel):
    """The file :meth:`~capgate.estimators.Recalibrated.save` (and ``save_map``) writes."""

    model_config = ConfigDict(strict=True)

    format: str
    base_method: str
    calibrator: dict[str, Any]
