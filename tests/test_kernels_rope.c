/* tests/test_kernels_rope.c — Wan 3-D RoPE table (values recorded from diffusers WanRotaryPosEmbed, and an
 * independent double formula) and the interleaved-pair rotary kernel (forward against a double reference,
 * backward against finite differences, in place, accumulation, thread invariance). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/kern_util.h"
#include "tests/test.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Values printed by diffusers 0.42.1 WanRotaryPosEmbed(Dh, (1, 2, 2), 1024) (freqs_cos/sin[..., 0::2] of the
 * token at (f, h, w) of an F x Hp x Wp grid), fp32 bit patterns. */
static const struct {
    int Dh, F, Hp, Wp, f, h, w, j;
    uint32_t cos, sin;
} diffusers_rope[] = {
    {128, 4, 6, 5, 3, 5, 4, 0, 0xbf7d7026u, 0x3e1081c3u},  {128, 4, 6, 5, 3, 5, 4, 1, 0xbec8cc31u, 0x3f6b7dbcu},
    {128, 4, 6, 5, 3, 5, 4, 21, 0x3f7ffffeu, 0x39ef0fb4u}, {128, 4, 6, 5, 3, 5, 4, 22, 0x3e913c2cu, 0xbf757c10u},
    {128, 4, 6, 5, 3, 5, 4, 23, 0xbf7f1da0u, 0xbdaa137du}, {128, 4, 6, 5, 3, 5, 4, 43, 0xbf275530u, 0xbf41bdcfu},
    {128, 4, 6, 5, 3, 5, 4, 63, 0x3f7ffffdu, 0x3a229557u}, {128, 4, 6, 5, 1, 2, 3, 0, 0x3f0a5140u, 0x3f576aa4u},
    {128, 4, 6, 5, 1, 2, 3, 1, 0x3f4a8fdeu, 0x3f1c8a23u},  {128, 4, 6, 5, 1, 2, 3, 21, 0x3f800000u, 0x391f5fcdu},
    {128, 4, 6, 5, 1, 2, 3, 22, 0xbed51133u, 0x3f68c7b7u}, {128, 4, 6, 5, 1, 2, 3, 23, 0x3e8df038u, 0x3f75f759u},
    {128, 4, 6, 5, 1, 2, 3, 43, 0xbf7d7026u, 0x3e1081c3u}, {128, 4, 6, 5, 1, 2, 3, 63, 0x3f7ffffeu, 0x39f3e002u},
    {128, 4, 6, 5, 0, 0, 0, 0, 0x3f800000u, 0x00000000u},  {128, 4, 6, 5, 0, 0, 0, 63, 0x3f800000u, 0x00000000u},
    {12, 2, 3, 4, 1, 2, 3, 0, 0x3f0a5140u, 0x3f576aa4u},   {12, 2, 3, 4, 1, 2, 3, 1, 0x3f7ffcb9u, 0x3c23d657u},
    {12, 2, 3, 4, 1, 2, 3, 2, 0xbed51133u, 0x3f68c7b7u},   {12, 2, 3, 4, 1, 2, 3, 5, 0x3f7fe283u, 0x3cf5b920u},
};

TEST(kern_rope_table_matches_diffusers) {
    for (size_t i = 0; i < sizeof diffusers_rope / sizeof diffusers_rope[0]; i++) {
        int Dh = diffusers_rope[i].Dh, F = diffusers_rope[i].F, Hp = diffusers_rope[i].Hp, Wp = diffusers_rope[i].Wp;
        size_t S = (size_t)F * Hp * Wp;
        float *c = kt_zeros(S * Dh / 2), *s = kt_zeros(S * Dh / 2);
        REQUIRE_OK(k_wan_rope_table(c, s, F, Hp, Wp, Dh, 10000.0, 1024));
        size_t tok = ((size_t)diffusers_rope[i].f * Hp + diffusers_rope[i].h) * Wp + diffusers_rope[i].w;
        size_t at = tok * Dh / 2 + diffusers_rope[i].j;
        CHECK_MSG(bits(c[at]) == diffusers_rope[i].cos && bits(s[at]) == diffusers_rope[i].sin,
                  "entry %zu (Dh %d, token %zu, pair %d): cos %.9g sin %.9g", i, Dh, tok, diffusers_rope[i].j, c[at],
                  s[at]);
        free(c), free(s);
    }
}

