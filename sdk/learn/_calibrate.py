"""``calibrate``: learn from the decision log's outcomes, versioned and risk-controlled.

From the logged decisions with outcomes of one target and one estimator method, in time order:

1. the latest ``holdout`` share is held out (what the next days look like);
2. candidates are fitted on the older part only: isotonic and Platt maps of the logged estimates
   and, where reader features were logged, a probe on them (the shipped probe's ridge trainer, one
   row per query); the *previous* estimator (the estimates as logged) is a candidate too;
3. each is scored on the held-out outcomes (capability Brier with a 95% interval and its paired
   difference from the previous estimator, cluster-robust by query when queries recur), and one
   is kept by :func:`capgate.learn.select`: the previous one unless a candidate beats it beyond
   the noise;
4. with ``risk``, an answer threshold is certified by Learn-then-Test on cross-fitted confidences
   of the kept estimator (no row scored by a fit that saw its outcome) and written into a policy.
   The older rows' confidences come from fits on the other older blocks, and the held-out rows
   also chose the candidate: two small departures from the test's assumptions, measured by
   ``bench/learn_from_traffic.py``;
5. everything is written atomically to a versioned folder (:class:`~capgate.learn.Calibration`).

Enforced traffic has outcomes only for what the gate let through. When enforced decisions were
blocked without outcomes, the answer threshold never goes below the kept estimator's confidence at
the lowest logged estimate with an outcome (a monotone map keeps every blocked query below it); a
probe orders queries its own way, so it then gets no threshold (log shadow traffic instead: all
its calls proceed and get outcomes).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from capgate._util.validate import FloatArray, IntArray
from capgate.learn._artefact import CALIBRATOR_FILE, POLICY_FILE, Calibration, Kind, write_calibration
from capgate.learn._crossfit import cross_fit, fit_map, map_fitter, time_split
from capgate.learn._probe import LoggedFeatureSet, fit_probe, logged_features
from capgate.learn._select import PREVIOUS, SELECTION_LEVEL, HeldOutRow, best_challenger, select, table_rows
from capgate.learn._traffic import CalibrationRefusedError, Traffic, read_traffic
from capgate.policies import PRESETS

if TYPE_CHECKING:
    from capgate.decision.store.log import DecisionLog
    from capgate.policies import Policy


MIN_OUTCOMES = 100
"""Fewest decisions with outcomes ``calibrate`` learns from by default."""
MIN_SIDE = 10
"""Fewest outcomes on each side of the time split."""


@dataclass(frozen=True)
class CalibrationResult:
    """What :func:`calibrate` wrote and why.

    Attributes:
        calibration: The written calibration (load it again with :meth:`Calibration.load`).
        kind: The kept candidate's kind (``"identity"`` when the previous estimator was kept).
        table: The held-out table, the kept candidate marked ``chosen``.
        threshold: The certified answer threshold (``None``: none asked for, or none certified).
        notes: What the run decided that a reader should know (skipped candidates, thresholds).
        summary: The account stored in ``calibration.json``.
        candidates: Every challenger as fitted on the older part, kept or not, by name (an
            isotonic or Platt map, a :class:`~capgate.estimators.LinearProbe`): to inspect what
            lost and by how much; only the kept one is written.
    """

    calibration: Calibration
    kind: Kind
    table: list[HeldOutRow]
    threshold: float | None
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    candidates: dict[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The calibration's version."""
        return self.calibration.version


@dataclass
class _Candidate:
    name: str
    holdout: FloatArray
    n_fit: int
    fitted: Any = None
    train_oof: FloatArray | None = None  # cross-fitted on the older part (NaN: no prediction)
    crossfit_brier: float | None = None


def _brier(p: FloatArray, y: FloatArray) -> float | None:
    """Brier over the rows with a prediction (``None`` when none has one)."""
    known = ~np.isnan(p)
    return float(np.mean((p[known] - y[known]) ** 2)) if known.any() else None


def _previous_kind(log: DecisionLog, traffic: Traffic) -> tuple[Calibration | None, str | None]:
    """The calibration the window was made under (loaded, when the log records its folder)."""
    version = traffic.versions[0] if len(traffic.versions) == 1 else None
    if version is None:
        return None, None
    for event in reversed(log.calibration_events(traffic.target)):
        if event.version == version and event.path:
            try:
                return Calibration.load(event.path), version
            except (OSError, ValueError):
                break
    return None, version


