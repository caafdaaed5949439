/* tests/test_nccl.c — the comm table on NCCL (sp/comm_nccl.c) over the fake NCCL (tests/fake_nccl/, built as
 * $(BUILD)/libfake_nccl.so beside the MPI test binary) on the emulated device: one rank in this process, 1, 2 and 4
 * ranks under mpirun (tests/mpi/mpi_nccl.c), the fake's own contract checks, the exact block sum of the device
 * tables, and parallel.reduce in the recipe. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/recipe.h"
#include "kernels/body/kb_blocksum.h"
#include "kernels/cpu/dev_table.h"
#include "kernels/cuda/emu/k_emu.h"
#include "sp/comm_nccl.h"
#include "sp/nccl_abi.h"
#include "tests/test.h"

#define CHECK_OK(e) CHECK_MSG((e) == 0, "%s: %s", #e, core_last_error())

/* $(BUILD)/libfake_nccl.so: beside the MPI test binary ($VGRPO_MPI_TESTS) or vgrpo ($VGRPO_BIN). */
static const char *fake_lib(void) {
    static char path[1024];
    const char *e = getenv("VGRPO_MPI_TESTS");
    const char *bin = e && *e ? e : test_vgrpo_bin(), *slash = strrchr(bin, '/');
    snprintf(path, sizeof path, "%.*s/libfake_nccl.so", slash ? (int)(slash - bin) : 1, slash ? bin : ".");
    return path;
}

static int have_fake(void) {
    FILE *f = fopen(fake_lib(), "r");
    if (!f) {
        test_fail(__FILE__, __LINE__, "%s not found: build it (make builds it with $(BUILD)/vgrpo_mpi_tests)",
                  fake_lib());
        return 0;
    }
    fclose(f);
    return 1;
}

/* ---- the block sum: the same bits on the CPU table, the emulated device and the body, in rank order ---- */

TEST(nccl_block_sum_rank_order) {
    enum { NB = 4, N = 1000, STRIDE = 1003 };
    float *b = malloc(sizeof(float) * NB * STRIDE), out_c[N], out_e[N];
    unsigned s = 7;
    for (int i = 0; i < NB * STRIDE; i++) {
        s = s * 1103515245u + 12345u;
        b[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 3 ? 1.0f : 3e4f);
    }
    b[5] = -0.0f, b[STRIDE + 5] = -0.0f, b[2 * STRIDE + 5] = -0.0f, b[3 * STRIDE + 5] = -0.0f;
    REQUIRE(k_cpu_dev_ops.block_sum && k_emu_ops.block_sum);
    REQUIRE_OK(k_cpu_dev_ops.block_sum(out_c, b, NB, STRIDE, N));
    REQUIRE_OK(k_emu_ops.block_sum(out_e, b, NB, STRIDE, N));
    int differ_from_pairwise = 0;
    for (int i = 0; i < N; i++) {
        const float want = ((b[i] + b[STRIDE + i]) + b[2 * STRIDE + i]) + b[3 * STRIDE + i];
        const float pairwise = (b[i] + b[STRIDE + i]) + (b[2 * STRIDE + i] + b[3 * STRIDE + i]);
        CHECK_MSG(!memcmp(&out_c[i], &want, 4) && !memcmp(&out_e[i], &want, 4), "element %d", i);
        differ_from_pairwise += memcmp(&want, &pairwise, 4) != 0;
    }
    /* -0 summed from -0s stays -0 (the sum starts from b_0, not from 0) */
    CHECK(out_c[5] == 0.0f && signbit(out_c[5]));
    /* the inputs tell the orders apart: OpenMPI's 4-rank grouping would give other bits on some elements */
    CHECK(differ_from_pairwise > 10);
    CHECK(k_emu_ops.block_sum(out_e, b, 0, STRIDE, N) == -1 && strstr(core_last_error(), "block_sum"));
    CHECK(k_emu_ops.block_sum(out_e, b, NB, N - 1, N) == -1);
    free(b);
}

/* ---- one rank in this process (the self group as the host group) ---- */

