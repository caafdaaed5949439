/* cli/cmd_bench.c — `vgrpo bench <name> [options]`: the benchmarks of bench/ (bench/bench.h), each with its own
 * option table:
 *
 *   vgrpo bench peak    [--threads N] [--quick]   the fp32 FMA ceiling per vector width (bench/bench_peak.c)
 *   vgrpo bench kernels [--threads N] [--quick]   sgemm and attention GFLOP/s (bench/bench_kernels.c)
 *   vgrpo bench dit     [--threads N] [--quick]   one Wan block, forward and forward+backward (bench/bench_dit.c)
 *   vgrpo bench vae     [--threads N] [--quick]   Wan 2.1 VAE decode of one latent frame (bench/bench_text_vae.c)
 *   vgrpo bench umt5    [--threads N] [--quick]   umT5 on one 512-token prompt (bench/bench_text_vae.c); --device
 *                                                 cuda: the encoder on the GPU against the CPU (the GPU check's row)
 *   vgrpo bench dit --profile                      its per-op time table (bench/bench_dit.c)
 *   vgrpo bench gemm|attention|dit --device cuda [--quick]
 *                                                 the GPU: cuBLASLt bf16 GEMM TFLOP/s (the measured peak of every
 *                                                 MFU figure), cuDNN SDPA, the device Wan DiT with MFU
 *                                                 (bench/bench_device.c); gemm and attention with --device cpu (the
 *                                                 default) run bench kernels
 *   vgrpo bench dit|umt5|vae --torch FILE          PyTorch's figures (scripts/bench_torch.py --json FILE) beside
 *   vgrpo bench step    [--recipe FILE] [--set k=v]... [--steps N] [--top N] [--threads N]
 *                                                 one GRPO step by phase and op class (bench/bench_step.c)
 *   vgrpo bench reward  [--scorers LIST] [--videos N] [--threads T] [--batch B] [--inflight K]
 *                                                 reward-server videos/s (bench/bench_reward.c); --models
 *                                                 NAME=DIR [--frames K]: with learned scorers (reward/learned.h)
 *   vgrpo bench clip    --model DIR [--batch B] [--threads N] [--reps N] [--tower image|text|both] [--torch FILE]
 *                                                 CLIP images/s and texts/s (bench/bench_clip.c)
 *   vgrpo bench sync [--preset P] [--bucket-mib N] [--workers K] [--syncs N] [--ipc [--ipc-host]]
 *                                                 the weight sync's bytes, seconds, GB/s (bench/bench_sync.c)
 *
 * A new benchmark is one entry in `benches` and, when its options differ, a parser like bench_reward_cmd.
 * Exit status: 0, 1 on failure, 2 on a usage error. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/commands.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "core/error.h"
#include "reward/server.h"

typedef struct {
    const char *name;
    int (*run)(int threads, int quick); /* NULL: the benchmark parses its own options (parse) */
    int (*run_profile)(int threads, int quick); /* non-NULL: the benchmark takes --profile, which runs this instead */
    int (*parse)(int argc, char **argv);
    const char *help;
    int (*run_device)(int quick); /* non-NULL: the benchmark takes --device cpu|cuda, and cuda runs this */
} bench_entry;

static int bench_reward_cmd(int argc, char **argv);
static int bench_step_cmd(int argc, char **argv);
static int bench_sync_cmd(int argc, char **argv);
static int bench_clip_cmd(int argc, char **argv);

