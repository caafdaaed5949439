/* tests/test_wire_rollout.c — rollout_request and trajectory messages (core/wire_rollout.h): round trips through
 * the frames (trajectories bit for bit, full or a stored range with or without the step means, rewards, hashes,
 * velocities, videos), a full trajectory's reply byte for byte as before stored ranges, and every rejection naming
 * its field. */
#include <jansson.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/wire_rollout.h"
#include "tests/test.h"

/* Parses the frames of a built message. */
static int reparse(const core_wire_built *b, core_wire_msg *m) {
    return core_wire_parse(b->frames, b->n_frames, NULL, m);
}

TEST(wire_rollout_request_round_trip) {
    json_t *md = json_pack("{s:s}", "color", "red");
    core_rollout_sample s[2] = {{.uid = 4294967295ull, .prompt_index = 3, .prompt = "a red car", .metadata = md},
                                {.uid = 0, .prompt_index = 0, .prompt = ""}};
    core_rollout_request req = {.policy_version = 12, .stream = CORE_STREAM_EVAL_NOISE, .eta = 0.7f,
                                .return_trajectories = 1, .return_videos = 0, .n = 2, .samples = s};
    core_wire_built b;
    REQUIRE_OK(core_rollout_request_build("q1", &req, &b));
    core_wire_msg m;
    REQUIRE_OK(reparse(&b, &m));
    core_rollout_request got;
    REQUIRE_OK(core_rollout_request_parse(&m, &got));
    CHECK(got.policy_version == 12 && got.stream == CORE_STREAM_EVAL_NOISE && got.eta == 0.7f);
    CHECK(got.return_trajectories == 1 && got.return_videos == 0 && got.n == 2);
    CHECK(got.samples[0].uid == 4294967295ull && got.samples[0].prompt_index == 3);
    CHECK(!strcmp(got.samples[0].prompt, "a red car") && !strcmp(got.samples[1].prompt, ""));
    CHECK(!strcmp(json_string_value(json_object_get(got.samples[0].metadata, "color")), "red"));
    CHECK(got.samples[1].metadata == NULL);
    core_rollout_request_free(&got);
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    json_decref(md);
}

/* A rollout_request header with one field replaced must be refused naming `want`. */
static void refuse(const char *header, const char *want) {
    core_wire_frame f = {header, strlen(header)};
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(&f, 1, NULL, &m));
    core_rollout_request r;
    CHECK(core_rollout_request_parse(&m, &r) == -1);
    if (!strstr(core_last_error(), want)) test_fail(__FILE__, __LINE__, "error \"%s\" does not name %s", core_last_error(), want);
    core_wire_msg_free(&m);
}

#define HDR(fields) "{\"v\":1,\"type\":\"rollout_request\",\"id\":\"x\"," fields "}"
#define OKF "\"policy_version\":0,\"stream\":\"rollout\",\"eta\":1,\"return_trajectories\":true,\"return_videos\":false,"

TEST(wire_rollout_request_rejections) {
    refuse(HDR("\"stream\":\"rollout\",\"eta\":1,\"return_trajectories\":true,\"return_videos\":false,"
               "\"samples\":[{\"uid\":1,\"prompt_index\":0,\"prompt\":\"a\"}]"), "policy_version");
    refuse(HDR("\"policy_version\":0,\"stream\":\"train\",\"eta\":1,\"return_trajectories\":true,\"return_videos\":false,"
               "\"samples\":[{\"uid\":1,\"prompt_index\":0,\"prompt\":\"a\"}]"), "stream");
    refuse(HDR("\"policy_version\":0,\"stream\":\"eval\",\"eta\":-1,\"return_trajectories\":true,\"return_videos\":false,"
               "\"samples\":[{\"uid\":1,\"prompt_index\":0,\"prompt\":\"a\"}]"), "eta");
    refuse(HDR("\"policy_version\":0,\"stream\":\"eval\",\"eta\":1,\"return_trajectories\":1,\"return_videos\":false,"
               "\"samples\":[{\"uid\":1,\"prompt_index\":0,\"prompt\":\"a\"}]"), "return_trajectories");
    refuse(HDR(OKF "\"samples\":[]"), "samples");
    refuse(HDR(OKF "\"samples\":[{\"uid\":4294967296,\"prompt_index\":0,\"prompt\":\"a\"}]"), "samples[0]: \"uid\"");
    refuse(HDR(OKF "\"samples\":[{\"uid\":1,\"prompt_index\":-1,\"prompt\":\"a\"}]"), "prompt_index");
    refuse(HDR(OKF "\"samples\":[{\"uid\":1,\"prompt_index\":0}]"), "\"prompt\"");
    refuse(HDR(OKF "\"samples\":[{\"uid\":1,\"prompt_index\":0,\"prompt\":\"a\"},{\"uid\":1,\"prompt_index\":0,\"prompt\":\"b\"}]"),
           "samples[1]: uid 1 repeats");
    refuse(HDR(OKF "\"samples\":[{\"uid\":1,\"prompt_index\":0,\"prompt\":\"a\",\"metadata\":{\"color\":3}}]"), "metadata \"color\"");
    refuse(HDR(OKF "\"samples\":[7]"), "samples[0]: must be an object");
}

