/* tests/test_kernels_patch.c — patchify / unpatchify layouts against a generic reshape + permute written here
 * (the torch expressions: Conv3d patch flattening, and diffusers Wan's unpatchify
 * reshape(B, Fp, Hp, Wp, pt, ph, pw, C).permute(0, 7, 1, 4, 2, 5, 3, 6)), exact inverse pairs, accumulation,
 * and sizes that are not multiples of the patch. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/kern_util.h"
#include "tests/test.h"

/* out = x.reshape(dims).permute(perm) made contiguous, for 8-D shapes: out[j] = x[i] with i[perm[k]] = j[k]. */
static void permute8(float *out, const float *x, const int dims[8], const int perm[8]) {
    int od[8];
    long xs[8], n = 1;
    for (int k = 7; k >= 0; k--) xs[k] = n, n *= dims[k];
    for (int k = 0; k < 8; k++) od[k] = dims[perm[k]];
    int j[8] = {0};
    for (long o = 0; o < n; o++) {
        long src = 0;
        for (int k = 0; k < 8; k++) src += (long)j[k] * xs[perm[k]];
        out[o] = x[src];
        for (int k = 7; k >= 0; k--) { /* next output multi-index, last dim fastest */
            if (++j[k] < od[k]) break;
            j[k] = 0;
        }
    }
}

