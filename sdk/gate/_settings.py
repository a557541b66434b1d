"""The settings every gate and integration takes, checked in one place."""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias, TypedDict, runtime_checkable

from capgate.core.types import Extractor, Mode
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.estimators.probe import Featurizer
from capgate.policies import Policy, load_policy

if TYPE_CHECKING:
    from capgate.decision.log import DecisionLog


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

    Each key is a field of :class:`GateSettings` (see there); one not given keeps its default (or,
    in ``with_options``, the gate's value). Integrations declare ``**settings: Unpack[GateOptions]``
    so the same keywords are type-checked everywhere.
    """

    on_block: OnBlock


@dataclass(frozen=True)
class GateSettings:
    """What a :class:`~capgate.Gate` is configured with; every integration takes the same keywords.

    Checked on construction (and on :meth:`replace`), each error naming the setting.

    Attributes:
        policy: A :class:`~capgate.policies.Policy`, a preset name or a policy file path.
        estimator: The capability estimator; ``None`` uses the process-wide default
            (:func:`capgate.set_default_estimator`) at call time.
        extract: Answer extractor for ``resample`` votes (default: :func:`capgate.default_extract`).
        on_block: ``"return"`` a result or ``"raise"`` a :class:`~capgate.GateBlocked`.
        step: Agent step passed to the policy (selects its ``steps:`` override).
        tool: Tool name passed to the policy (selects its ``tools:`` override).
        log: Decision log (a :class:`~capgate.decision.DecisionLog` or a path to one).
        target: The model the gated calls go to (a model id or served name); recorded in each
            decision and checked against the estimator's target (a probe knows whose
            capability it predicts).
        allow_other_target: Gate calls to ``target`` with an estimator of another model's
            capability; each decision records the override (``target_override``).
        max_concurrency: Most estimate calls in flight at once from this gate and its views; a
            burst beyond it queues for a slot (``None``: no cap of the gate's own).
        estimate_timeout_s: Deadline in seconds on one call's estimate, the wait for a slot
            included; a late estimate becomes a degraded decision naming it (``None``: none).
        routes: One capability estimator per model choice (by name), for the policy's ``route``
            actions: the query goes to the cheapest choice (first in the action's ``choices``)
            whose predicted capability clears the edge, else to the strongest (the last).
        mode: ``"shadow"``: decide and log beside each call, which proceeds as if answered (the
            estimate never delays or fails it); ``"enforce"``: act on each decision; ``None``: the
            policy's ``mode`` (enforce unless the policy file says shadow).
        speculative: In enforce mode, start the gated call together with its estimate (for a
            remote call whose estimate is a call of its own): an ``answer`` returns the call's
            result without waiting twice; a block discards it (an async call is cancelled). The
            decision records it (``speculation``). Only for calls that are safe to start and drop.
        log_features: Write each logged decision's reader features to the log (keyed by its id,
            tagged with the reader's feature spec), for ``capgate calibrate`` to fit a probe on the
            gate's own traffic. A probe's are its own (no second pass); for another estimator
            (verbalized, P(True), consistency) ``feature_reader`` computes them beside the call,
            which it never delays or fails (failures are counted in ``stats.feature_failures``).
            Needs a ``log``. Features are as sensitive as the text: hidden states can be inverted
            to recover much of a prompt.
        feature_reader: The featurizer whose features are logged. ``None``: a probe's own; for
            another estimator, the embedded model's, with the default probe's spec (loaded once, on
            the first decision that needs it, beside the call).
        calibration: Run under a calibration (``capgate calibrate --out DIR``): a folder, a loaded
            :class:`capgate.learn.Calibration`, or ``"promoted"`` (the version the log says is in
            force for the gate's target, read when the gate first decides; nothing promoted: run
            uncalibrated). The gate uses the calibration's estimator in place of ``estimator`` and
            its thresholds (when it carries them) as its policy, unless ``policy`` names another
            policy than the one they were learnt for (then the gate keeps its own, and says so
            once on the ``capgate`` logger; refused at once for a loaded calibration); every
            decision records its ``calibration`` version.
        shadow_calibration: A candidate calibration (as ``calibration``, or ``"candidate"``: the
            version the log has in shadow). Beside every logged decision the gate also decides
            under the candidate and logs that decision (``shadow``, with the candidate's
            ``calibration`` and ``beside`` the enforced decision's id), never delaying or failing
            the call; ``capgate report`` compares the two on the same decisions. Needs a ``log``.

    Raises:
        SettingsError: A setting has a wrong value or type (the message names it), or the
            estimator predicts another model than ``target`` without ``allow_other_target``.
    """

    policy: PolicyLike = DEFAULT_POLICY
    estimator: CapabilityEstimator | None = None
    extract: Extractor | None = None
    on_block: OnBlock = "return"
    step: str | None = None
    tool: str | None = None
    log: DecisionLog | str | Path | None = None
    target: str | None = None
    allow_other_target: bool = False
    max_concurrency: int | None = None
    estimate_timeout_s: float | None = None
    routes: Mapping[str, CapabilityEstimator] | None = None
    mode: Mode | None = None
    speculative: bool = False
    log_features: bool = False
    feature_reader: Featurizer | None = None
    calibration: CalibrationSetting | None = None
    shadow_calibration: CalibrationSetting | None = None

    def __post_init__(self) -> None:
        from capgate.decision.log import DecisionLog

        policy = self.policy
        if not isinstance(policy, str | Path | Policy) or (isinstance(policy, str) and not policy):
            raise SettingsError(
                f"`policy` must be a Policy, a preset name or a policy file path; got {policy!r}"
            )
        if self.estimator is not None and not isinstance(self.estimator, CapabilityEstimator):
            raise SettingsError(
                f"`estimator` must be a capgate CapabilityEstimator or None; got {self.estimator!r}"
            )
        if self.extract is not None and not callable(self.extract):
            raise SettingsError(f"`extract` must be a function text -> answer or None; got {self.extract!r}")
        if self.on_block not in ON_BLOCK:
            raise SettingsError(f"`on_block` must be one of {ON_BLOCK}; got {self.on_block!r}")
        for name in ("step", "tool"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise SettingsError(f"`{name}` must be a non-empty string or None; got {value!r}")
        if self.log is not None and not isinstance(self.log, DecisionLog | str | Path):
            raise SettingsError(f"`log` must be a DecisionLog, a path or None; got {self.log!r}")
        if self.target is not None and not (isinstance(self.target, str) and self.target):
            raise SettingsError(f"`target` must be a non-empty model name or None; got {self.target!r}")
        if not isinstance(self.speculative, bool):
            raise SettingsError(f"`speculative` must be True or False; got {self.speculative!r}")
        if not isinstance(self.allow_other_target, bool):
            raise SettingsError(
                f"`allow_other_target` must be True or False; got {self.allow_other_target!r}"
            )
        limit = self.max_concurrency
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise SettingsError(f"`max_concurrency` must be a positive integer or None; got {limit!r}")
        deadline = self.estimate_timeout_s
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 0 < deadline < 1e9
        ):
            raise SettingsError(f"`estimate_timeout_s` must be a positive number or None; got {deadline!r}")
        if self.mode not in (None, *MODES):
            raise SettingsError(f"`mode` must be one of {MODES} or None; got {self.mode!r}")
        if self.estimator is not None:
            self.target_check(self.estimator)
        self._check_learning()
        if self.routes is not None:
            if not isinstance(self.routes, Mapping) or not self.routes:
                raise SettingsError(
                    f"`routes` must map model choice names to capability estimators; got {self.routes!r}"
                )
            for name, estimator in self.routes.items():
                if not (isinstance(name, str) and name) or not isinstance(estimator, CapabilityEstimator):
                    raise SettingsError(
                        f"`routes` must map model choice names to capability estimators; "
                        f"got {name!r}: {estimator!r}"
                    )
            object.__setattr__(self, "routes", dict(self.routes))

    def _check_learning(self) -> None:
        """Check the settings of learning from traffic: features and calibrations."""
        if not isinstance(self.log_features, bool):
            raise SettingsError(f"`log_features` must be True or False; got {self.log_features!r}")
        if self.log_features and self.log is None:
            raise SettingsError(
                "`log_features` writes each decision's features to the decision log: pass log=..."
            )
        if self.feature_reader is not None and not isinstance(self.feature_reader, Featurizer):
            raise SettingsError(
                "`feature_reader` must be a featurizer (with `spec` and `transform(queries)`) or None; "
                f"got {self.feature_reader!r}"
            )
        for name, keyword in (("calibration", PROMOTED), ("shadow_calibration", CANDIDATE)):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str | Path | CalibrationLike) or (isinstance(value, str) and not value):
                raise SettingsError(
                    f"`{name}` must be a calibration folder, a loaded capgate.learn.Calibration, "
                    f"{keyword!r} or None; got {value!r}"
                )
            other = CANDIDATE if keyword == PROMOTED else PROMOTED
            if isinstance(value, str) and value == other:
                raise SettingsError(f"`{name}` takes {keyword!r} (or a folder), not {other!r}")
            if self.log is None and (value == keyword or name == "shadow_calibration"):
                why = "reads the version from" if value == keyword else "logs its candidate decisions to"
                raise SettingsError(f"`{name}`={value!r} {why} the decision log: pass log=...")
        if isinstance(self.calibration, CalibrationLike):
            self.calibrated_policy(self.calibration.version, self.calibration.policy, at_start=True)

    def calibrated_policy(
        self, version: str, policy: Policy | None, *, at_start: bool = False
    ) -> Policy | None:
        """The policy a gate under calibration ``version`` decides by: its thresholds (``policy``)
        when the gate's ``policy`` was left at the default or names the policy they were learnt
        for; ``None`` (keep the gate's own policy, and say so once on the ``capgate`` logger) when
        the gate names another one. A promotion never makes a running gate raise.

        Raises:
            SettingsError: ``at_start`` (a calibration given loaded, so known when the gate is
                built) and the gate names another policy than the one its thresholds are for.
        """
        if policy is None or (isinstance(self.policy, str) and self.policy == DEFAULT_POLICY):
            return policy
        own = _policy_name(self.policy)
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
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise SettingsError(f"unknown gate setting(s): {', '.join(unknown)}")
        given = {k: v for k, v in changes.items() if v is not UNSET}
        return dataclasses.replace(self, **given) if given else self


def given_settings(**values: Any) -> dict[str, Any]:
    """The settings among ``values`` that differ from :class:`GateSettings`' defaults.

    Integrations call it with their keyword arguments to tell which were given alongside ``gate=``.

    Raises:
        SettingsError: A name that is not a gate setting.
    """
    defaults = GateSettings()
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(defaults)})
    if unknown:
        raise SettingsError(f"unknown gate setting(s): {', '.join(unknown)}")
    return {k: v for k, v in values.items() if v is not UNSET and v != getattr(defaults, k)}


_LOG = logging.getLogger("capgate")
_KEPT_POLICY_WARNED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=64)
def _loaded_name(policy: str) -> str:
    return load_policy(policy).name


def _policy_name(policy: PolicyLike) -> str:
    """The name of a policy setting (a preset or file is read once)."""
    return policy.name if isinstance(policy, Policy) else _loaded_name(str(policy))
