/* bench/bench_clip.c — `vgrpo bench clip --model DIR`: the CLIP towers of model/clip/ (clip_encode_image,
 * clip_encode_text) on a model folder (transformers CLIPModel or open_clip, as clip_load takes), in images/s and
 * texts/s with GFLOP/s and the share of this machine's FMA peak (bench_peak_gflops), and PyTorch eager's figures
 * beside them when --torch FILE holds them (scripts/bench_torch.py --clip DIR --json FILE: the same model folder,
 * batch and thread count).
 *
 * Inputs: `batch` images [B, 3, H, W] at the model's image size (deterministic values in [-2, 2), as normalised
 * pixels), and `batch` prompts of S = min(77, max_positions) token ids (deterministic, in [0, vocab_size); the last
 * one the largest, so every pooling rule picks a real position). One warm-up call, then `reps` timed calls; the
 * figure is the median call. The weights' values do not change the timing.
 * FLOPs per image (the vision tower; N = grid + 1 tokens, D width, M the MLP width, L layers, E the projection):
 *     2 * grid * C * patch^2 * D  +  L * (8 N D^2 + 4 N^2 D + 4 N D M)  +  2 D E
 * and per prompt the same for the text tower with N = S and no patch embedding (attention counted over all S x S
 * positions, as the causal mask is applied to a full product in both implementations). LayerNorms, softmax and the
 * activations are not counted. */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/error.h"
#include "model/clip/clip_model.h"

/* FLOPs of one tower pass over N tokens (the layers and the projection of one pooled token). */
static double tower_flops(const clip_tower_config *t, double N, int proj) {
    const double D = t->width, M = t->mlp;
    return t->layers * (8.0 * N * D * D + 4.0 * N * N * D + 4.0 * N * D * M) + 2.0 * D * proj;
}

double bench_clip_image_flops(const clip_config *c) {
    const double grid = (double)(c->image_h / c->patch) * (double)(c->image_w / c->patch);
    return 2.0 * grid * c->channels * c->patch * c->patch * c->vision.width +
           tower_flops(&c->vision, grid + 1, c->projection_dim);
}

double bench_clip_text_flops(const clip_config *c, int S) {
    return tower_flops(&c->text, S, c->projection_dim);
}

/* Median seconds of `reps` calls of one tower after a warm-up call; -1 on the forward's error. */
static double time_tower(const clip_model *m, int text, const float *px, const int32_t *ids, int B, int S,
                         float *emb, int reps) {
    double t[64];
    for (int r = -1; r < reps; r++) {
        const double t0 = omp_get_wtime();
        const int rc = text ? clip_encode_text(m, ids, B, S, emb) : clip_encode_image(m, px, B, emb);
        if (rc) return -1;
        if (r >= 0) t[r] = omp_get_wtime() - t0;
    }
    return bench_median(t, reps);
}

static void print_row(const char *who, const char *unit_name, int B, double s, double flop, double peak) {
    const double gf = flop * B / s * 1e-9;
    printf("  %-24s %6d %10.2f %10.3f %9.1f %6.1f%%   (%s)\n", who, B, s * 1e3, B / s, gf, 100.0 * gf / peak,
           unit_name);
}

