/* model/dit/wan_dev_acts.c — device activation memory of the Wan transformer for one (config, shape, mode):
 * wan_acts.c's plan with dtypes (wan_dev_internal.h), one device allocation laid out by a planning pass that runs
 * twice (count, then assign). What each mode keeps is wan_dit.h's "Activation memory"; here every kept activation is
 * bf16 and the statistics, LSE, modulation rows and velocity fp32, so a mode needs about half the CPU's bytes.
 * WAN_ACTS_CHECKPOINT (device only): every block's input (the residual stream) plus ONE block's full set (what STORE
 * keeps per block), shared by the forward and by each block's rerun in the backward. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dev_internal.h"

typedef struct {
    char *base; /* NULL while counting */
    size_t off;
} arena;

/* n elements of esz bytes, 256-byte aligned (NULL while counting). */
static void *take(arena *a, int64_t n, size_t esz) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * esz + 255) & ~(size_t)255;
    void *p = a->base ? a->base + a->off : NULL;
    a->off += bytes;
    return p;
}
#define T16(ar, n) ((kb_bf16 *)take(ar, n, sizeof(kb_bf16)))
#define T32(ar, n) ((float *)take(ar, n, sizeof(float)))

static void plan(wan_dev_acts *A, arena *ar) {
    const wan_config *c = &A->cfg;
    const int64_t B = A->shape.B, S = A->S, D = A->D, L = A->L, R = A->R, Fd = A->Fd, H = A->H;
    const int64_t BS = B * S, X = BS * D, T = B * L * D;
    const int nl = c->num_layers;
    const int train = A->mode != WAN_ACTS_INFER;
    /* per block: STORE and RECOMPUTE keep every block's GEMM/attention results; INFER and CHECKPOINT one shared set
     * (CHECKPOINT: the set a block's backward reruns its forward into, elementwise results included) */
    const int per_block = A->mode == WAN_ACTS_STORE || A->mode == WAN_ACTS_RECOMPUTE;
    const int store = A->mode == WAN_ACTS_STORE;

    A->rope_cos = T32(ar, S * (A->Dh / 2));
    A->rope_sin = T32(ar, S * (A->Dh / 2));
    A->xp = T16(ar, BS * A->Pin);
    A->tsin = T16(ar, R * c->freq_dim);
    A->t1 = T16(ar, R * D), A->t1a = T16(ar, R * D), A->temb = T16(ar, R * D), A->temb_act = T16(ar, R * D);
    A->tproj = T16(ar, R * 6 * D);
    A->enc = T16(ar, B * L * c->text_dim);
    A->e1 = T16(ar, T), A->e1a = T16(ar, T), A->ctx = T16(ar, T);
    A->mod = T32(ar, R * 6 * D), A->modo = T32(ar, R * 2 * D);
    A->meano = T32(ar, BS), A->rstdo = T32(ar, BS);
    A->xno = T16(ar, X), A->xmo = T16(ar, X);
    A->po = T32(ar, BS * A->Pout);

    /* residual stream: every block input kept when training; ping-pong for inference */
    kb_bf16 *ping = NULL, *pong = NULL;
    if (!train) ping = T16(ar, X), pong = T16(ar, X);
    for (int l = 0; l <= nl; l++) {
        kb_bf16 *r = train ? T16(ar, X) : (l % 2 ? pong : ping);
        if (A->res) A->res[l] = r;
    }

    /* shared sets: "e" = the elementwise results when not stored per block; "k" = everything else when not kept
     * per block */
    wan_dev_block_acts e = {0}, k = {0};
    if (!store) {
        e.xn1 = T16(ar, X), e.xm1 = T16(ar, X), e.q = T16(ar, X), e.k = T16(ar, X), e.x1 = T16(ar, X);
        e.xn2 = c->cross_attn_norm ? T16(ar, X) : NULL;
        e.q2 = T16(ar, X), e.k2 = T16(ar, T), e.xn3 = T16(ar, X), e.xm3 = T16(ar, X), e.ha = T16(ar, BS * Fd);
    }
    if (!per_block) {
        k.mean1 = T32(ar, BS), k.rstd1 = T32(ar, BS), k.q_pre = T16(ar, X), k.k_pre = T16(ar, X);
        k.v = T16(ar, X), k.rstd_q = T32(ar, BS), k.rstd_k = T32(ar, BS), k.o = T16(ar, X);
        k.lse = T32(ar, B * H * S), k.y1 = T16(ar, X), k.mean2 = T32(ar, BS), k.rstd2 = T32(ar, BS);
        k.q2_pre = T16(ar, X), k.rstd_q2 = T32(ar, BS), k.k2_pre = T16(ar, T), k.rstd_k2 = T32(ar, B * L);
        k.v2 = T16(ar, T), k.o2 = T16(ar, X), k.lse2 = T32(ar, B * H * S), k.x2 = T16(ar, X);
        k.mean3 = T32(ar, BS), k.rstd3 = T32(ar, BS), k.h = T16(ar, BS * Fd), k.y3 = T16(ar, X);
    }
    for (int l = 0; l < nl; l++) {
        wan_dev_block_acts b = {0};
        if (per_block) {
            b.mean1 = T32(ar, BS), b.rstd1 = T32(ar, BS), b.q_pre = T16(ar, X), b.k_pre = T16(ar, X);
            b.v = T16(ar, X), b.rstd_q = T32(ar, BS), b.rstd_k = T32(ar, BS), b.o = T16(ar, X);
            b.lse = T32(ar, B * H * S), b.y1 = T16(ar, X);
            b.mean2 = c->cross_attn_norm ? T32(ar, BS) : NULL, b.rstd2 = c->cross_attn_norm ? T32(ar, BS) : NULL;
            b.q2_pre = T16(ar, X), b.rstd_q2 = T32(ar, BS), b.k2_pre = T16(ar, T), b.rstd_k2 = T32(ar, B * L);
            b.v2 = T16(ar, T), b.o2 = T16(ar, X), b.lse2 = T32(ar, B * H * S), b.x2 = T16(ar, X);
            b.mean3 = T32(ar, BS), b.rstd3 = T32(ar, BS), b.h = T16(ar, BS * Fd), b.y3 = T16(ar, X);
        } else {
            b = k;
        }
        if (store) {
            b.xn1 = T16(ar, X), b.xm1 = T16(ar, X), b.q = T16(ar, X), b.k = T16(ar, X), b.x1 = T16(ar, X);
            b.xn2 = c->cross_attn_norm ? T16(ar, X) : NULL;
            b.q2 = T16(ar, X), b.k2 = T16(ar, T), b.xn3 = T16(ar, X), b.xm3 = T16(ar, X);
            b.ha = T16(ar, BS * Fd);
        } else {
            b.xn1 = e.xn1, b.xm1 = e.xm1, b.q = e.q, b.k = e.k, b.x1 = e.x1, b.xn2 = e.xn2, b.q2 = e.q2;
            b.k2 = e.k2, b.xn3 = e.xn3, b.xm3 = e.xm3, b.ha = e.ha;
        }
        if (!c->cross_attn_norm) b.xn2 = b.x1, b.mean2 = b.rstd2 = NULL;
        if (A->res) b.x = A->res[l];
        b.layer = l;
        if (A->blk) A->blk[l] = b;
    }

    if (train) {
        A->dres = T32(ar, X), A->dres16 = T16(ar, X);
        A->da = T16(ar, X), A->db = T16(ar, X), A->dq = T16(ar, X), A->dk = T16(ar, X), A->dv = T16(ar, X);
        A->dob = T16(ar, X);
        A->dh = T16(ar, BS * Fd), A->dha = T16(ar, BS * Fd);
        A->dctx = T32(ar, T), A->dctx16 = T16(ar, T);
        A->dk2 = T16(ar, T), A->dv2 = T16(ar, T), A->dk2p = T16(ar, T), A->de1 = T16(ar, T), A->de1a = T16(ar, T);
        A->dmod = T32(ar, R * 6 * D), A->dmodo = T32(ar, R * 2 * D);
        A->dtemb = T32(ar, R * D), A->dtproj = T32(ar, R * 6 * D);
        A->dtemb16 = T16(ar, R * D), A->dtproj16 = T16(ar, R * 6 * D);
        A->dtemb_act = T16(ar, R * D), A->dt1 = T16(ar, R * D), A->dt1a = T16(ar, R * D);
        A->dpo = T16(ar, BS * A->Pout), A->dxp = T32(ar, BS * A->Pin);
    }
}

