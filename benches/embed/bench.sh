#!/usr/bin/env bash
# Embedding throughput, ours (release build: the default CPU-kernel backend, and candle in
# f32 for reference) vs sentence-transformers (PyTorch), on the same sentences with the same
# thread count, in one run.
#
# Usage: benches/embed/bench.sh [MODEL_DIR]
# Env:   STARLING_TEST_EMBED  model dir when no argument (default /tmp/m/minilm)
#        PYTHON               interpreter with sentence-transformers installed
#                             (default python3; `pip install sentence-transformers`)
#        THREADS (2), ROUNDS (3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
model_dir="${1:-${STARLING_TEST_EMBED:-/tmp/m/minilm}}"
python="${PYTHON:-python3}"
threads="${THREADS:-2}"
rounds="${ROUNDS:-3}"

if [[ ! -f "$model_dir/model.safetensors" ]]; then
    echo "no model at $model_dir: pass an extracted all-MiniLM-L6-v2 directory" >&2
    exit 2
fi
if ! "$python" -c "import sentence_transformers" 2>/dev/null; then
    echo "$python has no sentence-transformers: pip install sentence-transformers, or set PYTHON" >&2
    exit 2
fi

sentences="$(mktemp)"
trap 'rm -f "$sentences"' EXIT
"$python" "$here/make_sentences.py" >"$sentences"

(cd "$root" && cargo build --release -q -p starling-models --example embed_bench)
ours_bin="$root/target/release/examples/embed_bench"

echo "model: $model_dir  sentences: $(wc -l <"$sentences")  threads: $threads  rounds: $rounds"
ours="$(RAYON_NUM_THREADS="$threads" STARLING_EMBED_BACKEND=kernels "$ours_bin" "$model_dir" "$sentences" "$rounds")"
ours_f32="$(RAYON_NUM_THREADS="$threads" STARLING_EMBED_BACKEND=candle "$ours_bin" "$model_dir" "$sentences" "$rounds")"
theirs="$(OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" TOKENIZERS_PARALLELISM=false \
    "$python" "$here/bench_st.py" "$model_dir" "$sentences" "$threads" "$rounds" 2>/dev/null)"

"$python" - "$ours" "$ours_f32" "$theirs" <<'PY'
import json, sys
ours, f32, theirs = (json.loads(a) for a in sys.argv[1:4])
print("sentences/second; ratio = starling (default, kernels) / sentence-transformers")
print(f"{'':10}{'starling':>10}{'candle f32':>12}{'sentence-tf':>13}{'ratio':>8}")
for key in ("batch1", "batch32"):
    print(f"{key:10}{ours[key]:10.1f}{f32[key]:12.1f}{theirs[key]:13.1f}{ours[key] / theirs[key]:8.2f}x")
PY