TEST(wire_trajectory_reply_round_trip) {
    const int64_t shape[4] = {2, 1, 2, 2};
    core_traj t[2];
    core_rollout_sample s[2] = {{.uid = 5, .prompt_index = 1, .prompt = "a"}, {.uid = 9, .prompt_index = 2, .prompt = "b"}};
    uint64_t vh[2] = {0x0123456789abcdefull, 42};
    for (int j = 0; j < 2; j++) {
        REQUIRE_OK(core_traj_alloc(&t[j], 3, shape));
        t[j].uid = s[j].uid, t[j].prompt_index = s[j].prompt_index, t[j].policy_version = 4;
        t[j].eta = 0.7f, t[j].guidance_scale = 4.5f, t[j].guidance_scale_2 = 3.0f;
        const float sig[4] = {1.0f, 0.6f, 0.25f, 0.0f};
        memcpy(t[j].sigmas, sig, sizeof sig);
        for (int i = 0; i < 3; i++) t[j].timesteps[i] = 1000 * sig[i], t[j].has_log_prob[i] = 1, t[j].log_probs[i] = -1.5f * (float)(i + j + 1);
        t[j].expert[2] = 1;
        core_philox_normal(t[j].latents, 4 * 8, 3, 0, (uint32_t)j, 0);
        const char *names[2] = {"color_match", "brightness"};
        const float vals[2] = {0.25f + (float)j, 1.0f / 3.0f};
        REQUIRE_OK(core_traj_set_rewards(&t[j], 2, names, vals, 0.1f * (float)j + 0.3f));
    }
    uint8_t videos[2 * 2 * 4 * 4 * 3];
    for (size_t i = 0; i < sizeof videos; i++) videos[i] = (uint8_t)(i * 7);
    const int64_t vshape[4] = {2, 4, 4, 3};
    core_wire_built b;
    REQUIRE_OK(core_trajectory_reply_build("r", 4, 2, t, vh, 1, videos, vshape, &b));
    core_wire_msg m;
    REQUIRE_OK(reparse(&b, &m));
    core_rollout_request req = {.policy_version = 4, .return_trajectories = 1, .return_videos = 1, .n = 2, .samples = s};
    core_rollout_result res[2];
    const uint8_t *vg;
    int64_t vs[4];
    REQUIRE_OK(core_trajectory_reply_parse(&m, &req, res, &vg, vs));
    CHECK(vs[0] == 2 && vs[1] == 4 && vs[2] == 4 && vs[3] == 3 && !memcmp(vg, videos, sizeof videos));
    for (int j = 0; j < 2; j++) {
        const core_traj *a = &t[j], *g = &res[j].traj;
        CHECK(res[j].video_hash == vh[j]);
        CHECK(g->uid == a->uid && g->prompt_index == a->prompt_index && g->policy_version == 4 && g->n_steps == 3);
        CHECK(!memcmp(g->latents, a->latents, sizeof(float) * 4 * 8) && !memcmp(g->log_probs, a->log_probs, 12));
        CHECK(!memcmp(g->expert, a->expert, 3) && !memcmp(g->sigmas, a->sigmas, 16));
        CHECK(g->eta == 0.7f && g->guidance_scale_2 == 3.0f);
        CHECK(g->n_rewards == 2 && g->rewards[0] == a->rewards[0] && g->rewards[1] == a->rewards[1]);
        CHECK(!strcmp(g->reward_names[1], "brightness") && g->reward_total == a->reward_total);
        core_traj_free(&res[j].traj);
    }
    /* The reply checked against a request it does not answer: other uids, other version, videos not sent. */
    core_rollout_sample s2[2] = {s[0], {.uid = 10, .prompt_index = 2}};
    core_rollout_request other = req;
    other.samples = s2;
    CHECK(core_trajectory_reply_parse(&m, &other, res, &vg, vs) == -1 && strstr(core_last_error(), "samples[1]: uid 9"));
    other = req;
    other.policy_version = 5;
    CHECK(core_trajectory_reply_parse(&m, &other, res, &vg, vs) == -1 && strstr(core_last_error(), "policy_version 4"));
    other = req;
    other.return_videos = 0;
    CHECK(core_trajectory_reply_parse(&m, &other, res, &vg, vs) == -1 && strstr(core_last_error(), "tensors"));
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    /* Rewards only (no trajectories, no videos). */
    REQUIRE_OK(core_trajectory_reply_build("r", 4, 2, t, vh, 0, NULL, vshape, &b));
    REQUIRE_OK(reparse(&b, &m));
    req.return_trajectories = 0, req.return_videos = 0;
    REQUIRE_OK(core_trajectory_reply_parse(&m, &req, res, &vg, vs));
    CHECK(vg == NULL && res[1].traj.latents == NULL && res[1].traj.reward_total == t[1].reward_total);
    CHECK(res[0].traj.rewards[0] == 0.25f);
    for (int j = 0; j < 2; j++) core_traj_free(&res[j].traj), core_traj_free(&t[j]);
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    uint64_t h;
    CHECK(core_hash_parse("0123456789ABCDEF", &h) == 0 && h == 0x0123456789abcdefull);
    CHECK(core_hash_parse("0123456789abcde", &h) == -1 && core_hash_parse("0123456789abcdeg", &h) == -1);
}

