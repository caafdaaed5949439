/* tests/test_worker.c — a `vgrpo rollout-worker` process driven by this test acting as the controller (a ROUTER),
 * with a `vgrpo reward-server` process behind it:
 *   hello fields; a weights update (every tensor perturbed) acknowledged with the whole-model hash computed here; a
 *   rollout at the new version whose trajectory equals, bit for bit, one generated in this process with the same
 *   perturbed weights; a request for another version refused (version_mismatch); a tensor whose bytes do not match
 *   its xxh64 and a wrong whole-model hash refused (weights_mismatch, naming the tensor / both hashes) with the old
 *   weights kept; an unknown tensor name; `shutdown` answered and exit status 0. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"
#include "core/wire_zmq.h"
#include "rollout/pipeline.h"
#include "tests/test.h"

typedef struct {
    void *ctx, *router;
    uint8_t rid[256];
    size_t rid_len;
} ctl;

/* Receives the next message (5 s at most) into *m (parsed; frames kept in *zm). */
static int ctl_recv(ctl *c, core_zmq_msg *zm, core_wire_msg *m) {
    zmq_pollitem_t it = {c->router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 20000) <= 0) return -1;
    if (core_zmq_recv(c->router, 0, zm)) return -1;
    memcpy(c->rid, zmq_msg_data(&zm->frames[0]), zmq_msg_size(&zm->frames[0]));
    c->rid_len = zmq_msg_size(&zm->frames[0]);
    return core_zmq_parse(zm, 1, NULL, m);
}

/* Sends the weights of `m` as expert "transformer" at version v; corrupt >= 0: that tensor's header hash is off by
 * one; bad_model_hash: weights_end carries a wrong whole-model hash. */
static void send_weights(ctl *c, const wan_model *m, int64_t v, int corrupt, int bad_model_hash) {
    json_t *f = json_pack("{s:I, s:i}", "policy_version", (json_int_t)v, "tensors_count", m->layout.count);
    REQUIRE_OK(core_zmq_send_fields(c->router, c->rid, c->rid_len, CORE_WIRE_WEIGHTS_BEGIN, "wb", f));
    json_decref(f);
    for (int i = 0; i < m->layout.count; i++) {
        const wan_tensor *t = &m->layout.tensors[i];
        char name[128], hx[17], id[32];
        snprintf(name, sizeof name, "transformer/%s", t->name);
        core_hash_hex(wan_tensor_hash(m, i) + (i == corrupt ? 1 : 0), hx);
        snprintf(id, sizeof id, "wt-%d", i);
        core_wire_tensor wt = {.name = "value", .dtype = CORE_F32, .ndim = t->ndim, .data = m->params + t->offset,
                               .nbytes = sizeof(float) * (size_t)t->numel};
        memcpy(wt.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        json_t *tf = json_pack("{s:s, s:s}", "name", name, "xxh64", hx);
        core_wire_built b;
        REQUIRE_OK(core_wire_build(CORE_WIRE_WEIGHTS_TENSOR, id, tf, &wt, 1, &b));
        REQUIRE_OK(core_zmq_send(c->router, c->rid, c->rid_len, &b));
        core_wire_built_free(&b);
        json_decref(tf);
    }
    const wan_model *ms[1] = {m};
    uint64_t h;
    REQUIRE_OK(wan_models_hash(ms, 1, &h));
    char hx[17];
    core_hash_hex(h + (bad_model_hash ? 1 : 0), hx);
    f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)v, "model_xxh64", hx);
    REQUIRE_OK(core_zmq_send_fields(c->router, c->rid, c->rid_len, CORE_WIRE_WEIGHTS_END, "we", f));
    json_decref(f);
}

static core_rollout_sample samples[2];

static void send_rollout(ctl *c, int64_t v, const char *id, int with_velocities) {
    samples[0] = (core_rollout_sample){.uid = 7, .prompt_index = 0, .prompt = "a red ball"};
    samples[1] = (core_rollout_sample){.uid = 12, .prompt_index = 1, .prompt = "blue water"};
    core_rollout_request req = {.policy_version = v, .stream = CORE_STREAM_ROLLOUT_NOISE, .eta = 0.8f,
                                .return_trajectories = 1, .return_videos = 0, .return_velocities = with_velocities,
                                .n = 2, .samples = samples};
    core_wire_built b;
    REQUIRE_OK(core_rollout_request_build(id, &req, &b));
    REQUIRE_OK(core_zmq_send(c->router, c->rid, c->rid_len, &b));
    core_wire_built_free(&b);
}

static const char *expect_error(ctl *c, const char *code) {
    static char reason[1024];
    core_zmq_msg zm;
    core_wire_msg m;
    reason[0] = 0;
    if (ctl_recv(c, &zm, &m)) return "(nothing received)";
    if (m.type == CORE_WIRE_ERROR && !strcmp(json_string_value(json_object_get(m.header, "code")), code))
        snprintf(reason, sizeof reason, "%s", json_string_value(json_object_get(m.header, "reason")));
    else
        snprintf(reason, sizeof reason, "(got %s)", core_wire_type_name(m.type));
    core_wire_msg_free(&m);
    core_zmq_msg_close(&zm);
    return reason;
}

