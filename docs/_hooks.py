"""MkDocs hooks for capgate's site (mkdocs.yml `hooks:`), run by `mkdocs build`.

1. capgate is installed from three folders (``sdk/`` is ``capgate``, ``adapters/`` is
   ``capgate.adapters``, ``policies/`` is ``capgate.policies``: pyproject's ``package-dir``).
   mkdocstrings reads sources statically, so before the build this links them under one
   ``build/docs-api/capgate`` folder, the search path mkdocs.yml gives it.
2. The docstrings cross-reference in Sphinx roles (``:func:`x```); on the site the role's name is
   dropped and the name stays as code.
3. The command-line reference (``reference/cli.md``) is generated from the ``capgate`` CLI itself
   (its click tree: commands, arguments, options and their help) where the page says
   ``<!-- capgate-cli -->``, so it cannot drift from the code.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "docs-api" / "capgate"
FOLDERS = {"adapters": ROOT / "adapters", "policies": ROOT / "policies"}
CLI_MARKER = "<!-- capgate-cli -->"
ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj|ref|const):(?=<code>)")


def on_startup(**_: Any) -> None:
    """Link ``sdk/``, ``adapters/`` and ``policies/`` into one ``capgate`` package folder (before
    any plugin's ``on_config``: mkdocstrings resolves its search paths there)."""
    if STAGE.is_symlink() or STAGE.is_file():
        STAGE.unlink()
    elif STAGE.exists():
        shutil.rmtree(STAGE)
    STAGE.mkdir(parents=True)
    for entry in (ROOT / "sdk").iterdir():
        if entry.name != "__pycache__":
            (STAGE / entry.name).symlink_to(entry)
    for name, folder in FOLDERS.items():
        (STAGE / name).symlink_to(folder)


def on_page_content(html: str, **_: Any) -> str:
    """``:func:<code>x</code>`` (a Sphinx role rendered as Markdown) becomes ``<code>x</code>``."""
    return ROLE.sub("", html)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Expand the CLI marker into the generated command reference."""
    if CLI_MARKER not in markdown:
        return markdown
    return markdown.replace(CLI_MARKER, cli_reference())


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def cli_reference() -> str:
    """Markdown for every ``capgate`` command: its help, usage, arguments and options."""
    import typer

    from capgate.cli import app

    root = typer.main.get_command(app)
    context = type(root.make_context("capgate", [], resilient_parsing=True))  # typer's own click
    parts: list[str] = []

    def walk(command: Any, path: list[str], ctx: Any) -> None:
        if hasattr(command, "list_commands"):  # a group
            if command.invoke_without_command:  # a group that is a command too (capgate calibrate)
                section(command, path, ctx)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], context(sub, info_name=name, parent=ctx))
            return
        section(command, path, ctx)

    def section(command: Any, path: list[str], ctx: Any) -> None:
        title = " ".join(path)
        usage = " ".join(command.collect_usage_pieces(ctx))
        help_text = (command.help or "").strip().replace("\b\n", "").replace("<", "&lt;")
        rows = ["| argument or option | help |", "| --- | --- |"]
        for param in command.params:
            if param.param_type_name == "argument":
                described = _cell(getattr(param, "help", None) or "argument")
                rows.append(f"| `{(param.name or '').upper()}` | {described} |")
            elif not getattr(param, "hidden", False):
                names = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
                rows.append(f"| {names} | {_cell(getattr(param, 'help', None) or '')} |")
        parts.append(f"## {title}\n\n{help_text}\n\n```text\n{title} {usage}\n```\n\n" + "\n".join(rows))

    walk(root, ["capgate"], context(root, info_name="capgate"))
    return "\n\n".join(parts) + "\n"
