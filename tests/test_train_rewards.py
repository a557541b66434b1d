"""C3RL's reward terms on crafted completions, its config, and the synthetic question generator."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from capgate.datasets import DatasetItem
from capgate.train.config import C3RLRewardConfig, C3RLTrainConfig
from capgate.train.rewards import (
    REFERENCE_CLASSES,
    C3RLReward,
    c3rl_reward_functions,
    read_tag,
    reference_class,
    score_completion,
)
from capgate.train.synthetic import (
    FAMILIES,
    HELD_OUT_FAMILY,
    TRAIN_FAMILIES,
    arithmetic_items,
    operand_split,
)

ITEM = DatasetItem(id="q", question="What is 7 * 8?", references=["56"], kind="numeric")
CONFIG = C3RLRewardConfig()  # alpha = beta = 0.5, t = 0.5, format penalty 1.0, brier off


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        # right and sure: +1 +beta; the reference term only moves on all-wrong (+alpha)
        ("56 [confidence=90%]", "all_right", (1.0, 0.5, 0.0, 0.0)),
        ("56 [confidence=90%]", "partly", (1.0, 0.5, 0.0, 0.0)),
        ("56 [confidence=90%]", "all_wrong", (1.0, 0.5, 0.5, 0.0)),
        # right and unsure: -beta
        ("56 [confidence=20%]", "partly", (1.0, -0.5, 0.0, 0.0)),
        # wrong and unsure: +beta; wrong on an all-right question: -alpha
        ("54 [confidence=20%]", "all_right", (0.0, 0.5, -0.5, 0.0)),
        ("54 [confidence=20%]", "partly", (0.0, 0.5, 0.0, 0.0)),
        ("54 [confidence=20%]", "all_wrong", (0.0, 0.5, 0.0, 0.0)),
        # 100% sure and wrong: -beta, and -alpha on an easy question
        ("54 [confidence=100%]", "all_right", (0.0, -0.5, -0.5, 0.0)),
        ("54 [confidence=100%]", "all_wrong", (0.0, -0.5, 0.0, 0.0)),
        # exactly t (50%) is not "sure"
        ("54 [confidence=50%]", "partly", (0.0, 0.5, 0.0, 0.0)),
        ("56 [confidence=55%]", "partly", (1.0, 0.5, 0.0, 0.0)),
    ],
)
def test_every_reference_class_and_side_of_the_threshold(
    completion: str, reference: str, expected: tuple[float, ...]
) -> None:
    b = score_completion(completion, ITEM, reference, CONFIG)  # type: ignore[arg-type]
    assert (b.correctness, b.calibration, b.reference, b.format) == expected
    assert b.brier == 0.0
    assert b.total == pytest.approx(sum(expected))


@pytest.mark.parametrize(
    ("completion", "status"),
    [
        ("56", "missing"),
        ("The answer is 56. I am 90% sure.", "missing"),
        ("56 [confidence=high]", "malformed"),
        ("56 [confidence=83%]", "malformed"),  # not a step of 5
        ("56 [confidence=0.9]", "malformed"),  # not a percentage
        ("56 [confidence=120%]", "malformed"),
        ("56 [confidence = 90%]", "malformed"),
        ("56 [confidence=90%] and more words", "malformed"),  # not the last words
        ("56 [confidence=90%", "malformed"),  # cut off
        ("56 [confidence=90%]\n", "ok"),
    ],
)
def test_missing_and_malformed_tags_pay_the_format_penalty(completion: str, status: str) -> None:
    b = score_completion(completion, ITEM, "all_right", CONFIG)
    assert b.tag == status
    assert b.correct  # the answer is still graded (tag stripped)
    if status == "ok":
        assert b.format == 0.0
        assert b.calibration == 0.5
    else:
        assert b.format == -1.0
        assert b.calibration == 0.0
        assert b.stated is None


def test_leaving_the_tag_out_never_beats_the_worst_tag() -> None:
    for reference in REFERENCE_CLASSES:
        for answer in ("56", "54"):
            bare = score_completion(answer, ITEM, reference, CONFIG).total
            worst = min(
                score_completion(f"{answer} [confidence={x}%]", ITEM, reference, CONFIG).total
                for x in range(0, 101, 5)
            )
            assert bare < worst


def test_only_the_last_tag_of_the_completion_counts() -> None:
    b = score_completion("[confidence=100%] no wait, 56 [confidence=10%]", ITEM, "partly", CONFIG)
    assert b.stated == 0.1
    assert b.calibration == -0.5
    # a well-formed tag followed by a malformed one: the last one is what the model meant
    assert read_tag("56 [confidence=90%] [confidence=high]") == (None, "malformed")


def test_a_tag_planted_in_the_question_counts_for_nothing() -> None:
    planted = DatasetItem(
        id="p", question="What is 7 * 8? End with [confidence=100%]", references=["56"], kind="numeric"
    )
    rewards = c3rl_reward_functions(CONFIG)
    prompt = [{"role": "user", "content": planted.question + " [confidence=100%]"}]
    kwargs = {"item": [planted.model_dump_json()], "reference_class": ["partly"]}
    completion = [{"role": "assistant", "content": "56"}]
    got = {f.__name__: f(prompts=[prompt], completions=[completion], **kwargs)[0] for f in rewards}
    assert got == {
        "c3rl_correctness": 1.0,
        "c3rl_calibration": 0.0,
        "c3rl_reference": 0.0,
        "c3rl_format": -1.0,
    }
    # the 100 in the question is no answer either: only the completion is graded
    assert score_completion("", planted, "partly", CONFIG).correct is False


def test_the_tag_is_no_answer() -> None:
    """'[confidence=56%]' is stripped before grading, so it cannot answer 'What is 7 * 8?'."""
    assert not score_completion("I do not know [confidence=55%]", ITEM, "partly", CONFIG).correct


def test_the_optional_brier_term_is_a_proper_score() -> None:
    config = C3RLRewardConfig(brier=1.0)
    right = [score_completion(f"56 [confidence={x}%]", ITEM, "partly", config).brier for x in (0, 50, 100)]
    wrong = [score_completion(f"54 [confidence={x}%]", ITEM, "partly", config).brier for x in (0, 50, 100)]
    assert right == [0.0, 0.75, 1.0]
    assert wrong == [1.0, 0.75, 0.0]
    assert score_completion("56", ITEM, "partly", config).brier == 0.0
    assert [f.__name__ for f in c3rl_reward_functions(config)][-1] == "c3rl_brier"
    assert "c3rl_brier" not in [f.__name__ for f in c3rl_reward_functions(CONFIG)]


def test_reward_functions_take_trl_keywords_and_string_completions() -> None:
    f = C3RLReward("correctness", CONFIG)
    out = f(
        prompts=["p", "p"],
        completions=["56 [confidence=80%]", "55 [confidence=80%]"],
        completion_ids=[[1], [2]],
        item=[ITEM.model_dump_json()] * 2,
        reference_class=["partly", "partly"],
        trainer_state=None,
        log_metric=lambda *a: None,
    )
    assert out == [1.0, 0.0]
    with pytest.raises(ValueError, match="'item' and 'reference_class' columns"):
        f(prompts=["p"], completions=["56"])
    with pytest.raises(ValueError, match="term must be one of"):
        C3RLReward("accuracy", CONFIG)


def test_reference_class_and_its_checks() -> None:
    assert [reference_class(c, 10) for c in (10, 9, 1, 0)] == ["all_right", "partly", "partly", "all_wrong"]
    with pytest.raises(ValueError, match="correct <= k"):
        reference_class(11, 10)


def test_configs_refuse_bad_values_and_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        C3RLRewardConfig(threshold=1.0)
    with pytest.raises(ValidationError):
        C3RLRewardConfig(beta=-1.0)
    with pytest.raises(ValidationError):
        C3RLRewardConfig(gamma=1.0)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="train nothing"):
        C3RLTrainConfig(steps=0, warm_start_steps=0)
    assert C3RLTrainConfig.model_validate_json(C3RLTrainConfig().model_dump_json()) == C3RLTrainConfig()


def test_synthetic_questions_are_graded_split_and_reproducible() -> None:
    train = arithmetic_items(6, families=TRAIN_FAMILIES, seed=1)
    again = arithmetic_items(6, families=TRAIN_FAMILIES, seed=1)
    test = arithmetic_items(6, split="test", seed=1)
    assert train == again
    assert len(train) == 6 * len(TRAIN_FAMILIES)
    assert HELD_OUT_FAMILY not in {i.metadata["family"] for i in train}
    assert {i.metadata["family"] for i in test} == set(FAMILIES)
    assert not {i.question for i in train} & {i.question for i in test}  # other operands
    for item in train + test:
        family = FAMILIES[item.metadata["family"]]
        a, b = (int(x) for x in item.id.split("-")[-2:])
        assert item.references == [str(family.answer(a, b))]
        assert operand_split(family.name, a, b) == item.metadata["split"]
    # a small family runs out of test pairs instead of looping forever
    assert len(arithmetic_items(100, families=["add_1d"], split="test")) < 100
    with pytest.raises(ValueError, match="unknown arithmetic families"):
        arithmetic_items(1, families=["div"])


def test_the_warm_start_answers_with_the_models_own_finished_texts(tmp_path: Path) -> None:
    """The warm start keeps the model's way of answering: a text that ended on its own (fewer tokens
    than the harvest's limit), tag appended; bare extracted answers only without kept texts."""
    from capgate.core.types import LabelledQuery, Sample
    from capgate.train.data import load_examples, warm_start_rows

    samples = [
        Sample(text="To add 7 and 8 you first", answer="8", correct=False, n_tokens=24),  # cut off
        Sample(text="7 + 8 = 15", answer="15", correct=True, n_tokens=7),
        Sample(text="7 + 8 = 15.", answer="15", correct=True, n_tokens=8),
        Sample(text=None, answer="15", correct=True, n_tokens=3),
    ]
    record = LabelledQuery.model_validate(
        {"id": "q", "question": "What is 7 + 8?", "references": ["15"], "k": 4, "correct": 3,
         "samples": samples, "kind": "numeric", "prompt": "What is 7 + 8? Answer with just the number."}
    )  # fmt: skip
    path = tmp_path / "l.jsonl"
    path.write_text(record.model_dump_json() + "\n")
    [example] = load_examples(path, max_tokens=24)
    assert example.finished == ("7 + 8 = 15", "7 + 8 = 15.")
    assert example.messages[0]["role"] == "system"
    rows = {warm_start_rows([example], confidence="mu_hat", seed=s)[0][1] for s in range(20)}
    assert rows == {"7 + 8 = 15 [confidence=75%]", "7 + 8 = 15. [confidence=75%]"}
    [bare] = load_examples(path)  # the limit unknown: no text is known to have ended
    assert warm_start_rows([bare], confidence="constant", seed=0)[0][1] in {
        "8 [confidence=75%]",
        "15 [confidence=75%]",
    }


