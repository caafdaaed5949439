/* tests/test_umt5_dev.c — the umT5 encoder on the emulated device (kernels/cuda/emu/k_emu.h: the bodies of
 * kernels/body/kb_t5.h, bf16 storage as on the GPU) against the fp32 CPU encoder and transformers' fixture; the
 * bodies against the CPU table's entries; the refusals; the device bytes against what the encoder allocates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/safetensors.h"
#include "kernels/body/kb_t5.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dev_table.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/text/tiny_text.h"
#include "model/text/umt5.h"
#include "tests/test.h"

#define TE_DIR "tests/fixtures/text_tiny/text_encoder"
#define IO_PATH "tests/fixtures/text_umt5_io.safetensors"

/* max |a - b| into *abs_err; returns max |a - b| / max |b|. */
static double errs(const float *a, const float *b, size_t n, double *abs_err) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    if (abs_err) *abs_err = num;
    return num / den;
}

static uint64_t lcg(uint64_t *s) { return *s = *s * 6364136223846793005ULL + 1442695040888963407ULL; }
static float unif(uint64_t *s) { return (float)((lcg(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* A random small umT5 (d_model 64: 4 heads of d_kv 16, d_ff 128, 2 layers, 32 buckets, max distance 128) on the CPU
 * and on the emulated device; a padded batch of 3 prompts x 40 tokens (relative positions up to 39: the log buckets
 * too), the third prompt all padding. bf16 weights and activations against fp32: max|a-b|/max|b| <= 2e-2. */
TEST(t5_dev_encode_matches_cpu) {
    const char *dir = test_tmpdir();
    REQUIRE_OK(t5_tiny_write(dir, 64, 300, 11));
    t5_encoder *cpu = t5_load(dir), *dev = t5_load(dir);
    REQUIRE(cpu && dev);
    REQUIRE_OK(t5_to_device(dev, &k_emu_ops));
    CHECK(t5_device_name(cpu) == NULL && !strcmp(t5_device_name(dev), "emulated"));
    enum { B = 3, S = 40, D = 64 };
    int32_t ids[B * S], mask[B * S];
    uint64_t s = 5;
    for (int i = 0; i < B * S; i++) ids[i] = (int32_t)(lcg(&s) >> 33) % 300, mask[i] = 1;
    for (int j = 23; j < S; j++) mask[S + j] = 0; /* prompt 1: 23 tokens */
    for (int j = 0; j < S; j++) mask[2 * S + j] = 0;
    float *a = malloc(sizeof(float) * B * S * D), *b = malloc(sizeof(float) * B * S * D);
    REQUIRE(a && b);
    REQUIRE_OK(t5_forward(dev, ids, mask, B, S, a));
    REQUIRE_OK(t5_forward(cpu, ids, mask, B, S, b));
    double ab, ab1;
    const double rel = errs(a, b, (size_t)B * S * D, &ab), rel1 = errs(a + S * D, b + S * D, 23 * D, &ab1);
    printf("  umT5 emulated device vs CPU: max|a-b| %.3g, max|a-b|/max|b| %.3g (padded prompt's real rows %.3g)\n",
           ab, rel, rel1);
    CHECK(rel <= 2e-2 && rel1 <= 2e-2);
    CHECK(rel > 0); /* bf16 is not fp32: the device path did run */
    /* the mask reaches the device: without it prompt 1's real rows move by far more than bf16's rounding */
    float *c = malloc(sizeof(float) * B * S * D);
    REQUIRE(c);
    REQUIRE_OK(t5_forward(dev, ids, NULL, B, S, c));
    CHECK(errs(c + S * D, a + S * D, 23 * D, NULL) > 0.1);
    /* batch invariance on the device (every row's chain is its own): prompt 1 alone, bit for bit */
    REQUIRE_OK(t5_forward(dev, ids + S, mask + S, 1, S, c));
    CHECK(memcmp(c, a + S * D, sizeof(float) * S * D) == 0);
    free(a), free(b), free(c);
    t5_free(cpu), t5_free(dev);
}

/* transformers' UMT5EncoderModel on the fixture (scripts/fixtures_text.py), the encoder on the emulated device. */
TEST(t5_dev_encode_matches_transformers) {
    t5_encoder *e = t5_load(TE_DIR);
    REQUIRE(e);
    REQUIRE_OK(t5_to_device(e, &k_emu_ops));
    st_file *f = st_open(IO_PATH);
    REQUIRE(f);
    core_tensor ti, tm;
    REQUIRE_OK(st_get(f, "input_ids", &ti));
    REQUIRE_OK(st_get(f, "attention_mask", &tm));
    REQUIRE(core_tensor_numel(&ti) == 24 && ti.dtype == CORE_I64 && tm.dtype == CORE_I64);
    int32_t ids[24], mask[24];
    const int64_t *i64 = ti.data, *m64 = tm.data;
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)i64[i], mask[i] = (int32_t)m64[i];
    core_tensor_free(&ti), core_tensor_free(&tm);
    float out[2 * 12 * 32], ref[2 * 12 * 32];
    REQUIRE_OK(st_read_f32(f, "hidden_states", ref, 2 * 12 * 32));
    REQUIRE_OK(t5_forward(e, ids, mask, 2, 12, out));
    double ab;
    const double rel = errs(out, ref, 2 * 12 * 32, &ab);
    printf("  umT5 emulated device vs transformers: max|a-b| %.3g, max|a-b|/max|b| %.3g\n", ab, rel);
    CHECK(rel <= 2e-2);
    st_close(f);
    t5_free(e);
}

/* The bodies on fp32 views against the CPU table's entries: the gated GELU bit for bit; attention's fp32 softmax
 * within 1e-5 of the CPU's double one (the scores are the same chains). */
TEST(t5_dev_bodies_match_cpu_table) {
    enum { B = 2, S = 19, H = 3, Dk = 8, I = H * Dk, NB = 32 };
    const size_t n = (size_t)B * S * I;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o1 = malloc(n * 4), *o2 = malloc(n * 4);
    float rel[NB * H], sc[S];
    int bucket[2 * S - 1];
    int32_t mask[B * S];
    uint64_t s = 9;
    for (size_t i = 0; i < n; i++) q[i] = 2 * unif(&s), k[i] = 2 * unif(&s), v[i] = unif(&s);
    for (int i = 0; i < NB * H; i++) rel[i] = unif(&s);
    for (int r = 0; r < 2 * S - 1; r++) bucket[r] = t5_relative_bucket(r - (S - 1), NB, 128);
    for (int i = 0; i < B * S; i++) mask[i] = i % S < 11 || i < S;
    REQUIRE_OK(k_cpu_dev_ops.t5_attention(kb_out_f32(o1), kb_in_f32(q), kb_in_f32(k), kb_in_f32(v), rel, bucket, mask,
                                          B, S, H, Dk));
    kbh_t5_attention(kb_out_f32(o2), kb_in_f32(q), kb_in_f32(k), kb_in_f32(v), rel, bucket, mask, B, S, H, Dk, sc);
    const double e = errs(o2, o1, n, NULL);
    printf("  t5 attention body (fp32 softmax) vs the CPU's (double): %.3g\n", e);
    CHECK(e <= 1e-5);
    REQUIRE_OK(k_cpu_dev_ops.t5_gated_gelu(kb_out_f32(o1), kb_in_f32(q), kb_in_f32(k), (int64_t)n));
    kbh_t5_gated_gelu(kb_out_f32(o2), kb_in_f32(q), kb_in_f32(k), (int64_t)n);
    CHECK(memcmp(o1, o2, n * 4) == 0);
    /* the CPU table's entry is the encoder's loop before the table: gelu_forward, then *= */
    k_cpu_gelu_forward(o2, q, (int64_t)n);
    for (size_t i = 0; i < n; i++) o2[i] *= k[i];
    CHECK(memcmp(o1, o2, n * 4) == 0);
    free(q), free(k), free(v), free(o1), free(o2);
}

/* Refusals with the reason named: a config the device's GEMM cannot take, a second copy, bad shapes and ids, a
 * sequence over the attention kernel's shared memory, bf16 views on the CPU table. */
TEST(t5_dev_refusals_name_the_problem) {
    const char *dir = test_tmpdir();
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/a", dir);
    REQUIRE_OK(t5_tiny_write(sub, 48, 100, 1)); /* 3 heads x 16, d_ff 96: fine */
    t5_encoder *e = t5_load(sub);
    REQUIRE(e);
    REQUIRE_OK(t5_to_device(e, &k_emu_ops));
    CHECK(t5_to_device(e, &k_emu_ops) == -1);
    CHECK_MSG(strstr(core_last_error(), "already on emulated") != NULL, "%s", core_last_error());
    int32_t ids[4] = {1, 2, 3, 100};
    float out[4 * 48];
    CHECK(t5_forward(e, ids, NULL, 1, 4, out) == -1);
    CHECK_MSG(strstr(core_last_error(), "token id 100") != NULL, "%s", core_last_error());
    CHECK(t5_forward(e, ids, NULL, 0, 4, out) == -1);
    CHECK_MSG(strstr(core_last_error(), "must be >= 1") != NULL, "%s", core_last_error());
    t5_free(e);
    /* d_model 12 (3 heads of 4, d_ff 24): the CPU encoder takes it, the device's bf16 GEMM rows do not */
    snprintf(sub, sizeof sub, "%s/b", dir);
    REQUIRE(mkdir(sub, 0755) == 0);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", sub);
    FILE *cf = fopen(path, "w");
    REQUIRE(cf);
    fputs("{\"vocab_size\": 10, \"d_model\": 12, \"d_kv\": 4, \"d_ff\": 24, \"num_layers\": 1, \"num_heads\": 3,"
          " \"feed_forward_proj\": \"gated-gelu\"}", cf);
    fclose(cf);
    static float wbuf[10 * 12 + 4 * 144 + 32 * 3 + 3 * 288 + 3 * 12];
    for (size_t i = 0; i < sizeof wbuf / sizeof *wbuf; i++) wbuf[i] = 0.01f * (float)(i % 17);
    st_writer *wr = st_writer_new();
    REQUIRE(wr);
    const struct {
        const char *name;
        int64_t r, c; /* c 0: a vector of r */
    } ts[] = {{"shared.weight", 10, 12},
              {"encoder.block.0.layer.0.SelfAttention.q.weight", 12, 12},
              {"encoder.block.0.layer.0.SelfAttention.k.weight", 12, 12},
              {"encoder.block.0.layer.0.SelfAttention.v.weight", 12, 12},
              {"encoder.block.0.layer.0.SelfAttention.o.weight", 12, 12},
              {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 32, 3},
              {"encoder.block.0.layer.0.layer_norm.weight", 12, 0},
              {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight", 24, 12},
              {"encoder.block.0.layer.1.DenseReluDense.wi_1.weight", 24, 12},
              {"encoder.block.0.layer.1.DenseReluDense.wo.weight", 12, 24},
              {"encoder.block.0.layer.1.layer_norm.weight", 12, 0},
              {"encoder.final_layer_norm.weight", 12, 0}};
    const float *wp = wbuf;
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        const int64_t shp[2] = {ts[i].r, ts[i].c};
        REQUIRE_OK(st_writer_add(wr, ts[i].name, CORE_F32, ts[i].c ? 2 : 1, shp, wp));
        wp += ts[i].r * (ts[i].c ? ts[i].c : 1);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", sub);
    REQUIRE_OK(st_writer_write(wr, path));
    st_writer_free(wr);
    REQUIRE(wp <= wbuf + sizeof wbuf / sizeof *wbuf);
    e = t5_load(sub);
    REQUIRE(e);
    CHECK(t5_to_device(e, &k_emu_ops) == -1);
    CHECK_MSG(strstr(core_last_error(), "d_model 12") && strstr(core_last_error(), "multiples of 8"), "%s",
              core_last_error());
    CHECK(t5_device_name(e) == NULL); /* nothing kept: still the CPU encoder */
    REQUIRE_OK(t5_forward(e, ids, NULL, 1, 3, out));
    t5_free(e);
    /* the table's own refusals */
    float f[64] = {0}, rel[32] = {0};
    int bucket[1] = {0};
    CHECK(k_emu_ops.t5_attention(kb_out_f32(f), kb_in_f32(f), kb_in_f32(f), kb_in_f32(f), rel, bucket, NULL, 1, 9000,
                                 1, 8) == -1);
    CHECK_MSG(strstr(core_last_error(), "S 9000") != NULL, "%s", core_last_error());
    CHECK(k_emu_ops.t5_attention(kb_out_f32(f), kb_in_f32(f), kb_in_f32(f), kb_in_f32(f), NULL, bucket, NULL, 1, 1, 1,
                                 8) == -1);
    CHECK_MSG(strstr(core_last_error(), "rel_bias") != NULL, "%s", core_last_error());
    kb_bf16 h[8];
    CHECK(k_cpu_dev_ops.t5_gated_gelu(kb_out_bf16(h), kb_in_f32(f), kb_in_f32(f), 8) == -1);
    CHECK_MSG(strstr(core_last_error(), "t5_gated_gelu") && strstr(core_last_error(), "bf16"), "%s", core_last_error());
}

/* t5_device_bytes (the device estimate's umT5 part, trainer/budget/) equals what t5_to_device and one forward ask
 * the emulated device for. */
TEST(t5_dev_bytes_equal_allocations) {
    const char *dir = test_tmpdir();
    REQUIRE_OK(t5_tiny_write(dir, 64, 120, 4));
    t5_encoder *e = t5_load(dir);
    REQUIRE(e);
    size_t held0, peak0, held1, peak1, held2, peak2;
    k_emu_mem_stats(&held0, &peak0);
    REQUIRE_OK(t5_to_device(e, &k_emu_ops));
    k_emu_mem_stats(&held1, &peak1);
    const t5_config *c = t5_get_config(e);
    CHECK_MSG(held1 - held0 == t5_device_bytes(c, 0, 0), "weights %zu, t5_device_bytes %zu", held1 - held0,
              t5_device_bytes(c, 0, 0));
    enum { B = 2, S = 7 };
    int32_t ids[B * S], mask[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = i + 1, mask[i] = 1;
    float out[B * S * 64];
    /* the forward's buffers all live at once (allocated first, freed at the end): the peak rises by exactly them,
     * when the emulated device's earlier peak is below (the tests before may have held more: then not checked) */
    REQUIRE_OK(t5_forward(e, ids, mask, B, S, out));
    k_emu_mem_stats(&held2, &peak2);
    CHECK(held2 == held1);
    if (peak1 <= held1 + (t5_device_bytes(c, B, S) - t5_device_bytes(c, 0, 0)))
        CHECK_MSG(peak2 - held0 == t5_device_bytes(c, B, S), "peak %zu, t5_device_bytes %zu", peak2 - held0,
                  t5_device_bytes(c, B, S));
    t5_free(e);
    k_emu_mem_stats(&held2, NULL);
    CHECK(held2 == held0);
}

/* model.text_device at --dry-run: a value other than auto / cpu refused naming the key; with model.device cuda the
 * device estimate counts umT5 under auto (the trainer's start-up phase and the worker's whole job) and not under
 * cpu. */
TEST(t5_dev_recipe_key_text_device) {
    static char out[1 << 16];
    const char *bin = test_vgrpo_bin(), *dir = test_tmpdir();
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.text_device=gpu --dry-run 2>&1", bin) !=
          0);
    CHECK_MSG(strstr(out, "model.text_device") && strstr(out, "auto|cpu"), "%s", out);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.device=cuda --set mode=colocated "
                     "--set model.path=%s/m --set model.init_preset=tiny --dry-run 2>&1", bin, dir) == 0);
    const char *w = strstr(out, "rollout worker, on its GPU");
    CHECK_MSG(w && strstr(w, "umT5 text encoder weights") && strstr(w, "the whole job"), "%s", out);
    CHECK(strstr(out, "start-up, freed before the DiT's") != NULL);
    /* the host estimate: the fp32 copy only at start-up (freed once uploaded), the tokenizer and staging after */
    CHECK_MSG(strstr(out, "text encoder (umT5) fp32 weights, freed once on the GPU") &&
              strstr(out, "text encoder (umT5) tokenizer + staging") && !strstr(out, "text encoder (umT5) + tokenizer"),
              "%s", out);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.device=cuda --set mode=colocated "
                     "--set model.path=%s/m --set model.init_preset=tiny --set model.text_device=cpu --dry-run 2>&1",
                     bin, dir) == 0);
    CHECK_MSG(strstr(out, "umT5 text encoder weights") == NULL, "%s", out);
    CHECK_MSG(strstr(out, "text encoder (umT5) + tokenizer") && !strstr(out, "freed once on the GPU"), "%s", out);
}

