"""The settings every gate and integration takes, checked in one place."""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Protocol, TypeAlias, TypedDict, runtime_checkable

from annotated_types import Gt, Lt, MinLen
from pydantic import (
    BaseModel,
    ConfigDict,
    InstanceOf,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    model_serializer,
    model_validator,
)

from capgate.core.types import Extractor, Mode
from capgate.decision.store.log import DecisionLog
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.estimators.probe import Featurizer
from capgate.policies import Policy, load_policy


class Unset(enum.Enum):
    """Type of :data:`UNSET`."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET
"""Marks a setting as not given (inherit it), unlike an explicit ``None`` (which, for ``step`` and
``tool``, means "no step" / "no tool")."""

OnBlock: TypeAlias = Literal["return", "raise"]
"""What a blocked query (abstain, clarify, escalate, a resample without an answer) produces: a
:class:`~capgate.Gated` result (or, in agent integrations, the framework's own way: a message,
an interrupt), or a :class:`~capgate.GateBlocked` exception."""

ON_BLOCK: tuple[OnBlock, ...] = ("return", "raise")
MODES: tuple[Mode, ...] = ("enforce", "shadow")

PolicyLike: TypeAlias = str | Path | Policy
"""A policy, a preset name (``"balanced"``) or a policy file path."""

DEFAULT_POLICY: Final = "balanced"

PROMOTED: Final = "promoted"
"""``calibration="promoted"``: the version the decision log says is in force for the gate's target
(``capgate calibrate promote`` / ``rollback``)."""

CANDIDATE: Final = "candidate"
"""``shadow_calibration="candidate"``: the version the decision log says is in shadow for the gate's
target (``capgate calibrate shadow``), not yet promoted."""


@runtime_checkable
class CalibrationLike(Protocol):
    """What a gate asks of a loaded calibration (:class:`capgate.learn.Calibration` is one)."""

    @property
    def version(self) -> str:
        """Content-derived id, recorded in every decision made under it."""
        ...

    @property
    def policy(self) -> Policy | None:
        """The thresholds calibrated with it (Learn-then-Test), if it carries any."""
        ...

    def apply(
        self, estimator: CapabilityEstimator, *, featurizer: Featurizer | None = None
    ) -> CapabilityEstimator:
        """The estimator to use in place of ``estimator`` under this calibration."""
        ...


CalibrationSetting: TypeAlias = str | Path | CalibrationLike
"""A calibration folder (``capgate calibrate --out DIR``), a loaded calibration, or the keyword
:data:`PROMOTED` (``calibration``) / :data:`CANDIDATE` (``shadow_calibration``)."""


class SharedOptions(TypedDict, total=False):
    """The gate settings but ``on_block`` (whose type some overloads narrow)."""

    policy: PolicyLike
    estimator: CapabilityEstimator | None
    extract: Extractor | None
    step: str | None
    tool: str | None
    log: DecisionLog | str | Path | None
    target: str | None
    allow_other_target: bool
    max_concurrency: int | None
    estimate_timeout_s: float | None
    routes: Mapping[str, CapabilityEstimator] | None
    mode: Mode | None
    speculative: bool
    log_features: bool
    feature_reader: Featurizer | None
    calibration: CalibrationSetting | None
    shadow_calibration: CalibrationSetting | None


class GateOptions(SharedOptions, total=False):
    """The gate settings as keyword arguments: what every integration and ``with_options`` take.

    Each key is a field of :class:`GateSettings`; one not given keeps its default (in
    ``with_options``, the gate's value). Integrations declare ``**settings: Unpack[GateOptions]``.
    """

    on_block: OnBlock


@dataclass(frozen=True)
class Expects:
    """What a setting must be, in words: a bad value's error reads "`name` must be <this>; got ..."."""

    text: str


NonEmptyStr: TypeAlias = Annotated[str, StringConstraints(min_length=1)]
PositiveSeconds: TypeAlias = Annotated[float, Gt(0), Lt(1e9)]


class GateSettings(BaseModel):
    """What a :class:`~capgate.Gate` is configured with; every integration takes the same keywords.

    Each setting is declared once, here (type, default, a bad value's error text, documentation),
    and checked on construction and :meth:`replace`; the TypedDict integrations type their
    ``**settings`` with (:class:`GateOptions`) and ``Gate``'s signature are checked against or
    derived from it.

    Raises:
        SettingsError: A setting has a wrong value or type (the message names it), or the
            estimator predicts another model than ``target`` without ``allow_other_target``.
    """

    model_config = ConfigDict(
        frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True
    )

    policy: Annotated[
        NonEmptyStr | InstanceOf[Path] | InstanceOf[Policy],
        Expects("a Policy, a preset name or a policy file path"),
    ] = DEFAULT_POLICY
    """A :class:`~capgate.policies.Policy`, a preset name or a policy file path."""

    estimator: Annotated[
        InstanceOf[CapabilityEstimator] | None, Expects("a capgate CapabilityEstimator or None")
    ] = None
    """The capability estimator; ``None`` uses the process-wide default
    (:func:`capgate.set_default_estimator`) at call time."""

    extract: Annotated[Extractor | None, Expects("a function text -> answer or None")] = None
    """Answer extractor for ``resample`` votes (default: :func:`capgate.default_extract`)."""

    on_block: Annotated[OnBlock, Expects(f"one of {ON_BLOCK}")] = "return"
    """``"return"`` a result or ``"raise"`` a :class:`~capgate.GateBlocked`."""

    step: Annotated[NonEmptyStr | None, Expects("a non-empty string or None")] = None
    """Agent step passed to the policy (selects its ``steps:`` override)."""

    tool: Annotated[NonEmptyStr | None, Expects("a non-empty string or None")] = None
    """Tool name passed to the policy (selects its ``tools:`` override)."""

    log: Annotated[
        InstanceOf[DecisionLog] | NonEmptyStr | InstanceOf[Path] | None,
        Expects("a DecisionLog, a path or None"),
    ] = None
    """Decision log (a :class:`~capgate.decision.DecisionLog` or a path to one)."""

    target: Annotated[NonEmptyStr | None, Expects("a non-empty model name or None")] = None
    """The model the gated calls go to (a model id or served name); recorded in each decision and
    checked against the estimator's target (a probe knows whose capability it predicts)."""

    allow_other_target: Annotated[bool, Expects("True or False")] = False
    """Gate calls to ``target`` with an estimator of another model's capability; each decision
    records the override (``target_override``)."""

    max_concurrency: Annotated[Annotated[int, Gt(0)] | None, Expects("a positive integer or None")] = None
    """Most estimate calls in flight at once from this gate and its views; a burst beyond it queues
    for a slot (``None``: no cap of the gate's own)."""

    estimate_timeout_s: Annotated[PositiveSeconds | None, Expects("a positive number or None")] = None
    """Deadline in seconds on one call's estimate, the wait for a slot included; a late estimate
    becomes a degraded decision naming it (``None``: none)."""

    routes: Annotated[
        Annotated[Mapping[NonEmptyStr, InstanceOf[CapabilityEstimator]], MinLen(1)] | None,
        Expects("a mapping of model choice names to capability estimators"),
    ] = None
    """One capability estimator per model choice (by name), for the policy's ``route`` actions:
    the query goes to the cheapest choice (first in the action's ``choices``) whose predicted
    capability clears the edge, else to the strongest (the last)."""

    mode: Annotated[Mode | None, Expects(f"one of {MODES} or None")] = None
    """``"shadow"``: decide and log beside each call, which proceeds as if answered (the estimate
    never delays or fails it); ``"enforce"``: act on each decision; ``None``: the policy's ``mode``
    (enforce unless the policy file says shadow)."""

    speculative: Annotated[bool, Expects("True or False")] = False
    """In enforce mode, start the gated call together with its estimate (for a remote call whose
    estimate is a call of its own): an ``answer`` returns the call's result without waiting twice;
    a block discards it (an async call is cancelled). The decision records it (``speculation``).
    Only for calls that are safe to start and drop."""

    log_features: Annotated[bool, Expects("True or False")] = False
    """Write each logged decision's reader features to the log (keyed by its id, tagged with the
    reader's spec), for ``capgate calibrate`` to fit a probe on the gate's traffic. A probe's are
    its own; for another estimator ``feature_reader`` computes them beside the call, never delaying
    or failing it (failures: ``stats.feature_failures``). Needs a ``log``. Features are as
    sensitive as the text: hidden states can be inverted to recover much of a prompt."""

    feature_reader: Annotated[
        InstanceOf[Featurizer] | None,
        Expects("a featurizer (with `spec` and `transform(queries)`) or None"),
    ] = None
    """The featurizer whose features are logged. ``None``: a probe's own; for another estimator, the
    embedded model's, with the default probe's spec (loaded once, on the first decision that needs
    it, beside the call)."""

    calibration: Annotated[
        NonEmptyStr | InstanceOf[Path] | InstanceOf[CalibrationLike] | None,
        Expects(f"a calibration folder, a loaded capgate.learn.Calibration, {PROMOTED!r} or None"),
    ] = None
    """Run under a calibration (``capgate calibrate --out DIR``): a folder, a loaded
    :class:`capgate.learn.Calibration`, or ``"promoted"`` (the version the log has in force for
    the gate's target, read when the gate first decides; none: uncalibrated). Its estimator
    replaces ``estimator`` and its thresholds (if any) the policy, unless ``policy`` names another
    policy than theirs (the gate keeps its own and says so once on the ``capgate`` logger; refused
    at once for a loaded calibration); every decision records its ``calibration`` version."""

    shadow_calibration: Annotated[
        NonEmptyStr | InstanceOf[Path] | InstanceOf[CalibrationLike] | None,
        Expects(f"a calibration folder, a loaded capgate.learn.Calibration, {CANDIDATE!r} or None"),
    ] = None
    """A candidate calibration (as ``calibration``, or ``"candidate"``: the version the log has in
    shadow). Beside every logged decision the gate also decides under it and logs that (``shadow``,
    ``beside`` the enforced decision's id), never delaying or failing the call, for ``capgate
    report`` to compare. Needs a ``log``."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _settings_error(exc, values) from None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """In JSON mode, objects JSON cannot hold (an estimator, a function) by their ``repr``."""
        if not info.mode_is_json():
            dumped: dict[str, Any] = handler(self)
            return dumped
        return {name: _json_value(getattr(self, name)) for name in type(self).model_fields}

    @model_validator(mode="after")
    def _check_together(self) -> GateSettings:
        """The checks that read more than one setting: the estimator's target, learning from traffic."""
        if self.estimator is not None:
            self.target_check(self.estimator)
        if self.log_features and self.log is None:
            raise SettingsError(
                "`log_features` writes each decision's features to the decision log: pass log=..."
            )
        for name, keyword in (("calibration", PROMOTED), ("shadow_calibration", CANDIDATE)):
            value = getattr(self, name)
            if value is None:
                continue
            other = CANDIDATE if keyword == PROMOTED else PROMOTED
            if isinstance(value, str) and value == other:
                raise SettingsError(f"`{name}` takes {keyword!r} (or a folder), not {other!r}")
            if self.log is None and (value == keyword or name == "shadow_calibration"):
                why = "reads the version from" if value == keyword else "logs its candidate decisions to"
                raise SettingsError(f"`{name}`={value!r} {why} the decision log: pass log=...")
        if isinstance(self.calibration, CalibrationLike):
            self.calibrated_policy(self.calibration.version, self.calibration.policy, at_start=True)
        return self

    def calibrated_policy(
        self, version: str, policy: Policy | None, *, at_start: bool = False
    ) -> Policy | None:
        """The policy a gate under calibration ``version`` decides by: its thresholds (``policy``)
        when the gate's ``policy`` is the default or the one they were learnt for, else ``None``
        (keep the gate's own, said once on the ``capgate`` logger; a promotion never raises).

        Raises:
            SettingsError: ``at_start`` (a calibration given loaded) and another policy is named.
        """
        if policy is None or (isinstance(self.policy, str) and self.policy == DEFAULT_POLICY):
            return policy
        own = self.policy.name if isinstance(self.policy, Policy) else _loaded_name(str(self.policy))
        if own == policy.name:
            return policy
        message = (
            f"calibration {version} carries thresholds for policy {policy.name!r}, and the gate "
            f"names policy {own!r}"
        )
        if at_start:
            raise SettingsError(f"{message}: pass one of them")
        if (version, own) not in _KEPT_POLICY_WARNED:
            _KEPT_POLICY_WARNED.add((version, own))
            _LOG.warning("%s: the gate keeps %r (the calibration's estimator still applies)", message, own)
        return None

    def target_check(self, estimator: CapabilityEstimator) -> tuple[str | None, bool]:
        """The model a decision is about, and whether it overrides the estimator's own target.

        Raises:
            SettingsError: The estimator predicts another model's capability than ``target``
                and ``allow_other_target`` is off.
        """
        predicts = estimator.target_model
        if self.target is None or predicts is None or predicts == self.target:
            return self.target or predicts, False
        if not self.allow_other_target:
            raise SettingsError(
                f"the estimator predicts the capability of {predicts!r} (the target its labels were "
                f"sampled from), but this gate's calls go to {self.target!r}: harvest labels from "
                f"{self.target!r} and fit a probe for it, or pass allow_other_target=True to gate "
                "anyway (each decision records the override)"
            )
        return self.target, True

    def replace(self, **changes: Any) -> GateSettings:
        """A copy with some settings changed (:data:`UNSET` values are ignored), checked again.

        Raises:
            SettingsError: An unknown setting, or a wrong value.
        """
        _check_names(changes)
        given = {k: v for k, v in changes.items() if v is not UNSET}
        if not given:
            return self
        return GateSettings(**{**{name: getattr(self, name) for name in type(self).model_fields}, **given})


def _json_value(value: object) -> object:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Policy):
        return value.name
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return repr(value)