def calibrate(
    log: DecisionLog | str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    target: str | None = None,
    method: str | None = None,
    risk: float | None = None,
    delta: float = 0.05,
    policy: str | Path | Policy | None = None,
    holdout: float = 0.3,
    min_outcomes: int = MIN_OUTCOMES,
    allow_mixed_versions: bool = False,
    since: datetime | None = None,
    until: datetime | None = None,
    probe: bool = True,
    n_splits: int = 5,
    seed: int = 0,
    selection_level: float = SELECTION_LEVEL,
) -> CalibrationResult:
    """Learn a calibration from the log's outcomes and write it to ``out`` (see the module docs).

    Args:
        log: A :class:`~capgate.decision.DecisionLog`, or its path or URL.
        out: The calibration folder to create.
        target: The target model to calibrate (required when the window holds several).
        method: The estimator method (required when the window holds several).
        risk: Certify an answer threshold with error rate <= ``risk`` among answered queries.
        delta: ... with probability >= 1 - ``delta``.
        policy: The policy whose answer threshold is set (default: the one the decisions were
            made by, when it is a shipped preset, else a new two-band policy).
        holdout: Share of the latest outcomes held out to choose the candidate.
        min_outcomes: Refuse with fewer outcomes than this.
        allow_mixed_versions: Learn from a window whose decisions were made under several
            calibration versions.
        since: Only decisions made at or after this time.
        until: Only decisions made before this time.
        probe: Consider a probe on logged reader features.
        n_splits: Blocks of the cross-fitting.
        seed: Seed of the probe's trainer and the LTT one-response draw.
        selection_level: One-sided level a challenger's held-out advantage over the previous
            estimator must clear (split among the challengers); lower keeps the previous
            estimator more often.

    Raises:
        CalibrationRefusedError: Too few outcomes (the count needed and found), another target
            or method, features from several readers, mixed calibration versions.
        DataError: ``out`` exists.
    """
    from capgate.decision.store.log import DecisionLog

    if not 0.0 < selection_level < 1.0:
        raise ValueError(f"`selection_level` must be in (0, 1); got {selection_level!r}")
    if policy is not None and risk is None:
        raise ValueError("`policy` is the policy whose answer threshold `risk` sets: give risk (--risk) too")
    if min_outcomes < 2 * MIN_SIDE:
        raise ValueError(f"`min_outcomes` must be at least {2 * MIN_SIDE}; got {min_outcomes}")
    opened = log if isinstance(log, DecisionLog) else DecisionLog(os.fspath(log))
    try:
        traffic = read_traffic(
            opened,
            target=target,
            method=method,
            since=since,
            until=until,
            allow_mixed_versions=allow_mixed_versions,
            min_outcomes=min_outcomes,
        )
        custom = traffic.policy is not None and traffic.policy not in PRESETS
        if risk is not None and policy is None and custom:
            raise CalibrationRefusedError(
                f"the decisions were made under the policy {traffic.policy!r}, which is not a preset: "
                "pass it with --policy FILE (policy=), so the learned version keeps its bands and sets "
                "only its answer threshold; without it a two-band policy would be written",
                path=opened.location,
            )
        groups = traffic.groups  # a recurring query's outcomes stay on one side of every split
        split = time_split(len(traffic), holdout, groups)
        if min(len(split.train), len(split.holdout)) < MIN_SIDE:
            raise CalibrationRefusedError(
                f"too few outcomes on one side of the time split ({len(split.train)} older, "
                f"{len(split.holdout)} held out); each side needs at least {MIN_SIDE}: "
                "more outcomes or another holdout share",
                path=opened.location,
            )
        tr, ho = split.train, split.holdout
        est = traffic.estimated
        if min(int(est[tr].sum()), int(est[ho].sum())) < MIN_SIDE:
            raise CalibrationRefusedError(
                f"too few usable estimates on one side of the time split ({int(est[tr].sum())} older, "
                f"{int(est[ho].sum())} held out); each side needs at least {MIN_SIDE} to compare "
                "candidates with the previous estimator: more outcomes or another holdout share",
                path=opened.location,
            )
        previous_cal, previous_version = _previous_kind(opened, traffic)
        notes: list[str] = []
        if not est.all():
            notes.append(
                f"{int((~est).sum())} of {len(traffic)} decisions with outcomes had no usable estimate "
                "(degraded): the previous estimator and its maps are fitted and compared on the others; "
                "a probe on logged features learns from them too"
            )
        y = traffic.y
        candidates = [
            _Candidate(PREVIOUS, traffic.p[ho], 0, None, traffic.p[tr], _brier(traffic.p[tr], y[tr]))
        ]
        base_known = traffic.has_base or (previous_cal is not None and previous_cal.kind == "identity")
        if base_known:
            bp = traffic.base_p
            fit_rows = tr[est[tr]]
            for name in ("isotonic", "platt"):
                fitted = fit_map(name, bp[fit_rows], y[fit_rows])
                within = None if groups is None else groups[fit_rows]
                fitter = map_fitter(name, bp[fit_rows], y[fit_rows])
                oof = np.full(len(tr), np.nan)
                oof[est[tr]] = cross_fit(fitter, len(fit_rows), n_splits=n_splits, groups=within).predictions
                held = np.full(len(ho), np.nan)
                held[est[ho]] = fitted.predict(bp[ho[est[ho]]])
                candidates.append(_Candidate(name, held, len(fit_rows), fitted, oof, _brier(oof, y[tr])))
        else:
            notes.append(
                "no isotonic or Platt candidate: the window's estimates came from a probe calibration "
                "and do not record the base estimator's confidence"
            )
        features: LoggedFeatureSet | None = None
        if probe:
            features = logged_features(opened, traffic)
            if features is not None:
                probe_candidate = _probe_candidate(features, traffic, tr, ho, seed, opened.location, notes)
                if probe_candidate is not None:
                    candidates.append(probe_candidate)
        compared = est[ho]  # every candidate is judged where the previous estimator had an estimate
        held_groups = None if groups is None else groups[ho][compared]
        rows = _table(candidates, y[ho], compared, held_groups, selection_level)
        best = best_challenger(rows)
        if best is not None and best.candidate == "probe" and best.diff_high < 0:  # its veto check
            assert features is not None
            found = candidates[-1]
            found.train_oof = _probe_oof(features, traffic, tr, n_splits, seed, opened.location)
            found.crossfit_brier = _brier(found.train_oof[est[tr]], y[tr][est[tr]])
            rows = _table(candidates, y[ho], compared, held_groups, selection_level)
        winner_name, rows = select(rows)
        best = best_challenger(rows)
        if (
            best is not None
            and winner_name == PREVIOUS
            and best.diff_high < 0
            and best.crossfit_brier is None
        ):
            notes.append(
                f"{best.candidate} beat the previous estimator on the held-out outcomes, but cross-fitting "
                "made no predictions on the older part (its outcomes come from too few distinct queries "
                "for 2 folds), so the veto could not confirm it: the previous estimator stays"
            )
        winner = next(c for c in candidates if c.name == winner_name)
        kind: Kind = "identity" if winner_name == PREVIOUS else cast(Kind, winner_name)
        kept_files: Calibration | None = None
        if winner_name == PREVIOUS and previous_version is not None:
            if previous_cal is None:
                raise CalibrationRefusedError(
                    f"the previous estimator (calibration {previous_version}) stays best on the held-out "
                    "outcomes, but the log records no folder for it to carry forward: nothing written",
                    path=opened.location,
                )
            kept_files, kind = previous_cal, previous_cal.kind
            notes.append(f"the previous calibration {previous_version} stays: no candidate beat it")

        threshold, policy_yaml, thresholds = None, None, None
        if risk is not None:
            from capgate.learn._ltt import certify

            honest = np.full(len(traffic), np.nan)
            honest[ho] = winner.holdout
            if winner.train_oof is not None:
                honest[tr] = winner.train_oof
            threshold, policy_yaml, thresholds = certify(
                honest,
                traffic,
                fitted=winner.fitted if winner.name in ("isotonic", "platt") else None,
                kind=kind,
                risk=risk,
                delta=delta,
                policy=policy,
                seed=seed,
                notes=notes,
            )

        summary = {
            "window": traffic.window,
            "n": len(traffic),
            "n_train": len(tr),
            "n_holdout": len(ho),
            "holdout": holdout,
            "counts": traffic.counts,
            "excluded": traffic.excluded,
            "selection_gap": traffic.blocked_without_outcome,
            "previous_version": previous_version,
            "versions": list(traffic.versions),
            "features": _features_summary(features),
            "table": [r.to_dict() for r in rows],
            "chosen": winner_name,
            "thresholds": thresholds,
            "seed": seed,
            "selection_level": selection_level,
            "notes": notes,
        }

        def write_files(folder: Path) -> None:
            if kept_files is not None:
                for name in _estimator_files(kept_files):
                    shutil.copy2(kept_files.path / name, folder / name)
            elif kind in ("isotonic", "platt"):
                from capgate.estimators import Recalibrated

                Recalibrated.save_map(folder / CALIBRATOR_FILE, winner.fitted, base_method=traffic.method)
            elif kind == "probe":
                winner.fitted.save(folder)
            if policy_yaml is not None:
                (folder / POLICY_FILE).write_text(policy_yaml, encoding="utf-8")

        write_calibration(
            out,
            kind=kind,
            target=traffic.target,
            method=traffic.method,
            summary=summary,
            write_files=write_files,
        )
        challengers = {c.name: c.fitted for c in candidates if c.fitted is not None}
        return CalibrationResult(Calibration.load(out), kind, rows, threshold, notes, summary, challengers)
    finally:
        if opened is not log:
            opened.close()