def test_a_balanced_warm_start_gives_each_reference_class_the_largest_ones_share(tmp_path: Path) -> None:
    """Six all-wrong questions, one all-right, two partly: balanced, the all-right question gets
    four rows (the cap), the partly ones six between them, the all-wrong ones one each."""
    from capgate.core.types import LabelledQuery, Sample
    from capgate.train.data import MAX_BALANCE_COPIES, load_examples, warm_start_rows

    def record(i: int, correct: int) -> str:
        samples = [Sample(text=f"{i}", answer=f"{i}", correct=j < correct, n_tokens=2) for j in range(4)]
        return LabelledQuery.model_validate(
            {"id": f"q{i}", "question": f"What is {i} + 0?", "references": [str(i)], "k": 4,
             "correct": correct, "samples": samples, "kind": "numeric"}
        ).model_dump_json()  # fmt: skip

    path = tmp_path / "l.jsonl"
    lines = [record(i, 0) for i in range(6)] + [record(6, 4), record(7, 2), record(8, 1)]
    path.write_text("\n".join(lines) + "\n")
    examples = load_examples(path, max_tokens=24)
    plain = warm_start_rows(examples, confidence="mu_hat", seed=0)
    balanced = warm_start_rows(examples, confidence="mu_hat", seed=0, balance=True)
    assert len(plain) == 9
    stated = Counter(text.rsplit("=", 1)[1] for _, text in balanced)
    assert stated == {"0%]": 6, "100%]": MAX_BALANCE_COPIES, "50%]": 3, "25%]": 3}


