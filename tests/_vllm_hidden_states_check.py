"""Run with the vLLM venv's python (see tests/test_vllm.py): hidden states from the engine that generates.

Writes one JSON object to the file named by its second argument: two prompts answered and
featurized in the same requests (``generate_with_features``, greedy, 8 tokens, all layers, last
token), then the same prompts through ``transform`` (1-token requests), and what is left in the
connector's folder afterwards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    from capgate import SamplingParams
    from capgate.adapters.backends.vllm import VLLMFeaturizer

    model_dir, prompts = sys.argv[1], ["What is 2+3?", "Name a colour."]
    featurizer = VLLMFeaturizer(
        model_dir, layers="all", dtype="float32", max_model_len=512, llm_kwargs={"enforce_eager": True}
    )
    gens, features = featurizer.generate_with_features(prompts, SamplingParams(temperature=0.0, max_tokens=8))
    again = featurizer.transform(prompts)
    sampled, _ = featurizer.generate_with_features(prompts[:1], SamplingParams(n=3, max_tokens=4, seed=1))
    assert featurizer._storage is not None
    Path(sys.argv[2]).write_text(
        json.dumps(
            {
                "texts": [row[0].text for row in gens],
                "n_tokens": [row[0].n_tokens for row in gens],
                "features": features.tolist(),
                "again": again.tolist(),
                "samples": len(sampled[0]),
                "left": sorted(os.listdir(featurizer._storage.name)),
            }
        )
    )


if __name__ == "__main__":  # vLLM starts its engine with spawn: the guard is required
    main()
