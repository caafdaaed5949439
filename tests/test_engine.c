/* tests/test_engine.c — the rollout engine (rollout/engine.*), the tiny preset's word embeddings
 * (model/word_embed.*) and latent-to-RGB map (model/latent_rgb.*).
 * Checks: FNV-1a against published vectors; embeddings row by row against Philox fills; the latent-to-RGB map on
 * hand-computed pixels and through a file; the engine's initial noise and first step recomputed independently from
 * the DiT, Philox and the flow step (CFG order, noise counters); a sample's trajectory bitwise the same alone, in a
 * batch of 4 and in batches of 3 (batch invariance). */
#include <string.h>

#include "core/philox.h"
#include "model/flow/flow.h"
#include "model/vae/latent_rgb.h"
#include "model/dit/wan_dit.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/test.h"

#define EL 4 /* text length */

TEST(engine_fnv1a_vectors) {
    /* Published FNV-1a 32-bit test vectors (Fowler/Noll/Vo reference test suite). */
    CHECK(wan_fnv1a32("", 0) == 0x811c9dc5u);
    CHECK(wan_fnv1a32("a", 1) == 0xe40c292cu);
    CHECK(wan_fnv1a32("foobar", 6) == 0xbf9cf968u);
}

TEST(engine_word_embed_rows) {
    const int td = 8;
    float e[EL * 8], want[8];
    REQUIRE_OK(wan_word_embed("  A Red  BALL ", EL, td, e));
    const char *words[3] = {"a", "red", "ball"};
    for (int j = 0; j < 3; j++) {
        core_philox_normal(want, td, 0, 0, wan_fnv1a32(words[j], (int64_t)strlen(words[j])), 4);
        CHECK(memcmp(e + j * td, want, sizeof want) == 0);
    }
    for (int k = 3 * td; k < EL * td; k++) CHECK(e[k] == 0.0f);
    CHECK(wan_word_count("  A Red  BALL ") == 3);
    REQUIRE_OK(wan_word_embed("", EL, td, e));
    for (int k = 0; k < EL * td; k++) CHECK(e[k] == 0.0f);
    CHECK(wan_word_embed("one two three four five", EL, td, e) == -1);
    CHECK(strstr(core_last_error(), "\"one two three four five\" has 5 words") != NULL);
    CHECK(strstr(core_last_error(), "rollout.text_len") != NULL);
}

TEST(engine_latent_rgb_map) {
    wan_latent_rgb m;
    REQUIRE_OK(wan_latent_rgb_default(&m, 16));
    /* Hadamard row 1 over channel k: +-0.15 by k's bit 0; row 2 by bit 1; row 4 by bit 2. */
    CHECK(m.weight[0][0] == 0.15f && m.weight[0][1] == -0.15f && m.weight[1][2] == -0.15f && m.weight[2][3] == 0.15f &&
          m.weight[2][4] == -0.15f);
    /* One latent pixel (F = H = W = 1): z = e_0 * 2 -> y = 0.3 on every channel -> 127.5 * 1.3 = 165.75 -> 166;
     * second pixel z_1 = -10 -> y = (+1.5, -1.5, -1.5) -> 255 (clamped), 0, 0. */
    float z[16 * 2] = {0};
    z[0 * 2 + 0] = 2.0f;
    z[1 * 2 + 1] = -10.0f;
    uint8_t v[2 * 8 * 8 * 3];
    wan_latent_rgb_decode(&m, z, 1, 1, 2, v);
    for (int dy = 0; dy < 8; dy++)
        for (int dx = 0; dx < 16; dx++) {
            const uint8_t *p = v + (dy * 16 + dx) * 3;
            if (dx < 8) CHECK(p[0] == 166 && p[1] == 166 && p[2] == 166);
            else CHECK(p[0] == 255 && p[1] == 0 && p[2] == 0);
        }
    char path[600];
    snprintf(path, sizeof path, "%s/latent_rgb.safetensors", test_tmpdir());
    m.bias[1] = 0.25f;
    REQUIRE_OK(wan_latent_rgb_save(&m, path));
    wan_latent_rgb r;
    REQUIRE_OK(wan_latent_rgb_load(&r, path, 16));
    CHECK(memcmp(r.weight, m.weight, sizeof m.weight) == 0 && r.bias[1] == 0.25f && r.channels == 16);
    CHECK(wan_latent_rgb_load(&r, path, 48) == -1);
}