static const bench_entry benches[] = {
    {"peak", bench_peak, NULL, NULL,
     "fp32 FMA ceiling per vector width (register-only loop per thread): the 100% of % of peak", NULL},
    {"kernels", bench_kernels, NULL, NULL, "sgemm and CPU attention GFLOP/s (forward, forward+backward) against sgemm", NULL},
    {"dit", bench_dit, bench_dit_profile, NULL,
     "one Wan block (1.3B shape and tiny): forward, forward+backward GFLOP/s against sgemm; --device cuda: the "
     "device model's TFLOP/s and MFU against the measured bf16 GEMM peak",
     bench_device_dit},
    {"gemm", bench_kernels, NULL, NULL,
     "--device cuda: cuBLASLt bf16 GEMM TFLOP/s (8192^3 and Wan shapes), the measured peak of every MFU figure; "
     "cpu: as kernels",
     bench_device_gemm},
    {"attention", bench_kernels, NULL, NULL,
     "--device cuda: cuDNN SDPA forward and forward+backward TFLOP/s at Wan shapes; cpu: as kernels",
     bench_device_attention},
    {"vae", bench_vae, NULL, NULL,
     "Wan 2.1 VAE decode of one latent frame (16 x 60 x 104 -> 480 x 832): s/frame, peak memory", NULL},
    {"umt5", bench_umt5, NULL, NULL,
     "umT5 encoder (d_model 512, 4 layers) on one 512-token prompt: ms; --device cuda: on the device vs the CPU",
     bench_device_umt5},
    {"step", NULL, NULL, bench_step_cmd,
     "one GRPO step of a recipe (default the demo's) by phase and op class, and its largest ops", NULL},
    {"reward", NULL, NULL, bench_reward_cmd, "reward-server throughput, videos/s, batched and unbatched", NULL},
    {"sync", NULL, NULL, bench_sync_cmd, "the weight sync to rollout worker processes: bytes, seconds, GB/s", NULL},
    {"clip", NULL, NULL, bench_clip_cmd, "CLIP image and text towers of a model folder: images/s, texts/s, GFLOP/s",
     NULL},
};
#define N_BENCHES (sizeof benches / sizeof benches[0])

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo bench NAME [options]\n\nbenchmarks (NAME):\n");
    for (size_t i = 0; i < N_BENCHES; i++) fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].help);
    fprintf(f, "\n`vgrpo bench NAME --help` lists a benchmark's options.\n");
}

/* peak, kernels, dit, vae, umt5: --threads and --quick (dit, umt5, vae also --torch; dit also --profile). argv[0] is
 * the benchmark's name. */
static int bench_common_cmd(const bench_entry *b, int argc, char **argv) {
    int threads = 0, quick = 0, profile = 0;
    const char *torch = NULL, *device = "cpu";
    opts_spec opts[] = {
        {.name = "threads", .type = OPTS_INT, .i = &threads, .min = 1, .max = 4096, .meta = "N",
         .help = "OpenMP (and OpenBLAS) threads (default: OMP_NUM_THREADS or all cores)"},
        {.name = "quick", .type = OPTS_FLAG, .flag = &quick,
         .help = "one timed run per figure and the slowest shapes left out (a smoke run)"},
        {.name = "torch", .type = OPTS_STRING, .str = &torch, .meta = "FILE",
         .help = "PyTorch's figures from scripts/bench_torch.py --json FILE, printed beside vgrpo's (dit, umt5, vae)"},
        {.name = "profile", .type = OPTS_FLAG, .flag = &profile,
         .help = "instead of the table: the per-op time table (each GEMM with its shape and transposition, attention "
                 "forward/backward, the elementwise passes)"},
        {.name = "device", .type = OPTS_STRING, .str = &device, .meta = "cpu|cuda",
         .help = "cpu (default): the CPU's figures; cuda: the GPU's through the device op table (refused with one "
                 "line in a build or on a machine without one)"},
        {0}};
    const int takes_torch = b->run == bench_dit || b->run == bench_umt5 || b->run == bench_vae;
    /* drop the options this benchmark does not take, keeping the table's order */
    const int keep[5] = {1, 1, takes_torch, b->run_profile != NULL, b->run_device != NULL};
    int n = 0;
    for (int i = 0; i < 5; i++)
        if (keep[i]) opts[n++] = opts[i];
    opts[n] = (opts_spec){0};
    char name[64];
    snprintf(name, sizeof name, "bench %s", b->name);
    const opts_cmd cmd = {.name = name, .about = b->help, .opts = opts};
    int rc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (rc != OPTS_OK) return opts_exit_status(rc);
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return opts_exit_status(opts_fail(&cmd, stderr, "--device: expected cpu or cuda, got \"%s\"", device));
    if (!strcmp(device, "cuda")) {
        if (torch || profile)
            return opts_exit_status(opts_fail(&cmd, stderr, "--device cuda: --%s is for the CPU's figures only",
                                              torch ? "torch" : "profile"));
        return b->run_device(quick);
    }
    if (torch && bench_torch_load(torch)) return 1;
    return profile ? b->run_profile(threads, quick) : b->run(threads, quick);
}

