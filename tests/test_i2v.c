/* tests/test_i2v.c — image to video, Wan 2.2 TI2V's first-frame conditioning (model/flow/first_frame.*, the engine's
 * and the trainer's conditioned paths, the trajectory's `condition`).
 * Checks: (1) the layout helpers and the conditioned step against the plain step on gathered elements; (2) one whole
 * denoising loop of a tiny TI2V pipeline (tests/fixtures/wan_ti2v48 + vae_wan22: 48 channels, the Wan 2.2 VAE) against
 * diffusers' WanImageToVideoPipeline(expand_timesteps=True) on the same image, prompt embeddings and noise
 * (scripts/fixtures_i2v.py): the condition, every step's generated frames and the final latents within 1e-5 relative
 * (max|a-b| / max|b|), and the first decoded frame equal (bit for bit) to the decode of the condition alone, as in
 * diffusers; (3) the trainer recomputes a conditioned rollout's log-probs bit for bit, and the step's log-prob is the
 * Gaussian log-density over the generated frames only; (4) the trajectory's condition stored, sent and refused;
 * (5) the first_frame_consistency scorer on hand-computed values. */
#include <string.h>

#include "core/philox.h"
#include "core/safetensors.h"
#include "core/trajectory.h"
#include "core/wire_rollout.h"
#include "model/dit/wan_dit.h"
#include "model/flow/first_frame.h"
#include "model/flow/flow.h"
#include "model/text/word_embed.h"
#include "model/vae/wan_vae.h"
#include "model/vae/wan_vae_encode.h"
#include "reward/scorers.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/step/train_step.h"

#define I2V_TOL 1e-5

static double rel_err(const float *a, const float *b, size_t n) {
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return mx > 0 ? e / mx : e;
}

/* Tensor `name` of f as F32 (malloc'd), its element count into *n. */
static float *read_f32(st_file *f, const char *name, int64_t *n) {
    const int i = st_find(f, name);
    if (i < 0) return NULL;
    const st_info *t = st_info_at(f, i);
    int64_t k = 1;
    for (int d = 0; d < t->ndim; d++) k *= t->shape[d];
    float *b = malloc(sizeof(float) * (size_t)k);
    if (b && st_read_f32(f, name, b, k)) {
        free(b);
        return NULL;
    }
    if (n) *n = k;
    return b;
}