def _features_summary(features: LoggedFeatureSet | None) -> dict[str, Any] | None:
    if features is None:
        return None
    return {"spec_sha256": features.spec_sha256, "n": int(features.has.sum())}


def _estimator_files(calibration: Calibration) -> list[str]:
    """The files that make a calibration's estimator (not its policy or its own record)."""
    names = {"isotonic": [CALIBRATOR_FILE], "platt": [CALIBRATOR_FILE], "identity": []}
    return names.get(calibration.kind, ["probe.safetensors", "probe.json"])


def _probe_candidate(
    features: LoggedFeatureSet,
    traffic: Traffic,
    tr: IntArray,
    ho: IntArray,
    seed: int,
    location: str,
    notes: list[str],
) -> _Candidate | None:
    missing = int((~features.has[ho]).sum())
    train_rows = tr[features.has[tr]]
    if missing:
        notes.append(f"no probe candidate: {missing} held-out decisions have no logged features")
        return None
    if len(train_rows) < MIN_SIDE * 2:
        notes.append(f"no probe candidate: {len(train_rows)} older decisions have features; it needs 20")
        return None
    groups = traffic.groups
    fitted = fit_probe(
        features.X[train_rows],
        traffic.y[train_rows],
        spec=features.spec,
        target=traffic.target,
        source=f"decision log {location}",
        seed=seed,
        groups=None if groups is None else groups[train_rows],
    )
    return _Candidate("probe", fitted.predict(features.X[ho]), len(train_rows), fitted)


