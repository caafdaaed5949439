/* bench/bench.h — the benchmarks behind `vgrpo bench <name>` (cli/cmd_bench.c parses their options and calls
 * these). Each prints its table to stdout and its errors to stderr, and returns the process exit status: 0, or 1
 * on failure (out of memory, a server that did not answer, a wrong reply). Benchmarks are commands, never timed
 * tests (docs/design.md section 9).
 *
 * threads: OpenMP (and OpenBLAS) threads for the process; 0 keeps the default (OMP_NUM_THREADS or all cores).
 * quick: a smoke run (one timed run per figure, the slowest shapes left out); see each file's top comment. */
#ifndef BENCH_BENCH_H
#define BENCH_BENCH_H

#include <stddef.h>

#include "core/recipe.h"
#include "model/clip/clip_model.h"

/* The fp32 FMA ceiling of this machine: a register-only loop per thread at every vector width it runs, the best
 * team figure printed as the peak (bench/bench_peak.c). */
int bench_peak(int threads, int quick);
/* The same ceiling measured quietly (about 0.1 s, once per process, at the current OpenMP thread count), GFLOP/s;
 * bench_pct_peak: 100 * gflops / that ceiling. */
double bench_peak_gflops(void);
double bench_pct_peak(double gflops);

/* sgemm (k_cpu_gemm and cblas_sgemm) and CPU attention GFLOP/s, and attention over the best sgemm
 * (bench/bench_kernels.c). */
int bench_kernels(int threads, int quick);

/* One Wan block at the Wan 2.1-1.3B shape and at tiny: forward and forward+backward ms and GFLOP/s
 * (bench/bench_dit.c). */
int bench_dit(int threads, int quick);
/* `vgrpo bench dit --profile`: the same blocks' forward and backward (stored activations) as a per-op time table:
 * each GEMM with its shape and transposition, attention forward/backward, every elementwise pass; per iteration. */
int bench_dit_profile(int threads, int quick);

/* `vgrpo bench gemm|attention|dit --device cuda` (bench/bench_device.c): cuBLASLt bf16 GEMM TFLOP/s (the 8192^3
 * row is the measured bf16 peak MFU figures are taken against), the cuDNN SDPA forward and forward+backward TFLOP/s, and
 * the device Wan DiT's forward and forward+backward with MFU against that peak. Each gets its device from
 * k_cuda_device and refuses (exit status 1, one line on stderr) without one; VGRPO_EMULATE_DEVICE=1 (tests only) runs
 * the emulated device at tiny shapes, every row labelled emulated. */
int bench_device_gemm(int quick);
/* The device of `vgrpo bench <name> --device cuda`: the GPU's table, the emulated one under VGRPO_EMULATE_DEVICE=1
 * (*emulated 1; tests only), or NULL after printing the refusal (bench/bench_device.c). */
struct k_dev_ops;
const struct k_dev_ops *bench_open_device(const char *name, int *emulated);
int bench_device_attention(int quick);
int bench_device_dit(int quick);

/* The Wan 2.1 VAE decoding one latent frame at 480 x 832, and a small umT5 on one 512-token prompt
 * (bench/bench_text_vae.c). */
int bench_vae(int threads, int quick);
int bench_umt5(int threads, int quick);
/* `vgrpo bench umt5 --device cuda`: the same encoder on the device (model/text/umt5.h t5_to_device) against the CPU
 * on a padded batch of 2 prompts (512 and 300 real tokens; emulated: 64 and 40): ms on each, max |a - b| and
 * max |a - b| / max |b| over the real tokens, and a line "umt5 device vs cpu: ... PASS" (FAIL and exit status 1
 * above the bf16 tolerance 2e-2). scripts/gpu_check.sh's umt5 row runs it. */
int bench_device_umt5(int quick);

