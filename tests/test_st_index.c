/* tests/test_st_index.c — sharded checkpoints (index + shards) and checkpoint folders; atomic writes. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "tests/st_test_util.h"
#include "tests/test.h"

#define NT 7

/* Seven F32 tensors of 10..70 elements (40..280 bytes), names added out of bytewise order. */
static const char *tn[NT] = {"blocks.1.w", "blocks.0.w", "head.bias", "blocks.10.w", "a", "z.last", "blocks.2.w"};
static float tdata[NT][70];

static st_writer *make_writer(void) {
    st_writer *w = st_writer_new();
    if (!w) return NULL;
    for (int i = 0; i < NT; i++) {
        int64_t shape[2] = {i + 1, 10};
        test_fill_uniform(tdata[i], 70, 100 + i, -1, 1);
        if (st_writer_add(w, tn[i], CORE_F32, 2, shape, tdata[i])) {
            st_writer_free(w);
            return NULL;
        }
    }
    st_writer_set_metadata(w, "format", "pt");
    return w;
}

static void check_set_contents(const st_set *s) {
    CHECK(st_set_count(s) == NT);
    for (int i = 1; i < st_set_count(s); i++) CHECK(strcmp(st_set_name(s, i - 1), st_set_name(s, i)) < 0);
    for (int i = 0; i < NT; i++) {
        core_tensor t;
        REQUIRE_OK(st_set_get(s, tn[i], &t));
        CHECK_MSG(t.shape[0] == i + 1 && t.shape[1] == 10 && t.owned == 0, "%s", tn[i]);
        CHECK_MSG(!memcmp(t.data, tdata[i], (size_t)(i + 1) * 40), "%s data", tn[i]);
        core_tensor_free(&t);
        float v[70];
        REQUIRE_OK(st_set_read_f32(s, tn[i], v, (i + 1) * 10));
        CHECK(v[(i + 1) * 10 - 1] == tdata[i][(i + 1) * 10 - 1]);
        const st_info *in = st_set_info_at(s, st_set_find(s, tn[i]));
        CHECK(in && !strcmp(in->name, tn[i]) && in->end - in->begin == (uint64_t)(i + 1) * 40);
    }
    CHECK(st_set_find(s, "missing") == -1 && st_set_file_of(s, "missing") == NULL);
    core_tensor t;
    CHECK(st_set_get(s, "missing", &t) == -1 && strstr(core_last_error(), "\"missing\""));
}

TEST(st_sharded_roundtrip) {
    const char *dir = test_tmpdir();
    st_writer *w = make_writer();
    REQUIRE(w);
    /* Limit 300 bytes, greedy in the order added: sizes 40,80,120 | 160 | 200 | 240 | 280 -> shards
     * {blocks.1.w, blocks.0.w, head.bias} (240), {blocks.10.w} (160), {a} (200), {z.last} (240), {blocks.2.w}. */
    REQUIRE_OK(st_writer_write_sharded(w, dir, "diffusion_pytorch_model", 300));
    char p[700];
    for (int k = 1; k <= 5; k++) {
        snprintf(p, sizeof p, "%s/diffusion_pytorch_model-%05d-of-00005.safetensors", dir, k);
        CHECK_MSG(access(p, F_OK) == 0, "missing %s", p);
    }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    json_error_t err;
    json_t *idx = json_load_file(p, 0, &err);
    REQUIRE(idx);
    json_t *wm = json_object_get(idx, "weight_map");
    CHECK(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) == 28 * 40);
    CHECK(json_object_size(wm) == NT);
    CHECK(!strcmp(json_string_value(json_object_get(wm, "head.bias")), "diffusion_pytorch_model-00001-of-00005.safetensors"));
    CHECK(!strcmp(json_string_value(json_object_get(wm, "blocks.10.w")), "diffusion_pytorch_model-00002-of-00005.safetensors"));
    CHECK(!strcmp(json_string_value(json_object_get(wm, "blocks.2.w")), "diffusion_pytorch_model-00005-of-00005.safetensors"));
    json_decref(idx);

    st_set *s = st_open_dir(dir);
    REQUIRE_OK(s == NULL);
    CHECK(st_set_shard_count(s) == 5);
    CHECK(st_set_metadata(s, "total_size") && !strcmp(st_set_metadata(s, "total_size"), "1120"));
    check_set_contents(s);
    CHECK(st_set_file_of(s, "blocks.0.w") == st_set_file_of(s, "head.bias"));
    CHECK(st_set_file_of(s, "blocks.0.w") != st_set_file_of(s, "a"));
    st_set_close(s);
    /* Each shard carries the writer's metadata. */
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00003-of-00005.safetensors", dir);
    st_file *f = st_open(p);
    REQUIRE_OK(f == NULL);
    CHECK(st_count(f) == 1 && !strcmp(st_name(f, 0), "a") && !strcmp(st_metadata(f, "format"), "pt"));
    st_close(f);

    /* Under the limit: one plain file, no index; the folder opens the same way. */
    char d2[700];
    snprintf(d2, sizeof d2, "%s/single", dir);
    REQUIRE(mkdir(d2, 0755) == 0);
    REQUIRE_OK(st_writer_write_sharded(w, d2, "model", 1 << 20));
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d2);
    CHECK(access(p, F_OK) != 0);
    REQUIRE_OK((s = st_open_dir(d2)) == NULL);
    CHECK(st_set_shard_count(s) == 1 && !strcmp(st_set_metadata(s, "format"), "pt"));
    check_set_contents(s);
    st_set_close(s);
    st_writer_free(w);
}

