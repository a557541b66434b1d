"""The probe's estimates against a bare forward pass of its reader (issue 21), side by side.

On the embedded SmolLM2-135M-Instruct with the shipped probe (it reads hidden state 26 of 30),
on held-out prompts, in one run:

* **where the time goes** (one list of 32, float32, today's path vs capgate's now): templating
  and tokenization, padding, the forward pass, pooling, the probe and the ``Estimate``s;
* **speed table**, for float32, bfloat16 and bf16-mixed (float32 with the MLP matmuls in
  bfloat16), batch 1 (``estimate_one`` in a loop), 8 and 32 (one list): a *bare forward* (the
  decoder's own call on pre-tokenized, padded ids, through the same 26 layers, no hooks,
  ``torch.inference_mode``, in the same length-bucketed passes capgate's featurizer makes of the
  list, so both do the same forward work) against *capgate's estimate* (from the prompt text to
  the ``Estimate``), the ratio estimate time / bare time (1.00 = as fast as the bare pass), and *today's
  path* before issue 21 (the full model with every hidden state, float32, batches of 8) with
  capgate's speed-up over it. Bare and capgate alternate per repetition, so a noisy machine slows
  both;
* **the fast paths' checks** (``--fast``, default bfloat16 and bf16-mixed): on the held-out
  split (``--check-n``, default all of it), the largest |Δp| between the fast and the float32
  estimates and both capability Brier scores against µ̂, passed when |Δp| <= 0.01 and the Brier
  moves by <= 0.0005. ``--record`` keeps the checks in the probe's metadata (default: the
  shipped probe), which is what lets ``load_estimator`` choose a fast path by itself on a CPU
  that computes bfloat16 natively (bfloat16 if its check passed, else bf16-mixed if its did).

The last line: ``probe speed: N/s at batch 32, M/s one at a time, within R× of a bare forward``
for the path ``load_estimator("default")`` chooses on this machine (R: the worst of the three
batch sizes).

Run: ``python bench/probe_speed.py [--threads 2] [--repeats 2] [--check-n N] [--fast DTYPE,...]
[--record] [--no-table]``. ``--smoke``: every part in seconds on a tiny random-weight model and a
probe fitted for it (4 checked queries, one repetition; the test suite runs it).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from _report import bench_parser, best_time

from capgate.demo.live import demo_questions
from capgate.estimators.probe import LinearProbe, ProbeEstimator
from capgate.loading import FastPathCheck, default_probe_path, load_estimator, recorded_fast_paths
from capgate.local.hidden_states import HiddenStateFeaturizer
from capgate.local.models import bf16_pays_off, bf16_speedup, native_bf16_cpu

BATCHES = (1, 8, 32)
DTYPES = ("float32", "bfloat16", "bf16-mixed")


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


class TodaysFeaturizer(HiddenStateFeaturizer):
    """The path before issue 21: the whole model with every hidden state, float32, passes of 8.

    It shares today's length-bucketed passes, so the speed-up over it counts the truncated pass,
    the kept positions and the larger passes, not the bucketing."""

    def _reader(self) -> Any:
        import torch

        from capgate.local._reader import Reader

        n = self.loaded.num_hidden_layers
        with self._readers_lock:
            if "today" not in self.__dict__:
                self.__dict__["today"] = Reader(self.loaded.model, n, range(n + 1), torch.float32)
            return self.__dict__["today"]


def padded(loaded: Any, encoded: list[list[int]]) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), loaded.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    return input_ids, mask, (mask.cumsum(dim=1) - 1).clamp(min=0)


def bare_decoder(loaded: Any, layers: int, dtype: str) -> Any:
    """The decoder's own call through its first ``layers`` layers, in ``dtype`` (a plain copy, no hooks)."""
    import torch

    from capgate.local._reader import _decoder_copy, _mix_bf16_matmuls, decoder_of

    found = decoder_of(loaded.model, loaded.num_hidden_layers)
    assert found is not None
    mixed = dtype == "bf16-mixed"
    decoder, kept = _decoder_copy(*found, layers, torch.float32 if mixed else getattr(torch, dtype))
    if mixed:
        _mix_bf16_matmuls(kept)
    return decoder


def _layer(probe: LinearProbe) -> int:
    """The one hidden state the probe reads (26 for the shipped one)."""
    layers = (probe.feature_spec_ or {}).get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        raise SystemExit(f"this bench times a probe of one hidden state; the probe reads {layers!r}")
    return int(layers[0])


def estimator_for(loaded: Any, probe: LinearProbe, dtype: str, batch_size: int) -> ProbeEstimator:
    featurizer = HiddenStateFeaturizer(loaded, layers=[_layer(probe)], batch_size=batch_size, dtype=dtype)  # type: ignore[arg-type]
    return ProbeEstimator(featurizer, probe, ignore_spec_fields=["dtype"])


