"""Calibration events in the decision log, on both stores: shadow, promote and rollback per
target, the version in force and the candidate beside it, and rollbacks that return to the
version promoted before (or to none)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from capgate import DataError
from capgate.decision import CalibrationEvent, DecisionLog
from capgate.decision.store.calibrations import NO_CALIBRATION


def _version(event: CalibrationEvent | None) -> str | None:
    return None if event is None else event.version


def test_promote_shadow_and_rollback_give_the_version_in_force_and_the_candidate(
    log_location: str | Path,
) -> None:
    with DecisionLog(log_location) as log:
        assert log.active_calibration("m") is None
        assert log.candidate_calibration("m") is None
        first = log.record_calibration_event("shadow", "cal-a", "/cal/a", target="m")
        assert isinstance(first, CalibrationEvent)
        assert first.at.tzinfo is not None
        assert first.writer is not None
        assert log.active_calibration("m") is None
        assert log.candidate_calibration("m") == first
        log.record_calibration_event("promote", "cal-a", "/cal/a", target="m")
        assert (log.active_calibration("m") or first).version == "cal-a"
        assert log.candidate_calibration("m") is None  # its shadow is older than its promotion
        log.record_calibration_event("shadow", "cal-b", "/cal/b", target="m")
        log.record_calibration_event(
            "shadow", "cal-a", "/cal/a", target="m"
        )  # the enforced one: no candidate
        candidate = log.candidate_calibration("m")
        assert candidate is not None
        assert (candidate.version, candidate.path) == ("cal-b", "/cal/b")
        log.record_calibration_event("promote", "cal-b", "/cal/b", target="m", previous="cal-a")
        active = log.active_calibration("m")
        assert active is not None
        assert (active.event, active.version, active.previous) == ("promote", "cal-b", "cal-a")
        back = log.rollback_calibration("m")
        assert (back.event, back.version, back.path, back.previous) == (
            "rollback",
            "cal-a",
            "/cal/a",
            "cal-b",
        )
        assert log.active_calibration("m") == back
        none = log.rollback_calibration("m")
        assert (none.version, none.path, none.previous) == (NO_CALIBRATION, NO_CALIBRATION, "cal-a")
        assert log.active_calibration("m") is None
        with pytest.raises(
            DataError, match="no calibration is in force for target 'm': nothing to roll back"
        ):
            log.rollback_calibration("m")
        events = log.calibration_events("m")
    assert [(e.event, e.version) for e in events] == [
        ("shadow", "cal-a"),
        ("promote", "cal-a"),
        ("shadow", "cal-b"),
        ("shadow", "cal-a"),
        ("promote", "cal-b"),
        ("rollback", "cal-a"),
        ("rollback", ""),
    ]
    assert [e.at for e in events] == sorted(e.at for e in events)


def test_targets_are_kept_apart_and_none_is_the_gate_without_a_target(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        log.record_calibration_event("promote", "cal-m", "/m", target="m")
        log.record_calibration_event("promote", "cal-none", "/none", target=None)
        log.record_calibration_event("shadow", "cal-n", "/n", target="n")
        assert _version(log.active_calibration("m")) == "cal-m"
        assert _version(log.active_calibration(None)) == "cal-none"
        assert log.active_calibration("n") is None
        assert _version(log.candidate_calibration("n")) == "cal-n"
        assert log.candidate_calibration("m") is None
        assert [e.version for e in log.calibration_events()] == ["cal-m", "cal-none", "cal-n"]
        assert [e.version for e in log.calibration_events("n")] == ["cal-n"]


def test_an_explicit_rollback_to_a_version_puts_that_version_in_force(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        log.record_calibration_event("promote", "cal-a", "/a", target="m")
        log.record_calibration_event("promote", "cal-b", "/b", target="m", previous="cal-a")
        log.record_calibration_event("promote", "cal-c", "/c", target="m", previous="cal-b")
        log.record_calibration_event("rollback", "cal-a", "/a", target="m", previous="cal-c")
        assert _version(log.active_calibration("m")) == "cal-a"
        log.record_calibration_event("shadow", "cal-d", "/d", target="m")
        assert _version(log.candidate_calibration("m")) == "cal-d"
        back = log.rollback_calibration("m")  # below cal-a on the stack: cal-b was never rolled back
        assert (back.version, back.previous) == ("cal-b", "cal-a")


def test_bad_events_are_refused(log_location: str | Path) -> None:
    with DecisionLog(log_location) as log:
        with pytest.raises(ValueError, match=r"`event` must be one of \['shadow', 'promote', 'rollback'\]"):
            log.record_calibration_event("enforce", "cal-a", "/a", target=None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="`version` must be a non-empty string for a promote"):
            log.record_calibration_event("promote", "", "/a", target=None)
        assert log.calibration_events() == []


def test_events_read_back_as_recorded(log_location: str | Path) -> None:
    before = datetime.now(UTC)
    with DecisionLog(log_location) as log:
        recorded = log.record_calibration_event("promote", "cal-a", "/cal/a", target="m", previous=None)
        (read,) = log.calibration_events()
    assert read == recorded
    assert before <= read.at <= datetime.now(UTC)