/* The tiny model with random weights. */
static void tiny_model(wan_model *m, uint64_t seed) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(m, &c));
    wan_params_init_random(m, seed);
}

static const int64_t SHAPE[4] = {16, 2, 8, 8};

static float *embeds(const char *const *prompts, int n, int td) {
    float *e = malloc(sizeof(float) * (size_t)(n * EL * td));
    for (int j = 0; j < n; j++)
        if (wan_word_embed(prompts[j], EL, td, e + j * EL * td)) return NULL;
    return e;
}

TEST(engine_first_step_recomputed) {
    wan_model m;
    tiny_model(&m, 3);
    rollout_experts E1 = rollout_one_expert(&m);
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, 6, 3.0, 0.8f, 4.5f, SHAPE, EL, 77, 2));
    const char *pr[1] = {"a green frog"};
    float *e = embeds(pr, 1, m.cfg.text_dim);
    REQUIRE(e);
    const float *cond[1] = {e};
    uint64_t uid = 9;
    core_traj t;
    const int64_t nl = 16 * 2 * 8 * 8;
    float *vrec = malloc(sizeof(float) * nl * 6);
    REQUIRE(vrec);
    float *const vrecs[1] = {vrec};
    rc.velocities = vrecs; /* the guided velocity of every step is recorded */
    REQUIRE_OK(rollout_generate(&rc, &E1, NULL, 1, cond, &uid, NULL, &t));
    float *z = malloc(sizeof(float) * nl * 4), *eps = z + nl, *v = z + 2 * nl, *xn = z + 3 * nl;
    core_philox_normal(z, nl, 77, 0, 9, 0);
    CHECK(memcmp(z, core_traj_latent(&t, 0), sizeof(float) * nl) == 0);
    /* step 0 by hand: rows (cond, uncond), v = v_u + g (v_c - v_u), eps = slot 1. */
    wan_shape sh = {.B = 2, .F = 2, .H = 8, .W = 8, .L = EL};
    wan_acts *a = wan_acts_new(&m.cfg, &sh, WAN_ACTS_INFER);
    float *x2 = malloc(sizeof(float) * nl * 2), *o2 = malloc(sizeof(float) * nl * 2);
    float *enc = calloc((size_t)(2 * EL * m.cfg.text_dim), sizeof(float)), ts[2] = {rc.timesteps[0], rc.timesteps[0]};
    memcpy(enc, e, sizeof(float) * EL * m.cfg.text_dim);
    memcpy(x2, z, sizeof(float) * nl);
    memcpy(x2 + nl, z, sizeof(float) * nl);
    REQUIRE_OK(wan_forward(&m, a, NULL, o2, x2, ts, enc));
    for (int64_t k = 0; k < nl; k++) v[k] = o2[nl + k] + 4.5f * (o2[k] - o2[nl + k]);
    CHECK(memcmp(v, vrec, sizeof(float) * nl) == 0);
    free(vrec);
    core_philox_normal(eps, nl, 77, 1, 9, 0);
    flow_step st;
    REQUIRE_OK(flow_sde_step(z, v, eps, NULL, nl, rc.sigmas[0], rc.sigmas[1], rc.sigmas[1], 0.8f, NULL, xn, &st));
    CHECK(memcmp(xn, core_traj_latent(&t, 1), sizeof(float) * nl) == 0);
    CHECK(st.has_logp && t.has_log_prob[0] == 1 && t.log_probs[0] == st.logp);
    for (int i = 0; i < 6; i++) CHECK(t.has_log_prob[i] == 1 && isfinite(t.log_probs[i]) && t.expert[i] == 0);
    CHECK(t.uid == 9 && t.eta == 0.8f && t.guidance_scale == 4.5f && t.sigmas[6] == 0.0f);
    REQUIRE_OK(core_traj_validate(&t, "engine"));
    wan_acts_free(a);
    free(x2), free(o2), free(enc), free(z), free(e);
    core_traj_free(&t);
    wan_model_free(&m);
}

