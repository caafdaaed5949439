/* tests/test_wan_dev.c — the Wan transformer on the device table (model/dit/wan_dev.h) run on the emulated device
 * (kernels/cuda/emu/k_emu.h: the kernel bodies with bf16 storage, k_cpu_ops for GEMM and attention on bf16 operands)
 * against the fp32 CPU model (wan_forward / wan_backward) on the same inputs and weights:
 *   - the forward output and every parameter gradient (and dx, d enc) within a bf16 band in relative L2 (the worst
 *     tensor printed), at the tiny preset (cross_attn_norm, one timestep per sample) and at a 2-block config with
 *     bigger dims (dim 256 = 4 x 64, ffn 512, text 128; no cross_attn_norm; per-token timesteps);
 *   - RECOMPUTE == STORE and a repeated forward, bit for bit; the inference forward equals the training forward;
 *   - a sample's forward (and its dx, d enc) does not depend on its batch mates, bit for bit;
 *   - the memory figures (device activations about half the CPU's; the estimate equals the allocation);
 *   - refusals (a dim that is not a multiple of 8, backward without gradients or after an inference forward);
 *   - the glue bodies add_table forward/backward (kernels/body/kb_modulate.h) against model/dit/wan_layers.c, bit for
 *     bit in fp32;
 *   - the user's side: vgrpo dit-forward --device, the recipe keys model.device / model.dtype and their refusals
 *     (wan_dev_cli_*: also in make test's CUDA smoke subset, against the `make cuda` binary).
 * Nothing here runs on a GPU; the GPU check (scripts/gpu_check.sh) runs the same comparison there. WD_DUMP=1 prints
 * every parameter tensor's figure. */
#include <stdio.h>
#include <sys/stat.h>

#include "kernels/body/kb_host.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"
#include "tests/test.h"
#include "tests/wan_test_util.h"

static const k_dev_ops *emu(void) { return &k_emu_ops; }

static wan_config big_config(void) {
    wan_config c = {{1, 2, 2}, 4, 64, 16, 16, 128, 256, 512, 2, 0, 1e-6, 64};
    return c;
}

static void compare(const wan_config *c, wan_shape sh, const char *label, unsigned long long seed) {
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, c));
    wt_random_params(&m, seed);
    wan_dev_report r;
    double *rel = calloc((size_t)m.layout.count, sizeof(double));
    REQUIRE_OK(wan_dev_compare(emu(), &m, &sh, seed + 1, &r, rel));
    printf("  %s: out rel-L2 %.2e (max-rel %.2e, band %.0e); grads: all %.2e, worst %.2e (%s), worst key bias %.2e "
           "(%s), dx %.2e, denc %.2e (band %.0e, key biases %.0e); recompute %s, checkpoint %s, repeat %s, batch "
           "mates %s\n",
           label, r.out_rel_l2, r.out_max_rel, WAN_DEV_BAND_OUT, r.grad_rel_l2, r.grad_worst_rel_l2, r.grad_worst,
           r.key_bias_rel_l2, r.key_bias_worst, r.dx_rel_l2, r.denc_rel_l2, WAN_DEV_BAND_GRAD, WAN_DEV_BAND_KEY_BIAS,
           r.recompute_same ? "same bits" : "DIFFER", r.checkpoint_same ? "same bits" : "DIFFER",
           r.repeat_same ? "same bits" : "DIFFER",
           r.batch_same ? "same bits" : "DIFFER");
    CHECK(r.out_rel_l2 <= WAN_DEV_BAND_OUT);
    CHECK(r.out_rel_l2 > 1e-5); /* the bf16 rounding really happened */
    if (getenv("WD_DUMP"))
        for (int i = 0; i < m.layout.count; i++) printf("    %-50s %.3e\n", m.layout.tensors[i].name, rel[i]);
    for (int i = 0; i < m.layout.count; i++) {
        const char *name = m.layout.tensors[i].name;
        const double band = wan_dev_is_key_bias(name) ? WAN_DEV_BAND_KEY_BIAS : WAN_DEV_BAND_GRAD;
        CHECK_MSG(rel[i] <= band, "%s: gradient of %s: rel-L2 %.3e > %.0e", label, name, rel[i], band);
    }
    CHECK(r.grad_worst_rel_l2 <= WAN_DEV_BAND_GRAD && r.key_bias_rel_l2 <= WAN_DEV_BAND_KEY_BIAS);
    CHECK(r.dx_rel_l2 <= WAN_DEV_BAND_GRAD);
    CHECK(r.denc_rel_l2 <= WAN_DEV_BAND_GRAD);
    CHECK(r.recompute_same);
    CHECK(r.checkpoint_same); /* whole-block checkpointing: STORE's gradients bit for bit */
    CHECK(r.repeat_same);
    CHECK(r.batch_same == 1);
    free(rel);
    wan_model_free(&m);
}