/* t5_to_device frees the host's fp32 weights (the forward reads the device copy only): t5_host_bytes falls from the
 * full copy to 0, the forward still matches an encoder uploaded the same way (already checked against the CPU
 * above), and a refused upload keeps the host copy. */
TEST(t5_dev_upload_frees_host_copy) {
    const char *dir = test_tmpdir();
    REQUIRE_OK(t5_tiny_write(dir, 64, 120, 4));
    t5_encoder *e = t5_load(dir), *f = t5_load(dir);
    REQUIRE(e && f);
    const t5_config *c = t5_get_config(e);
    const size_t full = t5_host_bytes(e);
    CHECK_MSG(full >= t5_param_floats(c) * sizeof(float), "host bytes %zu, parameters %zu floats", full,
              t5_param_floats(c));
    REQUIRE_OK(t5_to_device(e, &k_emu_ops));
    CHECK_MSG(t5_host_bytes(e) == 0, "host bytes after upload %zu", t5_host_bytes(e));
    CHECK(t5_to_device(e, &k_emu_ops) == -1); /* refused: already on a device */
    enum { B = 2, S = 9 };
    int32_t ids[B * S];
    for (int i = 0; i < B * S; i++) ids[i] = (i * 7 + 3) % 120;
    float a[B * S * 64], b[B * S * 64];
    REQUIRE_OK(t5_forward(e, ids, NULL, B, S, a));
    REQUIRE_OK(t5_to_device(f, &k_emu_ops));
    REQUIRE_OK(t5_forward(f, ids, NULL, B, S, b));
    CHECK(memcmp(a, b, sizeof a) == 0);
    t5_free(e), t5_free(f);
}
