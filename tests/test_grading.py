"""capgate.grading: each grader on real benchmark items and realistic model responses."""

from __future__ import annotations

import itertools
import threading

import pytest

from capgate._util.text import boxed_contents, last_boxed
from capgate.datasets import AnswerKind, DatasetItem, load_dataset
from capgate.grading import (
    AliasGrader,
    ChoiceGrader,
    FunctionGrader,
    Grader,
    Judgement,
    MathGrader,
    NumericGrader,
    as_grader,
    grader_for,
    normalize_latex,
    normalize_text,
    parse_number,
)


def _item(kind: AnswerKind, *references: str) -> DatasetItem:
    return DatasetItem(id="q", question="?", kind=kind, references=list(references))


# --------------------------------------------------------------------------- boxed extraction


def test_boxed_braces_nest_and_escape() -> None:
    text = r"First \boxed{1}. Then $\boxed{\frac{\sqrt{2}}{2}}$, a set \boxed{\{1, 2\}} and \boxed 7$."
    assert boxed_contents(text) == ["1", r"\frac{\sqrt{2}}{2}", r"\{1, 2\}", "7"]
    assert last_boxed(r"\fbox{A} then \boxed{\text{(B)}}") == r"\text{(B)}"
    assert last_boxed(r"unclosed \boxed{1 + {2}") is None
    assert last_boxed("no box here") is None


# --------------------------------------------------------------------------- alias (TriviaQA)


def test_normalize_text_follows_triviaqa() -> None:
    assert normalize_text("The  Beatles!") == "beatles"
    assert normalize_text("Sunset Blvd.") == "sunset blvd"
    assert normalize_text("‘An’ Apple_Pie") == "apple pie"


@pytest.mark.parametrize(
    ("response", "answer", "correct"),
    [
        ("Sunset Boulevard", "sunset boulevard", True),
        ("sunset blvd.", "sunset blvd", True),
        ("**Sunset Boulevard**\n\nIt premiered in 1993.", "sunset boulevard", True),
        ("I believe it was Evita.\nFinal answer: Sunset Boulevard", "sunset boulevard", True),
        ("The answer is \\boxed{\\text{Sunset Boulevard}}", "sunset boulevard", True),
        ("Evita", "evita", False),
        ("It was Sunset Boulevard", "it was sunset boulevard", False),  # exact match by default
        ("", None, False),
    ],
)
def test_alias_grader_on_triviaqa(response: str, answer: str | None, correct: bool) -> None:
    item = load_dataset("triviaqa", limit=1)[0]  # tc_33, "Which Lloyd Webber musical ...?"
    assert AliasGrader().judge(response, item) == Judgement(answer=answer, correct=correct)


def test_alias_contains_mode() -> None:
    item = load_dataset("triviaqa", limit=1)[0]
    grader = AliasGrader(contains=True)
    assert grader.grade("It was Sunset Boulevard", item)
    assert not grader.grade("It was Sunset Boulevards", item)  # whole words only
    assert not grader.grade("Evita", item)


def test_alias_grader_over_all_triviaqa_values() -> None:
    """Every item's own answer value, dressed up, is accepted; a neighbour's is (almost) never."""
    items = load_dataset("triviaqa", limit=500)
    grader = AliasGrader()
    for item in items:
        value = item.metadata["value"]
        assert grader.grade(f"The {value.upper()}.", item), item.id
    accepted = sum(grader.grade(items[i - 1].metadata["value"], items[i]) for i in range(1, len(items)))
    assert accepted <= 2  # a neighbour can share an answer only by coincidence


# --------------------------------------------------------------------------- numeric (GSM8K)


def test_parse_number() -> None:
    assert parse_number("1,234.50") == 1234.5
    assert parse_number("\\$18") == 18
    assert parse_number("25\\%") == 25
    assert parse_number("-3/4") == -0.75
    assert parse_number("\\frac{3}{4}") == 0.75
    assert parse_number("−7") == -7
    assert parse_number("12 or 13") is None
    assert parse_number("none") is None


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("16 - 3 - 4 = 9 eggs, and 9 * 2 = 18. So she makes \\boxed{18} dollars.", "18"),
        ("9 * 2 = 18\n#### 18", "18"),
        ("She makes $18.00 every day.", "18"),
        ("The answer is 18. (She had 16 eggs.)", "18"),
        ("\\boxed{\\$18}", "18"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("The total is 1,018 dollars", "1018"),
        ("So half is \\boxed{\\frac{1}{2}}", "0.5"),
        ("I cannot tell.", None),
        ("\\boxed{\\text{eighteen}}", None),
    ],
)
def test_numeric_extraction(response: str, answer: str | None) -> None:
    assert NumericGrader().extract(response) == answer


