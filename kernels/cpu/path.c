/* kernels/cpu/path.c — which vector path the CPU kernels run (kernels/cpu/cpu.h: k_cpu_path).
 *
 * Every path computes the same values bit for bit (each GEMM element one fused multiply-add chain in k order; the
 * attention's exp and sums in the same lane order), so the choice is about speed only: the widest path that is
 * compiled into this binary (the build's -march) and that this CPU runs, unless the environment variable
 * VGRPO_CPU_PATH (c, avx2, avx512) asks for another one. tests/test_kernels_paths.c runs every available path
 * against the others. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static int chosen = -1;

int k_cpu_path_available(k_cpu_path p) {
    switch (p) {
    case K_CPU_PATH_C:
        return 1;
    case K_CPU_PATH_AVX2:
#if defined(__AVX2__) && defined(__FMA__)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
        return 0;
#endif
    case K_CPU_PATH_AVX512:
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
        return 0;
#endif
    }
    return 0;
}

const char *k_cpu_path_name(k_cpu_path p) {
    return p == K_CPU_PATH_AVX512 ? "avx512" : p == K_CPU_PATH_AVX2 ? "avx2" : "c";
}

k_cpu_path k_cpu_get_path(void) {
    if (chosen >= 0) return (k_cpu_path)chosen;
    int p = K_CPU_PATH_C;
    for (int q = K_CPU_PATH_AVX512; q > K_CPU_PATH_C; q--)
        if (k_cpu_path_available((k_cpu_path)q)) {
            p = q;
            break;
        }
    const char *env = getenv("VGRPO_CPU_PATH");
    if (env)
        for (int q = K_CPU_PATH_C; q <= K_CPU_PATH_AVX512; q++)
            if (!strcmp(env, k_cpu_path_name((k_cpu_path)q)) && k_cpu_path_available((k_cpu_path)q)) p = q;
    __atomic_store_n(&chosen, p, __ATOMIC_RELAXED);
    return (k_cpu_path)p;
}

int k_cpu_set_path(k_cpu_path p) {
    if (p < K_CPU_PATH_C || p > K_CPU_PATH_AVX512 || !k_cpu_path_available(p)) return -1;
    __atomic_store_n(&chosen, (int)p, __ATOMIC_RELAXED);
    return 0;
}