TEST(i2v_first_frame_layout) {
    const int64_t shape[4] = {3, 4, 2, 5}, nl = 3 * 4 * 2 * 5, hw = 10;
    float x[120], g[120], y[120], cond[30], ts[12];
    for (int k = 0; k < nl; k++) x[k] = (float)k;
    for (int k = 0; k < 30; k++) cond[k] = -1.0f - (float)k;
    flow_ff none = flow_ff_make(shape, NULL), ff = flow_ff_make(shape, cond);
    CHECK(flow_ff_generated(&none) == nl && flow_ff_generated(&ff) == 3 * 3 * hw);
    CHECK(flow_ff_view(&none, x, g) == x);
    flow_ff_gather(&ff, x, g);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 3 * hw; k++) CHECK(g[c * 3 * hw + k] == x[c * 4 * hw + hw + k]);
    flow_ff_scatter(&ff, g, y);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 4 * hw; k++) CHECK(y[c * 4 * hw + k] == (k < hw ? cond[c * hw + k] : x[c * 4 * hw + k]));
    CHECK(flow_ff_first_is_cond(&ff, y) && !flow_ff_first_is_cond(&ff, x));
    flow_ff_scatter_grad(&ff, g, y);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < hw; k++) CHECK(y[c * 4 * hw + k] == 0.0f);
    flow_ff_timesteps(4, 3, 700.5f, ts);
    for (int k = 0; k < 12; k++) CHECK(ts[k] == (k < 3 ? 0.0f : 700.5f));

    /* the conditioned step = the plain step on the generated elements; without a condition, the plain step */
    float v[120], eps[120], xn[120], mean[120], xn2[120], mean2[120], work[5 * 120];
    test_fill_uniform(v, nl, 3, -1, 1);
    test_fill_uniform(eps, nl, 4, -2, 2);
    flow_ff_apply(&ff, x);
    flow_step st, st2;
    const flow_kind k = flow_kind_default();
    REQUIRE_OK(flow_ff_sde_step(k, &ff, x, v, eps, NULL, 0.8f, 0.6f, 0.9f, 0.7f, mean, xn, &st, work));
    float gx[90], gv[90], ge[90], gn[90], gm[90];
    flow_ff_gather(&ff, x, gx), flow_ff_gather(&ff, v, gv), flow_ff_gather(&ff, eps, ge);
    REQUIRE_OK(flow_sde_step_kind(k, gx, gv, ge, NULL, 90, 0.8f, 0.6f, 0.9f, 0.7f, gm, gn, &st2));
    CHECK(st.has_logp && st.logp == st2.logp);
    flow_ff_scatter(&ff, gn, xn2), flow_ff_scatter(&ff, gm, mean2);
    CHECK(!memcmp(xn, xn2, sizeof xn) && !memcmp(mean, mean2, sizeof mean));
    /* the trainer's form (the recorded next latent) gives the same log-prob */
    REQUIRE_OK(flow_ff_sde_step(k, &ff, x, v, NULL, xn, 0.8f, 0.6f, 0.9f, 0.7f, NULL, NULL, &st2, work));
    CHECK(st2.has_logp && st2.logp == st.logp);
    REQUIRE_OK(flow_ff_sde_step(k, &none, x, v, eps, NULL, 0.8f, 0.6f, 0.9f, 0.7f, mean, xn, &st, NULL));
    REQUIRE_OK(flow_sde_step_kind(k, x, v, eps, NULL, nl, 0.8f, 0.6f, 0.9f, 0.7f, mean2, xn2, &st2));
    CHECK(st.logp == st2.logp && !memcmp(xn, xn2, sizeof xn) && !memcmp(mean, mean2, sizeof mean));
    const int64_t one[4] = {3, 1, 2, 5};
    flow_ff f1 = flow_ff_make(one, cond);
    CHECK(flow_ff_sde_step(k, &f1, x, v, eps, NULL, 0.8f, 0.6f, 0.9f, 0.7f, mean, xn, &st, work) == -1 &&
          strstr(core_last_error(), "nothing to generate"));
}

/* The un-normalisation diffusers applies before decoding: latents / (1 / latents_std) + latents_mean (fp32). */
static void unnormalize(const vae_config *vc, const float *z, float *out, int64_t C, int64_t per) {
    for (int64_t c = 0; c < C; c++) {
        const float inv = 1.0f / vc->latents_std[c];
        for (int64_t k = 0; k < per; k++) out[c * per + k] = z[c * per + k] / inv + vc->latents_mean[c];
    }
}

