"""Fuzzed inputs (hypothesis): every kind of input capgate reads ends in a valid result, capgate's
own error type with a located message, or a degraded estimate with its reason -- never another
exception, a hang or a silent default. The cases live in tests/_fuzz.py (bench/fuzz_bench.py runs
more of them and counts them for bench/RELIABILITY.md); examples are bounded so the whole file
stays well under a minute."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _fuzz
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capgate import Estimate, Gate
from capgate.core.backend import Prompt
from capgate.estimators import CapabilityEstimator
from capgate.estimators._linear_probe import META_FILE, LinearProbe

BOUNDED = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


@pytest.fixture(scope="module")
def probe_folder() -> Iterator[tuple[Path, dict[str, Any]]]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    probe = LinearProbe(lr=1e-2, validation_fraction=None, max_epochs=3).fit(X, rng.uniform(size=40))
    with tempfile.TemporaryDirectory() as tmp:
        probe.save(tmp)
        yield Path(tmp), _fuzz.json.loads((Path(tmp) / META_FILE).read_text())


class Fixed(CapabilityEstimator):
    method = "fixed"

    def estimate(self, queries: Sequence[Prompt]) -> list[Estimate]:
        return [Estimate(p=0.9, method=self.method) for _ in queries]


@BOUNDED
@given(text=_fuzz.POLICY_TEXTS)
def test_policy_files(text: str, folder: Path) -> None:
    assert _fuzz.check_policy_yaml(text, folder) in ("accepted", "error")


@BOUNDED
@given(lines=_fuzz.jsonl_lines(_fuzz._GOOD_LABEL))
def test_label_files(lines: list[str], folder: Path) -> None:
    assert _fuzz.check_labels_jsonl(lines, folder) in ("accepted", "error")


@BOUNDED
@given(lines=_fuzz.jsonl_lines(_fuzz._GOOD_ITEM))
def test_dataset_files(lines: list[str], folder: Path) -> None:
    assert _fuzz.check_dataset_jsonl(lines, folder) in ("accepted", "error")


@BOUNDED
@given(value=_fuzz.MESSAGE_LISTS)
def test_chat_messages(value: Any) -> None:
    gate = Gate(policy="balanced", estimator=Fixed())
    assert _fuzz.check_chat_messages(value, gate.assess) in ("accepted", "error")


@BOUNDED
@given(data=st.data())
def test_probe_metadata(data: st.DataObject, probe_folder: tuple[Path, dict[str, Any]]) -> None:
    where, valid = probe_folder
    text = data.draw(_fuzz.probe_metadata(valid))
    try:
        assert _fuzz.check_probe_metadata(text, where) in ("accepted", "error")
    finally:
        (where / META_FILE).write_text(_fuzz._json_text(valid))


@BOUNDED
@given(text=_fuzz.REPLIES, structured=st.booleans())
def test_verbalized_replies(text: str, structured: bool) -> None:
    assert _fuzz.check_verbalized_reply(text, structured) in ("accepted", "degraded")


def test_the_valid_cases_are_accepted(folder: Path, probe_folder: tuple[Path, dict[str, Any]]) -> None:
    """The checks can tell good input from bad (so an 'error' outcome is not the only one possible)."""
    assert _fuzz.check_policy_yaml(_fuzz._PRESET, folder) == "accepted"
    assert _fuzz.check_labels_jsonl(['{"id": "a", "k": 4, "correct": 1, "conf": 0.5}'], folder) == "accepted"
    good = '{"id": "a", "question": "2+2?", "references": ["4"], "kind": "numeric"}'
    assert _fuzz.check_dataset_jsonl([good], folder) == "accepted"
    assert _fuzz.check_chat_messages([{"role": "human", "content": "hi"}], lambda q: None) == "accepted"
    where, valid = probe_folder
    assert _fuzz.check_probe_metadata(_fuzz._json_text(valid), where) == "accepted"
    assert _fuzz.check_verbalized_reply("\\boxed{0.7}", False) == "accepted"
    assert _fuzz.check_verbalized_reply("no idea", False) == "degraded"


@pytest.mark.parametrize("value", ["1" + "0" * 400, "1e999", "-0.5", "true", '"0.5"'])
def test_structured_replies_out_of_range_are_degraded(value: str) -> None:
    """Found by bench/fuzz_bench.py: a huge integer once overflowed math.isfinite."""
    assert _fuzz.check_verbalized_reply('{"probability": ' + value + "}", True) == "degraded"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("\x1f", "special characters are not allowed"),  # found by the fuzzer: a bare yaml ReaderError
        ("name: x\nbands: 0.5\non_degraded: abstain\nwhen: 2026-13-45\n", "not a valid date"),
        ("[" * 5000, "RecursionError"),
        # found by bench/fuzz_bench.py: a bare OverflowError from float() of a huge integer
        ("name: x\nbands: 1" + "0" * 400 + "\non_degraded: abstain\n", "bare threshold"),
    ],
)
def test_policy_text_yaml_cannot_read_is_a_policy_error(text: str, message: str, folder: Path) -> None:
    from capgate.policies import Policy
    from capgate.policies._yaml import PolicyError, parse_policy

    with pytest.raises(PolicyError, match=message) as info:
        parse_policy(text, model=Policy, source=str(folder / "p.yaml"))
    assert info.value.path == str(folder / "p.yaml")
