/* bench/bench_text_vae.c — `vgrpo bench vae` and `vgrpo bench umt5`: the two forward-only models on the path from
 * prompt to pixels, timed beside PyTorch (scripts/bench_torch.py --vae / --umt5, same shapes and thread count).
 *
 *   vae:  AutoencoderKLWan.decode of ONE latent frame at the real Wan 2.1 size: latents F32 [1, 16, 1, 60, 104]
 *         -> video [1, 3, 1, 480, 832], with the real Wan 2.1 VAE config (diffusers' defaults: base_dim 96, z_dim 16,
 *         dim_mult [1, 2, 4, 4], num_res_blocks 2, attn_scales [], temperal_downsample [False, True, True]) and
 *         random weights built in memory (no checkpoint). Reports seconds per frame, the decoder's weight bytes,
 *         the decode state (feature cache + scratch, vae_state_bytes) and the process's peak resident set size.
 *   umt5: UMT5EncoderModel forward of one 512-token prompt (batch 1, no padding) at a small config: vocab 32128,
 *         d_model 512, 4 layers, 8 heads, d_kv 64, d_ff 1024, 32 buckets, max distance 128. The random weights are
 *         written as a transformers folder (config.json + model.safetensors, F32) in a temporary folder under
 *         $TMPDIR (default /tmp), loaded with t5_load and removed afterwards. Reports milliseconds per prompt.
 *         --device cuda (bench_device_umt5): the same encoder on the device against the CPU, a padded batch of 2.
 *
 * Random weights: weights uniform with variance 1/fan_in (so activations stay O(1) and no denormals or
 * non-finite values distort the timing), biases 0, norm gains 1; the values do not change the work done.
 * Each figure is the median of several timed runs after one warm-up run (--quick: one timed run, no warm-up
 * for the VAE, whose first run then includes allocating the decode state).
 * Uses model/vae/wan_vae_internal.h on purpose: it builds the decoder from a config without a checkpoint, exactly
 * as vae_load does before reading the weights, so the numerics are those of the loaded model. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/text/umt5.h"
#include "model/vae/wan_vae.h"
#include "model/vae/wan_vae_internal.h"


/* Uniform in [-a, a), a deterministic stream per seed (64-bit LCG, top 24 bits). */
static void fill_uniform(float *x, size_t n, unsigned long long seed, float a) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = a * (2.0f * (float)((s >> 40) * (1.0 / 16777216.0)) - 1.0f);
    }
}

