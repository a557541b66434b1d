"""Decisions a gate could not write to its log yet, kept on local disk and written later.

When the log cannot take a decision (PostgreSQL down or past ``timeout_s``, SQLite locked beyond
``busy_timeout_s``) or its write queue is full, the gate appends it to the log's spill file (a JSON
line each, the query as its SHA-256 unless the log stores text), and writes the file back once
the log takes writes again (:meth:`SpillFile.replay`, after the gate's next successful write, or
``capgate log replay-spill``). The log keeps the first record of a decision id, so a replay cut
short by a crash reruns without duplicates.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from capgate._util.jsonl import atomic_write_lines
from capgate.core.backend import Prompt, as_messages
from capgate.core.messages import query_hash
from capgate.core.types import Decision
from capgate.errors import DataError

_logger = logging.getLogger("capgate")


@dataclass(frozen=True)
class SpilledDecision:
    """One decision kept in a spill file: what :meth:`DecisionLog.record` is given, and why it
    was spilled."""

    decision: Decision
    query_sha256: str | None
    query_text: str | None
    samples_used: int | None
    why: str


def query_fields(query: Prompt | None, store_text: bool) -> tuple[str | None, str | None]:
    """A query as a log keeps it: (its SHA-256, its text only if ``store_text``)."""
    text = None
    if query is not None and store_text:
        text = query if isinstance(query, str) else json.dumps(as_messages(query), ensure_ascii=False)
    return (None if query is None else query_hash(query)), text


class SpillTarget(Protocol):
    """Where spilled decisions are written back (a :class:`~capgate.decision.DecisionLog`)."""

    def record_spilled(self, spilled: SpilledDecision) -> str:
        """Record one kept decision; returns its id."""
        ...


class SpillFile:
    """A JSON-lines file of decisions waiting for their log (see the module docstring).

    Args:
        path: The file (created, with its folder, on the first spilled decision).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # appends, and moving the file aside
        self._replaying = threading.Lock()  # one replay at a time

    @property
    def replaying_path(self) -> Path:
        """Where a replay moves the file while it writes it back (new spills go to :attr:`path`)."""
        return self.path.with_name(self.path.name + ".replaying")

    def append(
        self,
        decision: Decision,
        *,
        query: Prompt | None,
        samples_used: int | None,
        store_text: bool,
        why: str,
    ) -> None:
        """Keep ``decision`` until its log takes it (``why``: what kept it out, in words)."""
        line = _line(SpilledDecision(decision, *query_fields(query, store_text), samples_used, why))
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # private, as the log beside it: it holds what the agent was asked and decided
            with os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600), "a+b") as out:
                size, torn = out.seek(0, os.SEEK_END), False
                if size:  # after an append cut short by a crash, the next starts on a line of its own
                    out.seek(size - 1)
                    torn = out.read(1) != b"\n"
                out.write(b"\n" * torn + line.encode() + b"\n")

    def pending(self) -> bool:
        """Whether any decision waits here (a cheap check: the files' sizes)."""
        return any(p.is_file() and p.stat().st_size > 0 for p in (self.path, self.replaying_path))

    def read(self, path: Path | None = None) -> list[SpilledDecision]:
        """The decisions kept in ``path`` (default :attr:`path`), in order; a line cut short by a
        crash mid-append (not JSON) is skipped with a warning naming file and line.

        Raises:
            DataError: A JSON line that is not a spilled decision (the message names file and line).
        """
        path = path or self.path
        if not path.is_file():
            return []
        kept: list[SpilledDecision] = []
        for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:  # JSON or UTF-8 cut off: an append that did not finish
                _logger.warning("%s:%d: skipped a spilled decision cut short mid-write", path, number)
                continue
            try:
                kept.append(
                    SpilledDecision(
                        decision=Decision.model_validate(record["decision"]),
                        query_sha256=record.get("query_sha256"),
                        query_text=record.get("query_text"),
                        samples_used=record.get("samples_used"),
                        why=str(record.get("why", "")),
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{path}:{number}: not a spilled decision ({exc})") from exc
        return kept

    def replay(self, log: SpillTarget, *, limit: int | None = None) -> int:
        """Write the kept decisions (at most ``limit``) into ``log`` and keep the rest; returns how
        many were written. The file is first moved aside (:attr:`replaying_path`): decisions
        spilled meanwhile wait for the next replay. Safe to rerun after a crash or failed write.

        Raises:
            LogUnavailableError: The log failed again; the decisions not written stay kept.
        """
        with self._replaying:
            with self._lock:
                if not self.replaying_path.exists():
                    if not self.path.is_file():
                        return 0
                    os.replace(self.path, self.replaying_path)
            kept = self.read(self.replaying_path)
            now, rest = (kept, []) if limit is None else (kept[:limit], kept[limit:])
            for item in now:
                log.record_spilled(item)
            if rest:  # the rest rewritten whole before the old file goes: a crash keeps one or the other
                atomic_write_lines(self.replaying_path, (_line(item) for item in rest))
            else:
                self.replaying_path.unlink()
            return len(now)


def _line(item: SpilledDecision) -> str:
    fields = {name: getattr(item, name) for name in ("query_sha256", "query_text", "samples_used", "why")}
    return json.dumps({"decision": json.loads(item.decision.model_dump_json()), **fields}, ensure_ascii=False)


def default_spill_path(location: str | Path) -> Path:
    """Where a log's decisions wait when it cannot take them: beside a SQLite file
    (``<file>.spill.jsonl``); for a database URL, in the user's state folder
    (``$XDG_STATE_HOME/capgate/spill/``, default ``~/.local/state``), named by the URL's hash."""
    if isinstance(location, Path):
        return location.with_name(location.name + ".spill.jsonl")
    import hashlib

    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "capgate" / "spill" / f"{hashlib.sha256(location.encode()).hexdigest()[:16]}.jsonl"
