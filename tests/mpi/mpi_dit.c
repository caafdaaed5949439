/* tests/mpi/mpi_dit.c — model-level sequence parallelism (docs/design.md section 6): the tiny Wan transformer's forward
 * and backward with each sample's video tokens sharded over the SP ranks (wan_acts_new_sp + the USP hook) against
 * the single-rank model (wan_acts_new, default attention) on the same inputs, in the same run.
 *
 * Case "dit SP ULYSSES [F H W B PER_TOKEN RECOMPUTE LORA]" (world = dp x SP ranks; latent F x H x W, 16 channels,
 * text length 8; defaults 4 8 8 1 0 0 0, i.e. 64 video tokens; LORA 1: with a LoRA adapter on all 16 linears, rank 4,
 * B != 0, whose gradients are checked like the parameters'). Every rank builds the tiny preset with random weights
 * (wan_params_init_random, the same everywhere) and its dp rank's inputs x, timestep, enc and the output gradient
 * dout (the same on every SP peer), runs the reference forward + backward over the whole sequence, then the
 * sequence-parallel forward + backward twice, and checks:
 *   - out and dx (the full tensors every rank holds): ring degree 1 (pure Ulysses) bit-identical (memcmp);
 *     ring > 1: max|sp - ref| <= DIT_RING_BOUND * FLT_EPSILON * max|ref| (the whole tensor's maximum);
 *   - denc (summed over the SP group inside wan_backward) and the parameter gradients (this rank's partial sums,
 *     all-reduced over the SP group here, as the trainer does over the world): relative L2 <= 1e-5, per tensor
 *     (the worst tensor is printed) — they are sums over tokens in another order, and under ring carry its
 *     rounding;
 *   - determinism: the two SP runs give bit-identical out, dx, denc and partial gradients; an SP forward on
 *     forward-only (INFER) activations gives the same out;
 *   - activation memory: wan_acts_bytes of the SP activations below the single-rank ones (ratio printed);
 *   - misuse refused before any communication: default attention under SP, an SP group of the wrong size.
 * Rank 0 prints the worst deviations over the world.
 *
 * DIT_RING_BOUND = 16, the op-level bound of sp/ (tests/mpi/mpi_usp.c), kept at model level. Measured (tiny preset,
 * 2 layers, S 64 and 256, L 8, B 1..2, per-token timesteps, STORE and RECOMPUTE, u1r2, u2r2, u1r4, dp 1 and 2):
 * out 2.3..3.1 and dx 2.7..3.4 eps x max|ref| (absolute 1.3e-6..1.9e-6 with max|out| ~ 4), the same at ring 2 and
 * ring 4: the ring's LSE-merge rounding passes through two blocks, LayerNorms and proj_out without growing.
 * Gradient relative L2 (sums over tokens in another order): Ulysses worst tensor 1.2e-6..1.4e-6, ring
 * 2.5e-6..3.3e-6 (both blocks.*.attn?.to_k.bias, whose exact gradient nearly cancels), whole vector
 * 2.3e-7..4.1e-7; denc 5.4e-7..7.3e-7.
 *
 * Case "dit_bench SP ULYSSES [F H W L LAYERS REPS]" (a benchmark, not a test; defaults 4 64 64 64 2 3: 4,096 video
 * tokens, 64 text tokens): per-rank activation bytes (wan_acts_bytes, STORE) against the single-rank figure, and
 * the wall time of one forward + backward (best of REPS after one warm-up, the slowest rank's), and the peak resident
 * memory of the largest rank (getrusage: also counts parameters, gradients, the USP workspace and MPI). SP 1 runs
 * the plain single-rank path. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/error.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "sp/usp_attention.h"
#include "tests/mpi/mpi_cases.h"

#define DIT_RING_BOUND 16.0
#define DIT_GRAD_L2 1e-5

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        m = fmax(m, d);
    }
    return m;
}

static double l2_rel(const float *a, const float *b, size_t n) {
    double nd = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        nd += d * d, nb += (double)b[i] * b[i];
    }
    if (nd != nd) return INFINITY;
    return nb > 0 ? sqrt(nd / nb) : sqrt(nd);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* One forward + backward into zeroed gradients: out, dx, denc (dx/denc NULL: not asked). */