static void fill_const(float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

/* Peak resident set size of this process so far, MiB. */
static double peak_rss_mib(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? -1.0 : ru.ru_maxrss / 1024.0;
}

static void set_threads(int threads) {
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* ---- VAE ---- */

/* The Wan 2.1 decoder from diffusers' default config, random weights (see the file comment). NULL on error. */
static vae_model *vae_random(void) {
    vae_model *m = calloc(1, sizeof *m);
    if (!m) {
        core_error("out of memory");
        return NULL;
    }
    /* every field at diffusers' AutoencoderKLWan defaults = the Wan 2.1 VAE */
    if (vae_config_parse(&m->cfg, "{\"base_dim\": 96, \"z_dim\": 16, \"dim_mult\": [1, 2, 4, 4], "
                                  "\"num_res_blocks\": 2, \"attn_scales\": [], "
                                  "\"temperal_downsample\": [false, true, true]}",
                         "bench vae config") ||
        vae_build(m))
        goto fail;
    m->params = malloc(m->nfloats * sizeof(float));
    if (!m->params) {
        core_error("bench vae: out of memory for %zu parameters", m->nfloats);
        goto fail;
    }
    for (int i = 0; i < m->nparams; i++) {
        const vae_param *p = &m->table[i];
        size_t n = 1, fan_in = 1;
        for (int d = 0; d < p->ndim; d++) n *= (size_t)p->shape[d];
        for (int d = 1; d < p->ndim; d++) fan_in *= (size_t)p->shape[d];
        float *x = m->params + p->offset;
        if (ends_with(p->name, ".bias"))
            fill_const(x, n, 0.0f);
        else if (ends_with(p->name, "gamma") || p->ndim < 2)
            fill_const(x, n, 1.0f);
        else
            fill_uniform(x, n, (unsigned long long)i + 1, sqrtf(3.0f / (float)fan_in));
    }
    return m;
fail:
    vae_free(m);
    return NULL;
}

int bench_vae(int threads, int quick) {
    set_threads(threads);
    const int nt = omp_get_max_threads(), reps = quick ? 1 : 3;
    const int z = 16, T = 1, h = 60, w = 104;
    float *lat = NULL, *vid = NULL;
    vae_model *m = vae_random();
    if (!m) goto fail;
    const int F = vae_frames_out(m, T), s = vae_spatial_factor(m), C = vae_video_channels(m);
    lat = malloc((size_t)z * T * h * w * sizeof *lat);
    vid = malloc((size_t)C * F * h * s * w * s * sizeof *vid);
    if (!lat || !vid) {
        core_error("out of memory for latents / video");
        goto fail;
    }
    fill_uniform(lat, (size_t)z * T * h * w, 99, 1.7320508f); /* unit variance, as the DiT's latents */
    printf("vgrpo bench vae: %d thread%s; Wan 2.1 VAE decoder (base_dim 96, z_dim 16, dim_mult [1,2,4,4], "
           "num_res_blocks 2, attn_scales [], temperal_downsample [F,T,T]), random weights, %.1f M parameters\n",
           nt, nt == 1 ? "" : "s", m->nfloats * 1e-6);
    printf("latents [1, %d, %d, %d, %d] -> video [1, %d, %d, %d, %d]; %s\n", z, T, h, w, C, F, h * s, w * s,
           quick ? "one timed run (no warm-up)" : "median of 3 runs after one warm-up run");
    fflush(stdout);
    double t[8];
    for (int r = quick ? 0 : -1; r < reps; r++) {
        double t0 = omp_get_wtime();
        if (vae_decode(m, lat, 1, z, T, h, w, vid)) goto fail;
        if (r >= 0) t[r] = omp_get_wtime() - t0;
    }
    const double sec = bench_median(t, reps);
    double sum = 0;
    for (size_t i = 0; i < (size_t)C * F * h * s * w * s; i++) sum += vid[i];
    printf("\n%-34s %12s %12s %12s %12s\n", "", "s / frame", "weights MiB", "state MiB", "peak RSS MiB");
    printf("%-34s %12.2f %12.1f %12.1f %12.1f\n", "vgrpo vae_decode (1 latent frame)", sec / F,
           m->nfloats * 4.0 / 1048576.0, vae_state_bytes(m) / 1048576.0, peak_rss_mib());
    printf("(state = feature cache %.1f MiB + scratch; video mean %.4f, a checksum)\n",
           vae_cache_bytes(m) / 1048576.0, sum / ((double)C * F * h * s * w * s));
    const double tv = bench_torch_figure("vae", "decode", "s_per_frame");
    if (tv > 0) {
        bench_torch_describe();
        printf("%-34s %12.2f   (vgrpo %.2fx PyTorch's speed)\n", "torch AutoencoderKLWan.decode", tv, tv / (sec / F));
    } else {
        printf("PyTorch on the same shape: python scripts/bench_torch.py --vae --threads %d\n", nt);
    }
    free(lat), free(vid);
    vae_free(m);
    return 0;
fail:
    fprintf(stderr, "vgrpo bench vae: %s\n", core_last_error());
    free(lat), free(vid);
    vae_free(m);
    return 1;
}

/* ---- umT5 ---- */

enum { U_VOCAB = 32128, U_D = 512, U_LAYERS = 4, U_HEADS = 8, U_DKV = 64, U_FF = 1024, U_BUCKETS = 32, U_MAXD = 128 };

/* Writes a random umT5 encoder (the config above) as a transformers folder in dir. t5_q: q's weights with T5's
 * initialisation, variance 1 / (fan_in x d_kv) (transformers T5PreTrainedModel._init_weights), so that the unscaled
 * scores q.k are O(1) as in a trained T5; 0: variance 1 / fan_in like every linear (the timing bench: the values do
 * not change the work; its scores are then ~sqrt(d_kv) large and its softmax nearly one-hot, where bf16's rounding
 * of q and k moves the outputs by far more than in a real encoder). Returns 0 / -1. */
static int umt5_write_random(const char *dir, int t5_q) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return core_error("%s: cannot create", path);
    fprintf(f,
            "{\"architectures\": [\"UMT5EncoderModel\"], \"model_type\": \"umt5\", \"vocab_size\": %d, "
            "\"d_model\": %d, \"d_kv\": %d, \"d_ff\": %d, \"num_layers\": %d, \"num_heads\": %d, "
            "\"relative_attention_num_buckets\": %d, \"relative_attention_max_distance\": %d, "
            "\"layer_norm_epsilon\": 1e-06, \"feed_forward_proj\": \"gated-gelu\"}\n",
            U_VOCAB, U_D, U_DKV, U_FF, U_LAYERS, U_HEADS, U_BUCKETS, U_MAXD);
    if (fclose(f)) return core_error("%s: write failed", path);

    const size_t HK = (size_t)U_HEADS * U_DKV;
    const size_t per = 4 * HK * U_D + (size_t)U_BUCKETS * U_HEADS + 2 * U_D + 3 * (size_t)U_FF * U_D;
    const size_t total = (size_t)U_VOCAB * U_D + per * U_LAYERS + U_D;
    float *buf = malloc(total * sizeof *buf);
    st_writer *wr = st_writer_new();
    char (*names)[96] = calloc(10 * U_LAYERS + 2, sizeof *names);
    int rc = -1, k = 0;
    if (!buf || !wr || !names) {
        core_error("bench umt5: out of memory for %zu parameters", total);
        goto done;
    }
    float *p = buf;
#define ADD(nm, rows, cols, kind)                                                                                \
    do {                                                                                                         \
        int64_t shp[2] = {(rows), (cols)};                                                                       \
        size_t n_ = (size_t)(rows) * (cols);                                                                     \
        if ((kind) == 0) fill_uniform(p, n_, (unsigned long long)k + 7, sqrtf(3.0f / ((float)(cols) * qs)));     \
        else if ((kind) == 1) fill_const(p, n_, 1.0f);                                                           \
        else fill_uniform(p, n_, (unsigned long long)k + 7, 1.0f);                                               \
        if (st_writer_add(wr, (nm), CORE_F32, 2, shp, p)) goto done;                                             \
        p += n_;                                                                                                 \
        k++;                                                                                                     \
    } while (0)
    /* embedding rows ~ U(-1, 1) (kind 2); linear weights variance 1/fan_in (kind 0); RMSNorm gains 1 (kind 1) */
    {
        const float qs = 1.0f;
        ADD("shared.weight", U_VOCAB, U_D, 2);
    }
    static const char *lin[] = {"0.SelfAttention.q.weight", "0.SelfAttention.k.weight", "0.SelfAttention.v.weight",
                                "0.SelfAttention.o.weight", "1.DenseReluDense.wi_0.weight",
                                "1.DenseReluDense.wi_1.weight", "1.DenseReluDense.wo.weight"};
    const int rows[] = {(int)HK, (int)HK, (int)HK, U_D, U_FF, U_FF, U_D};
    const int cols[] = {U_D, U_D, U_D, (int)HK, U_D, U_D, U_FF};
    for (int l = 0; l < U_LAYERS; l++) {
        for (int j = 0; j < 7; j++) {
            snprintf(names[k], sizeof names[k], "encoder.block.%d.layer.%s", l, lin[j]);
            const float qs = t5_q && j == 0 ? (float)U_DKV : 1.0f;
            ADD(names[k], rows[j], cols[j], 0);
        }
        snprintf(names[k], sizeof names[k], "encoder.block.%d.layer.0.SelfAttention.relative_attention_bias.weight", l);
        const float qs = 1.0f;
        ADD(names[k], U_BUCKETS, U_HEADS, 2);
        for (int j = 0; j < 2; j++) {
            snprintf(names[k], sizeof names[k], "encoder.block.%d.layer.%d.layer_norm.weight", l, j);
            int64_t shp[1] = {U_D};
            fill_const(p, U_D, 1.0f);
            if (st_writer_add(wr, names[k], CORE_F32, 1, shp, p)) goto done;
            p += U_D, k++;
        }
    }
    {
        int64_t shp[1] = {U_D};
        fill_const(p, U_D, 1.0f);
        if (st_writer_add(wr, "encoder.final_layer_norm.weight", CORE_F32, 1, shp, p)) goto done;
    }
#undef ADD
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = st_writer_write(wr, path);
done:
    st_writer_free(wr);
    free(names);
    free(buf);
    return rc;
}

static void umt5_remove(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int bench_umt5(int threads, int quick) {
    set_threads(threads);
    const int nt = omp_get_max_threads(), reps = quick ? 1 : 5, S = 512;
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/vgrpo-bench-umt5-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "vgrpo bench umt5: cannot create a temporary folder %s\n", dir);
        return 1;
    }
    t5_encoder *e = NULL;
    int32_t *ids = malloc(S * sizeof *ids);
    float *out = malloc((size_t)S * U_D * sizeof *out);
    if (!ids || !out) {
        core_error("out of memory");
        goto fail;
    }
    if (umt5_write_random(dir, 0) || !(e = t5_load(dir))) goto fail;
    umt5_remove(dir);
    unsigned long long s = 12345;
    for (int i = 0; i < S; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((s >> 33) % U_VOCAB);
    }
    printf("vgrpo bench umt5: %d thread%s; umT5 encoder, vocab %d, d_model %d, %d layers, %d heads, d_kv %d, "
           "d_ff %d (gated-gelu), %d buckets / max distance %d, random weights\n",
           nt, nt == 1 ? "" : "s", U_VOCAB, U_D, U_LAYERS, U_HEADS, U_DKV, U_FF, U_BUCKETS, U_MAXD);
    printf("one prompt of %d tokens (batch 1, no padding); %s\n", S,
           quick ? "one timed run after one warm-up run" : "median of 5 runs after one warm-up run");
    double t[8];
    for (int r = -1; r < reps; r++) {
        double t0 = omp_get_wtime();
        if (t5_forward(e, ids, NULL, 1, S, out)) goto fail;
        if (r >= 0) t[r] = omp_get_wtime() - t0;
    }
    double sum = 0;
    for (size_t i = 0; i < (size_t)S * U_D; i++) sum += out[i] * out[i];
    printf("\n%-34s %10s %12s\n", "", "ms", "peak RSS MiB");
    printf("%-34s %10.1f %12.1f\n", "vgrpo t5_forward (512 tokens)", bench_median(t, reps) * 1e3, peak_rss_mib());
    printf("(output mean square %.4f, a checksum)\n", sum / ((double)S * U_D));
    const double tu = bench_torch_figure("umt5", "encode", "ms"), mu = bench_median(t, reps) * 1e3;
    if (tu > 0) {
        bench_torch_describe();
        printf("%-34s %10.1f   (vgrpo %.2fx PyTorch's speed)\n", "torch UMT5EncoderModel (512 tok)", tu, tu / mu);
    } else {
        printf("PyTorch on the same config: python scripts/bench_torch.py --umt5 --threads %d\n", nt);
    }
    t5_free(e);
    free(ids), free(out);
    return 0;
fail:
    fprintf(stderr, "vgrpo bench umt5: %s\n", core_last_error());
    umt5_remove(dir);
    t5_free(e);
    free(ids), free(out);
    return 1;
}

