/* tests/test_checksum.c — xxh64 known answers and the whole-model hash of docs/design.md section 3. */
#include <string.h>

#include "core/checksum.h"
#include "tests/test.h"

TEST(checksum_xxh64_known_answers) {
    /* Published XXH64 values (seed 0). */
    CHECK(core_xxh64("", 0, 0) == 0xEF46DB3751D8E999ull);
    CHECK(core_xxh64(NULL, 0, 0) == 0xEF46DB3751D8E999ull);
    CHECK(core_xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5Bull);
    CHECK(core_xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ull);
    /* 100 bytes (three 32-byte stripes + tail) with a 64-bit seed, from an independent Python implementation
     * of the XXH64 specification that also reproduces the three values above. */
    unsigned char buf[100];
    for (int i = 0; i < 100; i++) buf[i] = (unsigned char)(i * 7 + 3);
    CHECK(core_xxh64(buf, 100, 0x9E3779B97F4A7C15ull) == 0xf6d8f65c625abb4full);
}

TEST(checksum_tensor_hash) {
    core_tensor t;
    int64_t shape[2] = {2, 2};
    float data[4] = {1.0f, -2.0f, 0.5f, 0.0f};
    core_tensor_wrap(&t, data, CORE_F32, 2, shape);
    uint64_t h;
    REQUIRE_OK(core_tensor_xxh64(&t, &h));
    CHECK(h == core_xxh64(data, sizeof data, 0));
    t.strides[0] = 1;
    t.strides[1] = 2;
    CHECK(core_tensor_xxh64(&t, &h) == -1);
    CHECK(strstr(core_last_error(), "contiguous") != NULL);
}

TEST(checksum_model_hash_order) {
    /* Bytewise order: 'B' (0x42) < 'a' < 'b' < UTF-8 e-acute (0xc3 0xa9) in "transformer/"; then "transformer_2"
     * ('_' 0x5f > '/' 0x2f). The expected value is xxh64 of the hashes in that order, from the Python reference. */
    const char *names[5] = {"transformer/b", "transformer_2/a", "transformer/B", "transformer/\xc3\xa9",
                            "transformer/a"};
    const uint64_t hashes[5] = {0x0123456789abcdefull, 0xfedcba9876543210ull, 1, 0x8000000000000000ull,
                                0xdeadbeefcafebabeull};
    uint64_t h;
    REQUIRE_OK(core_model_hash(names, hashes, 5, &h));
    CHECK(h == 0x6fecd32fecdf71f7ull);
    /* Same bytes assembled by hand in sorted order. */
    const uint64_t sorted[5] = {1, 0xdeadbeefcafebabeull, 0x0123456789abcdefull, 0x8000000000000000ull,
                                0xfedcba9876543210ull};
    unsigned char bytes[40];
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 8; b++) bytes[8 * i + b] = (unsigned char)(sorted[i] >> (8 * b));
    CHECK(h == core_xxh64(bytes, 40, 0));
    /* Every rotation and the reversal of the input list give the same hash. */
    for (int r = 0; r < 5; r++) {
        const char *n2[5];
        uint64_t h2[5], got;
        for (int i = 0; i < 5; i++) {
            int src = (i + r) % 5;
            n2[i] = names[src];
            h2[i] = hashes[src];
        }
        REQUIRE_OK(core_model_hash(n2, h2, 5, &got));
        CHECK_MSG(got == h, "rotation %d", r);
        for (int i = 0; i < 5; i++) {
            n2[i] = names[4 - i];
            h2[i] = hashes[4 - i];
        }
        REQUIRE_OK(core_model_hash(n2, h2, 5, &got));
        CHECK(got == h);
    }
    /* A changed tensor hash or name changes the model hash. */
    uint64_t h3[5], got;
    memcpy(h3, hashes, sizeof h3);
    h3[2] ^= 1ull << 40;
    REQUIRE_OK(core_model_hash(names, h3, 5, &got));
    CHECK(got != h);
    REQUIRE_OK(core_model_hash(NULL, NULL, 0, &got));
    CHECK(got == 0xEF46DB3751D8E999ull);
}

TEST(checksum_model_hash_errors) {
    const char *names[3] = {"vae/x", "transformer/y", "vae/x"};
    const uint64_t hashes[3] = {1, 2, 3};
    uint64_t h;
    CHECK(core_model_hash(names, hashes, 3, &h) == -1);
    CHECK(strstr(core_last_error(), "\"vae/x\" is listed twice") != NULL);
    names[2] = NULL;
    CHECK(core_model_hash(names, hashes, 3, &h) == -1);
    CHECK(strstr(core_last_error(), "tensor 2 has no name") != NULL);
}
