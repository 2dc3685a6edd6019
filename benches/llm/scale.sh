#!/usr/bin/env bash
# Speed at 1B scale: random-weight GGUF files with the shapes of Llama 3.2 1B and Qwen2.5
# 1.5B (speed does not depend on the weights' values), in Q8_0 and Q4_K_M made by
# llama-quantize, measured with `starling bench` and llama.cpp's `llama-bench` on the same
# files and threads in one run. Prints the CPU's flags, the machine's read bandwidth
# (measured by `starling bench`) and, beside each decode figure, the bytes of weights read
# per token × tokens/s as a share of that bandwidth.
#
# Usage: benches/llm/scale.sh [--threads N] [--reps N] [--shapes "A B"] [--types "Q8_0 Q4_K_M"]
#                             [--files "PATH ..."] [--avx2]
#
#   --threads N    threads for both engines (default 2)
#   --reps N       measured repetitions (default 3)
#   --shapes S     shapes to run (default "llama-3.2-1b qwen2.5-1.5b")
#   --types T      llama-quantize types (default "Q8_0 Q4_K_M")
#   --files F      existing GGUF files measured in the same run, as they are (for example the
#                  Gemma 3 270M Q4_K_M file of the model sources); --shapes "" runs only these
#   --avx2         the AVX2 tier on a CPU that has more: starling with STARLING_ISA=avx2, and
#                  llama.cpp built a second time with AVX-512 off (-DGGML_NATIVE=OFF
#                  -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON, cached in target/llama.cpp/avx2/)
#
# llama.cpp and starling are built by compare.sh (--build-only, cached); the files are
# written once under target/llama.cpp/models/scale/ (about 10 GB with the F16 sources).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LLAMA_DIR="$ROOT/target/llama.cpp"
THREADS=2
REPS=3
SHAPES="llama-3.2-1b qwen2.5-1.5b"
TYPES="Q8_0 Q4_K_M"
FILES=""
AVX2=0
PP=512
TG=128

while [[ $# -gt 0 ]]; do
    case "$1" in
        --threads|-t) THREADS="$2"; shift 2 ;;
        --reps|-r) REPS="$2"; shift 2 ;;
        --shapes) SHAPES="$2"; shift 2 ;;
        --types) TYPES="$2"; shift 2 ;;
        --files) FILES="$2"; shift 2 ;;
        --avx2) AVX2=1; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

log() { echo "==> $*" >&2; }

bash "$ROOT/benches/llm/compare.sh" --build-only
log "building the random-weight writer (release)"
(cd "$ROOT" && cargo build --release -p starling-models --example write_tiny >&2)
WRITE="$ROOT/target/release/examples/write_tiny"
STARLING="$ROOT/target/release/starling"
LB="$LLAMA_DIR/bin/llama-bench"
TIER="native"
if [[ $AVX2 == 1 ]]; then
    grep -qw avx2 /proc/cpuinfo || { echo "--avx2: this CPU has no AVX2" >&2; exit 2; }
    AVX2_DIR="$LLAMA_DIR/avx2"
    if [[ ! -x "$AVX2_DIR/bin/llama-bench" ]]; then
        src="$(find "$LLAMA_DIR" -maxdepth 4 -type d -path '*vendor/llama.cpp' | head -n1)"
        log "building llama.cpp with AVX2 and without AVX-512 from $src"
        cmake -S "$src" -B "$AVX2_DIR/build" -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
            -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF \
            -DGGML_AVX_VNNI=OFF -DGGML_AMX_INT8=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release >&2
        cmake --build "$AVX2_DIR/build" --config Release -j "$(nproc)" --target llama-bench >&2
        mkdir -p "$AVX2_DIR/bin"
        cp "$(find "$AVX2_DIR/build" -type f -name llama-bench -perm -u+x | head -n1)" "$AVX2_DIR/bin/"
    fi
    LB="$AVX2_DIR/bin/llama-bench"
    export STARLING_ISA=avx2
    TIER="AVX2 tier: starling STARLING_ISA=avx2, llama.cpp built with AVX2 and AVX-512 off"
fi
MODELS="$LLAMA_DIR/models/scale"
OUT="$LLAMA_DIR/runs/scale-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$MODELS" "$OUT"
export STARLING_HOME="${STARLING_HOME:-$LLAMA_DIR/starling-home}"

FLAGS="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' \
    | grep -E '^(avx|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|amx_int8)$' \
    | tr '\n' ' ' || true)"
MODEL_NAME="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //' || true)"
echo "$MODEL_NAME | $FLAGS | $TIER" >"$OUT/cpu.txt"

files=()
declare -A PATHS
for f in $FILES; do
    [[ -f "$f" ]] || { echo "no such file: $f" >&2; exit 2; }
    label="$(basename "$f" .gguf)"
    PATHS[$label]="$f"
    files+=("$label")
