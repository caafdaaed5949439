/* tests/test_checkpoint.c — checkpoints (trainer/checkpoint/checkpoint.h) and `vgrpo run --resume` (trainer/run/run_files.c).
 * Library level: save/load round trip of weights, Adam m/v and step, bit for bit; list/prune/resolve; the config
 * diff; refusals naming the file, tensor or key. End to end on the tiny preset (word embeddings + latent-to-RGB, 3
 * prompts, B = 2 so the prompt order wraps an epoch before the checkpoint, G = 4, beta > 0, 2 optimizer steps per
 * rollout, linear lr with warm-up): 2 steps + resume + 2 steps equals 4 straight steps bit for bit (checkpoint
 * files byte-identical, metrics.jsonl rows equal without time/ fields); the rolling limit; a leftover .tmp folder
 * ignored and removed; a missing, truncated or misnamed file and a changed recipe refused; SIGTERM saves and stops.
 * Integrity: one flipped byte in the weights' or the Adam moments' data, or one changed digit of
 * trainer_state.json, is refused naming the file and the tensor; a NaN or inf in a weight or a moment (with a valid
 * checksum) is refused naming the tensor; `--resume RUN` skips a checkpoint with a missing file and one with a
 * damaged file, naming each and why, and resumes from the one before (then repeats the straight run byte for
 * byte), while `--resume RUN/checkpoint-N` of a damaged one is an error naming the file; a removal cut short (the
 * rolling limit killed mid-delete) never leaves a partial checkpoint-N, and its leftovers are removed by the next
 * save. */
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/safetensors.h"
#include "tests/ckpt_edit.h"
#include "tests/metrics_rows.h"
#include "tests/ckpt_cmp.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_sums.h"

/* ---- library level ---- */

static void tiny_expert(wan_model *m, optim_adamw *o, uint64_t seed) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(m, &c));
    wan_params_init_random(m, seed);
    REQUIRE_OK(optim_adamw_init(o, m->layout.numel));
    test_fill_uniform(o->m, (size_t)o->n, seed + 1, -1e-3f, 1e-3f);
    test_fill_uniform(o->v, (size_t)o->n, seed + 2, 0, 1e-6f);
    o->step = 7;
}

static int exists(const char *fmt, const char *a, const char *b) {
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, fmt, a, b);
    return stat(p, &sb) == 0;
}

TEST(checkpoint_save_load_roundtrip) {
    const char *dir = test_tmpdir();
    wan_model m, m2;
    optim_adamw o, o2;
    tiny_expert(&m, &o, 3);
    tiny_expert(&m2, &o2, 11); /* other values everywhere: the load must overwrite them all */
    o2.step = 0;
    const char *cfg = "{optim: {lr: 0.001}, rollout: {eta: 1.0}}";
    trainer_ckpt_state st = {.step = 5, .policy_version = 7, .rollout_round = 5, .data_epoch = 2, .data_position = 4,
                             .data_size = 9, .seed = 42, .config = (char *)cfg};
    trainer_ckpt_expert ex = {"transformer", &m, &o, NULL, NULL}, ex2 = {"transformer", &m2, &o2, NULL, NULL};
    char path[TRAINER_CKPT_PATH_MAX];
    REQUIRE_OK(trainer_ckpt_save(dir, &st, &ex, 1, 0, path, sizeof path));
    CHECK(strstr(path, "/checkpoint-5") != NULL);
    CHECK(!exists("%s/.checkpoint-5.tmp%s", dir, ""));
    trainer_ckpt_state got;
    REQUIRE_OK(trainer_ckpt_load(path, cfg, &ex2, 1, &got));
    CHECK(got.step == 5 && got.policy_version == 7 && got.rollout_round == 5 && got.data_epoch == 2 &&
          got.data_position == 4 && got.data_size == 9 && got.seed == 42 && got.n_experts == 1);
    CHECK(!strcmp(got.experts[0], "transformer") && !strcmp(got.config, cfg));
    CHECK(o2.step == 7);
    CHECK(!memcmp(m.params, m2.params, sizeof(float) * (size_t)m.layout.numel));
    CHECK(!memcmp(o.m, o2.m, sizeof(float) * (size_t)o.n));
    CHECK(!memcmp(o.v, o2.v, sizeof(float) * (size_t)o.n));
    trainer_ckpt_state_free(&got);
    /* the transformer folder is a plain diffusers folder our loader reads */
    char dirs[TRAINER_CKPT_MAX_EXPERTS][TRAINER_CKPT_PATH_MAX];
    REQUIRE(trainer_ckpt_transformer_dirs(dir, dirs) == 1);
    CHECK(strstr(dirs[0], "checkpoint-5/transformer") != NULL);
    wan_model m3;
    REQUIRE_OK(wan_model_load(&m3, dirs[0]));
    CHECK(!memcmp(m.params, m3.params, sizeof(float) * (size_t)m.layout.numel));
    wan_model_free(&m3);
    /* a changed config: refused, naming the key and both values, and both hashes */
    CHECK(trainer_ckpt_load(path, "{optim: {lr: 0.002}, rollout: {eta: 1.0}}", &ex2, 1, &got) == -1);
    CHECK_MSG(strstr(core_last_error(), "optim.lr (checkpoint 0.001, now 0.002)") &&
                  strstr(core_last_error(), "config hash"),
              "got: %s", core_last_error());
    /* a two-expert run cannot load a one-expert checkpoint */
    wan_model mb, mb2;
    optim_adamw ob, ob2;
    tiny_expert(&mb, &ob, 21);
    tiny_expert(&mb2, &ob2, 31);
    ob.step = 9;
    trainer_ckpt_expert two[2] = {ex2, {"transformer_2", &mb2, &ob2, NULL, NULL}};
    CHECK(trainer_ckpt_load(path, cfg, two, 2, &got) == -1);
    CHECK_MSG(strstr(core_last_error(), "expert"), "got: %s", core_last_error());
    /* two experts round trip (each its own weights, moments and step), and transformer_dirs names both */
    REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 6, .config = (char *)cfg},
                                 (trainer_ckpt_expert[]){{"transformer", &m, &o, NULL, NULL}, {"transformer_2", &mb, &ob, NULL, NULL}}, 2, 0,
                                 NULL, 0));
    REQUIRE_OK(trainer_ckpt_load(path, NULL, &ex2, 1, &got)); /* checkpoint-5 still there */
    trainer_ckpt_state_free(&got);
    snprintf(path, sizeof path, "%s/checkpoint-6", dir);
    REQUIRE_OK(trainer_ckpt_load(path, cfg, two, 2, &got));
    CHECK(got.n_experts == 2 && !strcmp(got.experts[1], "transformer_2"));
    CHECK(!memcmp(mb.params, mb2.params, sizeof(float) * (size_t)mb.layout.numel));
    CHECK(!memcmp(ob.m, ob2.m, sizeof(float) * (size_t)ob.n) && !memcmp(ob.v, ob2.v, sizeof(float) * (size_t)ob.n));
    CHECK(ob2.step == 9 && o2.step == 7);
    CHECK(memcmp(m.params, mb.params, sizeof(float) * (size_t)m.layout.numel)); /* the experts do differ */
    trainer_ckpt_state_free(&got);
    REQUIRE(trainer_ckpt_transformer_dirs(dir, dirs) == 2); /* latest: checkpoint-6 */
    CHECK(strstr(dirs[1], "checkpoint-6/transformer_2") != NULL);
    wan_model_free(&m), wan_model_free(&m2), wan_model_free(&mb), wan_model_free(&mb2);
    optim_adamw_free(&o), optim_adamw_free(&o2), optim_adamw_free(&ob), optim_adamw_free(&ob2);
}

