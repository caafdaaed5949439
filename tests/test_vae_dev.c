/* tests/test_vae_dev.c — the Wan VAE decoder on the device table (model/vae/wan_vae.h vae_set_device) run on the
 * emulated device (kernels/cuda/emu/k_emu.h: bf16 activations and weights, the bodies of kernels/body/kb_vae.h, GEMMs
 * on widened operands) against the fp32 CPU decode: the tiny preset's VAE and the Wan 2.1 / Wan 2.2 fixtures (random
 * weights at small shapes, scripts/fixtures_vae.py; also against diffusers' video), the convolution entry's frame
 * cache and row chunks against one-shot runs, refusals with their messages, the device estimate against the
 * emulated device's actual allocation, the recipe key, and the bodies against the CPU's code bit for bit in fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "kernels/body/kb_vae.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dev_table.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/vae/tiny_vae.h"
#include "model/vae/wan_vae.h"
#include "tests/test.h"

typedef struct {
    double abs, rel, mean; /* max |a - b|, that over max |b|, and the mean |a - b| over max |b| */
} vdiff;

static vdiff diff(const float *a, const float *b, size_t n) {
    double e = 0, mb = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d; /* NaN propagates as a failure */
        s += d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    vdiff r = {e, mb > 0 ? e / mb : e, (mb > 0 ? s / mb : s) / (double)(n ? n : 1)};
    return r;
}

static size_t video_n(vae_model *m, int B, int T, int h, int w) {
    const int s = vae_spatial_factor(m);
    return (size_t)B * vae_video_channels(m) * vae_frames_out(m, T) * h * s * w * s;
}

/* Decodes lat [B, z, T, h, w] on the CPU and on the emulated device; returns the device's difference, also of the
 * uint8 path (*u8_off: the largest difference of a byte). ref (may be NULL): a reference video for *vs_ref. */
static vdiff cpu_vs_emu(vae_model *m, const float *lat, int B, int T, int h, int w, const float *ref, vdiff *vs_ref,
                        int *u8_off) {
    const int z = vae_get_config(m)->z_dim;
    const size_t nv = video_n(m, B, T, h, w);
    float *a = malloc(nv * sizeof(float)), *b = malloc(nv * sizeof(float));
    uint8_t *ua = malloc(nv), *ub = malloc(nv);
    vdiff r = {1e30, 1e30, 1e30};
    if (!a || !b || !ua || !ub) goto done;
    REQUIRE_OK(vae_set_device(m, NULL));
    REQUIRE_OK(vae_decode(m, lat, B, z, T, h, w, a));
    REQUIRE_OK(vae_latents_to_u8(m, lat, B, z, T, h, w, ua));
    REQUIRE_OK(vae_set_device(m, &k_emu_ops));
    CHECK(strcmp(vae_device_name(m), "emulated") == 0);
    REQUIRE_OK(vae_decode(m, lat, B, z, T, h, w, b));
    REQUIRE_OK(vae_latents_to_u8(m, lat, B, z, T, h, w, ub));
    REQUIRE_OK(vae_set_device(m, NULL));
    r = diff(b, a, nv);
    if (vs_ref) *vs_ref = diff(b, ref, nv);
    int off = 0;
    if (vae_video_channels(m) == 3)
        for (size_t i = 0; i < nv; i++) off = abs((int)ua[i] - (int)ub[i]) > off ? abs((int)ua[i] - (int)ub[i]) : off;
    *u8_off = off;
done:
    free(a), free(b), free(ua), free(ub);
    return r;
}

/* bf16 storage keeps 8 significant bits (relative rounding 2^-9): every activation, weight and the latents rounded
 * to it, through ~20 layers whose norms rescale each pixel: the largest difference a few percent of the video's
 * range, the mean difference a fraction of a percent. */
#define VAE_DEV_REL_TOL 8e-2
#define VAE_DEV_MEAN_TOL 1e-2