TEST(wan_dev_tiny_vs_cpu) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    compare(&c, (wan_shape){2, 2, 8, 8, 16, 0}, "tiny, B 2, 32 tokens, 16 text", 31);
}

TEST(wan_dev_2block_vs_cpu) {
    wan_config c = big_config();
    compare(&c, (wan_shape){2, 2, 8, 12, 16, 1}, "2-block dim 256, B 2, 48 tokens, per-token t", 41);
}

/* Forward (+ backward) of host inputs on the emulated device; out, dx, de allocated here. */
static void dev_run(wan_dev_model *d, const wan_shape *sh, wan_acts_mode mode, const float *x, const float *t,
                    const float *e, const float *go, float **out, float **dx, float **de) {
    const wan_config *c = &d->host->cfg;
    const int64_t vox = (int64_t)sh->F * sh->H * sh->W;
    wan_dev_acts *A = wan_dev_acts_new(emu(), c, sh, mode);
    REQUIRE(A != NULL);
    *out = calloc(sh->B * c->out_channels * vox, sizeof(float));
    if (go) *dx = calloc(sh->B * c->in_channels * vox, sizeof(float));
    if (go) *de = calloc((int64_t)sh->B * sh->L * c->text_dim, sizeof(float));
    REQUIRE_OK(wan_dev_run_host(d, A, *out, x, t, e, go, go ? *dx : NULL, go ? *de : NULL));
    wan_dev_acts_free(A);
}

TEST(wan_dev_batch_mates_bitwise) {
    wan_config c = big_config();
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 51);
    wan_dev_model d;
    REQUIRE_OK(wan_dev_model_init(&d, emu(), &m));
    wan_shape big = {3, 1, 8, 8, 8, 0}, one = {1, 1, 8, 8, 8, 0};
    const int64_t nx = 16 * 64, ne = 8 * 128, S = 16;
    float *x = malloc(3 * nx * 4), *t = malloc(3 * S * 4), *e = malloc(3 * ne * 4), *go = malloc(3 * nx * 4);
    test_fill_uniform(x, 3 * nx, 1, -2, 2);
    test_fill_uniform(t, 3, 2, 0, 1000);
    test_fill_uniform(e, 3 * ne, 3, -2, 2);
    test_fill_uniform(go, 3 * nx, 4, -1, 1);
    float *o3, *dx3, *de3, *o1, *dx1, *de1;
    dev_run(&d, &big, WAN_ACTS_STORE, x, t, e, go, &o3, &dx3, &de3);
    dev_run(&d, &one, WAN_ACTS_STORE, x + nx, t + 1, e + ne, go + nx, &o1, &dx1, &de1);
    CHECK(memcmp(o3 + nx, o1, nx * sizeof(float)) == 0);
    CHECK(memcmp(dx3 + nx, dx1, nx * sizeof(float)) == 0);
    CHECK(memcmp(de3 + ne, de1, ne * sizeof(float)) == 0);
    CHECK(wt_max_rel(o3, o1, nx) > 1e-3); /* the batch mates really differ */
    /* the inference forward of the batch equals its training forward */
    float *oi;
    dev_run(&d, &big, WAN_ACTS_INFER, x, t, e, NULL, &oi, NULL, NULL);
    CHECK(memcmp(o3, oi, 3 * nx * sizeof(float)) == 0);
    free(o3), free(dx3), free(de3), free(o1), free(dx1), free(de1), free(oi);
    free(x), free(t), free(e), free(go);
    wan_dev_model_free(&d);
    wan_model_free(&m);
}

