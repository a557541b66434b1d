"""Self-consistency: sample k_c answers and report the share of the most frequent one.

The estimate is ``count(most frequent normalized answer) / samples``; samples without an
extractable answer count against agreement. The most expensive black-box estimator (k_c full
answers per query), it reports that cost (tokens, calls, latency).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from capgate._util.validate import check_int_at_least
from capgate.core.backend import Generation, Prompt, SamplingParams
from capgate.core.types import Estimate
from capgate.estimators._backed import BackendEstimator, one_round_plan
from capgate.estimators._parsing import normalize_answer
from capgate.estimators._sampling import AnyBackend, QueryState, Round, Steps, describe_error

__all__ = ["Consistency"]


class Consistency(BackendEstimator):
    """Capability as the agreement among ``k_c`` sampled answers.

    Args:
        backend: A :class:`~capgate.Backend` and/or :class:`~capgate.AsyncBackend`.
        k_c: Answers sampled per query (>= 2), in one request with ``n=k_c``.
        extract: Maps a response to its normalized final answer, or ``None`` if it has none.
            Pass a task grader's ``.extract``; the default :func:`normalize_answer` is a simple
            normalizer (last ``\\boxed{}`` or last line, lowercased), not a grader.
        params: Sampling settings (``n`` is forced to ``k_c``). Default: temperature 1.0, 512 tokens.

    Examples:
        >>> from capgate import Generation
        >>> class Votes:
        ...     model_id = "votes"
        ...     def generate(self, prompts, params):
        ...         texts = ["4", "4", "4", "5", "four"]
        ...         return [[Generation(text=t, n_tokens=1) for t in texts] for _ in prompts]
        >>> Consistency(Votes(), k_c=5).estimate_one("2+2?").p
        0.6
    """

    method = "consistency"

    def __init__(
        self,
        backend: AnyBackend,
        *,
        k_c: int = 5,
        extract: Callable[[str], str | None] | None = None,
        params: SamplingParams | None = None,
    ) -> None:
        super().__init__(backend)
        self.k_c = check_int_at_least("k_c", k_c, 2)  # agreement needs several samples
        self.extract = extract
        self.params = params

    def _params(self) -> SamplingParams:
        base = self.params or SamplingParams(temperature=1.0, max_tokens=512)
        return base.model_copy(update={"n": self.k_c})

    def _steps(self, queries: Sequence[Prompt]) -> Steps:
        return one_round_plan(self.method, Round(list(queries), self._params()), self._read)

    def _read(self, samples: list[Generation], state: QueryState) -> Estimate:
        extract = self.extract or normalize_answer
        answers: list[str | None] = []
        for gen in samples:
            try:
                answers.append(extract(gen.text))
            except Exception as exc:  # a grader's extractor choking on one response
                answers.append(None)
                state.failures.append(describe_error(exc))
        counts = Counter(a for a in answers if a is not None)
        details = {"answers": answers, "samples": len(samples), "k_c": self.k_c}
        if state.failures:
            details["extract_errors"] = state.failures
        if not counts:
            reason = f"no answer could be extracted from any of the {len(samples)} samples"
            return Estimate.unavailable(self.method, reason, cost=state.cost, **details)
        majority, votes = counts.most_common(1)[0]
        details.update(majority=majority, votes=votes)
        return Estimate(p=votes / len(samples), method=self.method, cost=state.cost, details=details)
