/* kernels/cpu/patch.c — the patch layouts of the Wan DiT: patchify (video [B, C, F, H, W] to token rows, the
 * data movement of the Conv3d patch embedding with kernel = stride = (pt, ph, pw)) and Wan's unpatchify (token
 * rows after proj_out back to [B, C, F, H, W]), with their backward (adjoint) permutations.
 *
 * Grid: Fp = F/pt, Hp = H/ph, Wp = W/pw (integer division), S = Fp*Hp*Wp tokens in (f, h, w) row-major order.
 * Patchify patch vector: (c, kt, kh, kw) order, the flattening of a Conv3d weight [Dout, C, pt, ph, pw].
 * Unpatchify patch vector: (kt, kh, kw, c) order, as diffusers WanTransformer3DModel.forward does
 * reshape(B, Fp, Hp, Wp, pt, ph, pw, C).permute(0, 7, 1, 4, 2, 5, 3, 6).
 * Sizes that are not multiples of the patch: as Conv3d, patchify ignores the trailing remainder (its gradient is
 * untouched), and unpatchify writes zeros there. Pure data movement: results are exact. */
#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

/* below this many elements a parallel region costs more than the copy */
#define PAR(n) ((size_t)(n) >= K_PAR_MIN_ELEMS)

/* out[b, (fp*Hp + hp)*Wp + wp, ((c*pt + kt)*ph + kh)*pw + kw] = x[b, c, fp*pt + kt, hp*ph + kh, wp*pw + kw].
 * x [B, C, F, H, W]; out [B, S, C*pt*ph*pw]. */
static void patchify_forward_run(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    int Fp = F / pt, Hp = H / ph, Wp = W / pw, P = C * pt * ph * pw;
#pragma omp parallel for collapse(3) schedule(static) if (PAR((size_t)B * C * F * H * W))
    for (int b = 0; b < B; b++)
        for (int fp = 0; fp < Fp; fp++)
            for (int hp = 0; hp < Hp; hp++)
                for (int wp = 0; wp < Wp; wp++) {
                    float *o = out + (((size_t)b * Fp + fp) * Hp * Wp + (size_t)hp * Wp + wp) * P;
                    for (int c = 0; c < C; c++)
                        for (int kt = 0; kt < pt; kt++)
                            for (int kh = 0; kh < ph; kh++) {
                                const float *src = x + ((((size_t)b * C + c) * F + (size_t)fp * pt + kt) * H +
                                                        (size_t)hp * ph + kh) * W + (size_t)wp * pw;
                                memcpy(o, src, (size_t)pw * sizeof(float));
                                o += pw;
                            }
                }
}

/* dx[b, c, f, h, w] += dout[b, s, p] for the same index map as the forward. dx [B, C, F, H, W]. */
static void patchify_backward_run(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph,
                             int pw) {
    int Fp = F / pt, Hp = H / ph, Wp = W / pw, P = C * pt * ph * pw;
#pragma omp parallel for collapse(3) schedule(static) if (PAR((size_t)B * C * F * H * W))
    for (int b = 0; b < B; b++)
        for (int fp = 0; fp < Fp; fp++)
            for (int hp = 0; hp < Hp; hp++)
                for (int wp = 0; wp < Wp; wp++) {
                    const float *g = dout + (((size_t)b * Fp + fp) * Hp * Wp + (size_t)hp * Wp + wp) * P;
                    for (int c = 0; c < C; c++)
                        for (int kt = 0; kt < pt; kt++)
                            for (int kh = 0; kh < ph; kh++) {
                                float *dst = dx + ((((size_t)b * C + c) * F + (size_t)fp * pt + kt) * H +
                                                   (size_t)hp * ph + kh) * W + (size_t)wp * pw;
                                for (int kw = 0; kw < pw; kw++) dst[kw] += g[kw];
                                g += pw;
                            }
                }
}

