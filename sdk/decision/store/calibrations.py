"""Calibration events in the decision log, per target, one row each (table
``calibration_events``, in insertion order), as ``capgate calibrate``'s versions are put to use:

* ``shadow``: the version runs as a candidate beside the enforced one (its decisions are logged as
  shadow decisions ``beside`` the enforced ones).
* ``promote``: the version is enforced from now on (``previous``: the version it replaced).
* ``rollback``: enforcement returns to an earlier version (``version``: the one returned to, ``""``
  for none; ``previous``: the one rolled back).

The version in force (:meth:`CalibrationLog.active_calibration`) is the latest promote or
rollback; the candidate (:meth:`CalibrationLog.candidate_calibration`), the latest shadow newer
than it. :meth:`CalibrationLog.rollback_calibration` returns to the version promoted before.

Examples:
    >>> import os, tempfile
    >>> from capgate.decision import DecisionLog
    >>> log = DecisionLog(os.path.join(tempfile.mkdtemp(), "d.sqlite3"))
    >>> _ = log.record_calibration_event("promote", "cal-a", "/cal/a", target="m")
    >>> _ = log.record_calibration_event("shadow", "cal-b", "/cal/b", target="m")
    >>> log.active_calibration("m").version, log.candidate_calibration("m").version
    ('cal-a', 'cal-b')
    >>> _ = log.record_calibration_event("promote", "cal-b", "/cal/b", target="m", previous="cal-a")
    >>> log.rollback_calibration("m").version, log.active_calibration("m").version
    ('cal-a', 'cal-a')
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, TypeAlias, get_args

from capgate.decision.store.schema import writer_id
from capgate.errors import DataError

if TYPE_CHECKING:
    from capgate.decision.store._store import Store

__all__ = ["NO_CALIBRATION", "CalibrationEvent", "CalibrationEventKind", "CalibrationLog"]

CalibrationEventKind: TypeAlias = Literal["shadow", "promote", "rollback"]
"""What happened to a calibration version."""
NO_CALIBRATION = ""
"""The ``version`` (and ``path``) of a rollback that returns to no calibration at all."""

_COLUMNS = "at, event, target, version, path, previous, writer"
_INSERT = f"INSERT INTO calibration_events ({_COLUMNS}) VALUES (CAST(? AS {{time}}), ?, ?, ?, ?, ?, ?)"


@dataclass(frozen=True)
class CalibrationEvent:
    """One recorded calibration event.

    Attributes:
        at: When it was recorded (UTC).
        event: ``"shadow"``, ``"promote"`` or ``"rollback"``.
        target: The model the calibration is for (``None``: a gate without a target).
        version: The calibration version (for a rollback: the one returned to, ``""`` for none).
        path: Where its artefact directory is (``""`` for none).
        previous: For a promote or rollback: the version that was in force before.
        writer: ``host:pid`` of the process that recorded it.
    """

    at: datetime
    event: CalibrationEventKind
    target: str | None
    version: str
    path: str
    previous: str | None
    writer: str | None


def _event(row: tuple[object, ...]) -> CalibrationEvent:
    at, event, target, version, path, previous, writer = row
    when = at if isinstance(at, datetime) else datetime.fromisoformat(str(at))
    kind: CalibrationEventKind = (
        "shadow" if event == "shadow" else "promote" if event == "promote" else "rollback"
    )
    return CalibrationEvent(
        at=when.astimezone(UTC),
        event=kind,
        target=None if target is None else str(target),
        version=str(version),
        path=str(path),
        previous=None if previous is None else str(previous),
        writer=None if writer is None else str(writer),
    )


def _in_force(events: list[CalibrationEvent]) -> tuple[int, list[CalibrationEvent]]:
    """(index of the latest promote or rollback, or -1; the stack of versions in force, current last)."""
    last, stack = -1, []
    for i, e in enumerate(events):
        if e.event == "promote":
            last = i
            stack.append(e)
        elif e.event == "rollback":
            last = i
            if stack:
                stack.pop()
            if e.version == NO_CALIBRATION:
                stack.clear()
            elif not stack or stack[-1].version != e.version:
                stack.append(e)  # returned to a version not below on the stack: in force now
    return last, stack


class CalibrationLog:
    """The calibration-events part of :class:`~capgate.decision.DecisionLog` (a mixin)."""

    store: Store

    def record_calibration_event(
        self,
        event: CalibrationEventKind,
        version: str,
        path: str,
        *,
        target: str | None,
        previous: str | None = None,
    ) -> CalibrationEvent:
        """Record that a calibration version was shadowed, promoted or rolled back; returns the event.

        Args:
            event: ``"shadow"``, ``"promote"`` or ``"rollback"``.
            version: The calibration version (for ``rollback``: the one returned to, or
                :data:`NO_CALIBRATION` for none).
            path: Its artefact directory.
            target: The model it calibrates for (``None``: gates without a target).
            previous: The version in force before (promote, rollback).

        Raises:
            ValueError: An unknown event, or an empty version for a shadow or promote.
            LogUnavailableError: The store could not be written.
        """
        if event not in get_args(CalibrationEventKind):
            raise ValueError(f"`event` must be one of {list(get_args(CalibrationEventKind))}; got {event!r}")
        if not isinstance(version, str) or (event != "rollback" and not version):
            raise ValueError(f"`version` must be a non-empty string for a {event}; got {version!r}")
        recorded = CalibrationEvent(
            at=datetime.now(UTC),
            event=event,
            target=target,
            version=version,
            path=str(path),
            previous=previous,
            writer=writer_id(),
        )
        row = (recorded.at.isoformat(), event, target, version, recorded.path, previous, recorded.writer)
        self.store.write(self.store.dialect.render(_INSERT), row)
        return recorded

    def calibration_events(self, target: str | None = None) -> list[CalibrationEvent]:
        """The recorded calibration events, oldest first: all of them, or only ``target``'s."""
        if target is not None:
            return self._events_of(target)
        return [_event(r) for r in self.store.read(f"SELECT {_COLUMNS} FROM calibration_events ORDER BY seq")]

    def _events_of(self, target: str | None) -> list[CalibrationEvent]:
        """``target``'s events, oldest first (``None``: the events without a target)."""
        sql = (
            f"SELECT {_COLUMNS} FROM calibration_events WHERE target {self.store.dialect.same} ? ORDER BY seq"
        )
        return [_event(r) for r in self.store.read(sql, (target,))]

    def active_calibration(self, target: str | None) -> CalibrationEvent | None:
        """The latest promote or rollback for ``target`` (``None``: events without a target), whose
        ``version`` is enforced; ``None`` if none, or it returned to no calibration."""
        events = self._events_of(target)
        last, _ = _in_force(events)
        if last < 0 or events[last].version == NO_CALIBRATION:
            return None
        return events[last]

    def candidate_calibration(self, target: str | None) -> CalibrationEvent | None:
        """The latest ``shadow`` event for ``target`` newer than the promote or rollback in force,
        of a version other than the enforced one; ``None`` if there is none."""
        events = self._events_of(target)
        last, _ = _in_force(events)
        enforced = events[last].version if last >= 0 else NO_CALIBRATION
        for e in reversed(events[last + 1 :]):
            if e.event == "shadow" and e.version != enforced:
                return e
        return None

    def rollback_calibration(self, target: str | None) -> CalibrationEvent:
        """Return ``target``'s enforcement to the version promoted before the one in force (or to
        no calibration), and record it as a ``rollback`` event; returns that event.

        Raises:
            DataError: No calibration is in force for ``target``: nothing to roll back.
        """
        events = self._events_of(target)
        last, stack = _in_force(events)
        if last < 0 or events[last].version == NO_CALIBRATION or not stack:
            raise DataError(
                f"no calibration is in force for target {target!r}: nothing to roll back",
                path=self.store.location,
                field="calibration_events",
            )
        current = stack.pop()
        back = stack[-1] if stack else None
        return self.record_calibration_event(
            "rollback",
            NO_CALIBRATION if back is None else back.version,
            NO_CALIBRATION if back is None else back.path,
            target=target,
            previous=current.version,
        )