static int bench_step_cmd(int argc, char **argv) {
    const char *recipe = "recipes/tiny-cpu.yaml";
    int steps = 3, top = 30, threads = 0;
    opts_list sets = {.v = calloc((size_t)argc + 1, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "recipe", .type = OPTS_STRING, .str = &recipe, .meta = "FILE",
         .help = "the recipe (default recipes/tiny-cpu.yaml, the demo's; its model folder is written from "
                 "model.init_preset when missing, as vgrpo run does)"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value", .help = "override a recipe key"},
        {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 64, .meta = "N",
         .help = "timed steps after one warm-up step (default 3); the table shows the median step"},
        {.name = "top", .type = OPTS_INT, .i = &top, .min = 0, .max = 1000, .meta = "N",
         .help = "op rows listed (default 30)"},
        {.name = "threads", .type = OPTS_INT, .i = &threads, .min = 1, .max = 4096, .meta = "N",
         .help = "OpenMP threads (default: OMP_NUM_THREADS or all cores)"},
        {0}};
    const opts_cmd cmd = {.name = "bench step", .about = "one GRPO step of a recipe, profiled by phase and op class",
                          .opts = opts};
    int rc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (rc != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(rc);
    }
    if (threads > 0) omp_set_num_threads(threads);
    core_recipe r;
    if (core_recipe_load(&r, recipe, sets.v, sets.n) || ensure_model(&r)) {
        fprintf(stderr, "vgrpo bench step: %s\n", core_last_error());
        core_recipe_release(&r);
        free(sets.v);
        return 1;
    }
    rc = bench_step(recipe, &r, steps, top);
    core_recipe_release(&r);
    free(sets.v);
    return rc;
}

static int bench_reward_cmd(int argc, char **argv) {
    bench_reward_opts o = {.scorers = "colorfulness,sharpness,motion,flicker,brightness", .videos = 512, .threads = 2,
                           .batch = 16, .inflight = 0};
    const opts_spec opts[] = {
        {.name = "scorers", .type = OPTS_STRING, .str = &o.scorers, .meta = "LIST",
         .help = "NAME[:WEIGHT],... (default colorfulness,sharpness,motion,flicker,brightness)"},
        {.name = "videos", .type = OPTS_INT, .i = &o.videos, .min = 1, .max = 1 << 20, .meta = "N",
         .help = "videos scored per row (default 512), each 9 frames of 64x64 RGB"},
        {.name = "threads", .type = OPTS_INT, .i = &o.threads, .min = 1, .max = 256, .meta = "T",
         .help = "the server's scoring threads (default 2)"},
        {.name = "batch", .type = OPTS_INT, .i = &o.batch, .min = 1, .max = 4096, .meta = "B",
         .help = "videos per request in the batched rows (default 16)"},
        {.name = "inflight", .type = OPTS_INT, .i = &o.inflight, .min = 1, .max = 1024, .meta = "K",
         .help = "requests in flight in the pipelined rows (default 2 x threads)"},
        {.name = "models", .type = OPTS_STRING, .str = &o.models, .meta = "NAME=DIR,...",
         .help = "model folders of the learned scorers in --scorers (as reward-server --models); the unbatched rows "
                 "are left out"},
        {.name = "frames", .type = OPTS_STRING, .str = &o.frames, .meta = "first|all|K",
         .help = "frames a learned scorer scores of each 9-frame video (as reward-server --frames; default all)"},
        {0}};
    const opts_cmd cmd = {.name = "bench reward", .about = "reward-server throughput, videos/s, batched and unbatched", .opts = opts};
    int rc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (rc != OPTS_OK) return opts_exit_status(rc);
    if (!o.inflight) o.inflight = 2 * o.threads;
    reward_server_config c;
    reward_server_config_default(&c);
    if (reward_server_parse_scorers(&c, o.scorers) != 0)
        return opts_exit_status(opts_fail(&cmd, stderr, "%s", core_last_error()));
    return bench_reward(&o);
}

static int bench_sync_cmd(int argc, char **argv) {
    bench_sync_opts o = {.preset = "tiny", .bucket_mib = 256, .workers = 1, .syncs = 3};
    const opts_spec opts[] = {
        {.name = "preset", .type = OPTS_STRING, .str = &o.preset, .meta = "NAME",
         .help = "model shape (default tiny; wan2.1-t2v-1.3b: 5.7 GB here and a staged copy per worker)"},
        {.name = "bucket-mib", .type = OPTS_INT, .i = &o.bucket_mib, .min = 1, .max = 4096, .meta = "N",
         .help = "bucket size, as parallel.sync_bucket_mib (default 256)"},
        {.name = "workers", .type = OPTS_INT, .i = &o.workers, .min = 1, .max = 64, .meta = "K",
         .help = "worker processes (default 1)"},
        {.name = "syncs", .type = OPTS_INT, .i = &o.syncs, .min = 1, .max = 1000, .meta = "N",
         .help = "timed syncs (default 3)"},
        {.name = "ipc", .type = OPTS_FLAG, .flag = &o.ipc,
         .help = "the same-host IPC path on the emulated device (shared memory), not buckets"},
        {.name = "ipc-host", .type = OPTS_FLAG, .flag = &o.ipc_host,
         .help = "with --ipc: workers without device weights, copying into a host staging copy (the path before "
                 "device-to-device)"},
        {0}};
    const opts_cmd cmd = {.name = "bench sync", .about = "the weight sync to rollout worker processes", .opts = opts};
    int rc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (rc != OPTS_OK) return opts_exit_status(rc);
    return bench_sync(&o);
}

static int bench_clip_cmd(int argc, char **argv) {
    bench_clip_opts o = {.model = NULL, .batch = 8, .reps = 3, .threads = 0};
    const char *tower = "both", *torch = NULL;
    const opts_spec opts[] = {
        {.name = "model", .type = OPTS_STRING, .str = &o.model, .meta = "DIR", .required = 1,
         .help = "a CLIP folder: transformers CLIPModel (config.json) or open_clip (open_clip_config.json)"},
        {.name = "batch", .type = OPTS_INT, .i = &o.batch, .min = 1, .max = 4096, .meta = "B",
         .help = "images (and prompts) per call (default 8)"},
        {.name = "reps", .type = OPTS_INT, .i = &o.reps, .min = 1, .max = 64, .meta = "N",
         .help = "timed calls after one warm-up call (default 3); the figure is the median"},
        {.name = "threads", .type = OPTS_INT, .i = &o.threads, .min = 1, .max = 4096, .meta = "N",
         .help = "OpenMP (and OpenBLAS) threads (default: OMP_NUM_THREADS or all cores)"},
        {.name = "tower", .type = OPTS_STRING, .str = &tower, .meta = "image|text|both",
         .help = "the towers timed (default both)"},
        {.name = "torch", .type = OPTS_STRING, .str = &torch, .meta = "FILE",
         .help = "PyTorch's figures from scripts/bench_torch.py --clip DIR --json FILE, printed beside vgrpo's"},
        {0}};
    const opts_cmd cmd = {.name = "bench clip", .about = "CLIP image and text towers: images/s, texts/s, GFLOP/s",
                          .opts = opts};
    int rc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (rc != OPTS_OK) return opts_exit_status(rc);
    o.image = !strcmp(tower, "image") || !strcmp(tower, "both");
    o.text = !strcmp(tower, "text") || !strcmp(tower, "both");
    if (!o.image && !o.text)
        return opts_exit_status(opts_fail(&cmd, stderr, "--tower: expected image, text or both, got \"%s\"", tower));
    if (torch && bench_torch_load(torch)) return 1;
    return bench_clip(&o);
}

/* `vgrpo bench <name> [options]`: argv[0] is "bench". */
int cmd_bench(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        int help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
        if (argc < 2) fprintf(stderr, "vgrpo bench: NAME is required\n\n");
        else if (!help)
            fprintf(stderr, "vgrpo bench: unknown option \"%s\" (the benchmark's NAME comes first)\n\n", argv[1]);
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    for (size_t i = 0; i < N_BENCHES; i++)
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].parse ? benches[i].parse(argc - 1, argv + 1)
                                    : bench_common_cmd(&benches[i], argc - 1, argv + 1);
    fprintf(stderr, "vgrpo bench: unknown benchmark \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
