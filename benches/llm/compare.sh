#!/usr/bin/env bash
# Compares `starling bench` with llama.cpp's `llama-bench` on the same GGUF files and thread
# count, in one run, and prints tg/pp throughput, the ratios, and peak RSS while generating.
#
# Usage: benches/llm/compare.sh [--model PATH] [--threads N] [--reps N] [--quant q8_0|q4_0]
#                               [--candle] [--build-only]
#
#   --model PATH   the shipped GGUF (default: $STARLING_BENCH_MODEL or /tmp/m/smollm2.gguf)
#   --threads N    threads for both engines (default 2)
#   --reps N       measured repetitions (default 5)
#   --quant T      type our re-quantiser produces for the second comparison (default q8_0)
#   --candle       also measure the candle backend (STARLING_BACKEND=candle)
#   --build-only   only build llama.cpp and starling
#
# llama.cpp is built from the source vendored in the llama-cpp-python sdist on PyPI and
# cached under target/llama.cpp/, so reruns skip the build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LLAMA_DIR="$ROOT/target/llama.cpp"
MODEL="${STARLING_BENCH_MODEL:-/tmp/m/smollm2.gguf}"
THREADS=2
REPS=5
QUANT=q8_0
CANDLE=0
BUILD_ONLY=0
PP=512
TG=128

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --threads|-t) THREADS="$2"; shift 2 ;;
        --reps|-r) REPS="$2"; shift 2 ;;
        --quant) QUANT="$2"; shift 2 ;;
        --candle) CANDLE=1; shift ;;
        --build-only) BUILD_ONLY=1; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

log() { echo "==> $*" >&2; }

# ---------------------------------------------------------------- llama.cpp build (cached)
build_llama() {
    local bin="$LLAMA_DIR/bin"
    if [[ -x "$bin/llama-bench" && -x "$bin/llama-quantize" && -x "$bin/llama-simple" ]]; then
        return
    fi
    command -v cmake >/dev/null || { log "installing cmake"; apt-get install -y cmake >/dev/null || { apt-get update >/dev/null && apt-get install -y cmake >/dev/null; }; }
    mkdir -p "$LLAMA_DIR"
    local src
    src="$(find "$LLAMA_DIR" -maxdepth 4 -type d -path '*vendor/llama.cpp' 2>/dev/null | head -n1)"
    if [[ -z "$src" ]]; then
        log "downloading the llama-cpp-python sdist"
        python3 -m pip download --no-deps --no-binary llama-cpp-python llama-cpp-python -d "$LLAMA_DIR" >&2
        local sdist
        sdist="$(ls -t "$LLAMA_DIR"/llama_cpp_python-*.tar.gz | head -n1)"
        tar -xzf "$sdist" -C "$LLAMA_DIR"
        src="$(find "$LLAMA_DIR" -maxdepth 4 -type d -path '*vendor/llama.cpp' | head -n1)"
    fi
    log "building llama.cpp from $src"
    cmake -S "$src" -B "$LLAMA_DIR/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release >&2
    cmake --build "$LLAMA_DIR/build" --config Release -j "$(nproc)" \
        --target llama-bench llama-quantize llama-simple >&2
    mkdir -p "$bin"
    for t in llama-bench llama-quantize llama-simple; do
        cp "$(find "$LLAMA_DIR/build" -type f -name "$t" -perm -u+x | head -n1)" "$bin/$t"
    done
}

build_llama
log "building starling (release)"
(cd "$ROOT" && cargo build --release -p starling-node --bin starling >&2)
STARLING="$ROOT/target/release/starling"
LB="$LLAMA_DIR/bin/llama-bench"
[[ $BUILD_ONLY == 1 ]] && exit 0

[[ -f "$MODEL" ]] || { echo "model file $MODEL not found (pass --model PATH)" >&2; exit 1; }
OUT="$LLAMA_DIR/runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"
STEM="$(basename "$MODEL" .gguf)"
QUANT_UPPER="$(echo "$QUANT" | tr '[:lower:]' '[:upper:]')"

# Our re-quantised file: `starling` writes it beside the original (or in its data dir).
log "re-quantising with starling ($QUANT)"
export STARLING_HOME="${STARLING_HOME:-$LLAMA_DIR/starling-home}"
"$STARLING" bench --model "$MODEL" --requantize "$QUANT" -p 0 -n 1 -r 1 -t "$THREADS" --json >/dev/null
OURS="$(dirname "$MODEL")/$STEM.requant-$QUANT.gguf"
[[ -f "$OURS" ]] || OURS="$(find "$STARLING_HOME" -name "$STEM.requant-$QUANT.gguf" | head -n1)"
[[ -f "$OURS" ]] || { echo "cannot find the re-quantised file $STEM.requant-$QUANT.gguf" >&2; exit 1; }
# llama.cpp's own re-quantisation of the same source, to the same type.
THEIRS="$LLAMA_DIR/models/$STEM.llama-$QUANT.gguf"
if [[ ! -f "$THEIRS" || "$THEIRS" -ot "$MODEL" ]]; then
    mkdir -p "$LLAMA_DIR/models"
    log "re-quantising with llama-quantize ($QUANT_UPPER)"
    "$LLAMA_DIR/bin/llama-quantize" --allow-requantize "$MODEL" "$THEIRS" "$QUANT_UPPER" >"$OUT/quantize.log" 2>&1
