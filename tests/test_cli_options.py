"""The command line speaks one language: an option name means the same in every command.

The walk covers every command and subcommand of ``capgate`` as the user meets it (the built click
tree), so a new command that reuses a name for something else fails here.
"""

from __future__ import annotations

import typing
from collections import defaultdict

import typer.main

from capgate.cli import app
from capgate.cli._common import DbOption, JsonFlag, JsonOut

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