TEST(checkpoint_list_prune_resolve_and_refusals) {
    const char *dir = test_tmpdir();
    wan_model m;
    optim_adamw o;
    tiny_expert(&m, &o, 5);
    trainer_ckpt_expert ex = {"transformer", &m, &o, NULL, NULL};
    const char *cfg = "{a: 1}";
    for (int s = 1; s <= 4; s++)
        REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = s, .config = (char *)cfg}, &ex, 1, 3, NULL, 0));
    int64_t *steps;
    REQUIRE(trainer_ckpt_list(dir, &steps) == 3); /* rolling limit 3: the oldest (1) removed */
    CHECK(steps[0] == 2 && steps[1] == 3 && steps[2] == 4);
    free(steps);
    /* a leftover temporary folder (crash mid-save) and other names are not checkpoints; the next save removes it */
    char cmd[2048], out[4096], ck[TRAINER_CKPT_PATH_MAX];
    REQUIRE(test_run(out, sizeof out, "mkdir -p %s/.checkpoint-9.tmp/transformer %s/checkpoint-x %s/checkpoint-7b && "
                                      "echo junk > %s/.checkpoint-9.tmp/trainer_state.json", dir, dir, dir, dir) == 0);
    REQUIRE_OK(trainer_ckpt_resolve(dir, ck, sizeof ck));
    snprintf(cmd, sizeof cmd, "%s/checkpoint-4", dir);
    CHECK_MSG(!strcmp(ck, cmd), "resolved %s", ck);
    REQUIRE(trainer_ckpt_list(dir, &steps) == 3);
    free(steps);
    REQUIRE(trainer_ckpt_prune(dir, 2, -1) == 1);
    CHECK(!exists("%s/.checkpoint-9.tmp%s", dir, "") && !exists("%s/checkpoint-2%s", dir, ""));
    CHECK(exists("%s/checkpoint-3%s", dir, "") && exists("%s/checkpoint-4%s", dir, ""));
    /* resolve: a checkpoint folder is itself (trailing slash too); an empty folder has none */
    snprintf(cmd, sizeof cmd, "%s/checkpoint-3/", dir);
    REQUIRE_OK(trainer_ckpt_resolve(cmd, ck, sizeof ck));
    CHECK(strstr(ck, "checkpoint-3") && ck[strlen(ck) - 1] == '3');
    snprintf(cmd, sizeof cmd, "%s/checkpoint-x", dir);
    CHECK(trainer_ckpt_resolve(cmd, ck, sizeof ck) == -1 && strstr(core_last_error(), "no complete checkpoint"));
    /* refusals, each naming the file / tensor */
    trainer_ckpt_state got;
    snprintf(ck, sizeof ck, "%s/checkpoint-4", dir);
    REQUIRE(test_run(out, sizeof out, "cp -r %s %s/c5 && cp -r %s %s/c6 && cp -r %s %s/checkpoint-8", ck, dir, ck, dir,
                     ck, dir) == 0);
    snprintf(ck, sizeof ck, "%s/checkpoint-8", dir);
    CHECK(trainer_ckpt_load(ck, cfg, &ex, 1, &got) == TRAINER_CKPT_DAMAGED);
    CHECK_MSG(strstr(core_last_error(), "step 4 but the folder is named checkpoint-8"), "got: %s", core_last_error());
    struct {
        const char *cmd, *expect;
    } cases[] = {
        {"rm %s/optimizer.safetensors", "missing file optimizer.safetensors"},
        {"rm %s/trainer_state.json", "missing file trainer_state.json"},
        {"rm %s/transformer/config.json", "missing file transformer/config.json"},
        {"rm %s/transformer/diffusion_pytorch_model.safetensors", "transformer/diffusion_pytorch_model.safetensors"},
        {"truncate -s 100000 %s/transformer/diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors"},
        {"truncate -s 100000 %s/optimizer.safetensors", "optimizer.safetensors"},
        {"truncate -s 200 %s/trainer_state.json", "trainer_state.json"},
        {"sed -i 's/\"step\": 4/\"step\": -4/' %s/trainer_state.json", "\"step\""},
        {"sed -i 's/\"config\": \"{a: 1}\"/\"config\": \"{a: 2}\"/' %s/trainer_state.json", "config_hash"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(ck, sizeof ck, "%s/bad%zu", dir, i);
        REQUIRE(test_run(out, sizeof out, "cp -r %s/checkpoint-4 %s", dir, ck) == 0);
        REQUIRE(test_run(out, sizeof out, cases[i].cmd, ck) == 0);
        CHECK(trainer_ckpt_load(ck, cfg, &ex, 1, &got) == TRAINER_CKPT_DAMAGED);
        CHECK_MSG(strstr(core_last_error(), cases[i].expect), "case %zu: got: %s", i, core_last_error());
    }
    /* optimizer.safetensors with a moment of the wrong shape, or an extra tensor: named */
    st_writer *w = st_writer_new(), *w6 = st_writer_new();
    REQUIRE(w && w6);
    float z[4] = {0};
    int64_t shp[1] = {4}, stp = 0;
    snprintf(ck, sizeof ck, "%s/c5/optimizer.safetensors", dir);
    st_file *f = st_open(ck);
    REQUIRE(f);
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        core_tensor v;
        REQUIRE_OK(st_get(f, t->name, &v)); /* borrows the mapping (aligned: our writer's file) */
        REQUIRE(!v.owned);
        if (t->dtype == CORE_I64) {
            REQUIRE_OK(st_writer_add(w, t->name, CORE_I64, 0, NULL, &stp));
            REQUIRE_OK(st_writer_add(w6, t->name, CORE_I64, 0, NULL, &stp));
            continue;
        }
        if (!strcmp(t->name, "transformer/exp_avg/blocks.0.attn1.norm_q.weight"))
            REQUIRE_OK(st_writer_add(w, t->name, CORE_F32, 1, shp, z));
        else
            REQUIRE_OK(st_writer_add(w, t->name, CORE_F32, t->ndim, t->shape, v.data));
        REQUIRE_OK(st_writer_add(w6, t->name, CORE_F32, t->ndim, t->shape, v.data));
    }
    snprintf(ck, sizeof ck, "%s/c5/optimizer2.safetensors", dir);
    REQUIRE_OK(st_writer_write(w, ck));
    snprintf(ck, sizeof ck, "%s/c6/optimizer.safetensors", dir);
    REQUIRE_OK(st_writer_add(w6, "transformer/exp_avg/extra", CORE_F32, 1, shp, z));
    REQUIRE_OK(st_writer_write(w6, ck));
    st_writer_free(w), st_writer_free(w6);
    st_close(f);
    REQUIRE(test_run(out, sizeof out, "mv %s/c5/optimizer2.safetensors %s/c5/optimizer.safetensors", dir, dir) == 0);
    /* as they are, their checksums name what changed; resealed (valid checksums), the layout check names it */
    snprintf(ck, sizeof ck, "%s/c5", dir);
    CHECK(trainer_ckpt_load(ck, cfg, &ex, 1, &got) == TRAINER_CKPT_DAMAGED);
    CHECK_MSG(strstr(core_last_error(), "optimizer.safetensors: damaged file") &&
                  strstr(core_last_error(), "tensor \"transformer/exp_avg/blocks.0.attn1.norm_q.weight\" differs"),
              "got: %s", core_last_error());
    reseal(ck);
    CHECK(trainer_ckpt_load(ck, cfg, &ex, 1, &got) == -1);
    CHECK_MSG(strstr(core_last_error(), "transformer/exp_avg/blocks.0.attn1.norm_q.weight\": expected F32 with the "
                                        "parameter's shape"), "got: %s", core_last_error());
    snprintf(ck, sizeof ck, "%s/c6", dir);
    CHECK(trainer_ckpt_load(ck, cfg, &ex, 1, &got) == TRAINER_CKPT_DAMAGED);
    CHECK_MSG(strstr(core_last_error(), "unexpected tensor \"transformer/exp_avg/extra\""), "got: %s", core_last_error());
    reseal(ck);
    CHECK(trainer_ckpt_load(ck, cfg, &ex, 1, &got) == -1);
    CHECK_MSG(strstr(core_last_error(), "unexpected tensor \"transformer/exp_avg/extra\" (not an optimizer state"),
              "got: %s", core_last_error());
    wan_model_free(&m);
    optim_adamw_free(&o);
}

