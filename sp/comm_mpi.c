/* sp/comm_mpi.c — the MPI implementation of sp_comm (comm.h) for host memory.
 *
 * Each group owns an MPI communicator (the world group a duplicate of MPI_COMM_WORLD) with MPI_ERRORS_RETURN, so an
 * MPI failure becomes -1 with the MPI error string instead of an abort. Counts are elements; MPI's are int, so a
 * block over INT_MAX elements is refused (2^31 floats = 8 GiB per block: far above any activation shard here).
 * Collectives map one to one: MPI_Alltoall, MPI_Sendrecv, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce,
 * MPI_Barrier, MPI_Comm_split. Sums use MPI_SUM on MPI_FLOAT; OpenMPI picks its algorithm from the group size and
 * message size only, so a run repeats bit for bit. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "sp/comm.h"

typedef struct {
    MPI_Comm comm;
} mpi_impl;

static MPI_Comm comm_of(sp_comm *c) { return ((mpi_impl *)c->impl)->comm; }

static MPI_Datatype mpi_type(sp_dtype d) {
    switch (d) {
    case SP_F32: return MPI_FLOAT;
    case SP_I64: return MPI_INT64_T;
    case SP_U8: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
}

/* -1 with "<op> on group <name>: <MPI error string>" unless rc is MPI_SUCCESS. */
static int mpi_check(sp_comm *c, const char *op, int rc) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return core_error("%s on group %s (rank %d of %d): MPI error: %s", op, c->name, c->rank, c->size, msg);
}

static int fits(sp_comm *c, const char *op, size_t count) {
    if (count > (size_t)INT_MAX)
        return core_error("%s on group %s: %zu elements exceed MPI's int count limit", op, c->name, count);
    return 0;
}

static int m_all_to_all(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    if (fits(c, "all_to_all", count)) return -1;
    return mpi_check(c, "all_to_all",
                     MPI_Alltoall(send, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt), comm_of(c)));
}

static int m_sendrecv(sp_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                      int source, sp_dtype dt) {
    if (fits(c, "sendrecv", send_count) || fits(c, "sendrecv", recv_count)) return -1;
    return mpi_check(c, "sendrecv",
                     MPI_Sendrecv(send, (int)send_count, mpi_type(dt), dest, 0, recv, (int)recv_count, mpi_type(dt),
                                  source, 0, comm_of(c), MPI_STATUS_IGNORE));
}

static int m_all_gather(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    if (fits(c, "all_gather", count)) return -1;
    return mpi_check(c, "all_gather",
                     MPI_Allgather(send, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt), comm_of(c)));
}

static int m_reduce_scatter(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    if (fits(c, "reduce_scatter", count)) return -1;
    return mpi_check(c, "reduce_scatter",
                     MPI_Reduce_scatter_block(send, recv, (int)count, mpi_type(dt), MPI_SUM, comm_of(c)));
}

static int m_all_reduce(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dt) {
    if (fits(c, "all_reduce", count)) return -1;
    return mpi_check(c, "all_reduce",
                     MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(dt), MPI_SUM,
                                   comm_of(c)));
}

static int m_barrier(sp_comm *c) { return mpi_check(c, "barrier", MPI_Barrier(comm_of(c))); }

static int m_broadcast(sp_comm *c, void *buf, size_t count, sp_dtype dt, int root) {
    if (fits(c, "broadcast", count)) return -1;
    return mpi_check(c, "broadcast", MPI_Bcast(buf, (int)count, mpi_type(dt), root, comm_of(c)));
}

static int wrap(MPI_Comm comm, const char *name, sp_comm **out);

static int m_split(sp_comm *c, int colour, int key, const char *name, sp_comm **out) {
    MPI_Comm nc;
    if (mpi_check(c, "split", MPI_Comm_split(comm_of(c), colour, key, &nc))) return -1;
    return wrap(nc, name, out);
}

static void m_destroy(sp_comm *c) {
    mpi_impl *m = c->impl;
    int fin = 0;
    MPI_Finalized(&fin);
    if (m && !fin && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m);
    free(c);
}

static const sp_comm_ops mpi_ops = {m_all_to_all, m_sendrecv, m_all_gather, m_reduce_scatter, m_all_reduce,
                                    m_barrier,    m_broadcast, m_split,      m_destroy,        NULL,
                                    NULL,         NULL,        NULL};

/* Takes ownership of comm (freed on failure too). */
static int wrap(MPI_Comm comm, const char *name, sp_comm **out) {
    *out = NULL;
    sp_comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        MPI_Comm_free(&comm);
        return core_error("MPI group %s: out of memory", name);
    }
    m->comm = comm;
    c->ops = &mpi_ops;
    c->impl = m;
    snprintf(c->name, sizeof c->name, "%s", name);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    *out = c;
    return 0;
}

int sp_comm_mpi_world(int *argc, char ***argv, sp_comm **out) {
    *out = NULL;
    int init = 0, fin = 0;
    MPI_Finalized(&fin);
    if (fin) return core_error("MPI world: MPI was already finalised");
    MPI_Initialized(&init);
    if (!init) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return core_error("MPI world: MPI_Init_thread failed");
    }
    MPI_Comm dup;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        return core_error("MPI world: MPI_Comm_dup failed: %s", msg);
    }
    return wrap(dup, "world", out);
}

void sp_comm_mpi_finalize(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Finalize();
}
