/* bench/bench_device.c — `vgrpo bench gemm|attention|dit --device cuda`: the GPU's figures through the device op
 * table (kernels/dev_ops.h: k_dev_ops), the bf16 counterparts of bench/bench_kernels.c and bench/bench_dit.c.
 *
 *   gemm       cuBLASLt bf16 GEMMs (bf16 out, fp32 accumulation; B transposed as nn.Linear stores it): 8192^3 and
 *              the Wan linears at 32,760 tokens (81 frames 480x832): the 1.3B's q/k/v/o and FFN, the A14B's. FLOPs
 *              2*M*N*K. The 8192^3 row is "the measured bf16 peak": every MFU figure (bench dit's) is taken against
 *              it.
 *   attention  the cuDNN SDPA forward and forward+backward at Wan shapes (B 1, 32,760 tokens, head dim 128; 12 heads
 *              as the 1.3B, 40 as the A14B). FLOPs: forward 4*B*H*S^2*Dh, forward+backward 3.5 x that.
 *   dit        the device Wan model (model/dit/wan_dev.h) with the 1.3B's dims and 2 blocks (a small full model:
 *              embedders, blocks, head), forward (inference activations) and forward+backward (stored activations),
 *              at 1 latent frame (1,560 tokens) and 21 (32,760 tokens), 512 text tokens, batch 1. FLOPs per forward:
 *              the blocks' (docs/design.md section 9: 12*S*D^2 + 4*S^2*D + 4*S*L*D + 4*L*D^2 + 4*S*D*F each) plus the
 *              patch embedding, text embedder and proj_out GEMMs (the time embedder's are negligible and left out);
 *              forward+backward = 3 x forward. MFU = achieved TFLOP/s / the 8192^3 GEMM's, measured in the same
 *              process first.
 *
 * The device comes from k_cuda_device (kernels.h): a plain build, or a machine without a GPU, refuses with its one
 * line and exit status 1, as `vgrpo dit-forward --device cuda` does. For tests only, VGRPO_EMULATE_DEVICE=1
 * (model/dit/wan_dev_exec.h) runs the same code on the EMULATED device (kernels/cuda/emu/k_emu.h: host memory, the
 * CPU's kernels on bf16 operands) at tiny shapes; every row then says "emulated" and is no GPU figure.
 * Timing: one warm-up call (the GEMM algorithm or cuDNN plan is pinned then), then windows of several calls between
 * two stream syncs (k_dev_ops.mem_sync), wall clock; the median window per call. Status: compiled, never run on a
 * GPU (kernels/cuda/README.md). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/error.h"
#include "kernels/cuda/emu/k_emu.h"
#include "kernels/cuda/k_cuda.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_dev_exec.h"

const k_dev_ops *bench_open_device(const char *name, int *emulated) {
    *emulated = wan_dev_exec_emulating();
    if (*emulated) {
        printf("device: EMULATED (%s=1: host memory, the CPU's kernels on bf16 operands, tiny shapes): a test of the "
               "code path, not a GPU figure\n",
               WAN_DEV_EMULATE_ENV);
        return &k_emu_ops;
    }
    char why[K_WHY_MAX];
    const k_dev_ops *dev = k_cuda_device(why);
    if (!dev) {
        fprintf(stderr, "vgrpo bench %s: --device cuda: %s\n", name, why);
        return NULL;
    }
    printf("device: %s\n", dev->name);
    return dev;
}

/* n bf16 values of a fixed pattern in [-0.5, 0.5) into device memory, uploaded in chunks. */
static int fill_bf16(const k_dev_ops *dev, kb_bf16 *p, size_t n, unsigned salt) {
    enum { CHUNK = 1 << 20 };
    float *h = malloc(sizeof(float) * CHUNK);
    if (!h) return core_error("out of memory");
    int rc = 0;
    for (size_t o = 0; o < n && !rc; o += CHUNK) {
        const size_t m = n - o < CHUNK ? n - o : CHUNK;
        for (size_t i = 0; i < m; i++) h[i] = (float)(((o + i) * 2654435761u + salt * 40503u) % 1000) * 1e-3f - 0.5f;
        rc = dev->mem_upload_bf16(p + o, h, m);
    }
    free(h);
    return rc;
}

