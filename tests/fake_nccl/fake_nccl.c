/* tests/fake_nccl/fake_nccl.c — a stand-in for libnccl.so.2 in the tests: the nccl* functions sp/comm_nccl.c calls
 * (their ABI as sp/nccl_abi.h declares it), implemented over MPI on host memory (the emulated device's memory is host
 * memory), each call CHECKED against NCCL's contract. Built by the Makefile as $(BUILD)/libfake_nccl.so and loaded
 * through VGRPO_NCCL_LIB (tests/test_nccl.c, tests/mpi/mpi_nccl.c, make gpu-check-emu).
 *
 * What is checked (a violation: a message on stderr "fake_nccl: <function>: <why>", kept for ncclGetLastError, and
 * ncclInvalidArgument or ncclInvalidUsage returned):
 *   - the communicator is one this library made and has not destroyed; ranks and roots are in range;
 *   - the datatype is one of uint8, int64, float32 (the comm table's) and the operation ncclSum;
 *   - a buffer of count > 0 is not NULL; in-place calls follow NCCL's rules (all-gather: sendbuff == recvbuff + rank
 *     x count; reduce-scatter: recvbuff == sendbuff + rank x recvcount; all-reduce, broadcast, reduce: sendbuff ==
 *     recvbuff), otherwise send and receive buffers must not overlap; sums are float32;
 *   - every call on a communicator uses the same stream (the one the first call used);
 *   - a call on a second stream of the emulated device (kernels/cuda/emu/emu_stream.h: the gradient buckets'
 *     stream) finds that stream ordered after every GEMM the device's own stream ran (an event recorded there, then
 *     waited for), and is counted on it (the optimizer's entries then refuse to run until the device's own stream
 *     waited for an event recorded after it);
 *   - ncclGroupStart / ncclGroupEnd are balanced (an End without a Start, or a collective inside a group: usage
 *     error), ncclSend / ncclRecv are called inside a group (stricter than NCCL, which also accepts them alone: the
 *     comm table always groups them) and every send/recv of one group is on the same communicator;
 *   - a receive gets exactly as many elements as the matching send sent (NCCL requires equal counts).
 * A group's sends and receives run at ncclGroupEnd as MPI_Isend / MPI_Irecv (tag 0 on the group's communicator, so
 * several messages to one peer match in order, as in NCCL) and one MPI_Waitall. Collectives are the MPI ones. A group
 * of one rank in a process without MPI (the GPU check over the emulated device) copies locally.
 *
 * ncclCommInitRank: the unique id carries the MPI_COMM_WORLD rank of the process that made it, which must join the
 * group (sp/comm_nccl.c's rank 0 does); the others send it their (rank, world rank) and it answers with the table,
 * then MPI_Comm_create_group makes the group's communicator, collective over its members only. ncclCommSplit is
 * MPI_Comm_split of the parent's. fake_nccl_calls(name) counts the calls of each function (tests: which path ran). */
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/emu/emu_stream.h"
#include "sp/nccl_abi.h"

#define FAKE_MAGIC 0x46414b454e43434cULL /* "FAKENCCL" */
#define FAKE_TAG_BASE 30000

struct sp_nccl_comm_s {
    unsigned long long magic;
    MPI_Comm mpi; /* MPI_COMM_NULL: one rank without MPI */
    int rank, size;
    void *stream;
    int stream_set;
};

typedef struct {
    unsigned long long magic;
    int root_world; /* the MPI_COMM_WORLD rank that made the id (-1: no MPI) */
    int serial;
} fake_id;

static char last[512];
static int group_depth;
typedef struct {
    int is_send;
    const void *sbuf;
    void *rbuf;
    size_t count;
    int dt, peer;
} fake_p2p;
static fake_p2p *queue;
static int n_queue, cap_queue;
static sp_nccl_comm group_comm;
static int group_error;

