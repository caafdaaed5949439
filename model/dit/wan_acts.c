/* model/dit/wan_acts.c — activation memory of the Wan transformer for one (config, shape, mode) on one op table: one
 * allocation, laid out by a planning pass that runs twice (count, then assign), so the layout is written down once
 * for the CPU and the device. What each mode keeps is described in wan_dit.h ("Activation memory") and
 * wan_internal.h. On the CPU (wan_acts_new_sp) every tensor is fp32 in a reused host block (64-byte aligned), with the
 * sequence-parallel scratch; on a device (wan_dev_acts_new) the activations are bf16 and the statistics, LSE,
 * modulation rows, velocity and the backward's long sums fp32 (256-byte aligned, the table's mem_alloc), with the
 * bf16 copies of those sums a GEMM reads (the same memory on the CPU), and WAN_ACTS_CHECKPOINT (every block's input
 * plus ONE block's full set, shared by the forward and by each block's rerun in the backward). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_internal.h"

/* Recently freed activation blocks, kept for the next wan_acts_new that fits in one: the trainer makes and frees
 * the activations of every micro-batch and the rollout engine those of every chunk, and fresh memory of that size
 * comes from mmap, so each GEMM writing into it first paid the page faults (measured on the demo recipe: its train
 * GEMMs ran at 0.4x of the same calls on warm memory). The contents are never read before being written (a block is
 * uninitialised when new, too), so reuse changes no value. At most ACTS_CACHE blocks of at most ACTS_CACHE_BYTES
 * each are kept (the large models' blocks are freed as before); freed at exit. */
enum { ACTS_CACHE = 4 };
#define ACTS_CACHE_BYTES ((size_t)256 << 20)
static struct {
    void *mem;
    size_t bytes;
} acts_cache[ACTS_CACHE];
static pthread_mutex_t acts_cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* A cached block of at least `bytes` (the smallest that fits), or a new one; NULL on out of memory. *cap receives
 * its size. */
static void *acts_block_get(size_t bytes, size_t *cap) {
    int best = -1;
    pthread_mutex_lock(&acts_cache_lock);
    for (int i = 0; i < ACTS_CACHE; i++)
        if (acts_cache[i].mem && acts_cache[i].bytes >= bytes && acts_cache[i].bytes <= 2 * bytes + (1 << 20) &&
            (best < 0 || acts_cache[i].bytes < acts_cache[best].bytes))
            best = i;
    void *p = NULL;
    if (best >= 0) {
        p = acts_cache[best].mem, *cap = acts_cache[best].bytes;
        acts_cache[best].mem = NULL;
    }
    pthread_mutex_unlock(&acts_cache_lock);
    if (p) return p;
    *cap = bytes;
    return posix_memalign(&p, 64, bytes) ? NULL : p;
}

/* Keeps a freed block (replacing the smallest kept one when full), or frees it. */
static void acts_block_put(void *mem, size_t bytes) {
    if (!mem) return;
    if (bytes > ACTS_CACHE_BYTES) {
        free(mem);
        return;
    }
    pthread_mutex_lock(&acts_cache_lock);
    int slot = -1;
    for (int i = 0; i < ACTS_CACHE && slot < 0; i++)
        if (!acts_cache[i].mem) slot = i;
    if (slot < 0) {
        slot = 0;
        for (int i = 1; i < ACTS_CACHE; i++)
            if (acts_cache[i].bytes < acts_cache[slot].bytes) slot = i;
        if (acts_cache[slot].bytes > bytes) slot = -1;
    }
    void *drop = mem;
    if (slot >= 0) {
        drop = acts_cache[slot].mem;
        acts_cache[slot].mem = mem, acts_cache[slot].bytes = bytes;
    }
    pthread_mutex_unlock(&acts_cache_lock);
    free(drop);
}

__attribute__((destructor)) static void acts_cache_release(void) {
    for (int i = 0; i < ACTS_CACHE; i++) free(acts_cache[i].mem), acts_cache[i].mem = NULL;
}

typedef struct {
    char *base;   /* NULL while counting */
    size_t off;
    size_t align; /* 64 on the CPU, 256 on a device (cudaMalloc's) */
    size_t aesz;  /* bytes of one activation: 4 (fp32) or 2 (bf16) */
} arena;