def test_numeric_grader_on_gsm8k() -> None:
    items = load_dataset("gsm8k")
    grader = NumericGrader()
    janet = items[0]
    assert grader.grade("She sells 9 eggs at $2 each, so she makes $\\boxed{18}$.", janet)
    assert not grader.grade("She makes $\\boxed{16}$.", janet)
    assert grader.grade("She makes 18.0000001 dollars", janet)  # within the relative tolerance
    assert not NumericGrader(rel_tol=0, abs_tol=0).grade("She makes 18.0000001 dollars", janet)
    # GSM8K's own worked solutions ("... #### 18") grade correct, all 1319 of them
    assert all(grader.grade(item.metadata["solution"], item) for item in items)
    # and a neighbour's solution is wrong unless the two answers happen to coincide
    for previous, item in itertools.pairwise(items):
        same = float(previous.references[0]) == float(item.references[0])
        assert grader.grade(previous.metadata["solution"], item) == same


def test_numeric_reference_must_be_a_number() -> None:
    with pytest.raises(ValueError, match="numeric reference 'many' of item 'q' is not one number"):
        NumericGrader().grade("\\boxed{3}", _item("numeric", "many"))


def test_numeric_grader_on_basic_arithmetic() -> None:
    item = load_dataset("basic_arithmetic:hard", limit=1)[0]  # Calculate 65 * 835 =
    assert NumericGrader().grade("65 * 835 = 54,275", item)
    assert not NumericGrader().grade("65 * 835 = 54,285", item)


# --------------------------------------------------------------------------- math (MATH-500)


def test_normalize_latex() -> None:
    assert normalize_latex("\\left( 3, \\dfrac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert normalize_latex("14,\\!400") == "14400"
    assert normalize_latex("90^\\circ") == "90"
    assert normalize_latex("5\\text{ cm}.") == "5"
    assert normalize_latex("x = \\frac12") == "\\frac{1}{2}"
    assert normalize_latex("11\\sqrt2") == "11\\sqrt{2}"
    assert normalize_latex("2\\pi r") == "2\\pi{}r"  # a command still ends where it did
    assert normalize_latex("\\text{Evelyn}") == "Evelyn"


@pytest.mark.parametrize(
    ("reference", "response", "correct"),
    [
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "so $(r,\\theta) = \\boxed{(3, \\frac{\\pi}{2})}$.", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{\\left(3,\\pi/2\\right)}", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\pi)}", False),
        ("\\frac{1}{2}", "\\boxed{0.5}", True),
        ("x^2+2x+1", "\\boxed{(x+1)^2}", True),
        ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", True),
        ("[1,2)", "\\boxed{(1,2]}", False),
        ("\\sqrt{3}/2", "\\boxed{\\frac{\\sqrt{3}}{2}}", True),
        ("3, 5, 7", "\\boxed{7, 5, 3}", True),
        ("-\\frac{2}{3}", "Final Answer: The final answer is $-2/3$. I hope it is correct.", True),
        ("10", "no final answer given", False),
    ],
)
def test_math_grader_symbolic(reference: str, response: str, correct: bool) -> None:
    assert MathGrader().grade(response, _item("math", reference)) is correct


def test_math_grader_without_symbolic_compares_normal_forms() -> None:
    item = _item("math", "\\frac{1}{2}")
    assert MathGrader(symbolic=False).grade("\\boxed{\\dfrac12}", item)
    assert not MathGrader(symbolic=False).grade("\\boxed{0.5}", item)  # needs the symbolic check
    assert MathGrader(symbolic=True).grade("\\boxed{0.5}", item)


def test_math_grader_off_the_main_thread() -> None:
    """math-verify's SIGALRM timeouts only work in the main thread; off it the grader still works."""
    item = _item("math", "\\frac{1}{2}")
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(MathGrader().grade("\\boxed{0.50}", item)))
    worker.start()
    worker.join()
    assert results == [True]