/* Damage and non-finite values are refused, naming the file and the tensor. */
TEST(checkpoint_refuses_damage_and_non_finite) {
    const char *dir = test_tmpdir();
    wan_model m, m2;
    optim_adamw o, o2;
    tiny_expert(&m, &o, 5);
    tiny_expert(&m2, &o2, 6);
    trainer_ckpt_expert ex = {"transformer", &m, &o, NULL, NULL}, ex2 = {"transformer", &m2, &o2, NULL, NULL};
    const char *cfg = "{a: 1}";
    char ck[TRAINER_CKPT_PATH_MAX], out[4096], p[TRAINER_CKPT_PATH_MAX + 64], want[512];
    REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 1, .config = (char *)cfg}, &ex, 1, 0, ck, sizeof ck));
    REQUIRE_OK(trainer_ckpt_verify(ck, NULL));
    const wan_layout *L = &m.layout;
    const char *wname = L->tensors[3].name, *oname_t = L->tensors[2].name;
    char oname[256];
    snprintf(oname, sizeof oname, "transformer/exp_avg/%s", oname_t);
    float *before = malloc(sizeof(float) * (size_t)L->numel);
    REQUIRE(before);
    memcpy(before, m2.params, sizeof(float) * (size_t)L->numel);
    trainer_ckpt_state got;
    /* one flipped bit in the data of a weight, of an Adam moment; one changed digit of the state */
    struct {
        const char *file, *tensor;
    } flips[2] = {{"transformer/diffusion_pytorch_model.safetensors", wname}, {"optimizer.safetensors", oname}};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/flip%d", dir, i);
        REQUIRE(test_run(out, sizeof out, "cp -r %s %s", ck, p) == 0);
        char fp[TRAINER_CKPT_PATH_MAX + 128];
        snprintf(fp, sizeof fp, "%s/%s", p, flips[i].file);
        poke(fp, flips[i].tensor, 5, NULL, 0, 0x01);
        CHECK(trainer_ckpt_load(p, cfg, &ex2, 1, &got) == TRAINER_CKPT_DAMAGED);
        snprintf(want, sizeof want, "tensor \"%s\" differs", flips[i].tensor);
        CHECK_MSG(strstr(core_last_error(), fp) && strstr(core_last_error(), "damaged file") &&
                      strstr(core_last_error(), want),
                  "flip in %s: got: %s", flips[i].file, core_last_error());
        CHECK(trainer_ckpt_verify(p, NULL) == -1 && strstr(core_last_error(), want));
        CHECK(!memcmp(m2.params, before, sizeof(float) * (size_t)L->numel)); /* nothing was read into the run */
    }
    snprintf(p, sizeof p, "%s/state", dir);
    REQUIRE(test_run(out, sizeof out, "cp -r %s %s && sed -i 's/\"data_position\": 0/\"data_position\": 1/' "
                                      "%s/trainer_state.json", ck, p, p) == 0);
    CHECK(trainer_ckpt_load(p, cfg, &ex2, 1, &got) == TRAINER_CKPT_DAMAGED);
    CHECK_MSG(strstr(core_last_error(), "trainer_state.json: damaged file") && strstr(core_last_error(), "state_xxh64"),
              "got: %s", core_last_error());
    /* a NaN in a weight and an inf in an Adam moment written into the files with valid checksums (a save refuses
     * them: test_finite.c): refused on load, named */
    REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 2, .config = (char *)cfg}, &ex, 1, 0, ck, sizeof ck));
    const float nan_f = NAN, inf_f = INFINITY;
    snprintf(p, sizeof p, "%s/transformer/diffusion_pytorch_model.safetensors", ck);
    poke(p, wname, 4 * 17, &nan_f, sizeof nan_f, 0);
    reseal(ck);
    CHECK(trainer_ckpt_load(ck, cfg, &ex2, 1, &got) == TRAINER_CKPT_DAMAGED);
    snprintf(want, sizeof want, "transformer/diffusion_pytorch_model.safetensors: tensor \"%s\" holds a non-finite "
                                "value (nan at element 17 of", wname);
    CHECK_MSG(strstr(core_last_error(), want), "got: %s", core_last_error());
    REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 3, .config = (char *)cfg}, &ex, 1, 0, ck, sizeof ck));
    snprintf(p, sizeof p, "%s/optimizer.safetensors", ck);
    snprintf(oname, sizeof oname, "transformer/exp_avg_sq/%s", oname_t);
    poke(p, oname, 4 * 1, &inf_f, sizeof inf_f, 0);
    reseal(ck);
    CHECK(trainer_ckpt_load(ck, cfg, &ex2, 1, &got) == TRAINER_CKPT_DAMAGED);
    snprintf(want, sizeof want, "optimizer.safetensors: tensor \"transformer/exp_avg_sq/%s\" holds a non-finite value "
                                "(inf at element 1 of", oname_t);
    CHECK_MSG(strstr(core_last_error(), want), "got: %s", core_last_error());
    CHECK(!memcmp(m2.params, before, sizeof(float) * (size_t)L->numel));
    /* a NaN written into the file and the checksums fixed up: only the finite check can catch it */
    REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 4, .config = (char *)cfg}, &ex, 1, 0, ck, sizeof ck));
    REQUIRE_OK(trainer_ckpt_load(ck, cfg, &ex2, 1, &got));
    trainer_ckpt_state_free(&got);
    const float nan = NAN;
    snprintf(p, sizeof p, "%s/transformer/diffusion_pytorch_model.safetensors", ck);
    poke(p, wname, 4 * 9, &nan, sizeof nan, 0);
    CHECK(trainer_ckpt_verify(ck, NULL) == -1 && strstr(core_last_error(), "damaged file"));
    reseal(ck);
    CHECK(trainer_ckpt_load(ck, cfg, &ex2, 1, &got) == TRAINER_CKPT_DAMAGED);
    snprintf(want, sizeof want, "tensor \"%s\" holds a non-finite value (nan at element 9 of", wname);
    CHECK_MSG(strstr(core_last_error(), want) && !strstr(core_last_error(), "damaged"), "got: %s", core_last_error());
    free(before);
    wan_model_free(&m), wan_model_free(&m2);
    optim_adamw_free(&o), optim_adamw_free(&o2);
}

