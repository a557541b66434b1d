"""capgate.adapters.backends.transformers: the local sampling backend, on a tiny random-weight Llama."""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import pytest
import torch

from capgate import Backend, Generation, SamplingParams
from capgate.adapters.backends.transformers import TransformersBackend, load_backend
from capgate.core.backend import Prompt
from capgate.local.models import LoadedModel

SHORT: Prompt = "What is 2+3?"
LONG: Prompt = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Explain in one sentence why the sky looks blue during the day."},
]


def manual_greedy(loaded: LoadedModel, prompt: Prompt, steps: int) -> tuple[list[int], list[float]]:
    """Greedy decoding by hand, one unpadded full forward pass per token: the reference."""
    ids = loaded.prompt_ids(prompt)
    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.inference_mode():
        for _ in range(steps):
            logits = loaded.model(input_ids=torch.tensor([ids + tokens])).logits[0, -1].float()
            step = torch.log_softmax(logits, dim=-1)
            token = int(step.argmax())
            tokens.append(token)
            logprobs.append(float(step[token]))
    return tokens, logprobs


@pytest.fixture
def backend(tiny_model: LoadedModel) -> TransformersBackend:
    return TransformersBackend(tiny_model, max_batch_size=8)


def test_is_a_backend(backend: TransformersBackend, tiny_model: LoadedModel) -> None:
    assert isinstance(backend, Backend)
    assert backend.model_id == tiny_model.model_id
    assert "max_batch_size=8" in repr(backend)


def test_result_shape_and_accounting(backend: TransformersBackend, tiny_model: LoadedModel) -> None:
    prompts = [SHORT, LONG, "Hi"]
    out = backend.generate(prompts, SamplingParams(n=3, max_tokens=6, seed=0))
    assert [len(group) for group in out] == [3, 3, 3]
    for prompt, group in zip(prompts, out, strict=True):
        for generation in group:
            assert isinstance(generation, Generation)
            assert generation.prompt_tokens == len(tiny_model.prompt_ids(prompt))
            assert 1 <= generation.n_tokens <= 6
            if generation.n_tokens < 6:
                assert generation.finish_reason == "stop"
            else:
                assert generation.finish_reason in {"stop", "length"}
            assert generation.tokens is None  # not asked for
            assert generation.mean_logprob is not None
            assert generation.mean_logprob <= 0


def test_greedy_matches_unpadded_reference_with_raw_logprobs(
    backend: TransformersBackend, tiny_model: LoadedModel
) -> None:
    steps = 8
    # SHORT is left-padded next to LONG in the same batch.
    params = SamplingParams(temperature=0, max_tokens=steps, logprobs=True, top_logprobs=3)
    [[short], [long]] = backend.generate([SHORT, LONG], params)
    for prompt, generation in ((SHORT, short), (LONG, long)):
        tokens, logprobs = manual_greedy(tiny_model, prompt, steps)
        n = generation.n_tokens
        assert generation.tokens is not None
        assert len(generation.tokens) == n
        assert [t.token for t in generation.tokens] == [tiny_model.tokenizer.decode([t]) for t in tokens[:n]]
        assert [t.logprob for t in generation.tokens] == pytest.approx(logprobs[:n], abs=1e-4)
        assert generation.mean_logprob == pytest.approx(sum(logprobs[:n]) / n, abs=1e-4)
        stopped = 2 in tokens[:steps]
        assert generation.finish_reason == ("stop" if stopped else "length")
        content = tokens[: n - 1] if stopped else tokens[:n]
        assert generation.text == tiny_model.tokenizer.decode(content, skip_special_tokens=True)
        for token in generation.tokens:
            # Greedy picks the most likely token: it heads its own top list.
            assert len(token.top) == 3
            assert max(token.top.values()) == pytest.approx(token.logprob, abs=1e-6)
            assert list(token.top.values()) == sorted(token.top.values(), reverse=True)