/* `vgrpo bench reward`'s settings (bench/bench_reward.c). */
typedef struct {
    const char *scorers; /* NAME[:WEIGHT],... as `vgrpo reward-server --scorers` (checked by the caller) */
    int videos;          /* videos scored per row, >= 1 */
    int threads;         /* the server's scoring threads, >= 1 */
    int batch;           /* videos per request in the batched rows, >= 1 */
    int inflight;        /* requests in flight in the pipelined rows, >= 1 */
    const char *models;  /* NULL, or the learned scorers' folders "NAME=DIR,..." (reward-server --models) */
    const char *frames;  /* NULL, or the frames a learned scorer scores (reward-server --frames) */
} bench_reward_opts;

/* Reward-server throughput: starts `vgrpo reward-server` (this executable, /proc/self/exe) on an ipc socket in a
 * fresh folder under /tmp, scores o->videos videos batched and unbatched, one and o->inflight requests in flight,
 * and checks every reply against in-process scoring. With o->models (learned scorers), the models are loaded in
 * this process too, and only the batched reward-client row runs. */
int bench_reward(const bench_reward_opts *o);

/* `vgrpo bench sync`'s settings (bench/bench_sync.c). */
typedef struct {
    const char *preset; /* a model preset (wan_config_preset): its shape, random weights */
    int bucket_mib;     /* parallel.sync_bucket_mib */
    int workers;        /* worker processes, 1..64 */
    int syncs;          /* timed syncs */
    int ipc;            /* the same-host path on the emulated device instead of buckets */
    int ipc_host;       /* with ipc: workers without device weights (the copy into a host staging copy) */
} bench_sync_opts;

/* The weight sync's bytes, seconds and GB/s per sync: ctl_sync_weights to o->workers forked processes answering
 * with rollout_worker_handle over an ipc:// socket. */
int bench_sync(const bench_sync_opts *o);

/* `vgrpo bench clip`'s settings (bench/bench_clip.c). */
typedef struct {
    const char *model; /* a CLIP folder clip_load takes */
    int batch;         /* images (and prompts) per call, >= 1 */
    int reps;          /* timed calls after one warm-up call, 1 .. 64 */
    int threads;       /* OpenMP (and OpenBLAS) threads; 0 keeps the default */
    int image, text;   /* 1: time that tower */
} bench_clip_opts;

/* The CLIP image and text towers' images/s and texts/s with GFLOP/s and % of peak, PyTorch's beside them when
 * bench_torch_load read a "clip" section. bench_clip_image_flops / _text_flops: the FLOPs counted per image and per
 * prompt of S tokens (the formula at the top of bench/bench_clip.c). */
int bench_clip(const bench_clip_opts *o);
double bench_clip_image_flops(const clip_config *c);
double bench_clip_text_flops(const clip_config *c, int S);

/* One GRPO step of recipe r (read from recipe_path, its model folder present), profiled: 1 warm-up step, then
 * `steps` timed ones (<= 64); the median step by phase (rollout, decode, reward, train) and op class, then the `top`
 * largest op rows (bench/bench_step.c). */
int bench_step(const char *recipe_path, const core_recipe *r, int steps, int top);

/* PyTorch's figures of the same benchmarks (bench/bench_torch_ref.c): bench_torch_load reads the JSON file of
 * `scripts/bench_torch.py --json FILE` (0, or -1 with a line on stderr); bench_torch_figure(section, key, field) is a
 * figure from it ("dit", "tiny block", "fb_ms"; "umt5", "encode", "ms"; "vae", "decode", "s_per_frame"), or -1 when
 * absent or nothing was loaded; bench_torch_describe prints the torch version and threads when a file was loaded. */
int bench_torch_load(const char *path);
double bench_torch_figure(const char *section, const char *key, const char *field);
void bench_torch_describe(void);

/* The CPU's name from /proc/cpuinfo ("model name"), or "unknown CPU", into out (cap bytes). */
void bench_cpu_name(char *out, size_t cap);

/* The median of t[0..n) (sorted in place; n >= 1): the figure every benchmark reports. */
double bench_median(double *t, int n);

#endif
