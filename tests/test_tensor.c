/* tests/test_tensor.c — tensor descriptors and dtype conversions. */
#include <string.h>

#include "core/tensor.h"
#include "tests/test.h"

TEST(tensor_alloc_shape_strides) {
    core_tensor t;
    int64_t shape[3] = {2, 3, 4};
    REQUIRE_OK(core_tensor_alloc(&t, CORE_F32, 3, shape));
    CHECK(core_tensor_numel(&t) == 24);
    CHECK(core_tensor_nbytes(&t) == 96);
    CHECK(t.strides[0] == 12 && t.strides[1] == 4 && t.strides[2] == 1);
    CHECK(core_tensor_is_contiguous(&t));
    CHECK(((float *)t.data)[23] == 0.0f);
    t.strides[2] = 2;
    CHECK(!core_tensor_is_contiguous(&t));
    core_tensor_free(&t);
    CHECK(t.data == NULL);
    int64_t bad[1] = {-1};
    CHECK(core_tensor_alloc(&t, CORE_F32, 1, bad) == -1);
    CHECK(strstr(core_last_error(), "negative") != NULL);
}

TEST(tensor_dtype_names) {
    core_dtype dt;
    const char *names[] = {"F32", "BF16", "F16", "I64", "U8"};
    for (int i = 0; i < 5; i++) {
        REQUIRE_OK(core_dtype_from_name(names[i], &dt));
        CHECK(!strcmp(core_dtype_name(dt), names[i]));
    }
    CHECK(core_dtype_size(CORE_BF16) == 2 && core_dtype_size(CORE_I64) == 8);
    CHECK(core_dtype_from_name("F64", &dt) == -1);
    CHECK(strstr(core_last_error(), "F64") != NULL);
}

TEST(tensor_half_conversions) {
    /* Known encodings: 1.0, -2.0, 0.5, smallest f16 subnormal 2^-24, f16 max 65504, bf16 of pi. */
    CHECK(core_f32_to_f16(1.0f) == 0x3c00 && core_f16_to_f32(0x3c00) == 1.0f);
    CHECK(core_f32_to_f16(-2.0f) == 0xc000 && core_f16_to_f32(0xc000) == -2.0f);
    CHECK(core_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    CHECK(core_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001);
    CHECK(core_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(core_f32_to_f16(1e6f) == 0x7c00); /* overflow -> inf */
    CHECK(core_f32_to_bf16(1.0f) == 0x3f80 && core_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(core_f32_to_bf16(3.14159265f) == 0x4049);
    CHECK(isnan(core_bf16_to_f32(core_f32_to_bf16(NAN))));
    /* Round trip of every f16 finite value. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (core_f32_to_f16(core_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d f16 values do not round-trip", bad);
    /* Round to nearest even: 1 + 2^-11 is halfway between 1 and 1+2^-10 -> 1.0. */
    CHECK(core_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);
    CHECK(core_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02);
}