TEST(nccl_one_rank_over_fake) {
    if (!have_fake()) return;
    setenv("VGRPO_NCCL_LIB", fake_lib(), 1);
    sp_comm *host = sp_comm_self("host"), *g = NULL;
    REQUIRE(host);
    int dummy_stream;
    sp_nccl_opts o = {.stream = &dummy_stream, .dev = &k_emu_ops, .reduce = SP_REDUCE_EXACT, .piece = 64};
    REQUIRE_OK(sp_comm_nccl_world(host, &o, &g));
    CHECK(g->size == 1 && g->rank == 0 && !strcmp(g->name, "nccl-host") && sp_comm_is_nccl(g));
    CHECK(sp_nccl_version() >= SP_NCCL_MIN_VERSION && strstr(sp_nccl_lib_path(), "libfake_nccl.so"));
    enum { N = 300 };
    float *a = k_emu_ops.mem_alloc(sizeof(float) * N), *b = k_emu_ops.mem_alloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) a[i] = (float)i - 100.5f;
    CHECK_OK(sp_comm_all_to_all(g, a, b, N, SP_F32));
    CHECK(!memcmp(a, b, sizeof(float) * N));
    memset(b, 0, sizeof(float) * N);
    CHECK_OK(sp_comm_all_reduce(g, a, b, N, SP_F32)); /* exact, 5 rounds of 64: the identity */
    CHECK(!memcmp(a, b, sizeof(float) * N));
    memset(b, 0, sizeof(float) * N);
    CHECK_OK(sp_comm_reduce_scatter(g, a, b, N, SP_F32));
    CHECK(!memcmp(a, b, sizeof(float) * N));
    memset(b, 0, sizeof(float) * N);
    CHECK_OK(sp_comm_sendrecv(g, a, N, 0, b, N, 0, SP_F32));
    CHECK(!memcmp(a, b, sizeof(float) * N));
    CHECK(sp_comm_sendrecv(g, a, N, 0, b, N - 1, 0, SP_F32) == -1 && strstr(core_last_error(), "itself"));
    CHECK_OK(sp_comm_broadcast(g, a, N, SP_F32, 0));
    CHECK_OK(sp_comm_barrier(g));
    sp_comm *s = NULL;
    CHECK_OK(sp_comm_split(g, 0, 0, "one", &s));
    CHECK(s && s->size == 1 && sp_comm_is_nccl(s));
    if (s) {
        memset(b, 0, sizeof(float) * N);
        CHECK_OK(sp_comm_all_gather(s, a, b, N, SP_F32));
        CHECK(!memcmp(a, b, sizeof(float) * N));
    }
    sp_comm_destroy(s);
    k_emu_ops.mem_free(a), k_emu_ops.mem_free(b);
    sp_comm_destroy(g);
    sp_comm_destroy(host);
    unsetenv("VGRPO_NCCL_LIB"); /* the library stays loaded in this process; later tests' children do not inherit it */
}