TEST(i2v_pipeline_vs_diffusers) {
    st_file *io = st_open("tests/fixtures/i2v_ti2v48_io.safetensors");
    REQUIRE(io);
    const int N = atoi(st_metadata(io, "steps")), Fv = atoi(st_metadata(io, "frames"));
    const int H = atoi(st_metadata(io, "height")), W = atoi(st_metadata(io, "width"));
    const double shift = atof(st_metadata(io, "shift"));
    const float g = (float)atof(st_metadata(io, "guidance_scale"));
    wan_model m;
    REQUIRE_OK(wan_model_load(&m, "tests/fixtures/wan_ti2v48"));
    vae_encoder *enc = vae_encoder_load("tests/fixtures/vae_wan22");
    vae_model *dec = vae_load("tests/fixtures/vae_wan22");
    REQUIRE(enc && dec);
    const int C = m.cfg.in_channels, T = vae_encoder_frames_out(enc, Fv), h = H / 16, w = W / 16;
    const int64_t shape[4] = {C, T, h, w}, nl = (int64_t)C * T * h * w, nc = (int64_t)C * h * w;
    int64_t n_pe = 0, n_noise = 0, n_steps = 0;
    float *pe = read_f32(io, "prompt_embeds", &n_pe), *ne = read_f32(io, "negative_embeds", NULL);
    float *noise = read_f32(io, "noise", &n_noise), *cref = read_f32(io, "condition", NULL);
    float *steps = read_f32(io, "step_latents", &n_steps), *lref = read_f32(io, "latents", NULL);
    float *vfirst = read_f32(io, "video_first", NULL), *cfirst = read_f32(io, "cond_first", NULL);
    REQUIRE(pe && ne && noise && cref && steps && lref && vfirst && cfirst);
    REQUIRE(n_noise == nl && n_steps == N * nl);
    const int L = (int)(n_pe / m.cfg.text_dim);
    core_tensor img;
    REQUIRE_OK(st_get(io, "image", &img));
    REQUIRE(img.dtype == CORE_U8 && img.shape[0] == H && img.shape[1] == W);

    /* the condition: the image as one frame, encoded and normalised */
    float *video = malloc(sizeof(float) * 3 * H * W), *cond = malloc(sizeof(float) * nc);
    vae_video_from_u8(img.data, 1, 1, H, W, video);
    REQUIRE_OK(vae_encode(enc, video, 1, 3, 1, H, W, cond, 1));
    const double e_cond = rel_err(cond, cref, (size_t)nc);

    /* the loop: ODE (eta 0), CFG with the negative embeddings, the fixture's noise */
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, N, shift, 0.0f, g, shape, L, 1, 1));
    rc.neg = ne;
    const float *conds[1] = {cond}, *n0[1] = {noise}, *pcond[1] = {pe};
    rc.conditions = conds, rc.noise0 = n0;
    rollout_experts E = rollout_one_expert(&m);
    core_traj t;
    const uint64_t uid = 0;
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, 1, pcond, &uid, NULL, &t));
    REQUIRE(t.condition && !memcmp(t.condition, cond, sizeof(float) * nc));
    REQUIRE_OK(core_traj_validate(&t, "i2v"));
    /* every step's generated frames (diffusers' frame 0 drifts and is overwritten at the end) */
    const flow_ff ff = flow_ff_make(shape, cond);
    const int64_t ng = flow_ff_generated(&ff);
    float *ga = malloc(sizeof(float) * ng), *gb = malloc(sizeof(float) * ng);
    double e_step = 0;
    for (int i = 0; i < N; i++) {
        flow_ff_gather(&ff, core_traj_latent(&t, i + 1), ga);
        flow_ff_gather(&ff, steps + (int64_t)i * nl, gb);
        const double e = rel_err(ga, gb, (size_t)ng);
        if (e > e_step) e_step = e;
    }
    const double e_final = rel_err(core_traj_latent(&t, N), lref, (size_t)nl);
    for (int i = 0; i <= N; i++) CHECK(flow_ff_first_is_cond(&ff, core_traj_latent(&t, i)));
    for (int i = 0; i < N; i++) CHECK(t.has_log_prob[i] == 0); /* the ODE: no log-probs */

    /* decoding: the first frame depends on latent frame 0 alone (causal VAE): it is the condition's decode */
    const int Fo = vae_frames_out(dec, T);
    float *z = malloc(sizeof(float) * nl), *vid = malloc(sizeof(float) * 3 * (size_t)Fo * H * W);
    float *cz = malloc(sizeof(float) * nc), *cvid = malloc(sizeof(float) * 3 * H * W), *f0 = malloc(sizeof(float) * 3 * H * W);
    unnormalize(vae_get_config(dec), core_traj_latent(&t, N), z, C, (int64_t)T * h * w);
    unnormalize(vae_get_config(dec), cond, cz, C, (int64_t)h * w);
    REQUIRE_OK(vae_decode(dec, z, 1, C, T, h, w, vid));
    for (int c = 0; c < 3; c++) memcpy(f0 + (int64_t)c * H * W, vid + (int64_t)c * Fo * H * W, sizeof(float) * H * W);
    REQUIRE_OK(vae_decode(dec, cz, 1, C, 1, h, w, cvid));
    CHECK_MSG(!memcmp(f0, cvid, sizeof(float) * 3 * H * W), "the first decoded frame differs from the condition's decode");
    const double e_video = rel_err(f0, vfirst, (size_t)3 * H * W), e_cvideo = rel_err(cvid, cfirst, (size_t)3 * H * W);
    if (getenv("VGRPO_VERBOSE"))
        fprintf(stderr, "  condition %.3g, steps (generated frames) %.3g, final latents %.3g, first frame %.3g, "
                        "condition decode %.3g\n", e_cond, e_step, e_final, e_video, e_cvideo);
    CHECK_MSG(e_cond <= I2V_TOL, "condition: rel err %.3g", e_cond);
    CHECK_MSG(e_step <= I2V_TOL, "step latents: rel err %.3g", e_step);
    CHECK_MSG(e_final <= I2V_TOL, "final latents: rel err %.3g", e_final);
    CHECK_MSG(e_video <= I2V_TOL && e_cvideo <= I2V_TOL, "first frame: rel err %.3g / %.3g", e_video, e_cvideo);
    core_tensor_free(&img);
    core_traj_free(&t);
    free(pe), free(ne), free(noise), free(cref), free(steps), free(lref), free(vfirst), free(cfirst), free(video);
    free(cond), free(ga), free(gb), free(z), free(vid), free(cz), free(cvid), free(f0);
    vae_encoder_free(enc);
    vae_free(dec);
    wan_model_free(&m);
    st_close(io);
}

