/* tests/test_dev_run.c — the sampler and the training step on the device (model.device cuda), run
 * on the EMULATED device (kernels/cuda/emu/k_emu.h: host memory, the kernel bodies, k_cpu_ops for GEMM and
 * attention on bf16 operands; selected for the vgrpo processes by VGRPO_EMULATE_DEVICE=1, model/dit/wan_dev_exec.h).
 * Nothing here runs on a GPU; scripts/gpu_check.sh runs the GPU's counterparts ("grpo ..." rows).
 *   - the engine on the device: a sample's trajectory alone, in a batch of 3 and of 4 (with CFG), bit for bit; close
 *     to the CPU's but not equal (bf16 really happened);
 *   - the device optimizer step (trainer/optim/train_dev.h) equals trainer/optim/optim.c's on the same gradients bit for bit
 *     (master, moments, the bf16 copy, norm, clip factor), clipping and weight decay on;
 *   - `vgrpo parity` on the device: the rollout workers' velocities and log-probs recomputed by the trainer exactly
 *     (0), with 3 samples per rollout forward, 5 transitions per training forward, CFG rows and a partial selection;
 *   - a local run with algorithm.activations checkpoint equals store (and recompute) bit for bit; a resumed run
 *     (2 + 2 steps) equals a straight one (4 steps), metrics and checkpoint files; a colocated run (weights synced to
 *     a worker process over the wire, EMA eval pushes) equals a local one;
 *   - a 10-step tiny run on the device against the same seed's CPU run: the final eval within 2 standard errors of
 *     their difference (figures printed);
 *   - the start-up estimate of device memory at the Wan 1.3B recipe's sizes, per activation mode, and its refusal;
 *   - LoRA on the device: resume exact, parity 0 at trained adapters, the base unchanged;
 *   - eval on the device, and the refusals (a LoRA rank not a multiple of 8, an EMA of adapters, several ranks,
 *     checkpoint activations on the CPU). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "kernels/body/kb_base.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_lora.h"
#include "rollout/engine.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "tests/wan_test_util.h"
#include "trainer/optim/train_dev.h"

#define EMU "VGRPO_EMULATE_DEVICE=1 "

static double num(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* ---- in process ---- */

TEST(dev_engine_batch_invariant) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 5);
    wan_dev_exec *x = wan_dev_exec_new(&k_emu_ops);
    REQUIRE(x);
    const wan_exec ex = {.dev = x};
    const int64_t shape[4] = {16, 2, 4, 4}, nl = 16 * 2 * 4 * 4;
    const int L = 4, n = 4, N = 4;
    float *emb = malloc(sizeof(float) * (size_t)(n * L * c.text_dim));
    core_philox_normal(emb, n * L * c.text_dim, 9, 0, 0, 4);
    const float *cond[4] = {emb, emb + L * c.text_dim, emb + 2 * L * c.text_dim, emb + 3 * L * c.text_dim};
    const uint64_t uids[4] = {10, 11, 12, 13};
    const rollout_experts E = rollout_one_expert(&m);
    core_traj t4[4], t3[4], t1, tc[4];
    rollout_config r4, r3, r1;
    REQUIRE_OK(rollout_config_init(&r4, N, 3.0, 0.8f, 4.5f, shape, L, 77, 4));
    REQUIRE_OK(rollout_config_init(&r3, N, 3.0, 0.8f, 4.5f, shape, L, 77, 3));
    REQUIRE_OK(rollout_config_init(&r1, N, 3.0, 0.8f, 4.5f, shape, L, 77, 1));
    REQUIRE_OK(rollout_generate(&r4, &E, &ex, n, cond, uids, NULL, t4));
    REQUIRE_OK(rollout_generate(&r3, &E, &ex, n, cond, uids, NULL, t3));
    REQUIRE_OK(rollout_generate(&r4, &E, NULL, n, cond, uids, NULL, tc)); /* the fp32 CPU model */
    const size_t bytes = sizeof(float) * (size_t)((N + 1) * nl);
    double worst = 0;
    for (int j = 0; j < n; j++) {
        REQUIRE_OK(rollout_generate(&r1, &E, &ex, 1, cond + j, uids + j, NULL, &t1));
        CHECK_MSG(memcmp(t1.latents, t4[j].latents, bytes) == 0, "sample %d: alone vs batch of 4", j);
        CHECK_MSG(memcmp(t3[j].latents, t4[j].latents, bytes) == 0, "sample %d: batches of 3 vs 4", j);
        CHECK(memcmp(t1.log_probs, t4[j].log_probs, sizeof(float) * N) == 0);
        core_traj_free(&t1);
        /* against the CPU: the same noise, so the final latents are close, not equal */
        const double d = wt_l2_rel(core_traj_latent(&t4[j], N), core_traj_latent(&tc[j], N), nl);
        worst = d > worst ? d : worst;
        CHECK(memcmp(core_traj_latent(&t4[j], 0), core_traj_latent(&tc[j], 0), sizeof(float) * nl) == 0);
    }
    printf("  device vs CPU final latents: worst rel-L2 %.2e over %d samples (bf16)\n", worst, n);
    CHECK(worst > 1e-6 && worst < 5e-2);
    for (int j = 0; j < n; j++) core_traj_free(&t4[j]), core_traj_free(&t3[j]), core_traj_free(&tc[j]);
    free(emb);
    wan_dev_exec_forget(x, &m);
    wan_dev_exec_close(x);
    wan_model_free(&m);
}

