"""``capgate probe``: featurize labelled queries, fit a linear probe, evaluate it against baselines.

Features come from a precomputed ``.npz`` (``--features``; see
:mod:`capgate.estimators.feature_store`), so fitting and evaluating need no model once features
exist; or they are computed on the fly with ``--model`` (the local hidden-state featurizer) or
``--featurizer module:attr`` (any object with ``spec`` and ``transform``).
"""

from __future__ import annotations

import importlib
import math
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
import typer

from capgate._util.validate import check_int_at_least, check_positive_int, check_unit_interval
from capgate.cli._common import (
    JsonFlag,
    JsonOut,
    check_option,
    command_group,
    console,
    fail,
    output_file,
    output_folder,
    parse_int_list,
    run_reporting_errors,
    show_figures,
    writing,
)
from capgate.errors import CapgateError, DataError
from capgate.labels.labelled import LabelledSet, iter_labelled, read_labelled

__all__ = ["register"]

probe_app = command_group("probe", "Fit and evaluate a linear capability probe on hidden-state features.")

FeaturesOpt = Annotated[
    Path | None,
    typer.Option("--features", help="Precomputed features (.npz keyed by query id, spec in .spec.json)."),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", help="Compute features with this model's hidden states (needs the 'local' extra)."
    ),
]
FeaturizerOpt = Annotated[
    str | None,
    typer.Option(
        "--featurizer", help="Compute features with module:attr (a featurizer, or a factory of one)."
    ),
]
BatchOpt = Annotated[int, typer.Option(min=1, help="Queries per featurizer call.")]


def _hidden_state_featurizer(model: str) -> Any:
    """The local-model featurizer for ``model`` (``capgate.local.hidden_states``, extra ``local``),
    default recipe."""
    try:
        models = importlib.import_module("capgate.local.models")
        features = importlib.import_module("capgate.local.hidden_states")
    except ImportError as exc:
        fail(f"--model needs capgate.local.hidden_states and its extra (pip install 'capgate[local]'): {exc}")
    return features.HiddenStateFeaturizer(models.load_model(model))


def _import_featurizer(target: str) -> Any:
    from capgate.estimators.probe import Featurizer

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        fail(f"--featurizer must look like module:attr; got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"--featurizer: cannot import {module_name!r}: {exc}")
    obj = getattr(module, attr, None)
    if obj is None:
        fail(f"--featurizer: {module_name!r} has no attribute {attr!r}")
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Featurizer)):
        obj = obj()
    if not isinstance(obj, Featurizer):
        fail(f"--featurizer: {target} is not a featurizer (needs .spec and .transform(queries))")
    return obj


def _featurizer(model: str | None, featurizer: str | None) -> Any:
    return _import_featurizer(featurizer) if featurizer is not None else _hidden_state_featurizer(str(model))


def _one_source(features: Path | None, model: str | None, featurizer: str | None) -> None:
    given = [
        name for name, v in (("--features", features), ("--model", model), ("--featurizer", featurizer)) if v
    ]
    if len(given) != 1:
        fail(f"give exactly one of --features, --model, --featurizer; got {', '.join(given) or 'none'}")


def _questions(labelled: LabelledSet) -> list[str]:
    """The question text of every record; a record without one is a DataError at its line."""
    if all(r.question for r in labelled.records):
        return [str(r.question) for r in labelled.records]
    for line, record in iter_labelled(labelled.path):
        if not record.question:
            raise DataError(
                "no question text to featurize (give --features instead)",
                path=labelled.path,
                line=line,
                field="question",
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _features_for(
    labelled: LabelledSet,
    features: Path | None,
    model: str | None,
    featurizer: str | None,
    batch_size: int,
) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
    """Feature rows for the labelled queries (file order) and the spec that made them."""
    from capgate.estimators.feature_store import load_features, spec_as_dict

    if features is not None:
        stored = load_features(features)
        return stored.rows_for(labelled.ids, source=labelled.path), stored.spec
    made = _featurizer(model, featurizer)
    questions = _questions(labelled)
    rows = [made.transform(questions[i : i + batch_size]) for i in range(0, len(questions), batch_size)]
    return np.concatenate([np.asarray(r, dtype=np.float32) for r in rows]), spec_as_dict(made.spec)


def _parse_lr(text: str) -> float | tuple[float, ...] | Literal["sweep"]:
    if text == "sweep":
        return "sweep"
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"--lr must be 'sweep' or comma-separated numbers; got {text!r}")
    if not values or any(not 0 < v < math.inf for v in values):
        fail(f"--lr must be 'sweep' or positive numbers; got {text!r}")
    return values[0] if len(values) == 1 else values


