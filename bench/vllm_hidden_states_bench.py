"""Probe features from the vLLM engine that serves: hidden states in the request vs prefix caching.

Measures, on the first N ARC-Easy test questions in capgate's prompt form (``build_prompt``: the
question, its lettered options, "Answer with the letter..."), with the embedded SmolLM2 folder
(float32, ``enforce_eager``, block size 32, prefix caching on, max 24 greedy tokens):

* **engine features** (``VLLMFeaturizer(layers="all")``: ``extract_hidden_states`` + capgate's CPU
  hidden-states connector): each question is *one* request that generates the answer and
  captures the prompt's hidden states (``generate_with_features``). Its features are compared
  with ``capgate.local.hidden_states.HiddenStateFeaturizer`` (transformers, float32, same folder) on the
  same prompts: max abs and relative L2 difference per row, last-token and mean pooling; its
  greedy answers with a plain engine's.
* **prefix caching** (a plain engine): the generation request cold (prefix cache reset) against
  the same generation after a warming 1-token request of the same prompt (the probe's prefill
  in the fallback design), alternated per question, the cache reset before each pair; the
  engine's ``vllm:prefix_cache_hits`` / ``queries`` counters over the warmed generations.

Medians over the questions. Each engine runs in a subprocess of the vLLM venv's python
(``--vllm-python``, default ``.venv-vllm/bin/python``; ``VLLM_CPU_OMP_THREADS_BIND`` is passed
through, default core 0). Run: ``python bench/vllm_hidden_states_bench.py [--questions N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = 24


def _engine_phase(mode: str, model: str, prompts_file: str, out_file: str) -> None:
    """Runs under the vLLM venv: one engine, its timings and features, written as JSON."""
    from capgate import SamplingParams
    from capgate.adapters.backends.vllm import VLLMBackend, VLLMFeaturizer

    prompts: list[str] = json.loads(Path(prompts_file).read_text())
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)
    common = {
        "enforce_eager": True,
        "block_size": 32,
        "enable_prefix_caching": True,
        "disable_log_stats": False,
    }
    result: dict[str, Any] = {}
    if mode == "extract":
        featurizer = VLLMFeaturizer(
            model, layers="all", pooling="last", dtype="float32", max_model_len=1024, llm_kwargs=common
        )
        mean = VLLMFeaturizer(model, layers="all", pooling="mean", dtype="float32")
        featurizer.generate_with_features(prompts[:1], greedy)  # warm-up
        times, texts, last, means = [], [], [], []
        for prompt in prompts:
            featurizer.llm.reset_prefix_cache()
            start = time.perf_counter()
            gens, features = featurizer.generate_with_features([prompt], greedy)
            times.append(time.perf_counter() - start)
            texts.append(gens[0][0].text)
            last.append(features[0].tolist())
        # Mean pooling from the same engine (a 1-token request; pooling is done here, not in vLLM).
        mean._llm, mean._storage = featurizer.llm, featurizer._storage
        means = mean.transform(prompts).tolist()
        result = {"gen_with_features_s": times, "texts": texts, "last": last, "mean": means}
    else:
        backend = VLLMBackend(model, dtype="float32", max_model_len=1024, llm_kwargs=common)
        llm = backend.llm
        warm_params = SamplingParams(n=1, temperature=0.0, max_tokens=1)

        def counters() -> tuple[float, float]:
            values = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
            return float(values.get("vllm:prefix_cache_hits", 0)), float(
                values.get("vllm:prefix_cache_queries", 0)
            )

        backend.generate(prompts[:1], greedy)  # warm-up
        cold, warm, prefill, texts = [], [], [], []
        hits = queries = 0.0
        for i, prompt in enumerate(prompts):
            for kind in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
                llm.reset_prefix_cache()
                if kind == "warm":
                    start = time.perf_counter()
                    backend.generate([prompt], warm_params)
                    prefill.append(time.perf_counter() - start)
                    h0, q0 = counters()
                start = time.perf_counter()
                text = backend.generate([prompt], greedy)[0][0].text
                elapsed = time.perf_counter() - start
                if kind == "warm":
                    h1, q1 = counters()
                    hits, queries = hits + h1 - h0, queries + q1 - q0
                    warm.append(elapsed)
                else:
                    cold.append(elapsed)
                    texts.append(text)
        result = {
            "cold_s": cold,
            "warm_s": warm,
            "prefill_s": prefill,
            "texts": texts,
            "hits": hits,
            "queries": queries,
        }
    Path(out_file).write_text(json.dumps(result))


def _layout(root: Path) -> Path:
    """capgate laid out as it installs, importable by the vLLM venv's python."""
    layout = root / "layout"
    shutil.copytree(REPO / "sdk", layout / "capgate", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("adapters", "policies"):
        shutil.copytree(
            REPO / folder, layout / "capgate" / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    return layout


def _run_engine(python: str, mode: str, model: str, prompts_file: Path, root: Path) -> dict[str, Any]:
    out = root / f"{mode}.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(root / "layout"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0"),
    }
    cmd = [python, __file__, "--engine", mode, model, str(prompts_file), str(out)]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"vLLM {mode} engine failed:\n{proc.stderr[-4000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _diffs(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Largest per-row max abs difference, largest per-row relative L2 difference."""
    abs_ = float(np.abs(a - b).max())
    rel = float((np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)).max())
    return abs_, rel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds: 2 questions on a tiny model, the vLLM engines left out (a test runs it)",
    )
    args = parser.parse_args()

    from capgate.datasets import build_prompt, load_dataset
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model, prepare_model

    if args.smoke:
        from _smoke import left_out, smoke_dir, tiny_model

        folder = smoke_dir("vllm-hidden-states")
        model, args.questions = str(tiny_model(folder)), 2
    else:
        model = str(prepare_model("default"))
    prompts = [build_prompt(item) for item in load_dataset("arc_easy", split="test", limit=args.questions)]
    loaded = load_model(model, device="cpu", dtype="float32")
    hf_last = HiddenStateFeaturizer(loaded, layers="all", pooling="last").transform(prompts)
    hf_mean = HiddenStateFeaturizer(loaded, layers="all", pooling="mean").transform(prompts)
    del loaded

    with tempfile.TemporaryDirectory(prefix="capgate-vllm-hs-bench-") as tmp:
        root = Path(tmp)
        _layout(root)
        prompts_file = root / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        if args.smoke:
            # Starting a vLLM engine takes minutes on a CPU: the engines' results are stood in for by
            # the transformers features and zero timings, so the comparison and the table still run.
            left_out("both vLLM engines (extract and plain): transformers features and zero timings stand in")
            texts = [""] * len(prompts)
            zeros = [0.0] * len(prompts)
            extract = {
                "gen_with_features_s": zeros,
                "texts": texts,
                "last": hf_last.tolist(),
                "mean": hf_mean.tolist(),
            }
            plain = {"cold_s": [1.0] * len(prompts), "warm_s": zeros, "prefill_s": zeros, "texts": texts,
                     "hits": 0.0, "queries": 0.0}  # fmt: skip
        else:
            extract = _run_engine(args.vllm_python, "extract", model, prompts_file, root)
            plain = _run_engine(args.vllm_python, "plain", model, prompts_file, root)

    last_abs, last_rel = _diffs(np.asarray(extract["last"], dtype=np.float32), hf_last)
    mean_abs, mean_rel = _diffs(np.asarray(extract["mean"], dtype=np.float32), hf_mean)
    same = sum(a == b for a, b in zip(extract["texts"], plain["texts"], strict=True))
    med = statistics.median
    cold, warm, prefill = med(plain["cold_s"]), med(plain["warm_s"]), med(plain["prefill_s"])
    one = med(extract["gen_with_features_s"])
    hit_rate = plain["hits"] / plain["queries"] if plain["queries"] else float("nan")
    n = len(prompts)
    name = "a tiny random-weight model" if args.smoke else "SmolLM2-135M"
    print(f"{n} ARC-Easy test prompts (build_prompt), {name} float32, greedy {MAX_TOKENS} tokens")
    print()
    print("| path | median s / query | vs plain generation |")
    print("| --- | --- | --- |")
    print(f"| plain generation, cold prefix cache | {cold:.3f} | 1.00x |")
    print(f"| engine features: generation + hidden states in one request | {one:.3f} | {one / cold:.2f}x |")
    print(f"| prefix caching: warming 1-token request (the probe's prefill) | {prefill:.3f} | |")
    print(f"| prefix caching: generation after it | {warm:.3f} | {warm / cold:.2f}x |")
    print(f"| prefix caching: both requests | {prefill + warm:.3f} | {(prefill + warm) / cold:.2f}x |")
    print()
    hits = f"{plain['hits']:.0f}/{plain['queries']:.0f}"
    print(f"prefix cache hits over the warmed generations: {hits} tokens ({hit_rate:.1%})")
    print(
        f"features vs transformers (layers all, float32), worst row: last-token max abs {last_abs:.2e}, "
        f"rel L2 {last_rel:.2e}; mean-pooled max abs {mean_abs:.2e}, rel L2 {mean_rel:.2e}"
    )
    print(f"greedy answers identical to the plain engine's: {same}/{n}")


if __name__ == "__main__":  # vLLM starts its engine with spawn: the guard is required
    if len(sys.argv) > 1 and sys.argv[1] == "--engine":
        _engine_phase(*sys.argv[2:6])
    else:
        main()