TEST(wan_dev_memory_and_refusals) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_shape sh = {2, 2, 8, 8, 16, 0};
    for (int mode = WAN_ACTS_INFER; mode <= WAN_ACTS_RECOMPUTE; mode++) {
        wan_dev_acts *A = wan_dev_acts_new(emu(), &c, &sh, (wan_acts_mode)mode);
        wan_acts *H = wan_acts_new(&c, &sh, (wan_acts_mode)mode);
        REQUIRE(A && H);
        size_t dev = wan_dev_acts_bytes(A), host = wan_acts_bytes(H);
        printf("  tiny, B 2, 32 tokens, mode %d: device activations %zu bytes, CPU %zu (%.2f)\n", mode, dev, host,
               (double)dev / host);
        CHECK(wan_dev_acts_estimate(&c, &sh, (wan_acts_mode)mode) == dev);
        CHECK(dev < 0.75 * host);
        wan_dev_acts_free(A);
        wan_acts_free(H);
    }
    /* a dim the device cannot take */
    wan_config bad = wt_small_config(4, 1); /* text_dim 12 */
    CHECK(wan_dev_acts_new(emu(), &bad, &sh, WAN_ACTS_STORE) == NULL);
    CHECK(strstr(core_last_error(), "text_dim 12 is not a multiple of 8") != NULL);
    wan_model mb;
    REQUIRE_OK(wan_model_init(&mb, &bad));
    wan_dev_model db;
    CHECK(wan_dev_model_init(&db, emu(), &mb) == -1);
    wan_model_free(&mb);
    /* backward without gradients, after an inference forward */
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 61);
    wan_dev_model d;
    REQUIRE_OK(wan_dev_model_init(&d, emu(), &m));
    wan_dev_acts *A = wan_dev_acts_new(emu(), &c, &sh, WAN_ACTS_STORE);
    REQUIRE(A != NULL);
    kb_out none = {NULL, KB_F32};
    kb_in nothing = {NULL, KB_F32};
    CHECK(wan_dev_backward(&d, A, none, none, nothing) == -1);
    CHECK(strstr(core_last_error(), "gradients are not allocated") != NULL);
    REQUIRE_OK(wan_dev_alloc_grads(&d));
    CHECK(wan_dev_backward(&d, A, none, none, nothing) == -1);
    CHECK(strstr(core_last_error(), "no forward has run") != NULL);
    wan_dev_acts_free(A);
    A = wan_dev_acts_new(emu(), &c, &sh, WAN_ACTS_INFER);
    CHECK(wan_dev_backward(&d, A, none, none, nothing) == -1);
    CHECK(strstr(core_last_error(), "inference only") != NULL);
    wan_dev_acts_free(A);
    wan_dev_model_free(&d);
    wan_model_free(&m);
}

/* LoRA on the device (wan_dev.h): a rank-8 adapter on every linear of the tiny preset, B random, the base frozen:
 * the device forward and the adapter's gradients against the fp32 CPU model with the same adapter (wan_lora.h),
 * within the bf16 bands; RECOMPUTE and CHECKPOINT = STORE bit for bit; the adapter switched off = the base; a fresh
 * adapter (B = 0) = the base, value for value (+0 for -0, as on the CPU). */
