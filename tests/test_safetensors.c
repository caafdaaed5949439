/* tests/test_safetensors.c — the safetensors reader and writer against the Python package's output (fixture
 * tests/fixtures/st_python.safetensors from scripts/fixtures_safetensors.py), hand-built files for each rejection,
 * misaligned tensors, half-precision conversion, atomic writes. Sharded folders: tests/test_st_index.c. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "tests/st_test_util.h"
#include "tests/test.h"

#define FIXTURE "tests/fixtures/st_python.safetensors"

/* The fixture's tensors, recomputed from the closed forms in scripts/fixtures_safetensors.py. */
static float fx_f32[6], fx_q[3] = {10, 20, 30}, fx_scalar = 3.5f;
static uint16_t fx_f16[6] = {0xbc00, 0xb800, 0x0000, 0x3800, 0x7bff, 0x0001}; /* -1 -0.5 0 0.5 65504 2^-24 */
static uint16_t fx_bf16[4] = {0x3f80, 0xc020, 0x3e20, 0x7180};                 /* 1 -2.5 0.15625 2^100 */
static int64_t fx_i64[3] = {-(1LL << 40), 0, (1LL << 62) + 1};
static uint8_t fx_u8[7];
static const float fx_f16_val[6] = {-1.0f, -0.5f, 0.0f, 0.5f, 65504.0f, 5.9604644775390625e-8f};
static const float fx_bf16_val[4] = {1.0f, -2.5f, 0.15625f, 1.2676506002282294e30f};

static void fixture_values(void) {
    for (int i = 0; i < 6; i++) fx_f32[i] = 0.25f * (float)i - 0.5f;
    for (int i = 0; i < 7; i++) fx_u8[i] = (uint8_t)((37 * i + 3) % 256);
}

TEST(st_python_fixture_values) {
    fixture_values();
    st_file *f = st_open(FIXTURE);
    REQUIRE_OK(f == NULL);
    REQUIRE(st_count(f) == 8);
    /* Names in bytewise order. */
    const char *names[8] = {"bf16", "blocks.0.attn.to_q.weight", "empty", "f16", "f32", "i64", "scalar", "u8"};
    for (int i = 0; i < 8; i++) CHECK_MSG(!strcmp(st_name(f, i), names[i]), "name %d: %s", i, st_name(f, i));
    CHECK(st_find(f, "f32") == 4 && st_find(f, "nope") == -1 && st_find(f, "") == -1);
    CHECK(st_metadata_count(f) == 2);
    CHECK(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt"));
    CHECK(st_metadata(f, "note") && !strcmp(st_metadata(f, "note"), "vgrpo fixture"));
    CHECK(st_metadata(f, "missing") == NULL);

    core_tensor t;
    REQUIRE_OK(st_get(f, "f32", &t));
    CHECK(t.dtype == CORE_F32 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3 && t.strides[0] == 3);
    CHECK(t.owned == 0); /* the reference writer aligns every tensor: zero-copy view */
    for (int i = 0; i < 6; i++) CHECK(((float *)t.data)[i] == fx_f32[i]);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "blocks.0.attn.to_q.weight", &t));
    CHECK(t.ndim == 1 && t.shape[0] == 3 && !memcmp(t.data, fx_q, 12));
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "scalar", &t));
    CHECK(t.ndim == 0 && core_tensor_numel(&t) == 1 && *(float *)t.data == fx_scalar);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "empty", &t));
    CHECK(t.ndim == 2 && t.shape[0] == 0 && t.shape[1] == 4 && core_tensor_numel(&t) == 0);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "i64", &t));
    CHECK(t.dtype == CORE_I64 && t.shape[0] == 3);
    for (int i = 0; i < 3; i++) CHECK(((int64_t *)t.data)[i] == fx_i64[i]);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "u8", &t));
    CHECK(t.dtype == CORE_U8 && t.shape[0] == 7 && !memcmp(t.data, fx_u8, 7));
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "f16", &t));
    CHECK(t.dtype == CORE_F16 && !memcmp(t.data, fx_f16, 12));
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "bf16", &t));
    CHECK(t.dtype == CORE_BF16 && t.shape[0] == 2 && t.shape[1] == 2 && !memcmp(t.data, fx_bf16, 8));
    core_tensor_free(&t);

    float v[6];
    REQUIRE_OK(st_read_f32(f, "f16", v, 6));
    for (int i = 0; i < 6; i++) CHECK(v[i] == fx_f16_val[i]);
    REQUIRE_OK(st_read_f32(f, "bf16", v, 4));
    for (int i = 0; i < 4; i++) CHECK(v[i] == fx_bf16_val[i]);
    REQUIRE_OK(st_read_f32(f, "f32", v, 6));
    for (int i = 0; i < 6; i++) CHECK(v[i] == fx_f32[i]);
    REQUIRE_OK(st_read_f32(f, "empty", v, 0));
    /* Offsets: every tensor aligned to its dtype size in the file. */
    for (int i = 0; i < st_count(f); i++) {
        const st_info *in = st_info_at(f, i);
        CHECK_MSG(in->begin % core_dtype_size(in->dtype) == 0, "%s at %llu", in->name, (unsigned long long)in->begin);
    }
    st_close(f);
}

