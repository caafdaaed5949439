/* tests/test_wire_rollout.c — rollout_request and trajectory messages (core/wire_rollout.h): round trips through
 * the frames (trajectories bit for bit, rewards, hashes, videos), and every rejection naming its field. */
#include <jansson.h>
#include <string.h>

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
