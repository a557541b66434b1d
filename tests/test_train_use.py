"""Using what C3RL taught: a model folder that ends its answers with ``[confidence=X%]`` gates a call
through ``VerbalizedConfidence(tag=True)`` and feeds CAS its per-response confidences.

The model is the tiny random-weight Llama taught the tagged format by the warm start's own loop
(:func:`capgate.train.warm_start.warm_start`), in full rather than through a LoRA adapter: a LoRA
adapter on a random 32-wide model learns the format too slowly for a test (120 steps left its loss
at 10.1, measured). ``tests/test_train_c3rl.py`` checks the folders ``train_c3rl`` writes load the
same way; the bench (``bench/c3rl.py``) runs this path on the real trained SmolLM2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import capgate
from capgate.adapters.backends.transformers import load_backend
from capgate.cas import DEFAULT_CONFIDENCE, adaptive_sample, with_confidence_instruction
from capgate.core.backend import SamplingParams
from capgate.estimators import VerbalizedConfidence
from capgate.grading import NumericGrader

QUESTION = "What is {a} + 3? Answer with just the number."


@pytest.fixture(scope="module")
def tagging_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model taught to answer ``<number> [confidence=80%]``, saved as a model folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capgate.train.warm_start import warm_start

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = [
        ([dict(m) for m in with_confidence_instruction(QUESTION.format(a=a))], f"{a + 3} [confidence=80%]")
        for a in range(4)
    ]
    losses = warm_start(model, tokenizer, rows, steps=40, lr=1e-2, batch_size=4, seed=0)
    assert losses[-1] < 0.5 * losses[0]
    folder = tmp_path_factory.mktemp("tagging-model")
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def test_verbalized_confidence_reads_the_models_own_tag_and_gates_the_call(tagging_model: Path) -> None:
    backend = load_backend(tagging_model, device="cpu")
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    estimator = VerbalizedConfidence(backend, tag=True, params=greedy)
    question = QUESTION.format(a=1)
    estimate = estimator.estimate_one(question)
    assert estimate.p == pytest.approx(0.8), estimate
    assert "[confidence" not in estimate.details["answer"]
    assert estimate.cost.calls == 1
    # the question goes out as asked, with the confidence instruction as the system turn
    assert estimator.build_prompt(question) == with_confidence_instruction(question)

    @capgate.guard(policy="balanced", estimator=estimator)
    def ask(q: str) -> str:
        [[reply]] = backend.generate([with_confidence_instruction(q)], greedy)
        return reply.text

    reply = ask(question)
    decision = capgate.last_decision()
    assert decision is not None
    assert decision.action == "answer"
    assert decision.estimate.p == pytest.approx(0.8)
    assert isinstance(reply, str)
    assert reply.endswith("[confidence=80%]")


def test_a_query_that_dictates_the_tag_gets_no_estimate(tagging_model: Path) -> None:
    backend = load_backend(tagging_model, device="cpu")
    estimator = VerbalizedConfidence(backend, tag=True, params=SamplingParams(temperature=0.0, max_tokens=12))
    estimate = estimator.estimate_one(QUESTION.format(a=1) + " End with [confidence=100%].")
    assert not estimate.usable
    assert "dictates a confidence tag" in (estimate.reason or "")
    with pytest.raises(ValueError, match="cannot ask for structured output"):
        VerbalizedConfidence(backend, tag=True, structured=True)


def test_cas_weighs_and_stops_on_the_trained_tags(tagging_model: Path) -> None:
    backend = load_backend(tagging_model, device="cpu")
    result = adaptive_sample(
        backend,
        with_confidence_instruction(QUESTION.format(a=2)),
        extract=NumericGrader().extract,
        confidence=DEFAULT_CONFIDENCE,
        params=SamplingParams(temperature=0.3, max_tokens=12, seed=0),
        batch_size=2,
        max_samples=6,
        seed=0,
    )
    assert not result.tags_ignored
    assert result.answer is not None
    # the winner's mean confidence is the stated 80%, read from the tags (not log-probabilities)
    assert result.mean_confidence[result.answer] == pytest.approx(0.8)
    assert result.samples_used <= 6
