/* tests/test_finite.c — non-finite weights are refused where they enter and before they are written, each
 * with the file or message, the tensor, the element and the value:
 *   reading: st_read_f32 (every weight the program loads: transformer, adapter, VAE, text encoder) refuses a NaN or
 *     inf of F32, BF16 and F16 tensors; `vgrpo generate` and `vgrpo eval` of a transformer holding a NaN fail naming
 *     the file; `vgrpo export --merge` of an adapter holding a NaN fails, and one whose finite values overflow in
 *     the merge writes nothing;
 *   the weight sync: a weights_tensor whose bytes match their xxh64 but hold a NaN is refused at weights_end
 *     (weights_mismatch) and the worker keeps its weights and version;
 *   writing: a checkpoint with a NaN weight, EMA or inf Adam moment is refused before anything is written (the
 *     earlier checkpoint stays and verifies); a run whose AdamW update makes the weights non-finite (resumed from a
 *     checkpoint whose finite Adam moment overflows the update) stops at that step naming the tensor and the update,
 *     and writes no checkpoint of them;
 *   decoding: non-finite latents are refused by both decoders instead of becoming black frames, and so are the Wan
 *     VAE's non-finite pixels from finite latents. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "core/wire.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "model/vae/latent_rgb.h"
#include "model/vae/wan_vae.h"
#include "rollout/worker_msg.h"
#include "tests/ckpt_edit.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* ---- reading ---- */

TEST(finite_st_read_refuses_nonfinite) {
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", test_tmpdir());
    float w[8] = {0, 1, 2, 3, 4, NAN, 6, 7}, ok[2] = {1.5f, -2};
    uint16_t h[4] = {0x3f80, 0x3f80, 0x7f80, 0}, g[4] = {0x3c00, 0, 0, 0xfc00}; /* bf16 +inf at 2, f16 -inf at 3 */
    const int64_t s8[1] = {8}, s4[1] = {4}, s2[1] = {2};
    st_writer *wr = st_writer_new();
    REQUIRE(wr);
    REQUIRE_OK(st_writer_add(wr, "w", CORE_F32, 1, s8, w));
    REQUIRE_OK(st_writer_add(wr, "h", CORE_BF16, 1, s4, h));
    REQUIRE_OK(st_writer_add(wr, "g", CORE_F16, 1, s4, g));
    REQUIRE_OK(st_writer_add(wr, "ok", CORE_F32, 1, s2, ok));
    REQUIRE_OK(st_writer_write(wr, path));
    st_writer_free(wr);
    st_file *f = st_open(path);
    REQUIRE(f);
    float dst[8];
    char want[512];
    struct {
        const char *name, *what;
        int n;
    } bad[3] = {{"w", "nan at element 5 of 8", 8}, {"h", "inf at element 2 of 4", 4},
                {"g", "-inf at element 3 of 4", 4}};
    for (int i = 0; i < 3; i++) {
        CHECK(st_read_f32(f, bad[i].name, dst, bad[i].n) == -1);
        snprintf(want, sizeof want, "%s: tensor \"%s\" holds a non-finite value (%s): refused", path, bad[i].name,
                 bad[i].what);
        CHECK_MSG(!strcmp(core_last_error(), want), "got: %s", core_last_error());
    }
    REQUIRE_OK(st_read_f32(f, "ok", dst, 2));
    CHECK(dst[0] == 1.5f && dst[1] == -2.0f);
    st_close(f);
}

/* The first tensor name of the safetensors file at path, into out. */
static void first_tensor(const char *path, char *out, size_t cap) {
    st_file *f = st_open(path);
    REQUIRE(f);
    snprintf(out, cap, "%s", st_name(f, 0));
    st_close(f);
}

/* generate and eval of a transformer with a NaN weight: refused, naming the file, tensor and element (they exited 0,
 * their frames black and scored). */
