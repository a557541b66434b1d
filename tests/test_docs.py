"""The documentation: the README and the MkDocs site (``mkdocs.yml``, ``docs/``).

- The site builds with ``--strict`` (a broken link or reference, a page missing from the nav, a
  docstring mkdocstrings cannot render: each fails), offline.
- Every ``python`` block of the README and of each page runs, in order, one page per process,
  in a fresh folder (the files a block writes land there). Pages that call a hosted model run
  against the CI vLLM server (``MODEL``, ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` set as a user
  would set them). Their imports keep to the public names (the rule ``test_architecture`` holds the
  README to).
- Every ``capgate`` command line in a ``bash`` block names a real command and real options; every
  script or file such a block runs exists; every policy in a ``yaml`` block validates; every
  ``json`` block parses.
- The built home page and one guide are rendered in headless Chromium (Debian's ``chromium``,
  installed by ``scripts/setup.sh``) to PNGs that must show the styled page: the header bar in the
  theme's colour, text in the content area, the page's title in the rendered DOM.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
SOURCES = [ROOT / "README.md", *PAGES]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
# A block that calls a hosted model: its page runs against the CI vLLM server.
HOSTED = re.compile(r"\bOpenAIBackend\(|\bAsyncOpenAI\(")
# The theme's primary colour (Material's "indigo", #3f51b5), the header bar of every page.
HEADER_RGB = (63, 81, 181)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the line of the opening fence (1-based); the code starts on the next one
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path, lang: str | None = None) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = [
        Block(path, text[: m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)
    ]
    return [b for b in found if lang is None or b.lang == lang]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --------------------------------------------------------------------------- the site builds


def nav_pages(nav: object) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def mkdocs_config() -> dict[str, object]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = mkdocs_config()
    assert config["strict"] is True
    listed = set(nav_pages(config["nav"]))
    present = {str(p.relative_to(DOCS)) for p in PAGES}
    assert listed == present, f"only in nav: {listed - present}; not in nav: {present - listed}"


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built --strict into a temporary folder (offline: no fonts or inventories fetched),
    as users build it: without ``--quiet``, which in MkDocs 1.6 drops the very warnings
    ``--strict`` counts; any warning fails the build and is quoted."""
    out = tmp_path_factory.mktemp("site") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(out)]
    done = subprocess.run(build, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    warnings = [
        line for line in (done.stdout + done.stderr).splitlines() if line.startswith(("WARNING", "ERROR"))
    ]
    assert warnings == [], "mkdocs build --strict warned:\n" + "\n".join(warnings)
    assert done.returncode == 0, (
        f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return out


def test_site_builds_strict_with_every_page_and_the_api_reference(site: Path) -> None:
    for page in PAGES:
        name = page.relative_to(DOCS).with_suffix("")
        html = site / ("index.html" if str(name) == "index" else f"{name}/index.html")
        assert html.is_file(), f"{rel(page)} was not built ({html})"
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    # mkdocstrings rendered the public surface: a top-level name, an estimator, an integration.
    for anchor in ("capgate.Gate", "capgate.gate.decorator.guard", "capgate.estimators.VerbalizedConfidence",
                   "capgate.adapters.agents.langgraph.capability_subgraph"):  # fmt: skip
        assert f'id="{anchor}"' in api, f"the API reference lacks {anchor}"
    assert not re.search(r'id="capgate\.[\w.]*\._', api), "the API reference shows a private name"
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in cli_commands():
        assert f">{command}<" in cli or f">{command}</h2>" in cli, f"the CLI reference lacks `{command}`"


# --------------------------------------------------------------------------- command lines


def cli_tree() -> tuple[Any, Any]:
    """The ``capgate`` command (typer's click tree) and its context class (typer vendors click)."""
    import typer

    from capgate.cli import app

    root = typer.main.get_command(app)
    return root, type(root.make_context("capgate", [], resilient_parsing=True))


def is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def cli_commands() -> list[str]:
    names: list[str] = []
    root, context = cli_tree()

    def walk(command: Any, path: list[str], ctx: Any) -> None:
        if is_group(command):
            if command.invoke_without_command:  # a group that is a command too (capgate calibrate)
                names.append(" ".join(path))
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name], context(sub, info_name=name, parent=ctx))
        else:
            names.append(" ".join(path))

    walk(root, ["capgate"], context(root, info_name="capgate"))
    return names