/* Timing plan: windows of `inner` calls; emulated: one call per window. */
typedef struct {
    int windows, inner;
} plan;

static plan make_plan(int emulated, int quick) {
    plan p = {quick ? 1 : 5, emulated ? 1 : (quick ? 3 : 10)};
    return p;
}

/* ---- GEMM ---- */

typedef struct {
    const char *name;
    int M, N, K;
} gemm_shape;

/* Seconds per bf16 GEMM [M, K] x [N, K]^T -> [M, N] (bf16 C), the median window. -1 on failure. */
static double time_gemm(const k_dev_ops *dev, int M, int N, int K, plan pl) {
    kb_bf16 *a = dev->mem_alloc(sizeof(kb_bf16) * (size_t)M * K), *b = dev->mem_alloc(sizeof(kb_bf16) * (size_t)N * K);
    kb_bf16 *c = dev->mem_alloc(sizeof(kb_bf16) * (size_t)M * N);
    double t[16], res = -1;
    if (!a || !b || !c || fill_bf16(dev, a, (size_t)M * K, 1) || fill_bf16(dev, b, (size_t)N * K, 2)) goto out;
    const k_gemm_args g = {.transA = 0, .transB = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .beta = 0.0f,
                           .A = kb_in_bf16(a), .lda = K, .B = kb_in_bf16(b), .ldb = K, .C = kb_out_bf16(c), .ldc = N,
                           .epi = K_EPI_NONE};
    if (dev->gemm(&g) || dev->mem_sync()) goto out;
    for (int w = 0; w < pl.windows; w++) {
        const double t0 = omp_get_wtime();
        for (int i = 0; i < pl.inner; i++)
            if (dev->gemm(&g)) goto out;
        if (dev->mem_sync()) goto out;
        t[w] = (omp_get_wtime() - t0) / pl.inner;
    }
    res = bench_median(t, pl.windows);
out:
    dev->mem_free(a), dev->mem_free(b), dev->mem_free(c);
    return res;
}

static const gemm_shape gemm_gpu[] = {
    {"square 8192^3", 8192, 8192, 8192},
    {"1.3B q/k/v/o (32760 tok)", 32760, 1536, 1536},
    {"1.3B ffn up", 32760, 8960, 1536},
    {"1.3B ffn down", 32760, 1536, 8960},
    {"A14B q/k/v/o", 32760, 5120, 5120},
    {"A14B ffn up", 32760, 13824, 5120},
    {"A14B ffn down", 32760, 5120, 13824},
};
static const gemm_shape gemm_emu[] = {
    {"square 128^3", 128, 128, 128},
    {"tiny q/k/v/o (192 tok)", 192, 128, 128},
    {"tiny ffn up", 192, 256, 128},
};

int bench_device_gemm(int quick) {
    int emu;
    const k_dev_ops *dev = bench_open_device("gemm", &emu);
    if (!dev) return 1;
    const gemm_shape *s = emu ? gemm_emu : gemm_gpu;
    int n = emu ? (int)(sizeof gemm_emu / sizeof *gemm_emu) : (int)(sizeof gemm_gpu / sizeof *gemm_gpu);
    if (quick && !emu) n = 2;
    const plan pl = make_plan(emu, quick);
    printf("bf16 GEMM C[M,N] = A[M,K] B[N,K]^T (bf16 out, fp32 accumulation), %s\n",
           emu ? "EMULATED (not a GPU figure)" : "cuBLASLt");
    printf("%-26s %6s %6s %6s %10s %10s\n", "shape", "M", "N", "K", "ms", "TFLOP/s");
    double peak = 0;
    for (int i = 0; i < n; i++) {
        const double sec = time_gemm(dev, s[i].M, s[i].N, s[i].K, pl);
        if (sec < 0) {
            fprintf(stderr, "vgrpo bench gemm: %s: %s\n", s[i].name, core_last_error());
            return 1;
        }
        const double tf = 2.0 * s[i].M * s[i].N * s[i].K / sec * 1e-12;
        if (i == 0) peak = tf;
        printf("%-26s %6d %6d %6d %10.3f %10.2f%s\n", s[i].name, s[i].M, s[i].N, s[i].K, sec * 1e3, tf,
               emu ? "  (emulated)" : "");
    }
    printf("measured bf16 GEMM peak (the %s row): %.2f TFLOP/s%s\n", s[0].name, peak,
           emu ? " (EMULATED: not a GPU figure)" : ", the 100% of MFU (vgrpo bench dit --device cuda measures it too)");
    return 0;
}

