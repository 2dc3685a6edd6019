#!/usr/bin/env bash
# Runs the official OpenAI Python client (tests/python/test_openai_client.py) and the
# `ollama` package (tests/python/test_ollama_client.py) against `starling serve` on a free
# loopback port. The clients' versions are pinned below.
#
# Models: STARLING_TEST_LLM / STARLING_TEST_EMBED (paths) when set, else the registry
# defaults, fetched into the model cache on first use. The server is stopped on exit.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/pyenv

packages=(openai==3.57.0 ollama==0.6.3 pytest==9.2.0 jsonschema==4.26.0)
if [ "$("$venv/bin/pip" freeze 2>/dev/null | grep -c -x -F -f <(printf '%s\n' "${packages[@]}"))" != "${#packages[@]}" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
fi

cargo build --quiet -p starling-node --bin starling

port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port/v1"
log=$(mktemp)
"$target/debug/starling" serve --api "127.0.0.1:$port" \
    --model "${STARLING_TEST_LLM:-smollm2-135m-instruct}" \
    --embedding-model "${STARLING_TEST_EMBED:-all-minilm-l6-v2}" >"$log" 2>&1 &
server=$!
cleanup() {
    kill "$server" 2>/dev/null || true
    # SIGTERM is a graceful stop; give it 10 s, then force it.
    for _ in $(seq 1 100); do
        kill -0 "$server" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$server" 2>/dev/null || true
    rm -f "$log"
}
trap cleanup EXIT

# Ready when /v1/models answers; first use may fetch and convert models (up to 5 minutes).
ready=""
for _ in $(seq 1 600); do
    if "$venv/bin/python" -c "import urllib.request, sys; urllib.request.urlopen('$base/models', timeout=2)" 2>/dev/null; then
        ready=1
        break
    fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "starling serve exited early:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.5
done
if [ -z "$ready" ]; then
    echo "starling serve was not ready within 5 minutes:" >&2
    cat "$log" >&2
    exit 1
fi

STARLING_API_BASE="$base" timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python" "$@"
