/* bench/bench_dit.c — `vgrpo bench dit`: one Wan transformer block, forward and forward+backward, in ms and
 * GFLOP/s, beside this machine's sgemm GFLOP/s (OpenBLAS cblas_sgemm, the ceiling; and vgrpo's fixed-order
 * k_cpu_gemm that the model runs on) at the same thread count.
 *
 * Shapes: the Wan 2.1-1.3B block (D 1536 = 12 heads x 128, FFN 8960, 1,560 video tokens = one 480x832 latent
 * frame, 512 text tokens, batch 1) and the tiny preset's block (D 128 = 4 x 32, FFN 256, 192 tokens = a 3 x 8 x 8
 * grid, 32 text tokens, batch 1). FLOPs per block forward (docs/design.md section 9):
 *     12*S*D^2 + 4*S^2*D + 4*S*L*D + 4*L*D^2 + 4*S*D*F;   forward+backward = 3 x forward.
 * Each figure is the median of several timed runs after a warm-up run. scripts/bench_torch.py times diffusers'
 * WanTransformerBlock on the same shapes (PyTorch CPU eager, same thread count) for comparison.
 * Then the same blocks trained through a LoRA adapter (rank 32 and 64 on the 10 block linears, frozen base): f+b ms
 * against full fine-tuning, and the bytes of weights + gradients + AdamW state per block either way. Measured on the
 * 2-core development VM (shared): the 1.3B block f+b 5.42 s full, 4.23 s LoRA r32 (0.78x: the frozen base skips the
 * weight-gradient GEMMs), 4.54 s r64; 708.6 MB full vs 199.4 MB (r32) and 221.7 MB (r64).
 * Uses model/dit/wan_internal.h (the block functions) on purpose: it times a block alone, without the embedders. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"

typedef struct {
    const char *name;
    int heads, head_dim, ffn, F, H, W, L;
} dit_shape;

double bench_median(double *t, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* sgemm GFLOP/s at M x N x K (row-major, B transposed as nn.Linear uses it): OpenBLAS, then k_cpu_gemm. */
static int sgemm_gflops(int M, int N, int K, int reps, double *blas, double *ours) {
    float *a = malloc((size_t)M * K * sizeof(float)), *b = malloc((size_t)N * K * sizeof(float));
    float *c = malloc((size_t)M * N * sizeof(float));
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return core_error("bench dit: out of memory");
    }
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < (size_t)N * K; i++) b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    double t[16], flop = 2.0 * M * N * K;
    for (int which = 0; which < 2; which++) {
        for (int r = -1; r < reps; r++) {
            double t0 = omp_get_wtime();
            if (which == 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
            else
                k_cpu_gemm(0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N, NULL);
            if (r >= 0) t[r] = omp_get_wtime() - t0;
        }
        *(which ? ours : blas) = flop / bench_median(t, reps) * 1e-9;
    }
    free(a), free(b), free(c);
    return 0;
}

