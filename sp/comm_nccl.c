/* sp/comm_nccl.c — the comm table on NCCL for device buffers (see sp/comm_nccl.h): loading the library, the group's
 * creation from an MPI (host) group, the table's operations, and the exact (rank-order) reductions built from grouped
 * send/recv and the device table's block_sum. */
#include "sp/comm_nccl.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "sp/nccl_abi.h"

#if defined(VGRPO_CUDA) && defined(__has_include)
#if __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)
/* The ABI declared in sp/nccl_abi.h against the real header, where the CUDA build has it. */
#include <nccl.h>
_Static_assert(sizeof(ncclUniqueId) == sizeof(sp_nccl_unique_id), "ncclUniqueId's size");
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(ncclSuccess, SP_NCCL_SUCCESS) && SAME(ncclInvalidArgument, SP_NCCL_INVALID_ARGUMENT) &&
                   SAME(ncclInvalidUsage, SP_NCCL_INVALID_USAGE) && SAME(ncclInProgress, SP_NCCL_IN_PROGRESS),
               "ncclResult_t");
_Static_assert(SAME(ncclUint8, SP_NCCL_UINT8) && SAME(ncclInt64, SP_NCCL_INT64) && SAME(ncclFloat32, SP_NCCL_FLOAT32),
               "ncclDataType_t");
_Static_assert(SAME(ncclSum, SP_NCCL_SUM), "ncclRedOp_t");
#undef SAME
#endif
#endif

/* ---- the library ---- */

static sp_nccl_api api;
static void *lib;
static char lib_path[512];
static int lib_version;

int sp_nccl_load(void) {
    if (lib) return 0;
    const char *env = getenv("VGRPO_NCCL_LIB");
    const char *name = env && *env ? env : "libnccl.so.2";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        return core_error("NCCL: cannot load %s (%s); set LD_LIBRARY_PATH or VGRPO_NCCL_LIB to the library (PyTorch's "
                          "nvidia-nccl wheel has one)",
                          name, e ? e : "unknown reason");
    }
    static const char *const names[] = {
        "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommSplit", "ncclCommDestroy",
        "ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank", "ncclGetErrorString", "ncclGetLastError",
        "ncclSend", "ncclRecv", "ncclAllGather", "ncclBroadcast", "ncclReduceScatter", "ncclAllReduce", "ncclReduce",
        "ncclGroupStart", "ncclGroupEnd"};
    enum { N = sizeof names / sizeof names[0] };
    _Static_assert(sizeof(sp_nccl_api) == N * sizeof(void *), "one name per member of sp_nccl_api, in order");
    void *slots[N];
    for (int i = 0; i < N; i++)
        if (!(slots[i] = dlsym(h, names[i]))) {
            dlclose(h);
            return core_error("NCCL %s: symbol %s not found (NCCL 2.18 or later is needed)", name, names[i]);
        }
    sp_nccl_api a;
    memcpy(&a, slots, sizeof a); /* function pointers from dlsym's void * (POSIX: same representation) */
    int v = 0;
    if (a.GetVersion(&v) != SP_NCCL_SUCCESS || v < SP_NCCL_MIN_VERSION) {
        dlclose(h);
        return core_error("NCCL %s: version %d; 2.18 (%d) or later is needed (ncclCommSplit)", name, v,
                          SP_NCCL_MIN_VERSION);
    }
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
        snprintf(lib_path, sizeof lib_path, "%s", lm->l_name);
    else
        snprintf(lib_path, sizeof lib_path, "%s", name);
    api = a, lib = h, lib_version = v;
    return 0;
}

const char *sp_nccl_lib_path(void) { return lib_path; }
int sp_nccl_version(void) { return lib_version; }

/* ---- the group's state ---- */

typedef struct {
    sp_nccl_comm comm;
    sp_nccl_opts o;   /* piece filled in */
    float *scratch;   /* device: the exact reduction's receive blocks, scratch_n floats */
    size_t scratch_n;
    float *one;       /* device: one float, the barrier's */
    int own_stream;   /* o.stream is a second stream (sp_comm_dup_stream): block_sum launches there too */
} nccl_impl;

static nccl_impl *impl_of(sp_comm *c) { return c->impl; }

static int ndt(sp_dtype d) {
    switch (d) {
    case SP_F32: return SP_NCCL_FLOAT32;
    case SP_I64: return SP_NCCL_INT64;
    case SP_U8: return SP_NCCL_UINT8;
    }
    return -1;
}