/* The whole table equals the formula evaluated here: part sizes h = w = 2*(Dh/6), t = Dh - 2h; pair i of a part
 * of size dim has angle pos / theta^(2i/dim), pos = f, h or w. */
TEST(kern_rope_table_formula_and_errors) {
    int Dh = 20, F = 3, Hp = 2, Wp = 5; /* h_dim = w_dim = 6, t_dim = 8 */
    double theta = 500.0;
    size_t S = (size_t)F * Hp * Wp;
    float *c = kt_zeros(S * Dh / 2), *s = kt_zeros(S * Dh / 2);
    REQUIRE_OK(k_wan_rope_table(c, s, F, Hp, Wp, Dh, theta, 8));
    size_t bad = 0;
    for (int f = 0; f < F; f++)
        for (int h = 0; h < Hp; h++)
            for (int w = 0; w < Wp; w++)
                for (int j = 0; j < Dh / 2; j++) {
                    int pos, i, dim;
                    if (j < 4) pos = f, i = j, dim = 8;
                    else if (j < 7) pos = h, i = j - 4, dim = 6;
                    else pos = w, i = j - 7, dim = 6;
                    double ang = pos * (1.0 / pow(theta, 2.0 * i / dim));
                    size_t at = (((size_t)f * Hp + h) * Wp + w) * Dh / 2 + j;
                    bad += c[at] != (float)cos(ang) || s[at] != (float)sin(ang);
                }
    CHECK_MSG(bad == 0, "%zu table entries differ from the formula", bad);
    CHECK(k_wan_rope_table(c, s, F, Hp, Wp, 13, theta, 8) == -1);
    CHECK(strstr(core_last_error(), "13") != NULL);
    CHECK(k_wan_rope_table(c, s, F, Hp, Wp, 4, theta, 8) == -1);
    CHECK(k_wan_rope_table(c, s, F, Hp, 9, Dh, theta, 8) == -1);
    CHECK(strstr(core_last_error(), "max_seq_len") != NULL);
    CHECK(k_wan_rope_table(c, s, 0, Hp, Wp, Dh, theta, 8) == -1);
    REQUIRE_OK(k_wan_rope_table(c, s, 8, 1, 1, Dh, theta, 8)); /* grid == max_seq_len is allowed */
    free(c), free(s);
}

/* Double reference of the rotation; inverse = 1 rotates by -theta. */
static void rope_ref(double *out, const double *x, const float *cs, const float *sn, int B, int S, int H, int Dh) {
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; h < H; h++)
                for (int j = 0; j < Dh / 2; j++) {
                    size_t o = (((size_t)b * S + s) * H + h) * Dh + 2 * j;
                    double c = cs[(size_t)s * Dh / 2 + j], sn_ = sn[(size_t)s * Dh / 2 + j];
                    double x1 = x[o], x2 = x[o + 1];
                    out[o] = x1 * c - x2 * sn_;
                    out[o + 1] = x1 * sn_ + x2 * c;
                }
}

typedef struct {
    double *x, *g, *out;
    const float *c, *s;
    int B, S, H, Dh;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *r = p;
    rope_ref(r->out, r->x, r->c, r->s, r->B, r->S, r->H, r->Dh);
    return kt_dot(r->g, r->out, (size_t)r->B * r->S * r->H * r->Dh);
}