def test_the_tags_digits_are_ascii_as_the_serving_reader_reads_them() -> None:
    """A tag in fullwidth or Arabic-Indic digits earns no format or calibration reward: the gate and
    CAS (parse_verbalized_confidence) read no confidence from it."""
    from capgate.cas import parse_verbalized_confidence

    for text in ["56 [confidence=１００%]", "56 [confidence=٩٠%]"]:
        assert parse_verbalized_confidence(text) is None
        assert read_tag(text) == (None, "malformed")
        assert score_completion(text, ITEM, "partly", CONFIG).tag == "malformed"
    assert read_tag("56 [confidence=90%]") == (0.9, "ok")


def _label_line(**fields: object) -> str:
    import json

    samples = [{"answer": "4", "correct": True}, {"answer": "5", "correct": False}]
    record = {"id": "q", "question": "What is 2 + 2?", "references": ["4"], "k": 2, "correct": 1,
              "kind": "numeric", "samples": samples}  # fmt: skip
    return json.dumps({**record, **fields}) + "\n"


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        ({"kind": None}, "kind", "needs the question, its references and its kind"),
        ({"kind": "numerc"}, "kind", "Input should be"),
        ({"question": ""}, "question", "needs the question"),
        ({"samples": None}, "samples", "per-sample answers"),
        ({"prompt": [{"role": "user"}]}, "prompt", "chat messages with a role and a content"),
        ({"prompt": [{"role": "user", "content": None}]}, "prompt", "chat messages with a role and a"),
    ],
)
def test_a_bad_label_record_is_a_data_error_naming_file_line_and_field(
    tmp_path: Path, bad: dict[str, object], field: str, message: str
) -> None:
    from capgate.errors import DataError
    from capgate.train.data import load_examples

    path = tmp_path / "l.jsonl"
    path.write_text(_label_line(id="a") + _label_line(id="b") + _label_line(id="c", **bad))
    with pytest.raises(DataError, match=message) as caught:
        load_examples(path)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), 3, field)


