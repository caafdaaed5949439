/* tests/test_umt5.c — model/text/umt5.c, model/text/t5_prompt.c and `vgrpo encode-prompts` against transformers'
 * UMT5EncoderModel and diffusers' WanPipeline._get_t5_prompt_embeds (fixtures of scripts/fixtures_text.py). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "model/text/t5_prompt.h"
#include "tests/test.h"

#define TE_DIR "tests/fixtures/text_tiny/text_encoder"
#define TK_DIR "tests/fixtures/text_tiny/tokenizer"
#define IO_PATH "tests/fixtures/text_umt5_io.safetensors"

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / den;
}

/* I64 tensor `name` of f as a malloc'd array; *n its element count. */
static int64_t *read_i64(const st_file *f, const char *name, int64_t *n) {
    core_tensor v;
    if (st_get(f, name, &v) || v.dtype != CORE_I64) return NULL;
    *n = core_tensor_numel(&v);
    int64_t *out = malloc((size_t)*n * sizeof *out);
    memcpy(out, v.data, (size_t)*n * sizeof *out);
    core_tensor_free(&v);
    return out;
}

TEST(t5_relative_buckets_match_reference) {
    st_file *f = st_open(IO_PATH);
    REQUIRE_OK(f ? 0 : -1);
    int64_t n = 0;
    int64_t *b = read_i64(f, "buckets", &n);
    REQUIRE(b && n == 1201);
    int bad = 0;
    for (int r = -600; r <= 600; r++) bad += t5_relative_bucket(r, 32, 128) != b[r + 600];
    CHECK_MSG(bad == 0, "%d relative positions bucketed differently", bad);
    CHECK(t5_relative_bucket(0, 32, 128) == 0 && t5_relative_bucket(1, 32, 128) == 17); /* by hand */
    CHECK(t5_relative_bucket(-7, 32, 128) == 7 && t5_relative_bucket(1000, 32, 128) == 31);
    free(b);
    st_close(f);
}

/* Hidden states of a padded batch: max|a-b|/max|b| <= 1e-5 over every position (padded ones included). */
TEST(t5_forward_matches_transformers) {
    t5_encoder *e = t5_load(TE_DIR);
    REQUIRE_OK(e ? 0 : -1);
    const t5_config *c = t5_get_config(e);
    CHECK(c->d_model == 32 && c->num_layers == 2 && c->num_heads == 4 && c->d_kv == 8 && c->d_ff == 48);
    st_file *f = st_open(IO_PATH);
    REQUIRE_OK(f ? 0 : -1);
    int64_t n = 0, nm = 0;
    int64_t *ids64 = read_i64(f, "input_ids", &n), *mask64 = read_i64(f, "attention_mask", &nm);
    REQUIRE(ids64 && mask64 && n == 24 && nm == 24);
    int32_t ids[24], mask[24];
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)ids64[i], mask[i] = (int32_t)mask64[i];
    float out[2 * 12 * 32], ref[2 * 12 * 32];
    REQUIRE_OK(st_read_f32(f, "hidden_states", ref, 2 * 12 * 32));
    REQUIRE_OK(t5_forward(e, ids, mask, 2, 12, out));
    double err = rel_err(out, ref, 2 * 12 * 32);
    fprintf(stderr, "  umT5 hidden states: max|a-b|/max|b| = %.3g\n", err);
    CHECK(err <= 1e-5);
    /* the mask matters: without it row 1 differs */
    float nomask[2 * 12 * 32];
    REQUIRE_OK(t5_forward(e, ids, NULL, 2, 12, nomask));
    CHECK(rel_err(nomask + 12 * 32, ref + 12 * 32, 12 * 32) > 1e-3);
    /* batch invariance: row 1 alone equals row 1 in the batch */
    float one[12 * 32];
    REQUIRE_OK(t5_forward(e, ids + 12, mask + 12, 1, 12, one));
    CHECK(rel_err(one, out + 12 * 32, 12 * 32) <= 1e-6);
    ids[3] = 700;
    CHECK(t5_forward(e, ids, mask, 2, 12, out) == -1);
    free(ids64), free(mask64);
    st_close(f);
    t5_free(e);
}