TEST(vae_dev_tiny_preset) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vae_dev_tiny", test_tmpdir());
    REQUIRE_OK(vae_tiny_write(dir, 16, 7));
    vae_model *m = vae_load(dir);
    REQUIRE(m);
    const int B = 2, T = 3, h = 3, w = 5, z = 16;
    float *lat = malloc((size_t)B * z * T * h * w * sizeof(float));
    REQUIRE(lat);
    test_fill_uniform(lat, (size_t)B * z * T * h * w, 11, -2.0f, 2.0f);
    int off = 0;
    const vdiff d = cpu_vs_emu(m, lat, B, T, h, w, NULL, NULL, &off);
    printf("  vae on the emulated device, tiny preset [2, 16, 3, 3, 5]: max|dev - cpu| %.3g, relative %.3g, mean "
           "relative %.3g; uint8 max off %d\n", d.abs, d.rel, d.mean, off);
    CHECK_MSG(d.rel <= VAE_DEV_REL_TOL && d.mean <= VAE_DEV_MEAN_TOL, "relative %.3g, mean %.3g", d.rel, d.mean);
    CHECK(off <= 8);
    free(lat);
    vae_free(m);
}

static float *read_f32(st_file *io, const char *name, int64_t *sh) {
    const int i = st_find(io, name);
    if (i < 0) return NULL;
    const st_info *t = st_info_at(io, i);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) sh[d] = t->shape[d], n *= t->shape[d];
    float *b = malloc((size_t)n * sizeof(float));
    if (b && st_read_f32(io, name, b, n)) {
        free(b);
        return NULL;
    }
    return b;
}

static void fixture(const char *name) {
    char dir[256], iop[256];
    snprintf(dir, sizeof dir, "tests/fixtures/vae_%s", name);
    snprintf(iop, sizeof iop, "tests/fixtures/vae_%s_io.safetensors", name);
    vae_model *m = vae_load(dir);
    REQUIRE(m);
    st_file *io = st_open(iop);
    REQUIRE(io);
    for (int T = 1; T <= 3; T++) {
        char ln[32], vn[32];
        snprintf(ln, sizeof ln, "latents_t%d", T);
        snprintf(vn, sizeof vn, "video_t%d", T);
        int64_t ls[5], vs[5];
        float *lat = read_f32(io, ln, ls), *ref = read_f32(io, vn, vs);
        REQUIRE(lat && ref);
        vdiff r;
        int off = 0;
        const vdiff d = cpu_vs_emu(m, lat, (int)ls[0], T, (int)ls[3], (int)ls[4], ref, &r, &off);
        printf("  vae %s on the emulated device T=%d [%lld, %lld, %d, %lld, %lld]: max|dev - cpu| %.3g, relative "
               "%.3g, mean relative %.3g; vs diffusers %.3g (relative %.3g); uint8 max off %d\n", name, T,
               (long long)ls[0], (long long)ls[1], T, (long long)ls[3], (long long)ls[4], d.abs, d.rel, d.mean, r.abs,
               r.rel, off);
        CHECK_MSG(d.rel <= VAE_DEV_REL_TOL && r.rel <= VAE_DEV_REL_TOL && d.mean <= VAE_DEV_MEAN_TOL,
                  "%s T=%d: relative %.3g, mean %.3g, vs diffusers %.3g", name, T, d.rel, d.mean, r.rel);
        free(lat), free(ref);
    }
    st_close(io);
    vae_free(m);
}

TEST(vae_dev_wan21_fixture) { fixture("wan21"); }
TEST(vae_dev_wan22_fixture) { fixture("wan22"); }

/* ---- the convolution entry: frame cache and row chunks ---- */

/* A device buffer of n bf16 values uniform in [-1, 1] (seed), or zeros for seed 0. */
static kb_bf16 *dev_rand(const k_dev_ops *d, size_t n, unsigned long long seed) {
    float *h = calloc(n, sizeof(float));
    kb_bf16 *p = d->mem_alloc(n * sizeof(kb_bf16));
    if (!h || !p) abort();
    if (seed) test_fill_uniform(h, n, seed, -1.0f, 1.0f);
    if (d->mem_upload_bf16(p, h, n)) abort();
    free(h);
    return p;
}
static float *dev_read(const k_dev_ops *d, const kb_bf16 *p, size_t n) {
    float *h = malloc(n * sizeof(float));
    if (!h || d->mem_download_bf16(h, p, n)) abort();
    return h;
}