/* ---- call counts ---- */
static const char *const FN[] = {"ncclSend", "ncclRecv", "ncclAllGather", "ncclBroadcast", "ncclReduceScatter",
                                 "ncclAllReduce", "ncclReduce", "ncclGroupStart", "ncclGroupEnd",
                                 "ncclCommInitRank", "ncclCommSplit", "ncclCommDestroy", "ncclGetUniqueId"};
enum { N_FN = sizeof FN / sizeof FN[0] };
static long counts[N_FN];
static void tally(const char *fn) {
    for (int i = 0; i < N_FN; i++)
        if (!strcmp(FN[i], fn)) counts[i]++;
}
long fake_nccl_calls(const char *fn) {
    for (int i = 0; i < N_FN; i++)
        if (!strcmp(FN[i], fn)) return counts[i];
    return -1;
}

static int fail(int rc, const char *fn, const char *fmt, ...) {
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(last, sizeof last, "fake_nccl: %s: %s", fn, why);
    fprintf(stderr, "%s\n", last);
    return rc;
}
#define BAD_ARG(fn, ...) fail(SP_NCCL_INVALID_ARGUMENT, fn, __VA_ARGS__)
#define BAD_USE(fn, ...) fail(SP_NCCL_INVALID_USAGE, fn, __VA_ARGS__)

static int mpi_up(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

static size_t dt_size(int dt) { return dt == SP_NCCL_UINT8 ? 1 : dt == SP_NCCL_INT64 ? 8 : dt == SP_NCCL_FLOAT32 ? 4 : 0; }
static MPI_Datatype dt_mpi(int dt) {
    return dt == SP_NCCL_UINT8 ? MPI_UINT8_T : dt == SP_NCCL_INT64 ? MPI_INT64_T : MPI_FLOAT;
}

/* The checks every call on a communicator shares: comm, datatype, (op), count, stream. */
static int check_comm(const char *fn, sp_nccl_comm comm) {
    if (!comm || comm->magic != FAKE_MAGIC) return BAD_ARG(fn, "not a communicator of this library (%p)", (void *)comm);
    return SP_NCCL_SUCCESS;
}
static int check_call(const char *fn, sp_nccl_comm comm, int dt, int op, size_t count, void *stream) {
    int rc = check_comm(fn, comm);
    if (rc) return rc;
    if (!dt_size(dt)) return BAD_ARG(fn, "datatype %d (the comm table uses uint8 1, int64 4, float32 7)", dt);
    if (op != SP_NCCL_SUM) return BAD_ARG(fn, "reduction op %d (the comm table uses ncclSum 0)", op);
    if (count > (size_t)INT_MAX) return BAD_ARG(fn, "count %zu above this fake's MPI limit", count);
    if (!comm->stream_set) comm->stream = stream, comm->stream_set = 1;
    else if (comm->stream != stream)
        return BAD_USE(fn, "stream %p, but this communicator's calls so far used %p (one stream)", stream,
                       comm->stream);
    emu_stream *es = stream;
    if (es && es->magic == EMU_STREAM_MAGIC) { /* a second stream of the emulated device (emu_stream.h) */
        if (es->waited != *es->compute)
            return BAD_USE(fn, "on a second stream that has not waited for the device's own stream's latest work "
                               "(%llu of %llu GEMMs): the gradients it reduces may not be final",
                           (unsigned long long)es->waited, (unsigned long long)*es->compute);
        es->launched++;
    }
    return SP_NCCL_SUCCESS;
}
static int overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
}
static int mpi_rc(const char *fn, int rc) {
    if (rc == MPI_SUCCESS) return SP_NCCL_SUCCESS;
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return fail(SP_NCCL_SYSTEM_ERROR, fn, "MPI: %s", s);
}

/* ---- library and communicators ---- */

