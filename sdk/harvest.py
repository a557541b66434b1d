"""Label queries by sampling: k responses per query from a backend, graded, appended to JSON lines.

The output holds one :class:`~capgate.LabelledQuery` per line (µ̂ = correct / k, with per-sample
answers, correctness, token counts and mean log-probabilities), written as an append-only log:
after every batch of queries the new lines are written, flushed and fsynced. A run that is
killed, even by SIGKILL in the middle of a write, resumes where it stopped: queries already in the
file are never sampled again, and a torn last line is detected and cut off. A sidecar
``<out>.meta.json`` records the sampling settings so that a resumed run cannot silently mix
labels made under different settings.

Example:
    >>> import tempfile, pathlib
    >>> from capgate.backend import Generation
    >>> from capgate.datasets import DatasetItem
    >>> class Echo:  # a toy backend that always answers 4
    ...     model_id = "echo"
    ...     def generate(self, prompts, params):
    ...         return [[Generation(text="\\\\boxed{4}", n_tokens=3)] * params.n for _ in prompts]
    >>> items = [DatasetItem(id="q1", question="2+2?", references=["4"], kind="numeric"),
    ...          DatasetItem(id="q2", question="2+3?", references=["5"], kind="numeric")]
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "labels.jsonl"
    >>> report = harvest(Echo(), items, out, k=4, progress=False)
    >>> [(q.id, q.mu_hat) for q in map(LabelledQuery.model_validate_json, out.read_text().splitlines())]
    [('q1', 1.0), ('q2', 0.0)]
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from capgate._atomic import atomic_write_json, fsync_dir
from capgate._jsonl import data_error_from_validation, note_unique_id
from capgate._twins import Plan, adrive, drive, twin_of
from capgate._types import LabelledQuery, Sample
from capgate.backend import AsyncBackend, Backend, Generation, Prompt, SamplingParams, backend_endpoint
from capgate.cas.confidence import ConfidenceSource, strip_confidence_tag, with_confidence_instruction
from capgate.datasets import DatasetItem, build_prompt
from capgate.errors import DataError
from capgate.grading import Grader, GraderLike, as_grader, grader_for

__all__ = ["HarvestReport", "aharvest", "harvest", "meta_path", "prompt_with_confidence_tag"]

FORMAT_VERSION = 1
_CHECKED_SETTINGS = (
    "model_id", "dataset", "k", "temperature", "top_p", "max_tokens", "seed", "grader", "prompt",
    "confidence",
)  # fmt: skip


class HarvestReport(BaseModel):
    """What a harvest run did.

    Attributes:
        path: The output file.
        model_id: The backend's model.
        n_items: Queries asked for.
        n_resumed: Of those, already labelled in the file before this run (not resampled).
        n_new: Queries labelled by this run.
        n_samples: Responses sampled by this run.
        n_correct: Of those, graded correct.
        truncated_bytes: Bytes of a torn last line cut off when resuming (0 if none).
        elapsed_s: Wall-clock seconds of this run.
        samples_per_s: ``n_samples / elapsed_s``.
    """

    model_config = ConfigDict(frozen=True)

    path: Path
    model_id: str
    n_items: int
    n_resumed: int
    n_new: int
    n_samples: int
    n_correct: int
    truncated_bytes: int
    elapsed_s: float
    samples_per_s: float


def prompt_with_confidence_tag(item: DatasetItem) -> Prompt:
    """:func:`~capgate.datasets.build_prompt` with CAS's confidence instruction as the system turn,
    for harvests that record a per-response ``[confidence=X%]`` (``confidence=verbalized_confidence``;
    ``capgate harvest --confidence-tag``)."""
    return with_confidence_instruction(build_prompt(item))


def meta_path(out: str | Path) -> Path:
    """The sidecar file recording a harvest's settings: ``<out>.meta.json``."""
    out = Path(out)
    return out.with_name(out.name + ".meta.json")


def _mean_logprob(generation: Generation) -> float | None:
    value = generation.mean_logprob
    if value is None and generation.tokens:
        value = sum(token.logprob for token in generation.tokens) / len(generation.tokens)
    if value is None or not math.isfinite(value):
        return None
    return min(value, 0.0)


def _source_name(source: object) -> str:
    """A confidence source as recorded in the settings: its repr, or a function's dotted name."""
    if callable(source) and hasattr(source, "__qualname__"):
        return _callable_name(source)
    return repr(source)


def _callable_name(obj: object) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}" if module else str(name)