/* 1 when path exists. */
static int present(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Removing a checkpoint (the rolling limit) goes through a rename, so however it is cut short no folder
 * named checkpoint-N is ever partial; what is left is removed by the next save, and never read. */
TEST(checkpoint_removal_cut_short_leaves_no_partial_checkpoint) {
    const char *dir = test_tmpdir();
    wan_model m;
    optim_adamw o;
    tiny_expert(&m, &o, 5);
    trainer_ckpt_expert ex = {"transformer", &m, &o, NULL, NULL};
    const char *cfg = "{a: 1}";
    char out[4096], ck[TRAINER_CKPT_PATH_MAX];
    for (int s = 1; s <= 2; s++)
        REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = s, .config = (char *)cfg}, &ex, 1, 0, NULL, 0));
    /* many files in checkpoint-1, so that deleting it takes a while (they are not part of the checkpoint) */
    enum { JUNK = 20000 };
    REQUIRE(test_run(out, sizeof out, "mkdir %s/checkpoint-1/junk && cd %s/checkpoint-1/junk && seq 1 %d | xargs touch",
                     dir, dir, JUNK) == 0);
    /* the paths a watcher looks at: the checkpoint's own files and every 1000th junk file */
    char watch[32][700];
    int nw = 0;
    const char *own[] = {"trainer_state.json", "optimizer.safetensors", "transformer/config.json",
                         "transformer/diffusion_pytorch_model.safetensors"};
    for (int i = 0; i < 4; i++) snprintf(watch[nw++], sizeof watch[0], "%s/checkpoint-1/%s", dir, own[i]);
    for (int j = 1; j <= JUNK && nw < 32; j += 1000) snprintf(watch[nw++], sizeof watch[0], "%s/checkpoint-1/junk/%d", dir, j);
    char ck1[700];
    snprintf(ck1, sizeof ck1, "%s/checkpoint-1", dir);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(trainer_ckpt_prune(dir, 1, -1) == 1 ? 0 : 1); /* removes checkpoint-1 */
    /* Watch until checkpoint-1 is gone or seen partial, then kill the pruning process (cut short). A file missing
     * while a folder named checkpoint-1 still stands is a partial checkpoint. */
    int partial = 0, gone = 0, status = 0;
    for (long it = 0; it < 20000000 && !partial && !gone; it++) {
        for (int i = 0; i < nw && !partial; i++)
            if (!present(watch[i])) partial = present(ck1), gone = !partial;
        if (!partial && !gone && waitpid(pid, &status, WNOHANG) == pid) {
            pid = 0;
            break;
        }
    }
    if (pid > 0) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    CHECK_MSG(!partial, "a folder named checkpoint-1 was seen with files missing while it was being removed");
    CHECK_MSG(partial || gone || pid == 0, "the removal never started");
    /* checkpoint-1 is gone or complete; checkpoint-2 is complete; the run folder resolves to checkpoint-2 */
    CHECK(!present(ck1) || trainer_ckpt_verify(ck1, NULL) == 0);
    snprintf(ck, sizeof ck, "%s/checkpoint-2", dir);
    CHECK(trainer_ckpt_verify(ck, NULL) == 0);
    /* a removal cut short earlier, after its rename: a partial trash folder, and a half-written .tmp; never read */
    REQUIRE(test_run(out, sizeof out, "mkdir -p %s/.trash-checkpoint-7-abcdef/transformer %s/.checkpoint-9.tmp && "
                                      "cp %s/checkpoint-2/trainer_state.json %s/.trash-checkpoint-7-abcdef/",
                     dir, dir, dir, dir) == 0);
    int64_t *steps;
    const int n = trainer_ckpt_list(dir, &steps);
    CHECK(n >= 1 && steps[n - 1] == 2);
    free(steps);
    REQUIRE_OK(trainer_ckpt_resolve(dir, ck, sizeof ck));
    CHECK_MSG(strstr(ck, "checkpoint-2"), "resolved %s", ck);
    /* the next save removes every leftover */
    REQUIRE_OK(trainer_ckpt_save(dir, &(trainer_ckpt_state){.step = 3, .config = (char *)cfg}, &ex, 1, 2, NULL, 0));
    CHECK_MSG(test_run(out, sizeof out, "ls -A %s | grep -e trash -e '\\.tmp'", dir) != 0, "left: %s", out);
    CHECK(!present(ck1));
    wan_model_free(&m);
    optim_adamw_free(&o);
}

