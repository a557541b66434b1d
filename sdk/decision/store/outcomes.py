"""Outcomes attached to logged decisions: one at a time (:meth:`DecisionLog.record_outcome`) or in
bulk from a JSONL file (:func:`import_outcomes`, ``capgate log outcome --file FILE``).

An outcome is keyed by its decision and ``source`` (who judged: ``"user"``, ``"grader"``,
``"test"``, ``"tool"``, or your own label), so a user's thumbs and a grader's verdict sit side by
side. The same judgement again is a no-op (the first record is kept); a different one from the
same source is an :class:`OutcomeConflictError` unless ``replace=True``; an unknown id is a
:class:`~capgate.DataError` naming it. A bulk file has one JSON object a line: ``decision_id`` and
the :class:`~capgate.Outcome` fields. Every bad line is reported (``file:line: field 'x': what``)
and, unless told to skip them, nothing of a file with a bad line is imported.

Examples:
    >>> import json, os, tempfile
    >>> from capgate import Estimate
    >>> from capgate.decision import Decision, DecisionLog
    >>> folder = tempfile.mkdtemp()
    >>> log = DecisionLog(os.path.join(folder, "d.sqlite3"))
    >>> d = Decision(action="answer", estimate=Estimate(p=0.9, method="probe"), reason="p >= 0.8")
    >>> _ = log.record(d)
    >>> path = os.path.join(folder, "outcomes.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write(json.dumps({"decision_id": d.id, "correct": True, "source": "user"}) + "\\n")
    ...     _ = f.write(json.dumps({"decision_id": d.id, "score": 0.8, "source": "grader"}) + "\\n")
    >>> import_outcomes(log, path).imported
    2
    >>> sorted(o.source for o in log.get(d.id).outcomes)
    ['grader', 'user']
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from capgate.core.types import Outcome
from capgate.decision.store._store import Store, read_in
from capgate.decision.store.schema import INSERT_OUTCOME, OUTCOME_COLUMNS, REPLACE_OUTCOME, UPDATE_Y
from capgate.errors import DataError

__all__ = ["ImportSummary", "OutcomeConflictError", "OutcomeImportError", "import_outcomes"]


class DecisionLog(Protocol):
    """What outcomes need of a :class:`~capgate.decision.DecisionLog`: its store and location."""

    store: Store

    @property
    def location(self) -> str:
        """Where the log is, for messages."""


class OutcomeConflictError(DataError):
    """A decision already has a different outcome from the same source (pass ``replace=True``)."""


class OutcomeImportError(DataError):
    """A bulk file has bad lines; ``errors`` holds one :class:`~capgate.DataError` per line."""

    def __init__(self, path: str | Path, errors: Sequence[DataError]) -> None:
        self.errors = list(errors)
        lines = "\n".join(str(e) for e in self.errors)
        super().__init__(
            f"{len(self.errors)} bad line(s); nothing imported (skip them with --skip-bad / skip_bad=True):"
            f"\n{lines}",
            path=path,
        )


@dataclass(frozen=True)
class ImportSummary:
    """What a bulk import did.

    Attributes:
        imported: Outcomes written (new, or replacing with ``replace=True``).
        unchanged: Outcomes already in the log with the same judgement (left as they were).
        skipped: Bad lines left out (only with ``skip_bad=True``).
        errors: The bad lines' errors (``file:line: field: what``).
    """

    imported: int
    unchanged: int
    skipped: int
    errors: list[DataError] = field(default_factory=list)


def params(outcome: Outcome) -> tuple[Any, ...]:
    """The parameters of :data:`~capgate.decision.store.schema.INSERT_OUTCOME` for ``outcome``."""
    return (
        outcome.source,
        None if outcome.correct is None else int(outcome.correct),
        outcome.mu_hat,
        outcome.k,
        outcome.score,
        outcome.note,
        outcome.samples_used,
        outcome.latency_s,
        outcome.recorded_at.isoformat(),
        outcome.decision_id,
    )


def outcome_of_row(row: Sequence[Any]) -> Outcome:
    """An :class:`Outcome` from a row of :data:`~capgate.decision.store.schema.OUTCOME_COLUMNS`."""
    recorded = row[9]
    return Outcome(
        decision_id=row[0],
        source=row[1],
        correct=None if row[2] is None else bool(row[2]),
        mu_hat=row[3],
        k=row[4],
        score=row[5],
        note=row[6],
        samples_used=row[7],
        latency_s=row[8],
        recorded_at=recorded if isinstance(recorded, datetime) else datetime.fromisoformat(recorded),
    )


def same_judgement(a: Outcome, b: Outcome) -> bool:
    """Whether two outcomes say the same about the answer (``correct``, ``mu_hat``, ``k``, ``score``)."""
    return (a.correct, a.mu_hat, a.k, a.score) == (b.correct, b.mu_hat, b.k, b.score)


def _describe(o: Outcome) -> str:
    said = {"correct": o.correct, "mu_hat": o.mu_hat, "k": o.k, "score": o.score}
    return ", ".join(f"{k}={v}" for k, v in said.items() if v is not None)


def conflict(existing: Outcome, new: Outcome, location: str) -> OutcomeConflictError:
    """The error for a second, different outcome from the same source."""
    return OutcomeConflictError(
        f"decision {new.decision_id!r} already has an outcome from source {new.source!r} "
        f"({_describe(existing)}, recorded {existing.recorded_at.isoformat()}); this one says "
        f"{_describe(new)}: pass replace=True (--replace) to replace it",
        path=location,
        field="source",
    )


def unknown(decision_id: str, location: str, *, line: int | None = None) -> DataError:
    """The error for an outcome whose decision the log does not hold."""
    return DataError(
        f"no decision with id {decision_id!r} in the log", path=location, line=line, field="decision_id"
    )


def check_says_something(outcome: Outcome, location: str, line: int | None = None) -> None:
    """A :class:`DataError` unless the outcome gives ``correct``, ``mu_hat`` or ``score``."""
    if outcome.value is None:
        raise DataError(
            "an outcome needs `correct`, `mu_hat` or `score`", path=location, line=line, field="correct"
        )


def check_aware(outcome: Outcome, location: str, line: int | None = None) -> None:
    """A :class:`DataError` if ``recorded_at`` has no time zone (it could not be ordered against the
    decision's other outcomes)."""
    if outcome.recorded_at.utcoffset() is None:
        raise DataError(
            f"must carry a time zone (2026-01-05T10:00:00+00:00); got {outcome.recorded_at.isoformat()}",
            path=location,
            line=line,
            field="recorded_at",
        )


def _write(store: Store, outcomes: Sequence[Outcome], *, replace: bool) -> int:
    """Write outcomes and refresh their decisions' ``outcome_y``, in one transaction; the outcomes
    written."""
    sql = store.dialect.render(REPLACE_OUTCOME if replace else INSERT_OUTCOME)
    touched = [(decision_id,) for decision_id in dict.fromkeys(o.decision_id for o in outcomes)]
    counts = store.write_all(
        [(sql, [params(o) for o in outcomes]), (store.dialect.render(UPDATE_Y), touched)]
    )
    return counts[0]


def attach(log: DecisionLog, outcome: Outcome, *, replace: bool) -> Outcome:
    """Write one outcome (see :meth:`DecisionLog.record_outcome`); returns the stored one."""
    check_says_something(outcome, log.location)
    check_aware(outcome, log.location)
    if _write(log.store, [outcome], replace=replace):
        return outcome
    existing = stored(log, [outcome.decision_id]).get((outcome.decision_id, outcome.source))
    if existing is None:  # nothing written and nothing there: the decision is not in the log
        raise unknown(outcome.decision_id, log.location)
    if same_judgement(existing, outcome):
        return existing
    raise conflict(existing, outcome, log.location)


def stored(log: DecisionLog, ids: Sequence[str]) -> dict[tuple[str, str], Outcome]:
    """The outcomes the log holds for these decisions, by (decision id, source)."""
    sql = f"SELECT {OUTCOME_COLUMNS} FROM outcomes o WHERE o.decision_id IN ({{ids}})"
    found = [outcome_of_row(row) for row in read_in(log.store, sql, ids)]
    return {(o.decision_id, o.source): o for o in found}


def _parse(path: Path, errors: list[DataError]) -> list[tuple[int, Outcome]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read the outcomes file: {exc}", path=path) from exc
    parsed: list[tuple[int, Outcome]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(DataError(f"not JSON: {exc.msg} (column {exc.colno})", path=path, line=number))
            continue
        if not isinstance(record, dict):
            errors.append(
                DataError(f"expected a JSON object; got {type(record).__name__}", path=path, line=number)
            )
            continue
        try:
            outcome = Outcome.model_validate(record)
            check_says_something(outcome, str(path), number)
            check_aware(outcome, str(path), number)
        except ValidationError as exc:
            for problem in exc.errors():
                where = ".".join(str(part) for part in problem["loc"]) or None
                what = problem["msg"] if problem["type"] != "extra_forbidden" else "not an outcome field"
                errors.append(DataError(what, path=path, line=number, field=where))
            continue
        except DataError as exc:
            errors.append(exc)
            continue
        parsed.append((number, outcome))
    return parsed


def import_outcomes(
    log: DecisionLog, path: str | Path, *, skip_bad: bool = False, replace: bool = False
) -> ImportSummary:
    """Attach the outcomes of a JSONL file (see the module docstring). Every line is checked
    first (JSON, fields, its decision in the log, no contradiction of an outcome from the same
    source, in the log or earlier in the file, unless ``replace``); the good lines are then
    written in one transaction.

    Args:
        log: The decision log.
        path: The JSONL file.
        skip_bad: Import the good lines of a file that has bad ones (they are counted in
            ``skipped`` and listed in ``errors``).
        replace: A line replaces the outcome from the same source already recorded.

    Raises:
        OutcomeImportError: A bad line and not ``skip_bad``; it lists every bad line (file:line,
            field, what) and nothing was imported.
        DataError: The file cannot be read.
        LogUnavailableError: The store could not be written.
    """
    path = Path(path)
    errors: list[DataError] = []
    parsed = _parse(path, errors)
    ids = [o.decision_id for _, o in parsed]
    known = {r[0] for r in read_in(log.store, "SELECT id FROM decisions WHERE id IN ({ids})", ids)}
    existing = stored(log, ids)
    writes: dict[tuple[str, str], Outcome] = {}
    unchanged = 0
    for number, outcome in parsed:
        key = (outcome.decision_id, outcome.source)
        if outcome.decision_id not in known:
            errors.append(unknown(outcome.decision_id, str(path), line=number))
            continue
        earlier = writes.get(key)
        if earlier is not None:
            if not same_judgement(earlier, outcome):
                clash = f"contradicts an earlier line's outcome from source {outcome.source!r}"
                errors.append(DataError(clash, path=path, line=number, field="source"))
            continue
        before = existing.get(key)
        if before is not None and same_judgement(before, outcome):
            unchanged += 1
            continue
        if before is not None and not replace:
            message = conflict(before, outcome, str(path)).message
            errors.append(DataError(message, path=path, line=number, field="source"))
            continue
        writes[key] = outcome
    errors.sort(key=lambda e: e.line or 0)
    if errors and not skip_bad:
        raise OutcomeImportError(path, errors)
    if writes:
        _write(log.store, list(writes.values()), replace=replace)
    bad_lines = len({e.line for e in errors})
    return ImportSummary(imported=len(writes), unchanged=unchanged, skipped=bad_lines, errors=errors)
