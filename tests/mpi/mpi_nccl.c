/* tests/mpi/mpi_nccl.c — the comm table on NCCL (sp/comm_nccl.c) over the fake NCCL (tests/fake_nccl/, loaded by
 * VGRPO_NCCL_LIB) on the emulated device (host memory), against the MPI group's results on the same inputs:
 *   nccl [PIECE]   every operation of the table and the ranges collectives; the exact reductions bit for bit equal to
 *                  the MPI path's rank-order sums (sp_comm_reduce_scatter_ranges, sp_comm_all_reduce_ordered) and to a
 *                  serial rank-order sum computed here (so equal at every rank count); SP_REDUCE_NCCL's sums within
 *                  the fp32 bound of a double reference; which NCCL functions each mode called (fake_nccl_calls);
 *                  a split's groups. PIECE: the exact reduction's elements per peer and round (small: many rounds). */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/emu/k_emu.h"
#include "sp/comm_nccl.h"
#include "tests/mpi/mpi_cases.h"

/* Rank r's value i of test t: the same on every rank (and at every rank count), with negative zeros and values of
 * very different magnitude so that the summation order shows in the bits. */
static float val(int t, int r, int64_t i) {
    float x;
    mpi_fill_uniform(&x, 1, (unsigned long long)t * 1000003ULL + (unsigned long long)r * 7919ULL + (unsigned long long)i,
                     -1.0f, 1.0f);
    if (i % 17 == 3) return -0.0f;
    return (i % 5 == 0) ? x * 4096.0f : x;
}
static void fill(float *x, int t, int r, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = val(t, r, i);
}
/* Serial rank-order sum over `size` ranks of element i: ((x_0 + x_1) + x_2) + ... */
static float ordered(int t, int size, int64_t i) {
    float s = val(t, 0, i);
    for (int r = 1; r < size; r++) s = s + val(t, r, i);
    return s;
}

static long calls(const char *fn) {
    static long (*f)(const char *);
    if (!f) {
        void *h = dlopen(getenv("VGRPO_NCCL_LIB"), RTLD_NOW | RTLD_NOLOAD);
        if (h) *(void **)&f = dlsym(h, "fake_nccl_calls");
    }
    return f ? f(fn) : -1;
}
static long n_reductions(void) { return calls("ncclAllReduce") + calls("ncclReduceScatter") + calls("ncclReduce"); }

static int same_bits(const float *a, const float *b, int64_t n, int64_t *where) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) return *where = i, 0;
    return 1;
}