/* The shape checks of wan_acts_new_sp (sp 1) and the fields plan() reads. 0 or -1. */
static int setup(wan_dev_acts *A, const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode) {
    if (wan_dev_config_check(cfg, "wan_dev: transformer config")) return -1;
    const int *p = cfg->patch_size;
    if (shape->B < 1 || shape->F < 1 || shape->H < 1 || shape->W < 1 || shape->L < 1)
        return core_error("wan shape: B %d, F %d, H %d, W %d, L %d: every size must be >= 1", shape->B, shape->F,
                          shape->H, shape->W, shape->L);
    if (shape->F % p[0] || shape->H % p[1] || shape->W % p[2])
        return core_error("wan shape: latent F x H x W = %d x %d x %d is not divisible by the patch size (%d, %d, %d)",
                          shape->F, shape->H, shape->W, p[0], p[1], p[2]);
    const int Fp = shape->F / p[0], Hp = shape->H / p[1], Wp = shape->W / p[2];
    if (Fp > cfg->rope_max_seq_len || Hp > cfg->rope_max_seq_len || Wp > cfg->rope_max_seq_len)
        return core_error("wan shape: patch grid %d x %d x %d exceeds rope_max_seq_len %d", Fp, Hp, Wp,
                          cfg->rope_max_seq_len);
    if (mode != WAN_ACTS_INFER && mode != WAN_ACTS_STORE && mode != WAN_ACTS_RECOMPUTE && mode != WAN_ACTS_CHECKPOINT)
        return core_error("wan acts: unknown mode %d", (int)mode);
    A->cfg = *cfg;
    A->shape = *shape;
    A->mode = mode;
    A->Fp = Fp, A->Hp = Hp, A->Wp = Wp;
    A->S = Fp * Hp * Wp;
    A->D = wan_dim(cfg), A->Dh = cfg->attention_head_dim, A->H = cfg->num_attention_heads;
    A->Fd = cfg->ffn_dim, A->L = shape->L;
    A->R = shape->per_token_timestep ? shape->B * A->S : shape->B;
    A->Pin = cfg->in_channels * p[0] * p[1] * p[2];
    A->Pout = cfg->out_channels * p[0] * p[1] * p[2];
    return 0;
}