TEST(engine_batch_invariance) {
    wan_model m;
    tiny_model(&m, 5);
    rollout_experts E1 = rollout_one_expert(&m);
    const char *pr[4] = {"a red car", "blue sky", "a white cat", "the black night"};
    float *e = embeds(pr, 4, m.cfg.text_dim);
    REQUIRE(e);
    const int64_t ne = EL * m.cfg.text_dim;
    const float *cond[4] = {e, e + ne, e + 2 * ne, e + 3 * ne};
    uint64_t uids[4] = {12, 3, 40, 7};
    int64_t pidx[4] = {0, 1, 2, 3};
    const float gs[2] = {4.5f, 1.0f};
    for (int gi = 0; gi < 2; gi++) {
        rollout_config r4, r3, r1;
        REQUIRE_OK(rollout_config_init(&r4, 5, 3.0, 0.7f, gs[gi], SHAPE, EL, 1234, 4));
        REQUIRE_OK(rollout_config_init(&r3, 5, 3.0, 0.7f, gs[gi], SHAPE, EL, 1234, 3));
        REQUIRE_OK(rollout_config_init(&r1, 5, 3.0, 0.7f, gs[gi], SHAPE, EL, 1234, 1));
        core_traj t4[4], t3[4], t1;
        REQUIRE_OK(rollout_generate(&r4, &E1, NULL, 4, cond, uids, pidx, t4));
        REQUIRE_OK(rollout_generate(&r3, &E1, NULL, 4, cond, uids, pidx, t3));
        const int64_t bytes = sizeof(float) * 6 * core_traj_latent_numel(&t4[0]);
        for (int j = 0; j < 4; j++) {
            REQUIRE_OK(rollout_generate(&r1, &E1, NULL, 1, cond + j, uids + j, pidx + j, &t1));
            CHECK_MSG(memcmp(t1.latents, t4[j].latents, bytes) == 0, "g %g sample %d: alone vs batch of 4", gs[gi], j);
            CHECK_MSG(memcmp(t3[j].latents, t4[j].latents, bytes) == 0, "g %g sample %d: batches of 3 vs 4", gs[gi], j);
            CHECK(memcmp(t1.log_probs, t4[j].log_probs, sizeof(float) * 5) == 0);
            CHECK(t4[j].prompt_index == j);
            core_traj_free(&t1);
        }
        /* different uids really give different samples */
        CHECK(memcmp(t4[0].latents, t4[1].latents, bytes) != 0);
        for (int j = 0; j < 4; j++) core_traj_free(&t4[j]), core_traj_free(&t3[j]);
    }
    free(e);
    wan_model_free(&m);
}

/* Two experts (Wan 2.2 A14B routing): every step recomputed by hand from the recorded latents with the expert
 * flow_expert picks and that expert's guidance (4.5 with CFG rows; 1.0: one conditional forward only). */