#define XL 4
#define XN 4 /* samples */

/* A conditioned rollout of the tiny model (16 x 3 x 4 x 4 latents, 5 steps, CFG, SDE eta 0.9): conditions from
 * Philox, two prompts. */
typedef struct {
    wan_model m, ref; /* ref: the same weights (the KL reference) */
    float *emb, *cond;
    const float *pc[XN], *cc[XN];
    core_traj t[XN];
    float adv[XN];
    uint8_t mask[XN];
} xfix;

static const int64_t XSHAPE[4] = {16, 3, 4, 4};

static void xfix_build(xfix *f, int record_means) {
    memset(f, 0, sizeof *f);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(&f->m, &c));
    wan_params_init_random(&f->m, 17);
    REQUIRE_OK(wan_model_alloc_grads(&f->m));
    REQUIRE_OK(wan_model_init(&f->ref, &c));
    memcpy(f->ref.params, f->m.params, sizeof(float) * (size_t)f->m.layout.numel);
    const int td = c.text_dim;
    const int64_t nc = XSHAPE[0] * XSHAPE[2] * XSHAPE[3];
    f->emb = malloc(sizeof(float) * 2 * XL * td);
    f->cond = malloc(sizeof(float) * 2 * nc);
    REQUIRE_OK(wan_word_embed("a red ball", XL, td, f->emb));
    REQUIRE_OK(wan_word_embed("blue sky", XL, td, f->emb + XL * td));
    core_philox_normal(f->cond, 2 * nc, 5, 0, 0, 9);
    uint64_t uids[XN];
    int64_t pidx[XN];
    for (int s = 0; s < XN; s++)
        f->pc[s] = f->emb + (s / 2) * XL * td, f->cc[s] = f->cond + (s / 2) * nc, uids[s] = 40 + s, pidx[s] = s / 2;
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, 5, 3.0, 0.9f, 4.0f, XSHAPE, XL, 31, 3));
    rc.conditions = f->cc;
    rc.record_means = record_means;
    rollout_experts E = rollout_one_expert(&f->m);
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, XN, f->pc, uids, pidx, f->t));
    const float r[XN] = {0.1f, 0.9f, 0.3f, 0.6f};
    REQUIRE_OK(grpo_advantages(r, 2, 2, GRPO_STD_GROUP, 5.0f, f->adv, f->mask, NULL));
}