def command_lines(code: str) -> Iterator[list[str]]:
    """Each shell command of a bash block as tokens (continuations joined, comments dropped,
    ``a && b`` split)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        command: list[str] = []
        for token in tokens:
            if token in ("&&", "||", ";", "|"):
                if command:
                    yield command
                command = []
            else:
                command.append(token)
        if command:
            yield command


def check_capgate_command(tokens: list[str], where: str) -> list[str]:
    command, context = cli_tree()
    ctx = context(command, info_name="capgate")
    rest = tokens[1:]
    path = ["capgate"]
    while is_group(command):
        if not rest or rest[0].startswith("-"):
            if command.invoke_without_command:
                break  # the group runs itself with these options
            return [f"{where}: `{' '.join(path)}` needs a subcommand"]
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return [f"{where}: `{' '.join(path)}` has no command {rest[0]!r}"]
        path.append(rest.pop(0))
        command, ctx = sub, context(sub, info_name=path[-1], parent=ctx)
    known = {name for p in command.params for name in (*p.opts, *p.secondary_opts) if name.startswith("-")}
    problems = []
    for token in rest:
        if token.startswith("-") and token != "-" and not re.fullmatch(r"-\d.*", token):
            name = token.split("=", 1)[0]
            if name not in known:
                problems.append(f"{where}: `{' '.join(path)}` has no option {name}")
    return problems


BASH_BLOCKS = [b for source in SOURCES for b in blocks(source, "bash")]


@pytest.mark.parametrize("block", BASH_BLOCKS, ids=lambda b: b.where)
def test_bash_block_commands_exist(block: Block) -> None:
    problems: list[str] = []
    for tokens in command_lines(block.code):
        head = tokens[0]
        while "=" in head and not head.startswith("-") and len(tokens) > 1:  # VAR=value command
            tokens = tokens[1:]
            head = tokens[0]
        if Path(head).name == "capgate":
            problems += check_capgate_command(tokens, block.where)
        elif head in ("bash", "sh") or head.endswith("/python"):
            script = next((t for t in tokens[1:] if not t.startswith("-")), None)
            if script is not None and re.search(r"\.(sh|py)$", script) and not (ROOT / script).is_file():
                problems.append(f"{block.where}: runs {script}, which does not exist")
    assert problems == []


def test_the_readme_keeps_the_two_commands_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "bash scripts/setup.sh && .venv/bin/capgate demo" in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    tests = "bash scripts/setup.sh && bash scripts/with-vllm-server.sh .venv/bin/python -m pytest"
    assert tests in readme
    assert tests in ci


# --------------------------------------------------------------------------- the demo's figures

DEMO_PAGES = [ROOT / "README.md", DOCS / "index.md"]


def _pct(rate: Any) -> str:  # as `capgate demo` prints a rate
    return "n/a" if rate is None else f"{rate.value:.0%} [{rate.low:.0%}, {rate.high:.0%}]"


def check_demo_table(text: str) -> list[str]:
    """The live table a page shows, against what the demo computes from the counts it shows:
    every rate and interval, every count that follows from others, the time added."""
    from types import SimpleNamespace

    from capgate.cli.demo_cmd import time_change
    from capgate.demo.comparison import compare

    title = re.search(r"LIVE: (\d+) questions, without the gate vs with the gate", text)
    if title is None:
        return ["no live table"]
    cells = {}
    for line in text.splitlines():
        if line.startswith("│"):
            row = [c.strip() for c in line.strip().strip("│").split("│")]
            cells[row[0]] = row[1:]
    n = int(title.group(1))

    def count(row: str, column: int, pattern: str = r"(\d+)") -> int:
        found = re.match(pattern, cells[row][column])
        assert found is not None, f"row {row!r}: {cells[row][column]!r}"
        return int(found.group(1))

    answered = count("answered", 1)
    right, wrong = count("right answers", 1), count("wrong answers", 1)
    wrong_stopped = count("wrong answers", 1, r"\d+ given; (\d+) of")
    samples = [int(c) for c in cells["samples spent"]]
    seconds = [float(re.match(r"([\d.]+) s", c).group(1)) for c in cells["time"]]  # type: ignore[union-attr]
    # Questions with the counts shown (compare() reads only these marginals).
    rows = (
        [(True, None)] * (n - answered - wrong_stopped)
        + [(False, None)] * wrong_stopped
        + [(True, True)] * right
        + [(False, False)] * wrong
    )
    if len(rows) != n:
        return [f"the counts shown do not add up to {n} questions"]
    ones = [SimpleNamespace(ungated_correct=u, correct=g, samples=0, ungated_seconds=0.0, gated_seconds=0.0)
            for u, g in rows]  # fmt: skip
    ones[0].samples, ones[0].ungated_seconds, ones[0].gated_seconds = samples[1], seconds[0], seconds[1]
    c = compare(ones)
    off, on = c.without_gate, c.with_gate
    expected = {
        "answered": [f"{n} of {n}", f"{on.answered} of {n}: coverage {_pct(on.coverage)}"],
        "accuracy": [_pct(off.accuracy), f"{_pct(on.accuracy)} among answered"],
        "wrong answers": [
            f"{off.wrong} given",
            f"{on.wrong} given; {on.wrong_stopped} of {off.wrong} stopped ({_pct(on.wrong_stopped_share)})",
        ],
        "right answers": [
            f"{off.right} given",
            f"{on.right} given; {on.right_stopped} of {off.right} stopped ({_pct(on.right_stopped_share)})",
        ],
        "samples spent": [str(n), str(on.samples)],
        "time": [f"{off.seconds:.1f} s", f"{on.seconds:.1f} s ({time_change(on.seconds_added)})"],
    }
    return [
        f"row {k!r}: shown {cells.get(k)}, computed {v}" for k, v in expected.items() if cells.get(k) != v
    ]


@pytest.mark.parametrize("page", DEMO_PAGES, ids=rel)
def test_the_demo_table_shown_is_what_the_demo_computes(page: Path) -> None:
    assert check_demo_table(page.read_text(encoding="utf-8")) == []


def test_the_demo_table_check_fails_on_a_planted_wrong_count() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    planted = re.sub(r"(\d+) given; (\d+) of (\d+) stopped \(75%", r"\1 given; 5 of \3 stopped (75%", text)
    assert planted != text
    assert check_demo_table(planted) != []


@pytest.fixture(scope="module")
def replay() -> dict[str, Any]:
    """The demo's recorded 20B part as `capgate demo --no-live --no-verbalized --json` prints it
    (seconds)."""
    done = subprocess.run(
        [sys.executable, "-m", "capgate.cli", "demo", "--no-live", "--no-verbalized", "--json"],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)["replay"]
    assert isinstance(figures, dict)
    return figures


@pytest.mark.parametrize("page", DEMO_PAGES, ids=rel)
def test_the_replay_figures_shown_are_the_demos(page: Path, replay: dict[str, Any]) -> None:
    saved = [p["saved"] / p["uniform_samples"] for p in replay["passk"]]
    claim = (
        f"coverage {replay['coverage']['value']:.1%}, accuracy among answered "
        f"{replay['accuracy_answered']['value']:.1%} vs {replay['accuracy_all']['value']:.1%} answering "
        f"everything, and {100 * min(saved):.0f}–{max(saved):.0%} of a pass@k sampling budget saved"
    )
    assert claim in " ".join(page.read_text(encoding="utf-8").split())


# --------------------------------------------------------------------------- data blocks


DATA_BLOCKS = [b for source in SOURCES for b in blocks(source) if b.lang in ("yaml", "json")]


@pytest.mark.parametrize("block", DATA_BLOCKS, ids=lambda b: b.where)
def test_yaml_and_json_blocks_are_valid(block: Block) -> None:
    if block.lang == "json":
        for line in block.code.splitlines():
            if line.strip():
                json.loads(line)
        return
    data = yaml.safe_load(block.code)
    if isinstance(data, dict) and "bands" in data:
        from capgate.policies import Policy

        Policy.from_yaml_text(block.code, source=block.where)


# --------------------------------------------------------------------------- python blocks


def _public_name_checks() -> tuple[object, object, object]:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_architecture import _check_dotted, _check_import, _dotted_uses

    return _check_import, _dotted_uses, _check_dotted


PY_BLOCKS = [b for page in PAGES for b in blocks(page, "python")]


@pytest.mark.parametrize("block", PY_BLOCKS, ids=lambda b: b.where)
def test_docs_python_blocks_use_only_public_names(block: Block) -> None:
    import ast

    check_import, dotted_uses, check_dotted = _public_name_checks()
    tree = ast.parse(block.code)
    problems = [p for node in ast.walk(tree) for p in check_import(node, block.where)]  # type: ignore[operator]
    problems += [p for use in sorted(dotted_uses(tree)) for p in check_dotted(use, block.where)]  # type: ignore[operator]
    assert problems == []


RUNNER = r"""
import json, sys, traceback
ns = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1], encoding="utf-8")):
    code = "\n" * block["line"] + block["code"]  # tracebacks name the Markdown file's own lines
    try:
        exec(compile(code, block["path"], "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print(f"docs block failed: {block['path']}:{block['line']}", file=sys.stderr)
        sys.exit(1)
    print(f"docs block ran: {block['path']}:{block['line']}", flush=True)
"""

RUNNABLE = [source for source in SOURCES if blocks(source, "python")]


def hosted_env() -> dict[str, str]:
    """The CI vLLM server as a user's environment names a hosted model."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _ci_server import ci_vllm_server

    url, model = ci_vllm_server()
    return {"MODEL": model, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "EMPTY"}


def proxy_probe_folder(folder: Path, model: str, base_url: str) -> None:
    """``probe/`` as `capgate probe fit` writes it for a hosted target: the shipped probe's
    weights and reader spec, with the served model recorded as its target."""
    from capgate.loading import default_probe_path

    shutil.copytree(default_probe_path(), folder)
    meta = json.loads((folder / "probe.json").read_text(encoding="utf-8"))
    meta["target"] = {"model": model, "endpoint": "openai", "base_url": base_url}
    (folder / "probe.json").write_text(json.dumps(meta), encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("source", RUNNABLE, ids=rel)
def test_python_blocks_run(source: Path, tmp_path: Path, default_model_dir: Path) -> None:
    """Every python block of the page runs as written, in order, in one process."""
    del default_model_dir  # converted once for the session: the page's processes reuse the cache
    page = blocks(source, "python")
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY")}
    if any(HOSTED.search(b.code) for b in page):
        env |= hosted_env()
    if any('probe="probe/"' in b.code for b in page):
        proxy_probe_folder(tmp_path / "probe", env["MODEL"], env["OPENAI_BASE_URL"])
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([{"path": str(b.path), "line": b.line, "code": b.code} for b in page]))
    run_blocks = [sys.executable, "-c", RUNNER, str(spec)]
    done = subprocess.run(
        run_blocks, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200, check=False
    )
    assert done.returncode == 0, f"{rel(source)}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.stdout.count("docs block ran: ") == len(page)


# --------------------------------------------------------------------------- seen in a browser


def chromium() -> str:
    found = os.environ.get("CAPGATE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, (
        "no chromium on PATH: scripts/setup.sh installs Debian's `chromium` (or set CAPGATE_CHROMIUM)"
    )
    return found


def render(page: Path, work: Path, *, dump_dom: bool) -> subprocess.CompletedProcess[str]:
    args = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars", f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-', dir=work)}",
        "--window-size=1280,900",
        "--virtual-time-budget=3000",
    ]  # fmt: skip
    args += ["--dump-dom"] if dump_dom else [f"--screenshot={work / 'page.png'}"]
    return subprocess.run(
        [*args, page.as_uri()], capture_output=True, text=True, timeout=120, check=False, cwd=work
    )


def near(pixel: tuple[int, ...], rgb: tuple[int, int, int], tolerance: int = 24) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], rgb, strict=True))


