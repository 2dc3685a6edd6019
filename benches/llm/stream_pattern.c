/* How fast one thread reads ~1.3 GB (a 1B model's Q8_0 weights) in the order a decode step's
 * tile kernel reads it, against a plain sequential read (issue 14; benches/RESULTS.md,
 * "One thread against one thread").
 *
 *   gcc -O2 -mavx512f -o /tmp/stream_pattern benches/llm/stream_pattern.c
 *   /tmp/stream_pattern R [ROW_BYTES]
 *
 * R = 0: one sequential stream. R >= 1: rows of ROW_BYTES (default 2176, a 2048-wide Q8_0
 * row: 64 blocks of 34 bytes) R at a time, 64 bytes of each of the R rows in turn, as a tile
 * of R rows is read with the weights stored row after row. Prints GB/s for three passes;
 * only loads and integer adds, so it measures the access pattern, not the arithmetic. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s R [ROW_BYTES]\n", argv[0]);
        return 2;
    }
    int tile = atoi(argv[1]);
    size_t rb = argc > 2 ? strtoul(argv[2], NULL, 10) : 2176;
    if (rb < 64 || rb % 64 != 0 || tile < 0) {
        fprintf(stderr, "ROW_BYTES must be a multiple of 64, R at least 0\n");
        return 2;
    }
    size_t rows = (1300000000UL / rb) / 8 * 8;
    size_t n = rb * rows;
    unsigned char *b = aligned_alloc(64, n);
    if (!b) {
        perror("aligned_alloc");
        return 1;
    }
    memset(b, 1, n);
    for (int pass = 0; pass < 3; pass++) {
        __m512i acc = _mm512_setzero_si512();
        double t0 = now();
        if (tile == 0) {
            for (size_t i = 0; i < n; i += 64)
                acc = _mm512_add_epi32(acc, _mm512_load_si512(b + i));
        } else {
            for (size_t r = 0; r + tile <= rows; r += tile) {
                const unsigned char *p = b + r * rb;
                for (size_t o = 0; o < rb; o += 64)
                    for (int k = 0; k < tile; k++)
                        acc = _mm512_add_epi32(acc, _mm512_load_si512(p + k * rb + o));
            }
        }
        double secs = now() - t0;
        size_t read = tile == 0 ? n : rows / tile * tile * rb;
        /* The sum is printed so the loads cannot be optimised away. */
        printf("R=%d row_bytes=%zu %.2f GB/s (checksum %d)\n", tile, rb, read / secs / 1e9,
               _mm512_reduce_add_epi32(acc) & 0xff);
    }
    free(b);
    return 0;
}