def featurize_command(
    labels: Annotated[Path, typer.Option(help="Labelled JSONL (id, question, k, correct).")],
    out: Annotated[
        Path,
        typer.Option(callback=output_file, help="Feature file to write (.npz; the spec goes to .spec.json)."),
    ],
    model: ModelOpt = None,
    featurizer: FeaturizerOpt = None,
    batch_size: BatchOpt = 16,
) -> None:
    """Precompute features for labelled queries; an interrupted run resumes where it stopped."""
    from capgate.estimators.feature_store import featurize_to, spec_path

    _one_source(None, model, featurizer)
    labelled = run_reporting_errors(lambda: read_labelled(labels))
    questions = run_reporting_errors(lambda: _questions(labelled))
    made = _featurizer(model, featurizer)

    def progress(done: int, total: int) -> None:
        typer.echo(f"featurized {done}/{total}", err=True)

    with writing(out, "the features"):
        stored = run_reporting_errors(
            lambda: featurize_to(out, labelled.ids, questions, made, batch_size=batch_size, on_batch=progress)
        )
    typer.echo(f"wrote {out} ({len(stored.ids)} x {stored.features.shape[1]}) and {spec_path(out)}")


def fit_command(
    labels: Annotated[Path, typer.Option(help="Labelled JSONL of the training queries.")],
    out: Annotated[
        Path,
        typer.Option(
            callback=output_folder, help="Folder to save the probe in (probe.safetensors + probe.json)."
        ),
    ],
    features: FeaturesOpt = None,
    model: ModelOpt = None,
    featurizer: FeaturizerOpt = None,
    val_labels: Annotated[
        Path | None, typer.Option(help="Labelled JSONL for early stopping (default: hold out a fraction).")
    ] = None,
    lr: Annotated[
        str, typer.Option(help="'sweep' (1e-5..5e-4, the paper's), one rate, or a comma list.")
    ] = "sweep",
    validation_fraction: Annotated[float, typer.Option(help="Held out when no --val-labels.")] = 0.1,
    max_epochs: Annotated[int, typer.Option(help="Most passes over the data.")] = 200,
    patience: Annotated[int, typer.Option(help="Epochs without improvement before stopping.")] = 20,
    standardize: Annotated[bool, typer.Option(help="Z-score the features.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the split and minibatch order.")] = 0,
    batch_size: BatchOpt = 16,
) -> None:
    """Fit a linear probe on µ̂ = correct / k and save it with its feature spec and its target.

    The target (the model the labels were sampled from, with the sampling settings) is read from
    the harvest's ``<labels>.meta.json``; the features come from the reader (``--model``).
    """
    from capgate.estimators import ProbeTarget, check_target_match
    from capgate.estimators.probe import LinearProbe

    _one_source(features, model, featurizer)
    check_option(check_unit_interval, "--validation-fraction", validation_fraction, open_ends=True)
    check_option(check_positive_int, "--max-epochs", max_epochs)
    check_option(check_positive_int, "--patience", patience)
    check_option(check_int_at_least, "--seed", seed, 0)
    probe = LinearProbe(  # settings checked before the work
        standardize=standardize,
        lr=_parse_lr(lr),
        max_epochs=max_epochs,
        patience=patience,
        validation_fraction=validation_fraction,
        random_state=seed,
    )
    labelled = run_reporting_errors(lambda: read_labelled(labels))
    target = run_reporting_errors(lambda: ProbeTarget.from_harvest(labels))
    if val_labels is not None:
        val_target = run_reporting_errors(lambda: ProbeTarget.from_harvest(val_labels))
        run_reporting_errors(lambda: check_target_match(target, val_target, what="validation labels"))
    X, spec = run_reporting_errors(lambda: _features_for(labelled, features, model, featurizer, batch_size))
    X_val = y_val = None
    if val_labels is not None:
        held = run_reporting_errors(lambda: read_labelled(val_labels))
        X_val, _ = run_reporting_errors(lambda: _features_for(held, features, model, featurizer, batch_size))
        y_val = held.mu_hat
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        run_reporting_errors(
            lambda: probe.fit(
                X,
                labelled.mu_hat,
                X_val=X_val,
                y_val=y_val,
                feature_spec=spec,
                source=str(labels),
                target=target,
            ),
            (CapgateError, ValueError, ImportError),
        )
    for warning in caught:
        typer.echo(f"warning: {warning.message}", err=True)
    with writing(out, "the probe"):
        probe.save(out)
    val = probe.validation_
    typer.echo(
        f"fitted on {probe.training_['n']} queries (mean µ̂ {probe.training_['mean_mu_hat']:.4f}), "
        f"lr {probe.lr_:g}, best epoch {probe.best_epoch_} of {probe.n_epochs_}"
        + (f"; validation ({val['n']}): Brier {val['brier']:.4f}, BCE {val['bce']:.4f}" if val else "")
    )
    reader = spec.get("model_id") if isinstance(spec, dict) else getattr(spec, "model_id", None)
    typer.echo(f"reader {reader}; target {target.model if target is not None else 'not recorded'}")
    typer.echo(f"wrote {out}")


