"""The adaptive sampling loop (sync, async, replay) over a scripted backend written here."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Sequence

import pytest

from capgate import Sample
from capgate.cas import (
    DEFAULT_STOP,
    LogprobConfidence,
    SamplingState,
    aadaptive_sample,
    adaptive_sample,
    beta_consensus,
    cas_confidence_gap,
    replay,
    stop_after_samples,
    stop_never,
)
from capgate.core.backend import Generation, Prompt, SamplingParams


class Scripted:
    """Returns the scripted responses in order, ``params.n`` at a time, and records each request."""

    model_id = "scripted"

    def __init__(self, script: Sequence[str | Generation]) -> None:
        self.script = [
            g if isinstance(g, Generation) else Generation(text=g, n_tokens=len(g)) for g in script
        ]
        self.position = 0
        self.requests: list[SamplingParams] = []
        self.prompts: list[Prompt] = []

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        self.requests.append(params)
        self.prompts.extend(prompts)
        out = self.script[self.position : self.position + params.n]
        self.position += len(out)
        return [out]


class AsyncScripted(Scripted):
    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        await asyncio.sleep(0)
        return self.generate(prompts, params)


def first_word(text: str) -> str | None:
    words = text.split()
    return words[0] if words else None


def test_unanimous_confident_answers_stop_after_one_batch() -> None:
    backend = Scripted(["42 [confidence=90%]"] * 10)
    rule = cas_confidence_gap() | beta_consensus(0.95)  # capgate's deterministic variant
    result = adaptive_sample(backend, "q", extract=first_word, batch_size=3, stop=rule)
    assert result.answer == "42"
    assert result.samples_used == 3
    assert result.batches == 1
    assert result.tokens == 3 * len("42 [confidence=90%]")
    assert result.stop_reason == "rule"
    assert result.stopped_by == repr(rule.rules[0])  # the part of the composite that fired
    assert result.vote_shares == {"42": 1.0}
    assert result.mean_confidence["42"] == pytest.approx(0.9)
    assert [r.n for r in backend.requests] == [3]


def test_majority_vote_without_confidence_stops_by_the_beta_rule() -> None:
    # votes after each batch of 2: (1,1) (2,2) (4,2) (6,2) (8,2); Beta(9,3) is the first >= 0.95
    script = ["a", "b", "a", "b", "a", "a", "a", "a", "a", "a", "a", "a"]
    backend = Scripted(script)
    result = adaptive_sample(
        backend, "q", extract=first_word, stop=beta_consensus(0.95), batch_size=2, confidence=None
    )
    assert result.answer == "a"
    assert result.samples_used == 10
    assert result.batches == 5
    assert result.votes == {"a": 8, "b": 2}
    assert result.mean_confidence == {"a": None, "b": None}
    assert result.weighted_votes == {"a": 4.0, "b": 1.0}  # every vote at the neutral 0.5


def test_cap_truncates_the_last_batch() -> None:
    backend = Scripted([f"x{i}" for i in range(20)])
    result = adaptive_sample(backend, "q", extract=first_word, batch_size=4, max_samples=6, confidence=None)
    assert result.stop_reason == "max_samples"
    assert result.stopped_by == "max_samples=6"
    assert result.samples_used == 6
    assert [r.n for r in backend.requests] == [4, 2]
    assert result.answer == "x0"  # all tied at one vote: ties resolve by answer text


def test_initial_batch_and_seed_offsets() -> None:
    backend = Scripted(["a", "b"] * 20)
    adaptive_sample(
        backend,
        "q",
        extract=first_word,
        stop=stop_never(),
        batch_size=3,
        max_samples=11,
        initial_batch=5,
        params=SamplingParams(seed=100, temperature=0.7),
        confidence=None,
    )
    assert [r.n for r in backend.requests] == [5, 3, 3]
    assert [r.seed for r in backend.requests] == [100, 105, 108]
    assert all(r.temperature == 0.7 for r in backend.requests)


def test_confidence_weighted_winner_beats_the_raw_majority() -> None:
    script = ["a [confidence=10%]"] * 3 + ["b [confidence=90%]"]
    result = adaptive_sample(Scripted(script), "q", extract=first_word, stop=stop_never(), max_samples=4)
    assert result.answer == "b"
    assert result.votes == {"a": 3, "b": 1}
    assert result.vote_shares == {"a": 0.75, "b": 0.25}
    assert result.weighted_votes["a"] == pytest.approx(0.3)
    assert result.mean_confidence["b"] == pytest.approx(0.9)


def test_unparsable_confidence_falls_back_to_logprobs_then_to_unknown() -> None:
    script = [
        Generation(text="a [confidence=85%]", n_tokens=4, mean_logprob=-2.0),
        Generation(text="a [confidence=very]", n_tokens=4, mean_logprob=-0.5),
        Generation(text="a", n_tokens=1),
    ]
    result = adaptive_sample(Scripted(script), "q", extract=first_word, stop=stop_never(), max_samples=3)
    confs = [s.confidence for s in result.samples]
    assert confs[0] == pytest.approx(0.85)
    assert confs[1] == pytest.approx(math.exp(-0.5))
    assert confs[2] is None
    assert result.mean_confidence["a"] == pytest.approx((0.85 + math.exp(-0.5)) / 2)
    assert result.weighted_votes["a"] == pytest.approx(0.85 + math.exp(-0.5) + 0.5)


def test_logprob_only_source() -> None:
    script = [Generation(text="a [confidence=99%]", n_tokens=2, mean_logprob=-1.0)]
    result = adaptive_sample(
        Scripted(script),
        "q",
        extract=first_word,
        confidence=LogprobConfidence(),
        stop=stop_never(),
        max_samples=1,
    )
    assert result.samples[0].confidence == pytest.approx(math.exp(-1.0))


def test_extract_sees_text_without_the_tag_and_none_is_unanswered() -> None:
    seen: list[str] = []

    def extract(text: str) -> str | None:
        seen.append(text)
        return None if "?" in text else text

    script = ["12 [confidence=80%]", "?? [confidence=20%]", "12"]
    result = adaptive_sample(
        Scripted(script), "q", extract=extract, stop=stop_never(), max_samples=3, keep_text=True
    )
    assert seen == ["12", "??", "12"]
    assert result.samples_used == 3
    assert result.votes == {"12": 2}
    assert result.vote_shares == {"12": 1.0}
    assert result.samples[1].answer is None
    assert result.samples[1].text == "?? [confidence=20%]"


def test_all_unanswered_gives_no_answer() -> None:
    result = adaptive_sample(Scripted(["", " ", ""]), "q", extract=first_word, max_samples=3, batch_size=1)
    assert result.answer is None
    assert result.samples_used == 3
    assert result.votes == {}
    assert result.stop_reason == "max_samples"
    assert result.correct is None


def test_plain_function_stop_receives_the_frozen_state() -> None:
    states: list[SamplingState] = []

    def two_distinct(state: SamplingState) -> bool:
        states.append(state)
        return len(state.votes) >= 2

    result = adaptive_sample(
        Scripted(["a", "a", "b", "c"]), "q", extract=first_word, stop=two_distinct, batch_size=1
    )
    assert result.samples_used == 3
    assert result.stopped_by == "two_distinct"
    assert [s.n_samples for s in states] == [1, 2, 3]
    assert states[-1].max_samples == 40


def test_empty_backend_answer_is_an_error_not_a_hang() -> None:
    with pytest.raises(RuntimeError, match="no generations"):
        adaptive_sample(Scripted([]), "q", extract=first_word)


def test_extractor_returning_a_non_string_is_an_error() -> None:
    with pytest.raises(TypeError, match="`extract` must return a string or None; it returned int 4"):
        adaptive_sample(Scripted(["4"]), "q", extract=lambda t: int(t))  # type: ignore[arg-type,return-value]


def test_bad_loop_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer; got 0"):
        adaptive_sample(Scripted(["a"]), "q", extract=first_word, batch_size=0)
    with pytest.raises(TypeError, match="`stop` must be"):
        adaptive_sample(Scripted(["a"]), "q", extract=first_word, stop=3)  # type: ignore[arg-type]


def test_async_twin_gives_the_same_result() -> None:
    script = ["a [confidence=60%]", "b [confidence=70%]", "a [confidence=65%]", "a [confidence=80%]"] * 5
    kwargs = {"extract": first_word, "batch_size": 2, "max_samples": 12, "stop": beta_consensus(0.9)}
    sync = adaptive_sample(Scripted(script), "q", **kwargs)  # type: ignore[arg-type]
    backend = AsyncScripted(script)
    async_ = asyncio.run(aadaptive_sample(backend, "q", **kwargs))  # type: ignore[arg-type]
    assert sync.model_dump(exclude={"elapsed_s"}) == async_.model_dump(exclude={"elapsed_s"})
    assert backend.prompts == ["q"] * async_.batches


# --------------------------------------------------------------------------- replay


def test_replay_matches_the_live_loop_on_the_same_draws() -> None:
    texts = ["7 [confidence=40%]", "9 [confidence=50%]", "7 [confidence=45%]", "7 [confidence=70%]"] * 4
    pool = [(t.split()[0], t.startswith("7"), int(t[-4:-2]) / 100, len(t)) for t in texts]
    for rule in (DEFAULT_STOP, beta_consensus(0.9), cas_confidence_gap(margin=0.3)):
        live = adaptive_sample(
            Scripted(texts), "q", extract=first_word, stop=rule, batch_size=2, max_samples=16, seed=5
        )
        rep = replay(pool, stop=rule, batch_size=2, max_samples=16, seed=5)  # same seed: same stops
        assert (rep.answer, rep.samples_used, rep.tokens, rep.votes, rep.stop_reason) == (
            live.answer,
            live.samples_used,
            live.tokens,
            live.votes,
            live.stop_reason,
        )
        assert rep.correct is True


def test_replay_reports_winner_correctness_and_pool_exhaustion() -> None:
    pool = [("5", False, 0.9, 10), ("6", True, 0.2, 10), ("5", False, 0.8, 10)]
    r = replay(pool, stop=stop_never(), batch_size=2, max_samples=10)
    assert r.answer == "5"
    assert r.correct is False
    assert r.stop_reason == "pool_exhausted"
    assert r.samples_used == 3
    assert r.batches == 2


def test_replay_accepts_samples_and_validates_items() -> None:
    samples = [Sample(answer="1", correct=True, confidence=0.95, n_tokens=8)] * 2
    r = replay(samples, batch_size=1, stop=cas_confidence_gap())  # deterministic: stops at the first
    assert (r.answer, r.correct, r.samples_used, r.tokens) == ("1", True, 1, 8)
    with pytest.raises(ValueError, match=r"pool\[1\]: confidence must be in \[0, 1\] or None; got 1.5"):
        replay([("1", True, 0.5, 3), ("1", True, 1.5, 3)])
    with pytest.raises(ValueError, match=r"pool\[0\] must be \(answer, correct, confidence, n_tokens\)"):
        replay([("1", True)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="non-empty pool"):
        replay([])


def test_replay_of_samples_weighs_votes_by_mean_logprob_as_the_live_loop_does() -> None:
    """A harvested sample stores no confidence but its mean token log-prob: replay falls back to
    exp(mean_logprob), as the live default confidence and ``capgate simulate`` do."""
    from capgate.decision.analysis.simulate import pool_items

    draws = [("12", True, -0.05), ("13", False, -2.5), ("13", False, -2.5), ("12", True, -0.05)] * 5
    samples = [Sample(answer=a, correct=c, n_tokens=5, mean_logprob=lp) for a, c, lp in draws]
    live = adaptive_sample(
        Scripted([Generation(text=a, n_tokens=5, mean_logprob=lp) for a, _, lp in draws]),
        "q",
        extract=first_word,
        batch_size=4,
        max_samples=20,
        seed=0,
    )
    for pool in (samples, pool_items(samples)):
        rep = replay(pool, batch_size=4, seed=0)
        assert (rep.answer, rep.samples_used, rep.stop_reason) == ("12", 4, "rule")
        assert rep.weighted_votes == pytest.approx(live.weighted_votes)
        assert rep.samples_used == live.samples_used


def test_replay_stochastic_rule_is_reproducible_by_seed() -> None:
    pool = [("a", True, 0.55, 1), ("b", False, 0.5, 1)] * 20
    rule = cas_confidence_gap(mode="stochastic", margin=0.0, scale=3)
    runs = [replay(pool, stop=rule, batch_size=1, seed=s).samples_used for s in range(30)]
    assert runs == [replay(pool, stop=rule, batch_size=1, seed=s).samples_used for s in range(30)]
    assert len(set(runs)) > 1  # the draws vary with the seed


def test_stop_after_samples_through_the_loop() -> None:
    r = replay([("a", True, None, 3)] * 30, stop=stop_after_samples(7), batch_size=3)
    assert r.samples_used == 9
    assert r.stop_reason == "rule"


def test_async_twin_shows_the_same_parameters() -> None:
    sync = inspect.signature(adaptive_sample).parameters
    twin = inspect.signature(aadaptive_sample).parameters
    assert list(twin) == list(sync)
    assert [(p.kind, p.default) for p in twin.values()] == [(p.kind, p.default) for p in sync.values()]
    assert inspect.iscoroutinefunction(aadaptive_sample)
    with pytest.raises(TypeError, match="batch_sise"):
        adaptive_sample(object(), "q", extract=str.strip, batch_sise=2)  # type: ignore[call-arg]


def test_the_default_stop_is_the_papers_rule_and_reproducible_under_a_seed() -> None:
    assert repr(DEFAULT_STOP) == "stop_any(cas_frequency_gap(epsilon=-1), beta_consensus(threshold=0.95))"
    texts = ["7 [confidence=60%]", "9 [confidence=50%]", "7 [confidence=55%]"] * 8
    runs = [
        adaptive_sample(Scripted(texts), "q", extract=first_word, batch_size=1, max_samples=24, seed=s)
        for s in range(30)
    ]
    again = [
        adaptive_sample(Scripted(texts), "q", extract=first_word, batch_size=1, max_samples=24, seed=s)
        for s in range(30)
    ]
    assert [r.samples_used for r in runs] == [r.samples_used for r in again]
    assert len({r.samples_used for r in runs}) > 1  # stochastic across seeds
    assert {r.stopped_by for r in runs} <= {
        repr(DEFAULT_STOP.rules[0]),
        repr(DEFAULT_STOP.rules[1]),
        "max_samples=24",
    }
