"""Decision ids: random version-4 UUIDs made without giving up the GIL, distinct across a fork."""

from __future__ import annotations

import os
import uuid

import pytest

from capgate.core.types import Decision, Estimate, _new_id


def test_ids_are_version_4_uuids_and_distinct() -> None:
    ids = [_new_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for made in ids[:100]:
        parsed = uuid.UUID(hex=made)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert parsed.hex == made
    decision = Decision(action="answer", estimate=Estimate.unavailable("x", "y"), reason="r")
    assert uuid.UUID(hex=decision.id).version == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(_new_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    parent = {_new_id() for _ in range(5)}
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    assert len(child) == 5
    assert not parent & child


def test_ids_do_not_call_os_urandom(monkeypatch: pytest.MonkeyPatch) -> None:
    # os.urandom gives up the GIL: on a loop beside busy threads each id then waits for it back
    def no_urandom(n: int) -> bytes:
        raise AssertionError("os.urandom called")

    monkeypatch.setattr(os, "urandom", no_urandom)
    assert _new_id() != _new_id()