def eval_command(
    probe_dir: Annotated[Path, typer.Option("--probe", help="Folder of a saved probe.")],
    labels: Annotated[Path, typer.Option(help="Labelled JSONL of the evaluation queries.")],
    features: FeaturesOpt = None,
    model: ModelOpt = None,
    featurizer: FeaturizerOpt = None,
    pass_k: Annotated[str, typer.Option(help="Comma-separated k for the pass@k MSE columns.")] = "1,4,16,64",
    bins: Annotated[int, typer.Option(help="Equal-width bins for ECE.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the uniform-random baseline.")] = 0,
    as_json: JsonFlag = False,
    json_out: JsonOut = None,
    batch_size: BatchOpt = 16,
    ignore_spec_field: Annotated[
        list[str] | None,
        typer.Option(help="Feature-spec field not to compare with the probe's (repeatable; e.g. source)."),
    ] = None,
    ignore_target: Annotated[
        bool, typer.Option(help="Evaluate on labels of another target than the probe's.")
    ] = False,
) -> None:
    """Calibration of the probe beside the uniform-random and constant-prior baselines."""
    from capgate.estimators.baselines import ConstantPrior, UniformRandom
    from capgate.estimators.probe import LinearProbe, check_spec_match
    from capgate.metrics.table import calibration_row, format_table

    _one_source(features, model, featurizer)
    ks = parse_int_list(pass_k, option="--pass-k")
    if bins < 1:
        fail(f"--bins must be a positive integer; got {bins}")
    probe = run_reporting_errors(lambda: LinearProbe.load(probe_dir))
    labelled = run_reporting_errors(lambda: read_labelled(labels))
    X, spec = run_reporting_errors(lambda: _features_for(labelled, features, model, featurizer, batch_size))
    run_reporting_errors(lambda: check_spec_match(probe.feature_spec_, spec, ignore=ignore_spec_field or ()))
    if not ignore_target:
        from capgate.estimators import ProbeTarget, check_target_match

        labels_target = run_reporting_errors(lambda: ProbeTarget.from_harvest(labels))
        run_reporting_errors(lambda: check_target_match(probe.target_, labels_target))
    prior = ConstantPrior.from_mean(probe.training_["mean_mu_hat"], n_train=probe.training_["n"])
    sources = {
        "probe": probe.predict(X),
        "uniform-random": UniformRandom(random_state=seed).predict(labelled.ids),
        "constant-prior": prior.predict(labelled.ids),
    }
    rows = [
        calibration_row(name, p, labelled.correct, labelled.k, pass_ks=ks, n_bins=bins)
        for name, p in sources.items()
    ]
    title = f"{labels.name}: {len(labelled)} queries, probe {probe_dir.name} vs baselines"
    show_figures(
        {
            "data": str(labels),
            "probe": str(probe_dir),
            "n": len(labelled),
            "constant_prior": prior.prior_,
            "rows": [row.to_dict() for row in rows],
        },
        lambda: console().print(format_table(rows, title=title)),
        as_json=as_json,
        json_out=json_out,
    )


def register(app: typer.Typer) -> None:
    """Add ``probe featurize|fit|eval`` to the CLI."""
    probe_app.command("featurize")(featurize_command)
    probe_app.command("fit")(fit_command)
    probe_app.command("eval")(eval_command)
    app.add_typer(probe_app, name="probe")
