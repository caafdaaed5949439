/* tests/test_wire.c — the wire format (core/wire.h): every rejection, with the field its message names, and
 * build -> parse round trips. Headers are written by hand here, so the parser is checked against the text of
 * reward/PROTOCOL.md rather than against the builder. */
#include <stdint.h>
#include <string.h>

#include "core/wire.h"
#include "tests/test.h"

static uint8_t frame_a[2 * 3 * 4]; /* F32 [2,3] */
static uint8_t frame_b[5];         /* U8 [5] */

/* Parses header text + the given tensor frames; returns parse's status, leaves the message in *m. */
static int parse_text(const char *hdr, const core_wire_frame *tf, int ntf, const core_wire_limits *lim,
                      core_wire_msg *m) {
    core_wire_frame fr[8];
    fr[0].data = hdr;
    fr[0].len = strlen(hdr);
    for (int i = 0; i < ntf; i++) fr[i + 1] = tf[i];
    return core_wire_parse(fr, ntf + 1, lim, m);
}

/* Expects parse to fail with a message containing `want`. */
static void expect_reject(int line, const char *hdr, const core_wire_frame *tf, int ntf, const core_wire_limits *lim,
                          const char *want) {
    core_wire_msg m;
    int rc = parse_text(hdr, tf, ntf, lim, &m);
    if (rc == 0) {
        test_fail(__FILE__, line, "accepted a bad message: %s", hdr);
        core_wire_msg_free(&m);
        return;
    }
    if (!strstr(core_last_error(), want))
        test_fail(__FILE__, line, "error \"%s\" does not contain \"%s\"", core_last_error(), want);
    if (m.header || m.tensors || m.n_tensors) test_fail(__FILE__, line, "rejected message not left empty");
}
#define REJECT(hdr, tf, ntf, lim, want) expect_reject(__LINE__, hdr, tf, ntf, lim, want)

static const char *GOOD = "{\"v\":1,\"type\":\"score_request\",\"id\":\"r1\",\"fps\":16,"
                          "\"tensors\":[{\"name\":\"a\",\"dtype\":\"F32\",\"shape\":[2,3]},"
                          "{\"name\":\"b\",\"dtype\":\"U8\",\"shape\":[5]}]}";

TEST(wire_parse_good) {
    for (size_t i = 0; i < sizeof frame_a; i++) frame_a[i] = (uint8_t)i;
    core_wire_frame tf[2] = {{frame_a, sizeof frame_a}, {frame_b, sizeof frame_b}};
    core_wire_msg m;
    REQUIRE_OK(parse_text(GOOD, tf, 2, NULL, &m));
    CHECK(m.type == CORE_WIRE_SCORE_REQUEST);
    CHECK(!strcmp(m.id, "r1"));
    REQUIRE(m.n_tensors == 2);
    CHECK(!strcmp(m.tensors[0].name, "a") && m.tensors[0].dtype == CORE_F32 && m.tensors[0].ndim == 2);
    CHECK(m.tensors[0].shape[0] == 2 && m.tensors[0].shape[1] == 3 && m.tensors[0].nbytes == 24);
    CHECK(m.tensors[0].data == frame_a);
    CHECK(m.tensors[1].dtype == CORE_U8 && m.tensors[1].nbytes == 5 && m.tensors[1].data == frame_b);
    CHECK(core_wire_find(&m, "b") == &m.tensors[1]);
    CHECK(core_wire_find(&m, "c") == NULL);
    CHECK(json_integer_value(json_object_get(m.header, "fps")) == 16);
    core_wire_msg_free(&m);
    CHECK(m.header == NULL && m.tensors == NULL);
    /* No tensors: "tensors" may be [] or absent; a scalar tensor (shape []) is one element. */
    REQUIRE_OK(parse_text("{\"v\":1,\"type\":\"hello\",\"id\":\"x\",\"client\":\"w0\"}", NULL, 0, NULL, &m));
    CHECK(m.type == CORE_WIRE_HELLO && m.n_tensors == 0);
    core_wire_msg_free(&m);
    core_wire_frame s = {frame_a, 8};
    REQUIRE_OK(parse_text("{\"v\":1,\"type\":\"trajectory\",\"id\":\"x\",\"tensors\":[{\"name\":\"s\",\"dtype\":\"I64\","
                          "\"shape\":[]}]}",
                          &s, 1, NULL, &m));
    CHECK(m.tensors[0].ndim == 0 && m.tensors[0].nbytes == 8);
    core_wire_msg_free(&m);
    /* An error message may carry an empty id (the bad request's id could not be read). */
    REQUIRE_OK(parse_text("{\"v\":1,\"type\":\"error\",\"id\":\"\",\"reason\":\"x\"}", NULL, 0, NULL, &m));
    core_wire_msg_free(&m);
}

