"""Train the shipped claim detector (``sdk/assets/claim_detector.npz``) from TUNE text only.

Positives: the segments of sentences from the tune families' claim grammar
(``bench/injection_families.tune_claims``). Negatives: the segments of real benchmark questions
(TriviaQA, MMLU, ARC, GSM8K, MATH-500, basic_arithmetic; offline copies) wrapped in the prompt
templates of the default probe, plus benign instructions. The held-out queries of the default
probe's split are kept out of training. 20% of the negatives (seeded) are held out; the
threshold is their 99.5th-percentile score, so about 0.5% of clean segments score as claims. Run::

    .venv/bin/python bench/train_claim_detector.py [--install]

``--smoke`` trains on 10 questions per source and 40 claims and never installs (the test suite
runs it).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import bench_parser
from injection_families import BENIGN, tune_claims

from capgate.datasets import load_dataset
from capgate.datasets._prompt import ALIAS_TEMPLATE
from capgate.estimators._claims import ClaimDetector
from capgate.estimators._segments import split_segments

ROOT = Path(__file__).resolve().parents[1]
NUMERIC_TEMPLATE = "{question}\nAnswer with only the final number."
SOURCES = {"triviaqa": 1500, "mmlu": 800, "arc_easy": 300, "arc_challenge": 200, "gsm8k": 400,
           "math500": 200, "basic_arithmetic:easy": 200, "basic_arithmetic:hard": 200}  # fmt: skip


def negatives(seed: int, held_out: set[str], *, per_source: int | None = None) -> list[str]:
    rng = random.Random(seed)
    texts: list[str] = []
    for name, count in SOURCES.items():
        pool = [i for i in load_dataset(name) if i.id not in held_out]
        for item in rng.sample(pool, min(per_source or count, len(pool))):
            template = ALIAS_TEMPLATE if item.kind == "alias" else NUMERIC_TEMPLATE
            texts.extend(s.text for s in split_segments(template.format(question=item.question)))
    return sorted(set(texts))


def positives(seed: int, n: int = 600) -> list[str]:
    out = []
    for claim in tune_claims(seed, n):
        out.extend(s.text for s in split_segments(claim) if not (s.text.startswith("[") and len(s.text) < 25))
    return sorted(set(out))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--install", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny data, never installs (a test runs it)")
    args = parser.parse_args()
    if args.smoke and args.install:
        parser.error("--smoke never installs")
    split = json.loads((ROOT / "sdk/assets/default_split.json").read_text())
    neg = negatives(args.seed, set(split["test"]), per_source=10 if args.smoke else None)
    pos = sorted(
        set(positives(args.seed, 40 if args.smoke else 600)) - set(neg) - set(BENIGN)
    )  # a shared piece ("Answer:") is no claim
    rng = np.random.default_rng(args.seed)
    neg_order = rng.permutation(len(neg))
    n_fit = int(0.8 * len(neg))
    neg_fit, neg_val = [neg[i] for i in neg_order[:n_fit]], [neg[i] for i in neg_order[n_fit:]]
    neg_fit = sorted(set(neg_fit) | set(BENIGN))  # template pieces are always in the fit
    weight = max(1, len(neg_fit) // len(pos))  # balance the classes by repeating positives
    neg_fit += list(BENIGN) * weight  # the template pieces weigh as much as the claims
    texts, labels = pos * weight + neg_fit, [1] * (len(pos) * weight) + [0] * len(neg_fit)
    detector = ClaimDetector().fit(texts, labels)
    val = detector.score(neg_val)
    threshold = float(np.quantile(val, 0.995))
    detector.set_threshold(threshold)
    train_pos = detector.score(pos)
    print(f"positives {len(pos)}, negatives {len(neg_fit)} fit / {len(neg_val)} held out")
    print(
        f"threshold {threshold:.3f}; held-out clean segments flagged {np.mean(val >= threshold):.4f}; "
        f"train positives caught {np.mean(train_pos >= threshold):.3f}"
    )
    for text in sorted(neg_val, key=lambda t: -detector.score([t])[0])[:5]:
        print(f"  top clean: {detector.score([text])[0]:.3f} {text[:90]!r}")
    if args.install:
        detector.save(ROOT / "sdk/assets/claim_detector.npz")
        print("installed sdk/assets/claim_detector.npz")


if __name__ == "__main__":
    main()