static void xfix_free(xfix *f) {
    for (int s = 0; s < XN; s++) core_traj_free(&f->t[s]);
    wan_model_free(&f->m);
    wan_model_free(&f->ref);
    free(f->emb), free(f->cond);
}

TEST(i2v_rollout_logprob_and_trainer_parity) {
    xfix f;
    xfix_build(&f, 1);
    const int64_t nl = 16 * 3 * 4 * 4, nc = 16 * 4 * 4, ng = nl - nc;
    for (int s = 0; s < XN; s++) {
        REQUIRE_OK(core_traj_validate(&f.t[s], "i2v"));
        const flow_ff ff = flow_ff_make(XSHAPE, f.t[s].condition);
        CHECK(!memcmp(f.t[s].condition, f.cc[s], sizeof(float) * nc));
        for (int i = 0; i <= 5; i++) CHECK(flow_ff_first_is_cond(&ff, core_traj_latent(&f.t[s], i)));
        for (int i = 0; i < 5; i++) CHECK(f.t[s].has_log_prob[i] == 1);
        /* latents[0]'s generated frames are the Philox noise of the full element index */
        float *z = malloc(sizeof(float) * nl);
        core_philox_normal(z, nl, 31, 0, 40 + (uint32_t)s, CORE_STREAM_ROLLOUT_NOISE);
        CHECK(!memcmp(z + 16, core_traj_latent(&f.t[s], 0) + 16, sizeof(float) * 32)); /* channel 0, frames 1 and 2 */
        /* step 1's log-prob by hand: the Gaussian log-density averaged over the generated elements only */
        const int i = 1;
        const float *x = core_traj_latent(&f.t[s], i), *xn = core_traj_latent(&f.t[s], i + 1), *mu = core_traj_mean(&f.t[s], i);
        REQUIRE(mu);
        flow_step st;
        REQUIRE_OK(flow_step_init(&st, f.t[s].sigmas[i], f.t[s].sigmas[i + 1], f.t[s].sigmas[1], 0.9f));
        double acc = 0;
        int64_t cnt = 0;
        for (int64_t k = 0; k < nl; k++) {
            if ((k / 16) % 3 == 0) { CHECK(mu[k] == x[k] && xn[k] == x[k]); continue; } /* frame 0: the condition */
            const double d = (double)xn[k] - mu[k], sd = st.step_std;
            acc += -d * d / (2 * sd * sd) - log(sd) - 0.5 * log(2 * M_PI);
            cnt++;
        }
        CHECK(cnt == ng);
        CHECK_NEAR(f.t[s].log_probs[i], acc / (double)cnt, 1e-4 * fabs(acc / (double)cnt));
        free(z);
    }
    /* the trainer recomputes every conditioned step's log-prob bit for bit (micro-batches mixing samples and steps),
     * with GRPO-Guard's bias on the generated elements (0 at the rollout's weights) and a KL to itself (0) */
    const int mbs[2] = {1, 3};
    for (int k = 0; k < 2; k++)
        for (int guard = 0; guard < 2; guard++) {
            trainer_config tc = {.seed = 5, .clip_eps = 0.2f, .beta = 0.05f, .micro_batch_size = mbs[k],
                                 .acts_mode = WAN_ACTS_STORE, .guard = guard};
            REQUIRE_OK(grpo_selection_parse("all", &tc.sel));
            trainer_batch b = {.n = XN, .traj = f.t, .cond = f.pc, .text_len = XL, .adv = f.adv, .mask = f.mask};
            grpo_loss_stats st = {0};
            wan_model_zero_grads(&f.m);
            REQUIRE_OK(trainer_accumulate(&f.m, &f.ref, NULL, &tc, &b, 1, &st));
            CHECK(st.n_transitions == XN * 5);
            CHECK_MSG(st.abs_logp_diff_sum == 0.0 && st.kl == 0.0, "micro %d guard %d: |dlogp| %g kl %g", mbs[k], guard,
                      st.abs_logp_diff_sum, st.kl);
            double gn = 0;
            for (int64_t q = 0; q < f.m.layout.numel; q++) gn += (double)f.m.grads[q] * f.m.grads[q];
            CHECK(gn > 0 && isfinite(gn));
        }
    /* a batch mixing conditioned and text-only trajectories is refused */
    float *keep = f.t[1].condition;
    f.t[1].condition = NULL;
    trainer_config tc = {.seed = 5, .clip_eps = 0.2f, .micro_batch_size = 2, .acts_mode = WAN_ACTS_STORE};
    REQUIRE_OK(grpo_selection_parse("all", &tc.sel));
    trainer_batch b = {.n = XN, .traj = f.t, .cond = f.pc, .text_len = XL, .adv = f.adv, .mask = f.mask};
    grpo_loss_stats st = {0};
    CHECK(trainer_accumulate(&f.m, NULL, NULL, &tc, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "image-to-video or text-to-video throughout"));
    f.t[1].condition = keep;
    xfix_free(&f);
}

