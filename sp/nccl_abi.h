/* sp/nccl_abi.h — the part of NCCL's C interface that sp/comm_nccl.c calls, declared from its ABI so that neither the
 * plain build nor this file needs nccl.h: the library is loaded at run time (dlopen) and its functions are reached
 * through the pointers of sp_nccl_api. The values are those of nccl.h (2.18 and later, which has ncclCommSplit); a
 * CUDA build that finds nccl.h checks them against it (sp/comm_nccl.c, static assertions). The fake NCCL of the tests
 * (tests/fake_nccl/fake_nccl.c) exports the same functions with these types.
 *
 * Types: ncclComm_t is an opaque pointer, cudaStream_t a pointer (void * here), enums are passed as int,
 * ncclUniqueId is 128 bytes passed by value, ncclConfig_t * is passed as NULL (void * here). */
#ifndef SP_NCCL_ABI_H
#define SP_NCCL_ABI_H

#include <stddef.h>

#define SP_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[SP_NCCL_UNIQUE_ID_BYTES];
} sp_nccl_unique_id;

typedef struct sp_nccl_comm_s *sp_nccl_comm; /* ncclComm_t */

/* ncclResult_t */
enum {
    SP_NCCL_SUCCESS = 0,
    SP_NCCL_UNHANDLED_CUDA_ERROR = 1,
    SP_NCCL_SYSTEM_ERROR = 2,
    SP_NCCL_INTERNAL_ERROR = 3,
    SP_NCCL_INVALID_ARGUMENT = 4,
    SP_NCCL_INVALID_USAGE = 5,
    SP_NCCL_REMOTE_ERROR = 6,
    SP_NCCL_IN_PROGRESS = 7,
};
/* ncclDataType_t (the three the comm table carries) and ncclRedOp_t (sum only) */
enum { SP_NCCL_UINT8 = 1, SP_NCCL_INT64 = 4, SP_NCCL_FLOAT32 = 7 };
enum { SP_NCCL_SUM = 0 };
/* NCCL_VERSION(2, 18, 0): the first release with ncclCommSplit */
#define SP_NCCL_MIN_VERSION 21800

/* The functions, as nccl.h declares them (names without the nccl prefix). */
typedef struct sp_nccl_api {
    int (*GetVersion)(int *version);
    int (*GetUniqueId)(sp_nccl_unique_id *id);
    int (*CommInitRank)(sp_nccl_comm *comm, int nranks, sp_nccl_unique_id id, int rank);
    int (*CommSplit)(sp_nccl_comm comm, int color, int key, sp_nccl_comm *newcomm, void *config);
    int (*CommDestroy)(sp_nccl_comm comm);
    int (*CommGetAsyncError)(sp_nccl_comm comm, int *async_error);
    int (*CommCount)(sp_nccl_comm comm, int *count);
    int (*CommUserRank)(sp_nccl_comm comm, int *rank);
    const char *(*GetErrorString)(int result);
    const char *(*GetLastError)(sp_nccl_comm comm);
    int (*Send)(const void *sendbuff, size_t count, int datatype, int peer, sp_nccl_comm comm, void *stream);
    int (*Recv)(void *recvbuff, size_t count, int datatype, int peer, sp_nccl_comm comm, void *stream);
    int (*AllGather)(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype, sp_nccl_comm comm,
                     void *stream);
    int (*Broadcast)(const void *sendbuff, void *recvbuff, size_t count, int datatype, int root, sp_nccl_comm comm,
                     void *stream);
    int (*ReduceScatter)(const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op,
                         sp_nccl_comm comm, void *stream);
    int (*AllReduce)(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, sp_nccl_comm comm,
                     void *stream);
    int (*Reduce)(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, int root,
                  sp_nccl_comm comm, void *stream);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
} sp_nccl_api;

#endif
