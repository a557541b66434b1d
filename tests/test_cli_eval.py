"""`capgate eval` and `capgate budget` on the paper's released MATH-500 data (acceptance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capgate.cli import app

DATA = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
runner = CliRunner()


def run_json(*args: str) -> dict[str, object]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    payload: dict[str, object] = json.loads(result.stdout)
    return payload


def test_eval_reproduces_table_2_of_the_paper() -> None:
    payload = run_json("eval", str(DATA), "--confidence", "probe_conf_raw", "--oracle")
    rows = {row["source"]: row for row in payload["rows"]}  # type: ignore[attr-defined]
    probe, oracle = rows["probe_conf_raw"], rows["oracle (µ̂)"]
    published = {"1": 0.0267, "4": 0.0175, "16": 0.0099, "64": 0.0063}
    for k, value in published.items():
        assert round(probe["pass_at_k_mse"][k], 4) == value
    assert [round(oracle["pass_at_k_mse"][k], 4) for k in published] == [0.0, 0.0, 0.0, 0.0001]
    assert payload["n"] == 500
    assert probe["accuracy"] == pytest.approx(oracle["accuracy"])
    assert oracle["capability_brier"] == 0.0


def test_eval_prints_a_table_and_writes_plots(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", str(DATA), "-c", "probe_conf_raw", "--plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for heading in ("cap. Brier", "ECE", "AUROC", "Spearman", "pass@64 MSE", "0.0267"):
        assert heading in result.stdout
    png = tmp_path / "reliability_probe_conf_raw.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_plot_without_matplotlib_or_to_a_file_is_an_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import capgate.metrics.plots as plots
    from capgate.errors import MissingExtraError

    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    result = runner.invoke(app, ["eval", str(DATA), "-c", "probe_conf_raw", "--plot", str(a_file)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")

    def missing(extra: str, what: str) -> None:
        raise MissingExtraError(extra, ["matplotlib"], what)

    monkeypatch.setattr(plots, "require_extra", missing)
    result = runner.invoke(app, ["eval", str(DATA), "-c", "probe_conf_raw", "--plot", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "error: plotting needs matplotlib" in result.stderr


def test_budget_ordering_matches_the_paper() -> None:
    payload = run_json("budget", str(DATA), "--confidence", "probe_conf_raw", "--budgets", "1,2,4,8,16,32,64")
    rows = payload["rows"]
    assert isinstance(rows, list)
    for row in rows:
        if row["budget_per_query"] < 64:
            assert row["greedy_oracle"] > row["greedy_confidence"] > row["uniform"], row
    at_two = next(r for r in rows if r["budget_per_query"] == 2)
    # Computed independently (exact draws without replacement from the 100 pooled samples).
    assert at_two["greedy_oracle"] == pytest.approx(0.9865, abs=2e-4)
    assert at_two["greedy_confidence"] == pytest.approx(0.9665, abs=2e-4)
    assert at_two["uniform"] == pytest.approx(0.9593, abs=2e-4)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "no records"),
        (
            '{"id": "a", "k": 4, "correct": 5, "p": 0.5}\n',
            ":1: field 'correct': correct must be <= k; got correct=5, k=4",
        ),
        ('{"id": "a", "k": 4, "correct": 1, "p": 2}\n', ":1: field 'p': must be a number in [0, 1]; got 2"),
        ('{"id": "a", "k": 4, "correct": 1}\n', ":1: field 'p': missing confidence field"),
    ],
)
def test_bad_input_exits_2_with_location(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    for command in (["eval", str(path), "-c", "p"], ["budget", str(path), "-c", "p"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2
        assert expected in result.stderr
        assert result.stderr.startswith(f"error: {path}")


def test_pass_k_above_pool_size_is_reported_as_not_available(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    path.write_text('{"id": "a", "k": 2, "correct": 1, "p": 0.5}\n', encoding="utf-8")
    payload = run_json("eval", str(path), "-c", "p", "--pass-k", "1,4")
    row = payload["rows"][0]  # type: ignore[index]
    assert row["pass_at_k_mse"] == {"1": 0.0, "4": None}


def test_bad_options_are_named(tmp_path: Path) -> None:
    result = runner.invoke(app, ["budget", str(DATA), "-c", "probe_conf_raw", "--budgets", "1,x"])
    assert result.exit_code == 2
    assert "--budgets must be comma-separated integers; got '1,x'" in result.stderr
    result = runner.invoke(app, ["eval", str(DATA), "-c", "probe_conf_raw", "--bins", "0"])
    assert result.exit_code == 2
    assert result.stderr == "error: `--bins` must be a positive integer; got 0\n"
