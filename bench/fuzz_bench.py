"""Fuzzed inputs, counted: how many bad inputs of each kind were tried and what became of them.

Runs the cases of ``tests/_fuzz.py`` (the same strategies and checks as the hypothesis tests in
``tests/test_fuzz_inputs.py``, with more examples): policy YAML files, label and dataset JSONL
files, chat message lists, probe metadata JSON and verbalized replies. Each case ends *accepted*
(valid input, a sane result), *error* (capgate's own error type, located: file, line, field) or
*degraded* (an estimate with no value and its reason); anything else is *unexpected* and printed.
Prints a table, rewrites the fuzz section of bench/RELIABILITY.md and ends with
``fuzz: N cases, U unexpected``.

Run: ``python bench/fuzz_bench.py [--examples N] [--seed S] [--no-report]``. ``--smoke``: 5 cases per
kind, the section written into a RELIABILITY.md in a temporary folder (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import _fuzz  # noqa: E402
import numpy as np  # noqa: E402
from _report import machine, update_section  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from capgate import Estimate, Gate  # noqa: E402
from capgate.estimators import CapabilityEstimator  # noqa: E402
from capgate.estimators._linear_probe import META_FILE, LinearProbe  # noqa: E402


class _Fixed(CapabilityEstimator):
    method = "fixed"

    def estimate(self, queries: Any) -> list[Estimate]:
        return [Estimate(p=0.9, method=self.method) for _ in queries]


def cases(folder: Path) -> dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], str]]]:
    """Each kind's strategy and check (one argument: the drawn case)."""
    rng = np.random.default_rng(0)
    probe_dir = folder / "probe"
    X = rng.normal(size=(40, 3)).astype(np.float32)
    LinearProbe(lr=1e-2, validation_fraction=None, max_epochs=3).fit(X, rng.uniform(size=40)).save(probe_dir)
    valid = json.loads((probe_dir / META_FILE).read_text())
    gate = Gate(policy="balanced", estimator=_Fixed())

    def probe_case(text: str) -> str:
        try:
            return _fuzz.check_probe_metadata(text, probe_dir)
        finally:
            (probe_dir / META_FILE).write_text(_fuzz._json_text(valid))

    return {
        "policy_yaml": (_fuzz.POLICY_TEXTS, lambda t: _fuzz.check_policy_yaml(t, folder)),
        "labels_jsonl": (
            _fuzz.jsonl_lines(_fuzz._GOOD_LABEL),
            lambda ls: _fuzz.check_labels_jsonl(ls, folder),
        ),
        "dataset_jsonl": (
            _fuzz.jsonl_lines(_fuzz._GOOD_ITEM),
            lambda ls: _fuzz.check_dataset_jsonl(ls, folder),
        ),
        "chat_messages": (_fuzz.MESSAGE_LISTS, lambda v: _fuzz.check_chat_messages(v, gate.assess)),
        "probe_metadata": (_fuzz.probe_metadata(valid), probe_case),
        "verbalized_reply": (
            st.tuples(_fuzz.REPLIES, st.booleans()),
            lambda pair: _fuzz.check_verbalized_reply(pair[0], pair[1]),
        ),
    }


def run_kind(
    strategy: st.SearchStrategy[Any], check: Callable[[Any], str], examples: int, at: int
) -> tuple[Counter[str], list[str], float]:
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []

    @seed(at)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def tally(case: Any) -> None:
        try:
            outcomes[check(case)] += 1
        except Exception as exc:  # counted and shown, not raised: the bench reports every case
            outcomes["unexpected"] += 1
            unexpected.append(f"{type(exc).__name__}: {exc!s:.200} <- {case!r:.200}")

    start = time.monotonic()
    tally()
    return outcomes, unexpected, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500, help="cases per kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-report", action="store_true", help="do not rewrite bench/RELIABILITY.md")
    parser.add_argument("--smoke", action="store_true", help="5 cases per kind (the test suite runs it)")
    args = parser.parse_args()
    report = REPO / "bench" / "RELIABILITY.md"
    if args.smoke:
        from _smoke import smoke_dir

        args.examples, report = 5, smoke_dir("fuzz") / "RELIABILITY.md"
    started = machine()
    print(f"machine: {started}")
    row = "{:<18} {:>6} {:>9} {:>7} {:>9} {:>11} {:>7}"
    print(row.format("kind", "cases", "accepted", "error", "degraded", "unexpected", "s"))
    table = [
        "## Fuzzed inputs",
        "",
        f"Method: `bench/fuzz_bench.py --examples {args.examples} --seed {args.seed}` (strategies and "
        "checks: `tests/_fuzz.py`, also run with bounded examples by `tests/test_fuzz_inputs.py`). "
        "*error* = capgate's own error type, located (file, line or field); *degraded* = an estimate "
        f"with no value and its reason. Machine: {started}.",
        "",
        "| kind | cases | accepted | error (located) | degraded | unexpected |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    total = bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, (strategy, check)) in enumerate(cases(Path(tmp)).items()):
            outcomes, unexpected, took = run_kind(strategy, check, args.examples, args.seed + i)
            n = sum(outcomes.values())
            total, bad = total + n, bad + outcomes["unexpected"]
            counts = [outcomes[k] for k in ("accepted", "error", "degraded", "unexpected")]
            print(row.format(kind, n, *counts, f"{took:.1f}"), flush=True)
            table.append(f"| {kind} | {n} | " + " | ".join(str(c) for c in counts) + " |")
            for line in unexpected[:3]:
                print(f"  unexpected: {line}")
    if not args.no_report:
        update_section("fuzz", "\n".join(table), report)
    print(f"fuzz: {total} cases, {bad} unexpected")


if __name__ == "__main__":
    main()
