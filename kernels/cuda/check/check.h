/* kernels/cuda/check/check.h — the parts of the GPU check (gpu_check.c runs them in order). Each compares ops of
 * k_cuda_ops with the CPU reference in this same binary on fresh random inputs and prints rows of the table
 * (check_util.h). References: k_cpu_ops (kernels/cpu/) for the layer ops, GEMM and attention; the kernel bodies run
 * on the CPU (kernels/body/kb_host.h) for the flow and optimizer ops, which `make test` proves bit-identical to
 * model/flow and trainer/optim (tests/test_kernel_bodies_flow.c), since kernels/ may not include those folders. */
#ifndef KERNELS_CUDA_CHECK_CHECK_H
#define KERNELS_CUDA_CHECK_CHECK_H

/* Shapes of the check (gpu_check --shapes). wan: Wan 2.1 14B at 81 frames 480x832 (latent 16 x 21 x 60 x 104, patch
 * 1x2x2, so 21 x 30 x 52 = 32760 tokens), dim 5120 = 40 heads x 128, FFN 13824, 512 text tokens, AdamW over 64 Mi
 * parameters. quick: 5 latent frames (7800 tokens), same widths. small (stage 1): Wan's head dim at a small width,
 * dim 1024 = 8 heads x 128, FFN 2816, 128 text tokens, latent 16 x 5 x 24 x 32 (960 tokens), AdamW over 1 Mi.
 * tiny (the emulated device): dim 256 = 4 heads x 64, FFN 512, 64 text tokens, 480 tokens, AdamW over 1 Mi. */
typedef struct {
    int D, H, Dh, FFN, L;           /* model dim, heads, head dim, FFN width, text tokens */
    int C, F, Hl, Wl, pt, ph, pw;   /* latent channels, frames, height, width; patch */
    int Fp, Hp, Wp, S;              /* token grid and token count */
    int rows;                        /* rows (queries, keys) sampled for the CPU reference of GEMM and attention */
    long long adamw_n;               /* parameters of the AdamW / sum-of-squares rows */
    unsigned long long seed;
} ck_shapes;

void check_layers(const ck_shapes *s, const char *only);
void check_flow(const ck_shapes *s, const char *only);
void check_gemm(const ck_shapes *s, const char *only);
void check_attention(const ck_shapes *s, const char *only);
/* Batch invariance (check_invariance.c): GEMM rows at M = 1, 2, 8, S/2 vs M = S; attention's sample alone vs in a
 * batch of 2 and 8. */
void check_invariance(const ck_shapes *s, const char *only);
/* Speed: bf16 GEMM at gemm_n^3 and attention fwd / fwd+bwd at B1 H40 S attn_s D128. */
void check_perf(int gemm_n, int attn_s, const char *only);

/* 1 when `only` is NULL or a substring of name. */
int ck_selected(const char *name, const char *only);

/* Parts of the check that live above kernels/ (the Wan DiT rows: model/dit/check/check_dit.c; the GRPO rows:
 * cli/check/check_grpo.c) register themselves from a constructor under a group name ("block", "dit", "grpo"), since
 * kernels/ may not call into model/; gpu_check runs them, in registration order, after the op rows (with the same
 * shapes and --only), or alone with --group NAME. Up to CK_MAX_PARTS. */
#define CK_MAX_PARTS 8
typedef void (*ck_part_fn)(const ck_shapes *s, const char *only);
void ck_register_part(const char *group, ck_part_fn fn);

#endif
