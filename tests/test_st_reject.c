/* tests/test_st_reject.c — every malformed safetensors file is refused with a message naming the file, the tensor
 * (where there is one) and the fault; truncations and byte flips of a valid file never crash the parser. */
#include <stdio.h>
#include <string.h>

#include "core/safetensors.h"
#include "tests/st_test_util.h"
#include "tests/test.h"

/* Opens path expecting failure; checks the message holds the path and each non-NULL substring. */
static void expect_reject(const char *path, const char *case_name, const char *s1, const char *s2) {
    st_file *f = st_open(path);
    if (f) {
        test_fail(__FILE__, __LINE__, "%s: accepted", case_name);
        st_close(f);
        return;
    }
    const char *e = core_last_error();
    CHECK_MSG(strstr(e, path) != NULL, "%s: message lacks the path: %s", case_name, e);
    CHECK_MSG(!s1 || strstr(e, s1), "%s: message lacks \"%s\": %s", case_name, s1, e);
    CHECK_MSG(!s2 || strstr(e, s2), "%s: message lacks \"%s\": %s", case_name, s2, e);
}

#define F32_2(name, b, e) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" #b "," #e "]}"

TEST(st_reject_header_faults) {
    struct {
        const char *name, *json;
        size_t dlen;
        const char *s1, *s2; /* expected in the message: usually the tensor and the reason */
    } cases[] = {
        {"bad_json", "{\"a\":{\"dtype\":", 0, "bad JSON", NULL},
        {"trailing_garbage", "{} x", 0, "bad JSON", NULL},
        {"not_object", "[1,2]", 0, "not a JSON object", NULL},
        {"duplicate", "{" F32_2("dup", 0, 8) "," F32_2("dup", 8, 16) "}", 16, "duplicate", "dup"},
        {"overlap", "{" F32_2("a", 0, 8) "," F32_2("b", 4, 12) "}", 12, "overlap", "\"b\""},
        {"overlap_same", "{" F32_2("a", 0, 8) "," F32_2("b", 0, 8) "}", 8, "overlap", "\"a\""},
        {"hole_between", "{" F32_2("a", 0, 8) "," F32_2("b", 12, 20) "}", 20, "hole", "\"b\""},
        {"hole_at_start", "{" F32_2("late", 4, 12) "}", 12, "hole", "\"late\""},
        {"past_end", "{" F32_2("big", 0, 8) "}", 4, "past end", "\"big\""},
        {"trailing_bytes", "{" F32_2("a", 0, 8) "}", 9, "trailing bytes", NULL},
        {"trailing_no_tensors", "{}", 3, "trailing bytes", NULL},
        {"unknown_dtype", "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "unknown dtype",
         "\"w\""},
        {"unknown_dtype_i32", "{\"w\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "I32", "\"w\""},
        {"size_mismatch", "{\"m\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "byte size mismatch",
         "\"m\""},
        {"size_mismatch_bf16", "{\"m\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 4,
         "needs 8", "\"m\""},
        {"negative_shape", "{\"n\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "negative",
         "\"n\""},
        {"real_shape", "{\"r\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2, "not an integer",
         "\"r\""},
        {"string_shape", "{\"r\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, "not an integer",
         "\"r\""},
        {"shape_not_array", "{\"r\":{\"dtype\":\"U8\",\"shape\":2,\"data_offsets\":[0,2]}}", 2, "not an array",
         "\"r\""},
        {"dtype_not_string", "{\"d\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "not a string", "\"d\""},
        {"offsets_one", "{\"o\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "data_offsets", "\"o\""},
        {"offsets_neg", "{\"o\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, "data_offsets",
         "\"o\""},
        {"offsets_string", "{\"o\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0,1\"}}", 1, "data_offsets",
         "\"o\""},
        {"offsets_reversed", "{\"o\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 2, "end before",
         "\"o\""},
        {"missing_dtype", "{\"x\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "missing \"dtype\"", "\"x\""},
        {"missing_shape", "{\"x\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "missing \"shape\"", "\"x\""},
        {"missing_offsets", "{\"x\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "missing \"data_offsets\"", "\"x\""},
        {"entry_not_object", "{\"x\":[1]}", 0, "not a JSON object", "\"x\""},
        {"rank_9", "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "rank 9",
         "\"x\""},
        {"shape_overflow", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
         "too large", "\"x\""},
        {"huge_int", "{\"x\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,0]}}", 0,
         "bad JSON", NULL},
        {"metadata_number", "{\"__metadata__\":{\"step\":3}}", 0, "not a string", "step"},
        {"metadata_not_object", "{\"__metadata__\":[\"a\"]}", 0, "__metadata__", "not a JSON object"},
        {"bad_utf8", "{\"\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "bad JSON", NULL},
    };
    const char *dir = test_tmpdir();
    static uint8_t zeros[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, cases[i].name);
        REQUIRE(st_test_write_raw(path, cases[i].json, 8, zeros, cases[i].dlen) == 0);
        expect_reject(path, cases[i].name, cases[i].s1, cases[i].s2);
    }
}