def check_screenshot(png: Path) -> list[str]:
    """What a person would see wrong: a blank page, an unstyled one (no header bar), no text."""
    from PIL import Image

    problems: list[str] = []
    with Image.open(png) as image:
        rgb = image.convert("RGB")
        width, height = rgb.size
        if (width, height) != (1280, 900):
            return [f"screenshot is {width}x{height}, not 1280x900"]
        header = [rgb.getpixel((x, y)) for x in range(0, width, 8) for y in range(4, 44, 4)]
        share = sum(near(p, HEADER_RGB) for p in header) / len(header)  # type: ignore[arg-type]
        if share < 0.6:
            problems.append(f"header bar in the theme's colour over {share:.0%} of its pixels (want >= 60%)")
        content = [rgb.getpixel((x, y)) for x in range(280, width - 40, 4) for y in range(80, height - 80, 4)]
        dark = sum(max(p[:3]) < 110 for p in content) / len(content)  # type: ignore[index]
        if dark < 0.005:
            problems.append(f"almost no text in the content area ({dark:.2%} dark pixels)")
        colours = len(rgb.getcolors(maxcolors=width * height) or ())
        if colours < 50:
            problems.append(f"only {colours} colours: a blank or broken page")
    return problems


@pytest.mark.parametrize(
    ("page", "title", "expect"),
    [
        ("index.html", "capgate", "without the gate"),
        ("guides/local-model/index.html", "A local model", "capgate.load_estimator"),
    ],
)
def test_pages_render_in_headless_chromium(
    site: Path, tmp_path: Path, page: str, title: str, expect: str
) -> None:
    html = site / page
    assert html.is_file()
    dom = render(html, tmp_path, dump_dom=True)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(rf"<h1[^>]*>{re.escape(title)}", dom.stdout), f"{page}: no <h1>{title}</h1> in the DOM"
    assert expect in dom.stdout
    assert 'class="md-header' in dom.stdout  # the theme's template, not a bare page
    shot = render(html, tmp_path, dump_dom=False)
    png = tmp_path / "page.png"
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert png.is_file(), shot.stderr[-2000:]
    assert check_screenshot(png) == []