/* The trajectory of tests/test_trajectory.c's make_traj with a uid below 2^32: N = 3, latent [2, 3, 4, 5], log-probs
 * at steps 0 and 2, experts 0 1 1, two rewards. */
static void make_wire_traj(core_traj *t, uint64_t uid, int64_t prompt_index) {
    const int64_t shape[4] = {2, 3, 4, 5};
    REQUIRE_OK(core_traj_alloc(t, 3, shape));
    const float sig[4] = {1.0f, 0.7123456789f, 0.1f, 0.0f};
    for (int i = 0; i < 4; i++) t->sigmas[i] = sig[i];
    for (int i = 0; i < 3; i++) t->timesteps[i] = sig[i] * 1000.0f;
    test_fill_uniform(t->latents, (size_t)(4 * core_traj_latent_numel(t)), 77, -3, 3);
    core_traj_latent(t, 2)[5] = 1e-40f;
    t->log_probs[0] = 1.2345679e-7f, t->log_probs[2] = -3.3333333f;
    t->has_log_prob[0] = t->has_log_prob[2] = 1;
    t->expert[1] = t->expert[2] = 1;
    t->uid = uid, t->prompt_index = prompt_index, t->policy_version = 4;
    t->eta = 0.7f, t->guidance_scale = 5.0f, t->guidance_scale_2 = 0.1f;
    const char *names[2] = {"color_match", "brightness"};
    const float vals[2] = {0.333333343f, 1e-30f};
    REQUIRE_OK(core_traj_set_rewards(t, 2, names, vals, 0.333333343f + 1e-30f));
}

/* A reply of full trajectories without means is the message sent before stored ranges existed, byte for byte: the
 * frames' chained xxh64 recorded from commit 36fcab4 with these two trajectories. */