/* Writes the index {"metadata":{"total_size":0},"weight_map":{...json_map...}} into dir. */
static void write_index(const char *dir, const char *json_map) {
    char p[700], txt[2048];
    snprintf(p, sizeof p, "%s/m.safetensors.index.json", dir);
    snprintf(txt, sizeof txt, "{\"metadata\":{\"total_size\":0,\"nested\":{}},\"weight_map\":{%s}}", json_map);
    REQUIRE(st_test_write_bytes(p, txt, strlen(txt)) == 0);
}

static void expect_set_reject(const char *dir, const char *case_name, const char *s1, const char *s2) {
    st_set *s = st_open_dir(dir);
    if (s) {
        test_fail(__FILE__, __LINE__, "%s: accepted", case_name);
        st_set_close(s);
        return;
    }
    const char *e = core_last_error();
    CHECK_MSG(strstr(e, dir) != NULL, "%s: message lacks the folder: %s", case_name, e);
    CHECK_MSG(!s1 || strstr(e, s1), "%s: message lacks \"%s\": %s", case_name, s1, e);
    CHECK_MSG(!s2 || strstr(e, s2), "%s: message lacks \"%s\": %s", case_name, s2, e);
}

TEST(st_shard_errors) {
    const char *dir = test_tmpdir();
    char p[700];
    float x[2] = {1, 2};
    int64_t s2[1] = {2};
    /* Shards: A = {x, y}, B = {y2, z}, C = {x} (x again). */
    const char *shards[3][2] = {{"x", "y"}, {"y2", "z"}, {"x", NULL}};
    const char *files[3] = {"A.safetensors", "B.safetensors", "C.safetensors"};
    for (int k = 0; k < 3; k++) {
        st_writer *w = st_writer_new();
        REQUIRE(w);
        for (int j = 0; j < 2 && shards[k][j]; j++) REQUIRE_OK(st_writer_add(w, shards[k][j], CORE_F32, 1, s2, x));
        snprintf(p, sizeof p, "%s/%s", dir, files[k]);
        REQUIRE_OK(st_writer_write(w, p));
        st_writer_free(w);
    }
    /* A correct index over A and B opens; C is simply not part of it. */
    write_index(dir, "\"x\":\"A.safetensors\",\"y\":\"A.safetensors\",\"y2\":\"B.safetensors\",\"z\":\"B.safetensors\"");
    st_set *s = st_open_dir(dir);
    REQUIRE_OK(s == NULL);
    CHECK(st_set_count(s) == 4 && st_set_shard_count(s) == 2);
    CHECK(!strcmp(st_set_metadata(s, "total_size"), "0") && st_set_metadata(s, "nested") == NULL);
    st_set_close(s);

    write_index(dir, "\"x\":\"A.safetensors\",\"y\":\"B.safetensors\",\"y2\":\"B.safetensors\",\"z\":\"B.safetensors\"");
    expect_set_reject(dir, "mapped to wrong shard", "\"y\" is mapped to shard B.safetensors", "does not contain");
    write_index(dir, "\"x\":\"A.safetensors\",\"y2\":\"B.safetensors\",\"z\":\"B.safetensors\"");
    expect_set_reject(dir, "unlisted", "shard A.safetensors has tensor \"y\"", "does not list");
    write_index(dir, "\"x\":\"A.safetensors\",\"y\":\"A.safetensors\",\"y2\":\"B.safetensors\",\"z\":\"C.safetensors\"");
    expect_set_reject(dir, "z not in C", "\"z\"", "does not contain");
    write_index(dir, "\"y\":\"A.safetensors\",\"x\":\"C.safetensors\"");
    expect_set_reject(dir, "two shards", "\"x\" is in two shards", "A.safetensors");
    write_index(dir, "\"x\":\"../A.safetensors\"");
    expect_set_reject(dir, "path escape", "../A.safetensors", "not a file name");
    write_index(dir, "\"x\":\"missing.safetensors\"");
    expect_set_reject(dir, "missing shard", "missing.safetensors", "cannot open");
    write_index(dir, "\"x\":3");
    expect_set_reject(dir, "non-string", "\"x\"", "not a shard file name");
    write_index(dir, "\"x\":\"A.safetensors\",\"x\":\"A.safetensors\"");
    expect_set_reject(dir, "duplicate", "duplicate", NULL);
    snprintf(p, sizeof p, "%s/m.safetensors.index.json", dir);
    REQUIRE(st_test_write_bytes(p, "{\"metadata\":{}}", 15) == 0);
    expect_set_reject(dir, "no weight_map", "weight_map", NULL);
    /* A bad shard: the shard's own error, prefixed with the index. */
    snprintf(p, sizeof p, "%s/D.safetensors", dir);
    REQUIRE(st_test_write_bytes(p, "1234", 4) == 0);
    write_index(dir, "\"x\":\"D.safetensors\"");
    expect_set_reject(dir, "bad shard", "D.safetensors: truncated", NULL);

    /* Folder-level: two indexes; no index and several files; nothing at all. */
    snprintf(p, sizeof p, "%s/other.safetensors.index.json", dir);
    REQUIRE(st_test_write_bytes(p, "{}", 2) == 0);
    expect_set_reject(dir, "two indexes", "2 sharded-checkpoint indexes", NULL);
    unlink(p);
    snprintf(p, sizeof p, "%s/m.safetensors.index.json", dir);
    unlink(p);
    expect_set_reject(dir, "several files", "4 *.safetensors files", "A.safetensors");
    char empty[700];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    REQUIRE(mkdir(empty, 0755) == 0);
    expect_set_reject(empty, "empty folder", "no *.safetensors", NULL);
    snprintf(p, sizeof p, "%s/nope", dir);
    expect_set_reject(p, "missing folder", "cannot open", NULL);
}

