#!/usr/bin/env bash
# k-quant files on Starling's CPU kernels, against candle's k-quant kernels (the path such
# files took before) and llama.cpp, on the same file, threads and machine, in one run.
#
# The file is the shipped SmolLM2-135M re-quantised to Q4_K_M by llama.cpp's own
# llama-quantize. SmolLM2's width (576) is not a multiple of 256, so llama-quantize stores
# the matrices of that width in its fallback type (Q5_0) and only the down projections
# (width 1536) in Q4_K/Q6_K; `starling` with `requantize = auto` converts the Q5_0 ones to
# Q8_0 once, as for any file, and that converted file is what all three engines run.
#
# Usage: benches/llm/kquants.sh [--model PATH] [--threads N] [--reps N]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LLAMA_DIR="$ROOT/target/llama.cpp"
MODEL="${STARLING_BENCH_MODEL:-/tmp/m/smollm2.gguf}"
THREADS=2
REPS=3
PP=512
TG=128
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --threads|-t) THREADS="$2"; shift 2 ;;
        --reps|-r) REPS="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
log() { echo "==> $*" >&2; }

"$ROOT/benches/llm/compare.sh" --build-only
STARLING="$ROOT/target/release/starling"
[[ -f "$MODEL" ]] || { echo "model file $MODEL not found (pass --model PATH)" >&2; exit 1; }
OUT="$LLAMA_DIR/runs/kquants-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT" "$LLAMA_DIR/models"
export STARLING_HOME="${STARLING_HOME:-$LLAMA_DIR/starling-home}"

KQ="$LLAMA_DIR/models/$(basename "$MODEL" .gguf).llama-Q4_K_M.gguf"
if [[ ! -f "$KQ" || "$KQ" -ot "$MODEL" ]]; then
    log "re-quantising with llama-quantize (Q4_K_M)"
    "$LLAMA_DIR/bin/llama-quantize" --allow-requantize "$MODEL" "$KQ" Q4_K_M >"$OUT/quantize.log" 2>&1
fi
log "preparing with requantize = auto"
"$STARLING" bench --model "$KQ" --requantize auto -p 0 -n 1 -r 1 -t "$THREADS" --json >/dev/null
RUN="$(dirname "$KQ")/$(basename "$KQ" .gguf).requant-q8_0.gguf"
[[ -f "$RUN" ]] || RUN="$KQ"
python3 - "$RUN" >"$OUT/types.txt" <<'EOF'
import collections, struct, sys
# Counts the weight types in the file (reads the GGUF header only).
names = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
f = open(sys.argv[1], "rb")
magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", f.read(24))
def string():
    (n,) = struct.unpack("<Q", f.read(8)); return f.read(n).decode()
def value(t):
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if t == 8: string()
    elif t == 9:
        (et,) = struct.unpack("<I", f.read(4)); (n,) = struct.unpack("<Q", f.read(8))
        for _ in range(n): value(et)
    else: f.read(sizes[t])
for _ in range(n_kv):
    string(); (t,) = struct.unpack("<I", f.read(4)); value(t)
count = collections.Counter()
for _ in range(n_tensors):
    string(); (nd,) = struct.unpack("<I", f.read(4)); f.read(8 * nd)
    (t,) = struct.unpack("<I", f.read(4)); f.read(8)
    if nd == 2: count[names.get(t, str(t))] += 1
print(", ".join(f"{k} {v}" for k, v in sorted(count.items())))
EOF
log "matrices in the file run: $(cat "$OUT/types.txt")"

ours() { # label extra-env...
    local label="$1"; shift
    log "starling bench: $label"
    env "$@" "$STARLING" bench --model "$RUN" --requantize off -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --json \
        >"$OUT/$label.json" 2>"$OUT/$label.log"
}
echo "load before measuring: $(uptime)" >&2
ours starling
ours candle STARLING_BACKEND=candle
# On CPUs with AMX, llama.cpp's AMX weight repacking crashes in this environment
# (ggml_backend_amx_mul_mat, SIGSEGV); its plain CPU kernels are used there instead.
REPACK=()
grep -qw amx_int8 /proc/cpuinfo && REPACK=(--repack 0) && log "AMX present: llama-bench --repack 0"
log "llama-bench"
"$LLAMA_DIR/bin/llama-bench" -m "$RUN" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" "${REPACK[@]}" -o json >"$OUT/llama.json" 2>"$OUT/llama.log"
echo "load after measuring: $(uptime)" >&2

python3 - "$OUT" "$PP" "$TG" "$THREADS" "$(cat "$OUT/types.txt")" "${REPACK[*]}" <<'EOF'
import json, os, sys
out, pp, tg, threads, types, repack = sys.argv[1:7]
def ours(label):
    return {r["test"]: (r["tokens_per_second"], r["stddev"]) for r in json.load(open(os.path.join(out, label + ".json")))}
llama = {}
for r in json.load(open(os.path.join(out, "llama.json"))):
    llama[f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"] = (r["avg_ts"], r["stddev_ts"])
flags = [f for f in open("/proc/cpuinfo").read().split("\n") if f.startswith("flags")][0].split()
isa = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avxvnni") if f in flags)
note = f"; llama-bench {repack} (AMX)" if repack else ""
print(f"\nQ4_K_M SmolLM2 ({types}); threads={threads}; CPU flags: {isa}{note}; runs in {out}\n")
print("| test | starling (CPU kernels) | candle k-quant kernels | llama.cpp | starling / candle | starling / llama.cpp |")
print("|---|---|---|---|---|---|")
s, c = ours("starling"), ours("candle")
for t in (f"tg{tg}", f"pp{pp}"):
    print(f"| {t} | {s[t][0]:.1f} ± {s[t][1]:.1f} | {c[t][0]:.1f} ± {c[t][1]:.1f} | {llama[t][0]:.1f} ± {llama[t][1]:.1f} | {s[t][0] / c[t][0]:.2f} | {s[t][0] / llama[t][0]:.2f} |")
EOF
