"""Label queries by sampling: k responses per query from a backend, graded, appended to JSON lines.

The output holds one :class:`~capgate.LabelledQuery` per line (µ̂ = correct / k, with per-sample
answers, correctness, token counts and mean log-probabilities), written as an append-only log:
after every batch of queries the new lines are written, flushed and fsynced. A run that is
killed, even by SIGKILL in the middle of a write, resumes where it stopped: queries already in the
file are never sampled again, and a torn last line is detected and cut off. A sidecar
``<out>.meta.json`` records the sampling settings so that a resumed run cannot silently mix
labels made under different settings.

Examples:
    >>> import tempfile, pathlib
    >>> from capgate.core.backend import Generation
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

import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from capgate._util.atomic import atomic_write_json
from capgate._util.drive import Steps, adrive, drive, twin_of
from capgate._util.jsonl import append_durably, cut_torn_tail, iter_json_objects, open_append_only
from capgate._util.validate import check_positive_int
from capgate.cas.confidence import ConfidenceSource, strip_confidence_tag, with_confidence_instruction
from capgate.core.backend import AsyncBackend, Backend, Generation, Prompt, SamplingParams, backend_endpoint
from capgate.core.types import LabelledQuery, Sample
from capgate.datasets import DatasetItem, build_prompt
from capgate.errors import DataError
from capgate.grading import Grader, GraderLike, NumericGrader, as_grader, grader_for, parse_number
from capgate.labels._identity import grader_identity, stable_identity
from capgate.labels.labelled import iter_labelled

__all__ = ["HarvestReport", "HarvestRun", "HarvestTarget", "aharvest", "harvest", "meta_path",
           "prompt_with_confidence_tag"]  # fmt: skip

FORMAT_VERSION = 1
_CHECKED_SETTINGS = (
    "model_id", "endpoint", "dataset", "k", "temperature", "top_p", "max_tokens", "seed", "grader",
    "prompt", "confidence",
)  # fmt: skip
"""Settings a resumed harvest must share with the file's. Not ``base_url``: the same target may
move to another address (as for :class:`~capgate.estimators.ProbeTarget`'s identity)."""


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


class HarvestTarget(NamedTuple):
    """Whose labels a harvest makes: the model, and how it is reached (recorded in the settings,
    read back by :meth:`capgate.estimators.ProbeTarget.from_harvest`)."""

    model_id: str
    endpoint: str  # a capgate.core.backend.EndpointKind
    base_url: str | None

    @classmethod
    def of(cls, backend: object) -> HarvestTarget:
        """A backend's ``model_id`` and :func:`~capgate.core.backend.backend_endpoint`."""
        return cls(str(getattr(backend, "model_id", "")), *backend_endpoint(backend))


class HarvestRun:
    """One harvest without the model calls: the pieces :func:`harvest`, :func:`aharvest` and
    :func:`capgate.labels.harvest_ray.ray_harvest` drive.

    :meth:`open`, then per batch :meth:`request` and :meth:`write` (grading each item with
    :meth:`label`), then :meth:`close` (or leaving the ``with`` block). The arguments are
    :func:`harvest`'s.

    Examples:
        >>> import tempfile, pathlib
        >>> from capgate.datasets import DatasetItem
        >>> items = [DatasetItem(id="q1", question="2+2?", references=["4"], kind="numeric")]
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "labels.jsonl"
        >>> with HarvestRun(items, out, k=2, progress=False) as run:
        ...     for batch in run.open(HarvestTarget("echo", "other", None)):
        ...         prompts, params = run.request(batch)
        ...         run.write(batch, prompts, [[Generation(text="\\\\boxed{4}", n_tokens=1)] * params.n])
        ...     run.close().n_correct
        2
    """

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
        self.k = check_positive_int("k", k)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.out = Path(out)
        if self.out.name.endswith(".gz"):
            raise ValueError(f"a harvest appends plain JSON lines; name the output without .gz: {self.out}")
        self.model_id = ""  # set by open(), from the target
        self.items = list(items)
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
            "grader": grader_identity(self.grader) if self.grader is not None else "default per answer kind",
            "prompt": "capgate.datasets.build_prompt" if prompt is None else stable_identity(prompt),
            "logprobs": logprobs,
            "keep_text": keep_text,
            "confidence": None if confidence is None else stable_identity(confidence),
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

    def _check_items(self) -> None:
        seen: set[str] = set()
        for index, item in enumerate(self.items, start=1):
            if not isinstance(item, DatasetItem):
                raise TypeError(f"items must be DatasetItem; item {index} is {type(item).__name__}")
            if item.id in seen:
                raise DataError(f"duplicate id {item.id!r} (item {index})", field="id")
            seen.add(item.id)
            # A custom item without a grader, or a numeric reference that is no number, fails now,
            # before sampling (the grader would find the reference only once a response has a number).
            if isinstance(self._grader_of(item), NumericGrader):
                for reference in item.references:
                    if parse_number(reference) is None:
                        what = f"numeric reference {reference!r} of item {item.id!r}"
                        located = _item_location(self.settings["dataset"], index, item.id)
                        if located is None:
                            raise DataError(f"{what} (item {index}) is not one number", field="references")
                        path, line, field = located
                        raise DataError(f"{what} is not one number", path=path, line=line, field=field)

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
            meta = {"format": "capgate.labels.harvesting", "version": FORMAT_VERSION, **self.settings}
            atomic_write_json(path, meta)

    def _labelled_ids(self, fd: int) -> set[str]:
        """Ids already labelled in the output (under the lock), after cutting off a torn last line;
        anything else wrong (a bad line or record, a repeated id, another k) is damage, and raises."""
        self.truncated_bytes = cut_torn_tail(fd)
        done: set[str] = set()
        for line, record in iter_labelled(self.out):
            if record.k != self.k:
                raise DataError(
                    f"record has k={record.k} but this run samples k={self.k}",
                    path=self.out,
                    line=line,
                    field="k",
                )
            done.add(record.id)
        return done

    def open(self, target: HarvestTarget) -> list[list[DatasetItem]]:
        """Lock and scan the output, write or check the settings; return the batches that remain.

        The settings record the target (its model and how it is reached: endpoint kind, base
        URL), so a probe fitted on these labels knows whose capability it predicts.
        """
        self.model_id = self.settings["model_id"] = target.model_id
        self.settings["endpoint"], self.settings["base_url"] = target.endpoint, target.base_url
        self._check_items()
        fd = open_append_only(self.out, busy="another harvest is writing to this file")
        try:
            self._check_meta()
            done = self._labelled_ids(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        remaining = [item for item in self.items if item.id not in done]
        self.n_resumed = len(self.items) - len(remaining)
        self.started = time.perf_counter()
        if self.show_progress:
            self._start_progress(len(remaining))
        return [remaining[i : i + self.batch_size] for i in range(0, len(remaining), self.batch_size)]

    def request(self, batch: Sequence[DatasetItem]) -> tuple[list[Prompt], SamplingParams]:
        """What to ask the model for a batch: its prompts, and ``n=k`` sampling settings (a given
        seed is mixed with the batch's first id)."""
        params = self.base_params
        if params.seed is not None:
            digest = hashlib.sha256(f"{params.seed}:{batch[0].id}".encode()).digest()
            params = params.model_copy(update={"seed": int.from_bytes(digest[:4], "big")})
        return [self.prompt(item) for item in batch], params

    def label(self, item: DatasetItem, prompt: Prompt, generations: Sequence[Generation]) -> LabelledQuery:
        """Grade one item's ``k`` responses into its label record."""
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
        return LabelledQuery.model_validate(
            {
                "id": item.id,
                "question": item.question,
                "references": item.references,
                "k": self.k,
                "correct": sum(sample.correct for sample in samples),
                "samples": samples,
                "kind": item.kind,
                "prompt": prompt,
            }
        )

    def write(self, batch: Sequence[DatasetItem], prompts: Sequence[Prompt], outputs: Any) -> None:
        """Label a batch's responses (the model's answer to :meth:`request`) and append them durably."""
        if not isinstance(outputs, list) or len(outputs) != len(batch):
            got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
            raise RuntimeError(f"backend {self.model_id!r} gave {got} result lists for {len(batch)} queries")
        records = [self.label(*row) for row in zip(batch, prompts, outputs, strict=True)]
        lines = b"".join(record.model_dump_json(exclude_none=True).encode() + b"\n" for record in records)
        append_durably(self._require_fd(), lines)
        self.n_correct += sum(record.correct for record in records)
        self.n_new += len(batch)
        self.n_samples += len(batch) * self.k
        if self._progress is not None:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            self._progress.update(self._task, advance=len(batch), rate=f"{self.n_samples / elapsed:.1f}")

    def requests(self, target: HarvestTarget) -> Steps[HarvestReport]:
        """The run as its model requests: yields each remaining batch's ``(prompts, params)``,
        writes the answer sent back, and returns the report."""
        with self:
            for batch in self.open(target):
                prompts, params = self.request(batch)
                self.write(batch, prompts, (yield prompts, params))
            return self.close()

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("harvest run is not open")
        return self._fd

    def _start_progress(self, total: int) -> None:
        import rich.progress as rp
        from rich.console import Console

        self._progress = rp.Progress(
            rp.TextColumn("[bold]harvest[/bold] {task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
            rp.TextColumn("queries · {task.fields[rate]} samples/s"), rp.TimeElapsedColumn(),
            rp.TimeRemainingColumn(), console=Console(stderr=True),
        )  # fmt: skip
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

    def __enter__(self) -> HarvestRun:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None or self._progress is not None:
            self.close()


def _item_location(dataset: str | None, index: int, item_id: str) -> tuple[Path, int, str] | None:
    """Where item ``index`` (1-based) was read from, when ``dataset`` names its JSON-lines file (a
    file, ``folder@split`` or a one-split folder) and that file's ``index``-th line holds it: the
    file, the line and the field of its references (``answer`` for the shorthand); else ``None``."""
    if dataset is None:
        return None
    folder, at, split = dataset.rpartition("@")
    root, candidates = Path(folder if at else dataset), [Path(dataset)]
    if root.is_dir():
        splits = sorted(c for c in root.iterdir() if c.name.endswith((".jsonl", ".jsonl.gz")))
        candidates = [c for c in splits if not at or c.name.split(".")[0] == split]
    if len(candidates) != 1 or not candidates[0].is_file():
        return None
    with contextlib.suppress(DataError):
        for number, (line, obj) in enumerate(iter_json_objects(candidates[0]), start=1):
            if number == index and obj.get("id") == item_id:
                keys = [key for key in ("answer", "aliases", "answers") if key in obj]
                return candidates[0], line, keys[0] if keys else "references"
            if number >= index:
                break
    return None


@twin_of(HarvestRun)
def harvest(backend: Backend, *args: Any, **kwargs: Any) -> HarvestReport:
    """Sample ``k`` responses per query from ``backend``, grade them, and append labels to ``out``.

    Queries go to the backend ``batch_size`` at a time, as one ``generate`` call with
    ``SamplingParams(n=k, ...)``; each batch's records are appended to ``out`` and fsynced.
    Rerunning with the same arguments resumes, as the module docstring says.

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
    requests = HarvestRun(*args, **kwargs).requests(HarvestTarget.of(backend))
    return drive(requests, lambda request: backend.generate(*request))


@twin_of(HarvestRun)
async def aharvest(backend: AsyncBackend, *args: Any, **kwargs: Any) -> HarvestReport:
    """Async twin of :func:`harvest` for an :class:`~capgate.AsyncBackend` (same arguments and log)."""
    requests = HarvestRun(*args, **kwargs).requests(HarvestTarget.of(backend))
    return await adrive(requests, lambda request: backend.agenerate(*request))
