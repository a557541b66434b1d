"""The CI vLLM server that ``scripts/with-vllm-server.sh`` starts, for the tests that talk to it.

It exports ``CAPGATE_TEST_VLLM_URL`` / ``CAPGATE_TEST_VLLM_MODEL``. Without them the tests fail
under CI (env ``CI`` set) and are skipped elsewhere, saying how to run them.
"""

from __future__ import annotations

import os

import pytest


def ci_vllm_server() -> tuple[str, str]:
    """The server's base URL and served model name, or fail (CI) / skip (elsewhere)."""
    url, model = os.environ.get("CAPGATE_TEST_VLLM_URL"), os.environ.get("CAPGATE_TEST_VLLM_MODEL")
    if not url or not model:
        msg = (
            "CAPGATE_TEST_VLLM_URL / CAPGATE_TEST_VLLM_MODEL are not set: run the tests under "
            "`bash scripts/with-vllm-server.sh .venv/bin/python -m pytest`, which starts vLLM's "
            "OpenAI-compatible server on this CPU"
        )
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return url, model
