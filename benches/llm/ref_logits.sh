#!/usr/bin/env bash
# Regenerates the llama.cpp reference fixtures of the architecture tests
# (models/tests/fixtures/llama_cpp/*.json, read by models/tests/reference_logits.rs).
#
# For every tiny architecture in `starling_models::testing::TinyArch` it writes the same
# random-weight Q8_0 GGUF the test writes (`--example write_tiny`), has llama.cpp tokenise
# the reference text and compute the logits of its first tokens (`ref_logits.cpp`, built
# against the llama.cpp that compare.sh builds from the llama-cpp-python sdist), and stores
# both with the file's SHA-256 so the test can tell when the writer changed.
#
# Usage: benches/llm/ref_logits.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
LLAMA_DIR="$ROOT/target/llama.cpp"
FIXTURES="$ROOT/models/tests/fixtures/llama_cpp"
WORK="$ROOT/target/ref_logits"
N_EVAL=12

log() { echo "==> $*" >&2; }

# The llama.cpp library, from the source and build directory compare.sh uses.
src="$(find "$LLAMA_DIR" -maxdepth 4 -type d -path '*vendor/llama.cpp' 2>/dev/null | head -n1)"
if [[ -z "$src" ]]; then
    log "downloading the llama-cpp-python sdist"
    mkdir -p "$LLAMA_DIR"
    python3 -m pip download --no-deps --no-binary llama-cpp-python llama-cpp-python -d "$LLAMA_DIR" >&2
    tar -xzf "$(ls -t "$LLAMA_DIR"/llama_cpp_python-*.tar.gz | head -n1)" -C "$LLAMA_DIR"
    src="$(find "$LLAMA_DIR" -maxdepth 4 -type d -path '*vendor/llama.cpp' | head -n1)"
fi
if [[ ! -f "$LLAMA_DIR/build/CMakeCache.txt" ]]; then
    cmake -S "$src" -B "$LLAMA_DIR/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release >&2
fi
cmake --build "$LLAMA_DIR/build" --config Release -j "$(nproc)" --target llama >&2
mkdir -p "$WORK" "$FIXTURES"
log "building ref_logits"
mapfile -t libs < <(find "$LLAMA_DIR/build" -name 'libllama*.a' -o -name 'libggml*.a' | sort -r)
g++ -O2 -std=c++17 -fopenmp "$ROOT/benches/llm/ref_logits.cpp" \
    -I "$src/include" -I "$src/ggml/include" \
    -Wl,--start-group "${libs[@]}" -Wl,--end-group -lpthread -ldl -o "$WORK/ref_logits"

log "writing the tiny GGUF files"
(cd "$ROOT" && cargo run -q --release -p starling-models --example write_tiny -- "$WORK") >&2
TEXT="$ROOT/models/tests/fixtures/llama_cpp/reference_text.txt"
version="$(basename "$(dirname "$(dirname "$src")")")"
for gguf in "$WORK"/tiny-*.gguf; do
    name="$(basename "$gguf" .gguf)"
    name="${name#tiny-}"
    log "llama.cpp on $name"
    "$WORK/ref_logits" "$gguf" "$TEXT" "$N_EVAL" > "$WORK/$name.raw.json"
    python3 - "$gguf" "$WORK/$name.raw.json" "$FIXTURES/$name.json" "$version" "$N_EVAL" <<'PY'
import hashlib, json, sys
gguf, raw, out, version, n_eval = sys.argv[1:]
data = json.load(open(raw))
fixture = {
    "made_by": f"benches/llm/ref_logits.sh with llama.cpp from {version}",
    "gguf_sha256": hashlib.sha256(open(gguf, "rb").read()).hexdigest(),
    "n_eval": int(n_eval),
    "tokens": data["tokens"],
    "logits": data["logits"],
}
json.dump(fixture, open(out, "w"), separators=(",", ":"))
open(out, "a").write("\n")
PY
done
log "fixtures written to $FIXTURES"