class _HarvestRun:
    """The I/O-free core shared by :func:`harvest` and :func:`aharvest`, plus the output log."""

    def __init__(
        self,
        items: Iterable[DatasetItem],
        out: str | Path,
        *,
        k: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        batch_size: int = 8,
        grader: GraderLike | None = None,
        prompt: Callable[[DatasetItem], Prompt] | None = None,
        keep_text: bool = False,
        logprobs: bool = True,
        dataset: str | None = None,
        progress: bool | None = None,
        confidence: ConfidenceSource | None = None,
    ) -> None:
        if confidence is not None and not callable(confidence):
            raise TypeError(
                f"`confidence` must be a confidence source Generation -> float | None; got {confidence!r}"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be a positive integer; got {k!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive integer; got {batch_size!r}")
        self.model_id = ""  # set by open(), from the backend
        self.items = list(items)
        self.out = Path(out)
        self.k = k
        self.batch_size = batch_size
        self.keep_text = keep_text
        self.base_params = SamplingParams(
            n=k, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed, logprobs=logprobs
        )
        self.grader: Grader | None = None if grader is None else as_grader(grader)
        self.prompt = prompt or build_prompt
        self.confidence = confidence
        self.settings: dict[str, Any] = {
            "dataset": dataset,
            "k": k,
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "seed": seed,
            "grader": repr(self.grader) if self.grader is not None else "default per answer kind",
            "prompt": "capgate.datasets.build_prompt" if prompt is None else _callable_name(prompt),
            "logprobs": logprobs,
            "keep_text": keep_text,
            "confidence": None if confidence is None else _source_name(confidence),
        }
        self.show_progress = sys.stderr.isatty() if progress is None else progress
        self._graders: dict[str, Grader] = {}
        self._fd: int | None = None
        self._progress: Any = None
        self._task: Any = None
        self.started = 0.0
        self.n_resumed = 0
        self.n_new = 0
        self.n_samples = 0
        self.n_correct = 0
        self.truncated_bytes = 0

    # ------------------------------------------------------------------------------ setup

    def _check_items(self) -> None:
        seen: set[str] = set()
        for index, item in enumerate(self.items, start=1):
            if not isinstance(item, DatasetItem):
                raise TypeError(f"items must be DatasetItem; item {index} is {type(item).__name__}")
            if item.id in seen:
                raise DataError(f"duplicate id {item.id!r} (item {index})", field="id")
            seen.add(item.id)
            if self.grader is None:
                self._grader_of(item)  # a custom item without a grader fails now, before sampling

    def _grader_of(self, item: DatasetItem) -> Grader:
        if self.grader is not None:
            return self.grader
        if item.kind not in self._graders:
            try:
                self._graders[item.kind] = grader_for(item.kind)
            except ValueError as exc:
                raise ValueError(f"item {item.id!r}: {exc}") from None
        return self._graders[item.kind]

    def _check_meta(self) -> None:
        path = meta_path(self.out)
        if path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"unreadable harvest settings: {exc}", path=path) from None
            if not isinstance(saved, dict):
                raise DataError("expected a JSON object of harvest settings", path=path)
            for key in _CHECKED_SETTINGS:
                if key in saved and saved[key] != self.settings[key]:
                    raise DataError(
                        f"this run has {key}={self.settings[key]!r} but {self.out.name} was harvested with "
                        f"{key}={saved[key]!r}; resume with the same settings, or write to another file",
                        path=path,
                        field=key,
                    )
        else:
            meta = {"format": "capgate.harvest", "version": FORMAT_VERSION, **self.settings}
            atomic_write_json(path, meta)

    def _scan_existing(self, fd: int) -> set[str]:
        """Ids already labelled in the log; cuts off a torn last line (called under the lock).

        A last line without its newline, or whose text is not JSON, is what a killed write
        leaves: it is truncated. Anything else that is wrong (a bad line before the last, a
        well-formed but invalid record, a repeated id, another k) is damage and raises.
        """
        done: dict[str, int] = {}
        offset = 0
        torn_at: int | None = None
        unparsable: DataError | None = None
        with open(fd, "rb", closefd=False) as handle:
            handle.seek(0)
            for number, raw in enumerate(handle, start=1):
                if unparsable is not None:  # not the last line, so not a torn write
                    raise unparsable
                if not raw.endswith(b"\n"):
                    torn_at = offset
                    break
                if raw.strip():
                    try:
                        obj = json.loads(raw)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        unparsable = DataError("line is not JSON", path=self.out, line=number)
                        torn_at = offset
                        offset += len(raw)
                        continue
                    self._check_record(obj, number, done)
                offset += len(raw)
        if torn_at is not None:
            size = os.fstat(fd).st_size
            os.ftruncate(fd, torn_at)
            os.fsync(fd)
            self.truncated_bytes = size - torn_at
        return set(done)

    def _check_record(self, obj: Any, number: int, done: dict[str, int]) -> None:
        try:
            record = LabelledQuery.model_validate(obj)
        except ValidationError as exc:
            raise data_error_from_validation(exc, path=self.out, line=number) from None
        if record.k != self.k:
            raise DataError(
                f"record has k={record.k} but this run samples k={self.k}",
                path=self.out,
                line=number,
                field="k",
            )
        note_unique_id(done, record.id, path=self.out, line=number)

    def open(self, backend: object) -> list[list[DatasetItem]]:
        """Lock and scan the output, write or check the settings; return the batches still to do.

        The settings record the target: the backend's model and how it is reached (endpoint kind,
        base URL), so a probe fitted on these labels knows whose capability it predicts.
        """
        self.model_id = self.settings["model_id"] = str(getattr(backend, "model_id", ""))
        self.settings["endpoint"], self.settings["base_url"] = backend_endpoint(backend)
        self._check_items()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        created = not self.out.exists()
        fd = os.open(self.out, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _lock(fd, self.out)
            if created:
                fsync_dir(self.out.parent)
            self._check_meta()
            done = self._scan_existing(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        pending = [item for item in self.items if item.id not in done]
        self.n_resumed = len(self.items) - len(pending)
        self.started = time.perf_counter()
        if self.show_progress:
            self._start_progress(len(pending))
        return [pending[i : i + self.batch_size] for i in range(0, len(pending), self.batch_size)]

    # ------------------------------------------------------------------------------ per batch

    def params_for(self, batch: Sequence[DatasetItem]) -> SamplingParams:
        """Sampling settings for a batch; a given seed is mixed with the batch's first id."""
        if self.base_params.seed is None:
            return self.base_params
        digest = hashlib.sha256(f"{self.base_params.seed}:{batch[0].id}".encode()).digest()
        return self.base_params.model_copy(update={"seed": int.from_bytes(digest[:4], "big")})

    def prompts_for(self, batch: Sequence[DatasetItem]) -> list[Prompt]:
        return [self.prompt(item) for item in batch]

    def record(self, batch: Sequence[DatasetItem], prompts: Sequence[Prompt], outputs: Any) -> None:
        """Grade a batch's responses and append its records durably."""
        if not isinstance(outputs, list) or len(outputs) != len(batch):
            got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
            raise RuntimeError(f"backend {self.model_id!r} gave {got} result lists for {len(batch)} queries")
        lines: list[bytes] = []
        for item, prompt, generations in zip(batch, prompts, outputs, strict=True):
            if len(generations) != self.k:
                raise RuntimeError(
                    f"backend {self.model_id!r} returned {len(generations)} responses for item {item.id!r}; "
                    f"asked for n={self.k}"
                )
            grader = self._grader_of(item)
            samples: list[Sample] = []
            for generation in generations:
                stated: float | None = None
                graded_text = generation.text
                if self.confidence is not None:
                    stated = self.confidence(generation)
                    graded_text = strip_confidence_tag(generation.text)  # "[confidence=85%]" is no answer
                judgement = grader.judge(graded_text, item)
                samples.append(
                    Sample(
                        text=generation.text if self.keep_text else None,
                        answer=judgement.answer,
                        correct=judgement.correct,
                        n_tokens=generation.n_tokens,
                        mean_logprob=_mean_logprob(generation),
                        confidence=stated,
                    )
                )
            correct = sum(sample.correct for sample in samples)
            labelled = LabelledQuery.model_validate(
                {
                    "id": item.id,
                    "question": item.question,
                    "references": item.references,
                    "k": self.k,
                    "correct": correct,
                    "samples": samples,
                    "kind": item.kind,
                    "prompt": prompt,
                }
            )
            lines.append(labelled.model_dump_json(exclude_none=True).encode("utf-8") + b"\n")
            self.n_correct += correct
        _append(self._require_fd(), b"".join(lines))
        self.n_new += len(batch)
        self.n_samples += len(batch) * self.k
        if self._progress is not None:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            self._progress.update(self._task, advance=len(batch), rate=f"{self.n_samples / elapsed:.1f}")

    def plan(self, backend: object) -> Plan[HarvestReport]:
        """The whole run without the backend calls: yields each batch's request, records its answer."""
        with self:
            for batch in self.open(backend):
                prompts = self.prompts_for(batch)
                self.record(batch, prompts, (yield prompts, self.params_for(batch)))
            return self.close()

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("harvest run is not open")
        return self._fd

    # ------------------------------------------------------------------------------ progress / close

    def _start_progress(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]harvest[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("queries · {task.fields[rate]} samples/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._progress.start()
        self._task = self._progress.add_task(self.model_id, total=total, rate="0.0")

    def close(self) -> HarvestReport:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None
        elapsed = time.perf_counter() - self.started if self.started else 0.0
        return HarvestReport(
            path=self.out,
            model_id=self.model_id,
            n_items=len(self.items),
            n_resumed=self.n_resumed,
            n_new=self.n_new,
            n_samples=self.n_samples,
            n_correct=self.n_correct,
            truncated_bytes=self.truncated_bytes,
            elapsed_s=elapsed,
            samples_per_s=self.n_samples / elapsed if elapsed > 0 else 0.0,
        )

    def __enter__(self) -> _HarvestRun:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None or self._progress is not None:
            self.close()


def _lock(fd: int, path: Path) -> None:
    try:
        import fcntl
    except ModuleNotFoundError:  # not POSIX: no advisory locking
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DataError("another harvest is writing to this file", path=path) from None


def _append(fd: int, data: bytes) -> None:
    """Append ``data`` and make it durable before returning."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


@twin_of(_HarvestRun)
def harvest(backend: Backend, *args: Any, **kwargs: Any) -> HarvestReport:
    """Sample ``k`` responses per query from ``backend``, grade them, and append labels to ``out``.

    Queries go to the backend ``batch_size`` at a time, as one ``generate`` call with
    ``SamplingParams(n=k, ...)``. After each batch its records are appended to ``out`` and
    fsynced. Rerunning with the same arguments resumes: queries already in ``out`` are skipped
    (never resampled), a torn last line left by a killed run is cut off, and the settings must
    match those saved in ``<out>.meta.json``.

    Args:
        backend: Any :class:`~capgate.Backend` (local transformers, OpenAI-compatible, vLLM...).
        items: The queries; ids must be unique.
        out: The JSON-lines output (one :class:`~capgate.LabelledQuery` a line).
        k: Responses sampled per query.
        temperature: Sampling temperature.
        top_p: Nucleus sampling mass.
        max_tokens: Most tokens per response.
        seed: Base seed; each batch gets a seed derived from it and the batch's first id.
        batch_size: Queries per ``generate`` call (and per fsync).
        grader: A :class:`~capgate.grading.Grader` or ``fn(response, item) -> bool`` for every
            item; ``None`` picks each item's default by kind (:func:`~capgate.grading.grader_for`).
        prompt: Builds the prompt of an item; defaults to :func:`~capgate.datasets.build_prompt`.
        keep_text: Store each response's text (files grow by about ``k`` responses a line).
        logprobs: Ask the backend for token log-probabilities (for ``mean_logprob``).
        dataset: Name of the dataset, recorded in the settings and checked on resume.
        progress: Show a progress bar on stderr; ``None`` shows it when stderr is a terminal.
        confidence: A per-response confidence source (e.g. :func:`capgate.cas.verbalized_confidence`
            for a ``[confidence=X%]`` tag the prompt asks for): its value is stored as each
            sample's ``confidence`` and the tag is stripped before grading.

    Returns:
        What the run did.

    Raises:
        DataError: Duplicate item ids, a damaged output file, settings that differ from the
            file's, or another harvest holding the file.
        ValueError: A ``custom`` item and no grader, or a bad ``k`` / ``batch_size``.
        RuntimeError: The backend returned the wrong number of responses.
    """
    plan = _HarvestRun(*args, **kwargs).plan(backend)
    return drive(plan, lambda request: backend.generate(*request))


@twin_of(_HarvestRun)
async def aharvest(backend: AsyncBackend, *args: Any, **kwargs: Any) -> HarvestReport:
    """Async twin of :func:`harvest` for an :class:`~capgate.AsyncBackend` (same arguments and log)."""
    plan = _HarvestRun(*args, **kwargs).plan(backend)
    return await adrive(plan, lambda request: backend.agenerate(*request))