/* Our writer, given the fixture's tensors and its metadata in header order, reproduces the file byte for byte. */
TEST(st_writer_matches_python_bytes) {
    fixture_values();
    st_file *ref = st_open(FIXTURE);
    REQUIRE_OK(ref == NULL);
    st_writer *w = st_writer_new();
    REQUIRE(w);
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s6[1] = {6}, s22[2] = {2, 2}, s7[1] = {7}, s04[2] = {0, 4};
    /* Added in a scrambled order: the layout must not depend on it. */
    REQUIRE_OK(st_writer_add(w, "u8", CORE_U8, 1, s7, fx_u8));
    REQUIRE_OK(st_writer_add(w, "f16", CORE_F16, 1, s6, fx_f16));
    REQUIRE_OK(st_writer_add(w, "scalar", CORE_F32, 0, NULL, &fx_scalar));
    REQUIRE_OK(st_writer_add(w, "f32", CORE_F32, 2, s23, fx_f32));
    REQUIRE_OK(st_writer_add(w, "bf16", CORE_BF16, 2, s22, fx_bf16));
    REQUIRE_OK(st_writer_add(w, "empty", CORE_F32, 2, s04, NULL));
    REQUIRE_OK(st_writer_add(w, "i64", CORE_I64, 1, s3, fx_i64));
    REQUIRE_OK(st_writer_add(w, "blocks.0.attn.to_q.weight", CORE_F32, 1, s3, fx_q));
    for (int i = 0; i < st_metadata_count(ref); i++)
        REQUIRE_OK(st_writer_set_metadata(w, st_metadata_key(ref, i), st_metadata(ref, st_metadata_key(ref, i))));
    st_close(ref);
    char path[600];
    snprintf(path, sizeof path, "%s/c.safetensors", test_tmpdir());
    REQUIRE_OK(st_writer_write(w, path));
    st_writer_free(w);
    size_t na, nb;
    uint8_t *a = st_test_slurp(FIXTURE, &na), *b = st_test_slurp(path, &nb);
    REQUIRE(a && b);
    CHECK_MSG(na == nb, "sizes %zu (python) vs %zu (ours)", na, nb);
    CHECK(na == nb && memcmp(a, b, na) == 0);
    free(a);
    free(b);
}

