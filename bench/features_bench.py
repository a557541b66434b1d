"""Throughput of the local model path on the embedded default model (SmolLM2-135M-Instruct).

Measures, on the CPU unless --device says otherwise:

1. conversion: GGUF -> cached transformers folder, into a fresh temporary cache (skip with
   --no-convert to use the normal cache);
2. load: ``load_model("default")`` from the converted folder;
3. features: ``HiddenStateFeaturizer.transform`` (last prompt token, mean over all 31 hidden
   states) in queries/s, for several batch sizes;
4. generation: ``TransformersBackend.generate`` in samples/s and generated tokens/s, n samples
   per prompt at temperature 1, for several ``max_batch_size`` values.

Data: synthetic arithmetic word problems, generated deterministically (seeded), 20 to 60 words,
so prompts are 50 to 110 tokens after the chat template. Each timing is the best of --repeats
runs after one warm-up run.

Usage:
    .venv/bin/python bench/features_bench.py [--threads 1] [--queries 64] [--device cpu]

``--smoke`` runs every part in seconds on a tiny random-weight model (no conversion timed; 4 queries,
2 prompts x n=2 of 4 tokens, one repeat; the test suite runs it).
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time

from _report import bench_parser, best_time


def make_queries(count: int, seed: int = 0) -> list[str]:
    """Deterministic arithmetic word problems of varied length."""
    rng = random.Random(seed)
    names = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]
    items = ["apples", "pencils", "marbles", "books", "stamps", "coins"]
    queries = []
    for _ in range(count):
        name, other = rng.sample(names, 2)
        item = rng.choice(items)
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        text = f"{name} has {a} {item}. {other} gives {name} {b} more {item}."
        for _ in range(rng.randint(0, 3)):
            text += f" Then {name} splits them into {c} equal groups and gives all but one group away."
        text += f" How many {item} does {name} have now? Answer with a number."
        queries.append(text)
    return queries


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--queries", type=int, default=64, help="queries for the feature benchmark")
    parser.add_argument("--prompts", type=int, default=8, help="prompts for the generation benchmark")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-convert", action="store_true", help="do not time a fresh conversion")
    parser.add_argument("--smoke", action="store_true", help="seconds on a tiny model (a test runs it)")
    args = parser.parse_args()
    model = "default"
    if args.smoke:
        from _smoke import left_out, tiny_model

        model, args.no_convert, args.threads = str(tiny_model()), True, args.threads or 1
        args.queries, args.prompts, args.n, args.max_tokens, args.repeats = 4, 2, 2, 4, 1
        left_out("the GGUF conversion (a tiny random-weight model is read instead)")

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not args.no_convert:
        os.environ["CAPGATE_CACHE_DIR"] = tempfile.mkdtemp(prefix="capgate-bench-")

    from capgate import Generation, SamplingParams
    from capgate.adapters.backends.transformers import TransformersBackend
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model, prepare_model

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), device={args.device}")
    print(f"cache: {os.environ.get('CAPGATE_CACHE_DIR', '(user cache)')}")
    start = time.perf_counter()
    folder = prepare_model(model)
    prepare_s = time.perf_counter() - start
    what = "conversion (fresh cache)" if not args.no_convert else "prepare (cached)"
    print(f"{what}: {prepare_s:.1f} s -> {folder}")
    start = time.perf_counter()
    loaded = load_model(model, device=args.device)
    print(f"load_model({model!r}): {time.perf_counter() - start:.2f} s ({loaded.dtype} on {loaded.device})")

    queries = make_queries(args.queries)
    lengths = [len(loaded.prompt_ids(q)) for q in queries]
    print(
        f"\nfeatures: {len(queries)} queries, prompt tokens min/median/max "
        f"{min(lengths)}/{int(statistics.median(lengths))}/{max(lengths)}, "
        f"{loaded.num_hidden_layers + 1} hidden states, pooling=last"
    )
    print(f"{'batch_size':>10} {'seconds':>9} {'queries/s':>10}")
    for batch_size in (1, 8, 32):
        featurizer = HiddenStateFeaturizer(loaded, batch_size=batch_size)
        featurizer.transform(queries)  # warm-up
        seconds = best_time(lambda f=featurizer: f.transform(queries), args.repeats)
        print(f"{batch_size:>10} {seconds:>9.2f} {len(queries) / seconds:>10.1f}")

    prompts = make_queries(args.prompts, seed=1)
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=0)
    print(
        f"\ngeneration: {len(prompts)} prompts x n={args.n}, max_tokens={args.max_tokens}, "
        f"temperature=1 (responses may stop early at EOS)"
    )
    print(f"{'max_batch':>10} {'seconds':>9} {'samples/s':>10} {'tokens/s':>9}")
    for max_batch in (4, 16, 32):
        backend = TransformersBackend(loaded, max_batch_size=max_batch)
        results: list[list[list[Generation]]] = []

        def run(b: TransformersBackend = backend, out: list[list[list[Generation]]] = results) -> None:
            out.extend([b.generate(prompts, params)])

        run()  # warm-up
        seconds = best_time(run, args.repeats)
        last = results[-1]
        samples = sum(len(group) for group in last)
        tokens = sum(g.n_tokens for group in last for g in group)
        print(f"{max_batch:>10} {seconds:>9.2f} {samples / seconds:>10.2f} {tokens / seconds:>9.1f}")


if __name__ == "__main__":
    main()