/* The non-reducing operations: NCCL vs MPI, bit for bit. */
static void check_moves(sp_comm *w, sp_comm *g) {
    const int size = w->size, me = w->rank;
    const size_t count = 1001;
    float *a = malloc(sizeof(float) * count * size), *b = malloc(sizeof(float) * count * size),
          *c = malloc(sizeof(float) * count * size);
    fill(a, 1, me, (int64_t)count * size);
    MCHECK(!sp_comm_all_to_all(g, a, b, count, SP_F32) && !sp_comm_all_to_all(w, a, c, count, SP_F32), "all_to_all: %s",
           core_last_error());
    MCHECK(!memcmp(b, c, sizeof(float) * count * size), "all_to_all differs from MPI's");
    memset(b, 0, sizeof(float) * count * size), memset(c, 0, sizeof(float) * count * size);
    MCHECK(!sp_comm_all_gather(g, a, b, count, SP_F32) && !sp_comm_all_gather(w, a, c, count, SP_F32), "all_gather: %s",
           core_last_error());
    MCHECK(!memcmp(b, c, sizeof(float) * count * size), "all_gather differs from MPI's");
    const int next = (me + 1) % size, prev = (me - 1 + size) % size;
    MCHECK(!sp_comm_sendrecv(g, a, count, next, b, count, prev, SP_F32) &&
               !sp_comm_sendrecv(w, a, count, next, c, count, prev, SP_F32),
           "sendrecv: %s", core_last_error());
    MCHECK(!memcmp(b, c, sizeof(float) * count), "sendrecv (ring shift) differs from MPI's");
    int64_t ib[7], ic[7];
    for (int k = 0; k < 7; k++) ib[k] = ic[k] = me == size - 1 ? 1000 * k - 3 : -1;
    MCHECK(!sp_comm_broadcast(g, ib, 7, SP_I64, size - 1) && !sp_comm_broadcast(w, ic, 7, SP_I64, size - 1),
           "broadcast: %s", core_last_error());
    MCHECK(!memcmp(ib, ic, sizeof ib) && ib[6] == 5997, "broadcast (int64, root %d) differs from MPI's", size - 1);
    MCHECK(!sp_comm_barrier(g), "barrier: %s", core_last_error());
    /* the ranges' all-gather (uint8) and gather, uneven ranges with an empty one */
    int64_t offs[9];
    offs[0] = 0;
    for (int r = 0; r < size; r++) offs[r + 1] = offs[r] + (r == 1 ? 0 : 37 * (r + 1) + 5);
    const int64_t n = offs[size];
    uint8_t *ub = malloc((size_t)n), *uc = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) ub[i] = uc[i] = (uint8_t)(i >= offs[me] && i < offs[me + 1] ? 7 * i + me : 0);
    MCHECK(!sp_comm_all_gather_ranges(g, ub, offs, SP_U8) && !sp_comm_all_gather_ranges(w, uc, offs, SP_U8),
           "all_gather_ranges: %s", core_last_error());
    MCHECK(!memcmp(ub, uc, (size_t)n), "all_gather_ranges differs from MPI's");
    fill(a, 2, me, n);
    float *all_g = calloc((size_t)n, sizeof(float)), *all_w = calloc((size_t)n, sizeof(float));
    MCHECK(!sp_comm_gather_ranges(g, a + offs[me], all_g, offs, SP_F32, 0) &&
               !sp_comm_gather_ranges(w, a + offs[me], all_w, offs, SP_F32, 0),
           "gather_ranges: %s", core_last_error());
    MCHECK(!memcmp(all_g, all_w, sizeof(float) * (size_t)n), "gather_ranges differs from MPI's");
    free(ub), free(uc), free(all_g), free(all_w), free(a), free(b), free(c);
}

