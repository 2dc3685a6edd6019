/* How many int8 dot-product instructions (`vpdpbusd`) one core retires per cycle, 512-bit
 * (AVX-512 VNNI) and 256-bit (AVX-VNNI, VEX), against 512-bit integer adds and float FMAs:
 * the ceiling of the prompt matmul's tile kernel on this CPU (issue 14; benches/RESULTS.md,
 * "The ceiling of the prompt kernel on a Sapphire Rapids Xeon").
 *
 *   gcc -O2 -o /tmp/vnni_ports benches/llm/vnni_ports.c && /tmp/vnni_ports
 *
 * Each loop runs 12 independent accumulators (more than latency times ports), written in
 * assembly so the compiler can neither fold nor spill them. The clock is estimated from a
 * chain of dependent `imul` (3 cycles each on every x86 core of this decade), so "per
 * cycle" is per core cycle at the speed the core runs now. Needs a CPU with AVX-512 VNNI
 * and AVX-VNNI (Sapphire Rapids and later); on others the first unsupported loop dies
 * with SIGILL. */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define IT 100000000L
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                "xmm10", "xmm11"
/* One instruction into accumulator n; the sources are registers no accumulator uses. */
#define Z(op, n) op " %%zmm30, %%zmm31, %%zmm" #n "\n\t"
#define Y(n) "%{vex%} vpdpbusd %%ymm12, %%ymm13, %%ymm" #n "\n\t"
#define TWELVE(M, a) M(a, 0) M(a, 1) M(a, 2) M(a, 3) M(a, 4) M(a, 5) M(a, 6) M(a, 7) \
                     M(a, 8) M(a, 9) M(a, 10) M(a, 11)
#define YM(a, n) Y(n)

static double ghz(void) {
    long x = 3;
    const long n = 200000000L;
    double t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
    t = now() - t;
    return n * 12.0 / t / 1e9;
}

/* Prints how many of the instructions in `code` (12 per iteration) retire per cycle. */
#define MEASURE(name, code)                                                                \
    do {                                                                                   \
        double t = now();                                                                  \
        for (long i = 0; i < IT; i++)                                                      \
            __asm__ volatile(code ::: CLOBBER);                                            \
        t = now() - t;                                                                     \
        printf("  %-20s %.2f per cycle\n", name, IT * 12 / t / 1e9 / f);                  \
    } while (0)

int main(void) {
    for (int round = 0; round < 2; round++) {
        double f = ghz();
        printf("round %d: core clock ~%.2f GHz\n", round + 1, f);
        MEASURE("vpdpbusd zmm", TWELVE(Z, "vpdpbusd"));
        MEASURE("vpdpbusd ymm (VEX)", TWELVE(YM, 0));
        MEASURE("vpaddd zmm", TWELVE(Z, "vpaddd"));
        MEASURE("vfmadd231ps zmm", TWELVE(Z, "vfmadd231ps"));
    }
    return 0;
}