TEST(finite_generate_eval_refuse_nonfinite_transformer) {
    const char *dir = test_tmpdir();
    char out[8192], p[700], name[256], want[512];
    REQUIRE(test_run(out, sizeof out,
                     "%s init-model --preset tiny --out %s/model --seed 0 && printf 'a black cat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
    snprintf(p, sizeof p, "%s/model/transformer/diffusion_pytorch_model.safetensors", dir);
    first_tensor(p, name, sizeof name);
    const float nan_f = NAN;
    poke(p, name, 4 * 3, &nan_f, sizeof nan_f, 0);
    snprintf(want, sizeof want, "%s: tensor \"%s\" holds a non-finite value (nan at element 3 of", p, name);
    int rc = test_run(out, sizeof out,
                      "%s generate --pipeline %s/model --prompt 'a black cat' --out %s/g.mp4 --steps 2",
                      test_vgrpo_bin(), dir, dir);
    CHECK_MSG(rc != 0 && strstr(out, want), "generate: exit %d: %s", rc, out);
    snprintf(p, sizeof p, "%s/g.mp4", dir);
    CHECK(!exists(p));
    rc = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml --set model.path=%s/model --set data.prompt_file=%s/"
                  "prompts.txt --set data.eval_prompt_file=%s/prompts.txt --set rollout.num_steps=2 --set "
                  "logging.run_dir=%s/run --out %s/ev", test_vgrpo_bin(), dir, dir, dir, dir, dir);
    CHECK_MSG(rc != 0 && strstr(out, want), "eval: exit %d: %s", rc, out);
}

/* An adapter of the tiny transformer (rank 2, every block linear) with A and B filled with v, saved at path. */
static void save_adapter(const char *path, float v) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    const wan_lora_config lc = {.rank = 2, .alpha = 2, .targets = WAN_LORA_ALL_BLOCK, .init_seed = 1};
    wan_lora l;
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    for (int64_t i = 0; i < l.layout.numel; i++) l.params[i] = v;
    REQUIRE_OK(wan_lora_save_diffusers(&l, path));
    wan_lora_free(&l);
}

/* export --merge: an adapter with a NaN is refused naming its file, key and element (it exited 0 and wrote 16,384
 * NaNs); a finite adapter whose merge overflows (B A of 1e30s) writes nothing (it wrote inf). */
TEST(finite_export_merge_refuses_nonfinite) {
    const char *dir = test_tmpdir();
    char out[8192], ad[700], key[256], want[700], o[700];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    snprintf(ad, sizeof ad, "%s/nan_lora.safetensors", dir);
    save_adapter(ad, 0.01f);
    first_tensor(ad, key, sizeof key);
    const float nan_f = NAN;
    poke(ad, key, 4 * 7, &nan_f, sizeof nan_f, 0);
    snprintf(o, sizeof o, "%s/merged", dir);
    int rc = test_run(out, sizeof out, "%s export --checkpoint %s/model --adapter %s --merge --out %s",
                      test_vgrpo_bin(), dir, ad, o);
    snprintf(want, sizeof want, "%s: tensor \"%s\" holds a non-finite value (nan at element 7 of", ad, key);
    CHECK_MSG(rc == 1 && strstr(out, want), "exit %d: %s", rc, out);
    snprintf(want, sizeof want, "%s/transformer", o);
    CHECK(!exists(want));
    snprintf(ad, sizeof ad, "%s/big_lora.safetensors", dir);
    save_adapter(ad, 1e30f);
    rc = test_run(out, sizeof out, "%s export --checkpoint %s/model --adapter %s --merge --out %s",
                  test_vgrpo_bin(), dir, ad, o);
    snprintf(want, sizeof want, "not saved: %s/transformer: tensor \"", o);
    CHECK_MSG(rc == 1 && strstr(out, want) && strstr(out, "holds a non-finite value (inf at element"),
              "exit %d: %s", rc, out);
    snprintf(want, sizeof want, "%s/transformer/diffusion_pytorch_model.safetensors", o);
    CHECK(!exists(want));
}

/* ---- the weight sync a rollout worker receives ---- */

typedef struct {
    int acks, errors;
    char code[64], reason[1024];
} sink;

static int io_error(void *ctx, const char *id, const char *code, const char *reason) {
    sink *k = ctx;
    k->errors++;
    snprintf(k->code, sizeof k->code, "%s", code);
    snprintf(k->reason, sizeof k->reason, "%s", reason);
    return 0;
}

static int io_fields(void *ctx, core_wire_type type, const char *id, const json_t *fields) {
    sink *k = ctx;
    if (type == CORE_WIRE_WEIGHTS_ACK) k->acks++;
    return 0;
}

