#!/usr/bin/env bash
# Run a command with a real vLLM OpenAI-compatible server up (CPU) and a throwaway PostgreSQL
# server (scripts/postgres-server.sh, for the decision-log tests), then always stop both.
#
#   bash scripts/with-vllm-server.sh .venv/bin/python -m pytest
#
# The command sees CAPGATE_TEST_VLLM_URL (base URL ending in /v1), CAPGATE_TEST_VLLM_MODEL (the
# served model name), CAPGATE_TEST_VLLM_PYTHON (the python of .venv-vllm, for offline-engine tests)
# and CAPGATE_TEST_VLLM_MODEL_DIR (the model folder). The model folder comes from CAPGATE_VLLM_MODEL_DIR, else from
# `capgate model prepare default` (which prints the folder of the embedded default model).
# It also sees CAPGATE_TEST_POSTGRES_URL (postgresql://capgate@127.0.0.1:PORT/capgate) when
# PostgreSQL started; if it cannot start, a warning is printed and the tests that need it fail
# under CI (skip elsewhere). The command's exit status is passed through; the servers are
# stopped on any exit.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
[ "$#" -gt 0 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }

model_dir=${CAPGATE_VLLM_MODEL_DIR:-}
if [ -z "$model_dir" ]; then
    if "$ROOT/.venv/bin/capgate" model prepare --help >/dev/null 2>&1; then
        model_dir=$("$ROOT/.venv/bin/capgate" model prepare default | tail -n 1)
    else
        echo "with-vllm-server: error: no model folder: set CAPGATE_VLLM_MODEL_DIR to a Hugging Face" \
            "model folder, or install capgate with the 'model prepare' command (bash scripts/setup.sh)" >&2
        exit 2
    fi
fi

# A private state folder, so two runs side by side do not stop each other's server.
if [ -z "${CAPGATE_VLLM_STATE_DIR:-}" ]; then
    CAPGATE_VLLM_STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/capgate-vllm.XXXXXX")
    own_state=$CAPGATE_VLLM_STATE_DIR
fi
export CAPGATE_VLLM_STATE_DIR
if [ -z "${CAPGATE_PG_STATE_DIR:-}" ]; then
    CAPGATE_PG_STATE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/capgate-pg.XXXXXX")
    own_pg_state=$CAPGATE_PG_STATE_DIR
fi
export CAPGATE_PG_STATE_DIR
cleanup() {
    bash "$HERE/vllm-server.sh" stop || true
    bash "$HERE/postgres-server.sh" stop || true
    [ -z "${own_state:-}" ] || rm -rf "$own_state"
    [ -z "${own_pg_state:-}" ] || rm -rf "$own_pg_state"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if CAPGATE_TEST_POSTGRES_URL=$(bash "$HERE/postgres-server.sh" start); then
    export CAPGATE_TEST_POSTGRES_URL
    echo "with-vllm-server: PostgreSQL at $CAPGATE_TEST_POSTGRES_URL" >&2
else
    unset CAPGATE_TEST_POSTGRES_URL
    echo "with-vllm-server: warning: PostgreSQL did not start; its tests fail under CI" >&2
fi
CAPGATE_TEST_VLLM_URL=$(bash "$HERE/vllm-server.sh" start "$model_dir")
CAPGATE_TEST_VLLM_MODEL=$(cat "$CAPGATE_VLLM_STATE_DIR/model")
# For the offline-engine test: vLLM's own python and the model folder.
CAPGATE_TEST_VLLM_PYTHON="$ROOT/.venv-vllm/bin/python"
CAPGATE_TEST_VLLM_MODEL_DIR=$(cd "$model_dir" && pwd)
export CAPGATE_TEST_VLLM_URL CAPGATE_TEST_VLLM_MODEL CAPGATE_TEST_VLLM_PYTHON CAPGATE_TEST_VLLM_MODEL_DIR
echo "with-vllm-server: $CAPGATE_TEST_VLLM_MODEL at $CAPGATE_TEST_VLLM_URL" >&2

status=0
"$@" || status=$?
exit "$status"