TEST(st_roundtrip_all_dtypes) {
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    /* Odd sizes of every dtype so that a naive layout would misalign the wider ones. */
    float f32[35];
    uint16_t bf[13], h[9];
    int64_t i64[5];
    uint8_t u8[11];
    test_fill_uniform(f32, 35, 7, -3, 3);
    for (int i = 0; i < 13; i++) bf[i] = core_f32_to_bf16(f32[i] * 100.0f);
    for (int i = 0; i < 9; i++) h[i] = core_f32_to_f16(f32[i + 13]);
    for (int i = 0; i < 5; i++) i64[i] = (int64_t)0x0123456789abcdefLL * (i - 2);
    for (int i = 0; i < 11; i++) u8[i] = (uint8_t)(255 - 23 * i);
    int64_t s_f32[3] = {5, 7, 1}, s_bf[1] = {13}, s_h[2] = {3, 3}, s_i[1] = {5}, s_u[1] = {11}, s_z[3] = {2, 0, 3};
    st_writer *w = st_writer_new();
    REQUIRE(w);
    REQUIRE_OK(st_writer_add(w, "u8", CORE_U8, 1, s_u, u8));
    REQUIRE_OK(st_writer_add(w, "a.f32", CORE_F32, 3, s_f32, f32));
    REQUIRE_OK(st_writer_add(w, "bf16", CORE_BF16, 1, s_bf, bf));
    REQUIRE_OK(st_writer_add(w, "f16", CORE_F16, 2, s_h, h));
    REQUIRE_OK(st_writer_add(w, "i64", CORE_I64, 1, s_i, i64));
    REQUIRE_OK(st_writer_add(w, "zero", CORE_BF16, 3, s_z, NULL));
    REQUIRE_OK(st_writer_add(w, "scalar_u8", CORE_U8, 0, NULL, u8 + 3));
    REQUIRE_OK(st_writer_set_metadata(w, "format", "pt"));
    REQUIRE_OK(st_writer_set_metadata(w, "step", "12"));
    REQUIRE_OK(st_writer_set_metadata(w, "format", "vgrpo")); /* replaced in place */
    REQUIRE_OK(st_writer_set_metadata(w, "unicode", "\xc3\xa9t\xc3\xa9 \"quoted\"\n"));
    REQUIRE_OK(st_writer_write(w, path));
    /* Errors on add: duplicate, reserved name, negative dim, NULL data. */
    CHECK(st_writer_add(w, "bf16", CORE_F32, 1, s_i, f32) == -1);
    CHECK(strstr(core_last_error(), "duplicate") && strstr(core_last_error(), "\"bf16\""));
    CHECK(st_writer_add(w, "__metadata__", CORE_F32, 1, s_i, f32) == -1);
    int64_t neg[1] = {-2};
    CHECK(st_writer_add(w, "neg", CORE_F32, 1, neg, f32) == -1 && strstr(core_last_error(), "\"neg\""));
    CHECK(st_writer_add(w, "null", CORE_F32, 1, s_i, NULL) == -1 && strstr(core_last_error(), "NULL"));
    CHECK(st_writer_add(w, "bad\xff", CORE_F32, 1, s_i, f32) == -1 && strstr(core_last_error(), "UTF-8"));
    st_writer_free(w);

    st_file *f = st_open(path);
    REQUIRE_OK(f == NULL);
    CHECK(st_count(f) == 7);
    CHECK(!strcmp(st_metadata(f, "format"), "vgrpo") && !strcmp(st_metadata(f, "step"), "12"));
    CHECK(!strcmp(st_metadata(f, "unicode"), "\xc3\xa9t\xc3\xa9 \"quoted\"\n"));
    CHECK(st_metadata_count(f) == 3 && !strcmp(st_metadata_key(f, 0), "format"));
    struct {
        const char *name;
        core_dtype dt;
        const void *data;
        size_t nbytes;
        int ndim;
        const int64_t *shape;
    } want[] = {{"u8", CORE_U8, u8, 11, 1, s_u},          {"a.f32", CORE_F32, f32, 140, 3, s_f32},
                {"bf16", CORE_BF16, bf, 26, 1, s_bf},     {"f16", CORE_F16, h, 18, 2, s_h},
                {"i64", CORE_I64, i64, 40, 1, s_i},       {"zero", CORE_BF16, NULL, 0, 3, s_z},
                {"scalar_u8", CORE_U8, u8 + 3, 1, 0, NULL}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        core_tensor t;
        REQUIRE_OK(st_get(f, want[k].name, &t));
        CHECK_MSG(t.dtype == want[k].dt && t.ndim == want[k].ndim, "%s", want[k].name);
        for (int d = 0; d < t.ndim; d++) CHECK(t.shape[d] == want[k].shape[d]);
        CHECK(core_tensor_nbytes(&t) == want[k].nbytes);
        CHECK_MSG(t.owned == 0, "%s copied: our writer must align every tensor", want[k].name);
        if (want[k].nbytes) CHECK_MSG(!memcmp(t.data, want[k].data, want[k].nbytes), "%s bytes", want[k].name);
        core_tensor_free(&t);
    }
    /* Header length is a multiple of 8 and no temporary file is left behind. */
    size_t n;
    uint8_t *raw = st_test_slurp(path, &n);
    REQUIRE(raw);
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--) hl = hl << 8 | raw[b];
    CHECK(hl % 8 == 0 && raw[8] == '{');
    free(raw);
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0);
    st_close(f);
}

