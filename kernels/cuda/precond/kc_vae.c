/* kernels/cuda/precond/kc_vae.c — the host drivers of the device's Wan VAE entries (kc_vae.h). */
#include "kernels/cuda/precond/kc_vae.h"

#include "core/error.h"

static int round8(int n) { return (n + 7) / 8 * 8; }

static int bf16_view(const char *be, const char *op, const char *name, const void *p, kb_dtype t, int optional) {
    if (!p) return optional ? 0 : core_error("%s %s: %s is NULL", be, op, name);
    if (t != KB_BF16)
        return core_error("%s %s: %s is %s: the device's VAE takes bf16 activations and weights", be, op, name,
                          t == KB_F32 ? "fp32" : "of an unknown dtype");
    return 0;
}
#define VIEW(op, v, opt) bf16_view(b->name, op, #v, (v).p, (v).t, opt)

int kc_vae_conv3d(const kc_vae_backend *b, const k_vae_conv_args *a) {
    const char *op = "vae_conv3d";
    if (VIEW(op, a->out, 0) || VIEW(op, a->x, 0) || VIEW(op, a->cache, 1) || VIEW(op, a->w, 0) ||
        VIEW(op, a->bias, 0))
        return -1;
    if (a->nf < 1 || a->H < 1 || a->W < 1 || a->cin < 1 || a->cout < 1 || a->kt < 1 || a->kt > 3 || a->kh < 1 ||
        a->kw < 1 || a->ncache < 0 || a->ncache > 2)
        return core_error("%s %s: nf %d, H %d, W %d, cin %d, cout %d, kernel %dx%dx%d, ncache %d out of range", b->name,
                          op, a->nf, a->H, a->W, a->cin, a->cout, a->kt, a->kh, a->kw, a->ncache);
    if (a->up2x && a->kt != 1) return core_error("%s %s: up2x with kt %d (kt 1 only)", b->name, op, a->kt);
    const int K = a->kt * a->kh * a->kw * a->cin, Kp = round8(K), cp = round8(a->cout);
    if (a->ldw != Kp || a->cout_w != cp)
        return core_error("%s %s: weights [%d, %d] for cout %d, K %d: the device takes them padded to [%d, %d]", b->name,
                          op, a->cout_w, a->ldw, a->cout, K, cp, Kp);
    const int Ho = a->up2x ? 2 * a->H : a->H, Wo = a->up2x ? 2 * a->W : a->W;
    const size_t npix = (size_t)Ho * Wo;
    const int padded = a->cout % 8 != 0;
    kb_bf16 *out = (kb_bf16 *)a->out.p;
    k_gemm_args g = {0};
    g.transB = 1, g.N = padded ? cp : a->cout, g.alpha = 1.0f, g.beta = 0.0f;
    g.B = a->w, g.ldb = Kp, g.epi = K_EPI_BIAS, g.bias = a->bias.p;
    const int pointwise = a->kt == 1 && a->kh == 1 && a->kw == 1 && !a->up2x && a->cin % 8 == 0;
    /* rows of one chunk: im2col rows (not for the pointwise case) and the padded output block */
    const size_t row_bytes = ((pointwise ? 0 : (size_t)Kp) + (padded ? (size_t)cp : 0)) * sizeof(kb_bf16);
    size_t rows = row_bytes ? a->work_bytes / row_bytes : (size_t)a->nf * npix;
    if (rows < 1)
        return core_error("%s %s: work holds %zu bytes, one output pixel needs %zu", b->name, op, a->work_bytes,
                          row_bytes);
    if (rows > (size_t)1 << 30) rows = (size_t)1 << 30;
    kb_bf16 *col = (kb_bf16 *)a->work, *cbuf = col + (pointwise ? 0 : rows * (size_t)Kp);
    const kb_vae_conv_geom geo = {a->H, a->W, a->cin, a->kt, a->kh, a->kw, a->up2x, a->cache.p ? a->ncache : 0};
    const int nfg = pointwise ? 1 : a->nf;                        /* the pointwise GEMM runs over all frames at once */
    const size_t span = pointwise ? (size_t)a->nf * npix : npix; /* its rows */
    for (int f = 0; f < nfg; f++)
        for (size_t r0 = 0; r0 < span; r0 += rows) {
            const size_t nr = span - r0 < rows ? span - r0 : rows;
            kb_bf16 *dst = out + ((size_t)f * npix + r0) * a->cout;
            if (pointwise) {
                g.A = kb_in_bf16((const kb_bf16 *)a->x.p + r0 * a->cin), g.lda = a->cin, g.K = a->cin;
            } else {
                if (b->im2col(col, Kp, K, a->x, a->cache, geo, f, r0, nr)) return -1;
                g.A = kb_in_bf16(col), g.lda = Kp, g.K = Kp;
            }
            g.M = (int)nr;
            g.C = kb_out_bf16(padded ? cbuf : dst), g.ldc = g.N;
            if (b->gemm(&g)) return core_error_push("%s %s: ", b->name, op);
            if (padded && b->copy2d(dst, (size_t)a->cout * sizeof(kb_bf16), cbuf, (size_t)cp * sizeof(kb_bf16),
                                    (size_t)a->cout * sizeof(kb_bf16), nr))
                return -1;
        }
    return 0;
}