TEST(dev_opt_step_equals_host) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model dm, hm;
    REQUIRE_OK(wan_model_init(&dm, &c));
    REQUIRE_OK(wan_model_init(&hm, &c));
    wt_random_params(&dm, 21);
    const int64_t np = dm.layout.numel;
    memcpy(hm.params, dm.params, sizeof(float) * (size_t)np);
    wan_dev_exec *x = wan_dev_exec_new(&k_emu_ops);
    REQUIRE(x);
    optim_adamw od, oh;
    REQUIRE_OK(optim_adamw_init(&od, np));
    REQUIRE_OK(optim_adamw_init(&oh, np));
    optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.01,
                       .max_grad_norm = 0.5, .schedule = OPTIM_SCHED_COSINE, .warmup_steps = 1, .total_steps = 5};
    wan_model *pd[1] = {&dm};
    optim_adamw *ods[1] = {&od};
    trainer_dev D;
    REQUIRE_OK(trainer_dev_init(&D, x, pd, 1, NULL, ods));
    float *g = malloc(sizeof(float) * (size_t)np), *w16 = malloc(sizeof(float) * (size_t)np);
    REQUIRE(g && w16);
    wan_dev_model *d = wan_dev_exec_model(x, &dm);
    REQUIRE(d);
    for (int step = 0; step < 3; step++) {
        test_fill_uniform(g, (size_t)np, 100 + step, -1.0f, 1.0f); /* norm ~440: clipped to 0.5 */
        REQUIRE_OK(wan_dev_exec_zero_grads(x, &dm));
        REQUIRE_OK(k_emu_ops.mem_upload(d->grads, g, sizeof(float) * (size_t)np));
        optim_step_info id, ih;
        REQUIRE_OK(trainer_dev_opt_step(&D, pd, 1, NULL, ods, &oc, &id));
        const float *gh[1] = {g};
        const double norm = optim_grad_norm_multi(gh, &np, 1);
        REQUIRE_OK(optim_adamw_step_coef(&oh, &oc, hm.params, g, NULL, norm, optim_clip_coef(norm, oc.max_grad_norm),
                                         &ih));
        CHECK(id.grad_norm == ih.grad_norm && id.clip_coef == ih.clip_coef && id.lr == ih.lr);
        CHECK(id.clip_coef < 1.0);
        CHECK_MSG(memcmp(dm.params, hm.params, sizeof(float) * (size_t)np) == 0, "step %d: master differs", step);
        CHECK(od.step == oh.step && od.step == step + 1);
        /* the device model's bf16 weights are the master rounded once */
        REQUIRE_OK(k_emu_ops.mem_download_bf16(w16, d->w, (size_t)np));
        int bad = 0;
        for (int64_t i = 0; i < np && !bad; i++) bad = w16[i] != kb_round_bf16(hm.params[i]);
        CHECK_MSG(!bad, "step %d: the bf16 copy is not the master rounded", step);
    }
    REQUIRE_OK(trainer_dev_sync_moments(&D, ods));
    CHECK(memcmp(od.m, oh.m, sizeof(float) * (size_t)np) == 0 && memcmp(od.v, oh.v, sizeof(float) * (size_t)np) == 0);
    /* a NaN gradient: refused, nothing changed */
    g[7] = NAN;
    REQUIRE_OK(k_emu_ops.mem_upload(d->grads, g, sizeof(float) * (size_t)np));
    optim_step_info id;
    CHECK(trainer_dev_opt_step(&D, pd, 1, NULL, ods, &oc, &id) == -1);
    CHECK(strstr(core_last_error(), "gradient norm is nan at optimizer step 3") != NULL);
    CHECK(memcmp(dm.params, hm.params, sizeof(float) * (size_t)np) == 0 && od.step == 3);
    free(g), free(w16);
    trainer_dev_free(&D);
    optim_adamw_free(&od), optim_adamw_free(&oh);
    wan_dev_exec_forget(x, &dm);
    wan_dev_exec_close(x);
    wan_model_free(&dm), wan_model_free(&hm);
}