static void handle(rollout_worker_state *st, const rollout_worker_io *io, core_wire_type type, const char *id,
                   json_t *fields, const core_wire_tensor *t) {
    core_wire_built b;
    REQUIRE_OK(core_wire_build(type, id, fields, t, t ? 1 : 0, &b));
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(b.frames, b.n_frames, NULL, &m));
    CHECK(rollout_worker_handle(st, &m, io) == 0);
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    json_decref(fields);
}

/* A full update whose tensor 2 holds a NaN at element 3, with every hash right (the controller's own): the worker
 * answered weights_ack and ran on the NaN weights; now weights_mismatch naming the tensor, its old weights kept. */
TEST(finite_worker_sync_refuses_nonfinite) {
    const wan_config c = {.patch_size = {1, 2, 2}, .num_attention_heads = 1, .attention_head_dim = 8, .in_channels = 4,
                          .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 16, .num_layers = 1,
                          .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};
    wan_model m, upd;
    REQUIRE_OK(wan_model_init(&m, &c));
    REQUIRE_OK(wan_model_init(&upd, &c));
    wan_params_init_random(&m, 11);
    wan_params_init_random(&upd, 12);
    const wan_tensor *bad = &upd.layout.tensors[2];
    upd.params[bad->offset + 3] = NAN;
    const size_t nb = sizeof(float) * (size_t)m.layout.numel;
    float *before = malloc(nb);
    REQUIRE(before);
    memcpy(before, m.params, nb);
    const core_log_level lvl = core_log_get_level();
    core_log_set_level(CORE_LOG_OFF);
    rollout_worker_state st = {.model = {&m, NULL}, .n_experts = 1, .id = "w", .version = 0};
    sink k = {0};
    const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields};
    handle(&st, &io, CORE_WIRE_WEIGHTS_BEGIN, "wb",
           json_pack("{s:I, s:i}", "policy_version", (json_int_t)1, "tensors_count", upd.layout.count), NULL);
    for (int i = 0; i < upd.layout.count; i++) {
        const wan_tensor *t = &upd.layout.tensors[i];
        char name[128], hx[17];
        snprintf(name, sizeof name, "transformer/%s", t->name);
        core_hash_hex(wan_tensor_hash(&upd, i), hx);
        core_wire_tensor wt = {.name = "value", .dtype = CORE_F32, .ndim = t->ndim, .data = upd.params + t->offset,
                               .nbytes = sizeof(float) * (size_t)t->numel};
        memcpy(wt.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        handle(&st, &io, CORE_WIRE_WEIGHTS_TENSOR, "wt", json_pack("{s:s, s:s}", "name", name, "xxh64", hx), &wt);
    }
    const wan_model *ms[1] = {&upd};
    uint64_t h;
    REQUIRE_OK(wan_models_hash(ms, 1, &h));
    char hx[17], want[512];
    core_hash_hex(h, hx);
    handle(&st, &io, CORE_WIRE_WEIGHTS_END, "we",
           json_pack("{s:I, s:s}", "policy_version", (json_int_t)1, "model_xxh64", hx), NULL);
    snprintf(want, sizeof want,
             "weights_tensor: tensor \"transformer/%s\" holds a non-finite value (nan at element 3 of %lld): refused",
             bad->name, (long long)bad->numel);
    CHECK_MSG(k.acks == 0 && k.errors == 1 && !strcmp(k.code, "weights_mismatch") && strstr(k.reason, want),
              "acks %d errors %d: %s: %s", k.acks, k.errors, k.code, k.reason);
    CHECK(st.version == 0 && !memcmp(m.params, before, nb));
    core_log_set_level(lvl);
    rollout_worker_state_free(&st);
    free(before);
    wan_model_free(&m), wan_model_free(&upd);
}

/* ---- writing ---- */

/* A checkpoint of a NaN weight, a NaN EMA, an inf Adam moment: refused before anything is written, naming the
 * tensor as the files would; checkpoint-1 stays complete and verifies. wan_model_save (export, checkpoints) refuses
 * a NaN weight before creating its folder. (All were written, and a resume then refused them.) */
