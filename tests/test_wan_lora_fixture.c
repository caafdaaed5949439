/* tests/test_wan_lora_fixture.c — LoRA adapters against diffusers 0.42.1 and peft 0.21.2 (fixtures from
 * scripts/fixtures_lora.py; the base is the tiny preset as `vgrpo init-model --preset tiny --seed 7 --experts 2`
 * makes it, rebuilt here with wan_params_init_random):
 *   (a) the adapter vgrpo wrote (tests/fixtures/lora_vgrpo) as diffusers (load_lora_weights, also into
 *       transformer_2) and peft (PeftModel.from_pretrained) loaded it: vgrpo's forward with it equals theirs; the
 *       current writer still writes those files byte for byte; `vgrpo export --merge` gives the transformer whose
 *       diffusers forward was recorded;
 *   (b) adapters saved by diffusers and by peft, loaded by vgrpo: the same forward as theirs.
 * Every adapter has B != 0 and alpha != r, and every output is checked to differ from the base model's. */
#include <stdio.h>

#include "core/safetensors.h"
#include "model/dit/wan_lora.h"
#include "tests/test.h"
#include "tests/wan_test_util.h"

#define OUT_TOL 1e-5
#define SEED 7

typedef struct {
    st_file *io;
    float *x, *t, *e;
    int64_t no;
    wan_shape sh;
} fx;

static void fx_open(fx *f) {
    f->io = st_open("tests/fixtures/lora_io.safetensors");
    REQUIRE(f->io != NULL);
    int nd_x = 0, nd_e = 0;
    int64_t sx[8], se[8];
    f->x = wt_read(f->io, "hidden_states", &nd_x, sx, NULL);
    f->t = wt_read(f->io, "timestep", NULL, NULL, NULL);
    f->e = wt_read(f->io, "encoder_hidden_states", &nd_e, se, NULL);
    REQUIRE(f->x && f->t && f->e && nd_x == 5 && nd_e == 3);
    f->sh = (wan_shape){(int)sx[0], (int)sx[2], (int)sx[3], (int)sx[4], (int)se[1], 0};
    f->no = sx[0] * sx[1] * sx[2] * sx[3] * sx[4];
}

static void fx_close(fx *f) { free(f->x), free(f->t), free(f->e), st_close(f->io); }

static void tiny_base(wan_model *m, int expert) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(m, &c));
    wan_params_init_random(m, SEED + (uint64_t)expert);
}

/* vgrpo's forward of m (with its attached adapter, if any) on the fixture's inputs. */
static float *run(const wan_model *m, const fx *f) {
    wan_acts *A = wan_acts_new(&m->cfg, &f->sh, WAN_ACTS_INFER);
    REQUIRE(A != NULL);
    float *out = calloc((size_t)f->no, sizeof(float));
    REQUIRE_OK(wan_forward(m, A, NULL, out, f->x, f->t, f->e));
    wan_acts_free(A);
    return out;
}

/* out vs the fixture's tensor `name` (<= OUT_TOL), and away from the base output `base_name`. Returns the error. */
static double compare(const fx *f, const float *out, const char *name, const char *base_name, const char *what) {
    float *ref = wt_read(f->io, name, NULL, NULL, NULL);
    float *base = wt_read(f->io, base_name, NULL, NULL, NULL);
    REQUIRE(ref && base);
    double err = wt_max_rel(out, ref, f->no), off = wt_max_rel(ref, base, f->no), off2 = wt_max_rel(out, base, f->no);
    CHECK_MSG(err <= OUT_TOL, "%s: vgrpo vs %s: max|a-b|/max|b| = %.3g", what, name, err);
    CHECK_MSG(off > 1e-2 && off2 > 1e-2, "%s: the adapter does not change the output (%.3g, %.3g)", what, off, off2);
    double mad = 0;
    for (int64_t i = 0; i < f->no; i++) mad = fmax(mad, fabs((double)out[i] - ref[i]));
    fprintf(stderr, "  %-44s vs %-30s max|a-b| %.2e, /max|b| %.2e (the adapter moves it by %.2f)\n", what, name, mad,
            err, off);
    free(ref), free(base);
    return err;
}