TEST(checkpoint_config_text_and_diff) {
    char out[512];
    CHECK(trainer_ckpt_config_diff("{a: 1, b: {c: x, d: [1, 2]}}", "{a: 1, b: {c: x, d: [1, 2]}}", out, sizeof out) == 0);
    CHECK(trainer_ckpt_config_diff("{a: 1, b: {c: x, d: [1, 2]}}", "{a: 2, b: {d: [1, 3], e: null}}", out, sizeof out) == 4);
    CHECK_MSG(!strcmp(out, "a (checkpoint 1, now 2), b.c (checkpoint x, now (absent)), b.d (checkpoint [1, 2], now "
                           "[1, 3]), b.e (checkpoint (absent), now null)"),
              "got: %s", out);
    CHECK(trainer_ckpt_config_diff("{a: \"1\"}", "{a: 1}", out, sizeof out) == 1); /* a string is not a number */
    /* a checkpoint that predates keys: accepted when they are at their old-behaviour values or null (free) now */
    CHECK(trainer_ckpt_config_predates("{rollout: {eta: 1}, parallel: {trainer_ranks: 2}}",
                                       "{rollout: {eta: 1, sde_type: sde, sde_window: {size: 0, range: [0, 7]}}, "
                                       "algorithm: {loss: grpo}, guard: {gold_scorers: [], video_stats: true}, "
                                       "parallel: {trainer_ranks: null, zero_stage: null}}") == 1);
    CHECK(trainer_ckpt_config_predates("{rollout: {eta: 1}}", "{rollout: {eta: 1, sde_type: cps}}") == 0);
    CHECK(trainer_ckpt_config_predates("{rollout: {eta: 1}}", "{rollout: {eta: 1, sde_window: {size: 2}}}") == 0);
    CHECK(trainer_ckpt_config_predates("{rollout: {eta: 1}}", "{rollout: {eta: 0.5, sde_type: sde}}") == 0);
    CHECK(trainer_ckpt_config_predates("{rollout: {eta: 1}}", "{rollout: {eta: 1, unknown_new: 3}}") == 0);
    CHECK(trainer_ckpt_config_predates("{guard: {x: 1}}", "{guard: {gold_scorers: [a]}}") == 0);
    CHECK(trainer_ckpt_config_predates("{reward: {scorers: [color_match]}}",
                                       "{reward: {scorers: [color_match], models: null, frames: all}}") == 1);
    CHECK(trainer_ckpt_config_predates("{reward: {scorers: [color_match]}}",
                                       "{reward: {scorers: [pickscore], models: {pickscore: /p}, frames: all}}") == 0);
    /* the recipe's canonical text: free keys null, the others kept */
    typedef struct {
        double lr;
        int64_t steps;
    } toy;
    static const core_cfg_entry schema[] = {
        {"x.lr", CORE_CFG_DOUBLE, offsetof(toy, lr), "0.5", 0, 0, 0, NULL, NULL},
        {"x.steps", CORE_CFG_INT64, offsetof(toy, steps), "20", 0, 0, 0, NULL, NULL},
        {0},
    };
    toy obj = {1e-4, 30};
    const char *const free_keys[] = {"x.steps", NULL};
    char *t = trainer_ckpt_config_text(schema, &obj, free_keys);
    REQUIRE(t);
    CHECK_MSG(!strcmp(t, "{x: {lr: 0.0001, steps: null}}"), "got: %s", t);
    obj.steps = 99;
    char *t2 = trainer_ckpt_config_text(schema, &obj, free_keys);
    REQUIRE(t2);
    CHECK(trainer_ckpt_config_hash(t) == trainer_ckpt_config_hash(t2));
    free(t2);
    obj.lr = 2e-4;
    t2 = trainer_ckpt_config_text(schema, &obj, free_keys);
    REQUIRE(t2);
    CHECK(trainer_ckpt_config_hash(t) != trainer_ckpt_config_hash(t2));
    free(t), free(t2);
}