TEST(wan_dev_lora_vs_cpu) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 71);
    wan_lora l;
    const wan_lora_config lc = {8, 16.0, WAN_LORA_ALL, 5};
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    REQUIRE_OK(wan_lora_alloc_grads(&l));
    for (int i = 1; i < l.layout.count; i += 2) { /* every B random, so A gets gradients too */
        const wan_tensor *t = &l.layout.tensors[i];
        test_fill_uniform(l.params + t->offset, (size_t)t->numel, 80 + (unsigned long long)i, -0.05f, 0.05f);
    }
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    const wan_shape sh = {2, 2, 8, 8, 16, 0};
    const int64_t nx = 2 * 16 * 2 * 8 * 8, ne = 2 * 16 * c.text_dim, nl = l.layout.numel;
    float *x = malloc(nx * 4), *t = malloc(2 * 4), *e = malloc(ne * 4), *go = malloc(nx * 4);
    float *oc = malloc(nx * 4), *od = malloc(nx * 4), *o2 = malloc(nx * 4), *gd = malloc(nl * 4), *g2 = malloc(nl * 4);
    test_fill_uniform(x, nx, 1, -2, 2);
    test_fill_uniform(t, 2, 2, 0, 1000);
    test_fill_uniform(e, ne, 3, -2, 2);
    test_fill_uniform(go, nx, 4, -1, 1);
    /* the CPU: frozen base (no m.grads), the adapter's gradients */
    wan_acts *ca = wan_acts_new(&c, &sh, WAN_ACTS_STORE);
    REQUIRE(ca);
    REQUIRE_OK(wan_forward(&m, ca, NULL, oc, x, t, e));
    REQUIRE_OK(wan_backward(&m, ca, NULL, NULL, NULL, go));
    /* the device */
    wan_dev_model d;
    REQUIRE_OK(wan_dev_model_init(&d, emu(), &m));
    CHECK(d.lora == &l && d.lora_w != NULL);
    const wan_acts_mode modes[3] = {WAN_ACTS_STORE, WAN_ACTS_RECOMPUTE, WAN_ACTS_CHECKPOINT};
    for (int k = 0; k < 3; k++) {
        wan_dev_acts *A = wan_dev_acts_new(emu(), &c, &sh, modes[k]);
        REQUIRE(A);
        REQUIRE_OK(wan_dev_run_host(&d, A, k ? o2 : od, x, t, e, go, NULL, NULL));
        REQUIRE_OK(wan_dev_grads_download(&d, k ? g2 : gd));
        if (k) CHECK_MSG(!memcmp(od, o2, nx * 4) && !memcmp(gd, g2, nl * 4), "LoRA: mode %d differs from STORE", k);
        wan_dev_acts_free(A);
    }
    CHECK(d.grads == NULL); /* the base stays frozen: no base gradients on the device */
    double worst = 0;
    const char *wn = "";
    for (int i = 0; i < l.layout.count; i++) {
        const wan_tensor *tt = &l.layout.tensors[i];
        const double r = wt_l2_rel(gd + tt->offset, l.grads + tt->offset, tt->numel);
        if (r > worst) worst = r, wn = tt->name;
    }
    const double out_rel = wt_l2_rel(od, oc, nx), all = wt_l2_rel(gd, l.grads, nl);
    printf("  LoRA rank 8, every linear, tiny B 2: out rel-L2 %.2e; adapter gradients all %.2e, worst %.2e (%s)\n",
           out_rel, all, worst, wn);
    CHECK(out_rel <= WAN_DEV_BAND_OUT && out_rel > 1e-5);
    CHECK(all <= WAN_DEV_BAND_GRAD && worst <= WAN_DEV_BAND_KEY_BIAS);
    /* switched off: the base model's forward, bit for bit */
    wan_dev_acts *A = wan_dev_acts_new(emu(), &c, &sh, WAN_ACTS_INFER);
    REQUIRE(A);
    float *xd = emu()->mem_alloc(nx * 4), *ed = emu()->mem_alloc(ne * 4), *yd = emu()->mem_alloc(nx * 4);
    REQUIRE_OK(emu()->mem_upload(xd, x, nx * 4));
    REQUIRE_OK(emu()->mem_upload(ed, e, ne * 4));
    REQUIRE_OK(wan_dev_forward_lora(&d, A, kb_out_f32(yd), kb_in_f32(xd), t, kb_in_f32(ed), 0));
    REQUIRE_OK(emu()->mem_download(o2, yd, nx * 4));
    wan_model_attach_lora(&m, NULL);
    wan_dev_model base;
    REQUIRE_OK(wan_dev_model_init(&base, emu(), &m));
    REQUIRE_OK(wan_dev_forward(&base, A, kb_out_f32(yd), kb_in_f32(xd), t, kb_in_f32(ed)));
    REQUIRE_OK(emu()->mem_download(od, yd, nx * 4));
    CHECK(!memcmp(od, o2, nx * 4));
    /* a fresh adapter (B = 0): the base's values */
    wan_lora_reset(&l);
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    REQUIRE_OK(wan_dev_model_upload_lora(&d));
    REQUIRE_OK(wan_dev_forward(&d, A, kb_out_f32(yd), kb_in_f32(xd), t, kb_in_f32(ed)));
    REQUIRE_OK(emu()->mem_download(o2, yd, nx * 4));
    int same = 1;
    for (int64_t i = 0; i < nx; i++) same &= od[i] == o2[i];
    CHECK(same);
    emu()->mem_free(xd), emu()->mem_free(ed), emu()->mem_free(yd);
    wan_dev_acts_free(A);
    wan_acts_free(ca);
    wan_dev_model_free(&base);
    wan_dev_model_free(&d);
    free(x), free(t), free(e), free(go), free(oc), free(od), free(o2), free(gd), free(g2);
    wan_model_free(&m);
    wan_lora_free(&l);
}