/* -1 with "<op> on group <name> (rank r of n): NCCL error <code>: <string> (<last error>)" unless rc is success. */
static int nc(sp_comm *c, const char *op, int rc) {
    if (rc == SP_NCCL_SUCCESS) return 0;
    const char *s = api.GetErrorString ? api.GetErrorString(rc) : NULL;
    const char *last = api.GetLastError && c && c->impl ? api.GetLastError(impl_of(c)->comm) : NULL;
    return core_error("%s on group %s (rank %d of %d): NCCL error %d: %s%s%s%s", op, c ? c->name : "?",
                      c ? c->rank : -1, c ? c->size : 0, rc, s ? s : "?", last && *last ? " (" : "",
                      last && *last ? last : "", last && *last ? ")" : "");
}

/* Grouped send/recv: open, queue (the first failure kept), close (always, so NCCL's group depth stays balanced). */
typedef struct {
    sp_comm *c;
    const char *op;
    int rc;
} grp;

static void g_open(grp *g, sp_comm *c, const char *op) {
    g->c = c, g->op = op;
    g->rc = api.GroupStart();
}
static void g_send(grp *g, const void *buf, size_t count, int dt, int peer) {
    if (g->rc == SP_NCCL_SUCCESS && count)
        g->rc = api.Send(buf, count, dt, peer, impl_of(g->c)->comm, impl_of(g->c)->o.stream);
}
static void g_recv(grp *g, void *buf, size_t count, int dt, int peer) {
    if (g->rc == SP_NCCL_SUCCESS && count)
        g->rc = api.Recv(buf, count, dt, peer, impl_of(g->c)->comm, impl_of(g->c)->o.stream);
}
static int g_close(grp *g) {
    const int end = api.GroupEnd();
    return nc(g->c, g->op, g->rc != SP_NCCL_SUCCESS ? g->rc : end);
}

/* ---- the table ---- */

static int n_all_to_all(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    const size_t es = sp_dtype_size(dt);
    grp g;
    g_open(&g, c, "all_to_all");
    for (int j = 0; j < c->size; j++) {
        g_send(&g, (const char *)send + (size_t)j * count * es, count, ndt(dt), j);
        g_recv(&g, (char *)recv + (size_t)j * count * es, count, ndt(dt), j);
    }
    return g_close(&g);
}

static int n_sendrecv(sp_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                      int source, sp_dtype dt) {
    if (dest == c->rank && source == c->rank && send_count != recv_count)
        return core_error("sendrecv on group %s: sending %zu elements to itself but receiving %zu", c->name,
                          send_count, recv_count);
    grp g;
    g_open(&g, c, "sendrecv");
    g_send(&g, send, send_count, ndt(dt), dest);
    g_recv(&g, recv, recv_count, ndt(dt), source);
    return g_close(&g);
}

static int n_all_gather(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    nccl_impl *m = impl_of(c);
    return nc(c, "all_gather", api.AllGather(send, recv, count, ndt(dt), m->comm, m->o.stream));
}

static int n_broadcast(sp_comm *c, void *buf, size_t count, sp_dtype dt, int root) {
    nccl_impl *m = impl_of(c);
    return nc(c, "broadcast", api.Broadcast(buf, buf, count, ndt(dt), root, m->comm, m->o.stream));
}

static int n_barrier(sp_comm *c) {
    nccl_impl *m = impl_of(c);
    if (!m->one && (!(m->one = m->o.dev->mem_alloc(sizeof(float))) || m->o.dev->mem_zero(m->one, sizeof(float))))
        return core_error_push("barrier on group %s: ", c->name);
    if (nc(c, "barrier", api.AllReduce(m->one, m->one, 1, SP_NCCL_FLOAT32, SP_NCCL_SUM, m->comm, m->o.stream)))
        return -1;
    if (m->o.dev->mem_sync()) return core_error_push("barrier on group %s: ", c->name);
    int async = SP_NCCL_SUCCESS; /* a failure of an earlier enqueued operation shows here */
    const int rc = api.CommGetAsyncError(m->comm, &async);
    return nc(c, "barrier (an earlier operation's error)", rc != SP_NCCL_SUCCESS ? rc : async);
}

