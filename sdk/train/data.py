"""C3RL's training data: labelled questions checked, split, and put in the shapes the trainers read.

The labels are what :func:`capgate.labels.harvest` writes (one
:class:`~capgate.core.types.LabelledQuery` a line, k sampled answers each, ``<labels>.meta.json``
naming the model sampled). The refusals live here: labels without all three reference classes,
labels harvested from another model than the one to train, and tagged answers graded with their tag.
"""

from __future__ import annotations

import json
import random
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from capgate._util.jsonl import data_error_from_validation
from capgate.cas.confidence import CONFIDENCE_INSTRUCTION, strip_confidence_tag, with_confidence_instruction
from capgate.core.backend import as_messages
from capgate.core.types import LabelledQuery
from capgate.datasets import DatasetItem, build_prompt
from capgate.errors import DataError
from capgate.labels import meta_path
from capgate.labels.labelled import iter_labelled
from capgate.train.config import WarmStartConfidence
from capgate.train.rewards import REFERENCE_CLASSES, TAG_STEP, ReferenceClass, reference_class

__all__ = [
    "LabelledExample",
    "check_labels_harvest",
    "check_labels_model",
    "check_spread",
    "grpo_rows",
    "load_examples",
    "round_to_step",
    "split_examples",
    "warm_answer_sources",
    "warm_start_rows",
]


@dataclass(frozen=True)
class LabelledExample:
    """One labelled question, ready to train on.

    Attributes:
        item: The question, references and kind (its grader).
        messages: The chat prompt the model is trained and served with: the harvest's prompt
            with :data:`~capgate.cas.confidence.CONFIDENCE_INSTRUCTION` as the system turn.
        reference: Its reference class from the base model's k samples.
        mu_hat: The base model's µ̂ = correct / k.
        answers: The base model's extracted answers (``None`` where none was found), in order.
        finished: The texts (tags stripped) of its sampled answers that ended on their own, when
            the labels kept texts (``harvest(keep_text=True)``); see :func:`warm_start_rows`.
        tagged: Its answers may carry the ``[confidence=X%]`` tag: a kept text carries one, or,
            texts not kept, the harvest's prompt asked for it (it held
            :data:`~capgate.cas.confidence.CONFIDENCE_INSTRUCTION`); see :func:`check_labels_harvest`.
    """

    item: DatasetItem
    messages: list[dict[str, str]]
    reference: ReferenceClass
    mu_hat: float
    answers: tuple[str | None, ...]
    finished: tuple[str, ...] = ()
    tagged: bool = False


def _item_of(record: LabelledQuery, path: Path, line: int) -> DatasetItem:
    extra = record.model_extra or {}
    kind = extra.get("kind")
    present = {"question": record.question, "references": record.references, "kind": kind}
    for name, value in present.items():
        if not value:
            raise DataError(
                f"record {record.id!r}: a C3RL label needs the question, its references and its kind "
                f"(as capgate harvest writes them); no {name}",
                path=path,
                line=line,
                field=name,
            )
    try:
        return DatasetItem(
            id=record.id,
            question=record.question,
            references=record.references,
            kind=kind,
            choices=extra.get("choices"),
        )
    except ValidationError as exc:
        raise data_error_from_validation(exc, path=path, line=line) from None


def _messages_of(record: LabelledQuery, item: DatasetItem, path: Path, line: int) -> list[dict[str, str]]:
    """The record's prompt (as harvested; else the item's default) as chat messages."""
    prompt = (record.model_extra or {}).get("prompt") or build_prompt(item)
    try:
        messages = [{"role": m["role"], "content": m["content"]} for m in as_messages(prompt)]
    except (KeyError, TypeError):
        messages = []
    if not messages or not all(isinstance(v, str) for m in messages for v in m.values()):
        raise DataError(
            f"record {record.id!r}: the prompt must be a string or chat messages with a role and a content",
            path=path,
            line=line,
            field="prompt",
        )
    return messages


def _ended(n_tokens: int | None, max_tokens: int | None) -> bool:
    """Whether a sampled answer ended on its own (fewer tokens than the harvest's limit)."""
    return n_tokens is not None and max_tokens is not None and n_tokens < max_tokens