/* A second adapter on the same frozen base through the executor (DiffusionNFT's old policy under LoRA): a host view
 * sharing the policy's fp32 weights gets a device view (the base's bf16 copy borrowed, the adapter's own), whose
 * forward equals a separate full copy's with the same adapter bit for bit, at the adapter's bytes only; forgetting
 * the lender removes the view too. */
TEST(wan_dev_exec_lora_view_shares_base) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 31);
    wan_lora l, o;
    const wan_lora_config lc = {8, 16.0, WAN_LORA_ALL, 5};
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    REQUIRE_OK(wan_lora_init(&o, &c, &lc, 0));
    test_fill_uniform(o.params, (size_t)o.layout.numel, 9, -0.05f, 0.05f); /* an adapter unlike the policy's */
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    wan_model view = m; /* trainer/run/old_policy.c's old_view: the policy's base, the old adapter */
    view.lora = &o;
    wan_dev_exec *x = wan_dev_exec_new(emu());
    REQUIRE(x);
    REQUIRE_OK(wan_dev_exec_sync(x, &m, 0));
    size_t held0, held1, peak;
    k_emu_mem_stats(&held0, &peak);
    REQUIRE_OK(wan_dev_exec_sync(x, &view, 0));
    k_emu_mem_stats(&held1, &peak);
    const wan_dev_model *dm = wan_dev_exec_model(x, &m), *dv = wan_dev_exec_model(x, &view);
    REQUIRE(dm && dv);
    CHECK(dv->base_borrowed && dv->w == dm->w && dv->proj_out_b == dm->proj_out_b && dv->lora == &o);
    CHECK_MSG(held1 - held0 == (size_t)o.layout.numel * 2, "the view took %zu bytes, the adapter is %lld",
              held1 - held0, (long long)o.layout.numel * 2);
    /* the view's forward = a separate copy's with the same adapter */
    const wan_shape sh = {1, 2, 8, 8, 16, 0};
    const int64_t nx = 16 * 2 * 8 * 8, ne = 16 * c.text_dim;
    float *xi = malloc(nx * 4), *t = malloc(4), *e = malloc(ne * 4), *ov = malloc(nx * 4), *of = malloc(nx * 4);
    test_fill_uniform(xi, nx, 1, -2, 2);
    test_fill_uniform(t, 1, 2, 0, 1000);
    test_fill_uniform(e, ne, 3, -2, 2);
    wan_dev_acts *A = wan_dev_exec_acts(x, &c, &sh, WAN_ACTS_INFER, 1, 0);
    REQUIRE(A);
    REQUIRE_OK(wan_dev_exec_forward(x, &view, A, ov, xi, t, e));
    wan_model full;
    REQUIRE_OK(wan_model_init(&full, &c));
    memcpy(full.params, m.params, sizeof(float) * (size_t)m.layout.numel);
    REQUIRE_OK(wan_model_attach_lora(&full, &o));
    REQUIRE_OK(wan_dev_exec_forward(x, &full, A, of, xi, t, e));
    CHECK(!memcmp(ov, of, nx * 4));
    CHECK(!wan_dev_exec_model(x, &full)->base_borrowed); /* other fp32 weights: a copy of its own */
    /* a new old adapter: uploaded alone at the next version */
    test_fill_uniform(o.params, (size_t)o.layout.numel, 10, -0.05f, 0.05f);
    REQUIRE_OK(wan_dev_exec_sync(x, &view, 1));
    REQUIRE_OK(wan_dev_exec_forward(x, &view, A, ov, xi, t, e));
    REQUIRE_OK(wan_dev_exec_sync(x, &full, 1));
    REQUIRE_OK(wan_dev_exec_forward(x, &full, A, of, xi, t, e));
    CHECK(!memcmp(ov, of, nx * 4));
    wan_dev_acts_free(A);
    wan_dev_exec_forget(x, &full);
    wan_dev_exec_forget(x, &m); /* the lender: its view goes with it */
    size_t held2;
    k_emu_mem_stats(&held2, &peak);
    CHECK_MSG(held2 < held0, "held %zu bytes after forgetting the lender, %zu with it alone", held2, held0);
    wan_dev_exec_close(x);
    free(xi), free(t), free(e), free(ov), free(of);
    wan_model_free(&full);
    wan_model_free(&m);
    wan_lora_free(&l);
    wan_lora_free(&o);
}