def test_batching_does_not_change_results(tiny_model: LoadedModel) -> None:
    params = SamplingParams(n=2, temperature=0, max_tokens=6, logprobs=True)
    prompts = [SHORT, LONG, "Hi", "Tell me a joke about cats."]
    one_by_one = TransformersBackend(tiny_model, max_batch_size=1).generate(prompts, params)
    batched = TransformersBackend(tiny_model, max_batch_size=8).generate(prompts, params)
    for a_group, b_group in zip(one_by_one, batched, strict=True):
        for a, b in zip(a_group, b_group, strict=True):
            assert (a.text, a.n_tokens, a.finish_reason) == (b.text, b.n_tokens, b.finish_reason)
            assert a.mean_logprob == pytest.approx(b.mean_logprob, abs=1e-4)


def test_seed_reproduces_and_leaves_global_rng_alone(backend: TransformersBackend) -> None:
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=11)
    state = torch.random.get_rng_state()
    first = backend.generate([SHORT], params)
    assert torch.equal(torch.random.get_rng_state(), state)
    again = backend.generate([SHORT], params)
    other = backend.generate([SHORT], params.model_copy(update={"seed": 12}))
    texts = [g.text for g in first[0]]
    assert texts == [g.text for g in again[0]]
    assert texts != [g.text for g in other[0]]
    assert len(set(texts)) > 1  # n samples are independent, not copies