/* One causal 3x3x3 convolution (cin 12, cout 20: padded K and N) over 3 frames at once vs frame by frame with the
 * cache of the previous frames, and with a work buffer of 7 im2col rows vs the whole frame: equal bit for bit (the
 * im2col values are the same, the GEMM is the same per row). */
TEST(vae_dev_conv_cache_and_chunks) {
    const k_dev_ops *d = &k_emu_ops;
    const int nf = 3, H = 5, W = 6, ci = 12, co = 20, K = 27 * ci, Kp = (K + 7) / 8 * 8, cp = 24;
    const size_t fsz = (size_t)H * W * ci, osz = (size_t)H * W * co;
    kb_bf16 *x = dev_rand(d, nf * fsz, 3), *w = dev_rand(d, (size_t)cp * Kp, 0), *b = dev_rand(d, cp, 5);
    {   /* weights: random [co, K], zero padding */
        float *h = calloc((size_t)cp * Kp, sizeof(float));
        REQUIRE(h);
        for (int o = 0; o < co; o++) test_fill_uniform(h + (size_t)o * Kp, (size_t)K, 100 + o, -0.1f, 0.1f);
        REQUIRE_OK(d->mem_upload_bf16(w, h, (size_t)cp * Kp));
        free(h);
    }
    kb_bf16 *o1 = dev_rand(d, nf * osz, 0), *o2 = dev_rand(d, nf * osz, 0);
    const size_t big = (size_t)H * W * (Kp + cp) * sizeof(kb_bf16), small = 7 * (size_t)(Kp + cp) * sizeof(kb_bf16);
    void *work = d->mem_alloc(big);
    REQUIRE(work);
    k_vae_conv_args a;
    memset(&a, 0, sizeof a);
    a.w = kb_in_bf16(w), a.bias = kb_in_bf16(b), a.ldw = Kp, a.cout_w = cp;
    a.H = H, a.W = W, a.cin = ci, a.cout = co, a.kt = 3, a.kh = 3, a.kw = 3, a.work = work;
    a.out = kb_out_bf16(o1), a.x = kb_in_bf16(x), a.nf = nf, a.work_bytes = big;
    REQUIRE_OK(d->vae_conv3d(&a)); /* one shot */
    for (int f = 0; f < nf; f++) { /* frame by frame: the cache holds the frames before (at most 2) */
        const int nc = f < 2 ? f : 2;
        a.out = kb_out_bf16(o2 + (size_t)f * osz), a.x = kb_in_bf16(x + (size_t)f * fsz), a.nf = 1;
        a.cache = kb_in_bf16(nc ? x + (size_t)(f - nc) * fsz : NULL), a.ncache = nc, a.work_bytes = small;
        REQUIRE_OK(d->vae_conv3d(&a));
    }
    float *h1 = dev_read(d, o1, nf * osz), *h2 = dev_read(d, o2, nf * osz);
    CHECK(memcmp(h1, h2, nf * osz * sizeof(float)) == 0);
    double mx = 0;
    for (size_t i = 0; i < nf * osz; i++) mx = fabs(h1[i]) > mx ? fabs(h1[i]) : mx;
    CHECK(mx > 0.01); /* not all zeros */
    free(h1), free(h2);
    d->mem_free(x), d->mem_free(w), d->mem_free(b), d->mem_free(o1), d->mem_free(o2), d->mem_free(work);
}