static int fwd_bwd(wan_model *m, wan_acts *A, const wan_exec *ex, float *out, float *dx, float *denc, size_t nx,
                   size_t ne, const float *x, const float *t, const float *enc, const float *dout) {
    wan_model_zero_grads(m);
    if (m->lora) wan_lora_zero_grads(m->lora);
    if (dx) memset(dx, 0, nx * sizeof(float));
    if (denc) memset(denc, 0, ne * sizeof(float));
    if (wan_forward(m, A, ex, out, x, t, enc)) return -1;
    return wan_backward(m, A, ex, dx, denc, dout);
}

typedef struct {
    wan_config c;
    wan_model m;
    wan_shape sh;
    int64_t S;
    size_t nx, nt, ne;
    float *x, *t, *enc, *dout;
} dit_setup;

static int setup(dit_setup *d, sp_comm *world, int layers, int F, int H, int W, int B, int L, int per_token,
                 int dp_rank) {
    memset(d, 0, sizeof *d);
    if (wan_config_preset(&d->c, "tiny")) return -1;
    if (layers > 0) d->c.num_layers = layers;
    if (wan_model_init(&d->m, &d->c) || wan_model_alloc_grads(&d->m)) return -1;
    wan_params_init_random(&d->m, 11);
    d->sh = (wan_shape){.B = B, .F = F, .H = H, .W = W, .L = L, .per_token_timestep = per_token};
    d->S = wan_tokens(&d->c, &d->sh);
    d->nx = (size_t)B * d->c.in_channels * F * H * W;
    d->nt = per_token ? (size_t)B * d->S : (size_t)B;
    d->ne = (size_t)B * L * d->c.text_dim;
    d->x = malloc(d->nx * 4), d->dout = malloc(d->nx * 4), d->t = malloc(d->nt * 4), d->enc = malloc(d->ne * 4);
    if (!d->x || !d->dout || !d->t || !d->enc) return core_error("dit: out of memory");
    unsigned long long seed = 500 + 31ull * dp_rank;
    mpi_fill_uniform(d->x, d->nx, seed, -1, 1);
    mpi_fill_uniform(d->dout, d->nx, seed + 1, -1, 1);
    mpi_fill_uniform(d->t, d->nt, seed + 2, 20, 980);
    mpi_fill_uniform(d->enc, d->ne, seed + 3, -1, 1);
    (void)world;
    return 0;
}

static void teardown(dit_setup *d) {
    free(d->x), free(d->dout), free(d->t), free(d->enc);
    wan_model_free(&d->m);
}

enum { NDEV = 8 }; /* out eps, out abs, dx eps, dx abs, denc l2, grads worst l2, grads whole l2, acts ratio */

