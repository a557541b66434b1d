"""Overhead of gating: wall time of a gated LLM call over the same call ungated, and batching.

Measures, side by side in one run, on real questions (the held-out prompts shipped with the
default model's labels):

* local path: ``ask(prompt)`` = one greedy answer (max 24, then 128 tokens) from the embedded
  SmolLM2-135M-Instruct through ``TransformersBackend``; gated = ``capgate.guard`` with the
  shipped probe (``load_estimator("default")``, loaded apart from the backend as the README
  does) and an always-answer policy, so the ratio is the estimate + decision cost alone. Two
  gated paths: *standalone probe* (the shared prefill switched off: the probe runs its own
  forward pass, then generation runs the prompt again) and *shared prefill* (the default: the
  probe's pass keeps the KV cache and generation continues from it). For each question the three
  calls alternate (ungated, standalone, shared, the order rotating from one question to the next;
  ``--repeats R`` rounds per question; the prefill cache is emptied before each call), and the
  table prints median seconds per call and the ratio of medians, then the median of the paired
  (same question, same round) ratios.
* batching: queries/s of the probe for 1, 8 and 32 queries: one by one (``estimate_one`` in a
  loop), as one list (``estimate``), and as a fan-out (one ``Gate.assess`` per thread, the way a
  LangGraph ``Send`` fan-out or a LangChain ``abatch`` calls it; concurrent calls coalesce).
* remote path (``--server URL``, not with ``--local``): the same ``ask`` through
  ``OpenAIBackend`` against an OpenAI-compatible server (the CI's vLLM CPU server), gated by the
  verbalized estimator.
* vLLM engine paths (``--vllm-engine``, not with ``--local``; issue 11 section 2): the engines of
  ``bench/vllm_hidden_states_bench.py`` in the vLLM venv (``--vllm-python``, default
  ``.venv-vllm/bin/python``) on this run's prompts, 24 greedy tokens: answer + hidden states in
  one request, and the prefix-caching fallback, each against a plain (cold) generation.
* breakdown (unless ``--no-breakdown``): where the 24-token shared-prefill call's time goes.

Issue 22 rows: the same gate in shadow mode (its estimate beside the call) on the local path, and
on the remote path the verbalized estimator in shadow mode and speculative (the call started with
its estimate), each as the median of paired gated/ungated ratios, and what a speculative call
discarded when the policy blocked it.

Run: ``python bench/overhead_bench.py [--local] [--questions N] [--server URL --served-model
NAME] [--repeats R] [--vllm-engine]``. The last line is ``overhead: local R1× (24 tok) R2× (128 tok)``
(shared-prefill path), followed by ``; verbalized R3×; calls/query C; verbalized shadow R4×,
speculative R5× (paired)`` when a server was measured.

``--smoke``: every local and remote part in seconds on a tiny random-weight model and a probe fitted
for it, against the test suite's server if set, else an in-process fake one; no vLLM engine paths
(the test suite runs it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _report import bench_parser

from capgate import Gate, guard
from capgate.core.backend import Backend, SamplingParams
from capgate.demo.live import demo_questions
from capgate.estimators.base import CapabilityEstimator
from capgate.policies import Policy

ALWAYS_ANSWER = Policy.from_yaml_text(
    "version: 1\nname: always-answer\nbands:\n  - action: answer\non_degraded: answer\n", source="bench"
)
ROW = "{:<52} {:>10} {:>10} {:>9}"
REPO = Path(__file__).resolve().parents[1]


def ask_with(backend: Backend, max_tokens: int) -> Callable[[str], str]:
    def ask(prompt: str) -> str:
        params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
        return backend.generate([prompt], params)[0][0].text

    return ask


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure_local(
    backend: Any, estimator: Any, prompts: list[str], max_tokens: int, repeats: int = 1
) -> float:
    """Ungated vs standalone-probe vs shared-prefill gated calls vs the same gate in shadow mode;
    returns the shared ratio. A shadow call's estimate runs beside it (the timed call); the next
    call starts once that estimate is done (flushed, untimed), so none spills into another's time."""
    from capgate.local.prefill import prefill_cache

    cache = prefill_cache(backend.loaded)
    ask = ask_with(backend, max_tokens)
    gated = guard(policy=ALWAYS_ANSWER, estimator=estimator)(ask)
    shadow = guard(policy=ALWAYS_ANSWER, estimator=estimator, mode="shadow")(ask)

    def standalone(prompt: str) -> None:
        cache.enabled = False
        try:
            gated(prompt)
        finally:
            cache.enabled = True

    paths: dict[str, Callable[[str], Any]] = {
        "ungated": ask,
        "standalone": standalone,
        "shared": gated,
        "shadow": shadow,
    }
    names = list(paths)
    times: dict[str, list[float]] = {name: [] for name in paths}
    rounds = [prompt for prompt in prompts for _ in range(repeats)]
    for turn, prompt in enumerate([prompts[0], *rounds]):  # the first round warms every path up
        # The order rotates from one question to the next, so no path always runs first or last.
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            cache.clear()
            times[name].append(timed(lambda call=paths[name], prompt=prompt: call(prompt)))
            shadow.gate.flush()
    medians = {name: statistics.median(values[1:]) for name, values in times.items()}
    plain = medians["ungated"]
    labels = (
        ("standalone", "probe (own prefill)"),
        ("shared", "probe (shared prefill)"),
        ("shadow", "probe in shadow mode"),
    )
    for name, label in labels:
        gate = medians[name]
        print(ROW.format(f"local {max_tokens} tok: {label} + policy", f"{plain:.3f}", f"{gate:.3f}",
                         f"{gate / plain:.2f}x"))  # fmt: skip
    # Paired: the median over calls of gated / ungated for the same question in the same round.
    paired = {
        name: statistics.median(g / u for g, u in zip(times[name][1:], times["ungated"][1:], strict=True))
        for name in ("standalone", "shared", "shadow")
    }
    print(f"local {max_tokens} tok, median of paired ratios: own prefill {paired['standalone']:.3f}x, "
          f"shared prefill {paired['shared']:.3f}x, shadow {paired['shadow']:.3f}x "
          f"({len(rounds)} calls per path)")  # fmt: skip
    return medians["shared"] / plain