/* ---- end to end ---- */

/* metrics.jsonl rows with time/ fields removed; returns the count. */

/* A tiny model in dir/model and a 3-prompt file dir/prompts.txt. */
static void make_inputs(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
}

/* `vgrpo run` on the small recipe into dir/<name> with extra options. */
static int run(const char *dir, const char *name, const char *extra, char *out, size_t cap) {
    return test_run(out, cap,
                    "OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set model.path=%s/model --set "
                    "data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt --set "
                    "logging.run_dir=%s/%s --set model.text_encoder=word_embed --set model.decoder=latent_rgb --set "
                    "rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 --set "
                    "data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set optim.total_steps=4 --set "
                    "algorithm.beta=0.05 --set algorithm.optimizer_steps_per_rollout=2 --set optim.schedule=linear "
                    "--set optim.warmup_steps=1 --set checkpoint.every=2 %s",
                    test_vgrpo_bin(), dir, dir, dir, dir, name, extra);
}

TEST(checkpoint_resume_exact) {
    const char *dir = test_tmpdir();
    char out[16384], a[1024], b[1024];
    make_inputs(dir);
    int rc = run(dir, "a", "--steps 2", out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "checkpoint-2"), "got: %s", out);
    snprintf(a, sizeof a, "%s/a/metrics.jsonl", dir);
    json_t *ra[8], *rb[8];
    int n = read_rows(a, ra, 8, 0);
    REQUIRE(n == 3); /* steps 0, 1 and the final eval row at step 2 (removed by the resume) */
    for (int i = 0; i < n; i++) json_decref(ra[i]);
    /* the checkpoint holds the sampler inside its second epoch (3 prompts, 2 per step) */
    snprintf(a, sizeof a, "%s/a/checkpoint-2/trainer_state.json", dir);
    json_t *st = json_load_file(a, 0, NULL);
    REQUIRE(st);
    const char *dh = json_string_value(json_object_get(st, "data_xxh64"));
    CHECK_MSG(dh && strlen(dh) == 16, "data_xxh64: %s", dh ? dh : "(absent)");
    CHECK(json_integer_value(json_object_get(st, "data_epoch")) == 1 &&
          json_integer_value(json_object_get(st, "data_position")) == 2 &&
          json_integer_value(json_object_get(st, "policy_version")) == 4);
    json_decref(st);
    /* resume from the run folder (latest complete checkpoint); free keys may change (eval_every, run length) */
    snprintf(a, sizeof a, "--resume %s/a --set checkpoint.total_limit=5 --set rollout.batch_size=3", dir);
    rc = run(dir, "a", a, out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "resumed from") && strstr(out, "checkpoint-2: step 2, policy version 4") &&
                  strstr(out, "step 2 of 4") && !strstr(out, "step 1 of 4"),
              "got: %s", out);
    REQUIRE(run(dir, "b", "", out, sizeof out) == 0);
    /* checkpoint-4 of both runs: byte-identical weights, Adam m/v + step, trainer state */
    const char *files[] = {"transformer/diffusion_pytorch_model.safetensors", "transformer/config.json",
                           "optimizer.safetensors", "trainer_state.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%s/a/checkpoint-4/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/b/checkpoint-4/%s", dir, files[i]);
        CHECK_MSG(ckpt_file_cmp(out, sizeof out, a, b) == 0, "%s differs: %s", files[i], out);
    }
    /* ... and the weights did move between steps 2 and 4 */
    CHECK(test_run(out, sizeof out, "cmp -s %s/b/checkpoint-2/%s %s/b/checkpoint-4/%s", dir, files[0], dir, files[0]) != 0);
    snprintf(a, sizeof a, "%s/a/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/b/metrics.jsonl", dir);
    int na = read_rows(a, ra, 8, 0), nb = read_rows(b, rb, 8, 0);
    CHECK_MSG(na == 5 && nb == 5, "rows: resumed %d, straight %d", na, nb); /* steps 0..3 + final eval */
    for (int i = 0; i < na && i < nb; i++) {
        CHECK_MSG(json_equal(ra[i], rb[i]), "metrics row %d differs between resumed and straight runs", i);
        CHECK(json_integer_value(json_object_get(ra[i], "step")) == i);
    }
    CHECK(na > 3 && json_number_value(json_object_get(ra[2], "kl")) > 0); /* the reference model is the initial one */
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
    /* a changed recipe is refused, naming the key; a missing checkpoint names the folder */
    snprintf(a, sizeof a, "--resume %s/a/checkpoint-2 --set optim.lr=0.001", dir);
    CHECK(run(dir, "a", a, out, sizeof out) == 1); /* refusals leave the run's files as they are */
    CHECK_MSG(strstr(out, "optim.lr (checkpoint 0.0005, now 0.001)") && strstr(out, "config hash"), "got: %s", out);
    snprintf(a, sizeof a, "--resume %s/b/checkpoint-2 --set data.prompt_file=recipes/prompts/colors.txt", dir);
    CHECK(run(dir, "b", a, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "data.prompt_file"), "got: %s", out);
    snprintf(a, sizeof a, "--resume %s/nothing", dir);
    CHECK(run(dir, "c", a, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "--resume") && strstr(out, "nothing"), "got: %s", out);
    snprintf(a, sizeof a, "--resume %s/b/checkpoint-4 --steps 3", dir);
    CHECK(run(dir, "b", a, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "past this run's 3 steps"), "got: %s", out);
    /* the same prompt file with one word changed (same path, same count) is refused, naming the file */
    REQUIRE(test_run(out, sizeof out, "printf 'a red kite\\na green frog\\na blue boot\\n' > %s/prompts.txt", dir) == 0);
    snprintf(a, sizeof a, "--resume %s/b/checkpoint-2", dir);
    CHECK(run(dir, "b", a, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "prompts.txt changed since the checkpoint") && strstr(out, "content hash"), "got: %s", out);
    /* a checkpoint written before the hash was kept (no "data_xxh64"; its own state hash redone): resumes with the
     * changed file, saying that only the count is checked */
    snprintf(a, sizeof a, "%s/b/checkpoint-2/trainer_state.json", dir);
    json_t *old = json_load_file(a, 0, NULL);
    REQUIRE(old && json_object_del(old, "data_xxh64") == 0);
    uint64_t self;
    REQUIRE_OK(trainer_ckpt_sums_state_hash(old, &self));
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)self);
    json_object_set_new(old, "state_xxh64", json_string(hx));
    REQUIRE(json_dump_file(old, a, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0);
    json_decref(old);
    snprintf(a, sizeof a, "--resume %s/b/checkpoint-2 --steps 3", dir);
    CHECK(run(dir, "b", a, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "records no prompt hash") && strstr(out, "checked by its count only"), "got: %s", out);
}