/* out[b, c, fp*pt + kt, hp*ph + kh, wp*pw + kw] = x[b, (fp*Hp + hp)*Wp + wp, ((kt*ph + kh)*pw + kw)*C + c].
 * x [B, S, pt*ph*pw*C]; out [B, C, F, H, W] (remainder positions, if any, set to 0). */
static void unpatchify_forward_run(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph,
                              int pw) {
    int Fp = F / pt, Hp = H / ph, Wp = W / pw, P = C * pt * ph * pw;
    if (F % pt || H % ph || W % pw) memset(out, 0, (size_t)B * C * F * H * W * sizeof(float));
#pragma omp parallel for collapse(3) schedule(static) if (PAR((size_t)B * C * F * H * W))
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int fp = 0; fp < Fp; fp++)
                for (int kt = 0; kt < pt; kt++)
                    for (int hp = 0; hp < Hp; hp++)
                        for (int kh = 0; kh < ph; kh++) {
                            float *dst = out + ((((size_t)b * C + c) * F + (size_t)fp * pt + kt) * H +
                                                (size_t)hp * ph + kh) * W;
                            const float *src = x + (((size_t)b * Fp + fp) * Hp + hp) * Wp * (size_t)P +
                                               ((size_t)(kt * ph + kh) * pw) * C + c;
                            for (int wp = 0; wp < Wp; wp++)
                                for (int kw = 0; kw < pw; kw++)
                                    dst[wp * pw + kw] = src[(size_t)wp * P + (size_t)kw * C];
                        }
}

/* dx[b, s, p] += dout[b, c, f, h, w] for the same index map as the forward. dx [B, S, pt*ph*pw*C]. */
static void unpatchify_backward_run(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph,
                               int pw) {
    int Fp = F / pt, Hp = H / ph, Wp = W / pw, P = C * pt * ph * pw;
    /* parallel over token rows so that each thread writes its own rows of dx */
#pragma omp parallel for collapse(3) schedule(static) if (PAR((size_t)B * C * F * H * W))
    for (int b = 0; b < B; b++)
        for (int fp = 0; fp < Fp; fp++)
            for (int hp = 0; hp < Hp; hp++)
                for (int wp = 0; wp < Wp; wp++) {
                    float *d = dx + (((size_t)b * Fp + fp) * Hp * Wp + (size_t)hp * Wp + wp) * P;
                    for (int kt = 0; kt < pt; kt++)
                        for (int kh = 0; kh < ph; kh++)
                            for (int kw = 0; kw < pw; kw++)
                                for (int c = 0; c < C; c++) {
                                    size_t src = ((((size_t)b * C + c) * F + (size_t)fp * pt + kt) * H +
                                                  (size_t)hp * ph + kh) * W + (size_t)wp * pw + kw;
                                    d[((kt * ph + kh) * pw + kw) * C + c] += dout[src];
                                }
                }
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_patchify_forward(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    K_PROF_BEGIN();
    patchify_forward_run(out, x, B, C, F, H, W, pt, ph, pw);
    K_PROF_END("patchify_forward", (int64_t)B * C * F * H * W, 0);
}

void k_cpu_patchify_backward(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    K_PROF_BEGIN();
    patchify_backward_run(dx, dout, B, C, F, H, W, pt, ph, pw);
    K_PROF_END("patchify_backward", (int64_t)B * C * F * H * W, 0);
}

void k_cpu_unpatchify_forward(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    K_PROF_BEGIN();
    unpatchify_forward_run(out, x, B, C, F, H, W, pt, ph, pw);
    K_PROF_END("unpatchify_forward", (int64_t)B * C * F * H * W, 0);
}

void k_cpu_unpatchify_backward(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph,
                               int pw) {
    K_PROF_BEGIN();
    unpatchify_backward_run(dx, dout, B, C, F, H, W, pt, ph, pw);
    K_PROF_END("unpatchify_backward", (int64_t)B * C * F * H * W, 0);
}
