"""P(True): the probability mass the model puts on "Yes" when asked whether it can answer.

The estimate is read from the log-probabilities of the alternatives (``top_logprobs``) at the
model's first answer token (after any ``<think>`` block and whitespace): the probability of every
"Yes" variant (any case, spacing or trailing punctuation) over that of Yes plus No.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from capgate._util.validate import check_positive_int
from capgate.core.backend import Generation, Prompt, SamplingParams, TokenLogprob
from capgate.core.types import Estimate
from capgate.estimators._backed import BackendEstimator, check_template, one_round_plan
from capgate.estimators._parsing import THINK_CLOSE, THINK_OPEN
from capgate.estimators._sampling import AnyBackend, QueryState, Round, Steps, wrap_last_user_turn
from capgate.estimators.verbalized import QUESTION_BLOCK, delimit_question

__all__ = ["PTRUE_TEMPLATE", "PTrue", "read_p_true"]

#: The prompt; ``{question}`` is the delimited question.
PTRUE_TEMPLATE = (
    QUESTION_BLOCK
    + "Are you able to answer the question correctly? Answer with only a single word: Yes or No."
)

_YES = "yes"
_NO = "no"


def _word(token: str) -> str:
    return token.strip().strip(".,;:!?\"'*").lower()


def _answer_position(tokens: Sequence[TokenLogprob]) -> tuple[int | None, str]:
    """Index of the first answer token: after a closed reasoning block, skipping whitespace."""
    i = 0
    if any(THINK_OPEN in t.token for t in tokens):
        closes = [j for j, t in enumerate(tokens) if THINK_CLOSE in t.token]
        if not closes:
            return None, "the reasoning block (<think>) did not close within max_tokens"
        i = closes[0] + 1
    while i < len(tokens) and not tokens[i].token.strip():
        i += 1
    if i >= len(tokens):
        return None, "the model produced no answer token"
    return i, ""


def read_p_true(tokens: Sequence[TokenLogprob] | None) -> tuple[float | None, str, dict[str, Any]]:
    """P(Yes) / (P(Yes) + P(No)) at the first answer token of a completion's logprobs.

    If only one of the two words is among the alternatives, the other's probability is bounded by
    the least likely alternative returned (the top-k floor), as ``details["bounded"]`` says.

    Returns:
        ``(p, "", details)``, or ``(None, reason, details)`` when there are no logprobs, the answer
        token has no alternatives (``top``) or neither word appears.

    Examples:
        >>> from capgate.core.backend import TokenLogprob
        >>> tok = TokenLogprob(token="Yes", logprob=-0.2, top={"Yes": -0.2, " yes": -3.0, "No": -2.0})
        >>> round(read_p_true([tok])[0], 4)
        0.8652
    """
    if not tokens:
        return None, "the backend returned no logprobs (P(True) needs logprobs with top_logprobs)", {}
    at, why = _answer_position(tokens)
    if at is None:
        return None, why, {}
    token = tokens[at]
    if not token.top:  # the floor below would be the token's own probability: p = 0.5 whatever it is
        reason = "the server sent no alternatives at the first answer token (it ignored top_logprobs)"
        return None, reason, {"answer_token": token.token, "position": at}
    alternatives = dict(token.top)
    alternatives.setdefault(token.token, token.logprob)
    yes = sum(math.exp(lp) for t, lp in alternatives.items() if _word(t) == _YES)
    no = sum(math.exp(lp) for t, lp in alternatives.items() if _word(t) == _NO)
    details: dict[str, Any] = {"answer_token": token.token, "p_yes": yes, "p_no": no, "position": at}
    if yes == 0.0 and no == 0.0:
        shown = sorted(alternatives, key=lambda t: -alternatives[t])[:5]
        reason = f"neither Yes nor No among the alternatives at the first answer token (top: {shown})"
        return None, reason, details
    if yes == 0.0 or no == 0.0:
        floor = math.exp(min(alternatives.values()))
        details["bounded"] = "no" if no == 0.0 else "yes"
        yes, no = (yes, floor) if no == 0.0 else (floor, no)
    return yes / (yes + no), "", details


class PTrue(BackendEstimator):
    """Capability as P(Yes) to "Are you able to answer the question correctly?".

    Args:
        backend: A backend that returns ``top_logprobs`` (chat completions, vLLM, local).
        top_logprobs: Alternatives requested at each position (OpenAI allows at most 20).
        max_tokens: Tokens generated; 1 suffices for plain models, reasoning models need room
            for their ``<think>`` block before the answer.
        template: The prompt template (``{question}`` placeholder).

    Examples:
        >>> from capgate import Generation
        >>> from capgate.core.backend import TokenLogprob
        >>> class Sure:
        ...     model_id = "sure"
        ...     def generate(self, prompts, params):
        ...         tok = TokenLogprob(token="Yes", logprob=-0.1, top={"Yes": -0.1, "No": -2.4})
        ...         return [[Generation(text="Yes", n_tokens=1, tokens=[tok])] for _ in prompts]
        >>> round(PTrue(Sure()).estimate_one("2+2?").p, 3)
        0.909
    """

    method = "p_true"

    def __init__(
        self,
        backend: AnyBackend,
        *,
        top_logprobs: int = 20,
        max_tokens: int = 1,
        template: str = PTRUE_TEMPLATE,
    ) -> None:
        super().__init__(backend)
        if check_positive_int("top_logprobs", top_logprobs) > 20:
            raise ValueError(f"`top_logprobs` must be in [1, 20]; got {top_logprobs!r}")
        self.top_logprobs = top_logprobs
        self.max_tokens = check_positive_int("max_tokens", max_tokens)
        self.template = check_template(template)

    @property
    def params(self) -> SamplingParams:
        """Greedy, one sample, with logprobs and ``top_logprobs`` alternatives."""
        return SamplingParams(
            n=1, temperature=0.0, max_tokens=self.max_tokens, logprobs=True, top_logprobs=self.top_logprobs
        )

    def build_prompt(self, query: Prompt) -> Prompt:
        """The prompt sent for ``query`` (earlier chat turns kept as context)."""
        return wrap_last_user_turn(query, lambda q: self.template.format(question=delimit_question(q)))

    def _steps(self, queries: Sequence[Prompt]) -> Steps:
        prompts = [self.build_prompt(q) for q in queries]
        return one_round_plan(self.method, Round(prompts, self.params), self._read)

    def _read(self, samples: list[Generation], state: QueryState) -> Estimate:
        gen = samples[0] if samples else None
        p, why, details = read_p_true(gen.tokens if gen else None)
        details["completion"] = gen.text if gen else ""
        if p is None:
            return Estimate.unavailable(self.method, why, cost=state.cost, **details)
        return Estimate(p=p, method=self.method, cost=state.cost, details=details)