int bench_device_umt5(int quick) {
    int emu = 0;
    const k_dev_ops *dev = bench_open_device("umt5", &emu);
    if (!dev) return 1;
    enum { B = 2 };
    const int S = emu ? 64 : 512, real[B] = {S, emu ? 40 : 300}, reps = quick || emu ? 1 : 5;
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/vgrpo-bench-umt5-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "vgrpo bench umt5: cannot create a temporary folder %s\n", dir);
        return 1;
    }
    t5_encoder *cpu = NULL, *gpu = NULL;
    int32_t *ids = malloc((size_t)B * S * sizeof *ids), *mask = malloc((size_t)B * S * sizeof *mask);
    float *a = malloc((size_t)B * S * U_D * sizeof *a), *b = malloc((size_t)B * S * U_D * sizeof *b);
    int rc = 1;
    if (!ids || !mask || !a || !b) {
        core_error("out of memory");
        goto done;
    }
    if (umt5_write_random(dir, 1) || !(cpu = t5_load(dir)) || !(gpu = t5_load(dir)) || t5_to_device(gpu, dev))
        goto done;
    unsigned long long s = 777;
    for (int i = 0; i < B * S; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = (int32_t)((s >> 33) % U_VOCAB), mask[i] = i % S < real[i / S];
    }
    printf("vgrpo bench umt5 --device cuda: umT5 encoder, d_model %d, %d layers, %d heads, d_kv %d, d_ff %d, random "
           "weights (q with T5's initialisation); %d prompts padded to %d tokens (%d and %d real)\n",
           U_D, U_LAYERS, U_HEADS, U_DKV, U_FF, B, S, real[0], real[1]);
    double tc = 0, td = 1e30;
    double t0 = omp_get_wtime();
    if (t5_forward(cpu, ids, mask, B, S, b)) goto done;
    tc = omp_get_wtime() - t0;
    for (int r = 0; r < reps; r++) { /* the first run includes the device's first-use costs */
        t0 = omp_get_wtime();
        if (t5_forward(gpu, ids, mask, B, S, a)) goto done;
        const double t = omp_get_wtime() - t0;
        td = t < td ? t : td;
    }
    double num = 0, den = 0;
    for (int p = 0; p < B; p++)
        for (size_t i = (size_t)p * S * U_D; i < ((size_t)p * S + real[p]) * U_D; i++) {
            const double d = fabs((double)a[i] - b[i]);
            if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
            if (fabs(b[i]) > den) den = fabs(b[i]);
        }
    const double rel = num / den, tol = 2e-2;
    printf("%-34s %10.1f ms\n", "cpu t5_forward (fp32)", tc * 1e3);
    printf("%-34s %10.1f ms%s\n", emu ? "emulated t5_forward (bf16)" : "device t5_forward (bf16)", td * 1e3,
           emu ? "  (EMULATED: not a GPU figure)" : "");
    printf("umt5 device vs cpu: max|a-b| %.3g, max|a-b|/max|b| %.3g (tolerance %.0e, bf16 weights and activations, "
           "fp32 residual): %s\n", num, rel, tol, rel <= tol ? "PASS" : "FAIL");
    rc = rel <= tol ? 0 : 2; /* 2: ran, above the tolerance (said above) */
done:
    if (rc == 1) fprintf(stderr, "vgrpo bench umt5: %s\n", core_last_error());
    umt5_remove(dir);
    t5_free(cpu), t5_free(gpu);
    free(ids), free(mask), free(a), free(b);
    return rc ? 1 : 0;
}
