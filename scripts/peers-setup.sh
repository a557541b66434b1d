#!/usr/bin/env bash
# Build one virtual environment per peer library for bench/peers_bench.py (not needed by capgate or
# its tests): their pins differ from capgate's (uqlm requires transformers < 5, numpy < 2).
#   .venv-uqlm       uqlm 0.6.7 + langchain-openai (its LangChain chat model for the vLLM server)
#   .venv-polygraph  lm-polygraph 0.7.0 (white-box estimators on the local HF folder)
# Both get the CPU build of torch first (a bare "torch" would pull a multi-GB CUDA build), then the
# peer with its declared dependencies, so its public API imports as its users get it. Scorers that
# need hub models (NLI, embeddings) are installed but cannot run offline; the bench lists them.
# Safe to re-run: an existing venv is reused and only what is missing is installed.
# Usage: bash scripts/peers-setup.sh [uqlm|polygraph ...]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH="torch==2.13.0"

build() {
    local venv=$1
    shift
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$TORCH"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$TORCH" "$@"
}

for peer in "${@:-uqlm polygraph}"; do
    for p in $peer; do
        case $p in
            # pyarrow (via datasets) >= 22 needs numpy 2 but does not declare it; uqlm pins numpy < 2.
            uqlm) build .venv-uqlm "uqlm==0.6.7" "langchain-openai>=0.3,<2" "pyarrow<22" ;;
            polygraph) build .venv-polygraph "lm-polygraph==0.7.0" ;;
            *)
                echo "error: unknown peer '$p' (expected uqlm or polygraph)" >&2
                exit 2
                ;;
        esac
    done
done