TEST(wire_trajectory_reply_full_bytes_unchanged) {
    core_traj t[2];
    make_wire_traj(&t[0], 5, 42);
    make_wire_traj(&t[1], 9, 2);
    t[1].log_probs[2] = -1.25f;
    uint64_t vh[2] = {0x0123456789abcdefull, 42};
    uint8_t videos[2 * 2 * 4 * 4 * 3];
    for (size_t i = 0; i < sizeof videos; i++) videos[i] = (uint8_t)(i * 7);
    const int64_t vshape[4] = {2, 4, 4, 3};
    core_wire_built b;
    REQUIRE_OK(core_trajectory_reply_build("r", 4, 2, t, vh, 1, videos, vshape, &b));
    uint64_t h = 0;
    size_t total = 0;
    for (int i = 0; i < b.n_frames; i++) h = core_xxh64(b.frames[i].data, b.frames[i].len, h), total += b.frames[i].len;
    CHECK_MSG(b.n_frames == 16 && total == 5840 && h == 0x6ebb4173e0e7196bull, "%d frames, %zu bytes, xxh64 %016llx",
              b.n_frames, total, (unsigned long long)h);
    CHECK(strstr(b.header_text, "\"format_version\":\"1\"") && !strstr(b.header_text, "latent_first"));
    core_wire_built_free(&b);
    core_traj_free(&t[0]), core_traj_free(&t[1]);
}

/* Three samples in one reply: a stored range with the step means (8 tensors), the same range without (7), a full
 * trajectory (7), each with its velocity, then the videos; bit for bit back. Then the per-sample tensor counting
 * refuses a sample missing a tensor, a tensor belonging to no sample, and a velocity not asked for. */