TEST(checkpoint_run_rolling_limit_tmp_and_signal) {
    const char *dir = test_tmpdir();
    char out[16384], x[1024];
    make_inputs(dir);
    /* every step, keep 2: after 3 steps checkpoint-2 and -3 */
    REQUIRE(run(dir, "r", "--steps 3 --set checkpoint.every=1 --set checkpoint.total_limit=2", out, sizeof out) == 0);
    CHECK(!exists("%s/r/checkpoint-1%s", dir, "") && exists("%s/r/checkpoint-2%s", dir, "") &&
          exists("%s/r/checkpoint-3%s", dir, ""));
    /* a leftover temporary folder with a higher step is ignored by --resume and removed by the next save; a
     * checkpoint.dir elsewhere is used */
    REQUIRE(test_run(out, sizeof out, "mkdir -p %s/r/.checkpoint-9.tmp/transformer", dir) == 0);
    snprintf(x, sizeof x, "--resume %s/r --set checkpoint.every=1 --set checkpoint.total_limit=2", dir);
    REQUIRE(run(dir, "r", x, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "checkpoint-3: step 3"), "got: %s", out);
    CHECK(!exists("%s/r/.checkpoint-9.tmp%s", dir, "") && !exists("%s/r/checkpoint-2%s", dir, "") &&
          exists("%s/r/checkpoint-3%s", dir, "") && exists("%s/r/checkpoint-4%s", dir, ""));
    /* SIGTERM: the step finishes, a checkpoint is saved, the run stops with status 1 and says so */
    snprintf(x, sizeof x,
             "--set optim.total_steps=500 --set checkpoint.every=1000 --set checkpoint.dir=%s/ck > %s/sig.log 2>&1 & "
             "pid=$!; i=0; while [ ! -s %s/s/metrics.jsonl ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
             "kill -TERM $pid; wait $pid; echo status=$?; cat %s/sig.log",
             dir, dir, dir, dir);
    run(dir, "s", x, out, sizeof out);
    CHECK_MSG(strstr(out, "status=1") && strstr(out, "stopped by signal 15") && strstr(out, "--resume"), "got: %s", out);
    int64_t *steps;
    snprintf(x, sizeof x, "%s/ck", dir);
    int n = trainer_ckpt_list(x, &steps);
    CHECK_MSG(n == 1 && steps[0] >= 1 && steps[0] < 500, "checkpoints after SIGTERM: %d", n);
    if (n == 1) {
        json_t *rows[512];
        snprintf(x, sizeof x, "%s/s/metrics.jsonl", dir);
        int nr = read_rows(x, rows, 512, 0);
        CHECK_MSG(nr == steps[0], "metrics rows %d, checkpoint step %lld", nr, (long long)steps[0]);
        for (int i = 0; i < nr; i++) json_decref(rows[i]);
    }
    free(steps);
}