/* trainer/optim/train_dev.h lazy_host: the master's host copy is made only when the host asks (trainer_dev_sync_host), not
 * at every step. Counted on the emulated device (k_emu_traffic): 3 lazy steps download proj_out.bias's slice only
 * (the eager steps download the whole master each time); after the sync the host params, moments and the device's
 * bf16 copy equal the eager run's bit for bit. */
TEST(dev_master_stays_on_device) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model ml, me; /* lazy, eager */
    REQUIRE_OK(wan_model_init(&ml, &c));
    REQUIRE_OK(wan_model_init(&me, &c));
    wt_random_params(&ml, 23);
    const int64_t np = ml.layout.numel;
    memcpy(me.params, ml.params, sizeof(float) * (size_t)np);
    wan_dev_exec *x = wan_dev_exec_new(&k_emu_ops);
    REQUIRE(x);
    optim_adamw ol, oe;
    REQUIRE_OK(optim_adamw_init(&ol, np));
    REQUIRE_OK(optim_adamw_init(&oe, np));
    optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.01,
                       .max_grad_norm = 0.5, .schedule = OPTIM_SCHED_COSINE, .warmup_steps = 1, .total_steps = 5};
    wan_model *pl[1] = {&ml}, *pe[1] = {&me};
    optim_adamw *osl[1] = {&ol}, *ose[1] = {&oe};
    trainer_dev Dl, De;
    REQUIRE_OK(trainer_dev_init(&Dl, x, pl, 1, NULL, osl));
    REQUIRE_OK(trainer_dev_init(&De, x, pe, 1, NULL, ose));
    Dl.lazy_host = 1;
    float *g = malloc(sizeof(float) * (size_t)np), *w0 = malloc(sizeof(float) * (size_t)np);
    float *wl = malloc(sizeof(float) * (size_t)np), *we = malloc(sizeof(float) * (size_t)np);
    REQUIRE(g && w0 && wl && we);
    memcpy(w0, ml.params, sizeof(float) * (size_t)np);
    wan_dev_model *dl = wan_dev_exec_model(x, &ml), *de = wan_dev_exec_model(x, &me);
    REQUIRE(dl && de);
    const int64_t pout = c.out_channels * c.patch_size[0] * c.patch_size[1] * c.patch_size[2];
    unsigned long long lazy_bytes = 0, lazy_n = 0, eager_bytes = 0;
    for (int step = 0; step < 3; step++) {
        test_fill_uniform(g, (size_t)np, 300 + step, -1.0f, 1.0f);
        REQUIRE_OK(wan_dev_exec_zero_grads(x, &ml));
        REQUIRE_OK(wan_dev_exec_zero_grads(x, &me));
        REQUIRE_OK(k_emu_ops.mem_upload(dl->grads, g, sizeof(float) * (size_t)np));
        REQUIRE_OK(k_emu_ops.mem_upload(de->grads, g, sizeof(float) * (size_t)np));
        optim_step_info il, ie;
        k_emu_traffic t0, t1, t2;
        k_emu_traffic_get(&t0);
        REQUIRE_OK(trainer_dev_opt_step(&Dl, pl, 1, NULL, osl, &oc, &il));
        k_emu_traffic_get(&t1);
        REQUIRE_OK(trainer_dev_opt_step(&De, pe, 1, NULL, ose, &oc, &ie));
        k_emu_traffic_get(&t2);
        lazy_bytes += t1.download_bytes - t0.download_bytes, lazy_n += t1.downloads - t0.downloads;
        eager_bytes += t2.download_bytes - t1.download_bytes;
        CHECK(il.grad_norm == ie.grad_norm && il.clip_coef == ie.clip_coef && il.lr == ie.lr);
        CHECK(Dl.host_stale[0] == 1 && De.host_stale[0] == 0);
    }
    printf("  3 steps, %lld parameters: lazy host copy %llu bytes downloaded (%llu copies: proj_out.bias), eager %llu "
           "bytes\n", (long long)np, lazy_bytes, lazy_n, eager_bytes);
    CHECK(lazy_bytes == 3ull * (unsigned long long)pout * sizeof(float) && lazy_n == 3);
    CHECK(eager_bytes >= 3ull * (unsigned long long)np * sizeof(float));
    /* the stale host copy: the first step's weights never arrived (but proj_out.bias, refreshed every step) */
    const int64_t pb_off = ml.w.proj_out_b - ml.params;
    CHECK(memcmp(ml.params, w0, sizeof(float) * (size_t)pb_off) == 0);
    CHECK(memcmp(ml.w.proj_out_b, me.w.proj_out_b, sizeof(float) * (size_t)pout) == 0);
    /* the device's bf16 copies already agree (the rollouts read those) */
    REQUIRE_OK(k_emu_ops.mem_download_bf16(wl, dl->w, (size_t)np));
    REQUIRE_OK(k_emu_ops.mem_download_bf16(we, de->w, (size_t)np));
    CHECK(memcmp(wl, we, sizeof(float) * (size_t)np) == 0);
    k_emu_traffic t0, t1;
    k_emu_traffic_get(&t0);
    REQUIRE_OK(trainer_dev_sync_host(&Dl, osl));
    k_emu_traffic_get(&t1);
    CHECK(t1.download_bytes - t0.download_bytes == 3ull * (unsigned long long)np * sizeof(float)); /* master, m, v */
    CHECK(Dl.host_stale[0] == 0);
    REQUIRE_OK(trainer_dev_sync_host(&De, ose));
    CHECK_MSG(memcmp(ml.params, me.params, sizeof(float) * (size_t)np) == 0, "lazy master differs from eager");
    CHECK(memcmp(ol.m, oe.m, sizeof(float) * (size_t)np) == 0 && memcmp(ol.v, oe.v, sizeof(float) * (size_t)np) == 0);
    k_emu_traffic_get(&t0);
    REQUIRE_OK(trainer_dev_sync_host(&Dl, osl)); /* current: nothing moves */
    k_emu_traffic_get(&t1);
    CHECK(t1.downloads == t0.downloads);
    free(g), free(w0), free(wl), free(we);
    trainer_dev_free(&Dl), trainer_dev_free(&De);
    optim_adamw_free(&ol), optim_adamw_free(&oe);
    wan_dev_exec_forget(x, &ml), wan_dev_exec_forget(x, &me);
    wan_dev_exec_close(x);
    wan_model_free(&ml), wan_model_free(&me);
}