TEST(finite_checkpoint_save_refuses_nonfinite) {
    const char *dir = test_tmpdir();
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m, ema;
    optim_adamw o;
    REQUIRE_OK(wan_model_init(&m, &c));
    REQUIRE_OK(wan_model_init(&ema, &c));
    wan_params_init_random(&m, 5);
    wan_params_init_random(&ema, 5);
    REQUIRE_OK(optim_adamw_init(&o, m.layout.numel));
    trainer_ckpt_expert ex = {"transformer", &m, &o, &ema, NULL};
    const char *cfg = "{a: 1}";
    char ck[TRAINER_CKPT_PATH_MAX], p[TRAINER_CKPT_PATH_MAX + 64], want[512];
    REQUIRE_OK(
        trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 1, .config = (char *)cfg}, &ex, 1, 0, ck, sizeof ck));
    const wan_tensor *t = &m.layout.tensors[3];
    struct {
        float *x;
        float v;
        const char *prefix, *what;
    } cases[3] = {{m.params, NAN, "transformer/", "nan"}, {ema.params, NAN, "ema/transformer/", "nan"},
                  {o.v, INFINITY, "transformer/exp_avg_sq/", "inf"}};
    for (int i = 0; i < 3; i++) {
        const float keep = cases[i].x[t->offset + 17];
        cases[i].x[t->offset + 17] = cases[i].v;
        const trainer_ckpt_state st2 = {.step = 2, .config = (char *)cfg};
        CHECK(trainer_ckpt_save(dir, &st2, &ex, 1, 0, NULL, 0) == -1);
        snprintf(want, sizeof want, "nothing written: %s/checkpoint-2: tensor \"%s%s\" holds a non-finite value (%s at "
                                    "element 17 of %lld): refused", dir, cases[i].prefix, t->name, cases[i].what,
                 (long long)t->numel);
        CHECK_MSG(!strcmp(core_last_error(), want), "case %d: got: %s", i, core_last_error());
        snprintf(p, sizeof p, "%s/checkpoint-2", dir);
        CHECK(!exists(p));
        snprintf(p, sizeof p, "%s/.checkpoint-2.tmp", dir);
        CHECK(!exists(p));
        REQUIRE_OK(trainer_ckpt_verify(ck, NULL));
        cases[i].x[t->offset + 17] = keep;
    }
    m.params[t->offset] = -INFINITY;
    snprintf(p, sizeof p, "%s/export", dir);
    CHECK(wan_model_save(&m, p) == -1 && !exists(p));
    snprintf(want, sizeof want, "not saved: %s: tensor \"%s\" holds a non-finite value (-inf at element 0 of", p,
             t->name);
    CHECK_MSG(strstr(core_last_error(), want), "got: %s", core_last_error());
    wan_model_free(&m), wan_model_free(&ema);
    optim_adamw_free(&o);
}

/* `vgrpo run` on the tiny preset into dir/a (3 prompts, B 2, G 4, 4 denoising steps, constant lr, one update per
 * step, a checkpoint every step) with extra options. */
static const char *run_env = ""; /* e.g. VGRPO_EMULATE_DEVICE=1 for the device variant */
static int run(const char *dir, const char *extra, char *out, size_t cap) {
    return test_run(out, cap,
                    "OMP_NUM_THREADS=2 %s %s run recipes/tiny-cpu.yaml --set model.path=%s/model --set "
                    "data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt --set "
                    "logging.run_dir=%s/a --set model.text_encoder=word_embed --set model.decoder=latent_rgb --set "
                    "rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 --set "
                    "data.eval_samples_per_prompt=1 --set logging.eval_every=0 --set optim.total_steps=2 --set "
                    "algorithm.optimizer_steps_per_rollout=1 --set checkpoint.every=1 %s 2>&1",
                    run_env, test_vgrpo_bin(), dir, dir, dir, dir, extra);
}

/* A run resumed from a checkpoint whose Adam first moment holds a finite 3e38 (it verifies): the next AdamW update
 * divides it by a small second moment and the weight becomes -inf. The run stops at that step naming it, the update
 * and the tensor; checkpoint-1 is kept and no checkpoint of the weights is written (checkpoint-2 was written, and
 * its resume refused). */