/* The conditioned policy gradient (frame 0's velocity gets none) against central finite differences of the loss
 * along the gradient. */
TEST(i2v_train_gradient_finite_difference) {
    xfix f;
    xfix_build(&f, 0);
    trainer_config tc = {.seed = 5, .clip_eps = 100.0f, .beta = 0.0f, .micro_batch_size = 4, .acts_mode = WAN_ACTS_STORE};
    REQUIRE_OK(grpo_selection_parse("random_k 2", &tc.sel));
    trainer_batch b = {.n = XN, .traj = f.t, .cond = f.pc, .text_len = XL, .adv = f.adv, .mask = f.mask};
    const int64_t n = f.m.layout.numel;
    wan_model_zero_grads(&f.m);
    grpo_loss_stats st = {0};
    REQUIRE_OK(trainer_accumulate(&f.m, NULL, NULL, &tc, &b, 1, &st));
    float *g = malloc(sizeof(float) * n), *p0 = malloc(sizeof(float) * n);
    memcpy(g, f.m.grads, sizeof(float) * n);
    memcpy(p0, f.m.params, sizeof(float) * n);
    double gn = 0;
    for (int64_t i = 0; i < n; i++) gn += (double)g[i] * g[i];
    gn = sqrt(gn);
    REQUIRE(gn > 0);
    const double hstep = 2e-4; /* the ratio's exp curves fast at small step std: a short step */
    double lp, lm, pred = 0;
    for (int64_t i = 0; i < n; i++) f.m.params[i] = p0[i] + (float)(hstep * g[i] / gn);
    grpo_loss_stats s1 = {0}, s2 = {0};
    REQUIRE_OK(trainer_accumulate(&f.m, NULL, NULL, &tc, &b, 0, &s1));
    for (int64_t i = 0; i < n; i++) pred += (double)g[i] * f.m.params[i];
    for (int64_t i = 0; i < n; i++) f.m.params[i] = p0[i] - (float)(hstep * g[i] / gn);
    REQUIRE_OK(trainer_accumulate(&f.m, NULL, NULL, &tc, &b, 0, &s2));
    for (int64_t i = 0; i < n; i++) pred -= (double)g[i] * f.m.params[i];
    lp = s1.loss, lm = s2.loss;
    const double fd = lp - lm, rel = fabs(fd - pred) / fabs(pred);
    if (getenv("VGRPO_VERBOSE")) fprintf(stderr, "  fd %.9g pred %.9g rel %.3g\n", fd, pred, rel);
    CHECK_MSG(rel < 2e-3, "finite difference %.9g vs gradient %.9g (rel %.3g)", fd, pred, rel);
    free(g), free(p0);
    xfix_free(&f);
}