/* The start-up estimate of device memory (trainer/optim/train_dev.h) at the Wan 2.1 1.3B recipe's sizes (33 frames 480 x
 * 832: 14,040 tokens, 512 text tokens; micro-batch 2 and rollout batch 4, CFG doubling both; a KL reference; local
 * mode), per activation mode: STORE does not fit one 141 GiB GPU, CHECKPOINT fits an 80 GB one; and the Wan 2.2
 * A14B LoRA recipe's (CHECKPOINT fits a 141 GB H200). Figures printed. */
TEST(dev_memory_estimate_wan_recipe) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "wan2.1-t2v-1.3b"));
    const wan_shape tr = {4, 9, 60, 104, 512, 0}, ro = {8, 9, 60, 104, 512, 0};
    const char *names[3] = {"store", "recompute", "checkpoint"};
    const wan_acts_mode modes[3] = {WAN_ACTS_STORE, WAN_ACTS_RECOMPUTE, WAN_ACTS_CHECKPOINT};
    const double g = 1024.0 * 1024.0 * 1024.0;
    double tot[3];
    for (int i = 0; i < 3; i++) {
        trainer_dev_budget b;
        const trainer_dev_request q = {.c = &c, .n_experts = 1, .copies = 1, .ref_forward = 1, .train = 1,
                                       .train_shape = tr, .mode = modes[i], .n_rollout = 1, .rollout = {ro}};
        REQUIRE_OK(trainer_dev_estimate(&q, &b));
        printf("  wan2.1-t2v-1.3b recipe, activations %s: device memory %.1f GiB (weights %.1f, gradients and "
               "optimizer %.1f, training activations %.1f, rollout activations %.1f, workspaces %.1f, margin %.1f, "
               "context %.1f)\n", names[i], b.total / g, b.weights / g, (b.grads + b.optim) / g, b.train_acts / g,
               b.roll_acts / g, (b.lt_ws + b.attn_ws + b.scratch) / g, b.margin / g, b.context / g);
        tot[i] = b.total / g;
        /* 18 bytes per parameter + the reference's 2, and each copy's fp32 proj_out.bias (64 floats) */
        CHECK(b.weights + b.grads + b.optim == 1418996800.0 * 20.0 + 2 * 4.0 * 64);
        CHECK(b.alloc == b.weights + b.grads + b.optim + b.staging + fmax(b.train_acts, b.roll_acts));
    }
    CHECK(tot[2] < tot[1] && tot[1] < tot[0] && tot[2] < 79.6 && tot[0] > 141.0);
    /* Wan 2.2 A14B with its LoRA recipe's adapter (rank 64 on the ten block linears) on one device: both experts'
     * frozen bf16 bases, each adapter trained; micro-batch 1 and rollout batch 2 (CFG doubled), no reference */
    wan_config a;
    REQUIRE_OK(wan_config_preset(&a, "wan2.2-t2v-a14b"));
    const wan_lora_config lc = {64, 128.0, WAN_LORA_ALL_BLOCK, 0};
    const int64_t ln = wan_lora_numel(&a, &lc);
    REQUIRE(ln > 0);
    const wan_shape tr2 = {2, 9, 60, 104, 512, 0}, ro2 = {4, 9, 60, 104, 512, 0};
    for (int i = 1; i < 3; i++) {
        trainer_dev_budget b;
        const trainer_dev_request q = {.c = &a, .n_experts = 2, .lora_numel = ln, .lora_rank = 64, .train = 1,
                                       .train_shape = tr2, .mode = modes[i], .n_rollout = 1, .rollout = {ro2}};
        REQUIRE_OK(trainer_dev_estimate(&q, &b));
        printf("  wan2.2-t2v-a14b LoRA recipe (rank 64, %lld adapter parameters per expert), activations %s: device "
               "memory %.1f GiB (bases and adapters %.1f, adapters' gradients and optimizer %.1f, training activations "
               "%.1f, rollout activations %.1f)\n", (long long)ln, names[i], b.total / g, b.weights / g,
               (b.grads + b.optim) / g, b.train_acts / g, b.roll_acts / g);
        if (i == 2) CHECK(b.total / g < 140.4);
    }
}

