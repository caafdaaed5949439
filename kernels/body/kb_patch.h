/* kernels/body/kb_patch.h — the index maps of Wan's patchify and unpatchify (kernels/cpu/patch.c; layouts in
 * kernels/kernels.h). Each body maps one element of the op's output to the element of its input it copies; the
 * backward of either op adds each output-gradient element to that one input element, so no two threads ever touch
 * the same gradient element. Pure data movement: exact in every dtype that stores the values exactly. */
#ifndef KERNELS_BODY_KB_PATCH_H
#define KERNELS_BODY_KB_PATCH_H

#include "kernels/body/kb_base.h"

/* Sizes of a patch layout: video [B, C, F, H, W], patch (pt, ph, pw), grid Fp x Hp x Wp (remainders dropped), S
 * tokens, P = C*pt*ph*pw values per token. */
typedef struct kb_patch_dims {
    int B, C, F, H, W, pt, ph, pw;
    int Fp, Hp, Wp, S, P;
} kb_patch_dims;

KB_FN kb_patch_dims kb_patch_dims_make(int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    kb_patch_dims d;
    d.B = B, d.C = C, d.F = F, d.H = H, d.W = W, d.pt = pt, d.ph = ph, d.pw = pw;
    d.Fp = F / pt, d.Hp = H / ph, d.Wp = W / pw;
    d.S = d.Fp * d.Hp * d.Wp;
    d.P = C * pt * ph * pw;
    return d;
}

/* Element count of the token side [B, S, P] and of the video side [B, C, F, H, W]. */
KB_FN size_t kb_patch_tokens_n(const kb_patch_dims *d) { return (size_t)d->B * d->S * d->P; }
KB_FN size_t kb_patch_video_n(const kb_patch_dims *d) { return (size_t)d->B * d->C * d->F * d->H * d->W; }

/* Patchify: token element o of out [B, S, P] (patch vector (c, kt, kh, kw)) -> its video element in x. */
KB_FN size_t kb_patchify_src(const kb_patch_dims *d, size_t o_) {
    const uint32_t o = (uint32_t)o_; /* both sides < 2^31 elements: the callers check (32-bit index math) */
    uint32_t p = o % (uint32_t)d->P, t = o / (uint32_t)d->P;
    uint32_t s = t % (uint32_t)d->S, b = t / (uint32_t)d->S;
    uint32_t wp = s % (uint32_t)d->Wp, hp = (s / (uint32_t)d->Wp) % (uint32_t)d->Hp, fp = s / ((uint32_t)d->Wp * d->Hp);
    uint32_t kw = p % (uint32_t)d->pw, kh = (p / (uint32_t)d->pw) % (uint32_t)d->ph;
    uint32_t kt = (p / ((uint32_t)d->pw * d->ph)) % (uint32_t)d->pt, c = p / ((uint32_t)d->pw * d->ph * d->pt);
    return (((b * d->C + c) * d->F + fp * d->pt + kt) * d->H + hp * d->ph + kh) * d->W + wp * d->pw + kw;
}

/* Unpatchify: video element o of out [B, C, F, H, W] -> its token element in x [B, S, P] (patch vector
 * (kt, kh, kw, c)), or (size_t)-1 for a remainder position past the patch grid (written as 0). */
KB_FN size_t kb_unpatchify_src(const kb_patch_dims *d, size_t o_) {
    const uint32_t o = (uint32_t)o_; /* both sides < 2^31 elements: the callers check (32-bit index math) */
    uint32_t w = o % (uint32_t)d->W, h = (o / (uint32_t)d->W) % (uint32_t)d->H;
    uint32_t f = (o / ((uint32_t)d->W * d->H)) % (uint32_t)d->F;
    uint32_t c = (o / ((uint32_t)d->W * d->H * d->F)) % (uint32_t)d->C, b = o / ((uint32_t)d->W * d->H * d->F * d->C);
    if (f >= (uint32_t)d->Fp * d->pt || h >= (uint32_t)d->Hp * d->ph || w >= (uint32_t)d->Wp * d->pw) return (size_t)-1;
    uint32_t fp = f / (uint32_t)d->pt, kt = f % (uint32_t)d->pt, hp = h / (uint32_t)d->ph, kh = h % (uint32_t)d->ph;
    uint32_t wp = w / (uint32_t)d->pw, kw = w % (uint32_t)d->pw;
    return (((b * d->Fp + fp) * d->Hp + hp) * d->Wp + wp) * (uint32_t)d->P + ((kt * d->ph + kh) * d->pw + kw) * d->C + c;
}

#endif
