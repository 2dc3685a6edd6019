#!/usr/bin/env bash
# Team-formation retrieval benchmark. First the sets written independently of the code: the
# shared dev split (../shared/eval/team_formation/dev.jsonl, when present) and
# benches/team_formation/blind.jsonl. Then (history, SYNTH=1) the synthetic benchmark for three seeds
# (1 = development, 2 and 3 = held out) with `starling eval synth-team` and scores the node's
# hybrid search on each with `starling eval team-formation` (real all-MiniLM-L6-v2
# embeddings, BM25 and cosine alone for comparison). Generated files go to $OUT (default: a
# temporary directory); nothing is committed.
#
# Usage: benches/team_formation/run.sh [--json]   (STARLING=path/to/starling to skip building;
#        FULL=1 also runs the real LLM team-formation loop on LIMIT=100 tasks per seed)
set -euo pipefail

CARDS=${CARDS:-1200}
TASKS=${TASKS:-500}
SEEDS=${SEEDS:-"1 2 3"}
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/../.."
if [[ -z "${STARLING:-}" ]]; then
  cargo build --release -p starling-node -p starling-eval --bin starling --bin starling-eval
  STARLING=target/release/starling
fi
for data in ../shared/eval/team_formation/dev.jsonl benches/team_formation/blind.jsonl; do
  if [[ -f "$data" ]]; then
    "$STARLING" eval team-formation --data "$data" "$@"
  fi
done
[[ -n "${SYNTH:-}${FULL:-}" ]] || exit 0
for seed in $SEEDS; do
  data="$OUT/team-formation-c${CARDS}-t${TASKS}-s${seed}.jsonl"
  "$STARLING" eval synth-team --cards "$CARDS" --tasks "$TASKS" --seed "$seed" --out "$data"
  if [[ -n "${FULL:-}" ]]; then
    "$STARLING" eval team-formation --data "$data" --full --limit "${LIMIT:-100}" "$@"
  else
    "$STARLING" eval team-formation --data "$data" "$@"
  fi
done
