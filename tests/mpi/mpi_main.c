/* tests/mpi/mpi_main.c — entry point of vgrpo_mpi_tests (see mpi_cases.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tests/mpi/mpi_cases.h"

static int failures;

void mpi_test_fail(const char *file, int line) {
    failures++;
    fprintf(stderr, "  %s:%d: ", file, line);
}

int mpi_test_failures(void) { return failures; }

void mpi_fill_uniform(float *x, size_t n, unsigned long long seed, float lo, float hi) {
    unsigned long long s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(s >> 11) * (1.0 / 9007199254740992.0);
        x[i] = (float)(lo + (hi - lo) * u);
    }
}

static const struct {
    const char *name;
    int (*fn)(sp_comm *, int, char **);
    const char *usage;
} cases[] = {
    {"comm", mpi_case_comm, "comm                      every sp_comm collective on the world, values checked exactly"},
    {"usp", mpi_case_usp,
     "usp SP ULYSSES [S H Dh B] USP attention vs single-rank attention (world = dp x SP ranks)"},
    {"dit", mpi_case_dit,
     "dit SP ULYSSES [F H W B PER_TOKEN RECOMPUTE]  tiny Wan DiT fwd+bwd, sequence-parallel vs single-rank"},
    {"dp", mpi_case_dp, "dp                        trainer data parallelism: batch broadcast, reduced gradient vs one rank"},
    {"zero", mpi_case_zero, "zero                      ZeRO stages 1 and 2 vs stage 0 and the rank-order collectives, bit for bit"},
    {"nccl", mpi_case_nccl,
     "nccl [PIECE]              the comm table on the fake NCCL (VGRPO_NCCL_LIB) vs MPI; exact sums bit for bit"},
    {"sync_nccl", mpi_case_sync_nccl,
     "sync_nccl [BUCKET_BYTES]  the weight sync by NCCL broadcast (fake NCCL) into workers' device weights, bit for bit"},
    {"zero_dev", mpi_case_zero_dev,
     "zero_dev                  data parallelism and ZeRO on the emulated device vs the CPU path, bit for bit"},
    {"dit_dev", mpi_case_dit_dev,
     "dit_dev SP ULYSSES [F H W B PER_TOKEN]  the DiT's SP on the emulated device (bf16) vs its single-rank run"},
    {"dit_bench", mpi_case_dit_bench,
     "dit_bench SP ULYSSES [F H W L LAYERS REPS]    per-rank activation bytes and fwd+bwd wall time (benchmark)"},
};

int main(int argc, char **argv) {
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    int which = -1;
    for (int i = 0; argc > 1 && i < ncases; i++)
        if (!strcmp(argv[1], cases[i].name)) which = i;
    if (which < 0) {
        fprintf(stderr, "usage: mpirun -n K %s CASE [ARGS]\ncases:\n", argv[0]);
        for (int i = 0; i < ncases; i++) fprintf(stderr, "  %s\n", cases[i].usage);
        return 2;
    }
    sp_comm *world = NULL;
    if (sp_comm_mpi_world(&argc, &argv, &world)) {
        fprintf(stderr, "%s\n", core_last_error());
        return 1;
    }
    int rc = cases[which].fn(world, argc - 2, argv + 2);
    if (rc == 0 && mpi_test_failures()) rc = 1;
    /* Every rank's status: sum of failures over the world (exact in F32 for small counts). */
    float bad = rc ? 1.0f : 0.0f, total = 0.0f;
    if (sp_comm_all_reduce(world, &bad, &total, 1, SP_F32)) {
        fprintf(stderr, "rank %d: %s\n", world->rank, core_last_error());
        total = 1.0f;
    }
    if (world->rank == 0)
        printf("%s: %s (%d of %d ranks failed)\n", argv[1], total ? "FAIL" : "PASS", (int)total, world->size);
    sp_comm_destroy(world);
    sp_comm_mpi_finalize();
    return total ? 1 : 0;
}