def test_the_screenshot_check_fails_on_a_blank_and_an_unstyled_page(tmp_path: Path) -> None:
    """The check above can fail: a white page and the same text without the theme's CSS."""
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body></body></html>", encoding="utf-8")
    assert render(blank, tmp_path, dump_dom=False).returncode == 0
    assert check_screenshot(tmp_path / "page.png") != []
    bare = tmp_path / "bare.html"
    bare.write_text("<html><body><h1>capgate</h1>" + "<p>text " * 400 + "</body></html>", encoding="utf-8")
    assert render(bare, tmp_path, dump_dom=False).returncode == 0
    problems = check_screenshot(tmp_path / "page.png")
    assert any("header bar" in p for p in problems), problems


# What each plugin, theme and extension mkdocs.yml loads is installed from (the build is only as
# reproducible as the least pinned of them).
DOCS_DISTRIBUTIONS = {
    "theme:material": "mkdocs-material",
    "plugin:search": "mkdocs",
    "plugin:mkdocstrings": "mkdocstrings",
    "handler:python": "mkdocstrings-python",
    "autorefs": "mkdocs-autorefs",
    "griffe": "griffelib",
    "pymdownx": "pymdown-extensions",
}


def test_every_plugin_the_site_loads_is_pinned() -> None:
    import tomllib

    config = mkdocs_config()
    loaded = {f"theme:{config['theme']['name']}"}
    for plugin in config["plugins"]:
        name = plugin if isinstance(plugin, str) else next(iter(plugin))
        loaded.add(f"plugin:{name}")
        if name == "mkdocstrings":
            loaded |= {f"handler:{h}" for h in plugin["mkdocstrings"]["handlers"]} | {"autorefs", "griffe"}
    for extension in config["markdown_extensions"]:
        name = extension if isinstance(extension, str) else next(iter(extension))
        if name.startswith("pymdownx."):
            loaded.add("pymdownx")
    unknown = loaded - set(DOCS_DISTRIBUTIONS)
    assert unknown == set(), f"mkdocs.yml loads {unknown}: name the distribution each comes from here"
    docs_extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]["docs"]
    pinned = {req.split("==")[0] for req in docs_extra if "==" in req}
    assert {DOCS_DISTRIBUTIONS[name] for name in loaded} <= pinned, docs_extra
