#!/usr/bin/env bash
# Other agents' protocols against real nodes, with their official Python SDKs (pinned
# below): two nodes (`starling up`, loopback only, no mDNS), a botanist with the documents
# of configs/docs/basil and a coordinator with none. The MCP client launches
# `starling mcp --api COORDINATOR` over stdio, as a desktop assistant or IDE would
# (test_mcp_client.py); the A2A client resolves the coordinator's agent card and speaks
# JSON-RPC to it (test_a2a_client.py). A third node, alone, offers the tools of a stdio MCP
# server it starts (parts_server.py) and answers through them (test_mcp_tools.py); a fifth
# (fay) does the same with that server running over streamable HTTP. A fourth
# fronts an A2A agent built with the a2a-sdk server (notes_a2a_server.py) as its executor
# (test_a2a_executor.py, and node/tests/a2a_agent.rs against the server directly). Models:
# the registry defaults from the model cache (fetched on first use).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/pyenv-protocols

packages=(mcp==2.3.0 a2a-sdk==1.3.0 pytest==9.2.0)
if [ "$("$venv/bin/pip" freeze 2>/dev/null | grep -c -x -F -f <(printf '%s\n' "${packages[@]}"))" != "${#packages[@]}" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
fi

cargo build --quiet -p starling-node --bin starling
bin=$target/debug/starling

free_port() {
    "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
work=$(mktemp -d)
echo "work dir: $work" >&2
pids=()
cleanup() {
    # SIGTERM is a graceful stop; give each node 10 s, then force it.
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    done
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# start_node NAME QUIC_PORT API_PORT DESCRIPTION SKILLS DOCS [up args...]
start_node() {
    local name=$1 quic=$2 api=$3 description=$4 skills=$5 docs_line=""
    [ -n "$6" ] && docs_line="docs = \"$6\""
    shift 6
    cat >"$work/$name.toml" <<TOML
[node]
name = "$name"
data_dir = "$work/$name"

[network]
listen = "127.0.0.1:$quic"
mdns = false

[api]
listen = "127.0.0.1:$api"

[agent]
description = "$description"
skills = $skills
$docs_line
${extra_toml:-}
TOML
    "$bin" up --config "$work/$name.toml" "$@" >"$work/$name.log" 2>&1 &
    pids+=($!)
}

# wait_for NAME URL: until URL answers 200 with a non-empty JSON list (or object).
wait_for() {
    local name=$1 url=$2
    for _ in $(seq 1 600); do
        if "$venv/bin/python" - "$url" 2>/dev/null <<'PY'
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.exit(0 if json.load(r) else 1)
PY
        then
            return 0
        fi
        sleep 0.5
    done
    echo "$name was not ready within 5 minutes ($url):" >&2
    cat "$work/$name.log" >&2
    return 1
}

# wait_line FILE PATTERN: until FILE (a started process's output) has a line matching
# PATTERN (grep -E), for up to 20 s; the caller checks what it needs from the file.
wait_line() {
    for _ in $(seq 1 200); do
        grep -q -E "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 0
}

# announced_url OUT PREFIX WHAT LOG: the URL a started process announces in OUT on a line
# "PREFIX<url>" (waited for as wait_line does); when it never comes, says WHAT did not
# start, shows LOG and fails.
announced_url() {
    wait_line "$1" "^$2"
    local url
    url=$(sed -n "s/^$2//p" "$1")
    if [ -z "$url" ]; then
        echo "$3 did not start:" >&2
        cat "$4" >&2
        return 1
    fi
    echo "$url"
}

# basil holds the documents; ada, which the MCP client talks to, holds none and must
# recruit basil through the swarm.
basil_quic=$(free_port)
basil_api=$(free_port)
start_node basil "$basil_quic" "$basil_api" \
    "Botanist: plants, seeds, germination and greenhouse growing conditions." \
    '["botany", "seeds", "greenhouse", "plant care"]' "$root/configs/docs/basil"
wait_for basil "http://127.0.0.1:$basil_api/api/node"
secret=$("$bin" invite --api "127.0.0.1:$basil_api" --secret)

ada_quic=$(free_port)
ada_api=$(free_port)
start_node ada "$ada_quic" "$ada_api" \
    "Project coordinator: plans work, splits tasks and writes summaries." \
    '["planning", "coordination"]' "" \
    --swarm-secret "$secret" --bootstrap "127.0.0.1:$basil_quic"
wait_for ada "http://127.0.0.1:$ada_api/api/cards?q=plants"

# dora works alone and only through the tools of an MCP server it starts itself
# (parts_server.py, which logs every call's raw arguments).
dora_quic=$(free_port)
dora_api=$(free_port)
parts_log="$work/parts-calls.jsonl"
extra_toml="tools = []
collaboration = \"chat\"
allow_no_tool = false

[[agent.mcp]]
name = \"parts\"
command = [\"$venv/bin/python\", \"$root/tests/protocols/parts_server.py\", \"$parts_log\"]"
start_node dora "$dora_quic" "$dora_api" \
    "Spare parts desk: the status of spare parts, by part number." '["spare parts"]' ""
extra_toml=""
wait_for dora "http://127.0.0.1:$dora_api/api/node"

# fay is dora over MCP's streamable HTTP transport: the same server, already running at a
# URL (parts_server.py --http), reached with a header the server logs on each call.
stock_port=$(free_port)
stock_log="$work/stock-calls.jsonl"
"$venv/bin/python" "$root/tests/protocols/parts_server.py" "$stock_log" --http "$stock_port" \
    >"$work/stock-mcp.log" 2>&1 &
pids+=($!)
wait_line "$work/stock-mcp.log" "Uvicorn running on"
fay_quic=$(free_port)
fay_api=$(free_port)
extra_toml="tools = []
collaboration = \"chat\"
allow_no_tool = false

[[agent.mcp]]
name = \"stock\"
url = \"http://127.0.0.1:$stock_port/mcp\"
headers = { X-Desk = \"fay\" }"
start_node fay "$fay_quic" "$fay_api" \
    "Spare parts desk: the status of spare parts, by part number." '["spare parts"]' ""
extra_toml=""
wait_for fay "http://127.0.0.1:$fay_api/api/node"

# eve fronts an A2A agent built with the official a2a-sdk server (notes_a2a_server.py,
# which logs every task it is given): `executor = "external:notes"`, so eve's card
# advertises it and a question no node's documents hold goes to it (test_a2a_executor.py).
notes_log="$work/notes-a2a.jsonl"
"$venv/bin/python" "$root/tests/protocols/notes_a2a_server.py" "$notes_log" \
    >"$work/notes-a2a.out" 2>"$work/notes-a2a.log" &
pids+=($!)
notes_url=$(announced_url "$work/notes-a2a.out" "listening on " "the A2A agent" \
    "$work/notes-a2a.log") || exit 1
eve_quic=$(free_port)
eve_api=$(free_port)
extra_toml="executor = \"external:notes\"

[[agent.external]]
name = \"notes\"
description = \"Knows the station's maintenance notes: filters, pumps, inspections.\"
skills = [\"maintenance\", \"irrigation pumps\"]
a2a = \"$notes_url\""
start_node eve "$eve_quic" "$eve_api" \
    "Front desk of the maintenance team." '["maintenance"]' "" \
    --swarm-secret "$secret" --bootstrap "127.0.0.1:$basil_quic"
extra_toml=""
wait_for eve "http://127.0.0.1:$eve_api/api/node"

# `starling mcp --http`: the MCP adapter for ada over streamable HTTP, on a free loopback
# port (test_mcp_client.py connects to it by URL).
mcp_port=$(free_port)
"$bin" mcp --api "127.0.0.1:$ada_api" --http "127.0.0.1:$mcp_port" >"$work/mcp-http.log" 2>&1 &
pids+=($!)
mcp_url=$(announced_url "$work/mcp-http.log" "MCP server listening on " \
    "starling mcp --http" "$work/mcp-http.log") || exit 1

# The node as an A2A client, against the a2a-sdk server directly (ignored in a plain
# `cargo test`: they need this virtual environment).
STARLING_TEST_PYTHON="$venv/bin/python" \
    cargo test --quiet -p starling-node --test a2a_agent -- --ignored

STARLING_BIN="$bin" STARLING_API="127.0.0.1:$ada_api" STARLING_MCP_URL="$mcp_url" STARLING_EVE_API="127.0.0.1:$eve_api" \
    STARLING_NOTES_LOG="$notes_log" STARLING_DORA_API="127.0.0.1:$dora_api" \
    STARLING_PARTS_LOG="$parts_log" STARLING_FAY_API="127.0.0.1:$fay_api" \
    STARLING_STOCK_LOG="$stock_log" STARLING_PARTS_SERVER="$root/tests/protocols/parts_server.py" \
    STARLING_TEST_PYTHON="$venv/bin/python" \
    timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/protocols" "$@" || {
    status=$?
    for n in basil ada dora eve fay; do
        echo "--- $n log" >&2
        tail -n 40 "$work/$n.log" >&2
    done
    exit $status
}