def measure_breakdown(backend: Any, estimator: Any, prompts: list[str], max_tokens: int) -> None:
    """Where a shared-prefill gated call's time goes, against the ungated call's (medians).

    Per question, alternated: the ungated call; the ungated call's prefill alone (the same
    generate, one token); the estimate alone (templating, the probe's forward pass keeping the
    KV cache, the probe, the ``Estimate``); the generation right after it, from that cache; and
    the gate's own flow (``guard`` with a constant estimator around a function that returns at
    once, 50 calls).
    """
    from capgate.core.types import Estimate
    from capgate.local.prefill import prefill_cache

    class Constant(CapabilityEstimator):
        method = "constant"

        def estimate(self, queries: Any) -> list[Estimate]:
            return [Estimate(p=0.9, method=self.method) for _ in queries]

    cache = prefill_cache(backend.loaded)
    ask, first = ask_with(backend, max_tokens), ask_with(backend, 1)
    flow = guard(policy=ALWAYS_ANSWER, estimator=Constant())(lambda prompt: prompt)
    parts: dict[str, list[float]] = {k: [] for k in ("ungated", "prefill", "estimate", "cached", "flow")}
    for turn, prompt in enumerate([prompts[0], *prompts]):
        cache.clear()
        ungated = timed(lambda prompt=prompt: ask(prompt))
        cache.clear()
        prefill = timed(lambda prompt=prompt: first(prompt))
        cache.clear()
        estimate = timed(lambda prompt=prompt: estimator.estimate_one(prompt))
        cached = timed(lambda prompt=prompt: ask(prompt))
        flow_s = min(timed(lambda prompt=prompt: flow(prompt)) for _ in range(50))
        if turn:
            for key, value in zip(parts, (ungated, prefill, estimate, cached, flow_s), strict=True):
                parts[key].append(value)
    m = {key: statistics.median(values) for key, values in parts.items()}
    decode = m["ungated"] - m["prefill"]
    print(f"breakdown, {max_tokens} tok (median s): ungated {m['ungated']:.3f} = prefill+generate "
          f"setup {m['prefill']:.3f} + decode {decode:.3f}; gated = estimate (prefill+features+probe) "
          f"{m['estimate']:.3f} + generation from the cache {m['cached']:.3f} + flow "
          f"{m['flow'] * 1e3:.2f} ms; estimate - prefill {m['estimate'] - m['prefill']:+.3f}, "
          f"cached - decode {m['cached'] - decode:+.3f}")  # fmt: skip


