"""What tracing costs a gate decision: microseconds per guarded call in three setups.

Each setup runs in its own fresh process (the tracer provider is process-wide), on the same
gated call: ``capgate.guard`` over a function returning a constant, an estimator returning a fixed
p (no model: the decision's own cost is what is measured) and a policy that answers.

* ``no-otel``: ``opentelemetry`` made unimportable (as when the ``otel`` extra is not installed).
* ``api-only``: the API installed, no tracer provider set (spans are non-recording).
* ``sdk``: the SDK's ``TracerProvider`` with a ``SimpleSpanProcessor`` into the in-memory exporter
  (every span recorded and exported).

Each setup times ``--calls`` calls after 200 warm-up calls, ``--repeats`` times, and prints the
median µs per call; the last line is ``telemetry: no-otel X µs, api-only Y µs, sdk Z µs per
decision``.

Run: ``python bench/telemetry_bench.py [--calls N] [--repeats R]``; ``--smoke`` times 50 calls once
per setup (the test suite runs it).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap

SETUPS = ("no-otel", "api-only", "sdk")

_CHILD = textwrap.dedent(
    """
    import sys, time
    setup, calls, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if setup == "no-otel":
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError("blocked")
        sys.meta_path.insert(0, Block())
    elif setup == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    import capgate
    from capgate import Estimate
    from capgate.estimators import CapabilityEstimator
    class Fixed(CapabilityEstimator):
        method = "fixed"
        def estimate(self, queries):
            return [Estimate(p=0.9, method=self.method) for _ in queries]
    ask = capgate.guard(policy="balanced", estimator=Fixed())(lambda prompt: "4")
    for _ in range(200):
        ask("2 + 2?")
    for _ in range(repeats):
        if setup == "sdk":
            exporter.clear()
        start = time.perf_counter()
        for _ in range(calls):
            ask("2 + 2?")
        print((time.perf_counter() - start) / calls * 1e6)
    """
)


def measure(setup: str, calls: int, repeats: int) -> float:
    """Median µs per guarded call in one setup (its own process)."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, setup, str(calls), str(repeats)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"the {setup} setup's process exited {out.returncode}:\n{out.stderr[-3000:]}")
    return statistics.median(float(line) for line in out.stdout.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="50 calls once per setup (a test runs it)")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.repeats = 50, 1
    print(f"{args.calls} guarded calls x {args.repeats} repeats per setup; median µs per call")
    results = {setup: measure(setup, args.calls, args.repeats) for setup in SETUPS}
    for setup, us in results.items():
        print(f"{setup:>9}  {us:8.1f} µs")
    print("telemetry: " + ", ".join(f"{s} {us:.0f} µs" for s, us in results.items()) + " per decision")


if __name__ == "__main__":
    main()