/* ---- attention ---- */

typedef struct {
    const char *name;
    int B, S, H, Dh;
} attn_shape;

/* Seconds per forward and per forward+backward of the SDPA (self-attention, Sq = Skv = S). 0 or -1. */
static int time_attention(const k_dev_ops *dev, const attn_shape *s, plan pl, double *fwd, double *fb) {
    const size_t n = (size_t)s->B * s->S * s->H * s->Dh, nl = (size_t)s->B * s->H * s->S;
    kb_bf16 *p[8] = {0}; /* q k v o do dq dk dv */
    float *lse = dev->mem_alloc(sizeof(float) * nl);
    int rc = -1;
    if (!lse) goto out;
    for (int i = 0; i < 8; i++)
        if (!(p[i] = dev->mem_alloc(sizeof(kb_bf16) * n))) goto out;
    for (int i = 0; i < 5; i++)
        if (i != 3 && fill_bf16(dev, p[i], n, (unsigned)i + 3)) goto out;
    for (int i = 5; i < 8; i++)
        if (dev->mem_zero(p[i], sizeof(kb_bf16) * n)) goto out;
    const float scale = 1.0f / sqrtf((float)s->Dh);
    double t[16];
    for (int which = 0; which < 2; which++) {
        for (int w = -1; w < pl.windows; w++) {
            if (dev->mem_sync()) goto out;
            const double t0 = omp_get_wtime();
            for (int i = 0; i < (w < 0 ? 1 : pl.inner); i++) {
                const kb_in q = kb_in_bf16(p[0]), k = kb_in_bf16(p[1]), v = kb_in_bf16(p[2]);
                if (dev->attention_forward(kb_out_bf16(p[3]), lse, q, k, v, s->B, s->S, s->S, s->H, s->Dh, scale))
                    goto out;
                if (which && dev->attention_backward(kb_out_bf16(p[5]), kb_out_bf16(p[6]), kb_out_bf16(p[7]),
                                                     kb_in_bf16(p[4]), q, k, v, kb_in_bf16(p[3]), lse, s->B, s->S,
                                                     s->S, s->H, s->Dh, scale))
                    goto out;
            }
            if (dev->mem_sync()) goto out;
            if (w >= 0) t[w] = (omp_get_wtime() - t0) / pl.inner;
        }
        *(which ? fb : fwd) = bench_median(t, pl.windows);
    }
    rc = 0;
out:
    for (int i = 0; i < 8; i++) dev->mem_free(p[i]);
    dev->mem_free(lse);
    return rc;
}

static const attn_shape attn_gpu[] = {{"1.3B (12 heads)", 1, 32760, 12, 128}, {"A14B (40 heads)", 1, 32760, 40, 128}};
static const attn_shape attn_emu[] = {{"tiny (4 heads)", 1, 64, 4, 32}};