TEST(t5_prompt_clean_by_hand) {
    char *a = t5_prompt_clean("  caf&amp;eacute;\t&lt;b&gt;\n\n x\xE3\x80\x80y &#233;&#x41;&#150; ");
    REQUIRE(a);
    /* &amp;eacute; unescapes twice to U+00E9; &#150; is cp1252 en dash U+2013; U+3000 is whitespace */
    CHECK_MSG(!strcmp(a, "caf\xC3\xA9 <b> x y \xC3\xA9" "A\xE2\x80\x93"), "got \"%s\"", a);
    free(a);
    char *b = t5_prompt_clean("&ampx &hellip &hellip; &unknown; a&#0;");
    REQUIRE(b);
    CHECK_MSG(!strcmp(b, "&x &hellip \xE2\x80\xA6 &unknown; a\xEF\xBF\xBD"), "got \"%s\"", b);
    free(b);
}

/* Prompt embeddings as diffusers computes them: clean, tokenise (truncate at 16), encode with the mask, trim,
 * zero-pad; and the negative (empty) prompt. */
TEST(t5_prompt_embeds_match_diffusers) {
    t5_encoder *e = t5_load(TE_DIR);
    tok_tokenizer *t = tok_load(TK_DIR);
    st_file *f = st_open(IO_PATH);
    REQUIRE_OK(e && t && f ? 0 : -1);
    json_t *pj = json_loads(st_metadata(f, "prompts"), 0, NULL);
    REQUIRE(json_array_size(pj) == 3);
    const char *prompts[3];
    for (int i = 0; i < 3; i++) prompts[i] = json_string_value(json_array_get(pj, (size_t)i));
    float emb[3 * 16 * 32], ref[3 * 16 * 32], neg[16 * 32], nref[16 * 32];
    int64_t len[3], nlen = 0, nl = 0;
    int64_t *lref = read_i64(f, "prompt_lengths", &nl);
    REQUIRE(lref && nl == 3);
    REQUIRE_OK(st_read_f32(f, "prompt_embeds", ref, 3 * 16 * 32));
    REQUIRE_OK(st_read_f32(f, "negative_embeds", nref, 16 * 32));
    REQUIRE_OK(t5_encode_prompts(e, t, prompts, 3, 16, 2, emb, len));
    for (int i = 0; i < 3; i++) CHECK(len[i] == lref[i]);
    double err = rel_err(emb, ref, 3 * 16 * 32);
    fprintf(stderr, "  prompt embeds: max|a-b|/max|b| = %.3g (lengths %ld %ld %ld)\n", err, (long)len[0], (long)len[1],
            (long)len[2]);
    CHECK(err <= 1e-5);
    CHECK(emb[(0 * 16 + 15) * 32 + 5] == 0.0f); /* prompt 0 has 13 tokens: row 15 is zero padding */
    const char *empty = "";
    REQUIRE_OK(t5_encode_prompts(e, t, &empty, 1, 16, 0, neg, &nlen));
    CHECK(nlen == 1);
    CHECK(rel_err(neg, nref, 16 * 32) <= 1e-5);
    free(lref);
    json_decref(pj);
    st_close(f);
    tok_free(t);
    t5_free(e);
}

TEST(t5_load_errors_name_the_problem) {
    const char *dir = test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"vocab_size\": 10, \"d_model\": 4, \"d_kv\": 2, \"d_ff\": 8, \"num_layers\": 1, \"num_heads\": 2,"
          " \"feed_forward_proj\": \"relu\"}", f);
    fclose(f);
    CHECK(t5_load(dir) == NULL);
    CHECK_MSG(strstr(core_last_error(), "feed_forward_proj") != NULL, "error: %s", core_last_error());
}