int mpi_case_dit(sp_comm *world, int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "dit: need SP ULYSSES [F H W B PER_TOKEN RECOMPUTE]\n");
        return 2;
    }
    const int sp = atoi(argv[0]), ul = atoi(argv[1]);
    const int F = argc > 2 ? atoi(argv[2]) : 4, Hh = argc > 3 ? atoi(argv[3]) : 8, Ww = argc > 4 ? atoi(argv[4]) : 8;
    const int B = argc > 5 ? atoi(argv[5]) : 1, per_token = argc > 6 ? atoi(argv[6]) : 0;
    const wan_acts_mode mode = argc > 7 && atoi(argv[7]) ? WAN_ACTS_RECOMPUTE : WAN_ACTS_STORE;
    const int use_lora = argc > 8 && atoi(argv[8]);
    const int L = 8;
    sp_topology t;
    const int S_req = F * (Hh / 2) * (Ww / 2);
    if (sp_validate(world->size, sp, ul, &(sp_attn_request){.num_heads = 4, .tokens = S_req}) ||
        sp_topology_init(&t, world->size, sp, ul)) {
        fprintf(stderr, "dit: %s\n", core_last_error());
        return 2;
    }
    sp_usp u;
    if (sp_usp_init(&u, world, &t, NULL)) {
        fprintf(stderr, "dit: %s\n", core_last_error());
        return 1;
    }
    const sp_rank_info me = u.me;
    dit_setup d;
    if (setup(&d, world, 0, F, Hh, Ww, B, L, per_token, me.dp_rank)) {
        fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
        sp_usp_release(&u);
        teardown(&d);
        return 1;
    }
    wan_lora lo;
    memset(&lo, 0, sizeof lo);
    if (use_lora) { /* the same adapter on every rank */
        wan_lora_config lc = {4, 6.0, WAN_LORA_ALL, 5};
        if (wan_lora_init(&lo, &d.c, &lc, 0) || wan_lora_alloc_grads(&lo) || wan_model_attach_lora(&d.m, &lo)) {
            fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
            sp_usp_release(&u);
            teardown(&d);
            return 1;
        }
        for (int i = 1; i < lo.layout.count; i += 2)
            mpi_fill_uniform(lo.params + lo.layout.tensors[i].offset, (size_t)lo.layout.tensors[i].numel, 900 + i,
                             -0.2f, 0.2f);
    }
    const size_t nx = d.nx, ne = d.ne, np = (size_t)d.m.layout.numel, nl = use_lora ? (size_t)lo.layout.numel : 1;
    float *lg0 = calloc(nl, 4), *lg = calloc(nl, 4);
    float *out0 = calloc(nx, 4), *dx0 = calloc(nx, 4), *denc0 = calloc(ne, 4), *g0 = calloc(np, 4);
    float *out[2], *dx[2], *denc[2], *g[2];
    for (int r = 0; r < 2; r++)
        out[r] = calloc(nx, 4), dx[r] = calloc(nx, 4), denc[r] = calloc(ne, 4), g[r] = calloc(np, 4);
    int rc = 0;
    wan_acts *A0 = wan_acts_new(&d.c, &d.sh, mode);
    wan_acts *A = wan_acts_new_sp(&d.c, &d.sh, mode, sp, me.sp_rank);
    if (!A0 || !A) {
        fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
        rc = 1;
        goto out;
    }
    /* Reference: the whole sequence on this rank. */
    if (fwd_bwd(&d.m, A0, NULL, out0, dx0, denc0, nx, ne, d.x, d.t, d.enc, d.dout)) {
        fprintf(stderr, "rank %d: reference: %s\n", world->rank, core_last_error());
        rc = 1;
        goto out;
    }
    memcpy(g0, d.m.grads, np * 4);
    if (use_lora) memcpy(lg0, lo.grads, nl * 4);

    /* Misuse, refused locally (no collective entered): default attention under SP; a group of the wrong size. */
    if (sp > 1) {
        wan_exec plain = {.ops = NULL, .sp = u.sp};
        MCHECK(wan_forward(&d.m, A, &plain, out[0], d.x, d.t, d.enc) == -1 &&
                   strstr(core_last_error(), "needs a sequence-parallel self-attention"),
               "default attention under SP: %s", core_last_error());
        wan_exec whole = {NULL, sp_usp_forward, sp_usp_backward, &u, u.sp, 0, NULL, NULL, NULL};
        MCHECK(wan_forward(&d.m, A0, &whole, out[0], d.x, d.t, d.enc) == -1 &&
                   strstr(core_last_error(), "made for the whole sequence"),
               "SP group with whole-sequence activations: %s", core_last_error());
        wan_exec nogroup = {NULL, sp_usp_forward, sp_usp_backward, &u, NULL, 0, NULL, NULL, NULL};
        MCHECK(wan_forward(&d.m, A, &nogroup, out[0], d.x, d.t, d.enc) == -1 &&
                   strstr(core_last_error(), "wan_exec.sp is NULL"),
               "no SP group: %s", core_last_error());
    }

    /* Sequence parallel, twice. */
    wan_exec ex = {NULL, sp_usp_forward, sp_usp_backward, &u, u.sp, 0, NULL, NULL, NULL};
    for (int r = 0; r < 2; r++) {
        if (fwd_bwd(&d.m, A, &ex, out[r], dx[r], denc[r], nx, ne, d.x, d.t, d.enc, d.dout)) {
            fprintf(stderr, "rank %d: sp run %d: %s\n", world->rank, r, core_last_error());
            rc = 1; /* peers may now wait in a collective: mpirun's time-out (the caller's) ends the run */
            goto out;
        }
        memcpy(g[r], d.m.grads, np * 4);
        if (use_lora && r == 0) memcpy(lg, lo.grads, nl * 4);
    }
    MCHECK(!memcmp(out[0], out[1], nx * 4) && !memcmp(dx[0], dx[1], nx * 4) && !memcmp(denc[0], denc[1], ne * 4) &&
               !memcmp(g[0], g[1], np * 4),
           "rank %d: two SP runs differ", world->rank);
    /* Forward-only activations (INFER: ping-pong residual, one scratch set) give the same SP output. */
    wan_acts *Ai = wan_acts_new_sp(&d.c, &d.sh, WAN_ACTS_INFER, sp, me.sp_rank);
    if (!Ai || wan_forward(&d.m, Ai, &ex, out[1], d.x, d.t, d.enc)) {
        fprintf(stderr, "rank %d: INFER: %s\n", world->rank, core_last_error());
        wan_acts_free(Ai);
        rc = 1;
        goto out;
    }
    wan_acts_free(Ai);
    MCHECK(!memcmp(out[0], out[1], nx * 4), "rank %d: SP forward with INFER activations differs from STORE",
           world->rank);
    /* Partial parameter gradients summed over the SP group, as the trainer does (over the world). */
    if (sp_comm_all_reduce(u.sp, g[0], g[0], np, SP_F32) || (use_lora && sp_comm_all_reduce(u.sp, lg, lg, nl, SP_F32))) {
        fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
        rc = 1;
        goto out;
    }

    float dev[NDEV];
    const double so = max_abs(out0, nx), sx = max_abs(dx0, nx), mo = max_diff(out[0], out0, nx),
                 mx = max_diff(dx[0], dx0, nx);
    dev[0] = (float)(mo / (FLT_EPSILON * so)), dev[1] = (float)mo;
    dev[2] = (float)(mx / (FLT_EPSILON * sx)), dev[3] = (float)mx;
    dev[4] = (float)l2_rel(denc[0], denc0, ne);
    double worst = 0;
    int worst_i = 0;
    for (int i = 0; i < d.m.layout.count; i++) {
        const wan_tensor *wt = &d.m.layout.tensors[i];
        double e = l2_rel(g[0] + wt->offset, g0 + wt->offset, (size_t)wt->numel);
        if (e > worst) worst = e, worst_i = i;
    }
    double lworst = 0;
    int lworst_i = 0;
    for (int i = 0; use_lora && i < lo.layout.count; i++) {
        const wan_tensor *wt = &lo.layout.tensors[i];
        double e = l2_rel(lg + wt->offset, lg0 + wt->offset, (size_t)wt->numel);
        if (e > lworst) lworst = e, lworst_i = i;
    }
    MCHECK(!use_lora || lworst <= DIT_GRAD_L2, "rank %d: LoRA grad %s rel L2 %.3g > %g", world->rank,
           lo.layout.tensors[lworst_i].name, lworst, DIT_GRAD_L2);
    if (lworst > worst) worst = lworst, worst_i = -1 - lworst_i;
    dev[5] = (float)worst, dev[6] = (float)l2_rel(g[0], g0, np);
    dev[7] = (float)((double)wan_acts_bytes(A) / (double)wan_acts_bytes(A0));
    MCHECK(so > 0.1 && sx > 1e-4 && max_abs(denc0, ne) > 1e-6, "rank %d: reference is (near) zero: %g %g", world->rank,
           so, sx);
    if (t.ring == 1) {
        MCHECK(!memcmp(out[0], out0, nx * 4), "rank %d: out not bit-identical to sp=1 (max diff %.3g)", world->rank,
               mo);
        MCHECK(!memcmp(dx[0], dx0, nx * 4), "rank %d: dx not bit-identical to sp=1 (max diff %.3g)", world->rank, mx);
    } else {
        MCHECK(dev[0] <= DIT_RING_BOUND, "rank %d: out: %.2f eps x max|ref| > %g", world->rank, dev[0],
               DIT_RING_BOUND);
        MCHECK(dev[2] <= DIT_RING_BOUND, "rank %d: dx: %.2f eps x max|ref| > %g", world->rank, dev[2],
               DIT_RING_BOUND);
    }
    MCHECK(dev[4] <= DIT_GRAD_L2, "rank %d: denc rel L2 %.3g > %g", world->rank, dev[4], DIT_GRAD_L2);
    MCHECK(worst <= DIT_GRAD_L2, "rank %d: grad %s rel L2 %.3g > %g", world->rank,
           worst_i < 0 ? lo.layout.tensors[-1 - worst_i].name : d.m.layout.tensors[worst_i].name, worst, DIT_GRAD_L2);
    if (sp > 1)
        MCHECK(dev[7] < 1.0f, "rank %d: SP activations %zu bytes not below single-rank %zu", world->rank,
               wan_acts_bytes(A), wan_acts_bytes(A0));

    float *all = calloc((size_t)NDEV * world->size, 4);
    if (sp_comm_all_gather(world, dev, all, NDEV, SP_F32) == 0 && world->rank == 0) {
        float m[NDEV] = {0};
        for (int p = 0; p < world->size; p++)
            for (int i = 0; i < NDEV; i++) m[i] = fmaxf(m[i], all[p * NDEV + i]);
        printf("dit trainer_ranks %d dp %d sp %d ulysses %d ring %d, S %lld L %d B %d per_token %d %s%s: out %.3f eps "
               "[%.2e] dx %.3f eps [%.2e] denc l2 %.2e grads l2 worst %.2e (%s) whole %.2e; acts %zu B/rank vs %zu "
               "(%.3f) %s\n",
               t.trainer_ranks, t.dp, t.sp, t.ulysses, t.ring, (long long)d.S, L, B, per_token,
               mode == WAN_ACTS_STORE ? "store" : "recompute", use_lora ? " lora" : "", m[0], m[1], m[2], m[3], m[4],
               m[5], worst_i < 0 ? lo.layout.tensors[-1 - worst_i].name : d.m.layout.tensors[worst_i].name, m[6], wan_acts_bytes(A), wan_acts_bytes(A0), m[7],
               t.ring == 1 ? "(bit-identical required)" : "(ring bound 16)");
    }
    free(all);