int bench_device_attention(int quick) {
    int emu;
    const k_dev_ops *dev = bench_open_device("attention", &emu);
    if (!dev) return 1;
    const attn_shape *s = emu ? attn_emu : attn_gpu;
    const int n = emu ? 1 : (quick ? 1 : 2);
    const plan pl = make_plan(emu, quick);
    printf("SDPA self-attention, bf16 q/k/v [B, S, H, Dh], %s; FLOPs fwd 4*B*H*S^2*Dh, f+b 3.5 x fwd\n",
           emu ? "EMULATED (not a GPU figure)" : "cuDNN fused attention");
    printf("%-18s %3s %6s %4s %4s %10s %10s %10s %10s\n", "shape", "B", "S", "H", "Dh", "fwd ms", "TFLOP/s", "f+b ms",
           "TFLOP/s");
    for (int i = 0; i < n; i++) {
        double fwd = 0, fb = 0;
        if (time_attention(dev, &s[i], pl, &fwd, &fb)) {
            fprintf(stderr, "vgrpo bench attention: %s: %s\n", s[i].name, core_last_error());
            return 1;
        }
        const double flop = 4.0 * s[i].B * s[i].H * (double)s[i].S * s[i].S * s[i].Dh;
        printf("%-18s %3d %6d %4d %4d %10.3f %10.2f %10.3f %10.2f%s\n", s[i].name, s[i].B, s[i].S, s[i].H, s[i].Dh,
               fwd * 1e3, flop / fwd * 1e-12, fb * 1e3, 3.5 * flop / fb * 1e-12, emu ? "  (emulated)" : "");
    }
    return 0;
}

/* ---- the Wan DiT ---- */

typedef struct {
    const char *name;
    const char *preset; /* dims from this preset, num_layers replaced */
    int layers;
    wan_shape shape;
} dit_case;

/* Forward FLOPs of the model (see the top comment). */
static double dit_flop(const wan_config *c, const wan_shape *sh) {
    const double S = (double)wan_tokens(c, sh) * sh->B, D = wan_dim(c), L = (double)sh->L * sh->B, F = c->ffn_dim;
    const double pv = (double)c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
    const double block = 12 * S * D * D + 4 * S * S / sh->B * D + 4 * S * L / sh->B * D + 4 * L * D * D + 4 * S * D * F;
    return c->num_layers * block + 2 * S * D * c->in_channels * pv + 2 * S * D * c->out_channels * pv +
           2 * L * (c->text_dim * D + D * D);
}

/* Seconds per forward (INFER) and forward+backward (STORE) of the device model. 0 or -1. */
static int time_dit(const k_dev_ops *dev, const wan_model *m, const wan_shape *sh, plan pl, double *fwd, double *fb) {
    const wan_config *c = &m->cfg;
    const size_t vox = (size_t)sh->B * sh->F * sh->H * sh->W;
    const size_t nx = vox * c->in_channels, no = vox * c->out_channels, ne = (size_t)sh->B * sh->L * c->text_dim;
    wan_dev_model d;
    int rc = -1, have_model = 0;
    wan_dev_acts *a = NULL;
    kb_bf16 *x = dev->mem_alloc(2 * nx), *e = dev->mem_alloc(2 * ne), *g = dev->mem_alloc(2 * no);
    float *o = dev->mem_alloc(4 * no), *ts = malloc(sizeof(float) * (size_t)sh->B);
    if (!x || !e || !g || !o || !ts) goto out;
    for (int b = 0; b < sh->B; b++) ts[b] = 500.0f;
    if (fill_bf16(dev, x, nx, 7) || fill_bf16(dev, e, ne, 8) || fill_bf16(dev, g, no, 9)) goto out;
    if (wan_dev_model_init(&d, dev, m)) goto out;
    have_model = 1;
    if (wan_dev_alloc_grads(&d)) goto out;
    double t[16];
    for (int which = 0; which < 2; which++) {
        if (!(a = wan_dev_acts_new(dev, c, sh, which ? WAN_ACTS_STORE : WAN_ACTS_INFER))) goto out;
        for (int w = -1; w < pl.windows; w++) {
            if (dev->mem_sync()) goto out;
            const double t0 = omp_get_wtime();
            for (int i = 0; i < (w < 0 ? 1 : pl.inner); i++) {
                if (wan_dev_forward(&d, a, kb_out_f32(o), kb_in_bf16(x), ts, kb_in_bf16(e))) goto out;
                if (which && wan_dev_backward(&d, a, kb_out_f32(NULL), kb_out_f32(NULL), kb_in_bf16(g))) goto out;
            }
            if (dev->mem_sync()) goto out;
            if (w >= 0) t[w] = (omp_get_wtime() - t0) / pl.inner;
        }
        *(which ? fb : fwd) = bench_median(t, pl.windows);
        wan_dev_acts_free(a);
        a = NULL;
    }
    rc = 0;
out:
    wan_dev_acts_free(a);
    if (have_model) wan_dev_model_free(&d);
    dev->mem_free(x), dev->mem_free(e), dev->mem_free(g), dev->mem_free(o);
    free(ts);
    return rc;
}