@pytest.mark.parametrize("other_seed", [1, None])
def test_concurrent_seeded_calls_match_serial_ones(
    backend: TransformersBackend, monkeypatch: pytest.MonkeyPatch, other_seed: int | None
) -> None:
    params = {seed: SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=seed) for seed in (0, other_seed)}
    serial = {seed: [g.text for g in backend.generate([SHORT], p)[0]] for seed, p in params.items()}
    # The two threads' first draws meet, as they interleave under load; a call holding the
    # sampling lock meets no one and goes on after 0.1 s.
    meet = threading.Barrier(2, timeout=0.1)
    local = threading.local()
    multinomial = torch.multinomial

    def meeting_multinomial(*args: Any, **kwargs: Any) -> torch.Tensor:
        if not getattr(local, "met", False):
            local.met = True
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait()
        return multinomial(*args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", meeting_multinomial)
    concurrent: dict[int | None, list[str]] = {}

    def run(seed: int | None) -> None:
        concurrent[seed] = [g.text for g in backend.generate([SHORT], params[seed])[0]]

    threads = [threading.Thread(target=run, args=(seed,)) for seed in params]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert concurrent[0] == serial[0]
    if other_seed is not None:
        assert concurrent[other_seed] == serial[other_seed]


def test_tiny_top_p_or_temperature_is_greedy(backend: TransformersBackend) -> None:
    greedy = backend.generate([SHORT, LONG], SamplingParams(temperature=0, max_tokens=6))
    nucleus = backend.generate([SHORT, LONG], SamplingParams(n=3, top_p=1e-6, max_tokens=6, seed=3))
    cold = backend.generate([SHORT, LONG], SamplingParams(n=3, temperature=1e-4, max_tokens=6, seed=3))
    for g, n, c in zip(greedy, nucleus, cold, strict=True):
        assert {x.text for x in n} == {g[0].text}
        assert {x.text for x in c} == {g[0].text}


def test_logprobs_are_raw_whatever_the_sampling_settings(backend: TransformersBackend) -> None:
    params = SamplingParams(temperature=0, max_tokens=5, logprobs=True)
    [[greedy]] = backend.generate([SHORT], params)
    cold_params = params.model_copy(update={"temperature": 1e-4, "top_p": 0.5, "seed": 1})
    [[cold]] = backend.generate([SHORT], cold_params)
    assert cold.text == greedy.text
    assert cold.tokens is not None
    assert greedy.tokens is not None
    # Temperature 1e-4 would make processed log-probabilities ~0; raw ones are unchanged.
    assert [t.logprob for t in cold.tokens] == pytest.approx([t.logprob for t in greedy.tokens], abs=1e-5)
    assert all(math.isfinite(t.logprob) for t in cold.tokens)


def test_model_generation_defaults_are_ignored(
    backend: TransformersBackend, tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_model.model.generation_config
    monkeypatch.setattr(config, "repetition_penalty", 50.0)
    monkeypatch.setattr(config, "top_k", 1)
    monkeypatch.setattr(config, "temperature", 0.01)
    [[generation]] = backend.generate([SHORT], SamplingParams(temperature=0, max_tokens=6, logprobs=True))
    tokens, _ = manual_greedy(tiny_model, SHORT, 6)
    assert generation.tokens is not None
    assert [t.token for t in generation.tokens] == [tiny_model.tokenizer.decode([t]) for t in tokens[:6]]


def test_stop_string_truncates_and_counts(backend: TransformersBackend, tiny_model: LoadedModel) -> None:
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=True)
    [[full]] = backend.generate([LONG], params)
    ids, _ = manual_greedy(tiny_model, LONG, 16)
    assert full.finish_reason == "length"
    assert len(full.text) > 12
    # A stop string that first occurs in the middle of the greedy text.
    start = next(i for i in range(4, len(full.text) - 3) if full.text.find(full.text[i : i + 3]) == i)
    stop = full.text[start : start + 3]
    [[cut]] = backend.generate([LONG], params.model_copy(update={"stop": ("never-there", stop)}))
    assert cut.text == full.text[:start]
    assert cut.finish_reason == "stop"
    assert cut.n_tokens < full.n_tokens
    assert cut.tokens is not None
    assert full.tokens is not None
    assert cut.tokens == full.tokens[: cut.n_tokens]
    # n_tokens is the fewest tokens whose text holds the stop string.
    decoded_before = tiny_model.tokenizer.decode(ids[: cut.n_tokens - 1], skip_special_tokens=True)
    decoded_with = tiny_model.tokenizer.decode(ids[: cut.n_tokens], skip_special_tokens=True)
    assert stop not in decoded_before
    assert stop in decoded_with


def test_eos_ends_a_response(
    backend: TransformersBackend, tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens, logprobs = manual_greedy(tiny_model, SHORT, 8)
    # Declare as EOS the first token (from the third on) that greedy decoding has not emitted before.
    at = next(i for i in range(2, 8) if tokens[i] not in tokens[:i])
    monkeypatch.setattr(tiny_model.model.generation_config, "eos_token_id", [tokens[at]])
    [[generation]] = backend.generate([SHORT], SamplingParams(temperature=0, max_tokens=8, logprobs=True))
    assert generation.finish_reason == "stop"
    assert generation.n_tokens == at + 1  # the EOS token counts
    assert generation.text == tiny_model.tokenizer.decode(tokens[:at], skip_special_tokens=True)
    assert generation.mean_logprob == pytest.approx(sum(logprobs[: at + 1]) / (at + 1), abs=1e-4)


def test_bad_arguments(tiny_model: LoadedModel, backend: TransformersBackend) -> None:
    with pytest.raises(ValueError, match="max_batch_size must be a positive integer; got 0"):
        TransformersBackend(tiny_model, max_batch_size=0)
    with pytest.raises(TypeError, match="LoadedModel"):
        TransformersBackend("default")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrap a single prompt in a list"):
        backend.generate("What is 2+3?", SamplingParams())
    assert backend.generate([], SamplingParams()) == []


def test_load_backend_wraps_a_loaded_model(tiny_model: LoadedModel, tiny_model_dir: object) -> None:
    wrapped = load_backend(tiny_model, max_batch_size=3)
    assert wrapped.loaded is tiny_model
    assert wrapped.max_batch_size == 3
    fresh = TransformersBackend.from_pretrained(str(tiny_model_dir), device="cpu", max_batch_size=2)
    assert fresh.model_id == tiny_model.model_id
    out = fresh.generate([SHORT], SamplingParams(temperature=0, max_tokens=4))
    ref = wrapped.generate([SHORT], SamplingParams(temperature=0, max_tokens=4))
    assert out == ref


@pytest.mark.slow
def test_docstring_examples_run(default_model_dir: object) -> None:
    import doctest

    import capgate.adapters.backends.transformers

    result = doctest.testmod(capgate.adapters.backends.transformers, raise_on_error=False)
    assert result.attempted >= 3
    assert result.failed == 0
