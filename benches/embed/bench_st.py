#!/usr/bin/env python3
"""sentence-transformers side of bench.sh: sentences/second at batch 1 and 32.

Usage: bench_st.py MODEL_DIR SENTENCES_FILE THREADS ROUNDS
Prints one JSON object: {"batch1": ..., "batch32": ...} (best round of each).
"""

import json
import sys
import time

import torch
from sentence_transformers import SentenceTransformer


def best_rate(fn, n_sentences: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n_sentences / best


def main() -> None:
    model_dir, sentences_file, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    with open(sentences_file, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f if line.strip()]
    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()

    def one_at_a_time() -> None:
        for s in sentences:
            model.encode([s], batch_size=1, normalize_embeddings=True, convert_to_numpy=True)

    def batches_of_32() -> None:
        for i in range(0, len(sentences), 32):
            model.encode(sentences[i:i + 32], batch_size=32, normalize_embeddings=True,
                         convert_to_numpy=True)

    with torch.inference_mode():
        batches_of_32()  # warm-up
        batch1 = best_rate(one_at_a_time, len(sentences), rounds)
        batch32 = best_rate(batches_of_32, len(sentences), rounds)
    print(json.dumps({"batch1": batch1, "batch32": batch32}))


if __name__ == "__main__":
    main()