TEST(lora_fixture_base_matches) {
    fx f;
    fx_open(&f);
    for (int e = 0; e < 2; e++) {
        wan_model m;
        tiny_base(&m, e);
        float *out = run(&m, &f), *ref = wt_read(f.io, e ? "output_base_2" : "output_base", NULL, NULL, NULL);
        REQUIRE(ref);
        double err = wt_max_rel(out, ref, f.no);
        CHECK_MSG(err <= OUT_TOL, "base expert %d vs diffusers: %.3g", e, err);
        free(out), free(ref);
        wan_model_free(&m);
    }
    fx_close(&f);
}

/* Loads adapter `path` into the tiny base of `expert`, runs the forward, compares with `name`. */
static double adapter_case(const fx *f, const char *path, int expert, const char *name, wan_lora_format want,
                           const char *what) {
    wan_model m;
    tiny_base(&m, expert);
    wan_lora l;
    wan_lora_config c;
    wan_lora_format fmt;
    REQUIRE_OK(wan_lora_inspect(path, &c, &fmt, NULL, 0));
    CHECK_MSG(fmt == want, "%s: format %s", path, wan_lora_format_name(fmt));
    CHECK_MSG((double)c.rank != c.alpha, "%s: alpha == rank", path);
    REQUIRE_OK(wan_lora_load(&l, &m.cfg, path, expert));
    double bsum = 0;
    for (int i = 1; i < l.layout.count; i += 2)
        for (int64_t k = 0; k < l.layout.tensors[i].numel; k++) bsum += fabs(l.params[l.layout.tensors[i].offset + k]);
    CHECK_MSG(bsum > 0, "%s: every B is zero", path);
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    float *out = run(&m, f);
    double err = compare(f, out, name, expert ? "output_base_2" : "output_base", what);
    free(out);
    wan_lora_free(&l);
    wan_model_free(&m);
    return err;
}

TEST(lora_fixture_vgrpo_adapter_in_diffusers_and_peft) {
    fx f;
    fx_open(&f);
    adapter_case(&f, "tests/fixtures/lora_vgrpo", 0, "vgrpo_diffusers", WAN_LORA_FMT_DIFFUSERS,
                 "vgrpo's file, diffusers load_lora_weights");
    adapter_case(&f, "tests/fixtures/lora_vgrpo/adapter_model.safetensors", 0, "vgrpo_peft", WAN_LORA_FMT_PEFT,
                 "vgrpo's folder, PeftModel.from_pretrained");
    adapter_case(&f, "tests/fixtures/lora_vgrpo/pytorch_lora_weights.safetensors", 1,
                 "vgrpo_diffusers_transformer_2", WAN_LORA_FMT_DIFFUSERS, "vgrpo's file, load_into_transformer_2");
    fx_close(&f);
}

TEST(lora_fixture_adapters_saved_by_diffusers_and_peft) {
    fx f;
    fx_open(&f);
    adapter_case(&f, "tests/fixtures/lora_diffusers", 0, "diffusers_saved", WAN_LORA_FMT_DIFFUSERS,
                 "diffusers save_lora_weights, read by vgrpo");
    adapter_case(&f, "tests/fixtures/lora_peft", 0, "peft_saved", WAN_LORA_FMT_PEFT,
                 "peft save_pretrained, read by vgrpo");
    fx_close(&f);
}

static int same_file(const char *a, const char *b) {
    static char x[1 << 17], y[1 << 17];
    long n = test_slurp(a, x, sizeof x), m = test_slurp(b, y, sizeof y);
    return n > 0 && n == m && memcmp(x, y, (size_t)n) == 0;
}