def _check_names(values: Mapping[str, object]) -> None:
    unknown = sorted(set(values) - set(GateSettings.model_fields))
    if unknown:
        raise SettingsError(f"unknown gate setting(s): {', '.join(unknown)}")


def _settings_error(exc: ValidationError, values: Mapping[str, object]) -> SettingsError:
    """The first error of a settings check in words: "`name` must be <what it expects>; got <value>"."""
    error = exc.errors()[0]
    if error["type"] == "extra_forbidden":
        return SettingsError(f"unknown gate setting(s): {error['loc'][0]}")
    if error["type"] in ("assertion_error", "value_error") and not error["loc"]:  # a check of several
        cause = error.get("ctx", {}).get("error")
        return cause if isinstance(cause, SettingsError) else SettingsError(error["msg"])
    name = str(error["loc"][0])
    expects = next(m.text for m in GateSettings.model_fields[name].metadata if isinstance(m, Expects))
    return SettingsError(f"`{name}` must be {expects}; got {values.get(name, error['input'])!r}")


def given_settings(base: GateSettings, /, **values: Any) -> dict[str, Any]:
    """The settings among ``values`` that differ from ``base`` (a gate's own, given alongside
    ``gate=``): one equal to the gate's is in force already; any other would be ignored.

    Raises:
        SettingsError: A name that is not a gate setting.
    """
    _check_names(values)
    return {k: v for k, v in values.items() if v is not UNSET and v != getattr(base, k)}


_LOG = logging.getLogger("capgate")
_KEPT_POLICY_WARNED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=64)
def _loaded_name(policy: str) -> str:
    """The name of a preset's or policy file's policy (each read once)."""
    return load_policy(policy).name