int bench_clip(const bench_clip_opts *o) {
    if (o->threads > 0) {
        omp_set_num_threads(o->threads);
        openblas_set_num_threads(o->threads);
    }
    const int nt = omp_get_max_threads();
    const double tl = omp_get_wtime();
    clip_model *m = clip_load(o->model);
    if (!m) {
        fprintf(stderr, "vgrpo bench clip: %s\n", core_last_error());
        return 1;
    }
    const double load_s = omp_get_wtime() - tl;
    const clip_config *c = clip_get_config(m);
    const int B = o->batch, S = c->max_positions < 77 ? c->max_positions : 77;
    const size_t npx = (size_t)B * c->channels * c->image_h * c->image_w;
    float *px = malloc(npx * sizeof *px), *emb = malloc((size_t)B * c->projection_dim * sizeof *emb);
    int32_t *ids = malloc((size_t)B * S * sizeof *ids);
    int rc = 1;
    if (!px || !emb || !ids) {
        fprintf(stderr, "vgrpo bench clip: out of memory for a batch of %d\n", B);
        goto out;
    }
    for (size_t i = 0; i < npx; i++) px[i] = (float)((i * 2654435761u) % 4000) * 1e-3f - 2.0f;
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < S - 1; s++) ids[b * S + s] = (int32_t)(((b * 131 + s * 7919) % (c->vocab_size - 1)));
        ids[b * S + S - 1] = c->vocab_size - 1;
    }
    const double peak = bench_peak_gflops();
    const double fi = bench_clip_image_flops(c), ft = bench_clip_text_flops(c, S);
    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    printf("vgrpo bench clip: %s (%s layout), %s, %d thread%s, batch %d, median of %d call%s after one warm-up call; "
           "loaded in %.1f s, %.1f M parameters\n", o->model,
           c->format == CLIP_FORMAT_OPEN_CLIP ? "open_clip" : "transformers", cpu, nt, nt == 1 ? "" : "s", B, o->reps,
           o->reps == 1 ? "" : "s", load_s, (double)clip_param_bytes(c) / 4e6);
    printf("vision: %dx%d, patch %d, width %d, %d layers, %d heads, MLP %d; text: %d tokens, width %d, %d layers, "
           "%d heads, MLP %d; projection %d\n", c->image_h, c->image_w, c->patch, c->vision.width, c->vision.layers,
           c->vision.heads, c->vision.mlp, S, c->text.width, c->text.layers, c->text.heads, c->text.mlp,
           c->projection_dim);
    bench_torch_describe();
    printf("FMA peak %.1f GFLOP/s (vgrpo bench peak); %.4g GFLOP per image, %.4g GFLOP per prompt\n\n", peak,
           fi * 1e-9, ft * 1e-9);
    printf("  %-24s %6s %10s %10s %9s %7s\n", "tower", "batch", "ms/call", "items/s", "GFLOP/s", "%peak");
    for (int text = 0; text < 2; text++) {
        if ((text && !o->text) || (!text && !o->image)) continue;
        const double s = time_tower(m, text, px, ids, B, S, emb, o->reps);
        if (s < 0) {
            fprintf(stderr, "vgrpo bench clip: %s\n", core_last_error());
            goto out;
        }
        print_row(text ? "text, vgrpo" : "image, vgrpo", text ? "texts/s" : "images/s", B, s, text ? ft : fi, peak);
        const char *key = text ? "text" : "image";
        const double pms = bench_torch_figure("clip", key, "ms"), pb = bench_torch_figure("clip", key, "batch");
        if (pms > 0 && (int)pb == B) {
            print_row(text ? "text, PyTorch eager" : "image, PyTorch eager", text ? "texts/s" : "images/s", B,
                      pms * 1e-3, text ? ft : fi, peak);
            printf("  %-24s vgrpo %.2fx PyTorch's speed\n", "", pms * 1e-3 / s);
        } else if (pms > 0) {
            printf("  (PyTorch's %s figure is for batch %d, not %d: not shown)\n", key, (int)pb, B);
        }
    }
    printf("\nFLOPs per image 2 grid C p^2 D + L (8 N D^2 + 4 N^2 D + 4 N D M) + 2 D E (N = grid + 1); per prompt the "
           "text tower's with N = %d; %%peak = GFLOP/s over the FMA peak.\nPyTorch eager on the same folder: python "
           "scripts/bench_torch.py --clip %s --batch %d --threads %d --json FILE, then --torch FILE here\n", S,
           o->model, B, nt);
    rc = 0;
out:
    free(px);
    free(emb);
    free(ids);
    clip_free(m);
    return rc;
}
