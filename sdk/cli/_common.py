"""Helpers shared by CLI commands: error reporting and output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from capgate.errors import CapgateError

EXIT_BAD_INPUT = 2
T = TypeVar("T")


def unwritable(path: Path, *, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file (as a folder with ``folder``), or ``None`` when it
    can: it is a folder where a file is wanted (or the reverse), or it is missing and the folders
    it would be made in (created as needed) cannot be."""
    if path.exists():
        if path.is_dir() != folder:
            return "is a folder, not a file" if path.is_dir() else "is a file, not a folder"
        return None if os.access(path, os.W_OK) else "is not writable"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be made: {ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be made: {ancestor} is not writable"
    return None


def check_output(path: Path | None, option: str, *, folder: bool = False) -> Path | None:
    """``path``, after failing (exit status 2) when the output it names for ``option`` cannot be
    written (see :func:`unwritable`): checked before the work, not found out after it."""
    if path is not None and (reason := unwritable(path, folder=folder)) is not None:
        fail(f"{option} {path}: {reason}")
    return path


def _option_name(param: typer.CallbackParam) -> str:
    return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])


def output_file(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Option callback of an output file: :func:`check_output` as the command line is read."""
    return value if ctx.resilient_parsing else check_output(value, _option_name(param))


def output_folder(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """Option callback of an output folder: :func:`check_output` as the command line is read."""
    return value if ctx.resilient_parsing else check_output(value, _option_name(param), folder=True)


@contextmanager
def writing(path: Path | str, what: str) -> Iterator[None]:
    """Report an ``OSError`` raised in the block as ``error: PATH: cannot write WHAT: ...`` (exit 2)."""
    try:
        yield
    except OSError as exc:
        fail(f"{path}: cannot write {what}: {exc}")


# Options that mean the same in every command are declared once, here (tests/test_cli_options.py
# walks the CLI and checks each option name has one kind and, for these, one declaration).
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of the table.")]
JsonOut = Annotated[
    Path | None,
    typer.Option("--json-out", callback=output_file, help="Also write the figures as JSON to this file."),
]
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="CAPGATE_DB",
        help="The decision log: a SQLite file or a postgresql:// URL. Default: $CAPGATE_DB, else the "
        "user data folder.",
    ),
]
LocalModel = Annotated[
    str,
    typer.Option(
        "--model", help="The local model: 'default', a model folder, a .gguf file or a Hugging Face id."
    ),
]


def console() -> Console:
    """A rich console; wide enough for metric tables when output is piped to a file."""
    return Console(width=None if sys.stdout.isatty() else 200)


def command_group(name: str, description: str, *, invoke_without_command: bool = False) -> typer.Typer:
    """A command group (``capgate`` or ``capgate <name>``): no completion or pretty tracebacks; called
    bare it shows its help, or with ``invoke_without_command`` runs its own callback."""
    return typer.Typer(
        name=name,
        help=description,
        invoke_without_command=invoke_without_command,
        no_args_is_help=not invoke_without_command,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: message`` to stderr and exit with status ``code`` (2: bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def fail_lines(error: Exception) -> NoReturn:
    """:func:`fail` with ``error: `` before each line of ``error`` (a policy file can have many)."""
    for line in str(error).splitlines():
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT) from None


def run_reporting_errors(
    action: Callable[[], T], errors: tuple[type[Exception], ...] = (CapgateError, ValueError)
) -> T:
    """Run ``action``; turn capgate's input errors (``errors``) into a one-line message and exit status 2."""
    try:
        return action()
    except errors as exc:
        fail(str(exc))


def check_option(check: Callable[..., T], option: str, value: Any, *args: Any, **kwargs: Any) -> T:
    """Check an option's value with a :mod:`capgate._util.validate` helper; a bad value exits with
    status 2 and says so naming the option (``check_option(check_positive_int, "--bins", 0)``)."""
    return run_reporting_errors(lambda: check(option, value, *args, **kwargs))


def parse_int_list(text: str, *, option: str) -> list[int]:
    """Parse ``"1,2,4"`` into positive ints, naming the option on error."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fail(f"{option} must be comma-separated integers; got {text!r}")
    if not values or any(v < 1 for v in values):
        fail(f"{option} must hold positive integers; got {text!r}")
    return values


def show_figures(
    payload: object, show_table: Callable[[], None], *, as_json: bool, json_out: Path | None
) -> None:
    """The figure commands' one output rule: ``--json`` prints only the JSON, otherwise the table;
    ``--json-out`` also writes the JSON to a file."""
    if as_json:
        write_json(payload, "-")
    else:
        show_table()
    if json_out is not None:
        write_json(payload, str(json_out))


def write_json(payload: object, destination: str) -> None:
    """Write JSON to a file, or to stdout when ``destination`` is ``-``."""
    text = json.dumps(payload, indent=2, ensure_ascii=False)
    if destination == "-":
        sys.stdout.write(text + "\n")
    else:
        write_text(Path(destination), text + "\n", "the JSON figures")


def write_text(path: Path, text: str, what: str) -> None:
    """Write ``text`` to ``path`` (its folders made as needed); a failure is an ``error:`` line
    naming ``path`` and ``what`` was written (exit status 2)."""
    with writing(path, what):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