TEST(engine_two_experts_routing) {
    wan_model hi, lo;
    tiny_model(&hi, 21);
    tiny_model(&lo, 22);
    rollout_experts E2 = {2, {&hi, &lo}};
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, 6, 3.0, 0.7f, 4.5f, SHAPE, EL, 5, 2));
    rc.guidance_scale_2 = 1.0f;
    rc.boundary_ratio = 0.875;
    const char *pr[2] = {"a red car", "blue sky"};
    float *e = embeds(pr, 2, hi.cfg.text_dim);
    REQUIRE(e);
    const int64_t ne = EL * hi.cfg.text_dim, nl = 16 * 2 * 8 * 8;
    const float *cond[2] = {e, e + ne};
    uint64_t uids[2] = {4, 11};
    core_traj t[2];
    REQUIRE_OK(rollout_generate(&rc, &E2, NULL, 2, cond, uids, NULL, t));
    int n_hi = 0, n_lo = 0;
    wan_shape sh = {.B = 2, .F = 2, .H = 8, .W = 8, .L = EL};
    wan_acts *a = wan_acts_new(&hi.cfg, &sh, WAN_ACTS_INFER);
    float *x2 = malloc(sizeof(float) * nl * 2), *o2 = malloc(sizeof(float) * nl * 2), *v = malloc(sizeof(float) * nl);
    float *eps = malloc(sizeof(float) * nl), *xn = malloc(sizeof(float) * nl);
    float *enc = calloc((size_t)(2 * ne), sizeof(float));
    REQUIRE(a && x2 && o2 && v && eps && xn && enc);
    for (int j = 0; j < 2; j++) {
        CHECK(t[j].guidance_scale == 4.5f && t[j].guidance_scale_2 == 1.0f);
        for (int i = 0; i < 6; i++) {
            const int ex = t[j].timesteps[i] >= 875.0f ? 0 : 1;
            CHECK(t[j].expert[i] == ex);
            n_hi += j == 0 && ex == 0, n_lo += j == 0 && ex == 1;
            const wan_model *m = ex ? &lo : &hi;
            const float g = ex ? 1.0f : 4.5f;
            memcpy(enc, cond[j], sizeof(float) * ne);
            memcpy(x2, core_traj_latent(&t[j], i), sizeof(float) * nl);
            memcpy(x2 + nl, x2, sizeof(float) * nl);
            float ts[2] = {rc.timesteps[i], rc.timesteps[i]};
            /* B = 2 rows (cond, uncond); with g = 1 only row 0 is used: a row's output does not depend on its mates. */
            REQUIRE_OK(wan_forward(m, a, NULL, o2, x2, ts, enc));
            for (int64_t k = 0; k < nl; k++) v[k] = g == 1.0f ? o2[k] : o2[nl + k] + g * (o2[k] - o2[nl + k]);
            core_philox_normal(eps, nl, 5, (uint32_t)(i + 1), (uint32_t)uids[j], 0);
            flow_step st;
            REQUIRE_OK(flow_sde_step(x2, v, eps, NULL, nl, rc.sigmas[i], rc.sigmas[i + 1], rc.sigmas[1], 0.7f, NULL, xn,
                                     &st));
            CHECK(memcmp(xn, core_traj_latent(&t[j], i + 1), sizeof(float) * nl) == 0);
            CHECK(t[j].log_probs[i] == st.logp);
        }
    }
    CHECK(n_hi >= 1 && n_lo >= 1); /* the schedule crosses the boundary */
    /* A bad boundary and mismatched experts are refused. */
    rc.boundary_ratio = 1.0;
    CHECK(rollout_generate(&rc, &E2, NULL, 1, cond, uids, NULL, t) == -1);
    CHECK(strstr(core_last_error(), "model.boundary_ratio") != NULL);
    wan_acts_free(a);
    free(x2), free(o2), free(v), free(eps), free(xn), free(enc), free(e);
    core_traj_free(&t[0]);
    core_traj_free(&t[1]);
    wan_model_free(&hi);
    wan_model_free(&lo);
}

/* SDE window (rollout.sde_window): steps [2, 4) of 6 step with eta, the others with eta 0; the trajectory trimmed after
 * "decoding" keeps latents 2..4 (and the step means of steps 2, 3 when recorded), which equal the untrimmed chain's;
 * only window steps have a log-prob; the ODE steps are x + dt v exactly as an eta-0 run's (the first two latents
 * equal a full eta-0 run's bit for bit); a window step's recorded mean reproduces its latent with the Philox noise. */