/* Times one block of shape s: forward (inference activations), forward+backward (stored and recomputed). */
static int bench_block(const dit_shape *s, int reps, double *ms_fwd, double *ms_train, double *ms_train_rc,
                       double *flop_fwd) {
    wan_config cfg = {{1, 2, 2}, s->heads, s->head_dim, 16, 16, 64, 256, s->ffn, 1, 1, 1e-6, 1024};
    wan_shape shape = {1, s->F, s->H, s->W, s->L, 0};
    wan_model m;
    if (wan_model_init(&m, &cfg)) return -1;
    if (wan_model_alloc_grads(&m)) {
        wan_model_free(&m);
        return -1;
    }
    /* weights ~ N(0, 1/fan_in) so activations stay O(1); the values do not change the timing */
    wan_params_init_random(&m, 1);
    const int64_t S = wan_tokens(&cfg, &shape), D = wan_dim(&cfg), L = s->L, F = s->ffn;
    *flop_fwd = 12.0 * S * D * D + 4.0 * S * S * D + 4.0 * S * L * D + 4.0 * L * D * D + 4.0 * S * D * F;
    wan_exec ex;
    wan_exec_resolve(&ex, NULL);
    const wan_acts_mode modes[3] = {WAN_ACTS_INFER, WAN_ACTS_STORE, WAN_ACTS_RECOMPUTE};
    double *res[3] = {ms_fwd, ms_train, ms_train_rc};
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        wan_acts *A = wan_acts_new(&cfg, &shape, modes[k]);
        if (!A || wan_acts_bind_cpu(A, &m, NULL, 0)) {
            wan_acts_free(A);
            rc = -1;
            break;
        }
        /* block inputs: residual stream, modulation (tproj) and text context, uniform in [-1, 1) */
        float *in[3] = {A->res[0], A->tproj, A->ctx};
        int64_t n[3] = {S * D, 6 * D, L * D};
        for (int j = 0; j < 3; j++)
            for (int64_t i = 0; i < n[j]; i++) in[j][i] = (float)(((i + 17 * j) * 2654435761u) % 2000) * 1e-3f - 1.0f;
        double t[16];
        for (int r = -1; r < reps && !rc; r++) {
            double t0 = omp_get_wtime();
            rc = wan_block_forward(&ex, A, &m.w.blocks[0], &A->blk[0], A->res[1]);
            if (!rc && modes[k] != WAN_ACTS_INFER) {
                for (int64_t i = 0; i < S * D; i++) A->dres[i] = 1e-3f * (float)((i % 7) - 3);
                rc = wan_block_backward(&ex, A, &m.w.blocks[0], &A->blk[0], A->res[1]);
            }
            if (r >= 0) t[r] = omp_get_wtime() - t0;
        }
        *res[k] = bench_median(t, reps) * 1e3;
        wan_acts_free(A);
    }
    wan_model_free(&m);
    return rc;
}

/* One block of shape s trained through a LoRA adapter of rank r on its 10 linears (frozen base: no base gradients,
 * stored activations): forward+backward ms; and the bytes of what training holds per block, full fine-tuning
 * (fp32 weights + gradients + AdamW m, v = 16 B per parameter) vs LoRA (the frozen fp32 base, 4 B per parameter,
 * plus 16 B per adapter parameter). */
static int bench_block_lora(const dit_shape *s, int reps, int rank, double *ms, int64_t *base_params,
                            int64_t *adapter_params) {
    wan_config cfg = {{1, 2, 2}, s->heads, s->head_dim, 16, 16, 64, 256, s->ffn, 1, 1, 1e-6, 1024};
    wan_shape shape = {1, s->F, s->H, s->W, s->L, 0};
    wan_model m;
    wan_lora lo;
    if (wan_model_init(&m, &cfg)) return -1;
    wan_params_init_random(&m, 1);
    wan_lora_config lc = {rank, 2.0 * rank, WAN_LORA_ALL_BLOCK, 1};
    if (wan_lora_init(&lo, &cfg, &lc, 0) || wan_lora_alloc_grads(&lo)) {
        wan_model_free(&m);
        return -1;
    }
    for (int i = 1; i < lo.layout.count; i += 2) /* B != 0, as after some training */
        for (int64_t k = 0; k < lo.layout.tensors[i].numel; k++)
            lo.params[lo.layout.tensors[i].offset + k] = 1e-3f * (float)((k % 5) - 2);
    int64_t bp = 0;
    for (int i = 0; i < m.layout.count; i++)
        if (!strncmp(m.layout.tensors[i].name, "blocks.0.", 9)) bp += m.layout.tensors[i].numel;
    *base_params = bp, *adapter_params = lo.layout.numel;
    const int64_t S = wan_tokens(&cfg, &shape), D = wan_dim(&cfg), L = s->L;
    wan_exec ex;
    wan_exec_resolve(&ex, NULL);
    wan_acts *A = wan_acts_new(&cfg, &shape, WAN_ACTS_STORE);
    int rc = A ? wan_acts_bind_cpu(A, &m, &lo, 1) : -1; /* the base frozen: no base gradients */
    if (!rc) {
        float *in[3] = {A->res[0], A->tproj, A->ctx};
        int64_t n[3] = {S * D, 6 * D, L * D};
        for (int j = 0; j < 3; j++)
            for (int64_t i = 0; i < n[j]; i++) in[j][i] = (float)(((i + 17 * j) * 2654435761u) % 2000) * 1e-3f - 1.0f;
        double t[16];
        for (int r = -1; r < reps && !rc; r++) {
            double t0 = omp_get_wtime();
            rc = wan_block_forward(&ex, A, &m.w.blocks[0], &A->blk[0], A->res[1]);
            for (int64_t i = 0; !rc && i < S * D; i++) A->dres[i] = 1e-3f * (float)((i % 7) - 3);
            if (!rc) rc = wan_block_backward(&ex, A, &m.w.blocks[0], &A->blk[0], A->res[1]);
            if (r >= 0) t[r] = omp_get_wtime() - t0;
        }
        *ms = bench_median(t, reps) * 1e3;
    }
    wan_acts_free(A);
    wan_lora_free(&lo);
    wan_model_free(&m);
    return rc;
}