/* ---- refusals ---- */
TEST(vae_dev_refusals) {
    const k_dev_ops *d = &k_emu_ops;
    float xf[64] = {0}, of[64] = {0};
    kb_bf16 *xb = dev_rand(d, 64, 1), *ob = dev_rand(d, 64, 0), *wb = dev_rand(d, 64, 2);
    k_vae_conv_args a;
    memset(&a, 0, sizeof a);
    a.x = kb_in_f32(xf), a.out = kb_out_bf16(ob), a.w = kb_in_bf16(wb), a.bias = kb_in_bf16(wb);
    a.nf = 1, a.H = 2, a.W = 2, a.cin = 8, a.cout = 8, a.kt = 1, a.kh = 1, a.kw = 1, a.ldw = 8, a.cout_w = 8;
    CHECK(d->vae_conv3d(&a) == -1 && strstr(core_last_error(), "x is fp32"));
    a.x = kb_in_bf16(xb), a.kh = a.kw = 3; /* K = 72 with ldw 8: unpadded weights */
    CHECK(d->vae_conv3d(&a) == -1 && strstr(core_last_error(), "padded to [8, 72]"));
    a.ldw = 72, a.work = ob, a.work_bytes = 16;
    CHECK(d->vae_conv3d(&a) == -1 && strstr(core_last_error(), "one output pixel needs"));
    CHECK(d->vae_rms_norm(kb_out_f32(of), kb_in_bf16(xb), kb_in_bf16(wb), 8, 8, 1) == -1 &&
          strstr(core_last_error(), "out is fp32"));
    CHECK(k_cpu_dev_ops.vae_rms_norm(kb_out_f32(of), kb_in_bf16(xb), kb_in_f32(xf), 8, 8, 1) == -1 &&
          strstr(core_last_error(), "x is bf16"));
    CHECK(d->vae_dupup_add(kb_out_bf16(ob), kb_in_bf16(xb), 1, 1, 1, 3, 4, 1, 0) == -1 &&
          strstr(core_last_error(), "vae_dupup_add"));
    d->mem_free(xb), d->mem_free(ob), d->mem_free(wb);

    /* latents with the wrong z on the device: named, nothing decoded */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vae_dev_refuse", test_tmpdir());
    REQUIRE_OK(vae_tiny_write(dir, 16, 1));
    vae_model *m = vae_load(dir);
    REQUIRE(m);
    REQUIRE_OK(vae_set_device(m, d));
    float lat[12 * 4] = {0}, vid[1];
    CHECK(vae_decode(m, lat, 1, 12, 1, 2, 2, vid) == -1 && strstr(core_last_error(), "z_dim is 16"));
    vae_free(m);
}

/* The device estimate (vae_decoder_estimate_device) is what the emulated device allocates: weights at
 * vae_set_device, the decode state at the first decode, for the tiny preset and both fixtures. */
TEST(vae_dev_estimate_is_allocation) {
    const char *dirs[3] = {NULL, "tests/fixtures/vae_wan21", "tests/fixtures/vae_wan22"};
    char tiny[512];
    snprintf(tiny, sizeof tiny, "%s/vae_dev_est", test_tmpdir());
    REQUIRE_OK(vae_tiny_write(tiny, 16, 3));
    dirs[0] = tiny;
    for (int i = 0; i < 3; i++) {
        vae_model *m = vae_load(dirs[i]);
        REQUIRE(m);
        const vae_config *c = vae_get_config(m);
        const int h = 3, w = 5, T = 2;
        double wb = 0, sb = 0;
        REQUIRE_OK(vae_decoder_estimate_device(c, h, w, &wb, &sb));
        size_t held0, held1, held2;
        k_emu_mem_stats(&held0, NULL);
        REQUIRE_OK(vae_set_device(m, &k_emu_ops));
        k_emu_mem_stats(&held1, NULL);
        const size_t nl = (size_t)c->z_dim * T * h * w;
        float *lat = calloc(nl, sizeof(float)), *vid = malloc(video_n(m, 1, T, h, w) * sizeof(float));
        REQUIRE(lat && vid);
        test_fill_uniform(lat, nl, 5, -1.0f, 1.0f);
        REQUIRE_OK(vae_decode(m, lat, 1, c->z_dim, T, h, w, vid));
        k_emu_mem_stats(&held2, NULL);
        printf("  vae on the emulated device, %s at %d x %d: weights %zu bytes (estimate %.0f), state %zu (estimate "
               "%.0f)\n", dirs[i], h, w, held1 - held0, wb, held2 - held1, sb);
        CHECK((double)(held1 - held0) == wb && (double)vae_device_weight_bytes(m) == wb);
        CHECK((double)(held2 - held1) == sb && (double)vae_state_bytes(m) == sb);
        vae_free(m);
        k_emu_mem_stats(&held2, NULL);
        CHECK(held2 == held0); /* everything given back */
        free(lat), free(vid);
    }
}