/* ---- the vgrpo processes on the emulated device ---- */

#define SMALL                                                                                                      \
    "--set rollout.num_steps=6 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "               \
    "--set rollout.batch_size=3 --set algorithm.micro_batch_size=5 --set algorithm.beta=0.05 "                     \
    "--set data.eval_samples_per_prompt=1 --set logging.eval_every=0 --set optim.total_steps=4 "                   \
    "--set checkpoint.every=2"

static void make_model(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 3 >/dev/null",
                     test_vgrpo_bin(), dir) == 0);
}

/* A local run of the tiny recipe in dir/name; device "cuda" (emulated) or "cpu". */
static int run_local(const char *dir, const char *name, const char *device, const char *extra, char *out, size_t cap) {
    return test_run(out, cap, "%sOMP_NUM_THREADS=1 %s run recipes/tiny-cpu.yaml --set model.device=%s "
                              "--set model.path=%s/model --set logging.run_dir=%s/%s " SMALL " %s 2>&1",
                    strcmp(device, "cpu") ? EMU : "", test_vgrpo_bin(), device, dir, dir, name, extra);
}

static int rows_of(const char *dir, const char *name, json_t **rows, int cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, name);
    return read_rows(path, rows, cap, 0);
}

static int same_file(const char *a, const char *b) {
    char out[64];
    return test_run(out, sizeof out, "cmp -s %s %s", a, b) == 0;
}

TEST(dev_run_parity_zero) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[700];
    make_model(dir);
    /* 3 samples per rollout forward (CFG: 6 rows), 5 transitions per training forward (CFG rows after them), half
     * the steps trained */
    int st = test_run(out, sizeof out,
                      EMU "%s parity recipes/tiny-cpu.yaml --set mode=colocated --set model.device=cuda "
                          "--set model.path=%s/model --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "
                          "--set rollout.samples_per_prompt=4 --set rollout.batch_size=3 "
                          "--set algorithm.micro_batch_size=5 --set algorithm.timestep_selection='first_fraction 0.5' "
                          "--set logging.run_dir=%s/p 2>&1",
                      bin, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity on the emulated device failed: %s", out);
    CHECK_MSG(strstr(out, "PASS") && strstr(out, "model.device cuda (emulated)"), "got: %s", out);
    CHECK(strstr(out, "EMULATED device") != NULL); /* every process says it is not a GPU */
    snprintf(p, sizeof p, "%s/p/parity.json", dir);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    REQUIRE(j);
    CHECK(json_is_true(json_object_get(j, "pass")));
    CHECK(json_real_value(json_object_get(j, "max_abs_dlogp")) == 0.0);
    CHECK(json_real_value(json_object_get(j, "max_abs_dv")) == 0.0);
    CHECK(json_array_size(json_object_get(j, "steps")) == 2);
    CHECK(!strcmp(json_string_value(json_object_get(j, "device")), "cuda (emulated)"));
    json_decref(j);
    snprintf(p, sizeof p, "%s/p/logs/worker-0.log", dir);
    CHECK(test_run(out, sizeof out, "grep -q 'EMULATED device' %s", p) == 0);
}