def profile(loaded: Any, probe: LinearProbe, prompts: list[str]) -> None:
    """Where one list of 32 goes, today's path against capgate's now (float32)."""
    import torch

    for name, featurizer in (
        ("today", TodaysFeaturizer(loaded, layers=[_layer(probe)], batch_size=8)),
        ("now", HiddenStateFeaturizer(loaded, layers=[_layer(probe)], batch_size=32)),
    ):
        estimator = ProbeEstimator(featurizer, probe)
        estimator.estimate(prompts[:4])  # warm-up
        encode = best_time(lambda featurizer=featurizer: featurizer._encode(prompts))
        encoded = featurizer._encode(prompts)
        # the featurizer's own passes (by length, bounded padding; today's path at most 8 a pass)
        chunks = [[encoded[i] for i in chunk] for chunk in featurizer._chunks(encoded)]
        pad = best_time(lambda chunks=chunks: [padded(loaded, c) for c in chunks])
        reader = featurizer._reader()

        def passes(chunks: list[list[list[int]]] = chunks, reader: Any = reader) -> None:
            with torch.inference_mode():
                for c in chunks:
                    reader.states(*padded(loaded, c), last_only=True)

        forward = best_time(passes) - pad
        features = featurizer.transform(prompts)
        head = best_time(lambda features=features: [probe.predict(row[None, :]) for row in features])
        total = best_time(lambda estimator=estimator: estimator.estimate(prompts))
        rest = total - encode - pad - forward - head
        overrun = "" if rest >= 0 else " (the parts, timed apart, exceed the total)"
        rest_text = f"{rest * 1e3:.0f} ms{overrun}"
        print(
            f"profile {name:<5} (32 prompts, float32, batches of {featurizer.batch_size}; best of 3 each): "
            f"template+tokenize {encode * 1e3:.0f} ms, padding {pad * 1e3:.1f} ms, forward "
            f"{forward * 1e3:.0f} ms, probe {head * 1e3:.1f} ms, pooling/flow/rest {rest_text}; "
            f"total {total * 1e3:.0f} ms"
        )


def speed_table(
    loaded: Any, probe: LinearProbe, prompts: list[str], repeats: int
) -> dict[str, dict[int, float]]:
    """Queries/s per dtype and batch size: bare decoder vs capgate's estimate (and today's path)."""
    import torch

    today = ProbeEstimator(TodaysFeaturizer(loaded, layers=[_layer(probe)], batch_size=8), probe)
    rates: dict[str, dict[int, float]] = {}
    print(f"{'dtype':<10} {'batch':>5} {'bare q/s':>9} {'capgate q/s':>12} {'ratio':>6} {'today q/s':>10} "
          f"{'speed-up':>9}")  # fmt: skip
    for dtype in DTYPES:
        bare = bare_decoder(loaded, _layer(probe), dtype)
        estimator = estimator_for(loaded, probe, dtype, 32)
        rates[dtype] = {}
        for n in BATCHES:
            queries = prompts[:n] if n > 1 else prompts[:8]
            encoded = [loaded.prompt_ids(q) for q in queries]
            # the same passes capgate runs: one per query alone, else its length-bucketed passes
            passes = [[i] for i in range(len(encoded))] if n == 1 else estimator.featurizer._chunks(encoded)
            inputs = [padded(loaded, [encoded[i] for i in chunk]) for chunk in passes]

            def run_bare(inputs: list[Any] = inputs, bare: Any = bare) -> None:
                with torch.inference_mode():
                    for ids, mask, pos in inputs:
                        bare(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)

            def run_capgate(
                queries: list[str] = queries, n: int = n, est: ProbeEstimator = estimator
            ) -> None:
                if n == 1:
                    for q in queries:
                        est.estimate_one(q)
                else:
                    est.estimate(queries)

            def run_today(queries: list[str] = queries, n: int = n) -> None:
                if n == 1:
                    for q in queries:
                        today.estimate_one(q)
                else:
                    today.estimate(queries)

            run_bare()  # warm-up
            run_capgate()
            b, c, t = [], [], []
            for _ in range(repeats):
                b.append(timed(run_bare))
                c.append(timed(run_capgate))
                if dtype == "float32":
                    t.append(timed(run_today))
            count = len(queries)
            bare_rate, capgate_rate = count / statistics.median(b), count / statistics.median(c)
            rates[dtype][n] = capgate_rate
            rates.setdefault(f"bare {dtype}", {})[n] = bare_rate
            today_rate = count / statistics.median(t) if t else float("nan")
            if t:
                rates.setdefault("today", {})[n] = today_rate
            base = rates["today"][n]
            print(
                f"{dtype:<10} {n:>5} {bare_rate:>9.1f} {capgate_rate:>12.1f} "
                f"{bare_rate / capgate_rate:>5.2f}x "
                f"{today_rate:>10.1f} {capgate_rate / base:>8.2f}x",
                flush=True,
            )
    return rates


