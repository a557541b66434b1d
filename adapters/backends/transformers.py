"""A :class:`capgate.Backend` that samples from a local ``transformers`` causal LM.

Prompts go through the tokenizer's chat template with the generation prompt, exactly as
:meth:`capgate.local.models.LoadedModel.prompt_ids` builds them (the hidden-state features read the
same tokens). Each prompt is repeated ``n`` times and the rows are sampled in left-padded batches
of at most ``max_batch_size`` sequences, so memory stays bounded whatever ``n`` and prompt count.

Semantics follow the OpenAI chat-completions API, not the model's generation defaults:
``temperature`` 0 is greedy; otherwise only ``temperature`` and ``top_p`` shape the distribution
(the model's ``top_k``, ``repetition_penalty`` and similar defaults are switched off).

Log-probabilities are those of the *raw* model distribution (the log-softmax of the unprocessed
logits, before temperature and top-p), as vLLM and the OpenAI API report them: they do not depend
on the sampling settings (a token top-p filtered out still has a finite one), and ``mean_logprob``
(always filled) measures the model's own confidence in what it wrote. Per-token ``tokens`` are
filled only when ``SamplingParams.logprobs`` is set.

``n_tokens`` counts the generated tokens up to and including the one that ended the response (EOS,
or the token that completed a stop string); ``tokens`` and ``mean_logprob`` cover exactly those.
The text never contains the EOS token, the stop string or anything after it. ``finish_reason`` is
``"stop"`` (EOS or a stop string) or ``"length"`` (``max_tokens`` reached).

Shared prefill: when a :class:`~capgate.local.hidden_states.HiddenStateFeaturizer` of the same model
(weights, device and dtype) has just read a prompt, as a probe does before the gate lets the call
through, generation continues from that pass's KV cache and logits (:mod:`capgate.local.prefill`);
the tokens drawn are the same, only the work differs.

``seed`` makes a call reproducible for the same prompts, parameters and ``max_batch_size`` on the
same hardware; the global torch RNG is left as it was. Sampling draws from torch's process-wide
RNG at every step, so sampling calls (seeded or not) run one at a time, under one process-wide
lock, and concurrent calls stay reproducible; greedy calls (``temperature`` 0) draw nothing and
run concurrently.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from capgate.adapters.backends._prefill_reuse import reuse_prefill, stage_prefill
from capgate.core.backend import EndpointKind, Generation, Prompt, SamplingParams, TokenLogprob
from capgate.estimators.verbalized import VerbalizedConfidence
from capgate.local.models import (
    DEFAULT_MODEL,
    MODEL_METADATA_FILE,
    Device,
    DType,
    LoadedModel,
    load_model,
    prepare_model,
)
from capgate.local.prefill import prefill_cache

__all__ = ["TransformersBackend", "load_backend", "trained_to_state_confidence", "verbalized_estimator"]

_SAMPLING_LOCK = threading.Lock()
"""Held by every call that samples or seeds: they share torch's process-wide RNG (all backends)."""