def _table(
    candidates: list[_Candidate],
    y_holdout: FloatArray,
    compared: npt.NDArray[np.bool_],
    groups: npt.NDArray[np.str_] | None,
    level: float,
) -> list[HeldOutRow]:
    return table_rows(
        y_holdout[compared],
        {c.name: c.holdout[compared] for c in candidates},
        n_fit={c.name: c.n_fit for c in candidates},
        crossfit_brier={c.name: c.crossfit_brier for c in candidates},
        level=level,
        groups=groups,
    )


def _probe_oof(
    features: LoggedFeatureSet, traffic: Traffic, tr: IntArray, n_splits: int, seed: int, location: str
) -> FloatArray:
    """The probe's cross-fitted predictions on the older part (NaN where no features were logged):
    each block predicted by a probe trained on the other blocks only."""
    y, X = traffic.y, features.X
    rows = tr[features.has[tr]]
    spec, source = features.spec, f"decision log {location}"

    groups = traffic.groups

    def fit_predict(a: IntArray, b: IntArray) -> FloatArray:
        by = None if groups is None else groups[rows[a]]
        fitted = fit_probe(
            X[rows[a]], y[rows[a]], spec=spec, target=traffic.target, source=source, seed=seed, groups=by
        )
        return fitted.predict(X[rows[b]])

    oof = np.full(len(tr), np.nan)
    within = None if groups is None else groups[rows]
    oof[features.has[tr]] = cross_fit(fit_predict, len(rows), n_splits=n_splits, groups=within).predictions
    return oof
