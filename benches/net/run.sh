#!/usr/bin/env bash
# Network benchmarks of starling-discovery.
#  1. netbench (RPC vs UDP echo, connection setup, failure detection,
#     reconciliation of 10k records over 5 nodes) in a private network
#     namespace, so that the `lo` byte counters it reads see only its traffic.
#  2. The bridge test (3 namespaces on a Linux bridge): mDNS discovery time to
#     the first RPC, partition and heal.
# Needs root for the namespaces; without it netbench runs on the host's
# loopback (byte counts then include unrelated traffic) and the test skips.
# Usage: benches/net/run.sh [--json] [--quick]
# netbench prints each figure next to its target ("ok" / "MISSED"); with
# --json the targets are under "targets".
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p starling-discovery --example netbench
bin=target/release/examples/netbench
if [ "$(id -u)" = 0 ] && ip netns add "stlbench$$" 2>/dev/null; then
  trap 'ip netns del "stlbench$$" 2>/dev/null || true' EXIT
  ip -n "stlbench$$" link set lo up
  timeout 150 ip netns exec "stlbench$$" "$bin" "$@"
else
  timeout 150 "$bin" "$@"
fi
echo
echo "bridge test: mDNS discovery to first RPC (fails past 20 s), partition and heal (fails past 30-40 s):"
timeout 120 cargo test -p starling-discovery --test netns_bridge