fi

ours_bench() { # label file extra-env...
    local label="$1" file="$2"; shift 2
    log "starling bench: $label"
    env "$@" "$STARLING" bench --model "$file" --requantize off -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --json \
        >"$OUT/$label.json" 2>"$OUT/$label.log"
}
llama_bench() { # label file
    local label="$1" file="$2"
    log "llama-bench: $label"
    "$LB" -m "$file" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" -o json >"$OUT/$label.json" 2>"$OUT/$label.log"
}

echo "load before measuring: $(uptime)" >&2
ours_bench starling-q4_1 "$MODEL"
llama_bench llama-q4_1 "$MODEL"
ours_bench "starling-$QUANT" "$OURS"
llama_bench "llama-ours-$QUANT" "$OURS"
llama_bench "llama-$QUANT" "$THEIRS"
if [[ $CANDLE == 1 ]]; then
    ours_bench candle-q4_1 "$MODEL" STARLING_BACKEND=candle
    ours_bench "candle-$QUANT" "$OURS" STARLING_BACKEND=candle
fi
echo "load after measuring: $(uptime)" >&2

# Peak RSS while generating 128 tokens greedily from a short prompt.
PROMPT="Write a short story about a robot learning to paint."
rss() { # label command...
    local label="$1"; shift
    /usr/bin/time -v "$@" >"$OUT/$label.out" 2>"$OUT/$label.time" || true
    awk -F': ' '/Maximum resident set size/ {print $2}' "$OUT/$label.time"
}
log "peak RSS"
RSS_OURS_Q41="$(rss rss-starling-q4_1 "$STARLING" generate --model "$MODEL" --requantize off -t "$THREADS" -n "$TG" --temperature 0 "$PROMPT")"
RSS_OURS_Q="$(rss "rss-starling-$QUANT" "$STARLING" generate --model "$OURS" --requantize off -t "$THREADS" -n "$TG" --temperature 0 "$PROMPT")"
RSS_LLAMA_Q41="$(rss rss-llama-q4_1 "$LLAMA_DIR/bin/llama-simple" -m "$MODEL" -n "$TG" "$PROMPT")"
RSS_LLAMA_Q="$(rss "rss-llama-$QUANT" "$LLAMA_DIR/bin/llama-simple" -m "$OURS" -n "$TG" "$PROMPT")"

python3 - "$OUT" "$QUANT" "$THREADS" "$PP" "$TG" "$RSS_OURS_Q41" "$RSS_LLAMA_Q41" "$RSS_OURS_Q" "$RSS_LLAMA_Q" "$CANDLE" <<'EOF'
import json, os, sys
out, quant, threads, pp, tg = sys.argv[1:6]
rss = sys.argv[6:10]
candle = sys.argv[10] == "1"

def ours(label):
    rows = json.load(open(os.path.join(out, label + ".json")))
    return {r["test"]: (r["tokens_per_second"], r["stddev"]) for r in rows}

def llama(label):
    path = os.path.join(out, label + ".json")
    try:
        rows = json.load(open(path))
    except (OSError, ValueError):
        return {}
    res = {}
    for r in rows:
        name = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        res[name] = (r["avg_ts"], r["stddev_ts"])
    return res

pairs = [
    ("Q4_1 (shipped)", "starling-q4_1", "llama-q4_1"),
    (f"{quant.upper()} (ours, same file)", f"starling-{quant}", f"llama-ours-{quant}"),
    (f"{quant.upper()} (ours vs llama-quantize)", f"starling-{quant}", f"llama-{quant}"),
]
if candle:
    pairs += [
        ("Q4_1 candle backend", "candle-q4_1", "llama-q4_1"),
        (f"{quant.upper()} candle backend", f"candle-{quant}", f"llama-ours-{quant}"),
    ]
tests = [f"tg{tg}", f"pp{pp}"]
print(f"\nthreads={threads}; tokens/s mean ± sd; ratio = starling / llama.cpp; runs in {out}\n")
print(f"| {'file':<34} | {'test':<6} | {'starling':>16} | {'llama.cpp':>16} | {'ratio':>6} |")
print(f"|{'-'*36}|{'-'*8}|{'-'*18}|{'-'*18}|{'-'*8}|")
for title, a, b in pairs:
    ra, rb = ours(a), llama(b)
    for t in tests:
        if t not in ra:
            continue
        sa = f"{ra[t][0]:8.1f} ± {ra[t][1]:5.1f}"
        if t in rb:
            sb = f"{rb[t][0]:8.1f} ± {rb[t][1]:5.1f}"
            ratio = f"{ra[t][0] / rb[t][0]:6.2f}"
        else:
            sb, ratio = f"{'n/a':>16}", f"{'n/a':>6}"
        print(f"| {title:<34} | {t:<6} | {sa} | {sb} | {ratio} |")
print(f"\npeak RSS while generating {tg} tokens (/usr/bin/time -v, max resident set size):")
kib = lambda s: f"{int(s) / 1024:7.1f} MiB" if s.strip().isdigit() else "    n/a"
print(f"  Q4_1:             starling generate {kib(rss[0])}   llama-simple {kib(rss[1])}")
print(f"  {quant.upper()} (ours):      starling generate {kib(rss[2])}   llama-simple {kib(rss[3])}")
EOF