def load_examples(path: str | Path, *, max_tokens: int | None = None) -> list[LabelledExample]:
    """Read a labelled file into examples (see :class:`LabelledExample`).

    ``max_tokens`` is the harvest's token limit (its settings file records it): sampled texts
    shorter than it ended on their own and may serve as warm-start answers.

    Raises:
        DataError: An unreadable or empty file, or a record without question, references, kind or
            per-sample answers, or with a bad kind or prompt (naming file, line and field).
    """
    path = Path(path)
    examples: list[LabelledExample] = []
    for line, record in iter_labelled(path):
        item = _item_of(record, path, line)
        messages = _messages_of(record, item, path, line)
        if not record.samples:
            raise DataError(
                f"record {record.id!r}: a C3RL label needs its per-sample answers (harvest writes them; "
                "the warm start trains on the model's own answers)",
                path=path,
                line=line,
                field="samples",
            )
        texts = [sample.text for sample in record.samples]
        tagged = any(text and strip_confidence_tag(text) != text.rstrip() for text in texts) or (
            None in texts and any(CONFIDENCE_INSTRUCTION in m["content"] for m in messages)
        )
        if not (messages[0]["role"] == "system" and CONFIDENCE_INSTRUCTION in messages[0]["content"]):
            messages = [dict(m) for m in with_confidence_instruction(messages)]  # type: ignore[arg-type]
        examples.append(
            LabelledExample(
                item=item,
                messages=messages,
                reference=reference_class(record.correct, record.k),
                mu_hat=record.correct / record.k,
                answers=tuple(sample.answer for sample in record.samples),
                finished=tuple(
                    strip_confidence_tag(sample.text).strip()
                    for sample in record.samples
                    if sample.text and sample.text.strip() and _ended(sample.n_tokens, max_tokens)
                ),
                tagged=tagged,
            )
        )
    if not examples:
        raise DataError("no records (the file is empty)", path=path)
    return examples


def check_spread(examples: list[LabelledExample], *, path: str | Path, held_out: int = 0) -> dict[str, int]:
    """The count of each reference class; refuse labels that lack one.

    ``held_out``: how many questions were held out of ``examples`` (the training split), named in
    the error.

    Raises:
        DataError: Some class is empty: the reference term, and the calibration signal, need
            questions the model always, sometimes and never gets right.
    """
    counts = Counter(example.reference for example in examples)
    spread: dict[str, int] = {name: counts.get(name, 0) for name in REFERENCE_CLASSES}
    missing = [name for name, count in spread.items() if not count]
    if missing:
        shown = ", ".join(f"{count} {name}" for name, count in spread.items())
        which = "the labels have"
        if held_out:
            which = (
                f"the labels left to train on once {held_out} questions are held out for evaluation "
                "(eval_fraction, eval_max, seed) have"
            )
        raise DataError(
            f"{which} no {' and no '.join(missing)} questions ({shown}); C3RL needs questions "
            "the model always, sometimes and never answers right: add easier or harder ones "
            "(capgate.train.synthetic.arithmetic_items spreads a small model's accuracy)",
            path=Path(path),
        )
    return spread