/* A file laid out by another writer: U8[1] first puts a BF16 and an F32 tensor at odd offsets. */
TEST(st_misaligned_tensor_copied_out) {
    char path[600];
    snprintf(path, sizeof path, "%s/mis.safetensors", test_tmpdir());
    uint8_t data[1 + 4 + 12];
    data[0] = 0xab;
    uint16_t c[2] = {0x4049, 0xbf00}; /* 3.140625, -0.5 */
    float b[3] = {1.5f, -7.25f, 1e-3f};
    memcpy(data + 1, c, 4);
    memcpy(data + 5, b, 12);
    const char *hdr = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[1,5]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[5,17]}}";
    REQUIRE(st_test_write_raw(path, hdr, 8, data, sizeof data) == 0);
    st_file *f = st_open(path);
    REQUIRE_OK(f == NULL);
    core_tensor t;
    REQUIRE_OK(st_get(f, "b", &t));
    CHECK(t.owned == 1 && ((uintptr_t)t.data % 4) == 0);
    CHECK(((float *)t.data)[0] == 1.5f && ((float *)t.data)[1] == -7.25f && ((float *)t.data)[2] == 1e-3f);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "c", &t));
    CHECK(t.owned == 1 && ((uint16_t *)t.data)[0] == 0x4049 && ((uint16_t *)t.data)[1] == 0xbf00);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "a", &t));
    CHECK(t.owned == 0 && ((uint8_t *)t.data)[0] == 0xab);
    core_tensor_free(&t);
    float v[3];
    REQUIRE_OK(st_read_f32(f, "c", v, 2));
    CHECK(v[0] == 3.140625f && v[1] == -0.5f);
    REQUIRE_OK(st_read_f32(f, "b", v, 3));
    CHECK(v[0] == 1.5f && v[1] == -7.25f && v[2] == 1e-3f);
    st_close(f);
}

