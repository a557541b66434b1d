"""Installed the way users install it: build the sdist and the wheel, check them, install the wheel
(not editable) into a fresh virtual environment outside the repository, and use it from there.

The release workflow (``.github/workflows/release.yml``) runs this file against the commit it
publishes, so a wheel missing an asset, a preset or ``py.typed`` fails before it ships.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
# setuptools' own notes that say nothing about the package (present whenever bytecode is off).
NOT_PACKAGING = ("byte-compiling is disabled",)


def _run(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _build(out: Path, *only: str) -> str:
    """``python -m build`` as a release runs it (no isolation: this environment's setuptools, so
    the test runs offline); returns everything it printed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return _run([sys.executable, "-m", "build", "--no-isolation", *only, "-o", str(out), str(ROOT)], env=env)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """The sdist and the wheel built from it (``python -m build``'s default), a wheel built
    straight from the tree, and what the first build printed."""
    release = tmp_path_factory.mktemp("release")
    direct = tmp_path_factory.mktemp("direct")
    printed = _build(release)
    # setuptools' scratch folder keeps the modules of earlier builds of this tree: a module removed
    # since would ship in the direct wheel (the sdist's build starts from its own clean copy).
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    _build(direct, "--wheel")
    return {
        "sdist": next(release.glob("capgate-*.tar.gz")),
        "wheel": next(release.glob("capgate-*.whl")),
        "direct_wheel": next(direct.glob("capgate-*.whl")),
        "printed": printed,
    }


def _wheel_names(wheel: Path | str) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


def test_the_build_prints_no_packaging_warnings(dists: dict[str, Path | str]) -> None:
    printed = str(dists["printed"])
    warnings = [
        line.strip()
        for line in printed.splitlines()
        if ("warning" in line.lower() or "deprecat" in line.lower())
        and not any(n in line for n in NOT_PACKAGING)
    ]
    assert warnings == [], "\n".join(warnings)