TEST(wire_reject_json) {
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"x\"", NULL, 0, NULL, "not valid JSON");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"x\"} junk", NULL, 0, NULL, "not valid JSON");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"x\",\"id\":\"y\"}", NULL, 0, NULL, "duplicate");
    REJECT("[1,2]", NULL, 0, NULL, "not a JSON object");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"\xff\"}", NULL, 0, NULL, "not valid JSON");
    REJECT("", NULL, 0, NULL, "header frame is empty");
    core_wire_msg m;
    CHECK(core_wire_parse(NULL, 0, NULL, &m) == -1 && strstr(core_last_error(), "no frames"));
}

TEST(wire_reject_fields) {
    REJECT("{\"type\":\"hello\",\"id\":\"x\"}", NULL, 0, NULL, "\"v\" is missing");
    REJECT("{\"v\":\"1\",\"type\":\"hello\",\"id\":\"x\"}", NULL, 0, NULL, "\"v\" is missing or not an integer");
    REJECT("{\"v\":2,\"type\":\"hello\",\"id\":\"x\"}", NULL, 0, NULL, "unsupported protocol version 2");
    REJECT("{\"v\":1,\"id\":\"x\"}", NULL, 0, NULL, "\"type\" is missing");
    REJECT("{\"v\":1,\"type\":\"helo\",\"id\":\"x\"}", NULL, 0, NULL, "unknown message type \"helo\"");
    REJECT("{\"v\":1,\"type\":\"hello\"}", NULL, 0, NULL, "\"id\" is missing");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":7}", NULL, 0, NULL, "\"id\" is missing or not a string");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"\"}", NULL, 0, NULL, "\"id\" has length 0");
    char big[400];
    snprintf(big, sizeof big, "{\"v\":1,\"type\":\"hello\",\"id\":\"%0129d\"}", 0);
    REJECT(big, NULL, 0, NULL, "\"id\" has length 129");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"x\",\"tensors\":{}}", NULL, 0, NULL, "\"tensors\" is not an array");
}

