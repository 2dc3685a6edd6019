#!/usr/bin/env bash
# Load benchmark of the OpenAI-compatible API: builds the release binary, starts
# `starling serve` on a free loopback port with the default models, and runs
# benches/api/load.py (bounded: a few hundred requests in all). Loopback only.
#
# Usage: benches/api/run.sh [--json]     (STARLING=path/to/starling to skip building)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/pyenv
if ! "$venv/bin/python" -c 'import httpx' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check httpx
fi
if [[ -z "${STARLING:-}" ]]; then
  cargo build --release -q -p starling-node --bin starling
  STARLING=$target/release/starling
fi
port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"$STARLING" serve --api "127.0.0.1:$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.5
done
"$venv/bin/python" "$root/benches/api/load.py" "http://127.0.0.1:$port/v1" "$@"