TEST(i2v_trajectory_condition_stored) {
    xfix f;
    xfix_build(&f, 0);
    core_traj *t = &f.t[0];
    const int64_t nc = 16 * 4 * 4;
    char path[4200];
    snprintf(path, sizeof path, "%s/t.safetensors", test_tmpdir());
    REQUIRE_OK(core_traj_save(t, path));
    core_traj u;
    REQUIRE_OK(core_traj_load(&u, path));
    CHECK(u.condition && !memcmp(u.condition, t->condition, sizeof(float) * nc));
    CHECK(!memcmp(u.latents, t->latents, sizeof(float) * (size_t)(6 * 16 * 3 * 4 * 4)));
    core_traj_free(&u);
    st_file *sf = st_open(path);
    REQUIRE(sf);
    CHECK(!strcmp(st_metadata(sf, "format_version"), "2") && st_find(sf, "condition") >= 0);
    st_close(sf);
    /* fields: 8 tensors with the condition last; the condition's shape is checked */
    core_traj_fields fl;
    REQUIRE_OK(core_traj_to_fields(t, &fl));
    CHECK(fl.n_tensors == 8 && !strcmp(fl.tensor_names[7], "condition") && fl.tensors[7].ndim == 4 &&
          fl.tensors[7].shape[1] == 1);
    core_tensor bad;
    const int64_t bs[4] = {16, 1, 2, 4};
    core_tensor_wrap(&bad, t->condition, CORE_F32, 4, bs);
    core_tensor ts[8];
    memcpy(ts, fl.tensors, sizeof ts);
    ts[7] = bad;
    CHECK_MSG(core_traj_from_fields(&u, 8, fl.tensor_names, ts, fl.n_meta, fl.meta_keys,
                                    (const char *const *)fl.meta_values, "x") == -1 &&
              strstr(core_last_error(), "tensor 'condition' has shape"), "%s", core_last_error());
    core_traj_fields_free(&fl);
    /* a latent whose frame 0 is not the condition is refused */
    core_traj_latent(t, 2)[5] += 1.0f;
    CHECK(core_traj_validate(t, "x") == -1 && strstr(core_last_error(), "latents[2] element 5 (frame 0) differs"));
    core_traj_latent(t, 2)[5] -= 1.0f;
    REQUIRE_OK(core_traj_validate(t, "x"));
    /* the wire: the trajectory reply carries the condition */
    core_rollout_sample smp[XN];
    for (int s = 0; s < XN; s++) {
        smp[s] = (core_rollout_sample){.uid = f.t[s].uid, .prompt_index = f.t[s].prompt_index, .prompt = "p"};
        const char *nm[1] = {"r"};
        const float v[1] = {0.5f};
        REQUIRE_OK(core_traj_set_rewards(&f.t[s], 1, nm, v, 0.5f));
    }
    core_rollout_request req = {.policy_version = 0, .return_trajectories = 1, .n = XN, .samples = smp};
    uint64_t vh[XN] = {0};
    core_wire_built bw;
    REQUIRE_OK(core_trajectory_reply_build("q", 0, XN, f.t, vh, 1, NULL, NULL, &bw));
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(bw.frames, bw.n_frames, NULL, &m));
    core_rollout_result res[XN];
    const uint8_t *vg;
    int64_t vs[4];
    REQUIRE_OK(core_trajectory_reply_parse(&m, &req, res, &vg, vs));
    for (int s = 0; s < XN; s++) {
        CHECK(res[s].traj.condition && !memcmp(res[s].traj.condition, f.t[s].condition, sizeof(float) * nc));
        core_rollout_result_free(&res[s]);
    }
    core_wire_msg_free(&m);
    core_wire_built_free(&bw);
    xfix_free(&f);
}