TEST(wire_trajectory_reply_stored_ranges) {
    core_traj t[3];
    core_rollout_sample s[3] = {{.uid = 1, .prompt_index = 0, .prompt = "a"}, {.uid = 2, .prompt_index = 0, .prompt = "a"},
                                {.uid = 3, .prompt_index = 1, .prompt = "b"}};
    const int64_t nl = 120;
    static float vel[3][3 * 120];
    const float *velp[3] = {vel[0], vel[1], vel[2]};
    for (int j = 0; j < 3; j++) {
        make_wire_traj(&t[j], s[j].uid, s[j].prompt_index);
        test_fill_uniform(vel[j], 3 * nl, 90 + (unsigned long long)j, -1, 1);
        if (j == 2) continue;
        t[j].has_log_prob[0] = t[j].has_log_prob[2] = 0, t[j].log_probs[0] = t[j].log_probs[2] = 0;
        t[j].has_log_prob[1] = 1, t[j].log_probs[1] = -0.5f;
        if (j == 0) {
            REQUIRE_OK(core_traj_alloc_means(&t[j]));
            test_fill_uniform(t[j].means, 3 * nl, 91, -2, 2);
        }
        REQUIRE_OK(core_traj_trim(&t[j], 1, 2));
    }
    uint64_t vh[3] = {1, 2, 3};
    uint8_t videos[3 * 1 * 2 * 2 * 3];
    for (size_t i = 0; i < sizeof videos; i++) videos[i] = (uint8_t)(i * 5);
    const int64_t vshape[4] = {1, 2, 2, 3};
    core_wire_built b;
    REQUIRE_OK(core_trajectory_reply_build_v("r", 4, 3, t, vh, 1, velp, videos, vshape, &b));
    core_wire_msg m;
    REQUIRE_OK(reparse(&b, &m));
    CHECK(m.n_tensors == 8 + 7 + 7 + 3 + 1);
    CHECK(!strcmp(m.tensors[7].name, "0/means") && !strcmp(m.tensors[8].name, "0/velocity"));
    core_rollout_request req = {.policy_version = 4, .return_trajectories = 1, .return_videos = 1,
                                .return_velocities = 1, .n = 3, .samples = s};
    core_rollout_result res[3];
    const uint8_t *vg;
    int64_t vs[4];
    REQUIRE_OK(core_trajectory_reply_parse(&m, &req, res, &vg, vs));
    CHECK(vg && !memcmp(vg, videos, sizeof videos));
    for (int j = 0; j < 3; j++) {
        const core_traj *a = &t[j], *g = &res[j].traj;
        CHECK_MSG(g->latent_first == a->latent_first && g->n_latents == a->n_latents && g->n_steps == 3, "sample %d", j);
        CHECK(!memcmp(g->latents, a->latents, sizeof(float) * (size_t)(a->n_latents * nl)));
        CHECK(!a->means == !g->means);
        if (a->means && g->means) CHECK(!memcmp(g->means, a->means, sizeof(float) * (size_t)((a->n_latents - 1) * nl)));
        CHECK(!memcmp(g->log_probs, a->log_probs, 12) && !memcmp(g->has_log_prob, a->has_log_prob, 3));
        CHECK(res[j].velocity && !memcmp(res[j].velocity, vel[j], sizeof vel[j]));
        CHECK(g->n_rewards == 2 && g->reward_total == a->reward_total);
        core_rollout_result_free(&res[j]);
    }
    CHECK(t[0].latent_first == 1 && t[2].n_latents == 4);
    CHECK(strstr(b.header_text, "\"latent_first\":\"1\"") && strstr(b.header_text, "\"format_version\":\"2\""));
    /* asked for the step means (GRPO-Guard), a reply whose sample 1 carries none is refused, naming it */
    req.return_means = 1;
    CHECK(core_trajectory_reply_parse(&m, &req, res, &vg, vs) == -1 && strstr(core_last_error(), "samples[1]") &&
          strstr(core_last_error(), "return_means"));
    req.return_means = 0;

    /* The same frames with tensors taken out or added (a shallow copy of the message with another tensor list). */
    core_wire_tensor ts[32];
    core_wire_msg mm = m;
    mm.tensors = ts;
    int n = 0; /* without "0/rewards": sample 0 has 7 tensors, but not the ones it needs */
    for (int i = 0; i < m.n_tensors; i++)
        if (strcmp(m.tensors[i].name, "0/rewards")) ts[n++] = m.tensors[i];
    mm.n_tensors = n;
    CHECK(core_trajectory_reply_parse(&mm, &req, res, &vg, vs) == -1 &&
          strstr(core_last_error(), "samples[0]: tensor 'rewards' missing"));
    n = 0; /* a second "2/velocity": a tensor that belongs to no sample */
    for (int i = 0; i < m.n_tensors; i++) {
        ts[n++] = m.tensors[i];
        if (!strcmp(m.tensors[i].name, "2/velocity")) ts[n++] = m.tensors[i];
    }
    mm.n_tensors = n;
    CHECK(core_trajectory_reply_parse(&mm, &req, res, &vg, vs) == -1 &&
          strstr(core_last_error(), "tensor 25 \"2/velocity\" belongs to no sample"));
    n = 0; /* "1/sigmas" moved before sample 0's tensors */
    ts[n++] = m.tensors[9];
    for (int i = 0; i < m.n_tensors; i++)
        if (i != 9) ts[n++] = m.tensors[i];
    mm.n_tensors = n;
    CHECK(!strcmp(ts[0].name, "1/sigmas") && core_trajectory_reply_parse(&mm, &req, res, &vg, vs) == -1 &&
          strstr(core_last_error(), "samples[0]: tensor 0 is \"1/sigmas\", expected a \"0/...\" tensor"));
    core_rollout_request other = req;
    other.return_velocities = 0; /* velocities not asked for: within the count (a sample may carry 10 tensors with
                                    means, condition and concat), so sample 0's velocity is read as an unknown field */
    CHECK(core_trajectory_reply_parse(&m, &other, res, &vg, vs) == -1 &&
          strstr(core_last_error(), "samples[0]: unknown tensor 'velocity'"));
    mm.n_tensors = 0; /* 21 tensors: one fewer than 3 samples need */
    for (int i = 0; i < m.n_tensors; i++)
        if (strcmp(m.tensors[i].name, "1/velocity") && strcmp(m.tensors[i].name, "2/velocity") &&
            strcmp(m.tensors[i].name, "0/velocity") && strcmp(m.tensors[i].name, "2/expert") &&
            strcmp(m.tensors[i].name, "2/rewards"))
            ts[mm.n_tensors++] = m.tensors[i];
    CHECK_MSG(core_trajectory_reply_parse(&mm, &other, res, &vg, vs) == -1 &&
              strstr(core_last_error(), "21 tensors, expected 22 .. 31"), "%s", core_last_error());
    other = req;
    other.return_trajectories = 0, other.return_velocities = 0;
    CHECK(core_trajectory_reply_parse(&m, &other, res, &vg, vs) == -1 && strstr(core_last_error(), "26 tensors, expected 1"));
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    for (int j = 0; j < 3; j++) core_traj_free(&t[j]);
}