int ncclGetVersion(int *version) {
    if (!version) return BAD_ARG("ncclGetVersion", "NULL");
    *version = 22800; /* reports 2.28: the API sp/comm_nccl.c needs (>= 2.18) */
    return SP_NCCL_SUCCESS;
}

const char *ncclGetErrorString(int result) {
    switch (result) {
    case SP_NCCL_SUCCESS: return "no error";
    case SP_NCCL_SYSTEM_ERROR: return "unhandled system error (fake: MPI)";
    case SP_NCCL_INVALID_ARGUMENT: return "invalid argument";
    case SP_NCCL_INVALID_USAGE: return "invalid usage";
    }
    return "unknown result code";
}

const char *ncclGetLastError(sp_nccl_comm comm) { return last; }

int ncclGetUniqueId(sp_nccl_unique_id *id) {
    static int serial;
    tally("ncclGetUniqueId");
    if (!id) return BAD_ARG("ncclGetUniqueId", "NULL");
    fake_id f = {FAKE_MAGIC, -1, serial++};
    if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &f.root_world);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &f, sizeof f);
    return SP_NCCL_SUCCESS;
}

static sp_nccl_comm new_comm(MPI_Comm mpi, int rank, int size) {
    sp_nccl_comm c = calloc(1, sizeof *c);
    if (c) c->magic = FAKE_MAGIC, c->mpi = mpi, c->rank = rank, c->size = size;
    return c;
}