TEST(engine_sde_window_trajectory) {
    wan_model m;
    tiny_model(&m, 4);
    rollout_experts E1 = rollout_one_expert(&m);
    rollout_config rc, ode;
    REQUIRE_OK(rollout_config_init(&rc, 6, 3.0, 0.8f, 4.5f, SHAPE, EL, 77, 2));
    REQUIRE_OK(rollout_config_init(&ode, 6, 3.0, 0.0f, 4.5f, SHAPE, EL, 77, 2));
    core_rollout_request req = {.stream = CORE_STREAM_ROLLOUT_NOISE, .eta = 0.8f, .window_lo = 2, .window_hi = 4,
                                .return_trajectories = 1, .return_means = 1};
    REQUIRE_OK(rollout_config_apply_request(&rc, &req));
    const char *pr[2] = {"a green frog", "a red ball"};
    float *e = embeds(pr, 2, m.cfg.text_dim);
    REQUIRE(e);
    const float *cond[2] = {e, e + EL * m.cfg.text_dim};
    uint64_t uid[2] = {3, 4};
    core_traj t[2], o[2];
    REQUIRE_OK(rollout_generate(&rc, &E1, NULL, 2, cond, uid, NULL, t));
    REQUIRE_OK(rollout_generate(&ode, &E1, NULL, 2, cond, uid, NULL, o));
    const int64_t nl = 16 * 2 * 8 * 8;
    float *keep = malloc(sizeof(float) * nl * 3), *mean2 = malloc(sizeof(float) * nl), *eps = malloc(sizeof(float) * nl);
    REQUIRE(keep && mean2 && eps);
    for (int j = 0; j < 2; j++) {
        for (int i = 0; i < 6; i++) CHECK(t[j].has_log_prob[i] == (i == 2 || i == 3));
        for (int i = 0; i <= 2; i++) /* before the window: the ODE chain of an eta-0 run */
            CHECK(memcmp(core_traj_latent(&t[j], i), core_traj_latent(&o[j], i), sizeof(float) * nl) == 0);
        CHECK(memcmp(core_traj_latent(&t[j], 3), core_traj_latent(&o[j], 3), sizeof(float) * nl) != 0);
        /* step 2's latent = its recorded mean + step_std x the Philox noise of slot 3 */
        flow_step st;
        REQUIRE_OK(flow_step_init(&st, t[j].sigmas[2], t[j].sigmas[3], t[j].sigmas[1], 0.8f));
        core_philox_normal(eps, nl, 77, 3, (uint32_t)uid[j], CORE_STREAM_ROLLOUT_NOISE);
        const float *mu = core_traj_mean(&t[j], 2), *x3 = core_traj_latent(&t[j], 3);
        REQUIRE(mu);
        int same = 1;
        for (int64_t k = 0; k < nl; k++) same &= x3[k] == mu[k] + st.step_std * eps[k];
        CHECK(same);
        memcpy(keep, core_traj_latent(&t[j], 2), sizeof(float) * nl * 3);
        memcpy(mean2, mu, sizeof(float) * nl);
        REQUIRE_OK(rollout_trim_to_window(&rc, &t[j]));
        CHECK(t[j].latent_first == 2 && t[j].n_latents == 3);
        CHECK(core_traj_has_latent(&t[j], 2) && core_traj_has_latent(&t[j], 4) && !core_traj_has_latent(&t[j], 1) &&
              !core_traj_has_latent(&t[j], 5) && !core_traj_has_latent(&t[j], 6));
        CHECK(memcmp(keep, core_traj_latent(&t[j], 2), sizeof(float) * nl * 3) == 0);
        CHECK(core_traj_mean(&t[j], 2) && memcmp(mean2, core_traj_mean(&t[j], 2), sizeof(float) * nl) == 0);
        CHECK(core_traj_mean(&t[j], 4) == NULL);
        REQUIRE_OK(core_traj_validate(&t[j], "windowed"));
        core_traj_free(&t[j]);
        core_traj_free(&o[j]);
    }
    /* a window past the schedule is refused */
    req.window_lo = 4, req.window_hi = 7;
    CHECK(rollout_config_apply_request(&rc, &req) == -1 && strstr(core_last_error(), "sde_window"));
    free(keep), free(mean2), free(eps), free(e);
    wan_model_free(&m);
}