int kc_vae_attention(const kc_vae_backend *b, kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale,
                     void *work, size_t work_bytes) {
    const char *op = "vae_attention";
    if (VIEW(op, o, 0) || VIEW(op, q, 0) || VIEW(op, k, 0) || VIEW(op, v, 0)) return -1;
    if (S < 1 || C < 8 || C % 8) return core_error("%s %s: S %d, C %d (C a multiple of 8)", b->name, op, S, C);
    const int Sp = round8(S);
    const size_t need = (size_t)S * Sp * (sizeof(float) + sizeof(kb_bf16));
    if (!work || work_bytes < need)
        return core_error("%s %s: work holds %zu bytes, S = %d needs %zu", b->name, op, work_bytes, S, need);
    float *s = (float *)work;
    kb_bf16 *p = (kb_bf16 *)(s + (size_t)S * Sp);
    k_gemm_args g = {0};
    g.transB = 1, g.M = S, g.N = S, g.K = C, g.alpha = scale, g.beta = 0.0f, g.epi = K_EPI_NONE;
    g.A = q, g.lda = C, g.B = k, g.ldb = C, g.C = kb_out_f32(s), g.ldc = Sp;
    if (b->gemm(&g)) return core_error_push("%s %s (q k^T): ", b->name, op);
    if (b->softmax(p, s, S, Sp)) return -1;
    k_gemm_args h = {0};
    h.M = S, h.N = C, h.K = S, h.alpha = 1.0f, h.beta = 0.0f, h.epi = K_EPI_NONE;
    h.A = kb_in_bf16(p), h.lda = Sp, h.B = v, h.ldb = C, h.C = o, h.ldc = C;
    if (b->gemm(&h)) return core_error_push("%s %s (P v): ", b->name, op);
    return 0;
}

int kc_vae_check_norm(const char *be, kb_out out, kb_in x, kb_in gamma, int64_t n, int C) {
    const char *op = "vae_rms_norm";
    if (bf16_view(be, op, "out", out.p, out.t, 0) || bf16_view(be, op, "x", x.p, x.t, 0) ||
        bf16_view(be, op, "gamma", gamma.p, gamma.t, 0))
        return -1;
    if (n < 0 || C < 1) return core_error("%s %s: n %lld rows of C %d", be, op, (long long)n, C);
    return 0;
}

int kc_vae_check_dupup(const char *be, kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft,
                       int drop) {
    const char *op = "vae_dupup_add";
    if (bf16_view(be, op, "out", out.p, out.t, 0) || bf16_view(be, op, "x", x.p, x.t, 0)) return -1;
    if (nf < 1 || H < 1 || W < 1 || cin < 1 || cout < 1 || (ft != 1 && ft != 2) || drop < 0 || drop >= nf * ft ||
        (cout * ft * 4) % cin)
        return core_error("%s %s: nf %d, H %d, W %d, cin %d, cout %d, factor_t %d, drop %d", be, op, nf, H, W, cin, cout,
                          ft, drop);
    return 0;
}
