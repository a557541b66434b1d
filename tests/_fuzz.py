"""Fuzzed inputs of every kind capgate reads, and the one check each must pass.

Shared by tests/test_fuzz_inputs.py (bounded examples, in the suite) and bench/fuzz_bench.py
(more examples, counted by kind and outcome for bench/RELIABILITY.md). Each ``check_*`` runs one
case and returns its outcome: ``"accepted"`` (valid input, a sane result), ``"error"`` (capgate's
own error type with a located message) or ``"degraded"`` (an estimate with no value and a reason).
Anything else -- another exception, an error that does not say where, a value out of range, a
silent default -- fails the check with an ``AssertionError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from capgate import DataError, Estimate, Generation, MessageError, SamplingParams
from capgate.core.backend import Prompt
from capgate.core.messages import as_query
from capgate.datasets import read_dataset
from capgate.estimators import VerbalizedConfidence
from capgate.estimators._linear_probe import META_FILE, LinearProbe
from capgate.labels.labelled import read_labelled
from capgate.policies import Policy
from capgate.policies._yaml import PolicyError

KINDS = (
    "policy_yaml",
    "labels_jsonl",
    "dataset_jsonl",
    "chat_messages",
    "probe_metadata",
    "verbalized_reply",
)


def require(condition: object, what: object) -> None:
    """Fail the case (an ``AssertionError`` naming ``what``) unless ``condition`` holds."""
    if not condition:
        raise AssertionError(what)


# ---------------------------------------------------------------------------------------- values

_WORDS = st.sampled_from(
    [
        "name", "version", "bands", "below", "above", "action", "answer", "abstain", "clarify", "escalate",
        "resample", "on_degraded", "steps", "tools", "message", "question", "to", "budget", "stop", "id",
        "k", "correct", "samples", "references", "kind", "choices", "metadata", "conf", "example_id",
        "num_samples", "num_correct", "expected_accuracy", "format", "dim", "settings", "lr", "target",
        "feature_spec", "weights_sha256", "format_version", "../../etc/passwd", "", "é", "\u202e", "\x00",
    ]
)  # fmt: skip
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.just(10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | _WORDS
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(_WORDS | st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=25,
)
_HUGE = st.integers(0, 200_000).map(lambda n: "é" * n)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=True)


# ---------------------------------------------------------------------------------------- policies

_PRESET = (Path(__file__).resolve().parents[1] / "policies" / "balanced.yaml").read_text(encoding="utf-8")
_TAGS = st.sampled_from(
    [
        "!!python/object/apply:os.system ['true']",
        "!include ../outside.yaml",
        "!!binary AAAA",
        "*anchor",
        "&a [1]",
    ]
)


@st.composite
def _mutated_preset(draw: st.DrawFn) -> str:
    lines = _PRESET.splitlines()
    at = draw(st.integers(0, len(lines) - 1))
    new = draw(st.text(max_size=30) | _TAGS | _WORDS.map(lambda w: f"{w}: {w}"))
    how = draw(st.sampled_from(["replace", "insert", "delete"]))
    if how == "replace":
        lines[at] = new
    elif how == "insert":
        lines.insert(at, new)
    else:
        del lines[at]
    return "\n".join(lines)


POLICY_TEXTS: st.SearchStrategy[str] = (
    JSON_VALUES.map(lambda v: yaml.safe_dump(v, allow_unicode=True))
    | st.dictionaries(_WORDS, JSON_VALUES, max_size=6).map(lambda v: yaml.safe_dump(v, allow_unicode=True))
    | _mutated_preset()
    | st.text(max_size=200)
    | _TAGS.map(lambda tag: f"name: x\nbands: {tag}\non_degraded: abstain\n")
)


def check_policy_yaml(text: str, folder: Path) -> str:
    """A policy file's text: a valid :class:`Policy`, or a :class:`PolicyError` naming the file."""
    path = folder / "policy.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        policy = Policy.from_yaml(path)
    except PolicyError as exc:
        require(exc.path == str(path), exc)
        require(exc.errors, exc)
        require(all(e.path == str(path) for e in exc.errors), exc)
        require(all(e.line is not None or e.field is not None for e in exc.errors), exc)
        return "error"
    assert isinstance(policy, Policy)
    policy.decide(Estimate.unavailable("fuzz", "no estimate"))  # the fail-safe is always there
    return "accepted"


# ---------------------------------------------------------------------------------------- JSONL files

_LABEL_KEYS = st.sampled_from(
    ["id", "k", "correct", "conf", "question", "references", "samples", "example_id", "num_samples",
     "num_correct", "expected_accuracy"]
)  # fmt: skip
_LINE_OBJECTS = st.dictionaries(_LABEL_KEYS | _WORDS, JSON_VALUES | st.integers(-3, 50), max_size=7)
_GOOD_LABEL = st.builds(
    lambda i, k, c, p: {"id": f"q{i}", "k": k, "correct": min(c, k), "conf": p},
    st.integers(0, 5),
    st.integers(1, 40),
    st.integers(0, 40),
    st.floats(0, 1),
)
_GOOD_ITEM = st.builds(
    lambda i, q, r: {"id": f"q{i}", "question": q, "references": r, "kind": "alias"},
    st.integers(0, 5),
    st.text(min_size=1, max_size=30),
    st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3),
)
_RAW_LINES = st.text(max_size=60) | st.sampled_from(
    ["", "{", "[]", "null", "\ufeff{}", '{"id": "a"} trailing']
)