TEST(nccl_missing_library_refused) {
    setenv("VGRPO_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    sp_comm *host = sp_comm_self("host"), *g = NULL;
    sp_nccl_opts o = {.dev = &k_emu_ops};
    /* a library already loaded by an earlier test stays loaded: only a fresh process sees the refusal */
    if (!sp_nccl_lib_path()[0]) {
        CHECK(sp_comm_nccl_world(host, &o, &g) == -1 && !g);
        CHECK_MSG(strstr(core_last_error(), "cannot load /nonexistent/libnccl.so.2") &&
                      strstr(core_last_error(), "VGRPO_NCCL_LIB"),
                  "%s", core_last_error());
    }
    sp_nccl_opts none = {0};
    CHECK(sp_comm_nccl_world(host, &none, &g) == -1 && strstr(core_last_error(), "device table"));
    sp_comm_destroy(host);
    unsetenv("VGRPO_NCCL_LIB");
}

/* ---- the fake checks NCCL's contract (the tests above would pass a fake that checked nothing) ---- */

TEST(nccl_fake_checks_contract) {
    if (!have_fake()) return;
    void *h = dlopen(fake_lib(), RTLD_NOW | RTLD_LOCAL);
    CHECK_MSG(h, "%s", dlerror());
    REQUIRE(h);
    sp_nccl_api a;
    static const char *const names[] = {
        "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommSplit", "ncclCommDestroy",
        "ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank", "ncclGetErrorString", "ncclGetLastError",
        "ncclSend", "ncclRecv", "ncclAllGather", "ncclBroadcast", "ncclReduceScatter", "ncclAllReduce", "ncclReduce",
        "ncclGroupStart", "ncclGroupEnd"};
    void *slots[sizeof names / sizeof names[0]];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) REQUIRE((slots[i] = dlsym(h, names[i])));
    memcpy(&a, slots, sizeof a);
    sp_nccl_unique_id id;
    sp_nccl_comm c = NULL;
    REQUIRE(a.GetUniqueId(&id) == SP_NCCL_SUCCESS);
    REQUIRE(a.CommInitRank(&c, 1, id, 0) == SP_NCCL_SUCCESS && c);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    int s1, s2;
    /* a send outside a group; a group end without a start */
    CHECK(a.Send(x, 4, SP_NCCL_FLOAT32, 0, c, &s1) == SP_NCCL_INVALID_USAGE);
    CHECK(a.GroupEnd() == SP_NCCL_INVALID_USAGE);
    /* peer out of range, bad datatype: reported at the call and again at the group's end */
    CHECK(a.GroupStart() == 0 && a.Send(x, 4, SP_NCCL_FLOAT32, 1, c, &s1) == SP_NCCL_INVALID_ARGUMENT);
    CHECK(a.GroupEnd() == SP_NCCL_INVALID_ARGUMENT);
    CHECK(strstr(a.GetLastError(c), "peer 1"));
    CHECK(a.GroupStart() == 0 && a.Recv(y, 4, 9, 0, c, &s1) == SP_NCCL_INVALID_ARGUMENT && a.GroupEnd() != 0);
    /* unequal send and receive counts */
    CHECK(a.GroupStart() == 0 && a.Send(x, 4, SP_NCCL_FLOAT32, 0, c, &s1) == 0 &&
          a.Recv(y, 3, SP_NCCL_FLOAT32, 0, c, &s1) == 0 && a.GroupEnd() == SP_NCCL_INVALID_USAGE);
    /* a matched pair copies */
    memset(y, 0, sizeof y);
    CHECK(a.GroupStart() == 0 && a.Send(x, 8, SP_NCCL_FLOAT32, 0, c, &s1) == 0 &&
          a.Recv(y, 8, SP_NCCL_FLOAT32, 0, c, &s1) == 0 && a.GroupEnd() == 0 && !memcmp(x, y, sizeof x));
    /* another stream on the same communicator */
    CHECK(a.AllReduce(x, y, 8, SP_NCCL_FLOAT32, SP_NCCL_SUM, c, &s2) == SP_NCCL_INVALID_USAGE);
    CHECK(strstr(a.GetLastError(c), "stream"));
    /* overlapping buffers that are not in place; a collective inside a group; a non-sum op; float sums only */
    CHECK(a.AllReduce(x, x + 1, 4, SP_NCCL_FLOAT32, SP_NCCL_SUM, c, &s1) == SP_NCCL_INVALID_USAGE);
    CHECK(a.AllReduce(x, x, 8, SP_NCCL_FLOAT32, SP_NCCL_SUM, c, &s1) == 0);
    CHECK(a.AllGather(x + 1, x, 4, SP_NCCL_FLOAT32, c, &s1) == SP_NCCL_INVALID_USAGE);
    CHECK(a.GroupStart() == 0 && a.AllReduce(x, y, 8, SP_NCCL_FLOAT32, SP_NCCL_SUM, c, &s1) == SP_NCCL_INVALID_USAGE);
    CHECK(a.GroupEnd() == 0);
    CHECK(a.AllReduce(x, y, 8, SP_NCCL_FLOAT32, 1, c, &s1) == SP_NCCL_INVALID_ARGUMENT);
    CHECK(a.AllReduce(x, y, 2, SP_NCCL_INT64, SP_NCCL_SUM, c, &s1) == SP_NCCL_INVALID_ARGUMENT);
    CHECK(a.Broadcast(x, y, 8, SP_NCCL_FLOAT32, 1, c, &s1) == SP_NCCL_INVALID_ARGUMENT);
    /* a communicator that is not one */
    CHECK(a.AllReduce(x, y, 8, SP_NCCL_FLOAT32, SP_NCCL_SUM, (sp_nccl_comm)(void *)x, &s1) == SP_NCCL_INVALID_ARGUMENT);
    CHECK(a.CommDestroy(c) == 0);
    dlclose(h);
}

