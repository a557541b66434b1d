"""Per-response confidence: the verbalized tag parser, the instruction template, logprob confidence."""

from __future__ import annotations

import math

import pytest

from capgate.cas import (
    CONFIDENCE_INSTRUCTION,
    DEFAULT_CONFIDENCE,
    LogprobConfidence,
    deepconf_score,
    first_available,
    parse_verbalized_confidence,
    strip_confidence_tag,
    verbalized_confidence,
    with_confidence_instruction,
)
from capgate.core.backend import Generation, TokenLogprob


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 4. [confidence=85%]", 0.85),
        ("[confidence = 0.85]", 0.85),
        ("[CONFIDENCE=85%]", 0.85),
        ("[Confidence: 85 %]", 0.85),
        ("[ confidence =  7.5% ]", 0.075),
        ("[confidence=0]", 0.0),
        ("[confidence=1]", 1.0),
        ("[confidence=100%]", 1.0),
        ("[confidence=.3]", 0.3),
        ("[confidence=85]", 0.85),  # no %: above 1, so a percentage
        ("[confidence=1%]", 0.01),
        ("first [confidence=20%] then revised [confidence=60%]", 0.6),
    ],
)
def test_parser_accepts_the_documented_forms(text: str, expected: float) -> None:
    value = parse_verbalized_confidence(text)
    assert value is not None
    assert value == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    [
        "no tag at all",
        "confidence=85%",  # no brackets
        "[confidence=]",
        "[confidence=high]",
        "[confidence=120%]",
        "[confidence=101]",
        "[confidence=-5%]",
        "[confidence=85%%]",
        "[confidence=0.8] but finally [confidence=unsure]",  # last occurrence only
        "",
    ],
)
def test_parser_returns_none_when_unparsable(text: str) -> None:
    assert parse_verbalized_confidence(text) is None


def test_strip_removes_tags_only() -> None:
    assert strip_confidence_tag("x = 3 [confidence=70%]\n") == "x = 3"
    assert strip_confidence_tag("[1, 2] stays [Confidence : 0.4]") == "[1, 2] stays"
    assert strip_confidence_tag("plain") == "plain"


def test_instruction_template_is_parseable_by_the_parser() -> None:
    # the instruction itself shows the form the parser reads
    assert "[confidence=X%]" in CONFIDENCE_INSTRUCTION
    assert parse_verbalized_confidence(CONFIDENCE_INSTRUCTION.replace("X%", "64%")) == pytest.approx(0.64)


def test_with_confidence_instruction_adds_or_extends_the_system_turn() -> None:
    plain = with_confidence_instruction("What is 2+2?")
    assert plain == [
        {"role": "system", "content": CONFIDENCE_INSTRUCTION},
        {"role": "user", "content": "What is 2+2?"},
    ]
    chat = with_confidence_instruction(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}], instruction="TAG IT"
    )
    assert chat[0] == {"role": "system", "content": "Be terse.\n\nTAG IT"}
    assert chat[1] == {"role": "user", "content": "hi"}


def test_verbalized_source_reads_generation_text() -> None:
    assert verbalized_confidence(Generation(text="4 [confidence=33%]", n_tokens=5)) == pytest.approx(0.33)
    assert verbalized_confidence(Generation(text="4", n_tokens=1)) is None


def _tok(top: dict[str, float]) -> TokenLogprob:
    best = max(top, key=lambda k: top[k])
    return TokenLogprob(token=best, logprob=top[best], top=top)


def test_deepconf_score_is_negative_mean_of_top_k() -> None:
    tokens = [
        _tok({"a": math.log(0.7), "b": math.log(0.2), "c": math.log(0.1)}),
        _tok({"x": math.log(0.5), "y": math.log(0.5)}),  # only 2 alternatives: skipped at k=3
    ]
    expected = -(math.log(0.7) + math.log(0.2) + math.log(0.1)) / 3
    assert deepconf_score(tokens, top_k=3) == pytest.approx(expected)
    assert deepconf_score(tokens, top_k=2) == pytest.approx(
        (-(math.log(0.7) + math.log(0.2)) / 2 - 2 * math.log(0.5) / 2) / 2
    )
    assert deepconf_score(tokens[1:], top_k=3) is None
    with pytest.raises(ValueError, match="`top_k` must be an integer >= 2; got 1"):
        deepconf_score(tokens, top_k=1)


def test_logprob_confidence_maps_flat_to_zero_and_peaked_towards_one() -> None:
    src = LogprobConfidence(top_k=4)
    flat = Generation(text="t", n_tokens=1, tokens=[_tok({c: math.log(0.25) for c in "abcd"})])
    flat_value = src(flat)
    assert flat_value is not None
    assert flat_value == pytest.approx(0.0, abs=1e-12)
    peaked = Generation(
        text="t", n_tokens=1, tokens=[_tok({"a": math.log(0.997), "b": -7.0, "c": -8.0, "d": -9.0})]
    )
    value = src(peaked)
    assert value is not None
    assert 0.99 < value < 1.0
    # 1 - k * exp(-C̄), exactly
    c_bar = -(math.log(0.997) - 7 - 8 - 9) / 4
    assert value == pytest.approx(1 - 4 * math.exp(-c_bar))
    middling = Generation(
        text="t", n_tokens=1, tokens=[_tok({"a": math.log(0.6), "b": math.log(0.3), "c": -4.0, "d": -5.0})]
    )
    mid = src(middling)
    assert mid is not None
    assert flat_value < mid < value


def test_logprob_confidence_falls_back_to_mean_logprob() -> None:
    src = LogprobConfidence(top_k=5)
    # chosen-token logprobs only (no alternatives): geometric-mean probability
    toks = [TokenLogprob(token="a", logprob=-0.2), TokenLogprob(token="b", logprob=-0.4)]
    assert src(Generation(text="ab", n_tokens=2, tokens=toks)) == pytest.approx(math.exp(-0.3))
    assert src(Generation(text="ab", n_tokens=2, mean_logprob=-0.05)) == pytest.approx(math.exp(-0.05))
    assert src(Generation(text="ab", n_tokens=2)) is None
    with pytest.raises(ValueError, match="`top_k` must be an integer >= 2; got 1"):
        LogprobConfidence(top_k=1)


def test_first_available_chains_in_order() -> None:
    gen_tag = Generation(text="4 [confidence=20%]", n_tokens=3, mean_logprob=-0.01)
    gen_no_tag = Generation(text="4", n_tokens=3, mean_logprob=-0.01)
    assert DEFAULT_CONFIDENCE(gen_tag) == pytest.approx(0.2)
    assert DEFAULT_CONFIDENCE(gen_no_tag) == pytest.approx(math.exp(-0.01))
    logprob_first = first_available(LogprobConfidence(), verbalized_confidence)
    assert logprob_first(gen_tag) == pytest.approx(math.exp(-0.01))
    assert repr(DEFAULT_CONFIDENCE) == "first_available(verbalized_confidence, LogprobConfidence(top_k=5))"
    with pytest.raises(ValueError, match="at least one"):
        first_available()