int bench_dit(int threads, int quick) {
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    const int nt = omp_get_max_threads();
    const int reps = quick ? 1 : 3;
    static const dit_shape shapes[] = {
        {"wan2.1-1.3b block", 12, 128, 8960, 1, 60, 104, 512},
        {"tiny block", 4, 32, 256, 3, 16, 16, 32},
    };
    double blas = 0, ours = 0, full_tr[2] = {0, 0};
    if (sgemm_gflops(1560, 1536, 1536, reps, &blas, &ours)) goto fail;
    printf("vgrpo bench dit: %d thread%s\n", nt, nt == 1 ? "" : "s");
    bench_torch_describe();
    const double peak = bench_peak_gflops();
    printf("sgemm 1560x1536x1536: OpenBLAS %.1f GFLOP/s, k_cpu_gemm %.1f GFLOP/s; FMA peak %.1f GFLOP/s (vgrpo bench "
           "peak)\n\n", blas, ours, peak);
    printf("%-18s %6s %5s %5s %6s | %9s %8s %6s | %9s %8s %6s %8s | %9s %8s\n", "shape", "S", "L", "D", "FFN",
           "fwd ms", "GFLOP/s", "%peak", "f+b ms", "GFLOP/s", "%peak", "%sgemm", "f+b rc ms", "GFLOP/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const dit_shape *s = &shapes[i];
        if (quick && i == 0) continue; /* the 1.3B block takes seconds: not in a smoke run */
        double f, tr, rc, flop;
        if (bench_block(s, reps, &f, &tr, &rc, &flop)) goto fail;
        full_tr[i] = tr;
        const int S = (s->F / 1) * (s->H / 2) * (s->W / 2), D = s->heads * s->head_dim;
        const double gf = flop / (f * 1e-3) * 1e-9, gt = 3 * flop / (tr * 1e-3) * 1e-9;
        printf("%-18s %6d %5d %5d %6d | %9.2f %8.1f %5.0f%% | %9.2f %8.1f %5.0f%% %7.0f%% | %9.2f %8.1f\n", s->name, S,
               s->L, D, s->ffn, f, gf, 100.0 * gf / peak, tr, gt, 100.0 * gt / peak, 100.0 * gt / blas, rc,
               3 * flop / (rc * 1e-3) * 1e-9);
        const double pf = bench_torch_figure("dit", s->name, "fwd_ms"), pb = bench_torch_figure("dit", s->name, "fb_ms");
        if (pf > 0 && pb > 0)
            printf("%-18s %6s %5s %5s %6s | %9.2f %8.1f %5.0f%% | %9.2f %8.1f %5.0f%% %8s | vgrpo %.2fx / %.2fx "
                   "PyTorch's speed\n", "  PyTorch eager", "", "", "", "", pf, flop / (pf * 1e-3) * 1e-9,
                   100.0 * flop / (pf * 1e-3) * 1e-9 / peak, pb, 3 * flop / (pb * 1e-3) * 1e-9,
                   100.0 * 3 * flop / (pb * 1e-3) * 1e-9 / peak, "", pf / f, pb / tr);
    }
    printf("\nLoRA on the 10 linears of one block (frozen base, stored activations), against full fine-tuning above:\n");
    printf("%-18s %5s | %9s %8s | %14s | %12s %12s\n", "shape", "rank", "f+b ms", "vs full", "adapter params",
           "full MB", "LoRA MB");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const dit_shape *s = &shapes[i];
        if (quick && i == 0) continue;
        const double tr = full_tr[i];
        const int ranks[2] = {32, 64};
        for (int k = 0; k < 2; k++) {
            double ms;
            int64_t bp, ap;
            if (ranks[k] > s->heads * s->head_dim) continue;
            if (bench_block_lora(s, reps, ranks[k], &ms, &bp, &ap)) goto fail;
            printf("%-18s %5d | %9.2f %7.2fx | %14lld | %12.1f %12.1f\n", s->name, ranks[k], ms, ms / tr, (long long)ap,
                   16.0 * bp / 1048576.0, (4.0 * bp + 16.0 * ap) / 1048576.0);
        }
    }
    printf("(MB: weights + gradients + AdamW moments per block, fp32: full 16 B per parameter; LoRA the frozen base "
           "4 B per parameter + 16 B per adapter parameter)\n");
    printf("\nFLOPs per block forward 12SD^2 + 4S^2D + 4SLD + 4LD^2 + 4SDF, training 3x; %%peak = GFLOP/s over the "
           "FMA peak; %%sgemm = fwd+bwd GFLOP/s over OpenBLAS sgemm; rc = recompute mode.\nPyTorch eager on the same "
           "shapes: "
           "python scripts/bench_torch.py --threads %d\n", nt);
    return 0;
