"""The command line speaks one language: an option name means the same in every command.

The walk covers every command and subcommand of ``capgate`` as the user meets it (the built click
tree), so a new command that reuses a name for something else fails here.
"""

from __future__ import annotations

import json
import typing
from collections import defaultdict
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from capgate.cli import app
from capgate.cli._common import DbOption, JsonFlag, JsonOut, write_json
from capgate.datasets import DatasetItem, write_dataset

SHARED = {"--json": JsonFlag, "--json-out": JsonOut, "--db": DbOption}
# `capgate simulate --db LOG` replays the log *instead of* --data: reading $CAPGATE_DB there would
# switch a --data run to the log whenever the variable is set, so that one --db has no envvar.
DB_WITHOUT_ENVVAR = {"simulate"}


def _options() -> dict[str, list[tuple[str, object]]]:
    """Every option name -> (command path, click parameter) for each command that has it."""
    found: dict[str, list[tuple[str, object]]] = defaultdict(list)

    def walk(command: object, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            if getattr(param, "param_type_name", "") == "option":
                for opt in param.opts:
                    found[opt].append((" ".join(path) or "capgate", param))

    walk(typer.main.get_command(app), [])
    return found


def _kind(param: object) -> tuple[bool, str]:
    """Flag or value, and the value's type (how many a command takes may differ: ``eval`` compares
    several ``--confidence`` columns, ``budget`` reads one)."""
    annotation = param.type_descriptor.annotation  # type: ignore[attr-defined]
    while typing.get_args(annotation):  # str | None -> str, list[str] -> str
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return (param.is_flag, getattr(annotation, "__name__", str(annotation)))  # type: ignore[attr-defined]


def test_every_option_name_has_one_kind_in_every_command() -> None:
    problems = []
    for name, uses in sorted(_options().items()):
        kinds = {_kind(param) for _, param in uses}
        if len(kinds) > 1:
            problems.append(f"{name}: " + "; ".join(f"{cmd} {_kind(param)}" for cmd, param in uses))
    assert problems == [], "\n".join(problems)


def test_the_shared_options_are_the_declared_ones_everywhere() -> None:
    options = _options()
    for name in ("--json", "--json-out"):
        declared = SHARED[name].__metadata__[0].help  # type: ignore[attr-defined]
        assert options[name], name
        for command, param in options[name]:
            assert param.help == declared, f"`capgate {command}` declares its own {name}"  # type: ignore[attr-defined]
    assert options["--json"][0][1].is_flag  # type: ignore[attr-defined]
    for command, param in options["--db"]:
        envvar = "CAPGATE_DB" if command.split()[0] not in DB_WITHOUT_ENVVAR else None
        assert param.envvar == envvar, f"`capgate {command} --db` reads {param.envvar!r}"  # type: ignore[attr-defined]


def test_the_walk_sees_every_command() -> None:
    commands = {command for uses in _options().values() for command, _ in uses}
    assert {"eval", "budget", "probe eval", "demo", "log show", "calibrate", "report"} <= commands


def test_every_command_module_is_registered() -> None:
    import pkgutil

    import capgate.cli

    on_disk = {m.name.removesuffix("_cmd") for m in pkgutil.iter_modules(capgate.cli.__path__)}
    assert sorted(capgate.cli.COMMANDS) == sorted(on_disk - {"_common", "__main__"})
    built = typer.main.get_command(app)
    assert len(getattr(built, "commands", {})) >= len(capgate.cli.COMMANDS)


def test_every_batch_size_is_at_least_1() -> None:
    uses = _options()["--batch-size"]
    assert {command for command, _ in uses} >= {"harvest", "probe featurize", "probe fit", "probe eval"}
    for command, param in uses:
        assert getattr(param, "min", None) == 1, f"`capgate {command} --batch-size` takes any integer"


MATH500 = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
FEATURIZER = "_probe_helpers:CharCountFeaturizer"


def _inputs(root: Path) -> tuple[Path, Path]:
    """Labelled queries with question texts, and a dataset to harvest."""
    labels = root / "labels.jsonl"
    rows = [{"id": f"q{i}", "question": f"what is {i} + {i}?", "k": 4, "correct": i % 5} for i in range(20)]
    labels.write_text("".join(json.dumps(row) + "\n" for row in rows))
    items = [DatasetItem(id=f"d{i}", question=f"What is {i} + 1?", references=[str(i + 1)], kind="numeric")
             for i in range(2)]  # fmt: skip
    return labels, write_dataset(items, root / "sums.jsonl")


IN_FOLDER = "is a folder, not a file"
# each command line ({folder}, {file}, {labels}, {dataset} filled in) and its error
BAD_OUTPUTS = {
    "eval": (
        ["eval", str(MATH500), "-c", "probe_conf_raw", "--json-out", "{folder}"],
        f"--json-out {{folder}}: {IN_FOLDER}",
    ),
    "budget": (
        ["budget", str(MATH500), "-c", "probe_conf_raw", "--budgets", "1", "--json-out", "{folder}"],
        f"--json-out {{folder}}: {IN_FOLDER}",
    ),
    "demo": (
        ["demo", "--no-live", "--no-verbalized", "--json-out", "{folder}"],
        f"--json-out {{folder}}: {IN_FOLDER}",
    ),
    "policy schema": (["policy", "schema", "--out", "{folder}"], f"--out {{folder}}: {IN_FOLDER}"),
    "policy schema in a file": (
        ["policy", "schema", "--out", "{file}/schema.json"],
        "--out {file}/schema.json: cannot be made: {file} is a file, not a folder",
    ),
    "probe featurize": (
        ["probe", "featurize", "--labels", "{labels}", "--out", "{folder}", "--featurizer", FEATURIZER],
        f"--out {{folder}}: {IN_FOLDER}",
    ),
    "probe fit": (
        [
            "probe",
            "fit",
            "--labels",
            "{labels}",
            "--out",
            "{file}",
            "--featurizer",
            FEATURIZER,
            "--lr",
            "0.01",
        ],
        "--out {file}: is a file, not a folder",
    ),
    "harvest": (
        ["harvest", "{dataset}", "-o", "{folder}", "--backend", "test_harvest:make_backend", "--no-progress"],
        f"--out {{folder}}: {IN_FOLDER}",
    ),
}


@pytest.mark.parametrize("command", sorted(BAD_OUTPUTS))
def test_an_unusable_output_path_is_an_error_line_before_the_work(command: str, tmp_path: Path) -> None:
    """Each output option is checked as the command line is read: a run is not lost at its end."""
    labels, dataset = _inputs(tmp_path)
    folder, file = tmp_path / "a_folder.npz", tmp_path / "a_file.jsonl"
    folder.mkdir()
    file.write_text("taken\n")
    names = {"folder": str(folder), "file": str(file), "labels": str(labels), "dataset": str(dataset)}
    args, error = BAD_OUTPUTS[command]
    result = CliRunner().invoke(app, [arg.format(**names) for arg in args])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {error.format(**names)}\n"
    assert result.stdout == ""  # nothing was run, nothing written
    assert {p.name for p in tmp_path.iterdir()} == {folder.name, file.name, labels.name, dataset.name}


def test_a_write_that_fails_anyway_is_an_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as info:
        write_json({"n": 1}, str(tmp_path))
    assert info.value.exit_code == 2
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path}: cannot write the JSON figures: [Errno 21] "
    )


def test_an_output_in_a_missing_folder_makes_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "new" / "schema.json"
    result = CliRunner().invoke(app, ["policy", "schema", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["title"]
