#!/usr/bin/env bash
# Property-based test of the HTTP API with Schemathesis, driven by the node's own OpenAPI
# document (GET /openapi.json, node/assets/openapi.json).
#
# Starts `starling up` on free loopback ports with a fresh data dir (models come from the
# model cache: $STARLING_HOME, as for tests/python/run.sh), adds a few memories, then lets
# Schemathesis generate valid and invalid requests for every operation except the endless
# event stream. A run fails on any 5xx, any status, body or content type the document does
# not describe, an invalid request that is not refused with a 4xx, or an undocumented
# method that is not refused with 405. Afterwards the memories added first must all still be listed
# and the node must still be up. Bounded: API_FUZZ_MAX_EXAMPLES cases per operation and
# API_FUZZ_MAX_TIME seconds for the Schemathesis run; API_FUZZ_SEED picks the cases.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/tests/api_fuzz"
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/pyenv-fuzz
schemathesis_version=4.32.5
max_examples=${API_FUZZ_MAX_EXAMPLES:-25}
max_time=${API_FUZZ_MAX_TIME:-180}
seed=${API_FUZZ_SEED:-1}
started=$(date +%s)

if [ "$("$venv/bin/st" --version 2>/dev/null)" != "st, version $schemathesis_version" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$schemathesis_version"
fi
py="$venv/bin/python"

cargo build --quiet -p starling-node --bin starling

free_port() { # $1: tcp or udp
    "$py" -c 'import socket, sys
kind = socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, kind); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' "$1"
}
api_port=$(free_port tcp)
quic_port=$(free_port udp)
base="http://127.0.0.1:$api_port"
work=$(mktemp -d)
log="$work/node.log"

"$target/debug/starling" up --name api-fuzz --no-mdns \
    --listen "127.0.0.1:$quic_port" --api "127.0.0.1:$api_port" --data-dir "$work/node" \
    --model "${STARLING_TEST_LLM:-smollm2-135m-instruct}" \
    --embedding-model "${STARLING_TEST_EMBED:-all-minilm-l6-v2}" >"$log" 2>&1 &
node=$!
cleanup() {
    kill "$node" 2>/dev/null || true
    # SIGTERM is a graceful stop; give it 10 s, then force it.
    for _ in $(seq 1 100); do
        kill -0 "$node" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$node" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "api_fuzz: $*" >&2
    echo "--- node log (last 60 lines) ---" >&2
    tail -n 60 "$log" >&2 || true
    exit 1
}

# Ready when /api/node answers; a first run may still fetch and convert models.
ready=""
for _ in $(seq 1 600); do
    if curl -fs "$base/api/node" >/dev/null 2>&1; then
        ready=1
        break
    fi
    kill -0 "$node" 2>/dev/null || fail "starling up exited early"
    sleep 0.5
done
[ -n "$ready" ] || fail "starling up was not ready within 5 minutes"

# Memories stored before the fuzzing: every one must survive it.
ids=()
add_memory() { # domain prompt answer
    local body id
    body=$("$py" -c 'import json, sys; print(json.dumps({"domain": sys.argv[1], "prompt": sys.argv[2], "answer": sys.argv[3]}))' "$@")
    id=$(curl -fsS -H 'Content-Type: application/json' -d "$body" "$base/api/memories" |
        "$py" -c 'import json, sys; r = json.load(sys.stdin); print(r["memory"]["id"] if r.get("added") else "")') ||
        fail "POST /api/memories failed for: $2"
    [ -n "$id" ] || fail "the memory was not kept: $2"
    ids+=("$id")
}
add_memory geography "What is the capital of France?" "The capital of France is Paris."
add_memory cooking "How long should an egg boil to be hard-boiled?" "Boil a hard-boiled egg for about ten minutes, then cool it in cold water."
add_memory math "What is the derivative of x squared?" "The derivative of x squared is two x."
node_id=$(curl -fsS "$base/api/node" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["id"])')
# The served models' names, for the hooks (Ollama's routes need one).
tags=$(curl -fsS "$base/api/tags") || fail "GET /api/tags failed"
export STARLING_TEST_LLM_NAME STARLING_TEST_EMBED_NAME
STARLING_TEST_LLM_NAME=$(printf '%s' "$tags" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["models"][0]["name"])')
STARLING_TEST_EMBED_NAME=$(printf '%s' "$tags" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["models"][1]["name"])')
echo "api_fuzz: node $node_id up at $base, ${#ids[@]} memories stored"

status=0
# Run from the scratch dir: Hypothesis keeps its own files in the current directory.
(cd "$work" && API_FUZZ_PROTECT=$(IFS=,; echo "$node_id,${ids[*]}") SCHEMATHESIS_HOOKS="$here/hooks.py" timeout $((max_time + 120)) "$venv/bin/st" \
    --config-file "$here/schemathesis.toml" run "$base/openapi.json" \
    --phases coverage,fuzzing \
    --checks not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance,negative_data_rejection,unsupported_method \
    --exclude-path /api/events \
    --max-examples "$max_examples" --max-time "$max_time" --seed "$seed" \
    --workers 1 --request-timeout 60 --max-failures 20 --no-color) || status=$?

kill -0 "$node" 2>/dev/null || fail "the node died during the fuzzing"
curl -fs "$base/health" >/dev/null || fail "the node no longer answers /health"
listed=$(curl -fsS "$base/api/memories?limit=10000") || fail "cannot list memories"
for id in "${ids[@]}"; do
    printf '%s' "$listed" | "$py" -c 'import json, sys; ids = {m["id"] for m in json.load(sys.stdin)["memories"]}; sys.exit(sys.argv[1] not in ids)' "$id" ||
        fail "memory $id, stored before the fuzzing, is no longer listed"
done
server_errors=$(curl -fsS "$base/metrics" | awk '$1 == "starling_http_server_errors_total" {print $2}')
echo "api_fuzz: node still up, ${#ids[@]}/${#ids[@]} memories still listed, 5xx answers counted by the node: ${server_errors:-?}"
[ "${server_errors:-1}" = "0" ] || status=1
echo "api_fuzz: $(($(date +%s) - started)) s in all"
if [ "$status" -ne 0 ]; then
    fail "schemathesis found failures (exit $status)"
fi