fail:
    fprintf(stderr, "vgrpo bench dit: %s\n", core_last_error());
    return 1;
}

/* ---- --profile: the per-op time table of one block's forward and backward ---- */

static void prof_label(const k_prof_row *r, char *out, size_t cap) {
    if (!strcmp(r->op, "gemm"))
        snprintf(out, cap, "gemm %s M %d N %d K %d", r->ta ? (r->tb ? "A^T B^T" : "A^T B") : (r->tb ? "A B^T" : "A B"),
                 r->M, r->N, r->K);
    else
        snprintf(out, cap, "%s (n %lld)", r->op, (long long)r->elems);
}

/* Times reps forward+backward iterations of block shape s with the op table on (phases "forward", "backward") and
 * prints the rows, largest first, per iteration. */
static int profile_block(const dit_shape *s, int reps, double peak) {
    wan_config cfg = {{1, 2, 2}, s->heads, s->head_dim, 16, 16, 64, 256, s->ffn, 1, 1, 1e-6, 1024};
    wan_shape shape = {1, s->F, s->H, s->W, s->L, 0};
    wan_model m;
    if (wan_model_init(&m, &cfg)) return -1;
    if (wan_model_alloc_grads(&m)) {
        wan_model_free(&m);
        return -1;
    }
    wan_params_init_random(&m, 1);
    const int64_t S = wan_tokens(&cfg, &shape), D = wan_dim(&cfg), L = s->L;
    wan_exec ex;
    wan_exec_resolve(&ex, NULL);
    wan_acts *A = wan_acts_new(&cfg, &shape, WAN_ACTS_STORE);
    k_prof_row *rows = malloc(sizeof *rows * K_PROF_MAX_ROWS);
    int rc = A && rows && !wan_acts_bind_cpu(A, &m, NULL, 0) ? 0 : -1;
    double wall[2] = {0, 0};
    if (!rc) {
        float *in[3] = {A->res[0], A->tproj, A->ctx};
        int64_t n[3] = {S * D, 6 * D, L * D};
        for (int j = 0; j < 3; j++)
            for (int64_t i = 0; i < n[j]; i++) in[j][i] = (float)(((i + 17 * j) * 2654435761u) % 2000) * 1e-3f - 1.0f;
        for (int r = -1; r < reps && !rc; r++) {
            if (r == 0) k_prof_enable(1);
            double t0 = omp_get_wtime();
            k_prof_set_phase("forward");
            rc = wan_block_forward(&ex, A, &m.w.blocks[0], &A->blk[0], A->res[1]);
            double t1 = omp_get_wtime();
            for (int64_t i = 0; !rc && i < S * D; i++) A->dres[i] = 1e-3f * (float)((i % 7) - 3);
            double t2 = omp_get_wtime();
            k_prof_set_phase("backward");
            if (!rc) rc = wan_block_backward(&ex, A, &m.w.blocks[0], &A->blk[0], A->res[1]);
            double t3 = omp_get_wtime();
            if (r >= 0) wall[0] += t1 - t0, wall[1] += t3 - t2;
        }
    }
    if (!rc) {
        int n = k_prof_rows(rows, K_PROF_MAX_ROWS);
        if (n > K_PROF_MAX_ROWS) n = K_PROF_MAX_ROWS;
        const double total = wall[0] + wall[1];
        double in_table[2] = {0, 0};
        printf("\n%s: S %lld, L %lld, D %lld, FFN %d; forward %.3f ms + backward %.3f ms per iteration (%d "
               "iterations)\n", s->name, (long long)S, (long long)L, (long long)D, s->ffn, 1e3 * wall[0] / reps,
               1e3 * wall[1] / reps, reps);
        printf("%-9s %-38s %6s %9s %7s %9s %6s\n", "phase", "op", "calls", "ms", "%f+b", "GFLOP/s", "%peak");
        for (int i = 0; i < n; i++) {
            const k_prof_row *r = &rows[i];
            char lab[96];
            prof_label(r, lab, sizeof lab);
            in_table[strcmp(r->phase, "forward") ? 1 : 0] += r->seconds;
            const double ms = 1e3 * r->seconds / reps, gfs = r->flops > 0 ? r->flops / r->seconds * 1e-9 : 0;
            printf("%-9s %-38s %6.0f %9.3f %6.1f%%", r->phase, lab, (double)r->calls / reps, ms,
                   100.0 * r->seconds / total);
            if (gfs > 0) printf(" %9.1f %5.1f%%\n", gfs, 100.0 * gfs / peak);
            else printf(" %9s %6s\n", "-", "-");
        }
        for (int p = 0; p < 2; p++)
            printf("%-9s %-38s %6s %9.3f %6.1f%%\n", p ? "backward" : "forward", "(outside the op table)", "",
                   1e3 * (wall[p] - in_table[p]) / reps, 100.0 * (wall[p] - in_table[p]) / total);
    }
    k_prof_enable(0);
    free(rows);
    wan_acts_free(A);
    wan_model_free(&m);
    return rc;
}

int bench_dit_profile(int threads, int quick) {
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
    const int nt = omp_get_max_threads();
    const double peak = bench_peak_gflops();
    static const dit_shape shapes[] = {
        {"wan2.1-1.3b block", 12, 128, 8960, 1, 60, 104, 512},
        {"tiny block", 4, 32, 256, 3, 16, 16, 32},
    };
    printf("vgrpo bench dit --profile: %d thread%s, peak %.1f GFLOP/s (bench peak); per-op wall time per iteration of "
           "one block's forward + backward (stored activations), largest first\n", nt, nt == 1 ? "" : "s", peak);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (quick && i == 0) continue;
        if (profile_block(&shapes[i], quick ? 1 : (i == 0 ? 2 : 20), peak)) {
            fprintf(stderr, "vgrpo bench dit: %s\n", core_last_error());
            return 1;
        }
    }
    printf("\nGEMM notation: C = op(A) op(B), op(A) [M, K], op(B) [K, N] (nn.Linear forward: A B^T; its backward: "
           "dX = dY W (A B), dW = dY^T X (A^T B)).\n");
    return 0;
}