static void run_stops_when_the_update_goes_nonfinite(const char *dev) {
    const char *dir = test_tmpdir();
    char out[16384], p[700], name[256], x[700];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
    char first[300];
    snprintf(first, sizeof first, "--steps 1 %s", dev);
    int rc = run(dir, first, out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    char ck[700];
    snprintf(ck, sizeof ck, "%s/a/checkpoint-1", dir);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", ck);
    first_tensor(p, name, sizeof name); /* "transformer/exp_avg/<first parameter>" */
    REQUIRE(!strncmp(name, "transformer/exp_avg/", 20));
    const float big = 3e38f;
    poke(p, name, 0, &big, sizeof big, 0);
    reseal(ck);
    REQUIRE_OK(trainer_ckpt_verify(ck, NULL));
    snprintf(x, sizeof x, "--resume %s/a %s", dir, dev);
    rc = run(dir, x, out, sizeof out);
    char want[512];
    snprintf(want, sizeof want,
             "made the weights of transformer non-finite (the run stops here: they are neither synced nor "
             "checkpointed, the last checkpoint is kept): tensor \"%s\" holds a non-finite value (-inf at element 0 of",
             name + 20);
    CHECK_MSG(rc != 0 && strstr(out, "step 1: the AdamW update 1 of 1 (optimizer step 2") && strstr(out, want),
              "exit %d: %s", rc, out);
    snprintf(p, sizeof p, "%s/a/checkpoint-2", dir);
    CHECK(!exists(p));
    REQUIRE_OK(trainer_ckpt_verify(ck, NULL));
}

TEST(finite_run_stops_when_the_update_goes_nonfinite) {
    run_env = "";
    run_stops_when_the_update_goes_nonfinite("");
}

/* The same on the (emulated) device in local mode without EMA, where the master weights stay on the device between
 * steps (trainer_dev lazy_host): the device's sum of squares of the master finds the non-finite update and brings the
 * master to the host, where the same check names the tensor (it had checked the stale host copy). */
TEST(finite_run_stops_when_the_update_goes_nonfinite_device) {
    run_env = "VGRPO_EMULATE_DEVICE=1";
    run_stops_when_the_update_goes_nonfinite("--set model.device=cuda");
    run_env = "";
}

/* ---- decoding ---- */

/* A NaN or inf latent is refused by the latent-to-RGB map, naming the element (it became a black pixel: the
 * float-to-u8 conversion of NaN is undefined in C). */
TEST(finite_latent_rgb_refuses_nonfinite_latents) {
    wan_latent_rgb m;
    REQUIRE_OK(wan_latent_rgb_default(&m, 16));
    float z[16 * 2] = {0};
    uint8_t v[2 * 8 * 8 * 3];
    REQUIRE_OK(wan_latent_rgb_decode(&m, z, 1, 1, 2, v));
    CHECK(v[0] == 128);
    z[5 * 2 + 1] = NAN; /* channel 5, pixel 1 */
    CHECK(wan_latent_rgb_decode(&m, z, 1, 1, 2, v) == -1);
    CHECK_MSG(strstr(core_last_error(), "latent element 11 (channel 5, frame 0) is nan"), "got: %s", core_last_error());
    z[5 * 2 + 1] = -INFINITY;
    CHECK(wan_latent_rgb_decode(&m, z, 1, 1, 2, v) == -1 && strstr(core_last_error(), "is -inf"));
}

/* The Wan VAE's path to pixels: a NaN latent is refused naming the sample and element; finite latents that the
 * decoder overflows (1e38) are refused naming the frame, pixel and channel, not clamped into frames. */
TEST(finite_vae_to_u8_refuses_nonfinite) {
    vae_model *m = vae_load("tests/fixtures/vae_wan21");
    REQUIRE(m);
    const int z = vae_get_config(m)->z_dim, T = 1, h = 2, w = 2, s = vae_spatial_factor(m);
    const size_t nl = (size_t)z * T * h * w;
    float *lat = calloc(nl, sizeof(float));
    uint8_t *u8 = malloc((size_t)vae_frames_out(m, T) * h * s * w * s * 3);
    REQUIRE(lat && u8);
    REQUIRE_OK(vae_latents_to_u8(m, lat, 1, z, T, h, w, u8));
    lat[5] = NAN;
    CHECK(vae_latents_to_u8(m, lat, 1, z, T, h, w, u8) == -1);
    CHECK_MSG(strstr(core_last_error(), "vae: sample 0: latent element 5 is nan"), "got: %s", core_last_error());
    for (size_t i = 0; i < nl; i++) lat[i] = 1e38f;
    CHECK(vae_latents_to_u8(m, lat, 1, z, T, h, w, u8) == -1);
    CHECK_MSG(strstr(core_last_error(), "vae: sample 0: frame 0, pixel (") &&
                  strstr(core_last_error(), "from finite latents: check the VAE's weights"),
              "got: %s", core_last_error());
    free(lat), free(u8);
    vae_free(m);
}