TEST(dev_run_checkpoint_and_resume_exact) {
    const char *dir = test_tmpdir();
    char out[16384], a[700], b[700];
    make_model(dir);
    int st = run_local(dir, "store", "cuda", "--steps 2", out, sizeof out);
    if (st) test_fail(__FILE__, __LINE__, "device run failed: %s", out);
    REQUIRE(st == 0);
    CHECK_MSG(strstr(out, "EMULATED device") && strstr(out, "model.device cuda (emulated)"), "got: %s", out);
    REQUIRE(run_local(dir, "ckpt", "cuda", "--steps 2 --set algorithm.activations=checkpoint", out, sizeof out) == 0);
    REQUIRE(run_local(dir, "recomp", "cuda", "--steps 2 --set algorithm.activations=recompute", out, sizeof out) == 0);
    REQUIRE(run_local(dir, "cpu", "cpu", "--steps 2", out, sizeof out) == 0);
    json_t *s[4], *k[4], *r[4], *c[4];
    REQUIRE(rows_of(dir, "store", s, 4) == 3 && rows_of(dir, "ckpt", k, 4) == 3 && rows_of(dir, "recomp", r, 4) == 3 &&
            rows_of(dir, "cpu", c, 4) == 3);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(json_equal(s[i], k[i]), "row %d: checkpoint activations differ from store", i);
        CHECK_MSG(json_equal(s[i], r[i]), "row %d: recompute activations differ from store", i);
        if (i < 2) {
            CHECK_MSG(num(s[i], "log_prob_mean_abs_diff") == 0.0, "device step %d: |dlogp| %g", i,
                      num(s[i], "log_prob_mean_abs_diff"));
            CHECK(num(s[i], "grad_norm") != num(c[i], "grad_norm")); /* bf16: not the CPU's numbers */
        }
    }
    for (int i = 0; i < 3; i++) json_decref(s[i]), json_decref(k[i]), json_decref(r[i]), json_decref(c[i]);
    /* resume: 4 straight steps vs 2 (store's folder) + 2 resumed */
    REQUIRE(run_local(dir, "straight", "cuda", "", out, sizeof out) == 0);
    snprintf(a, sizeof a, "--resume %s/store/checkpoint-2", dir);
    st = run_local(dir, "store", "cuda", a, out, sizeof out);
    if (st) test_fail(__FILE__, __LINE__, "resume failed: %s", out);
    json_t *x[6], *y[6];
    const int nx = rows_of(dir, "straight", x, 6), ny = rows_of(dir, "store", y, 6);
    CHECK(nx == 5 && ny == 5);
    for (int i = 0; i < nx && i < ny; i++)
        CHECK_MSG(json_equal(x[i], y[i]), "row %d: resumed differs from straight", i);
    for (int i = 0; i < nx; i++) json_decref(x[i]);
    for (int i = 0; i < ny; i++) json_decref(y[i]);
    const char *files[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors"};
    for (int f = 0; f < 2; f++) {
        snprintf(a, sizeof a, "%s/straight/checkpoint-4/%s", dir, files[f]);
        snprintf(b, sizeof b, "%s/store/checkpoint-4/%s", dir, files[f]);
        CHECK_MSG(same_file(a, b), "%s differs between the straight and the resumed run", files[f]);
    }
}

/* mode: colocated (trainer, rollout worker and reward server as processes, weights synced over the wire each step)
 * equals mode: local on the device bit for bit, with the EMA's eval weights pushed and pushed back. */
TEST(dev_run_colocated_equals_local) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    const char *x = "--steps 2 --set checkpoint.every=-1 --set algorithm.ema_decay=0.9";
    char y[256];
    snprintf(y, sizeof y, "%s --set mode=colocated", x);
    int st = run_local(dir, "local", "cuda", x, out, sizeof out);
    if (!st) st = run_local(dir, "coloc", "cuda", y, out, sizeof out);
    if (st) test_fail(__FILE__, __LINE__, "device runs failed: %s", out);
    REQUIRE(st == 0);
    char path[700];
    json_t *a[4], *b[4];
    snprintf(path, sizeof path, "%s/local/metrics.jsonl", dir);
    const int na = read_rows(path, a, 4, 1);
    snprintf(path, sizeof path, "%s/coloc/metrics.jsonl", dir);
    const int nb = read_rows(path, b, 4, 1);
    CHECK(na == 3 && nb == 3);
    for (int i = 0; i < na && i < nb; i++) CHECK_MSG(json_equal(a[i], b[i]), "row %d: colocated differs from local", i);
    for (int i = 0; i < nb; i++) json_decref(b[i]);
    /* the weight sync: the policy's by IPC from the trainer's device master (one host), the EMA's in buckets; a worker
     * whose device refuses the handles (VGRPO_EMULATE_IPC=refuse) answers ipc_refused and gets buckets, same rows */
    char grep[64];
    CHECK(test_run(grep, sizeof grep, "grep -c 'applied (by IPC' %s/coloc/logs/worker-0.log", dir) == 0 && atoi(grep) >= 2);
    CHECK(test_run(grep, sizeof grep, "grep -c 'applied (in buckets' %s/coloc/logs/worker-0.log", dir) == 0 &&
          atoi(grep) >= 1);
    snprintf(y, sizeof y, "%s --set mode=colocated", x);
    st = test_run(out, sizeof out, "VGRPO_EMULATE_IPC=refuse " EMU "OMP_NUM_THREADS=1 %s run recipes/tiny-cpu.yaml "
                  "--set model.device=cuda --set model.path=%s/model --set logging.run_dir=%s/refuse " SMALL " %s 2>&1",
                  test_vgrpo_bin(), dir, dir, y);
    CHECK_MSG(st == 0 && strstr(out, "worker-0 cannot take the weights by IPC (weights_begin: the IPC handle of "
                                     "transformer: emulated device: ipc_open refused"), "%s", out);
    test_run(grep, sizeof grep, "grep -c 'applied (by IPC' %s/refuse/logs/worker-0.log", dir);
    CHECK_MSG(grep[0] == '0', "a refusing worker took IPC syncs: %s", grep);
    snprintf(path, sizeof path, "%s/refuse/metrics.jsonl", dir);
    const int nr = read_rows(path, b, 4, 1);
    CHECK(nr == 3);
    for (int i = 0; i < na && i < nr; i++) CHECK_MSG(json_equal(a[i], b[i]), "row %d: after ipc_refused differs", i);
    for (int i = 0; i < na; i++) json_decref(a[i]);
    for (int i = 0; i < nr; i++) json_decref(b[i]);
}

