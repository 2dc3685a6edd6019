#!/usr/bin/env bash
# Browser test of the dashboard: starts `starling demo --keep-running` (three nodes on
# loopback, real models), opens the first node's dashboard in headless Chromium, checks
# that peers, cards and the live group chat appear, saves target/dashboard.png.
# Needs: chromium (Debian package), node + npm (installs playwright-core here).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${STARLING_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/starling}"
port="${DEMO_API_PORT:-7631}"
log="$root/target/dashboard-demo.log"
mkdir -p "$root/target"
[ -d "$here/node_modules/playwright-core" ] || (cd "$here" && npm install --no-audit --no-fund --silent)
"$bin" demo --keep-running --api-port "$port" >"$log" 2>&1 &
demo=$!
trap 'kill $demo 2>/dev/null; wait $demo 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$port/api/node" >/dev/null 2>&1 && break
  kill -0 $demo 2>/dev/null || { cat "$log"; echo "demo exited early"; exit 1; }
  sleep 0.5
done
node "$here/dashboard.mjs" "http://127.0.0.1:$port" "$root/target/dashboard.png"