/* The command end to end on the fixture: the cache equals diffusers' embeddings; bad inputs are named. */
TEST(t5_encode_prompts_cli) {
    const char *dir = test_tmpdir();
    st_file *f = st_open(IO_PATH);
    REQUIRE_OK(f ? 0 : -1);
    json_t *pj = json_loads(st_metadata(f, "prompts"), 0, NULL);
    REQUIRE(json_array_size(pj) == 3);
    char ppath[1024], out[1024], cmd_out[4096];
    snprintf(ppath, sizeof ppath, "%s/prompts.txt", dir);
    snprintf(out, sizeof out, "%s/cache.safetensors", dir);
    FILE *pf = fopen(ppath, "w");
    REQUIRE(pf);
    for (int i = 0; i < 3; i++) { /* one prompt per line: the cleaner turns the fixture's \t and \n into spaces */
        const char *p = json_string_value(json_array_get(pj, (size_t)i));
        for (; *p; p++) fputc(*p == '\n' ? ' ' : *p, pf);
        fputs(i == 1 ? "\r\n\n   \n" : "\n", pf);
    }
    fclose(pf);
    const char *bin = test_vgrpo_bin();
    int rc = test_run(cmd_out, sizeof cmd_out, "%s encode-prompts --text-encoder %s --tokenizer %s --prompts %s --out %s "
                      "--max-length 16", bin, TE_DIR, TK_DIR, ppath, out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, cmd_out);
    st_file *c = st_open(out);
    REQUIRE_OK(c ? 0 : -1);
    float emb[3 * 16 * 32], ref[3 * 16 * 32], neg[16 * 32], nref[16 * 32];
    REQUIRE_OK(st_read_f32(c, "embeds", emb, 3 * 16 * 32));
    REQUIRE_OK(st_read_f32(c, "negative_embeds", neg, 16 * 32));
    REQUIRE_OK(st_read_f32(f, "prompt_embeds", ref, 3 * 16 * 32));
    REQUIRE_OK(st_read_f32(f, "negative_embeds", nref, 16 * 32));
    int64_t nl = 0, nr = 0;
    int64_t *l = read_i64(c, "lengths", &nl), *lr = read_i64(f, "prompt_lengths", &nr);
    REQUIRE(l && lr && nl == 3);
    for (int i = 0; i < 3; i++) CHECK(l[i] == lr[i]);
    CHECK(rel_err(emb, ref, 3 * 16 * 32) <= 1e-5);
    CHECK(rel_err(neg, nref, 16 * 32) <= 1e-5);
    free(l), free(lr);
    st_close(c);
    /* errors */
    rc = test_run(cmd_out, sizeof cmd_out, "%s encode-prompts --text-encoder %s --tokenizer %s --prompts %s --out %s",
                  bin, TE_DIR, dir, ppath, out);
    CHECK_MSG(rc == 1 && strstr(cmd_out, "missing tokenizer.json"), "exit %d: %s", rc, cmd_out);
    rc = test_run(cmd_out, sizeof cmd_out, "%s encode-prompts --text-encoder %s --tokenizer %s --prompts %s/nope.txt "
                  "--out %s", bin, TE_DIR, TK_DIR, dir, out);
    CHECK_MSG(rc == 1 && strstr(cmd_out, "nope.txt does not exist"), "exit %d: %s", rc, cmd_out);
    pf = fopen(ppath, "w");
    REQUIRE(pf);
    fputs("\n  \n", pf);
    fclose(pf);
    rc = test_run(cmd_out, sizeof cmd_out, "%s encode-prompts --text-encoder %s --tokenizer %s --prompts %s --out %s",
                  bin, TE_DIR, TK_DIR, ppath, out);
    CHECK_MSG(rc == 1 && strstr(cmd_out, "has no prompts"), "exit %d: %s", rc, cmd_out);
    json_decref(pj);
    st_close(f);
}