/* n elements of esz bytes, aligned (NULL while counting). */
static void *take(arena *a, int64_t n, size_t esz) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * esz + a->align - 1) & ~(a->align - 1);
    void *p = a->base ? a->base + a->off : NULL;
    a->off += bytes;
    return p;
}
#define TA(ar, n) take(ar, n, (ar)->aesz)              /* an activation */
#define T32(ar, n) ((float *)take(ar, n, sizeof(float))) /* fp32 */

static void plan(wan_acts *A, arena *ar) {
    const wan_config *c = &A->cfg;
    const int64_t B = A->shape.B, S = A->S, D = A->D, L = A->L, R = A->R, Fd = A->Fd, H = A->H;
    const int64_t BS = B * S, X = BS * D, T = B * L * D;
    const int nl = c->num_layers;
    const int train = A->mode != WAN_ACTS_INFER;
    /* per block: STORE and RECOMPUTE keep every block's GEMM/attention results; INFER and CHECKPOINT one shared set
     * (CHECKPOINT: the set a block's backward reruns its forward into, elementwise results included) */
    const int per_block = A->mode == WAN_ACTS_STORE || A->mode == WAN_ACTS_RECOMPUTE;
    const int store = A->mode == WAN_ACTS_STORE;
    const int f32 = A->at == KB_F32; /* the bf16 copies of the fp32 sums are the sums themselves */

    A->rope_cos = T32(ar, S * (A->Dh / 2));
    A->rope_sin = T32(ar, S * (A->Dh / 2));
    A->xp = TA(ar, BS * A->Pin);
    if (A->sp > 1) {
        A->full = T32(ar, B * A->S_full * (A->Pin > A->Pout ? A->Pin : A->Pout));
        if (train) A->denc_part = T32(ar, B * L * c->text_dim);
    }
    A->tsin = TA(ar, R * c->freq_dim);
    if (f32) A->tsin_host = A->tsin;
    A->t1 = TA(ar, R * D), A->t1a = TA(ar, R * D), A->temb = TA(ar, R * D), A->temb_act = TA(ar, R * D);
    A->tproj = TA(ar, R * 6 * D);
    A->enc = TA(ar, B * L * c->text_dim);
    A->e1 = TA(ar, T), A->e1a = TA(ar, T), A->ctx = TA(ar, T);
    A->mod = T32(ar, R * 6 * D), A->modo = T32(ar, R * 2 * D);
    A->meano = T32(ar, BS), A->rstdo = T32(ar, BS);
    A->xno = TA(ar, X), A->xmo = TA(ar, X);
    A->po = T32(ar, BS * A->Pout);

    /* residual stream: every block input kept when training; two buffers (ping-pong) for inference */
    void *ping = NULL, *pong = NULL;
    if (!train) ping = TA(ar, X), pong = TA(ar, X);
    for (int l = 0; l <= nl; l++) {
        void *r = train ? TA(ar, X) : (l % 2 ? pong : ping);
        if (A->res) A->res[l] = r;
    }

    /* shared sets: "e" = the elementwise results when not stored per block; "k" = everything else when not kept
     * per block */
    wan_block_acts e = {0}, k = {0};
    if (!store) {
        e.xn1 = TA(ar, X), e.xm1 = TA(ar, X), e.q = TA(ar, X), e.k = TA(ar, X), e.x1 = TA(ar, X);
        e.xn2 = c->cross_attn_norm ? TA(ar, X) : NULL;
        e.q2 = TA(ar, X), e.k2 = TA(ar, T), e.xn3 = TA(ar, X), e.xm3 = TA(ar, X), e.ha = TA(ar, BS * Fd);
    }
    if (!per_block) {
        k.mean1 = T32(ar, BS), k.rstd1 = T32(ar, BS), k.q_pre = TA(ar, X), k.k_pre = TA(ar, X);
        k.v = TA(ar, X), k.rstd_q = T32(ar, BS), k.rstd_k = T32(ar, BS), k.o = TA(ar, X);
        k.lse = T32(ar, B * H * S), k.y1 = TA(ar, X), k.mean2 = T32(ar, BS), k.rstd2 = T32(ar, BS);
        k.q2_pre = TA(ar, X), k.rstd_q2 = T32(ar, BS), k.k2_pre = TA(ar, T), k.rstd_k2 = T32(ar, B * L);
        k.v2 = TA(ar, T), k.o2 = TA(ar, X), k.lse2 = T32(ar, B * H * S), k.x2 = TA(ar, X);
        k.mean3 = T32(ar, BS), k.rstd3 = T32(ar, BS), k.h = TA(ar, BS * Fd), k.y3 = TA(ar, X);
    }
    for (int l = 0; l < nl; l++) {
        wan_block_acts b = {0};
        if (per_block) {
            b.mean1 = T32(ar, BS), b.rstd1 = T32(ar, BS), b.q_pre = TA(ar, X), b.k_pre = TA(ar, X);
            b.v = TA(ar, X), b.rstd_q = T32(ar, BS), b.rstd_k = T32(ar, BS), b.o = TA(ar, X);
            b.lse = T32(ar, B * H * S), b.y1 = TA(ar, X);
            b.mean2 = c->cross_attn_norm ? T32(ar, BS) : NULL, b.rstd2 = c->cross_attn_norm ? T32(ar, BS) : NULL;
            b.q2_pre = TA(ar, X), b.rstd_q2 = T32(ar, BS), b.k2_pre = TA(ar, T), b.rstd_k2 = T32(ar, B * L);
            b.v2 = TA(ar, T), b.o2 = TA(ar, X), b.lse2 = T32(ar, B * H * S), b.x2 = TA(ar, X);
            b.mean3 = T32(ar, BS), b.rstd3 = T32(ar, BS), b.h = TA(ar, BS * Fd), b.y3 = TA(ar, X);
        } else {
            b = k;
        }
        if (store) {
            b.xn1 = TA(ar, X), b.xm1 = TA(ar, X), b.q = TA(ar, X), b.k = TA(ar, X), b.x1 = TA(ar, X);
            b.xn2 = c->cross_attn_norm ? TA(ar, X) : NULL;
            b.q2 = TA(ar, X), b.k2 = TA(ar, T), b.xn3 = TA(ar, X), b.xm3 = TA(ar, X);
            b.ha = TA(ar, BS * Fd);
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
        A->dres = T32(ar, X), A->dres16 = f32 ? (void *)A->dres : TA(ar, X);
        A->da = TA(ar, X), A->db = TA(ar, X), A->dq = TA(ar, X), A->dk = TA(ar, X), A->dv = TA(ar, X);
        A->dob = TA(ar, X);
        A->dh = TA(ar, BS * Fd), A->dha = TA(ar, BS * Fd);
        A->dctx = T32(ar, T), A->dctx16 = f32 ? (void *)A->dctx : TA(ar, T);
        A->dk2 = TA(ar, T), A->dv2 = TA(ar, T), A->dk2p = TA(ar, T), A->de1 = TA(ar, T), A->de1a = TA(ar, T);
        A->dmod = T32(ar, R * 6 * D), A->dmodo = T32(ar, R * 2 * D);
        A->dtemb = T32(ar, R * D), A->dtproj = T32(ar, R * 6 * D);
        A->dtemb16 = f32 ? (void *)A->dtemb : TA(ar, R * D);
        A->dtproj16 = f32 ? (void *)A->dtproj : TA(ar, R * 6 * D);
        A->dtemb_act = TA(ar, R * D), A->dt1 = TA(ar, R * D), A->dt1a = TA(ar, R * D);
        A->dpo = TA(ar, BS * A->Pout), A->dxp = T32(ar, BS * A->Pin);
    }
}

/* A->rope_cos/sin = rows [s0, s0+S) of the full grid's RoPE table (the table is indexed by global position),
 * computed on the host (k_wan_rope_table): written in place on the CPU, uploaded to a device. */
static int rope_rows(wan_acts *A) {
    const int half = A->Dh / 2;
    const int host = A->at == KB_F32;
    float *cs = A->rope_cos, *sn = A->rope_sin, *tmp = NULL;
    if (A->sp > 1 || !host) {
        tmp = malloc((size_t)2 * A->S_full * half * sizeof(float));
        if (!tmp) return core_error("wan acts: out of memory (RoPE table of %d tokens)", A->S_full);
        cs = tmp, sn = tmp + (size_t)A->S_full * half;
    }
    const size_t n = (size_t)A->S * half;
    int rc = 0;
    if (k_wan_rope_table(cs, sn, A->Fp, A->Hp, A->Wp, A->Dh, 10000.0, A->cfg.rope_max_seq_len)) {
        rc = core_error("wan acts: RoPE table for grid %d x %d x %d, head dim %d failed", A->Fp, A->Hp, A->Wp,
                        A->Dh);
    } else if (tmp && host) {
        memcpy(A->rope_cos, cs + (size_t)A->s0 * half, n * sizeof(float));
        memcpy(A->rope_sin, sn + (size_t)A->s0 * half, n * sizeof(float));
    } else if (tmp) {
        if (A->dev->mem_upload(A->rope_cos, cs + (size_t)A->s0 * half, n * sizeof(float)) ||
            A->dev->mem_upload(A->rope_sin, sn + (size_t)A->s0 * half, n * sizeof(float)) || A->dev->mem_sync())
            rc = core_error_push("wan acts: uploading the RoPE table: ");
    }
    free(tmp);
    return rc;
}

int64_t wan_tokens(const wan_config *cfg, const wan_shape *s) {
    return (int64_t)(s->F / cfg->patch_size[0]) * (s->H / cfg->patch_size[1]) * (s->W / cfg->patch_size[2]);
}

wan_acts *wan_acts_new(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode) {
    return wan_acts_new_sp(cfg, shape, mode, 1, 0);
}

/* The checks of a shape and the fields plan() reads, for every constructor and estimate: 0, or -1 with core_error
 * naming what is refused. dev: the table (k_cpu_dev_ops: fp32 activations, sequence parallelism; another, or NULL
 * for an estimate: bf16 activations, wan_dev_config_check, WAN_ACTS_CHECKPOINT). */
static int setup(wan_acts *A, const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode,
                 int sp, int sp_rank) {
    const int cpu = dev == &k_cpu_dev_ops;
    if (cpu ? wan_config_validate(cfg, "wan config") : wan_dev_config_check(cfg, "wan_dev: transformer config"))
        return -1;
    const int *p = cfg->patch_size;
    if (shape->B < 1 || shape->F < 1 || shape->H < 1 || shape->W < 1 || shape->L < 1)
        return core_error("wan shape: B %d, F %d, H %d, W %d, L %d: every size must be >= 1", shape->B, shape->F,
                          shape->H, shape->W, shape->L);
    if (shape->F % p[0] || shape->H % p[1] || shape->W % p[2])
        return core_error("wan shape: latent F x H x W = %d x %d x %d is not divisible by the patch size (%d, %d, %d)",
                          shape->F, shape->H, shape->W, p[0], p[1], p[2]);
    const int Fp = shape->F / p[0], Hp = shape->H / p[1], Wp = shape->W / p[2];
    const int S_full = Fp * Hp * Wp;
    if (sp < 1 || sp_rank < 0 || sp_rank >= sp)
        return core_error("wan acts: sequence-parallel rank %d of %d is out of range", sp_rank, sp);
    if (S_full % sp)
        return core_error("wan shape: video tokens per sample (%d) are not a multiple of the sequence-parallel degree "
                          "(%d)", S_full, sp);
    if (Fp > cfg->rope_max_seq_len || Hp > cfg->rope_max_seq_len || Wp > cfg->rope_max_seq_len)
        return core_error("wan shape: patch grid %d x %d x %d exceeds rope_max_seq_len %d", Fp, Hp, Wp,
                          cfg->rope_max_seq_len);
    if (mode != WAN_ACTS_INFER && mode != WAN_ACTS_STORE && mode != WAN_ACTS_RECOMPUTE &&
        (cpu || mode != WAN_ACTS_CHECKPOINT))
        return core_error("wan acts: unknown mode %d", (int)mode);
    A->dev = dev;
    A->at = cpu ? KB_F32 : KB_BF16;
    A->cfg = *cfg;
    A->shape = *shape;
    A->mode = mode;
    A->Fp = Fp, A->Hp = Hp, A->Wp = Wp;
    A->S_full = S_full, A->sp = sp, A->sp_rank = sp_rank;
    A->S = S_full / sp, A->s0 = A->sp_rank * A->S;
    A->D = wan_dim(cfg), A->Dh = cfg->attention_head_dim, A->H = cfg->num_attention_heads;
    A->Fd = cfg->ffn_dim, A->L = shape->L;
    A->R = shape->per_token_timestep ? shape->B * A->S : shape->B;
    A->Pin = cfg->in_channels * p[0] * p[1] * p[2];
    A->Pout = cfg->out_channels * p[0] * p[1] * p[2];
    return 0;
}

/* The counting pass of A's layout: its bytes. */
static size_t count(wan_acts *A) {
    arena ar = {NULL, 0, A->at == KB_F32 ? 64 : 256, A->at == KB_F32 ? 4 : 2};
    plan(A, &ar);
    return ar.off;
}

/* The activations on dev (setup's checks), allocated and laid out, RoPE rows in place. NULL with core_error. */
static wan_acts *acts_new(const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode,
                          int sp, int sp_rank) {
    wan_acts *A = calloc(1, sizeof *A);
    if (!A) {
        core_error("wan acts: out of memory");
        return NULL;
    }
    if (setup(A, dev, cfg, shape, mode, sp, sp_rank)) {
        free(A);
        return NULL;
    }
    const int cpu = A->at == KB_F32;
    const size_t bytes = count(A);
    A->res = calloc((size_t)cfg->num_layers + 1, sizeof *A->res);
    A->blk = calloc((size_t)cfg->num_layers, sizeof *A->blk);
    if (!cpu) A->tsin_host = malloc((size_t)A->R * cfg->freq_dim * sizeof(float));
    if (!A->res || !A->blk || (!cpu && !A->tsin_host)) {
        wan_acts_free(A);
        core_error("wan acts: out of host memory");
        return NULL;
    }
    A->mem = cpu ? acts_block_get(bytes, &A->mem_cap) : dev->mem_alloc(bytes);
    if (!A->mem) {
        wan_acts_free(A);
        if (cpu) core_error("wan acts: out of memory (%.1f MiB of activations)", bytes / 1048576.0);
        else core_error_push("wan_dev acts: %.1f MiB of device activations: ", bytes / 1048576.0);
        return NULL;
    }
    A->bytes = bytes;
    arena real = {A->mem, 0, cpu ? 64 : 256, cpu ? 4 : 2};
    plan(A, &real);
    if (rope_rows(A)) {
        wan_acts_free(A);
        return NULL;
    }
    return A;
}

wan_acts *wan_acts_new_sp(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp, int sp_rank) {
    return acts_new(&k_cpu_dev_ops, cfg, shape, mode, sp, sp_rank);
}

void wan_acts_free(wan_acts *a) {
    if (!a) return;
    if (a->at == KB_F32) {
        acts_block_put(a->mem, a->mem_cap);
    } else {
        if (a->mem) a->dev->mem_free(a->mem);
        free(a->tsin_host);
    }
    if (a->lora_h) a->dev->mem_free(a->lora_h);
    free(a->res);
    free(a->blk);
    free(a);
}

size_t wan_acts_bytes(const wan_acts *a) {
    return a ? a->bytes + (size_t)(2 * a->lora_cap) * sizeof(float) + sizeof *a +
                   (size_t)(a->cfg.num_layers + 1) * (sizeof(float *) + sizeof(wan_block_acts))
             : 0;
}

size_t wan_acts_plan_bytes(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp) {
    wan_acts A;
    memset(&A, 0, sizeof A);
    if (setup(&A, &k_cpu_dev_ops, cfg, shape, mode, sp, 0)) return 0;
    A.bytes = count(&A);
    return wan_acts_bytes(&A);
}

/* ---- the device's (wan_dev.h) ---- */

wan_dev_acts *wan_dev_acts_new(const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape,
                               wan_acts_mode mode) {
    return wan_dev_acts_new_sp(dev, cfg, shape, mode, 1, 0);
}

wan_dev_acts *wan_dev_acts_new_sp(const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape,
                                  wan_acts_mode mode, int sp, int sp_rank) {
    if (dev == &k_cpu_dev_ops) {
        core_error("wan_dev_acts_new: the CPU table's activations are wan_acts_new's");
        return NULL;
    }
    return acts_new(dev, cfg, shape, mode, sp, sp_rank);
}

void wan_dev_acts_free(wan_dev_acts *a) { wan_acts_free(a); }

size_t wan_dev_acts_bytes(const wan_dev_acts *a) { return a ? a->bytes : 0; }

size_t wan_dev_acts_estimate(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode) {
    return wan_dev_acts_estimate_sp(cfg, shape, mode, 1);
}

size_t wan_dev_acts_estimate_sp(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp) {
    wan_acts A;
    memset(&A, 0, sizeof A);
    if (setup(&A, NULL, cfg, shape, mode, sp, 0)) return 0; /* no table: a device's dtypes and alignment */
    return count(&A);
}