def test_math_grader_on_math500_solutions() -> None:
    """Each MATH-500 worked solution grades correct for its own problem, wrong for its neighbour's."""
    items = load_dataset("math500", limit=60)
    grader = MathGrader()
    assert all(grader.grade(item.metadata["solution"], item) for item in items)
    for previous, item in itertools.pairwise(items):
        assert grader.grade(previous.metadata["solution"], item) == (
            normalize_latex(previous.references[0]) == normalize_latex(item.references[0])
        ), (previous.id, item.id)


# --------------------------------------------------------------------------- choice (MMLU, ARC)


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B. 4", "B"),
        ("**B**", "B"),
        ("B\n\nExplanation: a degree-4 extension.", "B"),
        ("A\nThe others are too small.", "A"),
        ("The answer is (B).", "B"),
        ("The correct answer is B, because a degree-4 extension ...", "B"),
        ("**Answer:** B", "B"),
        ("Let me think. A is wrong, C is too small.\nAnswer: D", "D"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("A good question! The answer is C.", "C"),
        ("A field extension of degree 4.", None),  # "A" followed by a word is English
        ("I think so.", None),
        ("option B", "B"),
        ("Option B", "B"),  # the prefix in any case (was None)
        ("Option B.", "B"),
        ("Option B: Paris", "B"),
        ("**Option B**", "B"),
        ("OPTION (C)", "C"),
        ("The answer is Option B.", "B"),
        ("Option b", None),  # the letter itself must be a capital
    ],
)
def test_choice_extraction(response: str, answer: str | None) -> None:
    assert ChoiceGrader().extract(response) == answer


def test_choice_grader_on_mmlu_and_arc() -> None:
    grader = ChoiceGrader()
    mmlu = load_dataset("mmlu:abstract_algebra", limit=1)[0]  # correct: B ("4")
    assert grader.judge("The answer is (B).", mmlu) == Judgement(answer="B", correct=True)
    assert grader.judge("The answer is (A).", mmlu) == Judgement(answer="A", correct=False)
    assert grader.judge("4", mmlu) == Judgement(answer="B", correct=True)  # the option's text
    assert grader.judge("E", mmlu) == Judgement(answer="E", correct=False)  # no option E
    arc = load_dataset("arc_challenge", limit=50)
    for item in arc:
        right = item.references[0]
        wrong = next(letter for letter in item.letters if letter != right)
        assert grader.grade(f"Answer: {right}", item)
        assert not grader.grade(f"Answer: {wrong}", item)
        texts = [t.lower() for t in item.choices or []]
        if len(set(texts)) == len(texts):
            assert grader.grade(item.correct_choices[0], item)


# --------------------------------------------------------------------------- user callables and the chooser


def test_function_grader() -> None:
    item = DatasetItem(id="u", question="Say hi", kind="custom")
    grader = as_grader(lambda response, item: "hi" in response.lower())
    assert isinstance(grader, FunctionGrader)
    assert grader.judge("Hi there.", item) == Judgement(answer="hi there", correct=True)
    assert grader.judge("Hello", item) == Judgement(answer="hello", correct=False)
    custom = FunctionGrader(lambda r, i: r == "x", extract=lambda r: r.upper(), name="exact-x")
    assert custom.judge("x", item) == Judgement(answer="X", correct=True)
    assert repr(custom) == "FunctionGrader(exact-x)"
    bad = FunctionGrader(lambda r, i: 1)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="must return a bool; got int"):
        bad.grade("x", item)
    with pytest.raises(TypeError, match="expected a Grader or a function"):
        as_grader(42)  # type: ignore[arg-type]


def test_grader_for_chooses_by_kind() -> None:
    assert isinstance(grader_for("alias"), AliasGrader)
    assert isinstance(grader_for("numeric"), NumericGrader)
    assert isinstance(grader_for("math"), MathGrader)
    assert isinstance(grader_for(load_dataset("arc_easy", limit=1)[0]), ChoiceGrader)
    with pytest.raises(ValueError, match="kind 'custom' have no default grader"):
        grader_for("custom")
    with pytest.raises(ValueError, match="unknown answer kind 'essay'"):
        grader_for("essay")


def test_every_grader_is_a_grader_and_callable() -> None:
    item = _item("numeric", "5")
    for grader in (AliasGrader(), NumericGrader(), MathGrader(), ChoiceGrader()):
        assert isinstance(grader, Grader)
    assert NumericGrader()("\\boxed{5}", item) is True
