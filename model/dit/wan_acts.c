/* model/dit/wan_acts.c — activation memory of the Wan transformer for one (config, shape, mode): one allocation,
 * laid out by a planning pass that runs twice (count, then assign), so the layout is written down once. What each
 * mode keeps is described in wan_dit.h ("Activation memory") and wan_internal.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
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
    char *base; /* NULL while counting */
    size_t off;
} arena;

/* n floats, 64-byte aligned (NULL while counting). */
static float *take(arena *a, int64_t n) {
    size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
    float *p = a->base ? (float *)(a->base + a->off) : NULL;
    a->off += bytes;
    return p;
}

static void plan(wan_acts *A, arena *ar) {
    const wan_config *c = &A->cfg;
    const int64_t B = A->shape.B, S = A->S, D = A->D, L = A->L, R = A->R, Fd = A->Fd, H = A->H;
    const int64_t BS = B * S, X = BS * D, T = B * L * D;
    const int nl = c->num_layers;
    const int train = A->mode != WAN_ACTS_INFER;
    const int store = A->mode == WAN_ACTS_STORE;

    A->rope_cos = take(ar, S * (A->Dh / 2));
    A->rope_sin = take(ar, S * (A->Dh / 2));
    A->xp = take(ar, BS * A->Pin);
    if (A->sp > 1) {
        A->full = take(ar, B * A->S_full * (A->Pin > A->Pout ? A->Pin : A->Pout));
        if (train) A->denc_part = take(ar, B * L * c->text_dim);
    }
    A->tsin = take(ar, R * c->freq_dim);
    A->t1 = take(ar, R * D);
    A->t1a = take(ar, R * D);
    A->temb = take(ar, R * D);
    A->temb_act = take(ar, R * D);
    A->tproj = take(ar, R * 6 * D);
    A->enc = take(ar, B * L * c->text_dim);
    A->e1 = take(ar, T);
    A->e1a = take(ar, T);
    A->ctx = take(ar, T);
    A->mod = take(ar, R * 6 * D);
    A->modo = take(ar, R * 2 * D);
    A->meano = take(ar, BS);
    A->rstdo = take(ar, BS);
    A->xno = take(ar, X);
    A->xmo = take(ar, X);
    A->po = take(ar, BS * A->Pout);

    /* Residual stream: every block input kept when training; two buffers (ping-pong) for inference. */
    float *ping = NULL, *pong = NULL;
    if (!train) {
        ping = take(ar, X);
        pong = take(ar, X);
    }
    for (int l = 0; l <= nl; l++)
        if (A->res) A->res[l] = train ? take(ar, X) : (l % 2 ? pong : ping);
        else (void)(train ? take(ar, X) : NULL);

    /* Shared sets: "e" = the elementwise results when not stored; "k" = everything when not training. */
    wan_block_acts e = {0}, k = {0};
    if (!store) {
        e.xn1 = take(ar, X), e.xm1 = take(ar, X), e.q = take(ar, X), e.k = take(ar, X), e.x1 = take(ar, X);
        e.xn2 = c->cross_attn_norm ? take(ar, X) : NULL;
        e.q2 = take(ar, X), e.k2 = take(ar, T), e.xn3 = take(ar, X), e.xm3 = take(ar, X), e.ha = take(ar, BS * Fd);
    }
    if (!train) {
        k.mean1 = take(ar, BS), k.rstd1 = take(ar, BS), k.q_pre = take(ar, X), k.k_pre = take(ar, X);
        k.v = take(ar, X), k.rstd_q = take(ar, BS), k.rstd_k = take(ar, BS), k.o = take(ar, X);
        k.lse = take(ar, B * H * S), k.y1 = take(ar, X), k.mean2 = take(ar, BS), k.rstd2 = take(ar, BS);
        k.q2_pre = take(ar, X), k.rstd_q2 = take(ar, BS), k.k2_pre = take(ar, T), k.rstd_k2 = take(ar, B * L);
        k.v2 = take(ar, T), k.o2 = take(ar, X), k.lse2 = take(ar, B * H * S), k.x2 = take(ar, X);
        k.mean3 = take(ar, BS), k.rstd3 = take(ar, BS), k.h = take(ar, BS * Fd), k.y3 = take(ar, X);
    }
    for (int l = 0; l < nl; l++) {
        wan_block_acts b = {0};
        if (train) {
            b.mean1 = take(ar, BS), b.rstd1 = take(ar, BS), b.q_pre = take(ar, X), b.k_pre = take(ar, X);
            b.v = take(ar, X), b.rstd_q = take(ar, BS), b.rstd_k = take(ar, BS), b.o = take(ar, X);
            b.lse = take(ar, B * H * S), b.y1 = take(ar, X);
            b.mean2 = c->cross_attn_norm ? take(ar, BS) : NULL, b.rstd2 = c->cross_attn_norm ? take(ar, BS) : NULL;
            b.q2_pre = take(ar, X), b.rstd_q2 = take(ar, BS), b.k2_pre = take(ar, T), b.rstd_k2 = take(ar, B * L);
            b.v2 = take(ar, T), b.o2 = take(ar, X), b.lse2 = take(ar, B * H * S), b.x2 = take(ar, X);
            b.mean3 = take(ar, BS), b.rstd3 = take(ar, BS), b.h = take(ar, BS * Fd), b.y3 = take(ar, X);
        } else {
            b = k;
        }
        if (store) {
            b.xn1 = take(ar, X), b.xm1 = take(ar, X), b.q = take(ar, X), b.k = take(ar, X), b.x1 = take(ar, X);
            b.xn2 = c->cross_attn_norm ? take(ar, X) : NULL;
            b.q2 = take(ar, X), b.k2 = take(ar, T), b.xn3 = take(ar, X), b.xm3 = take(ar, X);
            b.ha = take(ar, BS * Fd);
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
        A->dres = take(ar, X), A->da = take(ar, X), A->db = take(ar, X), A->dq = take(ar, X);
        A->dk = take(ar, X), A->dv = take(ar, X), A->dob = take(ar, X);
        A->dh = take(ar, BS * Fd), A->dha = take(ar, BS * Fd);
        A->dctx = take(ar, T), A->dk2 = take(ar, T), A->dv2 = take(ar, T), A->dk2p = take(ar, T);
        A->de1 = take(ar, T), A->de1a = take(ar, T);
        A->dmod = take(ar, R * 6 * D), A->dmodo = take(ar, R * 2 * D);
        A->dtemb = take(ar, R * D), A->dtemb_act = take(ar, R * D), A->dt1 = take(ar, R * D);
        A->dt1a = take(ar, R * D), A->dtproj = take(ar, R * 6 * D);
        A->dpo = take(ar, BS * A->Pout), A->dxp = take(ar, BS * A->Pin);
    }
}

/* A->rope_cos/sin = rows [s0, s0+S) of the full grid's RoPE table (the table is indexed by global position). */
static int rope_rows(wan_acts *A) {
    const int half = A->Dh / 2;
    float *cs = A->rope_cos, *sn = A->rope_sin, *tmp = NULL;
    if (A->sp > 1) {
        tmp = malloc((size_t)2 * A->S_full * half * sizeof(float));
        if (!tmp) return core_error("wan acts: out of memory (RoPE table of %d tokens)", A->S_full);
        cs = tmp, sn = tmp + (size_t)A->S_full * half;
    }
    int rc = 0;
    if (k_wan_rope_table(cs, sn, A->Fp, A->Hp, A->Wp, A->Dh, 10000.0, A->cfg.rope_max_seq_len)) {
        rc = core_error("wan acts: RoPE table for grid %d x %d x %d, head dim %d failed", A->Fp, A->Hp, A->Wp,
                        A->Dh);
    } else if (tmp) {
        memcpy(A->rope_cos, cs + (size_t)A->s0 * half, (size_t)A->S * half * sizeof(float));
        memcpy(A->rope_sin, sn + (size_t)A->s0 * half, (size_t)A->S * half * sizeof(float));
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

/* The checks of a shape and the fields plan() reads, for wan_acts_new_sp and wan_acts_plan_bytes alike: 0, or -1
 * with core_error naming what is refused. */
static int setup(wan_acts *A, const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp, int sp_rank) {
    if (wan_config_validate(cfg, "wan config")) return -1;
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
    if (mode != WAN_ACTS_INFER && mode != WAN_ACTS_STORE && mode != WAN_ACTS_RECOMPUTE)
        return core_error("wan acts: unknown mode %d", (int)mode);
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

wan_acts *wan_acts_new_sp(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp, int sp_rank) {
    wan_acts *A = calloc(1, sizeof *A);
    if (!A) {
        core_error("wan acts: out of memory");
        return NULL;
    }
    if (setup(A, cfg, shape, mode, sp, sp_rank)) {
        free(A);
        return NULL;
    }
    arena count = {NULL, 0};
    plan(A, &count);
    A->res = calloc((size_t)cfg->num_layers + 1, sizeof *A->res);
    A->blk = calloc((size_t)cfg->num_layers, sizeof *A->blk);
    if (!A->res || !A->blk || !(A->mem = acts_block_get(count.off, &A->mem_cap))) {
        A->mem = NULL;
        wan_acts_free(A);
        core_error("wan acts: out of memory (%.1f MiB of activations)", count.off / 1048576.0);
        return NULL;
    }
    A->bytes = count.off;
    arena real = {A->mem, 0};
    plan(A, &real);
    if (rope_rows(A)) {
        wan_acts_free(A);
        return NULL;
    }
    return A;
}

void wan_acts_free(wan_acts *a) {
    if (!a) return;
    acts_block_put(a->mem, a->mem_cap);
    free(a->lora_h);
    free(a->res);
    free(a->blk);
    free(a);
}

size_t wan_acts_bytes(const wan_acts *a) {
    return a ? a->bytes + (size_t)(2 * a->lora_cap) * sizeof(float) + sizeof *a + (size_t)(a->cfg.num_layers + 1) * (sizeof(float *) + sizeof(wan_block_acts))
             : 0;
}

size_t wan_acts_plan_bytes(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp) {
    wan_acts A;
    memset(&A, 0, sizeof A);
    if (setup(&A, cfg, shape, mode, sp, 0)) return 0;
    arena count = {NULL, 0};
    plan(&A, &count);
    A.bytes = count.off;
    return wan_acts_bytes(&A);
}