/* model.vae_device at --dry-run: auto (default) and cpu resolve, another value is refused naming the key; with
 * model.device cuda and auto the device estimate counts the VAE (weights and the decode phase), with cpu it does not. */
TEST(vae_dev_recipe_key) {
    const char *bin = test_vgrpo_bin();
    static char out[1 << 16];
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run 2>&1", bin) == 0);
    CHECK_MSG(strstr(out, "\n  vae_device: auto\n"), "got: %.2000s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.vae_device=gpu 2>&1", bin) != 0);
    CHECK_MSG(strstr(out, "model.vae_device: must be one of auto|cpu, got \"gpu\""), "got: %.2000s", out);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.device=cuda 2>&1", bin) == 0);
    CHECK_MSG(strstr(out, "VAE decoder weights (bf16)") && strstr(out, "VAE decode state"), "got: %.4000s", out);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.device=cuda "
                                      "--set model.vae_device=cpu 2>&1", bin) == 0);
    CHECK_MSG(strstr(out, "\n  vae_device: cpu\n") && !strstr(out, "VAE decode state"), "got: %.4000s", out);
}

/* The bodies of kernels/body/kb_vae.h on fp32 views against the CPU table's code (kernels/cpu/vae_conv.c), bit for
 * bit: WanRMS_norm + SiLU, DupUp3D's add, and one convolution frame as body im2col rows times k_cpu_gemm (a frame
 * whose taps all read the stream: nothing left out on the CPU side). */
TEST(vae_dev_bodies_equal_cpu_fp32) {
    enum { N = 37, C = 24 };
    float x[N * C], g[C], a[N * C], b[N * C];
    test_fill_uniform(x, N * C, 21, -3.0f, 3.0f);
    test_fill_uniform(g, C, 22, 0.5f, 1.5f);
    for (int silu = 0; silu < 2; silu++) {
        k_cpu_vae_rms_norm(a, x, g, N, C, silu);
        const float scale = (float)sqrt((double)C);
        for (int r = 0; r < N; r++) kb_vae_norm_row(kb_out_f32(b), kb_in_f32(x), kb_in_f32(g), (size_t)r, C, scale, silu);
        CHECK(memcmp(a, b, sizeof a) == 0);
    }
    /* DupUp3D: nf 2, 3 x 4 pixels, 8 -> 4 channels, factor_t 2, first frame dropped */
    const int nf = 2, H = 3, W = 4, ci = 8, co = 4, ft = 2, drop = 1, no = (nf * ft - drop) * 4 * H * W * co;
    float xs[2 * 3 * 4 * 8], oa[3 * 4 * 3 * 4 * 4], ob[3 * 4 * 3 * 4 * 4];
    test_fill_uniform(xs, sizeof xs / sizeof xs[0], 23, -1.0f, 1.0f);
    test_fill_uniform(oa, (size_t)no, 24, -1.0f, 1.0f);
    memcpy(ob, oa, sizeof oa);
    k_cpu_vae_dupup_add(oa, xs, nf, H, W, ci, co, ft, drop);
    for (int e = 0; e < no; e++) kb_vae_dupup_at(kb_out_f32(ob), kb_in_f32(xs), H, W, ci, co, ft, drop, (size_t)e);
    CHECK(memcmp(oa, ob, (size_t)no * sizeof(float)) == 0);
    /* a 3x3x3 convolution frame after two cached frames, with and without 2x up-sampling (kt 1 then) */
    for (int up = 0; up < 2; up++) {
        const int kt = up ? 1 : 3, Hc = 5, Wc = 6, cin = 5, cout = 20, K = kt * 9 * cin, Ho = up ? 2 * Hc : Hc,
                  Wo = up ? 2 * Wc : Wc;
        const size_t fsz = (size_t)Hc * Wc * cin, np = (size_t)Ho * Wo;
        float *cx = malloc(3 * fsz * sizeof(float)), *w = malloc((size_t)cout * K * sizeof(float));
        float *bias = malloc(cout * sizeof(float)), *col = malloc(np * K * sizeof(float));
        float *o1 = malloc(np * cout * sizeof(float)), *o2 = malloc(np * cout * sizeof(float));
        REQUIRE(cx && w && bias && col && o1 && o2);
        test_fill_uniform(cx, 3 * fsz, 25, -1.0f, 1.0f);
        test_fill_uniform(w, (size_t)cout * K, 26, -0.2f, 0.2f);
        test_fill_uniform(bias, cout, 27, -0.5f, 0.5f);
        REQUIRE_OK(k_cpu_vae_conv3d(o1, cx + 2 * fsz, cx, 2, w, bias, 1, Hc, Wc, cin, cout, kt, 3, 3, up, col,
                                    np * K));
        const kb_vae_conv_geom geo = {Hc, Wc, cin, kt, 3, 3, up, 2};
        for (size_t p = 0; p < np; p++)
            for (int k = 0; k < K; k++)
                col[p * K + k] = kb_vae_im2col_at(kb_in_f32(cx + 2 * fsz), kb_in_f32(cx), &geo, 0, p, k);
        k_cpu_gemm(0, 1, (int)np, cout, K, 1.0f, col, K, w, K, 0.0f, o2, cout, bias);
        CHECK_MSG(memcmp(o1, o2, np * cout * sizeof(float)) == 0, "up2x %d", up);
        free(cx), free(w), free(bias), free(col), free(o1), free(o2);
    }
}