TEST(wire_reject_tensors) {
    core_wire_frame a = {frame_a, sizeof frame_a}, b = {frame_b, sizeof frame_b};
    core_wire_frame ab[2] = {a, b};
    /* Frame count vs tensor count, both ways. */
    REJECT(GOOD, ab, 1, NULL, "lists 2 tensors but the message has 1 tensor frames");
    REJECT("{\"v\":1,\"type\":\"hello\",\"id\":\"x\"}", ab, 1, NULL, "lists 0 tensors but the message has 1");
#define T1(desc) "{\"v\":1,\"type\":\"trajectory\",\"id\":\"x\",\"tensors\":[" desc "]}"
    REJECT(T1("7"), &a, 1, NULL, "\"tensors\"[0] is not an object");
    REJECT(T1("{\"dtype\":\"F32\",\"shape\":[6]}"), &a, 1, NULL, "\"tensors\"[0].name is missing");
    REJECT(T1("{\"name\":\"\",\"dtype\":\"F32\",\"shape\":[6]}"), &a, 1, NULL, "\"tensors\"[0].name has length 0");
    REJECT(T1("{\"name\":\"a\",\"shape\":[6]}"), &a, 1, NULL, "\"tensors\"[0].dtype (tensor \"a\") is missing");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F64\",\"shape\":[3]}"), &a, 1, NULL, "\"tensors\"[0].dtype (tensor \"a\"): unknown dtype \"F64\"");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F32\"}"), &a, 1, NULL, "\"tensors\"[0].shape (tensor \"a\") is missing");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,6]}"), &a, 1, NULL, "has 9 dims (at most 8)");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F32\",\"shape\":[2,-3]}"), &a, 1, NULL, "\"tensors\"[0].shape[1] (tensor \"a\") is not a non-negative");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F32\",\"shape\":[2,3.0]}"), &a, 1, NULL, "\"tensors\"[0].shape[1]");
    /* Lying shapes: one element short, and a product that overflows 64 bits (2^62 * 2^62 * 4 bytes). */
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F32\",\"shape\":[5]}"), &a, 1, NULL,
           "frame 1 (tensor \"a\", F32 1-d) is 24 bytes but its \"shape\" needs 20");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904]}"), &a, 1, NULL,
           "size overflows at dimension");
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[24]},{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[5]}"), ab, 2,
           NULL, "tensor name \"a\" appears twice");
    /* The second tensor's error names index 1. */
    REJECT(T1("{\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[24]},{\"name\":\"b\",\"dtype\":\"U8\",\"shape\":[6]}"), ab, 2,
           NULL, "frame 2 (tensor \"b\", U8 1-d) is 5 bytes but its \"shape\" needs 6");
#undef T1
}

TEST(wire_reject_limits) {
    core_wire_frame ab[2] = {{frame_a, sizeof frame_a}, {frame_b, sizeof frame_b}};
    core_wire_limits l = core_wire_limits_default();
    l.max_tensors = 1;
    REJECT(GOOD, ab, 2, &l, "2 tensor frames (limit 1)");
    l = core_wire_limits_default();
    l.max_header_bytes = 20;
    REJECT(GOOD, ab, 2, &l, "header frame is");
    l = core_wire_limits_default();
    l.max_frame_bytes = 23;
    REJECT(GOOD, ab, 2, &l, "frame 1 is 24 bytes (limit 23 per frame)");
    l = core_wire_limits_default();
    l.max_total_bytes = strlen(GOOD) + 24 + 4;
    REJECT(GOOD, ab, 2, &l, "over the limit of");
    l.max_total_bytes += 1; /* exactly at the limit is fine */
    core_wire_msg m;
    REQUIRE_OK(parse_text(GOOD, ab, 2, &l, &m));
    core_wire_msg_free(&m);
    /* A frame length near SIZE_MAX must not wrap the total. */
    core_wire_frame huge[2] = {{frame_a, SIZE_MAX - 4}, {frame_b, 100}};
    l = core_wire_limits_default();
    l.max_frame_bytes = SIZE_MAX;
    l.max_total_bytes = SIZE_MAX;
    REJECT(GOOD, huge, 2, &l, "over the limit");
}