static void check_rope(int B, int F, int Hp, int Wp, int H, int Dh, unsigned long long seed) {
    int S = F * Hp * Wp;
    size_t n = (size_t)B * S * H * Dh;
    float *c = kt_zeros((size_t)S * Dh / 2), *s = kt_zeros((size_t)S * Dh / 2);
    REQUIRE_OK(k_wan_rope_table(c, s, F, Hp, Wp, Dh, 10000.0, 1024));
    float *x = kt_rand(n, seed, -2, 2), *g = kt_rand(n, seed + 1, -1, 1), *out = kt_zeros(n);
    k_cpu_rope_forward(out, x, c, s, B, S, H, Dh);
    rope_ctx ctx = {kt_to_double(x, n), kt_to_double(g, n), calloc(n, sizeof(double)), c, s, B, S, H, Dh};
    double *ref = calloc(n, sizeof(double));
    rope_ref(ref, ctx.x, c, s, B, S, H, Dh);
    double e = kt_max_rel(out, ref, n);
    CHECK_MSG(e <= 1e-6, "rope forward B=%d S=%d H=%d Dh=%d: max rel err %.3g", B, S, H, Dh, e);
    /* in place gives the same bits */
    float *xi = malloc(n * sizeof(float));
    memcpy(xi, x, n * sizeof(float));
    k_cpu_rope_forward(xi, xi, c, s, B, S, H, Dh);
    CHECK(kt_bits_differ(xi, out, n) == 0);
    /* backward: from zero against FD, then accumulation onto nonzero values */
    float *dx = kt_zeros(n), *dx2 = kt_rand(n, seed + 2, -1, 1), *dx0 = malloc(n * sizeof(float));
    memcpy(dx0, dx2, n * sizeof(float));
    k_cpu_rope_backward(dx, g, c, s, B, S, H, Dh);
    k_cpu_rope_backward(dx2, g, c, s, B, S, H, Dh);
    double *fd = calloc(n, sizeof(double));
    kt_fd_grad(rope_loss, &ctx, ctx.x, n, fd);
    e = kt_rel_l2(dx, fd, n);
    CHECK_MSG(e <= 1e-6, "rope backward B=%d S=%d H=%d Dh=%d: rel L2 err %.3g", B, S, H, Dh, e);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += dx2[i] != dx0[i] + dx[i];
    CHECK_MSG(bad == 0, "%zu rope gradient elements are not init + gradient", bad);
    free(c), free(s), free(x), free(g), free(out), free(ctx.x), free(ctx.g), free(ctx.out), free(ref), free(xi);
    free(dx), free(dx2), free(dx0), free(fd);
}

TEST(kern_rope_forward_backward_fd) {
    check_rope(1, 2, 3, 2, 1, 12, 51); /* one head, Dh = 12 */
    check_rope(2, 3, 2, 2, 3, 20, 52); /* Dh = 20: t part 8, h and w parts 6 */
}

TEST(kern_rope_thread_invariance) {
    int B = 2, S = 120, H = 4, Dh = 64; /* large enough for the parallel path */
    size_t n = (size_t)B * S * H * Dh;
    float *c = kt_zeros((size_t)S * Dh / 2), *s = kt_zeros((size_t)S * Dh / 2);
    REQUIRE_OK(k_wan_rope_table(c, s, 3, 5, 8, Dh, 10000.0, 1024));
    float *x = kt_rand(n, 61, -2, 2), *o1 = kt_zeros(n), *o2 = kt_zeros(n), *d1 = kt_zeros(n), *d2 = kt_zeros(n);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    k_cpu_rope_forward(o1, x, c, s, B, S, H, Dh);
    k_cpu_rope_backward(d1, x, c, s, B, S, H, Dh);
    omp_set_num_threads(2);
    k_cpu_rope_forward(o2, x, c, s, B, S, H, Dh);
    k_cpu_rope_backward(d2, x, c, s, B, S, H, Dh);
    omp_set_num_threads(saved);
    CHECK(kt_bits_differ(o1, o2, n) == 0);
    CHECK(kt_bits_differ(d1, d2, n) == 0);
    free(c), free(s), free(x), free(o1), free(o2), free(d1), free(d2);
}
