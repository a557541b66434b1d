"""Logged traffic for the capgate.learn tests: decisions with outcomes written to a real log, in
time order, with the estimates, actions, targets, versions and features a test asks for."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from capgate import Estimate
from capgate.decision import Decision, DecisionLog

START = datetime(2026, 1, 1, tzinfo=UTC)
SPEC: dict[str, Any] = {"model_id": "toy-reader", "weights_fingerprint": "sha256:toy", "dim": 4}


def log_traffic(
    log: DecisionLog,
    p: Sequence[float | None],
    y: Sequence[float | None],
    *,
    method: str = "verbalized",
    target: str | None = "m",
    action: str | Sequence[str] = "answer",
    shadow: bool = False,
    calibration: str | None = None,
    features: np.ndarray | None = None,
    spec: dict[str, Any] | None = None,
    start: datetime = START,
    details: Sequence[dict[str, Any]] | None = None,
    policy: str | None = None,
) -> list[str]:
    """Record one decision per ``p`` (one minute apart from ``start``; ``None``: a degraded estimate)
    and its binary outcome ``y`` (``None``: no outcome); with ``features``, log row ``i`` beside
    decision ``i`` under ``spec``."""
    ids = []
    actions = [action] * len(p) if isinstance(action, str) else list(action)
    for i, (pi, yi) in enumerate(zip(p, y, strict=True)):
        extra = details[i] if details else {}
        estimate = (
            Estimate(p=float(pi), method=method, details=extra)
            if pi is not None
            else Estimate(p=None, method=method, degraded=True, reason="test: no estimate", details=extra)
        )
        d = Decision(
            action=actions[i],
            estimate=estimate,
            reason="test",
            target=target,
            shadow=shadow,
            calibration=calibration,
            policy=policy,
            created_at=start + timedelta(minutes=i),
        )
        log.record(d)
        if yi is not None:
            log.record_outcome(d.id, correct=bool(yi))
        ids.append(d.id)
    if features is not None:
        log.record_features(list(zip(ids, features, strict=True)), spec or SPEC)
    return ids


def overconfident(n: int, seed: int = 0, power: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """Estimates p ~ U(0.05, 0.95) whose true capability is p**power, and binary outcomes.

    The default is overconfident enough that ``calibrate`` replaces it from 300 outcomes in
    every seed tried (0-5); p**3 sits near the selection test's power at 400 (replaced in 5 of
    6 seeds): ``bench/learn_selection.py`` measures the rates."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 0.95, n)
    return p, (rng.random(n) < p**power).astype(float)