/* Device scratch of at least n floats (grown, never shrunk; cudaFree waits for the device). */
static float *scratch(sp_comm *c, size_t n) {
    nccl_impl *m = impl_of(c);
    if (m->scratch_n >= n) return m->scratch;
    if (m->scratch) m->o.dev->mem_free(m->scratch);
    m->scratch_n = 0;
    if (!(m->scratch = m->o.dev->mem_alloc(n * sizeof(float)))) {
        core_error_push("exact reduction on group %s: scratch of %zu floats: ", c->name, n);
        return NULL;
    }
    m->scratch_n = n;
    return m->scratch;
}

static int64_t len_of(const int64_t *offs, int r) { return offs[r + 1] - offs[r]; }

/* The device's block_sum on the group's stream (the table's own unless the group has its own, dup_stream). */
static int block_sum(nccl_impl *m, float *out, const float *blocks, int nb, int64_t stride, int64_t n) {
    if (!m->own_stream || !m->o.dev->stream_use) return m->o.dev->block_sum(out, blocks, nb, stride, n);
    void *prev = m->o.dev->stream_use(m->o.stream);
    const int rc = m->o.dev->block_sum(out, blocks, nb, stride, n);
    m->o.dev->stream_use(prev);
    return rc;
}

/* The exact reduce-scatter: out [offs[rank + 1] - offs[rank]] = the rank-order sum of every rank's src[offs[rank] ..
 * offs[rank + 1]); src [offs[size]] is this rank's values. Round t moves piece t (elements t P .. (t + 1) P of each
 * range) of every rank's range to its owner: block i of the scratch holds rank i's values of my piece (my own by a
 * send to myself), then block_sum adds blocks 0 .. size-1 in order. out may lie inside src at this rank's range:
 * round t overwrites only piece t of it, which later rounds do not send. */
static int rs_exact(sp_comm *c, const char *op, const float *src, const int64_t *offs, float *out) {
    nccl_impl *m = impl_of(c);
    const int size = c->size, me = c->rank;
    int64_t longest = 0;
    for (int r = 0; r < size; r++) longest = len_of(offs, r) > longest ? len_of(offs, r) : longest;
    if (!longest) return 0;
    const int64_t P = longest < m->o.piece ? longest : m->o.piece, R = (longest + P - 1) / P;
    const int64_t mylen = len_of(offs, me);
    float *tmp = scratch(c, (size_t)P * (size_t)size);
    if (!tmp) return -1;
    for (int64_t t = 0; t < R; t++) {
        const int64_t m0 = t * P, mn = mylen - m0 <= 0 ? 0 : mylen - m0 < P ? mylen - m0 : P;
        grp g;
        g_open(&g, c, op);
        for (int j = 0; j < size; j++) {
            const int64_t d0 = t * P, left = len_of(offs, j) - d0, dn = left <= 0 ? 0 : left < P ? left : P;
            g_send(&g, src + offs[j] + d0, (size_t)dn, SP_NCCL_FLOAT32, j);
            g_recv(&g, tmp + (size_t)j * (size_t)P, (size_t)mn, SP_NCCL_FLOAT32, j);
        }
        if (g_close(&g)) return -1;
        if (mn && block_sum(m, out + m0, tmp, size, P, mn)) return core_error_push("%s on group %s: ", op, c->name);
    }
    return 0;
}

/* The exact all-gather of ranges, any dtype: rank r's range of buf to every rank (grouped send/recv, no pieces:
 * NCCL's counts are size_t). */
static int ag_exact(sp_comm *c, const char *op, void *buf, const int64_t *offs, sp_dtype dt) {
    const size_t es = sp_dtype_size(dt);
    char *b = buf;
    grp g;
    g_open(&g, c, op);
    for (int j = 0; j < c->size; j++) {
        if (j == c->rank) continue;
        g_send(&g, b + (size_t)offs[c->rank] * es, (size_t)len_of(offs, c->rank), ndt(dt), j);
        g_recv(&g, b + (size_t)offs[j] * es, (size_t)len_of(offs, j), ndt(dt), j);
    }
    return g_close(&g);
}

