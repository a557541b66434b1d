"""Run with the vLLM venv's python (see tests/test_vllm.py): exercises capgate.adapters.backends.vllm
for real.

Writes one JSON object to the file named by its second argument: samples of two prompts (n=3,
logprobs, seeded, twice) and the features of two queries from the pooling runner.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    from capgate import SamplingParams
    from capgate.adapters.backends.vllm import VLLMBackend, VLLMFeaturizer

    model_dir, prompts = sys.argv[1], ["What is 2+3?", "Name a colour."]
    backend = VLLMBackend(model_dir, dtype="float32", max_model_len=512, enforce_eager=True)
    params = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=11, logprobs=True, top_logprobs=3)
    first = backend.generate(prompts, params)
    again = backend.generate(prompts, params)
    del backend
    featurizer = VLLMFeaturizer(
        model_dir, dtype="float32", max_model_len=512, llm_kwargs={"enforce_eager": True}
    )
    features = featurizer.transform(prompts)
    Path(sys.argv[2]).write_text(
        json.dumps(
            {
                "first": [[g.model_dump() for g in row] for row in first],
                "again": [[g.text for g in row] for row in again],
                "features": features.tolist(),
            }
        )
    )


if __name__ == "__main__":  # vLLM starts its engine with spawn: the guard is required
    main()
