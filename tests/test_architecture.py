"""The house rules that keep capgate navigable: layers, no import cycles, small modules, and a
public surface that the README and the examples keep to."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"sdk": "capgate", "adapters": "capgate.adapters", "policies": "capgate.policies"}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    """Every capgate module, by dotted name, from the three package folders."""
    found: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    # adapters/ and policies/ also sit inside sdk/'s namespace: keep their own mapping.
    return found


MODULES = _modules()


def _imports(path: Path, name: str, *, typing: bool = False) -> set[str]:
    """The capgate modules a module imports anywhere in its body (lazy imports included; with
    ``typing``, also those imported for type checkers only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):  # imports for type checkers only never run
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in MODULES else base)
    return {t for t in targets if t in MODULES and t != name}


GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}
TYPED_GRAPH = {name: _imports(path, name, typing=True) for name, path in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_is_read_from_the_source() -> None:
    """The checker below sees real edges (lazy ones too), so its silence means something."""
    assert "capgate.gate.flow" in GRAPH["capgate.gate.decorator"]
    assert "capgate.policies" in GRAPH["capgate.gate._settings"]
    # a lazy import inside a function body counts
    assert "capgate.decision.store.log" in GRAPH["capgate.gate._settings"]
    # a TYPE_CHECKING import counts only for the type-level graph
    assert "capgate.decision.store.log" not in GRAPH["capgate.gate._effects"]
    assert "capgate.decision.store.log" in TYPED_GRAPH["capgate.gate._effects"]
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


@pytest.mark.parametrize("graph", ["runtime", "type-level"])
def test_no_import_cycle_among_capgate_modules(graph: str) -> None:
    found = _cycle(GRAPH if graph == "runtime" else TYPED_GRAPH)
    assert found is None, f"import cycle: {' -> '.join(found or [])}"


def _owner_of_private(module: str) -> str | None:
    """The package whose underscore module ``module`` is (``capgate.gate`` for
    ``capgate.gate._flow``); ``None`` for a public module or a top-level ``capgate._x`` helper,
    which the whole distribution shares."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return None if i == 1 else ".".join(parts[:i])
    return None


def test_no_module_imports_another_packages_private_modules() -> None:
    """A package's underscore modules are its own: others import its public modules."""
    problems = []
    for name, targets in TYPED_GRAPH.items():
        for target in targets:
            owner = _owner_of_private(target)
            if owner is not None and not (name == owner or name.startswith(owner + ".")):
                problems.append(f"{name} imports {target}")
    assert problems == []
    assert _owner_of_private("capgate.gate._flow") == "capgate.gate"
    assert _owner_of_private("capgate._util.validate") is None


# The applications on top of the core: they compose backends into commands and the demo.
APPLICATIONS = ("capgate.cli", "capgate.demo.live")


def test_layers() -> None:
    """Policies never import the decision log; core types import nothing of capgate; backends
    never import agent integrations; the core never imports an adapter (only the CLI and the demo,
    applications built on both, do); telemetry observes decisions and never imports the gate."""
    for name, targets in TYPED_GRAPH.items():
        core = not name.startswith(("capgate.adapters", "capgate.policies", *APPLICATIONS))
        if core:
            assert not any(t.startswith("capgate.adapters") for t in targets), (name, targets)
    assert not any(t.startswith("capgate.gate") for t in TYPED_GRAPH["capgate.gate.telemetry"])
    for name, targets in GRAPH.items():
        if name.startswith("capgate.policies"):
            assert not any(t.startswith("capgate.decision") for t in targets), (name, targets)
        if name.startswith("capgate.adapters.backends"):
            assert not any(t.startswith("capgate.adapters.agents") for t in targets), (name, targets)
        if not name.startswith("capgate.adapters"):
            assert not any(t.startswith("capgate.adapters.agents") for t in targets), (name, targets)
    assert GRAPH["capgate.core.types"] == {"capgate.core.plans"}
    assert GRAPH["capgate.core.plans"] == set()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_500_lines(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines; split it by responsibility"


def test_no_integration_rematches_a_decided_policy() -> None:
    """Decide once: outside policies/, nothing calls Policy.match."""
    for name, path in MODULES.items():
        if name.startswith("capgate.policies"):
            continue
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bpolicy\w*\.match\(", text), f"{path} re-matches a policy"


def test_no_adapter_imports_another_modules_private_names() -> None:
    for name, path in MODULES.items():
        if not name.startswith("capgate.adapters"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("capgate"):
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__all__"]
                assert not private, f"{path} imports private {private} from {node.module}"


# --------------------------------------------------------------------------- public surface


def _public_module(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def _check_import(node: ast.AST, where: str) -> list[str]:
    problems: list[str] = []
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "capgate":
        module = node.module or ""
        if not _public_module(module):
            problems.append(f"{where}: imports from the private module {module}")
            return problems
        exported = set(getattr(importlib.import_module(module), "__all__", ()))
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if alias.name not in exported and full not in MODULES:
                problems.append(f"{where}: {alias.name} is not in {module}.__all__")
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "capgate" and not _public_module(alias.name):
                problems.append(f"{where}: imports the private module {alias.name}")
    return problems


def _dotted_uses(tree: ast.AST) -> set[str]:
    """``capgate.x.y`` attribute chains used in code (``capgate.guard(...)``)."""
    uses: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            inner: ast.AST = node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "capgate":
                uses.add(".".join(["capgate", *reversed(parts)]))
    return uses


def _check_dotted(use: str, where: str) -> list[str]:
    parts = use.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if module in MODULES:
            name = parts[cut]
            exported = set(getattr(importlib.import_module(module), "__all__", ()))
            if name not in exported and f"{module}.{name}" not in MODULES:
                return [f"{where}: {module}.{name} is not in {module}.__all__"]
            return []
    return [f"{where}: {use} is not a capgate module"]


def _readme_blocks() -> list[tuple[int, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
        blocks.append((text[: match.start()].count("\n") + 1, match.group(1)))
    return blocks


def test_readme_has_python_blocks() -> None:
    assert len(_readme_blocks()) >= 3


@pytest.mark.parametrize(("line", "code"), _readme_blocks(), ids=[f"line{n}" for n, _ in _readme_blocks()])
def test_readme_code_uses_only_public_names(line: int, code: str) -> None:
    tree = ast.parse(code)
    where = f"README.md, block at line {line}"
    problems = [p for node in ast.walk(tree) for p in _check_import(node, where)]
    problems += [p for use in sorted(_dotted_uses(tree)) for p in _check_dotted(use, where)]
    assert problems == []


EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_use_only_public_names(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = f"examples/{path.name}"
    problems = [p for node in ast.walk(tree) for p in _check_import(node, where)]
    problems += [p for use in sorted(_dotted_uses(tree)) for p in _check_dotted(use, where)]
    assert problems == []


def test_the_public_surface_check_catches_private_and_unexported_names() -> None:
    bad = ast.parse(
        "from capgate.gate._gate import Gate\nfrom capgate.gate import _Shared\nimport capgate._util.validate"
    )
    problems = [p for node in ast.walk(bad) for p in _check_import(node, "t")]
    assert len(problems) == 3
    assert _check_dotted("capgate.local.models.load_backend", "t") != []
    assert _check_dotted("capgate.guard", "t") == []


# --------------------------------------------------------------------------- the walk of a call


def _capgate_path(frame: object) -> list[str]:
    """The capgate modules on the stack below ``frame``, outermost first, repeats in a row merged;
    ``capgate._util.drive``, the one plan driver every flow of the house runs on, is plumbing, not a stop."""
    path: list[str] = []
    current = frame
    while current is not None:
        module = current.f_globals.get("__name__", "")  # type: ignore[attr-defined]
        if module == "capgate._util.drive":
            pass
        elif module.startswith("capgate") and (not path or path[-1] != module):
            path.append(module)
        current = current.f_back  # type: ignore[attr-defined]
    return path[::-1]


def test_a_guarded_call_walks_down_once_and_calls_up_only_to_run_the_function() -> None:
    """decorator -> flow driver -> effect -> gate limits -> estimator: each module entered once on
    the way down, the query normalized once, and the one call back up runs the user's function."""
    import inspect
    import sys

    import capgate
    from capgate import Estimate
    from capgate.core.messages import as_query
    from capgate.estimators import CapabilityEstimator

    seen: dict[str, list[str]] = {}

    class Spy(CapabilityEstimator):
        method = "spy"

        def estimate(self, queries: object) -> list[Estimate]:
            seen["estimator"] = _capgate_path(inspect.currentframe())
            return [Estimate(p=0.95, method=self.method)]

    @capgate.guard(policy="balanced", estimator=Spy(), max_concurrency=2, estimate_timeout_s=30)
    def ask(prompt: str) -> str:
        seen["function"] = _capgate_path(inspect.currentframe())
        return "4"

    normalized = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal normalized
        if event == "call" and frame.f_code is as_query.__code__:  # type: ignore[attr-defined]
            normalized += 1

    sys.setprofile(count)
    try:
        assert ask("What is 2 + 2?") == "4"
    finally:
        sys.setprofile(None)
    assert normalized == 1
    # with a deadline the estimate runs in a started worker thread: its stack starts at the
    # worker's wrapper, then _limits
    assert seen["estimator"] == ["capgate.gate._workers", "capgate.gate._limits"]

    @capgate.guard(policy="balanced", estimator=Spy())
    def ask_plain(prompt: str) -> str:
        seen["function"] = _capgate_path(inspect.currentframe())
        return "4"

    assert ask_plain("What is 2 + 2?") == "4"
    walk = seen["estimator"]
    assert walk == [
        "capgate.gate.decorator",
        "capgate.gate.flow",
        "capgate.gate._effects",
        "capgate.gate._limits",
    ], walk
    assert len(set(walk)) == len(walk)
    up = seen["function"]
    assert up == [
        "capgate.gate.decorator",
        "capgate.gate.flow",
        "capgate.gate._effects",
        "capgate.gate.decorator",
    ], up


# --------------------------------------------------------------------------- the layout


LOOSE_MODULES_ALLOWED = 4


def test_sdk_keeps_only_what_a_user_imports_first_loose() -> None:
    """Everything else lives in a folder whose name says its job."""
    loose = sorted(p.name for p in (ROOT / "sdk").glob("*.py"))
    assert len(loose) <= LOOSE_MODULES_ALLOWED, f"sdk/ has {len(loose)} loose modules: {loose}"
    assert {"__init__.py", "errors.py"} <= set(loose)


def _shadowed_modules() -> list[str]:
    """Submodules hidden by a same-named non-module attribute of their package (``capgate.x.y``
    where ``capgate.x.y`` is a function re-exported by ``capgate.x``): ``import capgate.x.y as m``
    then binds the function, not the module."""
    import types

    found = []
    for name in sorted(MODULES):
        package, _, child = name.rpartition(".")
        if not package or package not in MODULES or MODULES[package].name != "__init__.py":
            continue
        try:
            parent = importlib.import_module(package)
            importlib.import_module(name)
        except ImportError:  # an adapter whose extra is missing here is checked where it is installed
            continue
        attribute = getattr(parent, child, None)
        if attribute is not None and not isinstance(attribute, types.ModuleType):
            found.append(f"{name} is hidden by {package}.{child} ({type(attribute).__name__})")
    return found


def test_no_module_shares_its_name_with_a_name_its_package_exports() -> None:
    assert _shadowed_modules() == []


def test_the_shadow_check_sees_a_hidden_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import capgate.demo

    monkeypatch.setattr(capgate.demo, "live", lambda: None)
    assert _shadowed_modules() == ["capgate.demo.live is hidden by capgate.demo.live (function)"]


def test_moved_modules_keep_their_old_import_paths() -> None:
    """Documented paths from before the layout (0.1.0) give the same module, with a warning naming
    the new path (checked in a fresh interpreter, where nothing is imported yet)."""
    import json
    import subprocess
    import sys

    from capgate._util.moved import MOVED_MODULES

    assert all(old not in MODULES and new in MODULES for old, new in MOVED_MODULES.items())
    code = """
import importlib, json, sys, warnings
problems = []
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    if module is not importlib.import_module(new):
        problems.append(f"{old} is not {new}")
    if not any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught):
        problems.append(f"{old}: no DeprecationWarning naming {new}")
print(json.dumps(problems))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(MOVED_MODULES)], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == []


def test_no_private_module_declares_all() -> None:
    """``__all__`` belongs to the public modules that re-export names; in a private module it only
    drifts from them."""
    found = []
    for name, path in MODULES.items():
        if _public_module(name) or path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                found.append(name)
    assert found == []


SHARED_ALIASES = ("FloatArray", "IntArray")


def test_shared_type_aliases_are_defined_once() -> None:
    """``FloatArray`` and ``IntArray`` live in ``capgate._util.validate``; everyone imports them."""
    defined = {alias: [] for alias in SHARED_ALIASES}  # type: dict[str, list[str]]
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in defined:
                    defined[target.id].append(name)
    assert defined == {alias: ["capgate._util.validate"] for alias in SHARED_ALIASES}