static int n_reduce_scatter_ranges(sp_comm *c, float *buf, const int64_t *offs) {
    nccl_impl *m = impl_of(c);
    if (m->o.reduce == SP_REDUCE_EXACT)
        return rs_exact(c, "reduce_scatter_ranges", buf, offs, buf + offs[c->rank]);
    for (int r = 0; r < c->size; r++) /* NCCL's own order: one reduce per range, to its owner, in place */
        if (len_of(offs, r) &&
            nc(c, "reduce_scatter_ranges",
               api.Reduce(buf + offs[r], buf + offs[r], (size_t)len_of(offs, r), SP_NCCL_FLOAT32, SP_NCCL_SUM, r,
                          m->comm, m->o.stream)))
            return -1;
    return 0;
}

static int n_all_gather_ranges(sp_comm *c, void *buf, const int64_t *offs, sp_dtype dt) {
    return ag_exact(c, "all_gather_ranges", buf, offs, dt);
}

static int n_gather_ranges(sp_comm *c, const void *mine, void *all, const int64_t *offs, sp_dtype dt, int root) {
    const size_t es = sp_dtype_size(dt);
    grp g;
    g_open(&g, c, "gather_ranges");
    if (c->rank == root)
        for (int r = 0; r < c->size; r++)
            g_recv(&g, (char *)all + (size_t)offs[r] * es, (size_t)len_of(offs, r), ndt(dt), r);
    g_send(&g, mine, (size_t)len_of(offs, c->rank), ndt(dt), root);
    return g_close(&g);
}

static int n_reduce_scatter(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    nccl_impl *m = impl_of(c);
    if (m->o.reduce == SP_REDUCE_NCCL)
        return nc(c, "reduce_scatter",
                  api.ReduceScatter(send, recv, count, SP_NCCL_FLOAT32, SP_NCCL_SUM, m->comm, m->o.stream));
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(c->size + 1));
    if (!offs) return core_error("reduce_scatter on group %s: out of memory", c->name);
    for (int r = 0; r <= c->size; r++) offs[r] = (int64_t)count * r;
    const int rc = rs_exact(c, "reduce_scatter", send, offs, recv);
    free(offs);
    return rc;
}

static int n_all_reduce(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    nccl_impl *m = impl_of(c);
    if (m->o.reduce == SP_REDUCE_NCCL)
        return nc(c, "all_reduce", api.AllReduce(send, recv, count, SP_NCCL_FLOAT32, SP_NCCL_SUM, m->comm, m->o.stream));
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(c->size + 1));
    if (!offs) return core_error("all_reduce on group %s: out of memory", c->name);
    for (int r = 0; r <= c->size; r++) offs[r] = (int64_t)count * r / c->size; /* sp_comm_all_reduce_ordered's split */
    const int rc = rs_exact(c, "all_reduce", send, offs, (float *)recv + offs[c->rank]) ||
                   ag_exact(c, "all_reduce", recv, offs, SP_F32);
    free(offs);
    return rc ? -1 : 0;
}

static int wrap(sp_nccl_comm comm, const sp_nccl_opts *o, const char *name, sp_comm **out);

/* A split of every rank (colour 0, key rank: the same ranks in the same order) on stream s. */
static int n_dup_stream(sp_comm *c, void *s, const char *name, sp_comm **out) {
    nccl_impl *m = impl_of(c);
    sp_nccl_comm nw = NULL;
    if (nc(c, "dup_stream", api.CommSplit(m->comm, 0, c->rank, &nw, NULL))) return -1;
    sp_nccl_opts o = m->o;
    if (s) o.stream = s;
    if (wrap(nw, &o, name, out)) return -1;
    impl_of(*out)->own_stream = s != NULL;
    return 0;
}

static int n_split(sp_comm *c, int colour, int key, const char *name, sp_comm **out) {
    nccl_impl *m = impl_of(c);
    sp_nccl_comm nw = NULL;
    if (nc(c, "split", api.CommSplit(m->comm, colour, key, &nw, NULL)) || wrap(nw, &m->o, name, out)) return -1;
    impl_of(*out)->own_stream = m->own_stream;
    return 0;
}

static void n_destroy(sp_comm *c) {
    nccl_impl *m = impl_of(c);
    if (m) {
        if (m->scratch) m->o.dev->mem_free(m->scratch);
        if (m->one) m->o.dev->mem_free(m->one);
        if (m->comm) api.CommDestroy(m->comm);
        free(m);
    }
    free(c);
}