/* A BF16 checkpoint (the real umT5's dtype) loads to exactly the F32 model of the same bf16-rounded weights. */
TEST(t5_bf16_checkpoint_loads_exactly) {
    const char *tmp = test_tmpdir();
    st_file *src = st_open(TE_DIR "/model.safetensors");
    REQUIRE_OK(src ? 0 : -1);
    int n = st_count(src);
    st_writer *w32 = st_writer_new(), *w16 = st_writer_new();
    REQUIRE(w32 && w16);
    float **f32 = calloc((size_t)n, sizeof *f32);
    uint16_t **b16 = calloc((size_t)n, sizeof *b16);
    for (int i = 0; i < n; i++) {
        const st_info *in = st_info_at(src, i);
        int64_t ne = 1;
        for (int d = 0; d < in->ndim; d++) ne *= in->shape[d];
        f32[i] = malloc((size_t)ne * sizeof(float));
        b16[i] = malloc((size_t)ne * sizeof(uint16_t));
        REQUIRE_OK(st_read_f32(src, in->name, f32[i], ne));
        for (int64_t k = 0; k < ne; k++) {
            b16[i][k] = core_f32_to_bf16(f32[i][k]);
            f32[i][k] = core_bf16_to_f32(b16[i][k]);
        }
        REQUIRE_OK(st_writer_add(w32, in->name, CORE_F32, in->ndim, in->shape, f32[i]));
        REQUIRE_OK(st_writer_add(w16, in->name, CORE_BF16, in->ndim, in->shape, b16[i]));
    }
    char cmd[2048], d32[1024], d16[1024], path[1100];
    snprintf(d32, sizeof d32, "%s/f32", tmp);
    snprintf(d16, sizeof d16, "%s/bf16", tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s %s && cp %s/config.json %s && cp %s/config.json %s", d32, d16, TE_DIR, d32,
             TE_DIR, d16);
    REQUIRE(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", d32);
    REQUIRE_OK(st_writer_write(w32, path));
    snprintf(path, sizeof path, "%s/model.safetensors", d16);
    REQUIRE_OK(st_writer_write(w16, path));
    t5_encoder *a = t5_load(d32), *b = t5_load(d16);
    REQUIRE_OK(a && b ? 0 : -1);
    int32_t ids[10] = {5, 17, 300, 42, 1, 9, 600, 2, 1, 0}, mask[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    float oa[10 * 32], ob[10 * 32];
    REQUIRE_OK(t5_forward(a, ids, mask, 1, 10, oa));
    REQUIRE_OK(t5_forward(b, ids, mask, 1, 10, ob));
    CHECK(memcmp(oa, ob, sizeof oa) == 0);
    t5_free(a), t5_free(b);
    for (int i = 0; i < n; i++) free(f32[i]), free(b16[i]);
    free(f32), free(b16);
    st_writer_free(w32), st_writer_free(w16);
    st_close(src);
}

/* t5_attention equals the chains its contract writes out (umt5.h), computed here one element at a time, bit for bit:
 * sequence lengths off the 4-row and 16-key blocks, head sizes through the 32- and 8-column passes and the scalar
 * tail, with and without a mask (one row with no kept key: zeros), 2 batch elements. */
static void attention_by_chains(float *o, const float *q, const float *k, const float *v, const float *rel_bias,
                                const int *bucket_of, const int32_t *mask, int B, int S, int H, int Dk) {
    const int I = H * Dk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                float sc[64], mx = -INFINITY;
                for (int j = 0; j < S; j++) {
                    float s = 0;
                    for (int d = 0; d < Dk; d++) {
                        const float p = q[((size_t)b * S + i) * I + h * Dk + d] * k[((size_t)b * S + j) * I + h * Dk + d];
                        s = s + p;
                    }
                    sc[j] = s + rel_bias[(size_t)bucket_of[j - i + S - 1] * H + h];
                    if ((!mask || mask[b * S + j]) && sc[j] > mx) mx = sc[j];
                }
                double sum = 0, col[40] = {0};
                for (int j = 0; j < S; j++) {
                    if (mask && !mask[b * S + j]) continue;
                    const double p = exp((double)sc[j] - mx);
                    sum += p;
                    for (int d = 0; d < Dk; d++) {
                        const double t = p * (double)v[((size_t)b * S + j) * I + h * Dk + d];
                        col[d] = col[d] + t;
                    }
                }
                for (int d = 0; d < Dk; d++)
                    o[((size_t)b * S + i) * I + h * Dk + d] = sum > 0 ? (float)(col[d] / sum) : 0.0f;
            }
}

TEST(t5_attention_chains_bitwise) {
    const int shapes[][3] = {{37, 2, 40}, {64, 3, 16}, {5, 2, 20}, {18, 1, 8}}; /* S, H, Dk */
    for (int c = 0; c < 4; c++) {
        const int S = shapes[c][0], H = shapes[c][1], Dk = shapes[c][2], B = 2, nb = 32;
        const size_t n = (size_t)B * S * H * Dk;
        float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
        float *oa = malloc(n * sizeof *oa), *ob = malloc(n * sizeof *ob), rel[32 * 3];
        int bucket_of[2 * 64], mask[2 * 64];
        uint32_t x = 12345u + (uint32_t)c;
#define RND() ((x = x * 1664525u + 1013904223u), (float)((x >> 8) & 0xFFFF) / 65536.0f - 0.5f)
        for (size_t i = 0; i < n; i++) q[i] = 2 * RND(), k[i] = 2 * RND(), v[i] = RND();
        for (int i = 0; i < nb * H; i++) rel[i] = RND();
#undef RND
        for (int r = -(S - 1); r <= S - 1; r++) bucket_of[r + S - 1] = t5_relative_bucket(r, nb, 128);
        for (int i = 0; i < B * S; i++) mask[i] = i < S ? 1 : (i % 3 != 0);
        for (int m = 0; m < 2; m++) {
            int32_t *mk = m ? (int32_t *)mask : NULL;
            if (m && c == 3)
                for (int i = S; i < 2 * S; i++) mask[i] = 0; /* the second batch element: no kept key */
            REQUIRE_OK(t5_attention(oa, q, k, v, rel, bucket_of, mk, B, S, H, Dk));
            attention_by_chains(ob, q, k, v, rel, bucket_of, mk, B, S, H, Dk);
            CHECK(memcmp(oa, ob, n * sizeof *oa) == 0);
            if (m && c == 3) CHECK(oa[n - 1] == 0.0f && oa[n / 2] == 0.0f);
        }
        free(q), free(k), free(v), free(oa), free(ob);
    }
}