TEST(wire_roundtrip) {
    float f[6] = {1.5f, -2, 3, 4, 5, 6};
    int64_t idx[2] = {-7, 1LL << 40};
    uint16_t bf[4] = {0x3f80, 0, 0xffff, 1};
    core_wire_tensor ts[3] = {
        {.name = "latents", .dtype = CORE_F32, .ndim = 2, .shape = {2, 3}, .data = f, .nbytes = sizeof f},
        {.name = "uids", .dtype = CORE_I64, .ndim = 1, .shape = {2}, .data = idx, .nbytes = sizeof idx},
        {.name = "w", .dtype = CORE_BF16, .ndim = 3, .shape = {1, 2, 2}, .data = bf, .nbytes = sizeof bf},
    };
    json_t *fields = json_pack("{s:i, s:s, s:[s]}", "policy_version", 3, "note", "caf\xc3\xa9", "list", "x");
    core_wire_built b;
    REQUIRE_OK(core_wire_build(CORE_WIRE_TRAJECTORY, "req-42", fields, ts, 3, &b));
    REQUIRE(b.n_frames == 4);
    CHECK(b.frames[1].data == f && b.frames[1].len == 24 && b.frames[3].len == 8);
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(b.frames, b.n_frames, NULL, &m));
    CHECK(m.type == CORE_WIRE_TRAJECTORY && !strcmp(m.id, "req-42"));
    CHECK(json_integer_value(json_object_get(m.header, "v")) == 1);
    CHECK(json_integer_value(json_object_get(m.header, "policy_version")) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(m.header, "note")), "caf\xc3\xa9"));
    REQUIRE(m.n_tensors == 3);
    for (int i = 0; i < 3; i++) {
        CHECK(!strcmp(m.tensors[i].name, ts[i].name) && m.tensors[i].dtype == ts[i].dtype);
        CHECK(m.tensors[i].ndim == ts[i].ndim && m.tensors[i].nbytes == ts[i].nbytes);
        CHECK(!memcmp(m.tensors[i].data, ts[i].data, ts[i].nbytes));
        for (int k = 0; k < ts[i].ndim; k++) CHECK(m.tensors[i].shape[k] == ts[i].shape[k]);
    }
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    /* Every type name round-trips. */
    for (int t = 0; t < CORE_WIRE_TYPE_COUNT; t++) {
        REQUIRE_OK(core_wire_build((core_wire_type)t, "i", NULL, NULL, 0, &b));
        REQUIRE_OK(core_wire_parse(b.frames, b.n_frames, NULL, &m));
        CHECK(m.type == (core_wire_type)t);
        CHECK(core_wire_type_from_name(core_wire_type_name((core_wire_type)t)) == t);
        core_wire_msg_free(&m);
        core_wire_built_free(&b);
    }
    CHECK(core_wire_type_from_name("nope") == -1 && core_wire_type_name(CORE_WIRE_TYPE_COUNT) == NULL);
    /* Builder rejections name the problem. */
    json_t *bad = json_pack("{s:i}", "id", 1);
    CHECK(core_wire_build(CORE_WIRE_HELLO, "i", bad, NULL, 0, &b) == -1 && strstr(core_last_error(), "\"id\" is reserved"));
    ts[1].nbytes = 8;
    CHECK(core_wire_build(CORE_WIRE_HELLO, "i", NULL, ts, 3, &b) == -1 &&
          strstr(core_last_error(), "tensor \"uids\" has 8 bytes but its shape needs 16"));
    ts[1].nbytes = 16;
    ts[2].name = "latents";
    CHECK(core_wire_build(CORE_WIRE_HELLO, "i", NULL, ts, 3, &b) == -1 && strstr(core_last_error(), "\"latents\" appears twice"));
    CHECK(core_wire_build(CORE_WIRE_HELLO, "", NULL, NULL, 0, &b) == -1 && strstr(core_last_error(), "\"id\""));
    CHECK(b.frames == NULL && b.header_text == NULL);
    json_decref(bad);
    json_decref(fields);
}

TEST(wire_nbytes) {
    size_t n;
    int64_t s[3] = {2, 3, 5};
    REQUIRE_OK(core_wire_nbytes(CORE_BF16, 3, s, &n));
    CHECK(n == 60);
    REQUIRE_OK(core_wire_nbytes(CORE_I64, 0, s, &n));
    CHECK(n == 8);
    int64_t z[2] = {0, INT64_MAX};
    REQUIRE_OK(core_wire_nbytes(CORE_U8, 2, z, &n)); /* a zero dim before a huge one: 0 bytes, not overflow */
    CHECK(n == 0);
    int64_t o[2] = {INT64_MAX, 3};
    CHECK(core_wire_nbytes(CORE_U8, 2, o, &n) == -1 && strstr(core_last_error(), "overflows at dimension 1"));
}