/* The writer still writes what diffusers and peft loaded (byte for byte), and `vgrpo export` merges and converts. */
TEST(lora_fixture_writer_and_export) {
    fx f;
    fx_open(&f);
    const char *dir = test_tmpdir();
    char p[700], q[700], out[8192];
    wan_model m;
    tiny_base(&m, 0);
    wan_lora l;
    REQUIRE_OK(wan_lora_load(&l, &m.cfg, "tests/fixtures/lora_vgrpo", 0));
    snprintf(p, sizeof p, "%s/again", dir);
    REQUIRE_OK(wan_lora_save(&l, p));
    const char *files[] = {WAN_LORA_DIFFUSERS_FILE, WAN_LORA_PEFT_FILE, WAN_LORA_PEFT_CONFIG};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/again/%s", dir, files[i]);
        snprintf(q, sizeof q, "tests/fixtures/lora_vgrpo/%s", files[i]);
        CHECK_MSG(same_file(p, q), "%s differs from %s", p, q);
    }
    wan_lora_free(&l);
    /* vgrpo export --merge on a transformer folder: diffusers' forward of the merged folder was recorded */
    snprintf(p, sizeof p, "%s/base", dir);
    REQUIRE_OK(wan_model_save(&m, p));
    wan_model_free(&m);
    int rc = test_run(out, sizeof out, "%s export --checkpoint %s/base --adapter tests/fixtures/lora_vgrpo --merge "
                                       "--out %s/merged 2>&1", test_vgrpo_bin(), dir, dir);
    CHECK_MSG(rc == 0 && strstr(out, "merged ->"), "export --merge: %d: %s", rc, out);
    snprintf(p, sizeof p, "%s/merged/transformer", dir);
    REQUIRE_OK(wan_model_load(&m, p));
    float *o = run(&m, &f);
    compare(&f, o, "vgrpo_merged", "output_base", "vgrpo export --merge, vgrpo forward");
    free(o);
    wan_model_free(&m);
    /* a peft adapter converted to the diffusers file (and back), same weights */
    rc = test_run(out, sizeof out, "%s export --checkpoint %s/base --adapter tests/fixtures/lora_peft --out %s/conv "
                                   "2>&1", test_vgrpo_bin(), dir, dir);
    CHECK_MSG(rc == 0 && strstr(out, "(peft, rank 3, alpha 1.5"), "export: %d: %s", rc, out);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_lora a, b;
    REQUIRE_OK(wan_lora_load(&a, &c, "tests/fixtures/lora_peft", 0));
    snprintf(p, sizeof p, "%s/conv/transformer/%s", dir, WAN_LORA_DIFFUSERS_FILE);
    REQUIRE_OK(wan_lora_load(&b, &c, p, 0));
    CHECK(wan_lora_config_equal(&a.cfg, &b.cfg) && a.layout.numel == b.layout.numel &&
          memcmp(a.params, b.params, a.layout.numel * sizeof(float)) == 0);
    wan_lora_free(&a), wan_lora_free(&b);
    /* usage and input errors */
    rc = test_run(out, sizeof out, "%s export --checkpoint %s/base --out %s/x 2>&1", test_vgrpo_bin(), dir, dir);
    CHECK_MSG(rc == 2 && strstr(out, "give --adapter"), "%d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s export --checkpoint %s/base --adapter tests/fixtures/lora_vgrpo --adapter-2 "
                                   "tests/fixtures/lora_vgrpo --out %s/x 2>&1", test_vgrpo_bin(), dir, dir);
    CHECK_MSG(rc == 1 && strstr(out, "has no transformer_2"), "%d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s export --checkpoint tests/fixtures/wan_difftest --adapter "
                                   "tests/fixtures/lora_vgrpo --out %s/x 2>&1", test_vgrpo_bin(), dir);
    CHECK_MSG(rc == 1 && strstr(out, "has shape [4, 128], the model expects [4, 24]"), "%d: %s", rc, out);
    fx_close(&f);
}