/* LoRA on the device (model.lora.rank 8, every linear): the adapter trains on the device (its fp32 master and moments
 * there, the base a frozen bf16 copy, the KL reference the same model with the adapter off); on-policy |dlogp| 0; a
 * resumed run (2 + 2 steps) equals a straight one (metrics, the adapter and optimizer files); vgrpo parity exactly 0
 * with the adapters synced to a worker process; the base unchanged at the end. */
TEST(dev_run_lora) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], a[700], b[700];
    make_model(dir);
    const char *lora = "--set model.lora.rank=8";
    snprintf(a, sizeof a, "%s --steps 2", lora);
    int st = run_local(dir, "l2", "cuda", a, out, sizeof out);
    if (st) test_fail(__FILE__, __LINE__, "LoRA device run failed: %s", out);
    REQUIRE(st == 0);
    REQUIRE(run_local(dir, "l4", "cuda", lora, out, sizeof out) == 0);
    CHECK_MSG(strstr(out, "LoRA: base weights unchanged after 4 steps"), "got: %s", out);
    snprintf(a, sizeof a, "%s --resume %s/l2/checkpoint-2", lora, dir);
    st = run_local(dir, "l2", "cuda", a, out, sizeof out);
    if (st) test_fail(__FILE__, __LINE__, "LoRA resume failed: %s", out);
    json_t *x[6], *y[6];
    const int nx = rows_of(dir, "l4", x, 6), ny = rows_of(dir, "l2", y, 6);
    CHECK(nx == 5 && ny == 5);
    for (int i = 0; i < nx && i < ny; i++) {
        CHECK_MSG(json_equal(x[i], y[i]), "LoRA row %d: resumed differs from straight", i);
        if (i < 4) CHECK(num(x[i], "log_prob_mean_abs_diff") == 0.0);
        if (i > 0 && i < 4) CHECK(num(x[i], "kl") > 0); /* the reference: the adapter switched off */
    }
    for (int i = 0; i < nx; i++) json_decref(x[i]);
    for (int i = 0; i < ny; i++) json_decref(y[i]);
    const char *files[] = {"transformer/pytorch_lora_weights.safetensors", "optimizer.safetensors"};
    for (int f = 0; f < 2; f++) {
        snprintf(a, sizeof a, "%s/l4/checkpoint-4/%s", dir, files[f]);
        snprintf(b, sizeof b, "%s/l2/checkpoint-4/%s", dir, files[f]);
        CHECK_MSG(same_file(a, b), "%s differs between the straight and the resumed LoRA run", files[f]);
    }
    /* parity at the trained adapters, synced to the worker */
    st = test_run(out, sizeof out,
                  EMU "%s parity recipes/tiny-cpu.yaml --set model.device=cuda --set model.path=%s/model "
                      "--set logging.run_dir=%s/l4 " SMALL " %s --checkpoint %s/l4/checkpoint-4 2>&1",
                  bin, dir, dir, lora, dir);
    if (st) test_fail(__FILE__, __LINE__, "LoRA parity on the emulated device failed: %s", out);
    CHECK_MSG(strstr(out, "PASS") && strstr(out, "(LoRA adapters)"), "got: %s", out);
}

/* The 10-step run of the GPU check's band, here on the emulated device: the final eval of the device run within 2
 * standard errors of the difference of the CPU run's (same seed, same initial weights; the bf16 rounding changes the
 * samples and so the updates, so the two runs are two draws of the same learning process, not one). */