class _RawLogprobRecorder(LogitsProcessor):
    """Records the raw log-probability of each sampled token (and the top alternatives).

    transformers runs custom processors after its penalty processors (all switched off here) and
    before the temperature and top-p warpers, so the scores seen here are the raw logits. The
    token sampled at step t is only known at step t + 1 (it is then the last input id), so the
    previous step's log-softmax is kept until then; :meth:`finish` reads the final step's token.
    """

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self._previous: torch.Tensor | None = None
        self.chosen: list[torch.Tensor] = []
        self.top_values: list[torch.Tensor] = []
        self.top_ids: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.chosen.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        self._previous = logprobs
        if self.top_k:
            values, ids = logprobs.topk(self.top_k, dim=-1)
            self.top_values.append(values)
            self.top_ids.append(ids)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the generated tokens, shape (batch, generated)."""
        if self._previous is not None:
            self.chosen.append(self._previous.gather(-1, sequences[:, -1:]).squeeze(-1))
            self._previous = None
        return torch.stack(self.chosen, dim=1)


class _StopOnStrings(StoppingCriteria):
    """Marks a row finished once its generated text contains one of the stop strings."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_length: int) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.prompt_length = prompt_length
        # A newly completed stop string lies within the last tokens; byte-level tokens may take
        # up to 4 tokens per character.
        self.window = 4 * max(len(s) for s in self.stops) + 4

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        tails = input_ids[:, self.prompt_length :][:, -self.window :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        done = [any(stop in text for stop in self.stops) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]


class TransformersBackend:
    """Samples responses from a local ``transformers`` causal LM (see the module docstring).

    Args:
        loaded: The model, from :func:`capgate.local.models.load_model`.
        max_batch_size: Most sequences (prompt rows times ``n``) generated in one batch.

    Examples:
        >>> from capgate import SamplingParams
        >>> backend = TransformersBackend.from_pretrained("default", device="cpu")
        >>> [[answer]] = backend.generate(["What is 2+3?"], SamplingParams(temperature=0, max_tokens=16))
        >>> answer.finish_reason in {"stop", "length"}
        True
    """

    endpoint: ClassVar[EndpointKind] = "local"
    """How this backend reaches its model (:func:`capgate.core.backend.backend_endpoint`)."""

    def __init__(self, loaded: LoadedModel, *, max_batch_size: int = 16) -> None:
        if not isinstance(loaded, LoadedModel):
            raise TypeError(f"loaded must be a capgate.local.models.LoadedModel; got {type(loaded).__name__}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive integer; got {max_batch_size!r}")
        self.loaded = loaded
        self.max_batch_size = max_batch_size
        prefill_cache(loaded).enable()  # featurizers of this model now keep their prefill for us

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] = "default",
        *,
        device: Device = "auto",
        dtype: DType = "auto",
        max_batch_size: int = 16,
    ) -> TransformersBackend:
        """Load a model (see :func:`capgate.local.models.load_model`) and wrap it."""
        return cls(load_model(name_or_path, device=device, dtype=dtype), max_batch_size=max_batch_size)

    @property
    def model_id(self) -> str:
        """The loaded model's id."""
        return self.loaded.model_id

    def __repr__(self) -> str:
        return f"TransformersBackend(model_id={self.model_id!r}, max_batch_size={self.max_batch_size})"

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[list[Generation]]:
        """Sample ``params.n`` responses for each prompt; result ``[i]`` belongs to ``prompts[i]``.

        Raises:
            ValueError: A prompt is empty or the tokenizer has no chat template.
        """
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of prompts; wrap a single prompt in a list")
        encoded = [self.loaded.prompt_ids(prompt) for prompt in prompts]
        for index, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompts[{index}] encodes to no tokens")
        rows = [index for index in range(len(prompts)) for _ in range(params.n)]
        # Longest prompts first so that batches hold prompts of similar length (less padding).
        order = sorted(range(len(rows)), key=lambda r: -len(encoded[rows[r]]))
        out: list[list[Generation]] = [[] for _ in prompts]
        placed: dict[int, Generation] = {}
        with torch.inference_mode(), self._seeded(params):
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                generations = self._generate_batch([encoded[rows[r]] for r in chunk], params)
                placed.update(zip(chunk, generations, strict=True))
        for r in range(len(rows)):
            out[rows[r]].append(placed[r])
        return out

    @contextlib.contextmanager
    def _seeded(self, params: SamplingParams) -> Iterator[None]:
        """Sampling calls hold the RNG lock throughout (generate draws at every step); greedy ones
        draw nothing, so they neither lock nor seed."""
        if params.temperature == 0.0:
            yield
            return
        with _SAMPLING_LOCK:
            if params.seed is None:
                yield
                return
            devices = [torch.cuda.current_device()] if self.loaded.device == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(params.seed)
                yield

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        greedy = params.temperature == 0.0
        make_config: Any = GenerationConfig  # its __init__ is untyped
        config: GenerationConfig = make_config(
            max_new_tokens=params.max_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=None if greedy else 0,
            typical_p=1.0,
            repetition_penalty=1.0,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            num_beams=1,
            num_return_sequences=1,
            eos_token_id=list(self.loaded.eos_token_ids),
            pad_token_id=self.loaded.pad_token_id,
        )
        if getattr(self.loaded.model.generation_config, "min_p", None) is not None:
            config.min_p = 0.0
        return config

    def _generate_batch(self, batch: list[list[int]], params: SamplingParams) -> list[Generation]:
        model = self.loaded.model
        width = max(len(ids) for ids in batch)
        pad = self.loaded.pad_token_id
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        device = model.device
        recorder = _RawLogprobRecorder(params.top_logprobs if params.logprobs else 0)
        criteria = StoppingCriteriaList()
        if params.stop:
            criteria.append(_StopOnStrings(self.loaded.tokenizer, params.stop, width))
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        with reuse_prefill(model, stage_prefill(self.loaded, batch, input_ids)):
            sequences = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=self._generation_config(params),
                logits_processor=LogitsProcessorList([recorder]),
                stopping_criteria=criteria,
            )
        generated = sequences[:, width:]
        chosen = recorder.finish(sequences).cpu()
        if chosen.shape != generated.shape:  # pragma: no cover - a transformers contract change
            raise RuntimeError(
                f"recorded {tuple(chosen.shape)} log-probabilities "
                f"for {tuple(generated.shape)} generated tokens"
            )
        top_values = torch.stack(recorder.top_values, dim=1).cpu() if recorder.top_values else None
        top_ids = torch.stack(recorder.top_ids, dim=1).cpu() if recorder.top_ids else None
        return [
            self._finish_row(
                generated[row].tolist(),
                chosen[row].tolist(),
                None if top_values is None else top_values[row].tolist(),
                None if top_ids is None else top_ids[row].tolist(),
                prompt_tokens=len(ids),
                params=params,
            )
            for row, ids in enumerate(batch)
        ]

    def _finish_row(
        self,
        tokens: list[int],
        logprobs: list[float],
        top_values: list[list[float]] | None,
        top_ids: list[list[int]] | None,
        *,
        prompt_tokens: int,
        params: SamplingParams,
    ) -> Generation:
        tokenizer = self.loaded.tokenizer
        eos = set(self.loaded.eos_token_ids)
        n_tokens = len(tokens)
        finish_reason = "length"
        content = tokens
        for position, token in enumerate(tokens):
            if token in eos:
                n_tokens, finish_reason, content = position + 1, "stop", tokens[:position]
                break
        text: str = tokenizer.decode(content, skip_special_tokens=True)
        if params.stop:
            hits = [(text.find(stop), stop) for stop in params.stop if stop in text]
            if hits:
                text = text[: min(hits)[0]]
                n_tokens = _first_prefix_with_stop(tokenizer, content, params.stop)
                finish_reason = "stop"
        kept = logprobs[:n_tokens]
        token_logprobs: list[TokenLogprob] | None = None
        if params.logprobs:
            token_logprobs = []
            for position in range(n_tokens):
                top: dict[str, float] = {}
                if top_values is not None and top_ids is not None:
                    for value, alternative in zip(top_values[position], top_ids[position], strict=True):
                        top.setdefault(tokenizer.decode([alternative]), value)
                token_logprobs.append(
                    TokenLogprob(token=tokenizer.decode([tokens[position]]), logprob=kept[position], top=top)
                )
        return Generation(
            text=text,
            n_tokens=n_tokens,
            prompt_tokens=prompt_tokens,
            mean_logprob=sum(kept) / len(kept) if kept else None,
            tokens=token_logprobs,
            finish_reason=finish_reason,
        )