/* ---- parallel.reduce ---- */

TEST(nccl_recipe_parallel_reduce) {
    core_recipe r;
    const char *dflt[] = {"model.init_preset=tiny"};
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", dflt, 0));
    CHECK(r.choice.reduce == CORE_REDUCE_EXACT && !strcmp(r.reduce, "exact"));
    core_recipe_release(&r);
    const char *nccl_cpu[] = {"parallel.reduce=nccl"};
    CHECK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", nccl_cpu, 1) == -1);
    CHECK_MSG(strstr(core_last_error(), "parallel.reduce: nccl") && strstr(core_last_error(), "use exact"), "%s",
              core_last_error());
    const char *bad[] = {"parallel.reduce=fast"};
    CHECK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", bad, 1) == -1);
    CHECK_MSG(strstr(core_last_error(), "exact|nccl"), "%s", core_last_error());
    CHECK((int)SP_REDUCE_EXACT == (int)CORE_REDUCE_EXACT && (int)SP_REDUCE_NCCL == (int)CORE_REDUCE_NCCL);
}

/* ---- several ranks: tests/mpi/mpi_nccl.c under mpirun ---- */

static void run_nccl_ranks(int ranks, const char *piece) {
    if (!have_fake()) return;
    static char out[16384];
    const char *e = getenv("VGRPO_MPI_TESTS");
    char bin[1024];
    snprintf(bin, sizeof bin, "%s", e && *e ? e : "build/vgrpo_mpi_tests");
    const char *asan = getenv("VGRPO_ASAN") ? "ASAN_OPTIONS=detect_leaks=0 " : "";
    const int rc = test_run(out, sizeof out,
                            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 %s"
                            "OMPI_MCA_btl_vader_single_copy_mechanism=none VGRPO_NCCL_LIB=%s "
                            "timeout 120 mpirun -n %d --oversubscribe --bind-to none -x OMP_NUM_THREADS -x "
                            "VGRPO_NCCL_LIB %s%s nccl %s",
                            asan, fake_lib(), ranks, *asan ? "-x ASAN_OPTIONS " : "", bin, piece);
    char want[64];
    snprintf(want, sizeof want, "nccl: PASS (0 of %d ranks failed)", ranks);
    CHECK_MSG(rc == 0 && strstr(out, want), "mpirun -n %d nccl %s: exit %d, output:\n%s", ranks, piece, rc, out);
    CHECK_MSG(strstr(out, "libfake_nccl.so"), "the fake NCCL was not the library loaded:\n%s", out);
}

TEST(nccl_mpi_one_rank) { run_nccl_ranks(1, "700"); }
TEST(nccl_mpi_two_ranks) { run_nccl_ranks(2, "700"); }
TEST(nccl_mpi_four_ranks) {
    run_nccl_ranks(4, "700");
    run_nccl_ranks(4, "0"); /* the default piece: one round */
}
TEST(nccl_mpi_three_ranks_small_pieces) { run_nccl_ranks(3, "64"); }

/* --dry-run prints the key and, for nccl, the note that the sums are not bit-identical across rank counts. */
TEST(nccl_dry_run_parallel_reduce) {
    static char out[65536];
    const char *bin = test_vgrpo_bin();
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.1-t2v-1.3b-1gpu.yaml --dry-run --set parallel.reduce=nccl",
                   bin) == 0);
    CHECK_MSG(strstr(out, "  reduce: nccl") && strstr(out, "note: parallel.reduce nccl") &&
                  strstr(out, "not bit-identical across trainer rank counts"),
              "%s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.1-t2v-1.3b-1gpu.yaml --dry-run", bin) == 0);
    CHECK_MSG(strstr(out, "  reduce: exact") && !strstr(out, "note: parallel.reduce"), "%s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set parallel.reduce=nccl", bin) == 1);
    CHECK_MSG(strstr(out, "parallel.reduce: nccl") && strstr(out, "model.device cpu"), "%s", out);
}