/* The exact reductions: bit for bit the MPI path's rank-order sums and the serial rank-order sum. */
static void check_exact(sp_comm *w, sp_comm *g) {
    const int size = w->size, me = w->rank;
    const long red0 = n_reductions();
    int64_t where = -1;
    /* all_reduce, out of place and in place, and sp_comm_all_reduce_ordered, vs MPI's ordered all-reduce */
    const int64_t n = 5003;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n),
          *want = malloc(sizeof(float) * n);
    fill(x, 3, me, n), fill(ref, 3, me, n);
    for (int64_t i = 0; i < n; i++) want[i] = ordered(3, size, i);
    MCHECK(!sp_comm_all_reduce_ordered(w, ref, n), "MPI all_reduce_ordered: %s", core_last_error());
    MCHECK(same_bits(ref, want, n, &where), "MPI's ordered sum differs from the serial one at %lld", (long long)where);
    MCHECK(!sp_comm_all_reduce(g, x, y, (size_t)n, SP_F32), "all_reduce: %s", core_last_error());
    MCHECK(same_bits(y, ref, n, &where), "exact all_reduce (out of place) differs at %lld: %a vs %a", (long long)where,
           y[where], ref[where]);
    MCHECK(!sp_comm_all_reduce(g, x, x, (size_t)n, SP_F32), "all_reduce in place: %s", core_last_error());
    MCHECK(same_bits(x, ref, n, &where), "exact all_reduce (in place) differs at %lld", (long long)where);
    fill(x, 3, me, n);
    MCHECK(!sp_comm_all_reduce_ordered(g, x, n), "all_reduce_ordered: %s", core_last_error());
    MCHECK(same_bits(x, ref, n, &where), "all_reduce_ordered on NCCL differs at %lld", (long long)where);
    /* reduce_scatter (equal blocks) vs the ranges reduce-scatter of MPI with offs r x count */
    const size_t count = 2049;
    float *s = malloc(sizeof(float) * count * size), *sw = malloc(sizeof(float) * count * size),
          *r = malloc(sizeof(float) * count);
    int64_t offs[9];
    for (int k = 0; k <= size; k++) offs[k] = (int64_t)count * k;
    fill(s, 4, me, (int64_t)count * size), fill(sw, 4, me, (int64_t)count * size);
    MCHECK(!sp_comm_reduce_scatter(g, s, r, count, SP_F32), "reduce_scatter: %s", core_last_error());
    MCHECK(!sp_comm_reduce_scatter_ranges(w, sw, offs), "MPI reduce_scatter_ranges: %s", core_last_error());
    MCHECK(same_bits(r, sw + offs[me], (int64_t)count, &where), "exact reduce_scatter differs at %lld",
           (long long)where);
    for (size_t i = 0; i < count; i++)
        if (memcmp(&r[i], &(float){ordered(4, size, offs[me] + (int64_t)i)}, 4)) {
            MCHECK(0, "exact reduce_scatter differs from the serial rank-order sum at %zu", i);
            break;
        }
    /* reduce_scatter_ranges, uneven with an empty range, in place: this rank's range reduced, the rest unchanged */
    offs[0] = 0;
    for (int k = 0; k < size; k++) offs[k + 1] = offs[k] + (k == size / 2 && size > 1 ? 0 : 1500 + 333 * k);
    const int64_t m = offs[size];
    float *u = malloc(sizeof(float) * m), *uw = malloc(sizeof(float) * m), *u0 = malloc(sizeof(float) * m);
    fill(u, 5, me, m), fill(uw, 5, me, m), fill(u0, 5, me, m);
    MCHECK(!sp_comm_reduce_scatter_ranges(g, u, offs) && !sp_comm_reduce_scatter_ranges(w, uw, offs),
           "reduce_scatter_ranges: %s", core_last_error());
    MCHECK(same_bits(u, uw, m, &where), "exact reduce_scatter_ranges differs from MPI's at %lld", (long long)where);
    for (int64_t i = offs[me]; i < offs[me + 1]; i++)
        if (memcmp(&u[i], &(float){ordered(5, size, i)}, 4)) {
            MCHECK(0, "exact reduce_scatter_ranges differs from the serial sum at %lld", (long long)i);
            break;
        }
    MCHECK(!memcmp(u, u0, sizeof(float) * offs[me]) &&
               !memcmp(u + offs[me + 1], u0 + offs[me + 1], sizeof(float) * (m - offs[me + 1])),
           "reduce_scatter_ranges changed another rank's range");
    /* the exact mode called no NCCL reduction but the barrier's (one ncclAllReduce each) */
    MCHECK(n_reductions() == red0, "exact mode called NCCL reductions %ld times", n_reductions() - red0);
    free(x), free(y), free(ref), free(want), free(s), free(sw), free(r), free(u), free(uw), free(u0);
}

/* SP_REDUCE_NCCL: NCCL's own sums, within |err| <= size eps sum |x_r| (plus the tiny absolute floor). */
static void check_native(sp_comm *w, sp_comm *g) {
    const int size = w->size, me = w->rank;
    const long red0 = n_reductions();
    const int64_t n = 3001;
    float *x = malloc(sizeof(float) * n * size), *y = malloc(sizeof(float) * n * size);
    fill(x, 6, me, n * size);
    int bad = 0;
    MCHECK(!sp_comm_all_reduce(g, x, y, (size_t)n, SP_F32), "nccl all_reduce: %s", core_last_error());
    for (int64_t i = 0; i < n && !bad; i++) {
        double sum = 0, mag = 0;
        for (int r = 0; r < size; r++) sum += val(6, r, i), mag += fabs(val(6, r, i));
        if (fabs(y[i] - sum) > size * 1.2e-7 * mag + 1e-30) {
            bad = 1;
            MCHECK(0, "nccl all_reduce at %lld", (long long)i);
        }
    }
    MCHECK(!sp_comm_reduce_scatter(g, x, y, (size_t)n, SP_F32), "nccl reduce_scatter: %s", core_last_error());
    for (int64_t i = 0; i < n && !bad; i++) {
        double sum = 0, mag = 0;
        for (int r = 0; r < size; r++) sum += val(6, r, me * n + i), mag += fabs(val(6, r, me * n + i));
        if (fabs(y[i] - sum) > size * 1.2e-7 * mag + 1e-30) {
            bad = 1;
            MCHECK(0, "nccl reduce_scatter at %lld", (long long)i);
        }
    }
    int64_t offs[9];
    for (int k = 0; k <= size; k++) offs[k] = n * size * k / size - (k > 0 && k < size ? 11 : 0);
    fill(x, 6, me, n * size);
    MCHECK(!sp_comm_reduce_scatter_ranges(g, x, offs), "nccl reduce_scatter_ranges: %s", core_last_error());
    for (int64_t i = offs[me]; i < offs[me + 1] && !bad; i++) {
        double sum = 0, mag = 0;
        for (int r = 0; r < size; r++) sum += val(6, r, i), mag += fabs(val(6, r, i));
        if (fabs(x[i] - sum) > size * 1.2e-7 * mag + 1e-30) {
            bad = 1;
            MCHECK(0, "nccl reduce_scatter_ranges at %lld", (long long)i);
        }
    }
    MCHECK(calls("ncclAllReduce") >= 0 && n_reductions() > red0, "nccl mode called no NCCL reduction");
    free(x), free(y);
}