TEST(st_read_f32_conversions_and_errors) {
    char path[600];
    snprintf(path, sizeof path, "%s/conv.safetensors", test_tmpdir());
    /* Known encodings: f16 1, -2, 2^-24, 65504, 0x3555 = 1365/4096, -65504 (and -inf); bf16 1, 3.140625, -123.5,
     * 2^-133. */
    uint16_t h[6] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x3555, 0xfbff}, hinf[1] = {0xfc00};
    uint16_t bf[4] = {0x3f80, 0x4049, 0xc2f7, 0x0001};
    int64_t i[2] = {1, 2};
    int64_t s6[1] = {6}, s22[2] = {2, 2}, s2[1] = {2}, s1[1] = {1};
    st_writer *w = st_writer_new();
    REQUIRE(w);
    REQUIRE_OK(st_writer_add(w, "h", CORE_F16, 1, s6, h));
    REQUIRE_OK(st_writer_add(w, "hinf", CORE_F16, 1, s1, hinf));
    REQUIRE_OK(st_writer_add(w, "bf", CORE_BF16, 2, s22, bf));
    REQUIRE_OK(st_writer_add(w, "i", CORE_I64, 1, s2, i));
    REQUIRE_OK(st_writer_write(w, path));
    st_writer_free(w);
    st_file *f = st_open(path);
    REQUIRE_OK(f == NULL);
    float v[6];
    REQUIRE_OK(st_read_f32(f, "h", v, 6));
    CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == ldexpf(1.0f, -24) && v[3] == 65504.0f);
    CHECK(v[4] == 1365.0f / 4096.0f && v[5] == -65504.0f);
    CHECK(isinf(core_f16_to_f32(0xfc00)) && core_f16_to_f32(0xfc00) < 0); /* -inf decodes; st_read_f32 refuses it */
    CHECK(st_read_f32(f, "hinf", v, 1) == -1 && strstr(core_last_error(), "\"hinf\" holds a non-finite value (-inf at "
                                                                        "element 0 of 1): refused"));
    REQUIRE_OK(st_read_f32(f, "bf", v, 4));
    CHECK(v[0] == 1.0f && v[1] == 3.140625f && v[2] == -123.5f && v[3] == ldexpf(1.0f, -133));
    CHECK(st_read_f32(f, "bf", v, 5) == -1);
    CHECK(strstr(core_last_error(), path) && strstr(core_last_error(), "\"bf\"") &&
          strstr(core_last_error(), "[2, 2]") && strstr(core_last_error(), "expected 5"));
    CHECK(st_read_f32(f, "i", v, 2) == -1 && strstr(core_last_error(), "I64") && strstr(core_last_error(), "\"i\""));
    CHECK(st_read_f32(f, "nope", v, 2) == -1 && strstr(core_last_error(), "no tensor \"nope\""));
    core_tensor t;
    CHECK(st_get(f, "nope", &t) == -1 && strstr(core_last_error(), path));
    st_close(f);
}

/* Legal corner cases written by hand: empty header, padding, scalar, zero-size tensors at a shared offset. */
TEST(st_legal_corner_cases) {
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    REQUIRE(st_test_write_raw(path, "{}", 1, NULL, 0) == 0);
    st_file *f = st_open(path);
    REQUIRE_OK(f == NULL);
    CHECK(st_count(f) == 0 && st_metadata_count(f) == 0);
    st_close(f);
    snprintf(path, sizeof path, "%s/meta_only.safetensors", dir);
    REQUIRE(st_test_write_raw(path, "{\"__metadata__\":{\"k\":\"v\"}}", 64, NULL, 0) == 0);
    REQUIRE_OK((f = st_open(path)) == NULL);
    CHECK(st_count(f) == 0 && !strcmp(st_metadata(f, "k"), "v"));
    st_close(f);
    snprintf(path, sizeof path, "%s/corner.safetensors", dir);
    float d[2] = {2.0f, -4.0f};
    REQUIRE(st_test_write_raw(path,
                              "{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                              "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                              "\"z2\":{\"dtype\":\"I64\",\"shape\":[3,0,2],\"data_offsets\":[4,4]},"
                              "\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1],\"data_offsets\":[4,8],\"extra\":1},"
                              "\"__metadata__\":null}",
                              8, d, 8) == 0);
    REQUIRE_OK((f = st_open(path)) == NULL);
    CHECK(st_count(f) == 4);
    core_tensor t;
    REQUIRE_OK(st_get(f, "s", &t));
    CHECK(t.ndim == 0 && *(float *)t.data == 2.0f);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "t", &t));
    CHECK(t.ndim == 3 && *(float *)t.data == -4.0f);
    core_tensor_free(&t);
    REQUIRE_OK(st_get(f, "z2", &t));
    CHECK(t.ndim == 3 && t.shape[1] == 0 && core_tensor_numel(&t) == 0);
    core_tensor_free(&t);
    st_close(f);
}