/* `vgrpo vae-decode --device cuda --vs-cpu` (scripts/gpu_check.sh's VAE row): on the emulated device it prints the
 * difference from the CPU decode within the row's tolerance; --vs-cpu alone and an unknown device are usage errors;
 * without VGRPO_EMULATE_DEVICE this build (or machine) refuses cuda in one line naming --device. */
TEST(vae_dev_cli_vs_cpu) {
    const char *bin = test_vgrpo_bin(), *tmp = test_tmpdir();
    static char out[1 << 14];
    const char *io = "--vae tests/fixtures/vae_wan22 --latents tests/fixtures/vae_wan22_io.safetensors --name latents_t2";
    REQUIRE(test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s vae-decode %s --out %s/v.safetensors --device cuda "
                                      "--vs-cpu 2>/dev/null", bin, io, tmp) == 0);
    const char *l = strstr(out, "vae-decode: emulated vs cpu: max |device - cpu| ");
    REQUIRE(l != NULL);
    const char *rel = strstr(l, ", relative "), *mean = strstr(l, "mean relative ");
    REQUIRE(rel && mean);
    const double r = atof(rel + 11), mr = atof(mean + 14);
    CHECK_MSG(r > 0 && r <= VAE_DEV_REL_TOL && mr > 0 && mr <= VAE_DEV_MEAN_TOL, "%s", l);
    CHECK(test_run(out, sizeof out, "%s vae-decode %s --out %s/v.safetensors --vs-cpu 2>&1", bin, io, tmp) == 2);
    CHECK_MSG(strstr(out, "--vs-cpu: compares --device cuda with the CPU"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s vae-decode %s --out %s/v.safetensors --device tpu 2>&1", bin, io, tmp) == 2);
    CHECK_MSG(strstr(out, "--device: expected cpu or cuda, got \"tpu\""), "got: %s", out);
    const int rc = test_run(out, sizeof out, "%s vae-decode %s --out %s/v.safetensors --device cuda 2>&1", bin, io, tmp);
    if (rc == 0) return; /* a GPU here: nothing refused */
    CHECK(rc == 1);
    CHECK_MSG(strstr(out, "vgrpo vae-decode: --device cuda: "), "got: %s", out);
}