def _first_prefix_with_stop(tokenizer: Any, tokens: list[int], stops: Sequence[str]) -> int:
    """Fewest leading tokens whose decoded text contains a stop string (binary search)."""

    def contains(k: int) -> bool:
        text = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        return any(stop in text for stop in stops)

    return bisect.bisect_left(range(len(tokens) + 1), True, lo=1, key=contains)


def load_backend(
    name_or_path: str | os.PathLike[str] | LoadedModel = DEFAULT_MODEL,
    *,
    device: Device = "auto",
    dtype: DType = "auto",
    max_batch_size: int = 16,
) -> TransformersBackend:
    """A :class:`~capgate.adapters.backends.transformers.TransformersBackend` over a (loaded) model.

    Args:
        name_or_path: What :func:`load_model` accepts, or an already loaded model.
        device: See :func:`load_model` (ignored for an already loaded model).
        dtype: See :func:`load_model` (ignored for an already loaded model).
        max_batch_size: Most sequences (prompts times ``n``) sampled in one batch.

    Examples:
        >>> backend = load_backend("default", device="cpu")
        >>> from capgate import SamplingParams
        >>> [[g]] = backend.generate(["Say hi."], SamplingParams(max_tokens=8, seed=0))
        >>> 0 < g.n_tokens <= 8
        True
    """
    if not isinstance(name_or_path, LoadedModel):
        name_or_path = load_model(name_or_path, device=device, dtype=dtype)
    return TransformersBackend(name_or_path, max_batch_size=max_batch_size)


def trained_to_state_confidence(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether a model folder is one ``capgate train c3rl`` wrote (its ``model/``: the capgate
    metadata file says ``source.c3rl``), so it ends its answers with ``[confidence=X%]``."""
    folder = prepare_model(os.fspath(name_or_path))
    try:
        meta = json.loads((folder / MODEL_METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    source = meta.get("source") if isinstance(meta, dict) else None
    return isinstance(source, dict) and source.get("c3rl") is True


def verbalized_estimator(
    name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: Device = "auto",
    dtype: DType | Literal["bf16-mixed"] = "auto",
    tag: bool | None = None,
) -> VerbalizedConfidence:
    """:class:`~capgate.estimators.VerbalizedConfidence` over a local model: what
    ``capgate.load_estimator(model, method="verbalized")`` loads.

    Args:
        name_or_path: What :func:`load_model` accepts; typically a ``capgate train c3rl`` run's
            ``model/`` folder.
        device: See :func:`load_model`.
        dtype: See :func:`load_model` (``"bf16-mixed"`` is a probe reader's pass: float32 here).
        tag: Read the model's own ``[confidence=X%]`` tag after its answer (``True``) or ask it
            for a probability (``False``); ``None``: the tag for a model C3RL trained
            (:func:`trained_to_state_confidence`), asking for any other.
    """
    backend = load_backend(name_or_path, device=device, dtype="float32" if dtype == "bf16-mixed" else dtype)
    states = trained_to_state_confidence(name_or_path) if tag is None else tag
    return VerbalizedConfidence(backend, tag=states)
