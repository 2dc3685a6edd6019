#!/usr/bin/env bash
# Runs the official OpenAI Python client (tests/python/test_openai_client.py), the `ollama`
# package (tests/python/test_ollama_client.py) and the agent frameworks on their default
# tool paths (tests/python/agents: LangChain, pydantic-ai, AutoGen, smolagents, LiteLLM;
# tests/python/instructor: instructor, whose `jiter` pin needs an older `openai`) against
# `starling serve` on a free loopback port. Each set has its own virtual environment; the
# versions are pinned below.
#
# Models: STARLING_TEST_LLM / STARLING_TEST_EMBED (paths) when set, else the registry
# defaults, fetched into the model cache on first use. The server is stopped on exit.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/pyenv

# install VENV PACKAGE==VERSION...: a virtual environment holding exactly these pins.
install() {
    local dir=$1
    shift
    if [ "$("$dir/bin/pip" freeze 2>/dev/null | grep -c -x -F -f <(printf '%s\n' "$@"))" != "$#" ]; then
        python3 -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
    fi
}
install "$venv" openai==3.57.0 ollama==0.6.3 pytest==9.2.0 jsonschema==4.26.0
install "$target/pyenv-agents" openai==3.57.0 langchain-openai==1.7.4 autogen-agentchat==0.7.5 \
    autogen-ext==0.7.5 aiofiles==25.1.0 tiktoken==0.14.0 litellm==1.110.2 pydantic-ai-slim==2.68.0 \
    smolagents==1.26.0 pytest==9.2.0
install "$target/pyenv-instructor" instructor==1.17.0 openai==3.3.0 pytest==9.2.0

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

export STARLING_API_BASE="$base"
timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python" \
    --ignore "$root/tests/python/agents" --ignore "$root/tests/python/instructor" "$@"
# LangChain's default embeddings count tokens with tiktoken's cl100k_base, which tiktoken
# downloads on first use. The same file ships in the tiktoken-rs crate that Starling builds
# with: put it where tiktoken looks (its cache key is the SHA-1 of the download URL), so no
# download is tried. LiteLLM reads its model price list from the package, not the network.
tiktoken_file=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*tiktoken-rs-*/assets/cl100k_base.tiktoken' | head -n 1)
export TIKTOKEN_CACHE_DIR="$target/tiktoken"
mkdir -p "$TIKTOKEN_CACHE_DIR"
cp "$tiktoken_file" "$TIKTOKEN_CACHE_DIR/9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
export LITELLM_LOCAL_MODEL_COST_MAP=True
timeout 900 "$target/pyenv-agents/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python/agents"
timeout 300 "$target/pyenv-instructor/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python/instructor"