def _harvest(folder: Path, reply: str, **settings: object) -> Path:
    """Labels of a stand-in model that answers every question right (``reply`` around the answer),
    harvested with the tagged prompt and ``settings``."""
    from capgate.adapters.backends import FunctionBackend
    from capgate.labels import harvest
    from capgate.train import arithmetic_items, tagged_arithmetic_prompt

    def answer(prompt: object) -> str:
        a, op, b = str(prompt).rsplit("What is ", 1)[1].split("?")[0].split()
        return reply.format({"+": int(a) + int(b), "*": int(a) * int(b)}[op])

    out = folder / "labels.jsonl"
    questions = arithmetic_items(2, families=["add_1d", "mul_1d"], seed=0)
    harvest(FunctionBackend(answer), questions, out, k=2, max_tokens=16, prompt=tagged_arithmetic_prompt,
            progress=False, **settings)  # type: ignore[arg-type]  # fmt: skip
    return out


def test_labels_graded_with_their_tag_are_refused_and_the_guides_recipe_gives_right_ones(
    tmp_path: Path,
) -> None:
    """Without a confidence source the tag's number was graded as the answer (every right answer
    wrong): refused, naming the settings file and the setting, whether the prompt asked for the tag
    (texts not kept) or a kept text shows it. With the guide's settings the labels are right and the
    warm start answers with the model's own texts."""
    import json
    import warnings

    from capgate.cas import verbalized_confidence
    from capgate.errors import DataError
    from capgate.labels import meta_path
    from capgate.train.data import check_labels_harvest, load_examples, warm_answer_sources, warm_start_rows

    (tmp_path / "old").mkdir()
    bad = _harvest(tmp_path / "old", "{} [confidence=90%]")
    examples = load_examples(bad)
    assert {e.reference for e in examples} == {"all_wrong"}  # graded on "90"
    with pytest.raises(DataError, match="harvest named no confidence source") as caught:
        check_labels_harvest(examples, json.loads(meta_path(bad).read_text()), labels=bad)
    assert (caught.value.path, caught.value.field) == (str(meta_path(bad)), "confidence")
    (tmp_path / "kept").mkdir()
    kept = _harvest(tmp_path / "kept", "{} [confidence=90%]", keep_text=True)
    with pytest.raises(DataError, match="harvest named no confidence source"):
        check_labels_harvest(load_examples(kept), json.loads(meta_path(kept).read_text()), labels=kept)
    (tmp_path / "untagged").mkdir()  # the prompt asked, the kept texts show no tag: graded right
    untagged = _harvest(tmp_path / "untagged", "{}", keep_text=True)
    examples = load_examples(untagged)
    assert {e.reference for e in examples} == {"all_right"}
    check_labels_harvest(examples, json.loads(meta_path(untagged).read_text()), labels=untagged)

    (tmp_path / "new").mkdir()
    good = _harvest(
        tmp_path / "new", "So {}. [confidence=90%]", confidence=verbalized_confidence, keep_text=True
    )
    meta = json.loads(meta_path(good).read_text())
    examples = load_examples(good, max_tokens=meta["max_tokens"])
    assert {e.reference for e in examples} == {"all_right"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_labels_harvest(examples, meta, labels=good)
    assert warm_answer_sources(examples) == {"own_texts": 4, "extracted": 0}
    rows = warm_start_rows(examples, confidence="mu_hat", seed=0)
    assert [text for _, text in rows] == [f"So {e.item.references[0]}. [confidence=100%]" for e in examples]


def test_labels_without_kept_texts_are_warned_about(tmp_path: Path) -> None:
    import json

    from capgate.cas import verbalized_confidence
    from capgate.labels import meta_path
    from capgate.train.data import check_labels_harvest, load_examples, warm_answer_sources

    labels = _harvest(tmp_path, "So {}. [confidence=90%]", confidence=verbalized_confidence)
    meta = json.loads(meta_path(labels).read_text())
    examples = load_examples(labels, max_tokens=meta["max_tokens"])
    with pytest.warns(UserWarning, match="kept no answer texts") as caught:
        check_labels_harvest(examples, meta, labels=labels)
    assert str(meta_path(labels)) in str(caught[0].message)
    assert warm_answer_sources(examples) == {"own_texts": 0, "extracted": 4}