def test_the_metadata_passes_twine_check(dists: dict[str, Path | str]) -> None:
    out = _run([sys.executable, "-m", "twine", "check", "--strict", str(dists["sdist"]), str(dists["wheel"])])
    assert out.count("PASSED") == 2, out
    metadata = zipfile.ZipFile(dists["wheel"]).read(f"capgate-{VERSION}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert f"Version: {VERSION}" in metadata


def test_the_sdist_rebuilds_the_same_wheel(dists: dict[str, Path | str]) -> None:
    from_sdist, from_tree = _wheel_names(dists["wheel"]), _wheel_names(dists["direct_wheel"])
    assert from_sdist == from_tree, sorted(from_sdist ^ from_tree)


def test_the_wheel_holds_every_package_asset_and_preset(dists: dict[str, Path | str]) -> None:
    names = _wheel_names(dists["wheel"])
    assert "capgate/py.typed" in names
    assert f"capgate-{VERSION}.dist-info/licenses/LICENSE" in names
    for folder, package in (
        ("sdk", "capgate"),
        ("adapters", "capgate/adapters"),
        ("policies", "capgate/policies"),
    ):
        for source in (ROOT / folder).rglob("*"):
            if source.is_file() and "__pycache__" not in source.parts and source.suffix != ".pyc":
                inside = f"{package}/{source.relative_to(ROOT / folder).as_posix()}"
                assert inside in names, f"{source} is missing from the wheel as {inside}"


@pytest.fixture(scope="module")
def installed(dists: dict[str, Path | str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh virtual environment with the wheel installed (no extras), and an empty folder
    outside the repository to run it from."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(dists["wheel"])])
    return {
        "python": python,
        "capgate": venv / "bin" / "capgate",
        "cwd": tmp_path_factory.mktemp("elsewhere"),
    }


def _in_venv(installed: dict[str, Path], code: str) -> str:
    return _run([str(installed["python"]), "-c", code], cwd=installed["cwd"]).strip()


def test_capgate_version_is_the_installed_metadata(installed: dict[str, Path]) -> None:
    assert (
        _run([str(installed["capgate"]), "--version"], cwd=installed["cwd"]).strip() == f"capgate {VERSION}"
    )
    assert _in_venv(installed, "import capgate; print(capgate.__version__)") == VERSION


def test_the_installed_package_is_the_wheel_and_imports_light(installed: dict[str, Path]) -> None:
    code = (
        "import sys, json, capgate, capgate.metrics, capgate.policies, capgate.adapters;"
        "heavy = ['torch', 'transformers', 'numpy.testing', 'openai', 'langgraph', 'typer', 'rich'];"
        "print(json.dumps({'file': capgate.__file__, 'heavy': [m for m in heavy if m in sys.modules]}))"
    )
    seen = json.loads(_in_venv(installed, code))
    assert str(installed["python"].parents[1]) in seen["file"], seen
    assert not seen["file"].startswith(str(ROOT)), seen
    assert seen["heavy"] == []


def test_every_policy_preset_validates(installed: dict[str, Path]) -> None:
    code = (
        "from capgate.policies import PRESETS, load_policy;"
        "print(','.join(sorted(name for name in PRESETS if load_policy(name).name)))"
    )
    presets = set(_in_venv(installed, code).split(","))
    assert presets == {p.stem for p in (ROOT / "policies").glob("*.yaml")}


def test_the_installed_estimator_methods_are_registered(installed: dict[str, Path]) -> None:
    """``load_estimator(..., method="verbalized")`` finds its loader through the wheel's entry points."""
    code = (
        "from importlib.metadata import entry_points;"
        "print(','.join(f'{e.name}={e.value}' for e in entry_points(group='capgate.estimators')))"
    )
    loader = "capgate.adapters.backends.transformers:verbalized_estimator"
    assert _in_venv(installed, code) == f"verbalized={loader}"


def test_the_default_probe_ships_and_a_missing_extra_names_itself(installed: dict[str, Path]) -> None:
    code = (
        "import json, capgate\n"
        "from capgate.loading import default_probe_path\n"
        "folder = default_probe_path()\n"
        "files = sorted(p.name for p in folder.iterdir())\n"
        "try:\n"
        "    capgate.load_estimator('default')\n"
        "    error = None\n"
        "except capgate.MissingExtraError as exc:\n"
        "    error = str(exc)\n"
        "print(json.dumps({'folder': str(folder), 'files': files, 'error': error}))"
    )
    seen = json.loads(_in_venv(installed, code))
    assert seen["files"] == ["probe.json", "probe.safetensors"]
    assert str(installed["python"].parents[1]) in seen["folder"]
    assert seen["error"] is not None, "load_estimator ran without the local extra"
    assert "pip install 'capgate[local]'" in seen["error"]
    assert "torch" in seen["error"]


def test_the_demos_replay_finds_its_data(installed: dict[str, Path]) -> None:
    out = _run(
        [str(installed["capgate"]), "demo", "--no-live", "--no-verbalized", "--json"], cwd=installed["cwd"]
    )
    report = json.loads(out)
    assert report["replay"] is not None, report
    assert report["replay_skipped"] is None, report


@pytest.mark.slow
def test_the_whole_demo_runs_from_the_wheel(installed: dict[str, Path]) -> None:
    """Every part, live, verbalized (the shipped C3RL adapter) and replay, from the installed
    wheel. The heavy extras (torch, transformers...) and the embedded model's package come from
    this environment's site-packages through a ``.pth`` line placed after the fresh environment's
    own: installing a second copy of torch would test pip, not capgate; capgate itself still
    comes from the wheel."""
    import site

    fresh_site = Path(_in_venv(installed, "import site; print(site.getsitepackages()[0])"))
    (fresh_site / "zz_test_extras.pth").write_text("\n".join(site.getsitepackages()) + "\n", encoding="utf-8")
    where = _in_venv(installed, "import capgate, torch; print(capgate.__file__)")
    assert where.startswith(str(fresh_site)), where
    out = _run([str(installed["capgate"]), "demo", "--questions", "4"], cwd=installed["cwd"])
    assert "LIVE: 4 questions, without the gate vs with the gate" in out
    assert "REPLAY: 250 held-out MATH-500 questions" in out
    assert "replay skipped" not in out
    assert "VERBALIZED: SmolLM2 taught by C3RL (the shipped adapter)" in " ".join(out.split())


# --------------------------------------------------------------------------- the release workflow


def test_the_release_workflow_builds_tests_this_file_and_publishes_with_trusted_publishing() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    jobs = workflow["jobs"]
    runs = {name: "\n".join(step.get("run", "") for step in job["steps"]) for name, job in jobs.items()}
    assert "python -m build" in runs["build"]
    assert "twine check --strict dist/*" in runs["build"]
    assert "pytest tests/test_install.py" in runs["test"]
    assert jobs["test"]["needs"] == "build"
    publish = jobs["publish"]
    assert publish["needs"] == ["build", "test"]
    assert publish["permissions"] == {"id-token": "write"}
    assert any(
        str(step.get("uses", "")).startswith("pypa/gh-action-pypi-publish@") for step in publish["steps"]
    )
    assert not any("password" in step.get("with", {}) for step in publish["steps"]), (
        "trusted publishing: no token"
    )
    # it refuses a tag that is not the version the package declares
    assert "GITHUB_REF_NAME" in runs["build"]
    assert "pyproject.toml" in runs["build"]


def test_the_changelog_has_a_section_for_this_version_and_the_one_before() -> None:
    import re

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, flags=re.MULTILINE)
    assert versions[0] == VERSION, (
        f"CHANGELOG.md's newest section is {versions[0]}, pyproject.toml says {VERSION}"
    )
    assert "0.1.0" in versions
    assert "## [Unreleased]" in text