TEST(st_reject_length_faults) {
    const char *dir = test_tmpdir();
    char path[600];
    uint8_t b[64] = {0};
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    REQUIRE(st_test_write_bytes(path, b, 5) == 0);
    expect_reject(path, "truncated", "truncated", "5 bytes");
    snprintf(path, sizeof path, "%s/zero.safetensors", dir);
    REQUIRE(st_test_write_bytes(path, b, 0) == 0);
    expect_reject(path, "empty file", "truncated", NULL);
    /* Header length 1000 in a 28-byte file. */
    snprintf(path, sizeof path, "%s/hlen.safetensors", dir);
    b[0] = 0xe8, b[1] = 0x03;
    memcpy(b + 8, "{}", 2);
    REQUIRE(st_test_write_bytes(path, b, 28) == 0);
    expect_reject(path, "header past end", "header length 1000", "past the end of the file");
    b[0] = 22, b[1] = 0; /* 8 + 22 = 30 > 28: just past the end */
    REQUIRE(st_test_write_bytes(path, b, 28) == 0);
    expect_reject(path, "header just past end", "header length 22", "past the end of the file");
    b[0] = 20; /* exactly to the end: "{}" and 18 NUL bytes, which is bad JSON, not a length fault */
    REQUIRE(st_test_write_bytes(path, b, 28) == 0);
    expect_reject(path, "header to end", "bad JSON", NULL);
    /* Header length 100,000,001 > limit (checked before the file size). */
    snprintf(path, sizeof path, "%s/huge.safetensors", dir);
    uint64_t n = ST_MAX_HEADER + 1;
    for (int k = 0; k < 8; k++) b[k] = (uint8_t)(n >> (8 * k));
    REQUIRE(st_test_write_bytes(path, b, 28) == 0);
    expect_reject(path, "header over 100 MB", "100000001", "limit");
    /* Header length 2^64 - 1 must not wrap around in the bounds arithmetic. */
    memset(b, 0xff, 8);
    REQUIRE(st_test_write_bytes(path, b, 28) == 0);
    expect_reject(path, "header length 2^64-1", "limit", NULL);
    snprintf(path, sizeof path, "%s/no_such_file.safetensors", dir);
    expect_reject(path, "missing", "cannot open", NULL);
    expect_reject(dir, "directory", "not a regular file", NULL);
}

/* Every proper prefix of a valid file and every single-byte change of its header must be rejected or parsed
 * without crashing (under ASan this is a small deterministic fuzz); every prefix must be rejected. */
TEST(st_truncations_and_flips) {
    size_t n;
    uint8_t *a = st_test_slurp("tests/fixtures/st_python.safetensors", &n);
    REQUIRE(a);
    st_file *f = st_parse_buffer(a, n, "fixture");
    REQUIRE_OK(f == NULL);
    st_close(f);
    int accepted = 0;
    for (size_t len = 0; len < n; len++) {
        uint8_t *c = malloc(len ? len : 1); /* exact-size copy so ASan sees any over-read */
        memcpy(c, a, len);
        f = st_parse_buffer(c, len, "prefix");
        if (f) accepted++, st_close(f);
        else CHECK_MSG(!strncmp(core_last_error(), "prefix: ", 8), "message: %s", core_last_error());
        free(c);
    }
    CHECK_MSG(accepted == 0, "%d truncated prefixes accepted", accepted);
    int flips_ok = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t *c = malloc(n);
        memcpy(c, a, n);
        c[i] ^= (uint8_t)(1u << (i % 8));
        f = st_parse_buffer(c, n, "flip");
        if (f) { /* still valid: touch every tensor */
            flips_ok++;
            for (int t = 0; t < st_count(f); t++) {
                core_tensor v;
                if (st_get(f, st_name(f, t), &v) == 0) core_tensor_free(&v);
            }
            st_close(f);
        }
        free(c);
    }
    /* Flips inside the data region (bytes after the header) leave the file valid; header flips mostly do not. */
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--) hl = hl << 8 | a[b];
    CHECK(flips_ok >= (int)(n - 8 - hl));
    free(a);
}