static const dit_case dit_gpu[] = {
    {"1.3B dims, 2 blocks, 1 frame", "wan2.1-t2v-1.3b", 2, {1, 1, 60, 104, 512, 0}},
    {"1.3B dims, 2 blocks, 21 frames", "wan2.1-t2v-1.3b", 2, {1, 21, 60, 104, 512, 0}},
};
static const dit_case dit_emu[] = {{"tiny, 2 blocks", "tiny", 2, {1, 1, 8, 8, 16, 0}}};

int bench_device_dit(int quick) {
    int emu;
    const k_dev_ops *dev = bench_open_device("dit", &emu);
    if (!dev) return 1;
    const plan pl = make_plan(emu, quick);
    /* the MFU's 100%: the square GEMM of bench gemm, measured here first */
    const gemm_shape *pk = emu ? &gemm_emu[0] : &gemm_gpu[0];
    const double pk_sec = time_gemm(dev, pk->M, pk->N, pk->K, pl);
    if (pk_sec < 0) {
        fprintf(stderr, "vgrpo bench dit: the peak GEMM: %s\n", core_last_error());
        return 1;
    }
    const double peak = 2.0 * pk->M * pk->N * pk->K / pk_sec * 1e-12;
    printf("bf16 GEMM peak (%s, as vgrpo bench gemm --device cuda): %.2f TFLOP/s%s\n", pk->name, peak,
           emu ? " (EMULATED: not a GPU figure)" : "");
    printf("Wan DiT on the device (bf16; forward: inference activations, f+b: stored), batch 1; FLOPs: blocks + "
           "patch/text/proj_out GEMMs, f+b = 3 x fwd\n");
    printf("%-32s %6s %4s %10s %9s %6s %10s %9s %6s\n", "model", "tokens", "L", "fwd ms", "TFLOP/s", "MFU", "f+b ms",
           "TFLOP/s", "MFU");
    const dit_case *cs = emu ? dit_emu : dit_gpu;
    const int n = emu ? 1 : (quick ? 1 : 2);
    for (int i = 0; i < n; i++) {
        wan_config c;
        wan_model m;
        if (wan_config_preset(&c, cs[i].preset)) {
            fprintf(stderr, "vgrpo bench dit: %s\n", core_last_error());
            return 1;
        }
        c.num_layers = cs[i].layers;
        if (wan_model_init(&m, &c)) {
            fprintf(stderr, "vgrpo bench dit: %s: %s\n", cs[i].name, core_last_error());
            return 1;
        }
        wan_params_init_random(&m, 1);
        double fwd = 0, fb = 0;
        const int rc = time_dit(dev, &m, &cs[i].shape, pl, &fwd, &fb);
        wan_model_free(&m);
        if (rc) {
            fprintf(stderr, "vgrpo bench dit: %s: %s\n", cs[i].name, core_last_error());
            return 1;
        }
        const double flop = dit_flop(&c, &cs[i].shape), tf = flop / fwd * 1e-12, tfb = 3 * flop / fb * 1e-12;
        printf("%-32s %6lld %4d %10.3f %9.2f %5.1f%% %10.3f %9.2f %5.1f%%%s\n", cs[i].name,
               (long long)wan_tokens(&c, &cs[i].shape), cs[i].shape.L, fwd * 1e3, tf, 100 * tf / peak, fb * 1e3, tfb,
               100 * tfb / peak, emu ? "  (emulated)" : "");
    }
    return 0;
}