size_t wan_dev_acts_estimate(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode) {
    wan_dev_acts A;
    memset(&A, 0, sizeof A);
    if (setup(&A, cfg, shape, mode)) return 0;
    arena count = {NULL, 0};
    plan(&A, &count);
    return count.off;
}

/* The RoPE table of the patch grid, computed on the host (k_wan_rope_table) and uploaded. */
static int upload_rope(wan_dev_acts *A) {
    const size_t n = (size_t)A->S * (A->Dh / 2);
    float *cs = malloc(2 * n * sizeof(float));
    if (!cs) return core_error("wan_dev acts: out of memory (RoPE table of %d tokens)", A->S);
    int rc = 0;
    if (k_wan_rope_table(cs, cs + n, A->Fp, A->Hp, A->Wp, A->Dh, 10000.0, A->cfg.rope_max_seq_len))
        rc = core_error("wan_dev acts: RoPE table for grid %d x %d x %d, head dim %d failed", A->Fp, A->Hp, A->Wp,
                        A->Dh);
    else if (A->dev->mem_upload(A->rope_cos, cs, n * sizeof(float)) ||
             A->dev->mem_upload(A->rope_sin, cs + n, n * sizeof(float)) || A->dev->mem_sync())
        rc = core_error_push("wan_dev acts: uploading the RoPE table: ");
    free(cs);
    return rc;
}

wan_dev_acts *wan_dev_acts_new(const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape,
                               wan_acts_mode mode) {
    wan_dev_acts *A = calloc(1, sizeof *A);
    if (!A) {
        core_error("wan_dev acts: out of memory");
        return NULL;
    }
    A->dev = dev;
    if (setup(A, cfg, shape, mode)) {
        free(A);
        return NULL;
    }
    arena count = {NULL, 0};
    plan(A, &count);
    A->res = calloc((size_t)cfg->num_layers + 1, sizeof *A->res);
    A->blk = calloc((size_t)cfg->num_layers, sizeof *A->blk);
    A->tsin_host = malloc((size_t)A->R * cfg->freq_dim * sizeof(float));
    if (!A->res || !A->blk || !A->tsin_host) {
        wan_dev_acts_free(A);
        core_error("wan_dev acts: out of host memory");
        return NULL;
    }
    if (!(A->mem = dev->mem_alloc(count.off))) {
        core_error_push("wan_dev acts: %.1f MiB of device activations: ", count.off / 1048576.0);
        wan_dev_acts_free(A);
        return NULL;
    }
    A->bytes = count.off;
    arena real = {A->mem, 0};
    plan(A, &real);
    if (upload_rope(A)) {
        wan_dev_acts_free(A);
        return NULL;
    }
    return A;
}

void wan_dev_acts_free(wan_dev_acts *a) {
    if (!a) return;
    if (a->mem) a->dev->mem_free(a->mem);
    if (a->lora_h) a->dev->mem_free(a->lora_h);
    free(a->res);
    free(a->blk);
    free(a->tsin_host);
    free(a);
}

size_t wan_dev_acts_bytes(const wan_dev_acts *a) { return a ? a->bytes : 0; }
