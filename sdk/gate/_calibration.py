"""The calibration a gate decides under, and a candidate it tries beside the call (issue 26).

The settings' meaning is documented on :class:`~capgate.GateSettings` (``calibration``,
``shadow_calibration``). A candidate decides through a gate of its own (same settings, the
candidate's calibration, no log, enforce mode) in the gate's shadow threads, so it never delays or
fails the call; an estimator that raises becomes a degraded candidate decision naming the error.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capgate.core.types import Decision
from capgate.errors import SettingsError
from capgate.estimators.base import CapabilityEstimator
from capgate.gate._defaults import default_estimator
from capgate.gate._effects import FlowGate
from capgate.gate._results import Verdict
from capgate.gate._settings import CANDIDATE, PROMOTED, CalibrationLike, CalibrationSetting, GateSettings
from capgate.gate._shadow import Shadows, decided
from capgate.gate.flow import drive
from capgate.policies import Policy

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog


def load_calibration(
    setting: str | Path, keyword: str, log: DecisionLog | None, target: str | None
) -> CalibrationLike | None:
    """The calibration in a folder, or (``keyword``) the version the log has promoted / in shadow
    for ``target`` (``None`` when there is none).

    Raises:
        SettingsError: The calibration is for another target, or the log's event names a folder
            that holds another version.
        DataError: The folder is missing or not a calibration (from ``Calibration.load``).
    """
    from capgate.learn import Calibration

    expected: str | None = None
    path: str | Path = setting
    if isinstance(setting, str) and setting == keyword:
        if log is None:  # GateSettings refuses it; kept for a direct call
            raise SettingsError(f"{keyword!r} reads the calibration from the decision log: pass log=...")
        event = log.active_calibration(target) if keyword == PROMOTED else log.candidate_calibration(target)
        if event is None:
            return None
        expected, path = event.version, event.path
    loaded = Calibration.load(path)
    if expected is not None and loaded.version != expected:
        raise SettingsError(
            f"the decision log has {expected} as the {keyword} calibration of target {target!r}, but "
            f"the folder it names ({path}) holds {loaded.version}"
        )
    return checked_target(loaded, target)


def checked_target(calibration: CalibrationLike, target: str | None) -> CalibrationLike:
    """``calibration``; a :class:`SettingsError` if it was learned for another target."""
    made_for = getattr(calibration, "target", None)
    if made_for is not None and target is not None and made_for != target:
        raise SettingsError(
            f"calibration {calibration.version} was learned for target {made_for!r}; "
            f"this gate's target is {target!r}"
        )
    return calibration


class Calibrations:
    """A gate's calibrations, each loaded once, with each calibrated estimator (so batching by
    estimator still groups) and each candidate's gate made once."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loaded: dict[tuple[Any, ...], tuple[Any, CalibrationLike | None]] = {}
        self._applied: dict[tuple[str, int], tuple[CapabilityEstimator, CapabilityEstimator]] = {}
        self._candidates: dict[str, FlowGate] = {}
        self._policies: dict[str, Policy | None] = {}

    def resolve(
        self, setting: CalibrationSetting, keyword: str, log: DecisionLog | None, target: str | None
    ) -> CalibrationLike | None:
        """:func:`load_calibration`, once per setting (a failure is raised and retried next time)."""
        if isinstance(setting, CalibrationLike):
            return checked_target(setting, target)
        key = (keyword, str(setting), id(log), target)
        with self._lock:
            if key not in self._loaded:
                self._loaded[key] = (log, load_calibration(setting, keyword, log, target))
            return self._loaded[key][1]

    def applied(
        self, calibration: CalibrationLike | None, base: CapabilityEstimator, settings: GateSettings
    ) -> CapabilityEstimator:
        """``base`` under ``calibration`` (built once per pair); ``base`` itself when uncalibrated."""
        if calibration is None:
            return base
        key = (calibration.version, id(base))
        with self._lock:
            if key not in self._applied:  # the base is kept, so its id is not reused
                self._applied[key] = (base, calibration.apply(base, featurizer=settings.feature_reader))
            return self._applied[key][1]

    def policy(self, calibration: CalibrationLike) -> Policy | None:
        """The thresholds ``calibration`` carries (read once), or ``None``."""
        with self._lock:
            if calibration.version not in self._policies:
                self._policies[calibration.version] = calibration.policy
            return self._policies[calibration.version]

    def for_target(self, estimator: CapabilityEstimator) -> CapabilityEstimator:
        """The estimator whose ``target_model`` a decision records: ``estimator``'s, else its base's."""
        if estimator.target_model is not None:
            return estimator
        with self._lock:
            for base, made in self._applied.values():
                if made is estimator:
                    return base
        return estimator

    def candidate_gate(
        self, calibration: CalibrationLike, settings: GateSettings, make: Callable[[GateSettings], FlowGate]
    ) -> FlowGate:
        """The gate a candidate decides through: the same settings under it, no log, enforce mode."""
        with self._lock:
            if calibration.version not in self._candidates:
                candidate = settings.replace(
                    calibration=calibration,
                    shadow_calibration=None,
                    log_features=False,
                    log=None,
                    mode="enforce",
                    speculative=False,
                )
                self._candidates[calibration.version] = make(candidate)
            return self._candidates[calibration.version]


def calibration_target(settings: GateSettings) -> str | None:
    """The target whose calibration events a gate reads: its ``target``, else its estimator's."""
    if settings.target is not None:
        return settings.target
    base = settings.estimator or default_estimator()
    return None if base is None else base.target_model


def _candidate_decision(gate: FlowGate, verdict: Verdict) -> Decision:
    decision_id = uuid.uuid4().hex  # its own id; ``beside`` ties it to the enforced decision
    made: Verdict = drive(decided(gate, verdict.query, decision_id))
    return made.decision.model_copy(update={"beside": verdict.decision.id})


def decide_candidate(
    gate: FlowGate,
    verdict: Verdict,
    log: DecisionLog,
    shadows: Shadows,
    calibrations: Calibrations,
    make: Callable[[GateSettings], FlowGate],
) -> None:
    """Beside a decision just logged, decide under the gate's ``shadow_calibration`` and log that,
    in a shadow thread; a failure is counted (``stats.candidate_failures``) and warned, never raised."""
    settings = gate.settings
    setting = settings.shadow_calibration
    if setting is None or verdict.decision.beside is not None:
        return

    def job() -> bool:
        candidate = calibrations.resolve(setting, CANDIDATE, log, calibration_target(settings))
        if candidate is None:  # "candidate", and the log has none in shadow
            return False
        decision = _candidate_decision(calibrations.candidate_gate(candidate, settings, make), verdict)
        log.record(decision, query=verdict.query)
        return True

    def described(exc: Exception) -> str:
        why = f"candidate decision beside {verdict.decision.id}: {type(exc).__name__}"
        return f"{why}: {exc}" if isinstance(exc, SettingsError) else why

    shadows.beside(gate.stats, "candidate", job, described)