int ncclCommInitRank(sp_nccl_comm *comm, int nranks, sp_nccl_unique_id id, int rank) {
    const char *fn = "ncclCommInitRank";
    tally(fn);
    fake_id f;
    memcpy(&f, id.internal, sizeof f);
    if (!comm) return BAD_ARG(fn, "comm is NULL");
    *comm = NULL;
    if (f.magic != FAKE_MAGIC) return BAD_ARG(fn, "the unique id was not made by ncclGetUniqueId");
    if (nranks < 1 || rank < 0 || rank >= nranks) return BAD_ARG(fn, "rank %d of %d", rank, nranks);
    if (!mpi_up()) {
        if (nranks != 1) return BAD_USE(fn, "%d ranks without MPI (only one rank runs without it)", nranks);
        return (*comm = new_comm(MPI_COMM_NULL, 0, 1)) ? SP_NCCL_SUCCESS : BAD_ARG(fn, "out of memory");
    }
    int me = 0, wsize = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (f.root_world < 0 || f.root_world >= wsize) return BAD_ARG(fn, "the id's maker %d is not in MPI_COMM_WORLD", f.root_world);
    const int tag = FAKE_TAG_BASE + f.serial % 2000;
    int *world_of = malloc(sizeof(int) * (size_t)nranks);
    if (!world_of) return BAD_ARG(fn, "out of memory");
    int rc = SP_NCCL_SUCCESS;
    if (me == f.root_world) { /* the id's maker gathers (rank, world rank) from every other member */
        for (int r = 0; r < nranks; r++) world_of[r] = -1;
        world_of[rank] = me;
        for (int k = 1; k < nranks && !rc; k++) {
            int pair[2];
            rc = mpi_rc(fn, MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            if (!rc && (pair[0] < 0 || pair[0] >= nranks || world_of[pair[0]] >= 0))
                rc = BAD_USE(fn, "rank %d claimed twice or out of range (%d ranks)", pair[0], nranks);
            if (!rc) world_of[pair[0]] = pair[1];
        }
        for (int r = 0; r < nranks && !rc; r++)
            if (r != rank) rc = mpi_rc(fn, MPI_Send(world_of, nranks, MPI_INT, world_of[r], tag, MPI_COMM_WORLD));
    } else {
        int pair[2] = {rank, me};
        rc = mpi_rc(fn, MPI_Send(pair, 2, MPI_INT, f.root_world, tag, MPI_COMM_WORLD));
        if (!rc) rc = mpi_rc(fn, MPI_Recv(world_of, nranks, MPI_INT, f.root_world, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    }
    MPI_Comm nc = MPI_COMM_NULL;
    if (!rc) {
        MPI_Group wg, g;
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_incl(wg, nranks, world_of, &g);
        rc = mpi_rc(fn, MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &nc));
        MPI_Group_free(&g), MPI_Group_free(&wg);
    }
    free(world_of);
    if (rc) return rc;
    int r2 = -1;
    MPI_Comm_rank(nc, &r2);
    if (r2 != rank) return BAD_USE(fn, "rank %d came out as %d", rank, r2);
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    return (*comm = new_comm(nc, rank, nranks)) ? SP_NCCL_SUCCESS : BAD_ARG(fn, "out of memory");
}

int ncclCommSplit(sp_nccl_comm comm, int color, int key, sp_nccl_comm *newcomm, void *config) {
    const char *fn = "ncclCommSplit";
    tally(fn);
    int rc = check_comm(fn, comm);
    if (rc) return rc;
    if (!newcomm) return BAD_ARG(fn, "newcomm is NULL");
    if (group_depth) return BAD_USE(fn, "inside a group");
    *newcomm = NULL;
    if (color < -1) return BAD_ARG(fn, "color %d (>= 0, or NCCL_SPLIT_NOCOLOR -1)", color);
    if (comm->mpi == MPI_COMM_NULL) {
        if (color < 0) return SP_NCCL_SUCCESS;
        return (*newcomm = new_comm(MPI_COMM_NULL, 0, 1)) ? SP_NCCL_SUCCESS : BAD_ARG(fn, "out of memory");
    }
    MPI_Comm nc;
    if ((rc = mpi_rc(fn, MPI_Comm_split(comm->mpi, color < 0 ? MPI_UNDEFINED : color, key, &nc)))) return rc;
    if (nc == MPI_COMM_NULL) return SP_NCCL_SUCCESS;
    int r = 0, n = 0;
    MPI_Comm_rank(nc, &r), MPI_Comm_size(nc, &n);
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    return (*newcomm = new_comm(nc, r, n)) ? SP_NCCL_SUCCESS : BAD_ARG(fn, "out of memory");
}

int ncclCommDestroy(sp_nccl_comm comm) {
    tally("ncclCommDestroy");
    int rc = check_comm("ncclCommDestroy", comm);
    if (rc) return rc;
    if (group_depth && group_comm == comm) return BAD_USE("ncclCommDestroy", "inside a group using it");
    if (comm->mpi != MPI_COMM_NULL && mpi_up()) MPI_Comm_free(&comm->mpi);
    comm->magic = 0;
    free(comm);
    return SP_NCCL_SUCCESS;
}

int ncclCommCount(sp_nccl_comm comm, int *n) {
    int rc = check_comm("ncclCommCount", comm);
    if (rc) return rc;
    return n ? (*n = comm->size, SP_NCCL_SUCCESS) : BAD_ARG("ncclCommCount", "NULL");
}
int ncclCommUserRank(sp_nccl_comm comm, int *r) {
    int rc = check_comm("ncclCommUserRank", comm);
    if (rc) return rc;
    return r ? (*r = comm->rank, SP_NCCL_SUCCESS) : BAD_ARG("ncclCommUserRank", "NULL");
}
int ncclCommGetAsyncError(sp_nccl_comm comm, int *e) {
    int rc = check_comm("ncclCommGetAsyncError", comm);
    if (rc) return rc;
    return e ? (*e = SP_NCCL_SUCCESS, SP_NCCL_SUCCESS) : BAD_ARG("ncclCommGetAsyncError", "NULL");
}

/* ---- groups, send and receive ---- */

int ncclGroupStart(void) {
    tally("ncclGroupStart");
    if (group_depth++ == 0) n_queue = 0, group_comm = NULL, group_error = 0;
    return SP_NCCL_SUCCESS;
}

static int run_group(void) {
    const char *fn = "ncclGroupEnd";
    if (!n_queue) return SP_NCCL_SUCCESS;
    sp_nccl_comm c = group_comm;
    if (c->mpi == MPI_COMM_NULL) { /* one rank: every send goes to itself; match them with the receives in order */
        int s = 0, r = 0;
        for (;;) {
            while (s < n_queue && !queue[s].is_send) s++;
            while (r < n_queue && queue[r].is_send) r++;
            if (s == n_queue || r == n_queue) break;
            if (queue[s].count != queue[r].count || queue[s].dt != queue[r].dt)
                return BAD_USE(fn, "a send of %zu elements (type %d) met a receive of %zu (type %d)", queue[s].count,
                               queue[s].dt, queue[r].count, queue[r].dt);
            if (overlap(queue[s].sbuf, queue[s].count * dt_size(queue[s].dt), queue[r].rbuf, queue[r].count * dt_size(queue[r].dt)))
                return BAD_USE(fn, "a send to itself overlaps its receive buffer");
            memcpy(queue[r].rbuf, queue[s].sbuf, queue[s].count * dt_size(queue[s].dt));
            s++, r++;
        }
        if (s != n_queue || r != n_queue) return BAD_USE(fn, "unmatched sends or receives to itself");
        return SP_NCCL_SUCCESS;
    }
    MPI_Request *req = malloc(sizeof(MPI_Request) * (size_t)n_queue);
    MPI_Status *st = malloc(sizeof(MPI_Status) * (size_t)n_queue);
    if (!req || !st) return free(req), free(st), BAD_ARG(fn, "out of memory");
    int rc = SP_NCCL_SUCCESS, posted = 0;
    for (int i = 0; i < n_queue && !rc; i++, posted++) {
        const fake_p2p *q = &queue[i];
        rc = mpi_rc(fn, q->is_send ? MPI_Isend(q->sbuf, (int)q->count, dt_mpi(q->dt), q->peer, 0, c->mpi, &req[i])
                                   : MPI_Irecv(q->rbuf, (int)q->count, dt_mpi(q->dt), q->peer, 0, c->mpi, &req[i]));
    }
    if (!rc) rc = mpi_rc(fn, MPI_Waitall(posted, req, st));
    for (int i = 0; i < n_queue && !rc; i++) {
        if (queue[i].is_send) continue;
        int got = -1;
        MPI_Get_count(&st[i], dt_mpi(queue[i].dt), &got);
        if (got != (int)queue[i].count)
            rc = BAD_USE(fn, "a receive of %zu elements from rank %d got %d (send and receive counts must match)",
                         queue[i].count, queue[i].peer, got);
    }
    free(req), free(st);
    return rc;
}

int ncclGroupEnd(void) {
    tally("ncclGroupEnd");
    if (group_depth <= 0) return BAD_USE("ncclGroupEnd", "without ncclGroupStart");
    if (--group_depth) return SP_NCCL_SUCCESS;
    const int err = group_error;
    const int rc = err ? err : run_group();
    n_queue = 0, group_comm = NULL, group_error = 0;
    return rc;
}

static int p2p(const char *fn, int is_send, const void *sbuf, void *rbuf, size_t count, int dt, int peer,
               sp_nccl_comm comm, void *stream) {
    int rc = check_call(fn, comm, dt, SP_NCCL_SUM, count, stream);
    if (!rc && !group_depth) rc = BAD_USE(fn, "outside ncclGroupStart/End (the comm table groups every send/recv)");
    if (!rc && (peer < 0 || peer >= comm->size)) rc = BAD_ARG(fn, "peer %d outside 0..%d", peer, comm->size - 1);
    if (!rc && count && !(is_send ? sbuf : rbuf)) rc = BAD_ARG(fn, "NULL buffer for %zu elements", count);
    if (!rc && group_comm && group_comm != comm) rc = BAD_USE(fn, "two communicators in one group");
    if (!rc && n_queue == cap_queue) {
        fake_p2p *q = realloc(queue, sizeof *q * (size_t)(cap_queue ? 2 * cap_queue : 64));
        if (!q) rc = BAD_ARG(fn, "out of memory");
        else queue = q, cap_queue = cap_queue ? 2 * cap_queue : 64;
    }
    if (rc) {
        if (group_depth && !group_error) group_error = rc; /* NCCL reports it again at ncclGroupEnd */
        return rc;
    }
    group_comm = comm;
    if (count) queue[n_queue++] = (fake_p2p){is_send, sbuf, rbuf, count, dt, peer};
    return SP_NCCL_SUCCESS;
}

int ncclSend(const void *sendbuff, size_t count, int datatype, int peer, sp_nccl_comm comm, void *stream) {
    tally("ncclSend");
    return p2p("ncclSend", 1, sendbuff, NULL, count, datatype, peer, comm, stream);
}

int ncclRecv(void *recvbuff, size_t count, int datatype, int peer, sp_nccl_comm comm, void *stream) {
    tally("ncclRecv");
    return p2p("ncclRecv", 0, NULL, recvbuff, count, datatype, peer, comm, stream);
}

/* ---- collectives (outside groups) ---- */

static int coll(const char *fn, sp_nccl_comm comm, int dt, int op, size_t count, const void *sbuf, void *rbuf,
                void *stream) {
    tally(fn);
    int rc = check_call(fn, comm, dt, op, count, stream);
    if (rc) return rc;
    if (group_depth) return BAD_USE(fn, "a collective inside a group (the comm table never groups them)");
    if (count && (!sbuf || !rbuf)) return BAD_ARG(fn, "NULL buffer for %zu elements", count);
    return SP_NCCL_SUCCESS;
}

int ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype, sp_nccl_comm comm,
                  void *stream) {
    const char *fn = "ncclAllGather";
    int rc = coll(fn, comm, datatype, SP_NCCL_SUM, sendcount, sendbuff, recvbuff, stream);
    if (rc || !sendcount) return rc;
    const size_t es = dt_size(datatype), blk = sendcount * es;
    const int in_place = (const char *)sendbuff == (const char *)recvbuff + (size_t)comm->rank * blk;
    if (!in_place && overlap(sendbuff, blk, recvbuff, blk * (size_t)comm->size))
        return BAD_USE(fn, "sendbuff overlaps recvbuff without being block %d of it (in place)", comm->rank);
    if (comm->mpi == MPI_COMM_NULL) return in_place ? 0 : (memcpy(recvbuff, sendbuff, blk), SP_NCCL_SUCCESS);
    return mpi_rc(fn, MPI_Allgather(in_place ? MPI_IN_PLACE : sendbuff, (int)sendcount, dt_mpi(datatype), recvbuff,
                                    (int)sendcount, dt_mpi(datatype), comm->mpi));
}

int ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, int datatype, int root, sp_nccl_comm comm,
                  void *stream) {
    const char *fn = "ncclBroadcast";
    int rc = coll(fn, comm, datatype, SP_NCCL_SUM, count, comm && comm->magic == FAKE_MAGIC && root == comm->rank ? sendbuff : recvbuff,
                  recvbuff, stream);
    if (rc) return rc;
    if (root < 0 || root >= comm->size) return BAD_ARG(fn, "root %d outside 0..%d", root, comm->size - 1);
    if (!count) return SP_NCCL_SUCCESS;
    const size_t bytes = count * dt_size(datatype);
    if (root == comm->rank && sendbuff != recvbuff) {
        if (overlap(sendbuff, bytes, recvbuff, bytes)) return BAD_USE(fn, "sendbuff and recvbuff overlap (not in place)");
        memcpy(recvbuff, sendbuff, bytes);
    }
    if (comm->mpi == MPI_COMM_NULL) return SP_NCCL_SUCCESS;
    return mpi_rc(fn, MPI_Bcast(recvbuff, (int)count, dt_mpi(datatype), root, comm->mpi));
}

int ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, sp_nccl_comm comm,
                  void *stream) {
    const char *fn = "ncclAllReduce";
    int rc = coll(fn, comm, datatype, op, count, sendbuff, recvbuff, stream);
    if (rc || !count) return rc;
    if (datatype != SP_NCCL_FLOAT32) return BAD_ARG(fn, "the comm table sums float32 only (datatype %d)", datatype);
    const size_t bytes = count * 4;
    if (sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes))
        return BAD_USE(fn, "sendbuff and recvbuff overlap (not in place)");
    if (comm->mpi == MPI_COMM_NULL) return sendbuff == recvbuff ? 0 : (memcpy(recvbuff, sendbuff, bytes), SP_NCCL_SUCCESS);
    return mpi_rc(fn, MPI_Allreduce(sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff, recvbuff, (int)count, MPI_FLOAT,
                                    MPI_SUM, comm->mpi));
}

int ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op,
                      sp_nccl_comm comm, void *stream) {
    const char *fn = "ncclReduceScatter";
    int rc = coll(fn, comm, datatype, op, recvcount, sendbuff, recvbuff, stream);
    if (rc || !recvcount) return rc;
    if (datatype != SP_NCCL_FLOAT32) return BAD_ARG(fn, "the comm table sums float32 only (datatype %d)", datatype);
    const size_t blk = recvcount * 4;
    const int in_place = (const char *)recvbuff == (const char *)sendbuff + (size_t)comm->rank * blk;
    if (!in_place && overlap(sendbuff, blk * (size_t)comm->size, recvbuff, blk))
        return BAD_USE(fn, "recvbuff overlaps sendbuff without being block %d of it (in place)", comm->rank);
    if (comm->mpi == MPI_COMM_NULL) return in_place ? 0 : (memcpy(recvbuff, sendbuff, blk), SP_NCCL_SUCCESS);
    void *src = (void *)sendbuff;
    if (in_place && !(src = malloc(blk * (size_t)comm->size))) return BAD_ARG(fn, "out of memory");
    if (in_place) memcpy(src, sendbuff, blk * (size_t)comm->size);
    rc = mpi_rc(fn, MPI_Reduce_scatter_block(src, recvbuff, (int)recvcount, MPI_FLOAT, MPI_SUM, comm->mpi));
    if (in_place) free(src);
    return rc;
}

int ncclReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, int root,
               sp_nccl_comm comm, void *stream) {
    const char *fn = "ncclReduce";
    const int is_root = comm && comm->magic == FAKE_MAGIC && root == comm->rank;
    int rc = coll(fn, comm, datatype, op, count, sendbuff, is_root ? recvbuff : (void *)sendbuff, stream);
    if (rc) return rc;
    if (root < 0 || root >= comm->size) return BAD_ARG(fn, "root %d outside 0..%d", root, comm->size - 1);
    if (!count) return SP_NCCL_SUCCESS;
    if (datatype != SP_NCCL_FLOAT32) return BAD_ARG(fn, "the comm table sums float32 only (datatype %d)", datatype);
    const size_t bytes = count * 4;
    if (is_root && sendbuff != recvbuff && overlap(sendbuff, bytes, recvbuff, bytes))
        return BAD_USE(fn, "sendbuff and recvbuff overlap (not in place)");
    if (comm->mpi == MPI_COMM_NULL) return sendbuff == recvbuff ? 0 : (memcpy(recvbuff, sendbuff, bytes), SP_NCCL_SUCCESS);
    const void *s = is_root && sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
    return mpi_rc(fn, MPI_Reduce(s, is_root ? recvbuff : NULL, (int)count, MPI_FLOAT, MPI_SUM, root, comm->mpi));
}