TEST(dev_run_10_steps_vs_cpu) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    const char *ten = "--set optim.total_steps=10 --set rollout.samples_per_prompt=8 --set rollout.batch_size=16 "
                      "--set algorithm.micro_batch_size=16 --set algorithm.beta=0 "
                      "--set data.eval_samples_per_prompt=2 --set checkpoint.every=-1";
    REQUIRE(run_local(dir, "cpu", "cpu", ten, out, sizeof out) == 0);
    int st = run_local(dir, "dev", "cuda", ten, out, sizeof out);
    if (st) test_fail(__FILE__, __LINE__, "device run failed: %s", out);
    json_t *c[12], *d[12];
    const int nc = rows_of(dir, "cpu", c, 12), nd = rows_of(dir, "dev", d, 12);
    REQUIRE(nc == 11 && nd == 11);
    double rc = 0, rd = 0;
    for (int i = 0; i < 10; i++) {
        rc += num(c[i], "reward/mean") / 10, rd += num(d[i], "reward/mean") / 10;
        CHECK(num(d[i], "log_prob_mean_abs_diff") == 0.0);
    }
    const double m0c = num(c[0], "eval/color_match/mean"), m0d = num(d[0], "eval/color_match/mean");
    const double mc = num(c[10], "eval/color_match/mean"), md = num(d[10], "eval/color_match/mean");
    const double sc = num(c[10], "eval/color_match/se"), sd = num(d[10], "eval/color_match/se");
    const double se = sqrt(sc * sc + sd * sd);
    printf("  eval color_match: step 0 cpu %.4f device %.4f; step 10 cpu %.4f +- %.4f, device %.4f +- %.4f: |diff| "
           "%.4f = %.2f se_diff (band 2); mean training reward cpu %.4f device %.4f\n",
           m0c, m0d, mc, sc, md, sd, fabs(md - mc), fabs(md - mc) / se, rc, rd);
    CHECK(isfinite(md) && isfinite(mc) && se > 0);
    CHECK(fabs(m0d - m0c) <= 0.1 * num(c[0], "eval/color_match/se")); /* the same weights: bf16 rounding only */
    CHECK(fabs(md - mc) <= 2.0 * se);
    for (int i = 0; i < nc; i++) json_decref(c[i]);
    for (int i = 0; i < nd; i++) json_decref(d[i]);
}

TEST(dev_eval_and_refusals) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384];
    make_model(dir);
    /* eval with the workers' DiT on the device: results independent of the worker count there too */
    for (int w = 1; w <= 2; w++) {
        int st = test_run(out, sizeof out,
                          EMU "%s eval recipes/tiny-cpu.yaml --set model.device=cuda --set model.path=%s/model "
                              "--set data.eval_samples_per_prompt=1 --set rollout.num_steps=4 --workers %d "
                              "--set rollout.batch_size=%d --out %s/eval%d 2>&1",
                          bin, dir, w, w == 1 ? 4 : 1, dir, w);
        if (st) test_fail(__FILE__, __LINE__, "eval on the emulated device failed: %s", out);
    }
    json_t *ev[2];
    for (int w = 0; w < 2; w++) {
        char p[700];
        json_error_t e;
        snprintf(p, sizeof p, "%s/eval%d/eval.json", dir, w + 1);
        ev[w] = json_load_file(p, 0, &e);
        REQUIRE(ev[w]);
    }
    const json_t *s1 = json_object_get(json_object_get(ev[0], "stats"), "color_match");
    CHECK(s1 && json_equal(s1, json_object_get(json_object_get(ev[1], "stats"), "color_match")));
    json_decref(ev[0]), json_decref(ev[1]);
    const char *tiny = "recipes/tiny-cpu.yaml --dry-run --set model.device=cuda";
    CHECK(test_run(out, sizeof out, "%s run %s --set model.lora.rank=12 2>&1", bin, tiny) == 1);
    CHECK_MSG(strstr(out, "model.lora.rank: 12 is not a multiple of 8"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run %s --set model.lora.rank=8 --set algorithm.ema_decay=0.9 2>&1", bin, tiny) ==
          1);
    CHECK_MSG(strstr(out, "algorithm.ema_decay: an EMA of LoRA adapters on model.device cuda"), "got: %s", out);
    CHECK(test_run(out, sizeof out,
                   "%s run recipes/tiny-cpu.yaml --dry-run --set algorithm.activations=checkpoint 2>&1", bin) == 1);
    CHECK_MSG(strstr(out, "algorithm.activations: checkpoint"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run %s --set algorithm.activations=checkpoint >/dev/null 2>&1", bin, tiny) ==
          0);
    /* a device smaller than the estimate: refused before anything is allocated there, naming the keys */
    CHECK(test_run(out, sizeof out,
                   EMU "VGRPO_EMULATE_DEVICE_MIB=8 %s run recipes/tiny-cpu.yaml --set model.device=cuda "
                       "--set model.path=%s/model --set logging.run_dir=%s/small 2>&1",
                   bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "exceeds the 8.0 MiB free on the device") && strstr(out, "algorithm.micro_batch_size") &&
                  strstr(out, "algorithm.activations checkpoint"),
              "got: %s", out);
}