done
for shape in $SHAPES; do
    f16="$MODELS/$shape.f16.gguf"
    if [[ ! -f "$f16" ]]; then
        log "writing $f16"
        "$WRITE" --shape "$shape" "$f16.tmp" >&2
        mv "$f16.tmp" "$f16"
    fi
    for type in $TYPES; do
        q="$MODELS/$shape.$type.gguf"
        if [[ ! -f "$q" ]]; then
            log "llama-quantize $shape $type"
            "$LLAMA_DIR/bin/llama-quantize" "$f16" "$q.tmp" "$type" >"$OUT/quantize-$shape-$type.log" 2>&1
            mv "$q.tmp" "$q"
        fi
        PATHS[$shape.$type]="$q"
        files+=("$shape.$type")
    done
done

echo "load before measuring: $(uptime)" >&2
for label in "${files[@]}"; do
    file="${PATHS[$label]}"
    echo "$file" >"$OUT/path-$label.txt"
    log "starling bench: $label"
    "$STARLING" bench --model "$file" --requantize off -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --json \
        >"$OUT/starling-$label.json" 2>"$OUT/starling-$label.log"
    log "llama-bench: $label"
    # llama.cpp's repacking into AMX tiles has crashed in this environment; without AMX the
    # default (repacking on) runs.
    if ! "$LB" -m "$file" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" -o json \
        >"$OUT/llama-$label.json" 2>"$OUT/llama-$label.log"; then
        log "llama-bench failed on $label; again with --repack 0"
        "$LB" -m "$file" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --repack 0 -o json \
            >"$OUT/llama-$label.json" 2>"$OUT/llama-$label.log" || true
        echo repack0 >"$OUT/llama-$label.repack0"
    fi
done
echo "load after measuring: $(uptime)" >&2

python3 - "$OUT" "$THREADS" "$PP" "$TG" "${files[@]}" <<'EOF'
import json, os, sys
out, threads, pp, tg = sys.argv[1:5]
labels = sys.argv[5:]
tests = [f"tg{tg}", f"pp{pp}"]

def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return []

print(f"\nCPU: {open(os.path.join(out, 'cpu.txt')).read().strip()}")
rows = []
for label in labels:
    ours = {r["test"]: r for r in load(os.path.join(out, f"starling-{label}.json"))}
    theirs = {}
    for r in load(os.path.join(out, f"llama-{label}.json")):
        name = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        theirs[name] = (r["avg_ts"], r["stddev_ts"])
    repack0 = os.path.exists(os.path.join(out, f"llama-{label}.repack0"))
    for t in tests:
        if t not in ours:
            continue
        o = ours[t]
        per_token = o["weight_bytes_per_token"]
        # llama.cpp reads the file's own blocks: every shape here ties its embeddings to the
        # output matrix, so a token reads the whole file (its metadata is a few MB of it).
        try:
            theirs_per_token = os.path.getsize(open(os.path.join(out, f"path-{label}.txt")).read().strip())
        except OSError:
            theirs_per_token = None
        rows.append((label + (" (llama.cpp --repack 0)" if repack0 else ""), t, o, theirs.get(t), per_token, theirs_per_token))

# Each `starling bench` measures the bandwidth just before its own runs; a file's shares are
# taken against that run's figure (the machine's bandwidth moves between runs).
bws = sorted({round(r[2]["memory_bandwidth"] / 1e9, 1) for r in rows if r[2].get("memory_bandwidth")})
bw = ", ".join(f"{b} GB/s" for b in bws) if bws else "not measured"
print(f"read bandwidth (each starling bench, {threads} threads, best of 5 passes over 1 GiB): {bw}")
print(f"threads={threads}; tokens/s mean ± sd; ratio = starling / llama.cpp; runs in {out}")
print("of bandwidth = bytes of weights per token × tokens/s / read bandwidth (decode only);")
print("starling's bytes are its in-memory layout (MiB/token), llama.cpp's the file's size\n")
print(f"| {'file':<40} | {'test':<6} | {'starling':>15} | {'llama.cpp':>15} | {'ratio':>5} | {'MiB/token':>9} | {'starling of bw':>14} | {'llama.cpp of bw':>15} |")
print(f"|{'-'*42}|{'-'*8}|{'-'*17}|{'-'*17}|{'-'*7}|{'-'*11}|{'-'*16}|{'-'*17}|")
for label, t, o, l, per_token, theirs_per_token in rows:
    s = f"{o['tokens_per_second']:7.1f} ± {o['stddev']:5.1f}"
    lt = f"{l[0]:7.1f} ± {l[1]:5.1f}" if l else f"{'n/a':>15}"
    ratio = f"{o['tokens_per_second'] / l[0]:5.2f}" if l else f"{'n/a':>5}"
    mib = per_token / (1 << 20)
    bandwidth = o.get("memory_bandwidth")
    ofbw = lambda b, tps: f"{100 * b * tps / bandwidth:.0f}%" if b and bandwidth and t.startswith("tg") else ""
    print(f"| {label:<40} | {t:<6} | {s} | {lt} | {ratio} | {mib:9.1f} | {ofbw(per_token, o['tokens_per_second']):>14} | {ofbw(theirs_per_token, l[0]) if l else '':>15} |")
EOF