def check(loaded: Any, probe: LinearProbe, n: int | None, fast: list[str]) -> list[FastPathCheck]:
    """Each fast dtype's estimates against float32's on the held-out split (the first ``n``)."""
    held_out = json.loads((resources.files("capgate.assets") / "default_split.json").read_text("utf-8"))[
        "test"
    ]
    questions = demo_questions(min(n or len(held_out), len(held_out)), seed=0)
    prompts = [q.prompt for q in questions]
    p32 = [e.p for e in estimator_for(loaded, probe, "float32", 32).estimate(prompts)]
    every = "all " if len(prompts) == len(held_out) else ""
    split = f"{every}{len(prompts)} held-out queries of the shipped split"
    results = []
    for dtype in fast:
        pfast = [e.p for e in estimator_for(loaded, probe, dtype, 32).estimate(prompts)]
        result = FastPathCheck.of(p32, pfast, [q.mu_hat for q in questions], dtype=dtype, split=split)
        worst = int(np.argmax(np.abs(np.asarray(pfast) - np.asarray(p32))))
        print(
            f"check {dtype} vs float32 on {split}: max |dp| {result.max_abs_dp:.4f} (<= 0.01; at p32 "
            f"{p32[worst]:.3f}), Brier {result.brier_float32:.5f} -> {result.brier_fast:.5f} "
            f"({result.brier_delta:+.5f}, within +-0.0005): {'PASSED' if result.passed else 'FAILED'}",
            flush=True,
        )
        results.append(result)
    return results


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repetitions per cell (median)")
    parser.add_argument("--check-n", type=int, default=0, help="held-out queries checked (0: all)")
    parser.add_argument("--fast", default="bfloat16,bf16-mixed", help="fast dtypes checked (comma-separated)")
    parser.add_argument("--record", action="store_true", help="save the checks into the probe's metadata")
    parser.add_argument("--probe", type=Path, default=None, help="probe folder (default: the shipped one)")
    parser.add_argument("--no-table", action="store_true", help="only the check")
    parser.add_argument(
        "--smoke", action="store_true", help="seconds on a tiny model and probe (a test runs it)"
    )
    args = parser.parse_args()
    model = "default"
    if args.smoke:
        from _smoke import left_out, smoke_dir, tiny_model, tiny_probe

        if args.record:
            parser.error("--smoke never records into a probe")
        folder = smoke_dir("probe-speed")
        model, args.threads, args.repeats, args.check_n = str(tiny_model(folder)), 1, 1, 4
        args.probe = tiny_probe(Path(model), folder)
        left_out("the embedded model and the shipped probe (a tiny model and a probe fitted for it)")

    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _report import machine

    path = args.probe or default_probe_path()
    probe = LinearProbe.load(path)
    chosen = load_estimator(model, device="cpu", probe=path)
    loaded = chosen.featurizer.loaded
    prompts = [q.prompt for q in demo_questions(64, seed=1)]
    tokens = statistics.mean(len(loaded.prompt_ids(p)) for p in prompts)
    recorded = {k: f"{'passed' if v.passed else 'failed'} ({v.max_abs_dp:.4f}, n={v.n})"
                for k, v in recorded_fast_paths(probe).items()}  # fmt: skip
    print(
        f"machine: {machine()}; torch threads {args.threads}; native bfloat16: {native_bf16_cpu()}; "
        f"a bfloat16 linear layer measured {bf16_speedup():.2f}x float32 (pays off: {bf16_pays_off()})"
    )
    print(
        f"data: held-out prompts of the shipped split (mean {tokens:.0f} tokens templated); probe reads "
        f"hidden state(s) {list(chosen.featurizer.layer_indices)} of {loaded.num_hidden_layers}; "
        f"load_estimator('default') chose {chosen.featurizer.dtype} "
        f"(recorded checks: {recorded or 'none'})"
    )
    fast = [d for d in args.fast.split(",") if d]
    if unknown := set(fast) - set(DTYPES[1:]):
        parser.error(f"--fast takes {', '.join(DTYPES[1:])}; got {', '.join(sorted(unknown))}")
    results = check(loaded, probe, args.check_n or None, fast)
    if args.record:
        for result in results:
            result.record(probe)
        probe.save(path)
        print(f"recorded the checks in {path / 'probe.json'}")
    if args.no_table:
        return
    profile(loaded, probe, prompts[:32])
    rates = speed_table(loaded, probe, prompts, args.repeats)
    dtype = chosen.featurizer.dtype  # what load_estimator("default") runs on this machine
    within = max(rates[f"bare {dtype}"][n] / rates[dtype][n] for n in BATCHES)
    print(
        f"probe speed: {rates[dtype][32]:.1f}/s at batch 32, {rates[dtype][1]:.1f}/s one at a time, "
        f"within {within:.2f}× of a bare forward ({dtype}; today's path: {rates['today'][32]:.1f}/s and "
        f"{rates['today'][1]:.1f}/s)"
    )


if __name__ == "__main__":
    main()
