/* tests/mpi/mpi_cases.h — the multi-rank test programs: one binary (build/vgrpo_mpi_tests), the case name as
 * argv[1], run by tests/test_sp.c as `mpirun -n K --oversubscribe vgrpo_mpi_tests CASE [ARGS]`.
 * A case returns 0 when every check passed on this rank; main() combines the ranks' results (every rank exits
 * with the world's worst status) and rank 0 prints one closing line "CASE: PASS" or "CASE: FAIL". */
#ifndef TESTS_MPI_CASES_H
#define TESTS_MPI_CASES_H

#include <stddef.h>
#include <stdio.h>

#include "sp/comm.h"

/* Records a failed check on this rank (printed with the rank) and continues. */
#define MCHECK(c, ...)                                                                                    \
    do {                                                                                                  \
        if (!(c)) {                                                                                       \
            mpi_test_fail(__FILE__, __LINE__);                                                            \
            fprintf(stderr, __VA_ARGS__);                                                                 \
            fprintf(stderr, "\n");                                                                        \
        }                                                                                                 \
    } while (0)

void mpi_test_fail(const char *file, int line);
/* Failures so far on this rank. */
int mpi_test_failures(void);
/* n floats uniform in [lo, hi) from a seeded LCG (the same sequence on every rank for the same seed). */
void mpi_fill_uniform(float *x, size_t n, unsigned long long seed, float lo, float hi);

/* Cases. world: the world group; args after the case name. */
int mpi_case_comm(sp_comm *world, int argc, char **argv);
int mpi_case_usp(sp_comm *world, int argc, char **argv);
int mpi_case_dit(sp_comm *world, int argc, char **argv);
int mpi_case_dit_bench(sp_comm *world, int argc, char **argv);
int mpi_case_dit_dev(sp_comm *world, int argc, char **argv);
int mpi_case_dp(sp_comm *world, int argc, char **argv);
int mpi_case_zero(sp_comm *world, int argc, char **argv);
int mpi_case_nccl(sp_comm *world, int argc, char **argv);
int mpi_case_zero_dev(sp_comm *world, int argc, char **argv);
int mpi_case_sync_nccl(sp_comm *world, int argc, char **argv);

#endif