out:
    wan_acts_free(A0);
    wan_acts_free(A);
    free(out0), free(dx0), free(denc0), free(g0);
    for (int r = 0; r < 2; r++) free(out[r]), free(dx[r]), free(denc[r]), free(g[r]);
    free(lg0), free(lg);
    teardown(&d);
    wan_lora_free(&lo);
    sp_usp_release(&u);
    return rc;
}

int mpi_case_dit_bench(sp_comm *world, int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "dit_bench: need SP ULYSSES [F H W L LAYERS REPS]\n");
        return 2;
    }
    const int sp = atoi(argv[0]), ul = atoi(argv[1]);
    const int F = argc > 2 ? atoi(argv[2]) : 4, Hh = argc > 3 ? atoi(argv[3]) : 64, Ww = argc > 4 ? atoi(argv[4]) : 64;
    const int L = argc > 5 ? atoi(argv[5]) : 64, layers = argc > 6 ? atoi(argv[6]) : 2;
    const int reps = argc > 7 ? atoi(argv[7]) : 3;
    sp_topology t;
    if (sp_validate(world->size, sp, ul, &(sp_attn_request){.num_heads = 4, .tokens = F * (Hh / 2) * (Ww / 2)}) ||
        sp_topology_init(&t, world->size, sp, ul)) {
        fprintf(stderr, "dit_bench: %s\n", core_last_error());
        return 2;
    }
    sp_usp u;
    if (sp_usp_init(&u, world, &t, NULL)) {
        fprintf(stderr, "dit_bench: %s\n", core_last_error());
        return 1;
    }
    dit_setup d;
    int rc = 0;
    wan_acts *A = NULL;
    float *out = NULL;
    if (setup(&d, world, layers, F, Hh, Ww, 1, L, 0, u.me.dp_rank)) {
        fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
        rc = 1;
        goto done;
    }
    A = sp > 1 ? wan_acts_new_sp(&d.c, &d.sh, WAN_ACTS_STORE, sp, u.me.sp_rank)
               : wan_acts_new(&d.c, &d.sh, WAN_ACTS_STORE);
    out = malloc(d.nx * 4);
    if (!A || !out) {
        fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
        rc = 1;
        goto done;
    }
    size_t bytes1 = wan_acts_bytes(A);
    if (sp > 1) { /* the single-rank figure */
        wan_acts *full = wan_acts_new(&d.c, &d.sh, WAN_ACTS_STORE);
        bytes1 = wan_acts_bytes(full);
        wan_acts_free(full);
    }
    wan_exec ex = {NULL, sp_usp_forward, sp_usp_backward, &u, u.sp, 0, NULL, NULL, NULL};
    const wan_exec *exp = sp > 1 ? &ex : NULL;
    double best = INFINITY;
    for (int r = 0; r <= reps; r++) {
        sp_comm_barrier(world);
        double t0 = now_s();
        if (fwd_bwd(&d.m, A, exp, out, NULL, NULL, d.nx, d.ne, d.x, d.t, d.enc, d.dout)) {
            fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
            rc = 1;
            goto done;
        }
        float dt = (float)(now_s() - t0), slowest = 0;
        float *all = calloc((size_t)world->size, 4);
        if (sp_comm_all_gather(world, &dt, all, 1, SP_F32) == 0)
            for (int p = 0; p < world->size; p++) slowest = fmaxf(slowest, all[p]);
        free(all);
        if (r > 0 && slowest < best) best = slowest; /* r == 0: warm-up */
    }
    /* Peak resident memory of the largest rank: parameters, gradients, activations, the USP
     * workspace (allocated per call) and MPI's own buffers. */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    float rss = (float)(ru.ru_maxrss / 1024.0), rss_max = rss, *rss_all = calloc((size_t)world->size, 4);
    if (sp_comm_all_gather(world, &rss, rss_all, 1, SP_F32) == 0)
        for (int p = 0; p < world->size; p++) rss_max = fmaxf(rss_max, rss_all[p]);
    free(rss_all);
    if (world->rank == 0) {
        const double S = (double)d.S, D = wan_dim(&d.c), Fd = d.c.ffn_dim, Lt = L;
        const double flop = 3.0 * d.c.num_layers *
                            (12 * S * D * D + 4 * S * S * D + 4 * S * Lt * D + 4 * Lt * D * D + 4 * S * D * Fd);
        printf("dit_bench trainer_ranks %d sp %d ulysses %d ring %d: tiny preset, %d layers, %lld video tokens, %d "
               "text tokens: activations (STORE) %.1f MiB/rank vs %.1f MiB at sp 1 (%.3f; 1/sp = %.3f); "
               "forward+backward %.3f s (best of %d, slowest rank), %.2f GFLOP/s total (docs/design.md section 9 count); "
               "peak RSS %.0f MiB (largest rank)\n",
               t.trainer_ranks, t.sp, t.ulysses, t.ring, d.c.num_layers, (long long)d.S, L,
               wan_acts_bytes(A) / 1048576.0, bytes1 / 1048576.0, (double)wan_acts_bytes(A) / bytes1, 1.0 / sp, best,
               reps, flop / best * 1e-9, rss_max);
    }
done:
    free(out);
    wan_acts_free(A);
    teardown(&d);
    sp_usp_release(&u);
    return rc;
}
