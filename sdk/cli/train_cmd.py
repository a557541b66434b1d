"""``capgate train c3rl``: teach a model to end its answers with ``[confidence=X%]`` (C3RL)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from capgate.cli._common import LocalModel, command_group, fail

__all__ = ["register"]

train_app = command_group("train", "Train a model on capgate's labels (needs the train extra: TRL, PEFT).")


@train_app.command("c3rl")
def c3rl_command(
    labels: Annotated[
        Path,
        typer.Option(
            help="Labels of this model from `capgate harvest` (k samples per question; its "
            ".meta.json names the model)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="The run's folder; rerun to resume.")],
    model: LocalModel = "default",
    config: Annotated[
        Path | None,
        typer.Option(help="A JSON or YAML file of training settings (capgate.train.C3RLTrainConfig)."),
    ] = None,
    steps: Annotated[int | None, typer.Option(min=0, help="GRPO steps (overrides the config).")] = None,
    warm_start_steps: Annotated[
        int | None, typer.Option(min=0, help="Supervised warm-start steps (overrides the config).")
    ] = None,
    brier: Annotated[
        float | None, typer.Option(min=0.0, help="Weight of the optional Brier reward term (0: off).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (overrides the config).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (overrides the config).")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars with the reward terms.")] = True,
) -> None:
    """Train MODEL with C3RL on LABELS: a supervised warm start, then GRPO with a LoRA adapter.

    Writes OUT/adapter (PEFT), OUT/model (merged: load or serve it like any model folder) and
    OUT/manifest.json (base fingerprint, settings, data hash, steps, seed, held-out evaluation).
    """
    import yaml
    from pydantic import ValidationError

    from capgate.errors import CapgateError
    from capgate.train.config import C3RLTrainConfig
    from capgate.train.trainer import train_c3rl

    try:
        settings: dict[str, Any] = {}
        if config is not None:
            loaded = yaml.safe_load(config.read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                fail(f"--config {config}: expected a mapping of settings")
            settings = loaded
        overrides = {"steps": steps, "warm_start_steps": warm_start_steps, "device": device, "seed": seed}
        settings |= {key: value for key, value in overrides.items() if value is not None}
        if brier is not None:
            settings["rewards"] = {**settings.get("rewards", {}), "brier": brier}
        chosen = C3RLTrainConfig.model_validate(settings)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        fail(f"bad training settings: {exc}")
    try:
        run = train_c3rl(labels, model, out, config=chosen, progress=progress)
    except (CapgateError, ValueError, ModuleNotFoundError) as exc:
        fail(str(exc))
    trained = run.manifest["evaluation"]["trained"] or {}
    summary = ", ".join(
        f"{key} {trained[key]:.3f}"
        for key in ("tag_rate", "accuracy", "auroc", "brier")
        if trained.get(key) is not None
    )
    typer.echo(
        f"{run.out}: {run.manifest['grpo']['steps']} GRPO steps; merged model {run.model}, adapter "
        f"{run.adapter}" + (f"; held-out: {summary}" if summary else "")
    )


def register(app: typer.Typer) -> None:
    """Add ``capgate train`` to the CLI."""
    app.add_typer(train_app, name="train")