TEST(i2v_first_frame_consistency_scorer) {
    /* 2 x 1 x 2 pixels per frame, 3 frames: frame 1 differs from frame 0 by 30 + 0 + 30 and 0 + 0 + 0, frame 2 by
     * 245 + 235 + 225 and 0: D = (60 + 705) / (255 x 3 channels x 2 pixels x 2 frames) */
    const uint8_t v[3 * 2 * 3] = {10, 20, 30, 0, 0, 0, 40, 20, 0, 0, 0, 0, 255, 255, 255, 0, 0, 0};
    reward_video vid = {v, 3, 1, 2};
    double r;
    REQUIRE_OK(reward_first_frame_consistency(&vid, "anything", NULL, &r));
    CHECK(r == 1.0 - 765.0 / (255.0 * 12.0));
    vid.frames = 1;
    REQUIRE_OK(reward_first_frame_consistency(&vid, NULL, NULL, &r));
    CHECK(r == 1.0);
    const reward_scorer *s = reward_find("first_frame_consistency");
    CHECK(s && s->fn == reward_first_frame_consistency && s->lo == 0.0 && s->hi == 1.0);
}

/* rollout_request with image conditions: built and parsed back bit for bit (aligned copies), and refused when a
 * tensor is missing, misnamed, of another shape or not finite; a request without conditions carries no tensor. */
TEST(i2v_request_conditions_wire) {
    float c[2][16 * 4 * 4];
    test_fill_uniform(&c[0][0], 2 * 256, 9, -2, 2);
    core_rollout_sample smp[2] = {{.uid = 3, .prompt_index = 0, .prompt = "a", .condition = c[0]},
                                  {.uid = 4, .prompt_index = 1, .prompt = "b", .condition = c[1]}};
    core_rollout_request req = {.stream = CORE_STREAM_ROLLOUT_NOISE, .eta = 1.0f, .return_trajectories = 1,
                                .cond_shape = {16, 1, 4, 4}, .n = 2, .samples = smp};
    core_wire_built b;
    REQUIRE_OK(core_rollout_request_build("q", &req, &b));
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(b.frames, b.n_frames, NULL, &m));
    core_rollout_request got;
    REQUIRE_OK(core_rollout_request_parse(&m, &got));
    CHECK(got.n == 2 && got.cond_shape[0] == 16 && got.cond_shape[1] == 1 && got.cond_shape[3] == 4);
    for (int j = 0; j < 2; j++)
        CHECK(got.samples[j].condition && !memcmp(got.samples[j].condition, c[j], sizeof c[j]) &&
              ((uintptr_t)got.samples[j].condition % sizeof(float)) == 0);
    core_rollout_request_free(&got);
    /* one tensor fewer than samples; a misnamed one; another shape; a NaN */
    core_wire_msg mm = m;
    mm.n_tensors = 1;
    CHECK(core_rollout_request_parse(&mm, &got) == -1 && strstr(core_last_error(), "carries 1 tensors"));
    core_wire_tensor ts[2] = {m.tensors[0], m.tensors[1]};
    mm.tensors = ts, mm.n_tensors = 2;
    ts[1].name = "0/condition";
    CHECK(core_rollout_request_parse(&mm, &got) == -1 && strstr(core_last_error(), "tensor 1 must be \"1/condition\""));
    ts[1] = m.tensors[1];
    ts[1].shape[3] = 2, ts[1].nbytes /= 2;
    CHECK(core_rollout_request_parse(&mm, &got) == -1 && strstr(core_last_error(), "(the shape of tensor 0)"));
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    c[1][7] = NAN;
    REQUIRE_OK(core_rollout_request_build("q", &req, &b));
    REQUIRE_OK(core_wire_parse(b.frames, b.n_frames, NULL, &m));
    CHECK(core_rollout_request_parse(&m, &got) == -1 && strstr(core_last_error(), "\"1/condition\" element 7 is not finite"));
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    /* a conditioned request needs every sample's condition; without cond_shape none is sent */
    smp[1].condition = NULL;
    CHECK(core_rollout_request_build("q", &req, &b) == -1 && strstr(core_last_error(), "samples[1] has no condition"));
    req.cond_shape[0] = 0;
    REQUIRE_OK(core_rollout_request_build("q", &req, &b));
    CHECK(b.n_frames == 1);
    core_wire_built_free(&b);
}
