"""Settings of a C3RL run: the reward (:class:`C3RLRewardConfig`) and the training (:class:`C3RLTrainConfig`).

Both are frozen pydantic models that refuse unknown keys, so a typo in a settings file fails at
once; both are recorded whole in the run's manifest.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["C3RLRewardConfig", "C3RLTrainConfig", "WarmStartConfidence"]

WarmStartConfidence: TypeAlias = Literal["mu_hat", "constant"]
"""What the warm start's answers state: each question's µ̂ from the labels rounded to 5%
(``"mu_hat"``), or the labels' overall base rate for every question (``"constant"``: the warm
start teaches the format only, and all calibration is left to the reinforcement learning)."""


class C3RLRewardConfig(BaseModel):
    """The C3RL reward (arXiv 2607.01612), with the values the paper does not publish chosen here.

    A completion's reward is the sum of these terms (each a separate TRL reward function, so the
    trainer logs each):

    - correctness: ``+1`` for a right answer, ``0`` for a wrong one (graded after the tag is
      stripped, by the grader of the item's kind);
    - calibration: with a well-formed tag ``[confidence=X%]``, X > ``threshold`` is "sure": sure
      and right or unsure and wrong earn ``+beta``, sure and wrong or unsure and right ``-beta``;
    - reference: a right answer to a question the base model got wrong in all its k samples
      earns ``+alpha``; a wrong answer to one it got right in all k costs ``-alpha``;
    - format: ``-format_penalty`` when the completion has no tag or a malformed one (see
      :func:`capgate.train.rewards.read_tag`); the calibration and Brier terms are then 0;
    - brier (optional, off by default): ``brier * (1 - (c - x)^2)`` for a well-formed tag stating
      x, c the 0/1 correctness, as RLCR (Damani et al. 2025) adds it.

    How the values were chosen (the paper gives none):

    - ``threshold = 0.5``. The ±beta term's expected value is ``beta(2p - 1)`` for "sure" and
      ``beta(1 - 2p)`` for "unsure" whatever t is, so a reward-maximizing model says "sure"
      exactly when its chance p of being right exceeds 1/2. Only t = 0.5 makes the stated X agree
      with that decision (X > 50% when p > 1/2); any other t would teach the model to state a
      number on the wrong side of its belief.
    - ``beta = 0.5``. Half of a right answer's reward: calibration matters, but the model can
      never earn more by stating a confidence than by answering right (1 > 0.5), so it is not
      paid to give up accuracy for calibration.
    - ``alpha = 0.5``. The same scale as beta. With beta alone, a wrong answer to an easy question
      stated as "unsure" still earns +beta; the reference term takes that back (-alpha) and
      pays +alpha for breaking through on a question the base model never got right. Keeping
      ``alpha <= 1`` leaves correctness the largest single term.
    - ``format_penalty = 1.0``. Larger than beta (plus nothing from brier, which is never negative),
      so leaving the tag out (``-format_penalty``) is always worse than the worst-placed tag
      (``-beta``): the model cannot dodge the calibration term by omitting the tag.
    - ``brier = 0.0``. Off, as the issue asks (the paper's reward). The ±beta term teaches only
      "above or below t"; ``brier > 0`` adds a proper scoring rule that rewards the exact X.

    Attributes:
        alpha: Reference-term weight (α).
        beta: Calibration-term weight (β).
        threshold: The t above which a stated confidence counts as "sure", in [0, 1).
        format_penalty: Subtracted for a missing or malformed tag (>= 0).
        brier: Weight of the optional Brier term (0 = off).

    Examples:
        >>> C3RLRewardConfig(brier=0.5).brier
        0.5
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(default=0.5, ge=0.0, allow_inf_nan=False)
    beta: float = Field(default=0.5, ge=0.0, allow_inf_nan=False)
    threshold: float = Field(default=0.5, ge=0.0, lt=1.0, allow_inf_nan=False)
    format_penalty: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    brier: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class C3RLTrainConfig(BaseModel):
    """How a C3RL run trains: the warm start, GRPO, the LoRA adapter, checkpoints.

    The defaults fit SmolLM2-135M on two CPU cores (about 10 s a GRPO step with 2 prompts x 4
    completions of up to 24 tokens, measured before this module): they are a start, not tuned
    values.

    Attributes:
        rewards: The reward (see :class:`C3RLRewardConfig`).
        warm_start_steps: Supervised steps on well-formed answers before GRPO (0 = none). The
            untrained 135M model never writes the tag, so without them the format reward is
            constant and GRPO has nothing to learn from.
        warm_start_confidence: What the warm start's answers state (see
            :data:`WarmStartConfidence`).
        warm_start_balance: Give each reference class as many warm-start answers as the largest
            (see :func:`capgate.train.data.warm_start_rows`), so the majority class's stated value
            is not all the warm start teaches.
        warm_start_lr: Learning rate of the warm start.
        warm_start_batch_size: Answers per warm-start step.
        steps: GRPO optimizer steps.
        lr: GRPO learning rate (LoRA learns little below about 1e-5, trl#2872).
        prompts_per_step: Distinct questions per GRPO step.
        num_generations: Completions sampled per question (GRPO's group size, >= 2).
        max_completion_length: Most tokens per sampled completion.
        temperature: Sampling temperature of the completions.
        kl_beta: GRPO's KL coefficient (0: no reference model, as RLCR).
        lora_r: LoRA rank (all linear layers).
        lora_alpha: LoRA scaling numerator.
        save_steps: GRPO steps between checkpoints (a killed run resumes from the last).
        eval_fraction: Share of the labelled questions held out of training and scored at the end
            (the manifest's ``evaluation``).
        eval_max: Most held-out questions scored.
        seed: Seed of the split, the warm start and GRPO.
        device: ``"auto"`` (CUDA when available), ``"cpu"`` or ``"cuda"``.

    Examples:
        >>> C3RLTrainConfig(steps=10).num_generations
        4
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rewards: C3RLRewardConfig = Field(default_factory=C3RLRewardConfig)
    warm_start_steps: int = Field(default=60, ge=0)
    warm_start_confidence: WarmStartConfidence = "mu_hat"
    warm_start_balance: bool = True
    warm_start_lr: float = Field(default=5e-4, gt=0.0, allow_inf_nan=False)
    warm_start_batch_size: int = Field(default=8, ge=1)
    steps: int = Field(default=200, ge=0)
    lr: float = Field(default=5e-5, gt=0.0, allow_inf_nan=False)
    prompts_per_step: int = Field(default=2, ge=1)
    num_generations: int = Field(default=4, ge=2)
    max_completion_length: int = Field(default=24, ge=4)
    temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    kl_beta: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    save_steps: int = Field(default=25, ge=1)
    eval_fraction: float = Field(default=0.1, ge=0.0, lt=1.0, allow_inf_nan=False)
    eval_max: int = Field(default=64, ge=0)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _check_any_training(self) -> C3RLTrainConfig:
        if self.steps == 0 and self.warm_start_steps == 0:
            raise ValueError("steps and warm_start_steps are both 0: the run would train nothing")
        return self
