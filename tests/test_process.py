"""capgate.tune_process: a long-lived process keeps its loaded objects out of later collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import capgate


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_tuning_freezes_what_is_loaded_and_full_collections_get_cheaper() -> None:
    held = [[i] for i in range(300_000)]  # a loaded model's worth of tracked objects
    tuning = capgate.tune_process()
    assert tuning.objects_frozen >= len(held)
    assert gc.get_freeze_count() >= len(held)
    assert tuning.full_collection_s_after < tuning.full_collection_s_before
    after: list[list[int]] = [[0]]  # objects made later are still collected as usual
    assert gc.is_tracked(after)
    assert len(held) == 300_000