/* A split (colour rank % 2, reversed key) has MPI's split's ranks, and its all-gather MPI's bits. */
static void check_split(sp_comm *w, sp_comm *g) {
    sp_comm *gs = NULL, *ws = NULL;
    MCHECK(!sp_comm_split(g, w->rank % 2, -w->rank, "half", &gs) && !sp_comm_split(w, w->rank % 2, -w->rank, "half", &ws),
           "split: %s", core_last_error());
    if (!gs || !ws) return;
    MCHECK(gs->rank == ws->rank && gs->size == ws->size, "split: rank %d of %d, MPI's %d of %d", gs->rank, gs->size,
           ws->rank, ws->size);
    MCHECK(sp_comm_is_nccl(gs) && !strcmp(gs->name, "half"), "split: not an NCCL group named half (%s)", gs->name);
    float mine = (float)w->rank + 0.5f, a[8] = {0}, b[8] = {0};
    MCHECK(!sp_comm_all_gather(gs, &mine, a, 1, SP_F32) && !sp_comm_all_gather(ws, &mine, b, 1, SP_F32),
           "split all_gather: %s", core_last_error());
    MCHECK(!memcmp(a, b, sizeof a), "split all_gather differs from MPI's");
    sp_comm_destroy(gs), sp_comm_destroy(ws);
}

int mpi_case_nccl(sp_comm *world, int argc, char **argv) {
    const int64_t piece = argc > 0 ? atoll(argv[0]) : 700;
    if (world->size > 8) {
        fprintf(stderr, "nccl: at most 8 ranks\n");
        return 1;
    }
    sp_nccl_opts o = {.stream = NULL, .dev = &k_emu_ops, .reduce = SP_REDUCE_EXACT, .piece = piece};
    sp_comm *g = NULL, *gn = NULL;
    if (sp_comm_nccl_world(world, &o, &g)) {
        fprintf(stderr, "nccl world: %s\n", core_last_error());
        return 1;
    }
    MCHECK(g->rank == world->rank && g->size == world->size && sp_comm_is_nccl(g) && !sp_comm_is_nccl(world),
           "NCCL world: rank %d of %d", g->rank, g->size);
    if (world->rank == 0) printf("nccl: %d ranks, %s (version %d), piece %lld\n", world->size, sp_nccl_lib_path(),
                                 sp_nccl_version(), (long long)piece);
    check_moves(world, g);
    check_exact(world, g);
    o.reduce = SP_REDUCE_NCCL;
    if (sp_comm_nccl_world(world, &o, &gn)) {
        fprintf(stderr, "nccl world (nccl reduce): %s\n", core_last_error());
        sp_comm_destroy(g);
        return 1;
    }
    check_native(world, gn);
    check_split(world, g);
    sp_comm_destroy(gn);
    sp_comm_destroy(g);
    return 0;
}