/* A failed write never leaves a partial or temporary file, and never disturbs an existing file at the path. */
TEST(st_writer_atomic) {
    const char *dir = test_tmpdir();
    char p[700], tmp[720];
    float x[3] = {1, 2, 3};
    int64_t s3[1] = {3};
    st_writer *w = st_writer_new();
    REQUIRE(w);
    REQUIRE_OK(st_writer_add(w, "x", CORE_F32, 1, s3, x));
    /* Into a missing folder. */
    snprintf(p, sizeof p, "%s/no/such/dir/x.safetensors", dir);
    CHECK(st_writer_write(w, p) == -1);
    CHECK(strstr(core_last_error(), p) != NULL);
    CHECK(access(p, F_OK) != 0);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(tmp, F_OK) != 0);
    /* An existing good file stays intact when the temporary cannot be created (a folder is in its way). */
    snprintf(p, sizeof p, "%s/keep.safetensors", dir);
    REQUIRE(st_test_write_bytes(p, "old", 3) == 0);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    REQUIRE(mkdir(tmp, 0755) == 0);
    CHECK(st_writer_write(w, p) == -1 && strstr(core_last_error(), "cannot create"));
    size_t n;
    uint8_t *b = st_test_slurp(p, &n);
    CHECK(b && n == 3 && !memcmp(b, "old", 3));
    free(b);
    rmdir(tmp);
    /* Rename onto a folder fails after the temporary was written: the temporary is removed. */
    snprintf(p, sizeof p, "%s/isdir.safetensors", dir);
    REQUIRE(mkdir(p, 0755) == 0);
    char inner[760];
    snprintf(inner, sizeof inner, "%s/f", p);
    REQUIRE(st_test_write_bytes(inner, "x", 1) == 0); /* non-empty: rename(file, dir) must fail */
    CHECK(st_writer_write(w, p) == -1 && strstr(core_last_error(), "rename"));
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(tmp, F_OK) != 0);
    /* Overwriting a file succeeds and replaces it whole. */
    snprintf(p, sizeof p, "%s/keep.safetensors", dir);
    REQUIRE_OK(st_writer_write(w, p));
    st_file *f = st_open(p);
    REQUIRE_OK(f == NULL);
    CHECK(st_count(f) == 1);
    st_close(f);
    /* Sharded output into a missing folder fails too, naming the file. */
    snprintf(p, sizeof p, "%s/missing", dir);
    CHECK(st_writer_write_sharded(w, p, "m", 4) == -1 && strstr(core_last_error(), p));
    st_writer_free(w);
}