def measure_vllm_engine(prompts: list[str], python: str) -> None:
    """Issue 11 section 2 beside the local part: vLLM engine paths, through the vLLM venv.

    The engines of ``bench/vllm_hidden_states_bench.py`` (its helpers, same settings: float32,
    ``enforce_eager``, block size 32, prefix caching, greedy 24 tokens, the prefix cache reset
    before each query) run in subprocesses of ``python`` on this run's prompts: a plain
    generation (cold) against the answer + hidden states in one request (``generate_with_features``)
    and the prefix-caching fallback (a 1-token warming request, then the generation).
    """
    import json
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm_hidden_states_bench as vhs

    from capgate.local.models import prepare_model

    model = str(prepare_model("default"))
    with tempfile.TemporaryDirectory(prefix="capgate-overhead-vllm-") as tmp:
        root = Path(tmp)
        vhs._layout(root)
        prompts_file = root / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        extract = vhs._run_engine(python, "extract", model, prompts_file, root)
        plain = vhs._run_engine(python, "plain", model, prompts_file, root)
    med = statistics.median
    cold = med(plain["cold_s"])
    rows = (
        ("vLLM engine: answer + hidden states, one request", med(extract["gen_with_features_s"])),
        ("vLLM engine: prefix-caching fallback, 2 requests", med(plain["prefill_s"]) + med(plain["warm_s"])),
    )
    for label, value in rows:
        print(ROW.format(label, f"{cold:.3f}", f"{value:.3f}", f"{value / cold:.2f}x"))
    same = sum(a == b for a, b in zip(extract["texts"], plain["texts"], strict=True))
    print(f"vLLM engine: greedy answers equal to the plain engine's {same}/{len(prompts)}")


def measure_batching(estimator: CapabilityEstimator, prompts: list[str]) -> None:
    """Queries/s of the probe for 1, 8 and 32 queries, three ways."""
    gate = Gate(policy=ALWAYS_ANSWER, estimator=estimator)
    print(f"{'probe queries/s':<26} {'n':>4} {'one by one':>11} {'one list':>10} {'fan-out':>9}")
    for n in (1, 8, 32):
        queries = [prompts[i % len(prompts)] for i in range(n)]
        estimator.estimate(queries)  # warm-up
        alone = timed(lambda queries=queries: [estimator.estimate_one(q) for q in queries])
        listed = timed(lambda queries=queries: estimator.estimate(queries))
        with ThreadPoolExecutor(max_workers=n) as pool:
            fanned = timed(lambda queries=queries, pool=pool: list(pool.map(gate.assess, queries)))
        print(f"{'':<26} {n:>4} {n / alone:>11.1f} {n / listed:>10.1f} {n / fanned:>9.1f}")


def measure_remote(
    ask: Callable[[str], str],
    estimator: CapabilityEstimator,
    prompts: list[str],
    label: str,
    policy: Policy = ALWAYS_ANSWER,
    **settings: Any,
) -> tuple[float, float]:
    """Ungated vs gated (``settings``: e.g. ``mode="shadow"``, ``speculative=True``) on the server;
    prints both medians and the median of the paired ratios; returns the ratio of the medians and
    the paired ratio."""
    gated = guard(policy=policy, estimator=estimator, **settings)(ask)
    ask(prompts[0])  # warm-up both paths once
    gated(prompts[0])
    gated.gate.flush()
    plain_s: list[float] = []
    gated_s: list[float] = []
    for turn, prompt in enumerate(prompts):  # alternate which path goes first
        pair = [("plain", ask), ("gated", gated)]
        for name, call in pair if turn % 2 == 0 else pair[::-1]:
            (plain_s if name == "plain" else gated_s).append(
                timed(lambda call=call, prompt=prompt: call(prompt))
            )
            gated.gate.flush()  # a shadow estimate ends before the next call starts (untimed)
    plain, gate = statistics.median(plain_s), statistics.median(gated_s)
    paired = statistics.median(g / u for g, u in zip(gated_s, plain_s, strict=True))
    print(ROW.format(f"remote: {label} + policy", f"{plain:.3f}", f"{gate:.3f}",
                     f"{gate / plain:.2f}x"))  # fmt: skip
    print(f"remote: {label}, median of paired ratios {paired:.3f}x ({len(prompts)} calls per path)")
    return gate / plain, paired