static const sp_comm_ops nccl_ops = {
    .all_to_all = n_all_to_all,
    .sendrecv = n_sendrecv,
    .all_gather = n_all_gather,
    .reduce_scatter = n_reduce_scatter,
    .all_reduce = n_all_reduce,
    .barrier = n_barrier,
    .broadcast = n_broadcast,
    .split = n_split,
    .destroy = n_destroy,
    .reduce_scatter_ranges = n_reduce_scatter_ranges,
    .all_gather_ranges = n_all_gather_ranges,
    .gather_ranges = n_gather_ranges,
    .dup_stream = n_dup_stream,
};

int sp_comm_is_nccl(const sp_comm *c) { return c && c->ops == &nccl_ops; }

/* Takes ownership of comm (destroyed on failure too). */
static int wrap_sized(sp_nccl_comm comm, const sp_nccl_opts *o, const char *name, int rank, int size, sp_comm **out) {
    *out = NULL;
    sp_comm *c = calloc(1, sizeof *c);
    nccl_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c), free(m);
        api.CommDestroy(comm);
        return core_error("NCCL group %s: out of memory", name);
    }
    m->comm = comm, m->o = *o;
    if (m->o.piece <= 0) m->o.piece = SP_NCCL_PIECE;
    c->ops = &nccl_ops, c->impl = m, c->rank = rank, c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name);
    *out = c;
    return 0;
}

/* A split's group: its rank and size from NCCL (ncclCommUserRank, ncclCommCount). */
static int wrap(sp_nccl_comm comm, const sp_nccl_opts *o, const char *name, sp_comm **out) {
    int rank = -1, size = 0;
    const int rc = api.CommUserRank(comm, &rank), rc2 = rc ? rc : api.CommCount(comm, &size);
    if (rc || rc2) {
        sp_comm tmp = {.rank = -1};
        snprintf(tmp.name, sizeof tmp.name, "%s", name);
        api.CommDestroy(comm);
        return nc(&tmp, "split (rank and size of the new group)", rc ? rc : rc2);
    }
    return wrap_sized(comm, o, name, rank, size, out);
}

int sp_comm_nccl_world(sp_comm *host, const sp_nccl_opts *opts, sp_comm **out) {
    *out = NULL;
    if (!host || !opts || !opts->dev) return core_error("NCCL world: no host group or no device table");
    if (!opts->dev->block_sum || !opts->dev->mem_alloc || !opts->dev->mem_sync)
        return core_error("NCCL world: device table %s lacks block_sum or memory entries", opts->dev->name);
    /* every rank loads, then all agree: one rank without NCCL must not leave the others blocked in the id broadcast */
    float bad = sp_nccl_load() ? 1.0f : 0.0f;
    char why[256] = "";
    if (bad) snprintf(why, sizeof why, "%s", core_last_error());
    if (sp_comm_all_reduce(host, &bad, &bad, 1, SP_F32)) return core_error_push("NCCL world: ");
    if (bad > 0)
        return why[0] ? core_error("NCCL world on group %s: %s", host->name, why)
                      : core_error("NCCL world on group %s: %g rank(s) could not load NCCL", host->name, (double)bad);
    unsigned char msg[1 + SP_NCCL_UNIQUE_ID_BYTES] = {0}; /* byte 0: rank 0 made the id */
    if (host->rank == 0) {
        sp_nccl_unique_id id;
        const int rc = api.GetUniqueId(&id);
        if (rc == SP_NCCL_SUCCESS) msg[0] = 1, memcpy(msg + 1, id.internal, SP_NCCL_UNIQUE_ID_BYTES);
        else nc(NULL, "ncclGetUniqueId", rc);
    }
    if (sp_comm_broadcast(host, msg, sizeof msg, SP_U8, 0)) return core_error_push("NCCL world: the unique id: ");
    if (!msg[0]) return core_error("NCCL world on group %s: rank 0 could not make the unique id", host->name);
    sp_nccl_unique_id id;
    memcpy(id.internal, msg + 1, SP_NCCL_UNIQUE_ID_BYTES);
    sp_nccl_comm comm = NULL;
    sp_comm tmp = {.name = "", .rank = host->rank, .size = host->size};
    snprintf(tmp.name, sizeof tmp.name, "nccl-%s", host->name);
    if (nc(&tmp, "ncclCommInitRank", api.CommInitRank(&comm, host->size, id, host->rank))) return -1;
    return wrap_sized(comm, opts, tmp.name, host->rank, host->size, out);
}