static void check_patch(int B, int C, int F, int H, int W, int pt, int ph, int pw, unsigned long long seed) {
    int Fp = F / pt, Hp = H / ph, Wp = W / pw, P = C * pt * ph * pw;
    size_t nv = (size_t)B * C * F * H * W, nt = (size_t)B * Fp * Hp * Wp * P;
    REQUIRE(nv == nt); /* divisible sizes here */
    float *x = kt_rand(nv, seed, -1, 1), *tok = kt_zeros(nt), *ref = kt_zeros(nt);

    /* patchify: [B, C, Fp, pt, Hp, ph, Wp, pw] -> [B, Fp, Hp, Wp, C, pt, ph, pw] */
    int dv[8] = {B, C, Fp, pt, Hp, ph, Wp, pw}, pp[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    permute8(ref, x, dv, pp);
    k_cpu_patchify_forward(tok, x, B, C, F, H, W, pt, ph, pw);
    CHECK_MSG(kt_bits_differ(tok, ref, nt) == 0, "patchify C=%d F=%d H=%d W=%d p=(%d,%d,%d) differs from permute", C,
              F, H, W, pt, ph, pw);
    /* one element by the explicit formula of kernels.h */
    {
        int b = B - 1, c = C - 1, fp = Fp - 1, kt = pt - 1, hp = Hp / 2, kh = ph - 1, wp = Wp / 2, kw = 0;
        size_t s = ((size_t)fp * Hp + hp) * Wp + wp, p = (((size_t)c * pt + kt) * ph + kh) * pw + kw;
        size_t xi = ((((size_t)b * C + c) * F + fp * pt + kt) * H + hp * ph + kh) * W + wp * pw + kw;
        CHECK(tok[((size_t)b * Fp * Hp * Wp + s) * P + p] == x[xi]);
    }
    /* patchify backward is the inverse permutation, accumulated */
    float *dx = kt_rand(nv, seed + 1, -1, 1), *dx0 = malloc(nv * sizeof(float)), *back = kt_zeros(nv);
    memcpy(dx0, dx, nv * sizeof(float));
    k_cpu_patchify_backward(back, tok, B, C, F, H, W, pt, ph, pw);
    CHECK(kt_bits_differ(back, x, nv) == 0);
    k_cpu_patchify_backward(dx, tok, B, C, F, H, W, pt, ph, pw);
    size_t bad = 0;
    for (size_t i = 0; i < nv; i++) bad += dx[i] != dx0[i] + x[i];
    CHECK_MSG(bad == 0, "%zu patchify gradient elements are not init + dout", bad);

    /* unpatchify: [B, Fp, Hp, Wp, pt, ph, pw, C] -permute(0,7,1,4,2,5,3,6)-> [B, C, Fp, pt, Hp, ph, Wp, pw] */
    float *y = kt_rand(nt, seed + 2, -1, 1), *vid = kt_zeros(nv), *vref = kt_zeros(nv);
    int du[8] = {B, Fp, Hp, Wp, pt, ph, pw, C}, pu[8] = {0, 7, 1, 4, 2, 5, 3, 6};
    permute8(vref, y, du, pu);
    k_cpu_unpatchify_forward(vid, y, B, C, F, H, W, pt, ph, pw);
    CHECK_MSG(kt_bits_differ(vid, vref, nv) == 0, "unpatchify C=%d F=%d H=%d W=%d p=(%d,%d,%d) differs from permute",
              C, F, H, W, pt, ph, pw);
    float *dy = kt_rand(nt, seed + 3, -1, 1), *dy0 = malloc(nt * sizeof(float)), *yback = kt_zeros(nt);
    memcpy(dy0, dy, nt * sizeof(float));
    k_cpu_unpatchify_backward(yback, vid, B, C, F, H, W, pt, ph, pw);
    CHECK(kt_bits_differ(yback, y, nt) == 0);
    k_cpu_unpatchify_backward(dy, vid, B, C, F, H, W, pt, ph, pw);
    bad = 0;
    for (size_t i = 0; i < nt; i++) bad += dy[i] != dy0[i] + y[i];
    CHECK_MSG(bad == 0, "%zu unpatchify gradient elements are not init + dout", bad);
    /* the two layouts differ (c first vs c last) unless C == 1 or the patch is 1x1x1 */
    if (C > 1 && pt * ph * pw > 1) {
        k_cpu_unpatchify_forward(vid, tok, B, C, F, H, W, pt, ph, pw);
        CHECK(kt_bits_differ(vid, x, nv) != 0);
    }
    free(x), free(tok), free(ref), free(dx), free(dx0), free(back), free(y), free(vid), free(vref), free(dy);
    free(dy0), free(yback);
}

TEST(kern_patchify_unpatchify_layouts) {
    check_patch(2, 3, 3, 4, 6, 1, 2, 2, 111); /* Wan patch (1, 2, 2) */
    check_patch(1, 2, 4, 4, 2, 2, 2, 2, 112); /* temporal patch 2 */
    check_patch(1, 5, 2, 3, 3, 1, 3, 1, 113); /* uneven patch */
}

/* Sizes that are not multiples of the patch: the remainder is dropped by patchify (its gradient untouched) and
 * zero in the unpatchify output. */
TEST(kern_patch_remainder) {
    int B = 1, C = 2, F = 3, H = 5, W = 4, pt = 2, ph = 2, pw = 2;
    int Fp = 1, Hp = 2, Wp = 2, P = C * pt * ph * pw;
    size_t nv = (size_t)B * C * F * H * W, nt = (size_t)B * Fp * Hp * Wp * P;
    float *x = kt_rand(nv, 121, 1, 2), *tok = kt_zeros(nt), *vid = kt_rand(nv, 122, 5, 6), *dx = kt_zeros(nv);
    k_cpu_patchify_forward(tok, x, B, C, F, H, W, pt, ph, pw);
    k_cpu_unpatchify_forward(vid, tok, B, C, F, H, W, pt, ph, pw);
    k_cpu_patchify_backward(dx, tok, B, C, F, H, W, pt, ph, pw);
    size_t bad = 0, zeros = 0;
    for (int c = 0; c < C; c++)
        for (int f = 0; f < F; f++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++) {
                    size_t i = (((size_t)c * F + f) * H + h) * W + w;
                    int covered = f < Fp * pt && h < Hp * ph && w < Wp * pw;
                    if (covered)
                        bad += dx[i] != x[i];
                    else
                        bad += dx[i] != 0.0f, zeros += vid[i] == 0.0f;
                }
    CHECK_MSG(bad == 0, "%zu covered/uncovered gradient elements wrong", bad);
    CHECK(zeros == nv - nt); /* every uncovered output position was cleared */
    free(x), free(tok), free(vid), free(dx);
}