def jsonl_lines(good: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[list[str]]:
    """Lists of JSONL lines: mostly plausible records, some broken objects and raw garbage."""
    line = good.map(_json_text) | _LINE_OBJECTS.map(_json_text) | _RAW_LINES
    return st.lists(line, max_size=6)


def _located(exc: DataError, path: Path) -> None:
    require(exc.path == str(path), exc)
    n_lines = path.read_bytes().count(b"\n") + 1
    require(exc.line is None or 1 <= exc.line <= n_lines, exc)


def _write_lines(folder: Path, name: str, lines: Sequence[str]) -> Path:
    path = folder / name
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    return path


def check_labels_jsonl(lines: list[str], folder: Path) -> str:
    """A label file: read with its confidence column, or a :class:`DataError` naming file and line."""
    path = _write_lines(folder, "labels.jsonl", lines)
    try:
        labels = read_labelled(path, confidence=["conf"])
    except DataError as exc:
        _located(exc, path)
        return "error"
    mu = labels.mu_hat
    assert len(mu) > 0
    assert all(0.0 <= float(m) <= 1.0 for m in mu)
    return "accepted"


def check_dataset_jsonl(lines: list[str], folder: Path) -> str:
    """A dataset file: its items, or a :class:`DataError` naming file and line."""
    path = _write_lines(folder, "data.jsonl", lines)
    try:
        items = read_dataset(path)
    except DataError as exc:
        _located(exc, path)
        return "error"
    assert all(item.question and item.references for item in items)
    return "accepted"


# ---------------------------------------------------------------------------------------- chat messages

_ROLE = st.sampled_from(["user", "human", "assistant", "ai", "system", "developer", "tool"]) | st.text(
    max_size=8
)
_PART = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}) | JSON_VALUES
_CONTENT = st.text(max_size=80) | _HUGE | st.none() | st.lists(_PART, max_size=4) | JSON_VALUES
_MESSAGE = (
    st.fixed_dictionaries({"role": _ROLE, "content": _CONTENT})
    | st.fixed_dictionaries({"type": _ROLE, "content": _CONTENT})
    | JSON_VALUES
)
MESSAGE_LISTS: st.SearchStrategy[Any] = (
    st.lists(_MESSAGE, max_size=6)
    | st.text(max_size=40)
    | JSON_VALUES
    | st.lists(st.lists(_MESSAGE, max_size=2))
)


def check_chat_messages(value: Any, run: Callable[[Prompt], object]) -> str:
    """Chat messages: normalized and passed to ``run`` (a gate), or a :class:`MessageError` naming where."""
    try:
        query = as_query(value)
    except MessageError as exc:
        require(str(exc).startswith("query"), exc)
        return "error"
    assert isinstance(query, str) or all(m["role"] in ("user", "assistant", "system", "tool") for m in query)
    assert isinstance(query, str) or all(isinstance(m["content"], str) for m in query)
    run(query)
    return "accepted"


# ---------------------------------------------------------------------------------------- probe metadata


@st.composite
def probe_metadata(draw: st.DrawFn, valid: dict[str, Any]) -> str:
    """A probe.json: the valid one with fields replaced, dropped or added, or something else."""
    how = draw(st.sampled_from(["replace", "drop", "add", "whole", "text"]))
    meta = dict(valid)
    if how == "replace":
        meta[draw(st.sampled_from(sorted(meta)))] = draw(JSON_VALUES)
    elif how == "drop":
        del meta[draw(st.sampled_from(sorted(meta)))]
    elif how == "add":
        meta[draw(st.text(max_size=10))] = draw(JSON_VALUES)
    elif how == "whole":
        return _json_text(draw(JSON_VALUES))
    else:
        return draw(st.text(max_size=80))
    return _json_text(meta)


def check_probe_metadata(text: str, folder: Path) -> str:
    """A probe folder with this probe.json: loads and predicts in [0, 1], or a located :class:`DataError`."""
    (folder / META_FILE).write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        probe = LinearProbe.load(folder)
    except DataError as exc:
        require(exc.path is not None and Path(exc.path).parent == folder, exc)
        return "error"
    dim = probe.coef_.shape[0]
    p = probe.predict([[0.5] * dim])
    assert all(0.0 <= float(x) <= 1.0 for x in p)
    return "accepted"


# ---------------------------------------------------------------------------------------- verbalized replies

_BOX = st.builds(lambda s: f"\\boxed{{{s}}}", st.text(max_size=12) | st.floats().map(str) | _WORDS)
REPLIES: st.SearchStrategy[str] = (
    st.text(max_size=120)
    | _BOX
    | st.lists(_BOX | st.text(max_size=10), max_size=4).map(" ".join)
    | JSON_VALUES.map(_json_text)
    | st.builds(lambda v: _json_text({"probability": v}), JSON_VALUES)
    | st.sampled_from(
        ["<think>\\boxed{0.9}", "\\boxed{{0.5}", "\\boxed{50%}", "\\boxed{1e309}", "\\boxed{0.3-0.1}"]
    )
)


class ReplyBackend:
    """A backend whose every completion is one fixed text."""

    model_id = "fuzz"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        return [[Generation(text=self.text, n_tokens=1)] for _ in prompts]


def check_verbalized_reply(text: str, structured: bool) -> str:
    """A model's verbalized reply: a p in [0, 1], or a degraded estimate saying why."""
    est = VerbalizedConfidence(ReplyBackend(text), max_tries=1, structured=structured).estimate_one("q?")
    if est.p is None:
        require(est.degraded and est.reason, est)
        return "degraded"
    require(math.isfinite(est.p) and 0.0 <= est.p <= 1.0, est)
    return "accepted"