def check_labels_model(labels: str | Path, *, model_id: str, fingerprint: str) -> dict[str, Any]:
    """Refuse to train a model on labels harvested from another one; return the harvest settings.

    The labels' ``<labels>.meta.json`` (written by :func:`capgate.labels.harvest`) names the
    model sampled: its ``weights_fingerprint`` when recorded, else its ``model_id``.

    Raises:
        DataError: No settings file, or one naming another model.
    """
    path = meta_path(labels)
    if not path.is_file():
        raise DataError(
            "no harvest settings next to the labels: C3RL checks that the labels were sampled from the "
            "model it trains (harvest with capgate harvest, or write this file with that model's "
            "weights_fingerprint)",
            path=path,
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable harvest settings: {exc}", path=path) from None
    if not isinstance(meta, dict):
        raise DataError("expected a JSON object of harvest settings", path=path)
    recorded = meta.get("weights_fingerprint")
    if isinstance(recorded, str) and recorded:
        if recorded != fingerprint:
            raise DataError(
                f"the labels were harvested from weights {recorded}, not from this model's {fingerprint}: "
                "the reference classes describe another model; harvest this model first",
                path=path,
                field="weights_fingerprint",
            )
    elif meta.get("model_id") != model_id:
        raise DataError(
            f"the labels were harvested from model {meta.get('model_id')!r}, not from {model_id!r} "
            f"(fingerprint {fingerprint}): the reference classes describe another model; harvest "
            "this model first",
            path=path,
            field="model_id",
        )
    return meta


def check_labels_harvest(
    examples: list[LabelledExample], meta: dict[str, Any], *, labels: str | Path
) -> None:
    """Refuse labels whose answers were graded with their ``[confidence=X%]`` tag in them; warn when
    the harvest kept no texts.

    A harvest strips the tag before grading only when given a confidence source
    (``harvest(confidence=verbalized_confidence)``, ``capgate harvest --confidence-tag``); without one,
    the tag's number is graded as the answer, so the reference classes (and the warm start's
    answers) are wrong. Without kept texts (``keep_text=True``, ``--keep-text``) the warm start
    trains on bare extracted answers (see :func:`warm_start_rows`).

    Raises:
        DataError: The harvest settings name no ``confidence`` source, and a kept text carries the
            tag or, texts not kept, the prompt asked for it.
    """
    if meta.get("confidence") is None and any(example.tagged for example in examples):
        raise DataError(
            "the harvest named no confidence source, yet its answers carry the [confidence=X%] tag (a "
            "kept text holds one, or, texts not kept, the prompt asks for it): each tagged answer was "
            "graded with its tag, the tag's number read as the answer, so the reference classes are "
            "wrong; harvest again with confidence=verbalized_confidence (capgate harvest --confidence-tag)",
            path=meta_path(labels),
            field="confidence",
        )
    if meta.get("keep_text") is not True:
        warnings.warn(
            f"{labels}: the harvest kept no answer texts (keep_text is not true in {meta_path(labels)}), "
            "so the warm start trains on bare extracted answers, not on the model's own way of answering "
            "(on SmolLM2-135M this taught it to repeat an operand); harvest with keep_text=True "
            "(capgate harvest --keep-text)",
            stacklevel=3,
        )


def split_examples(
    examples: list[LabelledExample], *, eval_fraction: float, eval_max: int, seed: int
) -> tuple[list[LabelledExample], list[LabelledExample]]:
    """``(train, held_out)``: a seeded share of the questions (at most ``eval_max``) held out."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_eval = min(round(eval_fraction * len(examples)), eval_max, max(len(examples) - 1, 0))
    held = set(order[:n_eval])
    train = [e for i, e in enumerate(examples) if i not in held]
    return train, [e for i, e in enumerate(examples) if i in held]


def round_to_step(p: float) -> int:
    """A probability as a whole percentage in steps of 5.

    Examples:
        >>> round_to_step(0.33), round_to_step(0.975)
        (35, 100)
    """
    return int(TAG_STEP * round(100.0 * min(max(p, 0.0), 1.0) / TAG_STEP))


def _answer_text(item: DatasetItem, answer: str) -> str:
    return f"\\boxed{{{answer}}}" if item.kind == "math" else answer


MAX_BALANCE_COPIES = 4
"""Most rows one question gets when the warm start balances the reference classes."""


def warm_start_rows(
    examples: list[LabelledExample], *, confidence: WarmStartConfidence, seed: int, balance: bool = False
) -> list[tuple[list[dict[str, str]], str]]:
    """``(messages, answer)`` pairs for the warm start: one of the model's own sampled answers to
    each question (so its accuracy is not taught, only the format), ending with the tag.

    The answer is one of the model's own texts that ended on their own (:attr:`LabelledExample.finished`),
    so it keeps its way of answering; without kept texts, its extracted answer alone. (Measured on
    SmolLM2-135M: bare extracted answers, often an operand read from an answer cut off mid-way,
    taught it to repeat an operand: accuracy 0.20 -> 0.01, bench/RESULTS.md.)

    The stated confidence is the question's µ̂ (``"mu_hat"``) or the labels' base rate
    (``"constant"``), rounded to 5%. Questions with no extracted answer are skipped.

    ``balance``: each reference class gives as many rows as the largest one (its questions
    repeated, each copy with another of its answers drawn, at most :data:`MAX_BALANCE_COPIES` per
    question), so the warm start does not teach the majority class's stated value alone (measured
    on SmolLM2-135M, 60% all-wrong labels: it stated 0% on 454 of 456 test answers).
    """
    rng = random.Random(seed)
    base_rate = sum(e.mu_hat for e in examples) / max(len(examples), 1)
    usable = [(e, _warm_answers(e)) for e in examples]
    usable = [(e, answers) for e, answers in usable if answers]
    sizes = Counter(e.reference for e, _ in usable)
    target = max(sizes.values(), default=0)
    seen: Counter[str] = Counter()
    rows: list[tuple[list[dict[str, str]], str]] = []
    for example, answers in usable:
        copies = 1
        if balance:  # the class's share spread evenly over its questions, the first taking the rest
            size = sizes[example.reference]
            share = min(target, MAX_BALANCE_COPIES * size)
            copies = share // size + (seen[example.reference] < share % size)
            seen[example.reference] += 1
        stated = round_to_step(example.mu_hat if confidence == "mu_hat" else base_rate)
        for _ in range(copies):
            rows.append((example.messages, f"{rng.choice(answers)} [confidence={stated}%]"))
    return rows


def _warm_answers(example: LabelledExample) -> list[str]:
    return list(example.finished) or [_answer_text(example.item, a) for a in example.answers if a]


def warm_answer_sources(examples: list[LabelledExample]) -> dict[str, int]:
    """How many questions the warm start answers with the model's own texts (``"own_texts"``) and
    how many with bare extracted answers only (``"extracted"``: no kept text ended on its own)."""
    own = sum(bool(example.finished) for example in examples)
    extracted = sum(not example.finished and any(example.answers) for example in examples)
    return {"own_texts": own, "extracted": extracted}


def grpo_rows(examples: list[LabelledExample]) -> list[dict[str, Any]]:
    """The GRPO dataset: a chat ``prompt`` and the columns the rewards read (``item``,
    ``reference_class``), plus ``id``."""
    return [
        {
            "prompt": example.messages,
            "item": example.item.model_dump_json(),
            "reference_class": example.reference,
            "id": example.item.id,
        }
        for example in examples
    ]