/* --resume RUN skips a checkpoint with a missing file and one with a damaged file (each named with the
 * reason) and resumes from the one before, repeating the straight run byte for byte; --resume RUN/checkpoint-N of a
 * damaged checkpoint is an error naming the file. */
TEST(checkpoint_resume_skips_damaged_and_incomplete) {
    const char *dir = test_tmpdir();
    char out[32768], x[1024];
    make_inputs(dir);
    REQUIRE(run(dir, "r", "--steps 3 --set checkpoint.every=1 --set checkpoint.total_limit=0", out, sizeof out) == 0);
    REQUIRE(test_run(out, sizeof out, "cp -r %s/r/checkpoint-3 %s/orig3 && cp %s/r/metrics.jsonl %s/orig-metrics.jsonl && "
                                      "rm %s/r/checkpoint-3/optimizer.safetensors",
                     dir, dir, dir, dir, dir) == 0);
    snprintf(x, sizeof x, "%s/r/checkpoint-2/transformer/diffusion_pytorch_model.safetensors", dir);
    poke(x, "blocks.1.ffn.net.2.weight", 6, NULL, 0, 0x10);
    /* the damaged checkpoint named: an error naming the file, the run's files as they were */
    snprintf(x, sizeof x, "--steps 3 --resume %s/r/checkpoint-2", dir);
    CHECK(run(dir, "r", x, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "checkpoint-2/transformer/diffusion_pytorch_model.safetensors: damaged file") &&
                  strstr(out, "tensor \"blocks.1.ffn.net.2.weight\" differs"),
              "got: %s", out);
    snprintf(x, sizeof x, "--steps 3 --resume %s/r/checkpoint-3", dir);
    CHECK(run(dir, "r", x, out, sizeof out) == 1);
    CHECK_MSG(strstr(out, "checkpoint-3: missing file optimizer.safetensors (incomplete checkpoint)"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "cmp %s/r/metrics.jsonl %s/orig-metrics.jsonl", dir, dir) == 0);
    /* the run folder: 3 and 2 skipped, named with why; resumed from 1 */
    snprintf(x, sizeof x, "--steps 3 --set checkpoint.every=1 --set checkpoint.total_limit=0 --resume %s/r", dir);
    REQUIRE_OK(run(dir, "r", x, out, sizeof out) ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "skipping") && strstr(out, "checkpoint-3: missing file optimizer.safetensors") &&
                  strstr(out, "checkpoint-2/transformer/diffusion_pytorch_model.safetensors: damaged file") &&
                  strstr(out, "checkpoint-1: step 1"),
              "got: %s", out);
    const char *files[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    for (int f = 0; f < 3; f++)
        CHECK_MSG(test_run(out, sizeof out, "cmp %s/r/checkpoint-3/%s %s/orig3/%s", dir, files[f], dir, files[f]) == 0,
                  "checkpoint-3/%s differs from the straight run's: %s", files[f], out);
    json_t *ra[8], *rb[8];
    snprintf(x, sizeof x, "%s/r/metrics.jsonl", dir);
    const int na = read_rows(x, ra, 8, 0);
    snprintf(x, sizeof x, "%s/orig-metrics.jsonl", dir);
    const int nb = read_rows(x, rb, 8, 0);
    CHECK_MSG(na == 4 && nb == 4, "rows %d and %d", na, nb);
    for (int i = 0; i < na && i < nb; i++) CHECK_MSG(json_equal(ra[i], rb[i]), "metrics row %d differs", i);
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
}