TEST(worker_weights_update_and_rollout_parity) {
    const char *dir = test_tmpdir();
    char sock[64] = "/tmp/vgrpo-w-XXXXXX", ctl_ep[128], rew_ep[128], mset[600], pset[600], lp[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
    REQUIRE(mkdtemp(sock));
    snprintf(ctl_ep, sizeof ctl_ep, "ipc://%s/ctl", sock);
    snprintf(rew_ep, sizeof rew_ep, "ipc://%s/rew", sock);
    snprintf(mset, sizeof mset, "model.path=%s/model", dir);
    snprintf(pset, sizeof pset, "rollout.num_steps=3");
    ctl c = {0};
    c.ctx = zmq_ctx_new();
    c.router = zmq_socket(c.ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(c.router, ZMQ_LINGER, &linger, sizeof linger);
    REQUIRE(zmq_bind(c.router, ctl_ep) == 0);
    pid_t rs = fork();
    if (rs == 0) {
        snprintf(lp, sizeof lp, "%s/reward.log", dir);
        FILE *f = freopen(lp, "w", stderr);
        (void)f;
        execl(test_vgrpo_bin(), test_vgrpo_bin(), "reward-server", "--bind", rew_ep, "--scorers", "color_match:1,brightness:0.5",
              (char *)NULL);
        _exit(127);
    }
    pid_t wk = fork();
    if (wk == 0) {
        snprintf(lp, sizeof lp, "%s/worker.log", dir);
        FILE *f = freopen(lp, "w", stderr);
        (void)f;
        execl(test_vgrpo_bin(), test_vgrpo_bin(), "rollout-worker", "recipes/tiny-cpu.yaml", "--controller", ctl_ep,
              "--reward", rew_ep, "--id", "worker-t", "--set", mset, "--set", pset, (char *)NULL);
        _exit(127);
    }
    core_zmq_msg zm;
    core_wire_msg m;
    REQUIRE_OK(ctl_recv(&c, &zm, &m));
    CHECK(m.type == CORE_WIRE_HELLO);
    CHECK(!strcmp(json_string_value(json_object_get(m.header, "client")), "worker-t"));
    CHECK(json_integer_value(json_object_get(m.header, "policy_version")) == 0);
    core_wire_msg_free(&m);
    core_zmq_msg_close(&zm);

    /* The in-process pipeline (same recipe), its weights perturbed: the policy of version 1. */
    core_recipe r;
    const char *sets[2] = {mset, pset};
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, 2));
    rollout_pipeline p;
    REQUIRE_OK(rollout_pipeline_load(&p, &r, NULL));
    wan_model *pm = &p.model[0];
    for (int64_t i = 0; i < pm->layout.numel; i++) pm->params[i] += 0.01f * sinf((float)i);
    const wan_model *ms[1] = {pm};
    uint64_t want_hash;
    REQUIRE_OK(wan_models_hash(ms, 1, &want_hash));

    send_weights(&c, pm, 1, -1, 0);
    REQUIRE_OK(ctl_recv(&c, &zm, &m));
    REQUIRE(m.type == CORE_WIRE_WEIGHTS_ACK);
    uint64_t got_hash = 0;
    REQUIRE_OK(core_hash_parse(json_string_value(json_object_get(m.header, "model_xxh64")), &got_hash));
    CHECK(got_hash == want_hash);
    CHECK(json_integer_value(json_object_get(m.header, "policy_version")) == 1);
    core_wire_msg_free(&m);
    core_zmq_msg_close(&zm);

    /* Rollout at version 1 == the same samples generated here. */
    send_rollout(&c, 1, "r1", 1);
    REQUIRE_OK(ctl_recv(&c, &zm, &m));
    REQUIRE(m.type == CORE_WIRE_TRAJECTORY);
    core_rollout_request req = {.policy_version = 1, .stream = 0, .eta = 0.8f, .return_trajectories = 1,
                                .return_velocities = 1, .n = 2, .samples = samples};
    core_rollout_result res[2];
    const uint8_t *vids;
    int64_t vshape[4];
    REQUIRE_OK(core_trajectory_reply_parse(&m, &req, res, &vids, vshape));
    const float *cond[2];
    REQUIRE_OK(rollout_pipeline_embed(&p, "a red ball", &cond[0]));
    REQUIRE_OK(rollout_pipeline_embed(&p, "blue water", &cond[1]));
    uint64_t uids[2] = {7, 12};
    int64_t pidx[2] = {0, 1};
    rollout_config rc = p.rc;
    rc.eta = 0.8f;
    rc.policy_version = 1;
    const int64_t nvel = (int64_t)rc.n_steps * rc.shape[0] * rc.shape[1] * rc.shape[2] * rc.shape[3];
    float *vbuf = malloc(sizeof(float) * (size_t)(2 * nvel));
    REQUIRE(vbuf);
    float *vels[2] = {vbuf, vbuf + nvel};
    rc.velocities = vels;
    core_traj mine[2];
    REQUIRE_OK(rollout_generate(&rc, &p.experts, NULL, 2, cond, uids, pidx, mine));
    for (int j = 0; j < 2; j++) {
        const int64_t nb = sizeof(float) * (int64_t)(rc.n_steps + 1) * core_traj_latent_numel(&mine[j]);
        CHECK(memcmp(res[j].traj.latents, mine[j].latents, (size_t)nb) == 0);
        CHECK(memcmp(res[j].traj.log_probs, mine[j].log_probs, sizeof(float) * (size_t)rc.n_steps) == 0);
        CHECK(res[j].traj.policy_version == 1 && res[j].traj.n_rewards == 2);
        REQUIRE(res[j].velocity != NULL);
        CHECK(memcmp(res[j].velocity, vels[j], sizeof(float) * (size_t)nvel) == 0);
        CHECK(!strcmp(res[j].traj.reward_names[0], "color_match") && !strcmp(res[j].traj.reward_names[1], "brightness"));
        CHECK_NEAR(res[j].traj.reward_total, res[j].traj.rewards[0] + 0.5 * res[j].traj.rewards[1], 1e-6);
        core_rollout_result_free(&res[j]);
        core_traj_free(&mine[j]);
    }
    free(vbuf);
    core_wire_msg_free(&m);
    core_zmq_msg_close(&zm);

    send_rollout(&c, 0, "r0", 0);
    CHECK(strstr(expect_error(&c, "version_mismatch"), "holds 1") != NULL);

    /* A corrupted tensor, then a wrong whole-model hash: refused, version 1 kept. */
    send_weights(&c, pm, 2, 3, 0);
    const char *why = expect_error(&c, "weights_mismatch");
    CHECK(strstr(why, pm->layout.tensors[3].name) && strstr(why, "xxh64"));
    send_weights(&c, pm, 2, -1, 1);
    why = expect_error(&c, "weights_mismatch");
    CHECK(strstr(why, "hashes to") && strstr(why, "version 1 kept"));
    send_rollout(&c, 2, "r2", 0);
    CHECK(strstr(expect_error(&c, "version_mismatch"), "holds 1") != NULL);
    /* An unknown tensor. */
    json_t *f = json_pack("{s:I, s:i}", "policy_version", (json_int_t)3, "tensors_count", 1);
    REQUIRE_OK(core_zmq_send_fields(c.router, c.rid, c.rid_len, CORE_WIRE_WEIGHTS_BEGIN, "wb", f));
    json_decref(f);
    float one = 1.0f;
    core_wire_tensor wt = {.name = "value", .dtype = CORE_F32, .ndim = 1, .shape = {1}, .data = &one, .nbytes = 4};
    char hx[17];
    core_hash_hex(core_xxh64(&one, 4, 0), hx);
    f = json_pack("{s:s, s:s}", "name", "transformer/no.such.weight", "xxh64", hx);
    core_wire_built b;
    REQUIRE_OK(core_wire_build(CORE_WIRE_WEIGHTS_TENSOR, "wt", f, &wt, 1, &b));
    REQUIRE_OK(core_zmq_send(c.router, c.rid, c.rid_len, &b));
    core_wire_built_free(&b);
    json_decref(f);
    f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)3, "model_xxh64", hx);
    REQUIRE_OK(core_zmq_send_fields(c.router, c.rid, c.rid_len, CORE_WIRE_WEIGHTS_END, "we", f));
    json_decref(f);
    CHECK(strstr(expect_error(&c, "weights_mismatch"), "no.such.weight") != NULL);

    REQUIRE_OK(core_zmq_send_fields(c.router, c.rid, c.rid_len, CORE_WIRE_SHUTDOWN, "bye", NULL));
    REQUIRE_OK(ctl_recv(&c, &zm, &m));
    CHECK(m.type == CORE_WIRE_SHUTDOWN);
    core_wire_msg_free(&m);
    core_zmq_msg_close(&zm);
    int st;
    REQUIRE(waitpid(wk, &st, 0) == wk);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    kill(rs, SIGTERM);
    waitpid(rs, NULL, 0);
    rollout_pipeline_free(&p);
    core_recipe_release(&r);
    zmq_close(c.router);
    zmq_ctx_term(c.ctx);
    char p2[128];
    snprintf(p2, sizeof p2, "%s/ctl", sock);
    unlink(p2);
    snprintf(p2, sizeof p2, "%s/rew", sock);
    unlink(p2);
    rmdir(sock);
}