/* Device memory at Wan shapes (the start-up estimate, nothing allocated): 81 frames 480 x 832 = 32,760 video tokens,
 * 512 text tokens, batch 1, per mode; whole-block checkpointing keeps the block inputs and one block, so the A14B's
 * training activations fit one 141 GiB GPU beside its bf16 weights (LoRA: a frozen base), RECOMPUTE's do not. */
TEST(wan_dev_memory_wan_shapes) {
    const char *presets[2] = {"wan2.1-t2v-1.3b", "wan2.2-t2v-a14b"};
    const wan_shape sh = {1, 21, 60, 104, 512, 0};
    const double gib = 1024.0 * 1024.0 * 1024.0;
    for (int p = 0; p < 2; p++) {
        wan_config c;
        REQUIRE_OK(wan_config_preset(&c, presets[p]));
        double by[4];
        for (int mode = 0; mode < 4; mode++) by[mode] = (double)wan_dev_acts_estimate(&c, &sh, (wan_acts_mode)mode) / gib;
        printf("  %s, 32760 tokens, 512 text, B 1: device activations INFER %.1f, STORE %.1f, RECOMPUTE %.1f, "
               "CHECKPOINT %.1f GiB\n", presets[p], by[0], by[1], by[2], by[3]);
        CHECK(by[3] > by[0] && by[3] < 0.25 * by[2]);
        if (p == 1) CHECK(by[3] < 40.0 && by[2] > 141.0); /* A14B: checkpoint fits beside 26.6 GiB of bf16 weights */
    }
}

/* The glue bodies against model/dit/wan_layers.c: fp32 bit for bit (both broadcast forms). */
TEST(kbody_add_table) {
    const int R = 5, D = 24;
    for (int bc = 0; bc <= 1; bc++) {
        const int nj = bc ? 2 : 6, snj = bc ? 1 : 6;
        float *table = malloc(nj * D * 4), *src = malloc(R * snj * D * 4), *o_c = malloc(R * nj * D * 4);
        float *o_b = malloc(R * nj * D * 4), *dmod = malloc(R * nj * D * 4);
        float *dt_c = malloc(nj * D * 4), *dt_b = malloc(nj * D * 4), *ds_c = malloc(R * snj * D * 4);
        float *ds_b = malloc(R * snj * D * 4);
        test_fill_uniform(table, nj * D, 1, -1, 1);
        test_fill_uniform(src, R * snj * D, 2, -1, 1);
        test_fill_uniform(dmod, R * nj * D, 3, -1, 1);
        test_fill_uniform(dt_c, nj * D, 4, -1, 1);
        test_fill_uniform(ds_c, R * snj * D, 5, -1, 1);
        memcpy(dt_b, dt_c, nj * D * 4), memcpy(ds_b, ds_c, R * snj * D * 4);
        k_cpu_add_table(o_c, table, src, R, nj, D, snj);
        kbh_add_table_forward(kb_out_f32(o_b), kb_in_f32(table), kb_in_f32(src), R, nj, D, snj);
        CHECK(memcmp(o_c, o_b, R * nj * D * 4) == 0);
        k_cpu_add_table_bwd(dt_c, ds_c, dmod, R, nj, D, snj);
        kbh_add_table_backward(kb_out_f32(dt_b), kb_out_f32(ds_b), kb_in_f32(dmod), R, nj, D, snj);
        CHECK(memcmp(dt_c, dt_b, nj * D * 4) == 0);
        CHECK(memcmp(ds_c, ds_b, R * snj * D * 4) == 0);
        /* the emulated device's entries are the same bodies */
        memset(o_b, 0, R * nj * D * 4);
        REQUIRE_OK(k_emu_ops.add_table_forward(kb_out_f32(o_b), kb_in_f32(table), kb_in_f32(src), R, nj, D, snj));
        CHECK(memcmp(o_c, o_b, R * nj * D * 4) == 0);
        CHECK(k_emu_ops.add_table_forward(kb_out_f32(o_b), kb_in_f32(table), kb_in_f32(src), R, nj, D, 3) == -1);
        free(table), free(src), free(o_c), free(o_b), free(dmod), free(dt_c), free(dt_b), free(ds_c), free(ds_b);
    }
}