def measure_discarded(ask: Callable[[str], str], estimator: CapabilityEstimator, prompts: list[str]) -> None:
    """Speculative gating under a policy that blocks: what the blocked calls cost before discarding."""
    from capgate import Gated

    strict = Policy.from_yaml_text(
        "version: 1\nname: answer-above-half\nbands:\n  - below: 0.5\n    action: abstain\n"
        "  - action: answer\non_degraded: abstain\n",
        source="bench",
    )
    gated = guard(policy=strict, estimator=estimator, speculative=True)(ask)
    blocked = [r for r in map(gated, prompts) if isinstance(r, Gated)]
    spent = [r.decision.speculation.call_s for r in blocked if r.decision.speculation is not None]
    known = [s for s in spent if s is not None]
    print(
        f"speculative, abstain below p=0.5: {len(blocked)} of {len(prompts)} calls blocked and discarded "
        f"(started with their estimate; {len(known)} had finished, {sum(known):.2f} s of calls thrown away; "
        "a sync call cannot be cancelled, an async one is)"
    )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--local", action="store_true", help="only the local part (no server needed)")
    parser.add_argument("--server", help="OpenAI-compatible base URL for the remote path")
    parser.add_argument("--served-model", help="model name on the server")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument(
        "--vllm-engine",
        action="store_true",
        help="also the vLLM engine paths of issue 11 section 2 (not with --local)",
    )
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--repeats", type=int, default=1, help="alternation rounds per question")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the 24-token breakdown")
    parser.add_argument("--smoke", action="store_true", help="seconds on a tiny model (a test runs it)")
    args = parser.parse_args()
    if args.smoke:
        import contextlib

        from _smoke import left_out, openai_server, smoke_dir, tiny_model, tiny_probe

        folder = smoke_dir("overhead")
        model = tiny_model(folder)
        args.questions, args.threads, args.vllm_engine = 2, 1, False
        left_out("the embedded model, the shipped probe and the vLLM engine paths (a tiny model and probe)")
        with contextlib.ExitStack() as stack:
            if not args.local:
                args.server, args.served_model = stack.enter_context(
                    openai_server(args.server, args.served_model)
                )
            run(args, str(model), str(tiny_probe(model, folder)))
        return
    run(args, "default", None)


def run(args: argparse.Namespace, model: str, probe: str | None) -> None:
    prompts = [q.prompt for q in demo_questions(args.questions, seed=1)]
    print(f"data: {len(prompts)} held-out prompts from the shipped SmolLM2 labels; greedy answers")

    import torch

    from capgate.adapters.backends.transformers import load_backend
    from capgate.loading import load_estimator

    torch.set_num_threads(args.threads)
    backend = load_backend(model, device="cpu")
    estimator = load_estimator(model, device="cpu", probe=probe)
    print(ROW.format("path", "ungated s", "gated s", "ratio"))
    short = measure_local(backend, estimator, prompts, 24, args.repeats)
    long = measure_local(backend, estimator, prompts, 128, args.repeats)
    if not args.no_breakdown:
        measure_breakdown(backend, estimator, prompts, 24)
    if args.vllm_engine and not args.local:
        measure_vllm_engine(prompts, args.vllm_python)
    measure_batching(estimator, prompts)
    line = f"overhead: local {short:.2f}× (24 tok) {long:.2f}× (128 tok)"
    if args.server and not args.local:
        from capgate.adapters.backends.openai import OpenAIBackend
        from capgate.estimators import VerbalizedConfidence

        remote = OpenAIBackend(
            args.served_model or "default", base_url=args.server, api_key="none", timeout=300.0
        )
        # Free-text \\boxed{P} (before section 3 of issue 11) beside structured output (JSON schema).
        for label, structured in (("verbalized, free text", False), ("verbalized, structured", True)):
            verbalized = VerbalizedConfidence(remote, structured=structured)
            ratio, _ = measure_remote(ask_with(remote, 24), verbalized, prompts, label)
            estimates = verbalized.estimate(prompts)
            calls = statistics.mean(e.cost.calls for e in estimates)
            parsed = statistics.mean(e.p is not None and e.details.get("tries") == 1 for e in estimates)
            print(f"{label:<40} calls/query {calls:.2f}; parsed on the first try {parsed:.0%}")
        line += f"; verbalized {ratio:.2f}×; calls/query {calls:.2f}"
        # Issue 22: the same estimator beside the call (shadow) and started with it (speculative).
        ask24 = ask_with(remote, 24)
        _, shadow = measure_remote(ask24, verbalized, prompts, "verbalized, shadow mode", mode="shadow")
        _, spec = measure_remote(ask24, verbalized, prompts, "verbalized, speculative", speculative=True)
        measure_discarded(ask24, verbalized, prompts)
        line += f"; verbalized shadow {shadow:.2f}×, speculative {spec:.2f}× (paired)"
    print(line)


if __name__ == "__main__":
    main()
