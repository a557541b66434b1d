"""capgate.labels.harvesting and ``capgate harvest``: batching, grading, the append-only log, and resuming.

The model here is a small deterministic Backend written for the test: it answers "What is a + b?"
with a + b, or with a + b + 1 when a hash of (prompt, sample index) says so. Its answers do not
depend on batching or on the seed, so the labels a run must write are known in advance, and a run
killed and resumed must end with exactly the labels of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from capgate import LabelledQuery, SamplingParams
from capgate._util.jsonl import cut_torn_tail
from capgate.cli import harvest_cmd
from capgate.core.backend import AsyncBackend, Backend, Generation, Prompt, as_messages
from capgate.datasets import DatasetItem, build_prompt, write_dataset
from capgate.errors import DataError
from capgate.grading import Grader, GraderLike, NumericGrader
from capgate.labels.harvesting import HarvestRun, HarvestTarget, aharvest, harvest, meta_path

TESTS = Path(__file__).resolve().parent


def make_items(n: int) -> list[DatasetItem]:
    return [
        DatasetItem(
            id=f"q{i:03d}",
            question=f"What is {i} + {2 * i + 1}?",
            references=[str(3 * i + 1)],
            kind="numeric",
        )
        for i in range(n)
    ]


def _hash(prompt: Prompt, index: int) -> int:
    text = as_messages(prompt)[-1]["content"]
    return int(hashlib.sha256(f"{text}|{index}".encode()).hexdigest(), 16)


def scripted_generation(prompt: Prompt, index: int) -> Generation:
    text = as_messages(prompt)[-1]["content"]
    match = re.search(r"What is (\d+) \+ (\d+)\?", text)
    assert match is not None, text
    a, b = int(match.group(1)), int(match.group(2))
    h = _hash(prompt, index)
    value = a + b + (1 if h % 4 == 0 else 0)
    response = f"{a} + {b} = {value}. The answer is \\boxed{{{value}}}."
    return Generation(text=response, n_tokens=len(response.split()), mean_logprob=-(h % 7) / 10)


def expected_correct(item: DatasetItem, k: int) -> int:
    return sum(_hash(build_prompt(item), i) % 4 != 0 for i in range(k))


class ScriptedBackend:
    """A deterministic Backend; records every generate call."""

    def __init__(self, *, model_id: str = "scripted-v1") -> None:
        self._model_id = model_id
        self.calls: list[tuple[list[Prompt], SamplingParams]] = []

    @property
    def model_id(self) -> str:
        return self._model_id

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append((list(prompts), params))
        return [[scripted_generation(prompt, i) for i in range(params.n)] for prompt in prompts]


class AsyncScriptedBackend:
    """The async twin of :class:`ScriptedBackend`."""

    model_id = "scripted-v1"

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        await asyncio.sleep(0)
        return [[scripted_generation(prompt, i) for i in range(params.n)] for prompt in prompts]


def make_backend() -> ScriptedBackend:
    """Factory for ``capgate harvest --backend test_harvest:make_backend``."""
    return ScriptedBackend()


def not_a_backend() -> object:
    """A factory whose product is not a Backend (for the CLI's error path)."""
    return object()


def read_records(path: Path) -> list[LabelledQuery]:
    return [LabelledQuery.model_validate_json(line) for line in path.read_text(encoding="utf-8").splitlines()]


def reference_run(tmp_path: Path, n: int, *, k: int = 4, batch_size: int = 2) -> list[dict[str, object]]:
    """What an uninterrupted run writes, one JSON object per query, in order."""
    out = tmp_path / "reference" / "labels.jsonl"
    harvest(ScriptedBackend(), make_items(n), out, k=k, batch_size=batch_size, seed=7, progress=False)
    return [json.loads(line) for line in out.read_text().splitlines()]


# --------------------------------------------------------------------------- one run


def test_harvest_batches_grades_and_writes_labels(tmp_path: Path) -> None:
    assert isinstance(ScriptedBackend(), Backend)
    items = make_items(10)
    backend = ScriptedBackend()
    out = tmp_path / "labels.jsonl"
    sampling = {"k": 5, "temperature": 0.7, "top_p": 0.9, "max_tokens": 64}
    report = harvest(backend, items, out, **sampling, seed=3, batch_size=4, progress=False)  # type: ignore[arg-type]
    # three generate calls of 4, 4 and 2 queries, each asking for n=k samples
    assert [len(prompts) for prompts, _ in backend.calls] == [4, 4, 2]
    for _, params in backend.calls:
        assert (params.n, params.temperature, params.top_p, params.max_tokens) == (5, 0.7, 0.9, 64)
        assert params.logprobs is True
    seeds = [params.seed for _, params in backend.calls]
    assert None not in seeds
    assert len(set(seeds)) == 3  # each batch gets its own seed, derived from the base seed
    assert backend.calls[0][0][0] == build_prompt(items[0])

    records = read_records(out)
    assert [record.id for record in records] == [item.id for item in items]
    for item, record in zip(items, records, strict=True):
        assert record.k == 5
        assert record.correct == expected_correct(item, 5)
        assert record.references == item.references
        assert record.question == item.question
        assert record.samples is not None
        for i, sample in enumerate(record.samples):
            generation = scripted_generation(build_prompt(item), i)
            assert sample.text is None  # texts are kept only on request
            assert sample.answer == generation.text.split("\\boxed{")[1].rstrip("}.")
            assert sample.correct == (sample.answer == item.references[0])
            assert sample.n_tokens == generation.n_tokens
            assert sample.mean_logprob == generation.mean_logprob
        extra = record.model_extra or {}
        assert extra["kind"] == "numeric"
        assert extra["prompt"] == build_prompt(item)
    total_correct = sum(record.correct for record in records)
    assert (report.n_items, report.n_resumed, report.n_new, report.n_samples) == (10, 0, 10, 50)
    assert report.n_correct == total_correct
    assert report.truncated_bytes == 0
    assert 0 < total_correct < 50  # the scripted model is right about 3/4 of the time

    meta = json.loads(meta_path(out).read_text())
    assert meta["model_id"] == "scripted-v1"
    assert (meta["k"], meta["temperature"], meta["top_p"], meta["max_tokens"], meta["seed"]) == (
        5,
        0.7,
        0.9,
        64,
        3,
    )


def test_keep_text_and_a_custom_grader(tmp_path: Path) -> None:
    items = make_items(3)
    out = tmp_path / "labels.jsonl"
    harvest(
        ScriptedBackend(), items, out, k=2, keep_text=True, progress=False,
        grader=lambda response, item: response.startswith("0 + 1"),
    )  # fmt: skip
    records = read_records(out)
    assert records[0].samples is not None
    assert records[0].samples[0].text == scripted_generation(build_prompt(items[0]), 0).text
    assert [record.correct for record in records] == [2, 0, 0]


def test_custom_items_need_a_grader_before_any_sampling(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    items = [*make_items(2), DatasetItem(id="free", question="What is 1 + 1?", kind="custom")]
    with pytest.raises(ValueError, match="item 'free': items of kind 'custom' have no default grader"):
        harvest(backend, items, tmp_path / "labels.jsonl", k=2, progress=False)
    assert backend.calls == []


def test_duplicate_item_ids_are_refused(tmp_path: Path) -> None:
    items = make_items(2)
    with pytest.raises(DataError, match="duplicate id 'q000'"):
        harvest(ScriptedBackend(), [*items, items[0]], tmp_path / "labels.jsonl", k=2, progress=False)


def test_a_backend_that_breaks_its_contract_writes_nothing(tmp_path: Path) -> None:
    class Short(ScriptedBackend):
        def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
            return [[scripted_generation(prompt, 0)] for prompt in prompts]  # one response, not n

    out = tmp_path / "labels.jsonl"
    with pytest.raises(RuntimeError, match="returned 1 responses for item 'q000'; asked for n=3"):
        harvest(Short(), make_items(2), out, k=3, progress=False)
    assert out.read_text() == ""


class FailsOnSecondCall(ScriptedBackend):
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        if self.calls:
            raise ConnectionError("server went away")
        return super().generate(prompts, params)


def test_a_failing_backend_releases_the_file_at_once(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    with pytest.raises(ConnectionError) as failure:
        harvest(FailsOnSecondCall(), make_items(4), out, k=2, batch_size=2, progress=False)
    assert failure.value is not None  # the traceback is still alive here, yet the lock is gone
    assert len(read_records(out)) == 2
    assert harvest(ScriptedBackend(), make_items(4), out, k=2, batch_size=2, progress=False).n_new == 2


def test_async_harvest_writes_what_sync_harvest_writes(tmp_path: Path) -> None:
    assert isinstance(AsyncScriptedBackend(), AsyncBackend)
    out = tmp_path / "async" / "labels.jsonl"
    report = asyncio.run(
        aharvest(AsyncScriptedBackend(), make_items(7), out, k=4, batch_size=2, seed=7, progress=False)
    )
    assert report.n_new == 7
    assert [json.loads(line) for line in out.read_text().splitlines()] == reference_run(tmp_path, 7)


def test_progress_bar_reports_samples_per_second(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    harvest(ScriptedBackend(), make_items(4), tmp_path / "labels.jsonl", k=2, batch_size=2, progress=True)
    err = capsys.readouterr().err
    assert "samples/s" in err
    assert "4/4" in err


# --------------------------------------------------------------------------- resuming


def test_resume_never_resamples_finished_queries(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = make_items(10)
    harvest(ScriptedBackend(), items[:6], out, k=4, batch_size=2, seed=7, progress=False)
    backend = ScriptedBackend()
    report = harvest(backend, items, out, k=4, batch_size=2, seed=7, progress=False)
    asked = [prompt for prompts, _ in backend.calls for prompt in prompts]
    assert asked == [build_prompt(item) for item in items[6:]]
    assert (report.n_resumed, report.n_new) == (6, 4)
    assert [json.loads(line) for line in out.read_text().splitlines()] == reference_run(tmp_path, 10)
    # a third run has nothing left to do
    idle = ScriptedBackend()
    assert harvest(idle, items, out, k=4, batch_size=2, seed=7, progress=False).n_new == 0
    assert idle.calls == []


def test_a_torn_last_line_is_cut_off_on_resume(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = make_items(6)
    harvest(ScriptedBackend(), items[:4], out, k=4, batch_size=2, seed=7, progress=False)
    lines = out.read_bytes().splitlines(keepends=True)
    torn = lines[-1][: len(lines[-1]) // 2]  # as if the process died halfway through writing q003
    out.write_bytes(b"".join(lines[:-1]) + torn)
    report = harvest(ScriptedBackend(), items, out, k=4, batch_size=2, seed=7, progress=False)
    assert report.truncated_bytes == len(torn)
    assert (report.n_resumed, report.n_new) == (3, 3)
    assert [json.loads(line) for line in out.read_text().splitlines()] == reference_run(tmp_path, 6)


def test_an_unparsable_last_line_is_treated_as_torn(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = make_items(3)
    harvest(ScriptedBackend(), items[:2], out, k=4, batch_size=2, seed=7, progress=False)
    with out.open("ab") as handle:
        handle.write(b"\x00\x00\x00\x00\n")  # what a crash can leave behind a file's last block
    report = harvest(ScriptedBackend(), items, out, k=4, batch_size=2, seed=7, progress=False)
    assert report.truncated_bytes == 5
    assert [record.id for record in read_records(out)] == ["q000", "q001", "q002"]


def test_damage_before_the_last_line_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = make_items(4)
    harvest(ScriptedBackend(), items[:3], out, k=4, batch_size=1, seed=7, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(DataError) as info:
        harvest(ScriptedBackend(), items, out, k=4, progress=False, seed=7, batch_size=1)
    assert info.value.line == 2
    assert info.value.message.startswith("invalid JSON")
    # a well-formed record that breaks the schema is damage too, even as the last line
    bad = json.loads(lines[0])
    bad["correct"] = 9
    out.write_text("".join(lines) + json.dumps({**bad, "id": "q003"}) + "\n")
    with pytest.raises(DataError) as info:
        harvest(ScriptedBackend(), items, out, k=4, progress=False, seed=7, batch_size=1)
    assert info.value.line == 4
    assert "correct must be <= k" in info.value.message
    # and so is a repeated id
    out.write_text("".join(lines) + lines[0])
    with pytest.raises(DataError, match="duplicate id 'q000' \\(first on line 1\\)"):
        harvest(ScriptedBackend(), items, out, k=4, progress=False, seed=7, batch_size=1)


def test_cut_torn_tail_cuts_only_what_a_killed_write_left(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    whole = [json.dumps({"id": str(i), "text": "x" * 100_000}).encode() + b"\n" for i in range(3)]
    cases = [
        (b"".join(whole), 0),
        (b"".join(whole) + b"\n", 0),  # a blank last line is no torn write
        (b"".join(whole) + whole[0][:70_000], 70_000),  # a long line, torn
        (whole[0][:70_000], 70_000),  # the only line, torn
        (b"".join(whole) + b"{not json\n", 10),
        (b"", 0),
    ]
    for data, cut in cases:
        path.write_bytes(data)
        fd = os.open(path, os.O_RDWR)
        try:
            assert cut_torn_tail(fd) == cut
        finally:
            os.close(fd)
        assert path.read_bytes() == data[: len(data) - cut]


def test_the_public_pieces_drive_a_harvest_in_any_batch_order(tmp_path: Path) -> None:
    """What capgate.labels.harvest_ray does: open, ask per batch, write answers as they come (here last
    batch first), close; the file holds the labels of a local run and resumes like one."""
    out = tmp_path / "labels.jsonl"
    backend = ScriptedBackend()
    assert HarvestTarget.of(backend) == HarvestTarget("scripted-v1", "other", None)
    with HarvestRun(make_items(6), out, k=4, batch_size=2, seed=7, progress=False) as run:
        batches = run.open(HarvestTarget.of(backend))
        assert [[item.id for item in batch] for batch in batches] == [["q000", "q001"], ["q002", "q003"],
                                                                      ["q004", "q005"]]  # fmt: skip
        for batch in reversed(batches[1:]):
            prompts, params = run.request(batch)
            run.write(batch, prompts, backend.generate(prompts, params))
        report = run.close()
    assert (report.n_new, report.n_samples) == (4, 16)
    reference = {record["id"]: record for record in reference_run(tmp_path, 6)}
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["id"] for record in written] == ["q004", "q005", "q002", "q003"]
    assert all(record == reference[record["id"]] for record in written)
    again = ScriptedBackend()
    assert harvest(again, make_items(6), out, k=4, batch_size=2, seed=7, progress=False).n_new == 2
    assert [prompt for prompts, _ in again.calls for prompt in prompts] == [
        build_prompt(i) for i in make_items(2)
    ]
    item = make_items(1)[0]
    with pytest.raises(RuntimeError, match="returned 1 responses for item 'q000'; asked for n=4"):
        run.label(item, build_prompt(item), [scripted_generation(build_prompt(item), 0)])


def test_a_gzip_output_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"plain JSON lines; name the output without \.gz"):
        harvest(ScriptedBackend(), make_items(1), tmp_path / "labels.jsonl.gz", k=2, progress=False)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"k": 8}, "k"),
        ({"temperature": 0.5}, "temperature"),
        ({"seed": 8}, "seed"),
        ({"max_tokens": 9}, "max_tokens"),
    ],
)
def test_resuming_with_other_settings_is_refused(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    out = tmp_path / "labels.jsonl"
    settings: dict[str, object] = {"k": 4, "temperature": 1.0, "seed": 7, "max_tokens": 32}
    harvest(ScriptedBackend(), make_items(2), out, progress=False, **settings)  # type: ignore[arg-type]
    backend = ScriptedBackend()
    with pytest.raises(DataError) as info:
        harvest(backend, make_items(4), out, progress=False, **{**settings, **change})  # type: ignore[arg-type]
    assert info.value.field == field
    assert info.value.path == str(meta_path(out))
    assert backend.calls == []


def test_another_model_cannot_append_to_the_file(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    harvest(ScriptedBackend(), make_items(2), out, k=2, progress=False)
    with pytest.raises(DataError, match="this run has model_id='other-model'"):
        harvest(ScriptedBackend(model_id="other-model"), make_items(3), out, k=2, progress=False)


def test_two_runs_cannot_write_one_file(tmp_path: Path) -> None:
    import fcntl

    out = tmp_path / "labels.jsonl"
    out.touch()
    with out.open("ab") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DataError, match="another harvest is writing to this file"):
            harvest(ScriptedBackend(), make_items(2), out, k=2, progress=False)


# --------------------------------------------------------------------------- killed runs

CHILD = """
import json, os, signal, sys, time
sys.path.insert(0, {tests!r})
import capgate.labels.harvesting as harvest_module
from test_harvest import ScriptedBackend, make_items

mode, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "tear":  # die by SIGKILL halfway through the third append
    real_append, appends = harvest_module.append_durably, []
    def tearing_append(fd, data):
        appends.append(len(data))
        if len(appends) == 3:
            os.write(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        real_append(fd, data)
    harvest_module.append_durably = tearing_append
backend = ScriptedBackend()
if mode == "hang":  # three batches go through, then the model hangs until killed
    real_generate = backend.generate
    def generate(prompts, params):
        if len(backend.calls) == 3:
            time.sleep(600)
        return real_generate(prompts, params)
    backend.generate = generate
report = harvest_module.harvest(backend, make_items(n), out, k=4, batch_size=2, seed=7, progress=False)
asked = sum(len(prompts) for prompts, _ in backend.calls)
result = {{"resumed": report.n_resumed, "new": report.n_new, "cut": report.truncated_bytes, "asked": asked}}
print(json.dumps(result))
"""


def _child(tmp_path: Path, mode: str, out: Path, n: int) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(TESTS)))
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(out), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(tmp_path: Path, out: Path, n: int) -> dict[str, int]:
    proc = _child(tmp_path, "fast", out, n)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    result: dict[str, int] = json.loads(stdout)
    return result


def test_sigkill_mid_write_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    n = 10
    proc = _child(tmp_path, "tear", out, n)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, stderr
    written = out.read_bytes()
    assert not written.endswith(b"\n")  # the kill left half a batch behind
    done_before = written.count(b"\n")
    assert done_before >= 4  # two whole batches of two queries, maybe one line of the third

    result = _finish(tmp_path, out, n)
    assert result["cut"] == len(written) - (written.rfind(b"\n") + 1)
    assert result["resumed"] == done_before
    assert result["asked"] == n - done_before  # finished queries were not sampled again
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["id"] for record in records] == [item.id for item in make_items(n)]
    assert records == reference_run(tmp_path, n)


def test_sigkill_from_outside_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    n = 40
    proc = _child(tmp_path, "hang", out, n)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 6):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done_before = out.read_bytes().count(b"\n")
    assert done_before == 6  # three batches of two were fsynced before the model hung

    result = _finish(tmp_path, out, n)
    assert result["resumed"] == done_before
    assert result["asked"] == n - done_before
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({record["id"] for record in records}) == len(records) == n
    reference = {record["id"]: record for record in reference_run(tmp_path, n)}
    assert {record["id"]: record for record in records} == reference


# --------------------------------------------------------------------------- the command


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Test app holding only the harvest command."""

    harvest_cmd.register(app)
    return app


def test_cli_harvest_and_resume(tmp_path: Path) -> None:
    dataset = write_dataset(make_items(5), tmp_path / "sums.jsonl")
    out = tmp_path / "labels.jsonl"
    args = ["harvest", str(dataset), "--out", str(out), "--backend", "test_harvest:make_backend", "-k", "3",
            "--batch-size", "2", "--seed", "1", "--no-progress"]  # fmt: skip
    runner = CliRunner()
    first = runner.invoke(_cli(), [*args, "--limit", "3"])
    assert first.exit_code == 0, first.stderr
    assert "3/3 queries labelled (3 new, 0 resumed); 9 samples" in first.stdout
    second = runner.invoke(_cli(), args)
    assert second.exit_code == 0, second.stderr
    assert "5/5 queries labelled (2 new, 3 resumed); 6 samples" in second.stdout
    records = read_records(out)
    assert [record.id for record in records] == [f"q{i:03d}" for i in range(5)]
    assert [record.correct for record in records] == [expected_correct(item, 3) for item in make_items(5)]


def test_cli_reports_bad_input_with_exit_code_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "q", "question": "?", "kind": "numeric"}\n')
    result = CliRunner().invoke(
        _cli(),
        ["harvest", str(bad), "--out", str(tmp_path / "o.jsonl"), "--backend", "test_harvest:make_backend"],
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad}:1: field 'references': ")
    missing = CliRunner().invoke(_cli(), ["harvest", "nope.jsonl", "--out", "o.jsonl", "--backend", "x"])
    assert missing.exit_code == 2
    assert "error: nope.jsonl: file not found" in missing.stderr
    wrong = CliRunner().invoke(
        _cli(), ["harvest", str(bad), "--out", "o.jsonl", "--backend", "test_harvest:read_records"]
    )
    assert wrong.exit_code == 2  # the file is bad before the backend is even made
    not_backend = CliRunner().invoke(
        _cli(), ["harvest", "gsm8k", "--limit", "1", "--out", str(tmp_path / "g.jsonl"),
                 "--backend", "test_harvest:not_a_backend"],
    )  # fmt: skip
    assert not_backend.exit_code == 2
    assert not_backend.stderr.startswith("error: Invalid value for --backend: ")
    assert "made a 'object', not a capgate.Backend" in not_backend.stderr


def test_importing_datasets_grading_and_harvest_stays_light() -> None:
    heavy = ["pyarrow", "math_verify", "sympy", "datasets", "olmo_eval", "torch", "transformers", "rich"]
    code = (
        "import sys, json, capgate.datasets, capgate.grading, capgate.labels.harvesting;"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    assert json.loads(subprocess.check_output([sys.executable, "-c", code], text=True)) == []


class TaggedBackend:
    """Replies with the right sum (or one more) and a confidence tag holding another number."""

    model_id = "tagged"

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        rows = []
        for prompt in prompts:
            row = []
            for i in range(params.n):
                good = scripted_generation(prompt, i)
                value = good.text.split("\\boxed{")[1].split("}")[0]
                tags = ["[confidence=85%]", "[confidence=high]", ""]
                row.append(Generation(text=f"{value} {tags[i % 3]}".strip(), n_tokens=3, mean_logprob=-0.1))
            rows.append(row)
        return rows


def test_a_confidence_source_is_stored_and_its_tag_never_graded(tmp_path: Path) -> None:
    from capgate.cas import verbalized_confidence

    out = tmp_path / "tagged.jsonl"
    items = make_items(4)
    harvest(
        TaggedBackend(), items, out, k=6, confidence=verbalized_confidence, keep_text=True, progress=False
    )
    records = read_records(out)
    for item, record in zip(items, records, strict=True):
        assert [s.confidence for s in record.samples] == [0.85, None, None] * 2
        # "85" in the tag is never taken for the answer: answers are the sums (or sum + 1)
        assert all(s.answer is not None and s.answer != "85" for s in record.samples)
        assert record.correct == expected_correct(item, 6)
    saved = json.loads(meta_path(out).read_text())
    assert saved["confidence"] == "capgate.cas.confidence.verbalized_confidence"
    with pytest.raises(DataError, match="confidence"):  # resuming under another source is refused
        harvest(TaggedBackend(), make_items(5), out, k=6, keep_text=True, progress=False)
    with pytest.raises(TypeError, match="confidence source"):
        harvest(TaggedBackend(), items, tmp_path / "x.jsonl", k=2, confidence=0.5, progress=False)  # type: ignore[arg-type]


def test_cli_confidence_tag_asks_for_the_tag_and_records_the_source(tmp_path: Path) -> None:
    dataset = write_dataset(make_items(2), tmp_path / "sums.jsonl")
    out = tmp_path / "tagged.jsonl"
    args = ["harvest", str(dataset), "--out", str(out), "--backend", "test_harvest:make_backend", "-k", "2",
            "--no-progress", "--confidence-tag"]  # fmt: skip
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 0, result.stderr
    records = read_records(out)
    assert all("[confidence=X%]" in as_messages(r.model_extra["prompt"])[0]["content"] for r in records)  # type: ignore[index, arg-type]
    assert all(s.confidence is None for r in records for s in r.samples)  # the scripted replies carry no tag
    meta = json.loads(meta_path(out).read_text())
    assert meta["confidence"] == "capgate.cas.confidence.verbalized_confidence"
    assert meta["prompt"] == "capgate.labels.harvesting.prompt_with_confidence_tag"


# --------------------------------------------------------------------------- recorded identities


class SumGrader(Grader):
    """A user's Grader subclass without a ``__repr__`` of its own (its default one holds an address)."""

    def __init__(self, slack: int = 0) -> None:
        self.slack = slack

    def extract(self, response: str) -> str | None:
        return NumericGrader().extract(response)

    def match(self, answer: str, item: DatasetItem) -> bool:
        return abs(float(answer) - float(item.references[0])) <= self.slack


def ends_with(response: str, item: DatasetItem, *, suffix: str) -> bool:
    return response.endswith(suffix)


def sum_prompt(item: DatasetItem, *, style: str) -> Prompt:
    return f"{style}: {item.question}"


def as_in_another_process(fn: Any) -> Any:
    """The same function as another process has it: equal name and code, another address."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__kwdefaults__ = fn.__qualname__, fn.__kwdefaults__
    return copy


@pytest.mark.parametrize(
    ("first", "again"),
    [
        (SumGrader(), SumGrader()),
        (partial(ends_with, suffix="}."), partial(as_in_another_process(ends_with), suffix="}.")),
    ],
    ids=["grader-subclass", "partial"],
)
def test_a_harvest_with_a_custom_grader_resumes_in_another_process(
    tmp_path: Path, first: GraderLike, again: GraderLike
) -> None:
    """The grader is recorded by what it is (class or function, and settings), not by a repr holding
    a memory address: a new process, with an equal grader at another address, resumes."""
    out = tmp_path / "labels.jsonl"
    harvest(ScriptedBackend(), make_items(2), out, k=2, grader=first, progress=False)
    report = harvest(ScriptedBackend(), make_items(3), out, k=2, grader=again, progress=False)
    assert (report.n_resumed, report.n_new) == (2, 1)
    assert " at 0x" not in json.loads(meta_path(out).read_text())["grader"]


@pytest.mark.parametrize(
    ("first", "again"),
    [
        (SumGrader(), SumGrader(slack=1)),
        (partial(ends_with, suffix="}."), partial(ends_with, suffix=".")),
    ],
    ids=["grader-subclass", "partial"],
)
def test_resuming_under_a_grader_with_other_settings_is_refused(
    tmp_path: Path, first: GraderLike, again: GraderLike
) -> None:
    out = tmp_path / "labels.jsonl"
    harvest(ScriptedBackend(), make_items(2), out, k=2, grader=first, progress=False)
    with pytest.raises(DataError) as info:
        harvest(ScriptedBackend(), make_items(3), out, k=2, grader=again, progress=False)
    assert info.value.field == "grader"


def test_a_partial_prompt_is_recorded_with_its_arguments(tmp_path: Path) -> None:
    """Two partials of one prompt builder are told apart by their arguments (both were recorded as
    "functools.partial"), and equal ones resume."""
    out = tmp_path / "labels.jsonl"
    harvest(ScriptedBackend(), make_items(2), out, k=2, prompt=partial(sum_prompt, style="A"), progress=False)
    recorded = json.loads(meta_path(out).read_text())["prompt"]
    assert recorded == f"functools.partial({sum_prompt.__module__}.sum_prompt, style='A')"
    backend = ScriptedBackend()
    with pytest.raises(DataError) as info:
        harvest(backend, make_items(3), out, k=2, prompt=partial(sum_prompt, style="B"), progress=False)
    assert info.value.field == "prompt"
    assert backend.calls == []
    same = partial(as_in_another_process(sum_prompt), style="A")
    assert harvest(ScriptedBackend(), make_items(3), out, k=2, prompt=same, progress=False).n_resumed == 2


def test_resuming_through_another_endpoint_is_refused(tmp_path: Path) -> None:
    """One model name reached another way (a local copy, a server) is another target: its labels
    are not appended to the file's."""

    class LocalScripted(ScriptedBackend):
        endpoint = "local"

    out = tmp_path / "labels.jsonl"
    harvest(LocalScripted(), make_items(2), out, k=2, progress=False)
    backend = ScriptedBackend()  # the same model_id, endpoint "other"
    with pytest.raises(DataError, match="this run has endpoint='other'") as info:
        harvest(backend, make_items(3), out, k=2, progress=False)
    assert info.value.field == "endpoint"
    assert backend.calls == []


@pytest.mark.parametrize("grader", [None, NumericGrader()], ids=["default", "numeric"])
def test_a_numeric_reference_that_is_no_number_is_refused_before_any_sampling(
    tmp_path: Path, grader: Grader | None
) -> None:
    """Found before sampling (the grader finds it only once a response holds a number: the batch's
    samples were lost, or the item was labelled 0 without a word)."""
    items = [
        *make_items(2),
        DatasetItem(id="bad", question="What is 1 + 1?", references=["two"], kind="numeric"),
    ]
    backend = ScriptedBackend()
    with pytest.raises(
        DataError, match=r"numeric reference 'two' of item 'bad' \(item 3\) is not one number"
    ):
        harvest(backend, items, tmp_path / "labels.jsonl", k=2, grader=grader, progress=False)
    assert backend.calls == []
    assert not (tmp_path / "labels.jsonl").exists()


def test_graders_whose_repr_was_stable_are_recorded_as_before(tmp_path: Path) -> None:
    """Files harvested before keep resuming: a dataclass grader, one with its own repr, or a named
    function is recorded as its repr was."""
    from capgate.grading import AliasGrader, ChoiceGrader, FunctionGrader, MathGrader

    graders = [
        NumericGrader(rel_tol=1e-3),
        AliasGrader(),
        MathGrader(),
        ChoiceGrader(),
        FunctionGrader(ends_with),
    ]
    for grader in graders:
        assert HarvestRun([], tmp_path / "x.jsonl", k=2, grader=grader).settings["grader"] == repr(grader)


def test_cli_locates_a_numeric_answer_that_is_no_number_in_the_dataset_file(tmp_path: Path) -> None:
    """As the dataset reader does: the file, the line (not the item's index) and the field the line
    gives (``answer`` for the shorthand)."""
    dataset = tmp_path / "sums.jsonl"
    dataset.write_text(
        '{"id": "a", "question": "1 + 1?", "answer": "2", "kind": "numeric"}\n\n'
        '{"id": "b", "question": "6 * 7?", "answer": "forty-two", "kind": "numeric"}\n'
    )
    splits = tmp_path / "splits"
    splits.mkdir()
    (splits / "test.jsonl").write_text(
        '{"id": "c", "question": "1 + 1?", "references": ["two"], "kind": "numeric"}\n'
    )
    runner = CliRunner()
    base = ["--backend", "test_harvest:make_backend", "-k", "2", "--no-progress"]
    result = runner.invoke(_cli(), ["harvest", str(dataset), "--out", str(tmp_path / "o.jsonl"), *base])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {dataset}:3: field 'answer': numeric reference 'forty-two' of item 'b' is not one number\n"
    )
    result = runner.invoke(
        _cli(), ["harvest", str(splits), "--split", "test", "--out", str(tmp_path / "s.jsonl"), *base]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {splits / 'test.jsonl'}:1: field 'references': ")
    assert not meta_path(tmp_path / "o.jsonl").exists()


def test_cli_ray_resolves_the_backend_before_starting_ray(tmp_path: Path) -> None:
    """A --backend that does not import is the error a local harvest gives, before Ray starts
    (on Ray, the workers' ActorDiedError was a traceback)."""
    dataset = write_dataset(make_items(2), tmp_path / "sums.jsonl")
    result = CliRunner().invoke(
        _cli(),
        ["harvest", str(dataset), "--out", str(tmp_path / "o.jsonl"), "--backend",
         "capgate_no_such_module:make", "-k", "2", "--no-progress", "--ray", "--workers", "1"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: Invalid value for --backend: cannot import 'capgate_no_such_module'"
    )
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