/* vgrpo dit-forward --device: cpu is the default (same bytes); cuda is refused with one line where there is no GPU
 * (this machine: a plain build says it was built without the backend, a `make cuda` build that there is no GPU;
 * `make test` runs this against both binaries). */
TEST(wan_dev_cli_device) {
    const char *tmp = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[8192], a[700], b[700];
    snprintf(a, sizeof a, "%s/default.safetensors", tmp);
    snprintf(b, sizeof b, "%s/cpu.safetensors", tmp);
    const char *io = "--model tests/fixtures/wan_multihead --inputs tests/fixtures/wan_multihead_io.safetensors";
    REQUIRE(test_run(out, sizeof out, "%s dit-forward %s --out %s", bin, io, a) == 0);
    REQUIRE(test_run(out, sizeof out, "%s dit-forward %s --out %s --device cpu", bin, io, b) == 0);
    CHECK(test_run(out, sizeof out, "cmp %s %s", a, b) == 0);
    CHECK(test_run(out, sizeof out, "%s dit-forward %s --out %s/x.safetensors --device cuda", bin, io, tmp) == 1);
    CHECK_MSG(strstr(out, "vgrpo dit-forward: --device cuda: ") && strchr(out, '\n') == out + strlen(out) - 1 &&
                  (strstr(out, "built without the CUDA backend") || strstr(out, "GPU")),
              "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s dit-forward %s --out %s/x.safetensors --device tpu", bin, io, tmp) == 2);
    CHECK_MSG(strstr(out, "--device: expected cpu or cuda"), "got: %s", out);
}

/* Recipe keys model.device and model.dtype (core/recipe.h): defaults and resolution, the refused combinations
 * (naming the key), --dry-run passing anywhere, and the one-line run-time refusal of cuda where there is no GPU,
 * before anything is written (cli/model_init.c). */
TEST(wan_dev_cli_recipe_device) {
    const char *tmp = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384];
    const char *tiny = "recipes/tiny-cpu.yaml";
    REQUIRE(test_run(out, sizeof out, "%s run %s --dry-run 2>/dev/null", bin, tiny) == 0);
    CHECK_MSG(strstr(out, "\n  device: cpu\n  dtype: fp32\n"), "got: %s", out);
    REQUIRE(test_run(out, sizeof out, "%s run %s --dry-run --set model.device=cuda 2>/dev/null", bin, tiny) == 0);
    CHECK_MSG(strstr(out, "\n  device: cuda\n  dtype: bf16\n"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run %s --dry-run --set model.dtype=bf16", bin, tiny) == 1);
    CHECK_MSG(strstr(out, "model.dtype: bf16 needs model.device cuda"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run %s --dry-run --set model.device=cuda --set model.dtype=fp32", bin, tiny) ==
          1);
    CHECK_MSG(strstr(out, "model.dtype: fp32 on model.device cuda is not implemented"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run %s --dry-run --set model.device=tpu", bin, tiny) == 1);
    CHECK_MSG(strstr(out, "model.device: must be one of cpu|cuda"), "got: %s", out);
    /* the run itself: one line, and no run folder, no model written */
    CHECK(test_run(out, sizeof out,
                   "%s run %s --set model.device=cuda --set model.path=%s/model --set logging.run_dir=%s/run "
                   "2>&1 >/dev/null",
                   bin, tiny, tmp, tmp) == 1);
    CHECK_MSG(strstr(out, "vgrpo run: model.device: cuda: ") &&
                  (strstr(out, "built without the CUDA backend") || strstr(out, "GPU")),
              "got: %s", out);
    char path[700];
    struct stat sb;
    snprintf(path, sizeof path, "%s/run", tmp);
    CHECK(stat(path, &sb) != 0);
    snprintf(path, sizeof path, "%s/model", tmp);
    CHECK(stat(path, &sb) != 0);
}
