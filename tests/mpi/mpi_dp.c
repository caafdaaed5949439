/* tests/mpi/mpi_dp.c — data parallelism over trainer ranks (trainer/dp/dp.h), case "dp": every rank builds the same
 * tiny Wan model and the same GRPO batch (8 samples x 4 steps, rolled out with the engine, rewards fixed), then
 *   reference: the whole batch through trainer_accumulate on one rank (what a single trainer rank computes);
 *   dp:        this rank's contiguous share (dp_share) with the whole batch's denominator
 *              (trainer_count_transitions), the gradients all-reduced over the world and the statistics summed
 *              (dp_grad_reduce);
 * and checks the reduced gradient against the reference: relative L2 <= 1e-6 (measured 1.6e-7 on 2 ranks): the same
 * terms summed in another order (micro-batches cut at other transitions, then the ranks' partial sums added by the
 * all-reduce), so only fp32 summation order differs; the statistics' transition count and loss equal; and a batch
 * broadcast from rank 0 (dp_batch_broadcast) arriving bit for bit, full trajectories and stored ranges (an SDE window
 * trimmed to latents[1 .. 3], with and without the step means). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/mpi/mpi_cases.h"
#include "trainer/dp/dp.h"
#include "trainer/step/grpo.h"
#include "trainer/step/train_step.h"

#define DN 8 /* samples */
#define DG 4 /* group size */
#define DL 4 /* text tokens */
#define DSTEPS 4

/* A copy of src (through its stored form) trained on steps 1..2 only, with the step means (deterministic values)
 * when with_means, trimmed to latents[1 .. 3] when trim. */
static int window_copy(core_traj *dst, const core_traj *src, int with_means, int trim) {
    core_traj_fields f;
    if (core_traj_to_fields(src, &f)) return -1;
    int rc = core_traj_from_fields(dst, f.n_tensors, f.tensor_names, f.tensors, f.n_meta, f.meta_keys,
                                   (const char *const *)f.meta_values, "copy");
    core_traj_fields_free(&f);
    if (rc) return -1;
    for (int i = 0; i < dst->n_steps; i++)
        if (i < 1 || i > 2) dst->has_log_prob[i] = 0, dst->log_probs[i] = 0;
    if (with_means) {
        if (core_traj_alloc_means(dst)) return -1;
        const int64_t n = (int64_t)(dst->n_latents - 1) * core_traj_latent_numel(dst);
        for (int64_t k = 0; k < n; k++) dst->means[k] = 0.001f * (float)k - (float)dst->uid;
    }
    return trim ? core_traj_trim(dst, 1, 3) : 0;
}

int mpi_case_dp(sp_comm *world, int argc, char **argv) {
    (void)argc, (void)argv;
    wan_config c;
    if (wan_config_preset(&c, "tiny")) return fprintf(stderr, "%s\n", core_last_error()), 1;
    wan_model m;
    if (wan_model_init(&m, &c) || wan_model_alloc_grads(&m)) return fprintf(stderr, "%s\n", core_last_error()), 1;
    wan_params_init_random(&m, 5);
    const int td = c.text_dim;
    float *emb = malloc(sizeof(float) * 2 * DL * td);
    const float *cond[DN];
    uint64_t uids[DN];
    int64_t pidx[DN];
    MCHECK(emb && !wan_word_embed("a red ball", DL, td, emb) && !wan_word_embed("blue sky", DL, td, emb + DL * td),
           "embeddings");
    for (int s = 0; s < DN; s++) cond[s] = emb + (s / DG) * DL * td, uids[s] = 40 + s, pidx[s] = s / DG;
    rollout_config rc;
    const int64_t shape[4] = {c.in_channels, 2, 4, 4};
    core_traj tr[DN];
    MCHECK(!rollout_config_init(&rc, DSTEPS, 3.0, 0.8f, 4.5f, shape, DL, 77, DN), "rollout config");
    rollout_experts ex = rollout_one_expert(&m);
    MCHECK(!rollout_generate(&rc, &ex, NULL, DN, cond, uids, pidx, tr), "rollout: %s", core_last_error());
    const float rewards[DN] = {0.1f, 0.9f, 0.3f, 0.6f, 0.2f, 0.2f, 0.8f, 0.4f};
    float adv[DN];
    uint8_t mask[DN];
    MCHECK(!grpo_advantages(rewards, 2, DG, GRPO_STD_GROUP, 5.0f, adv, mask, NULL), "advantages");
    if (mpi_test_failures()) return 1;

    /* The batch broadcast arrives bit for bit. */
    dp_batch db = {.n = DN, .traj = tr, .adv = adv, .mask = mask};
    if (world->rank > 0) memset(&db, 0, sizeof db);
    MCHECK(!dp_batch_broadcast(world, &db), "broadcast: %s", core_last_error());
    const int64_t nl = core_traj_latent_numel(&tr[0]);
    for (int s = 0; world->rank > 0 && s < DN && db.traj; s++) {
        MCHECK(db.traj[s].uid == tr[s].uid && db.traj[s].n_steps == DSTEPS, "sample %d header", s);
        MCHECK(!memcmp(db.traj[s].latents, tr[s].latents, sizeof(float) * (size_t)(nl * (DSTEPS + 1))), "sample %d latents", s);
        MCHECK(!memcmp(db.traj[s].log_probs, tr[s].log_probs, sizeof(float) * DSTEPS), "sample %d log-probs", s);
        MCHECK(db.adv[s] == adv[s] && db.mask[s] == mask[s], "sample %d advantage", s);
    }
    if (world->rank > 0) dp_batch_free(&db);

    /* Stored ranges: samples 0..5 trimmed (even ones with means), 6 full with means, 7 full without. */
    core_traj win[DN];
    memset(win, 0, sizeof win);
    for (int s = 0; s < DN; s++)
        MCHECK(!window_copy(&win[s], &tr[s], s % 2 == 0 || s == 6, s < 6), "window %d: %s", s, core_last_error());
    dp_batch wb = {.n = DN, .traj = win, .adv = adv, .mask = mask};
    if (world->rank > 0) memset(&wb, 0, sizeof wb);
    MCHECK(!dp_batch_broadcast(world, &wb), "broadcast of stored ranges: %s", core_last_error());
    for (int s = 0; world->rank > 0 && s < DN && wb.traj; s++) {
        const core_traj *a = &win[s], *g = &wb.traj[s];
        const size_t M = (size_t)a->n_latents;
        MCHECK(g->latent_first == a->latent_first && g->n_latents == a->n_latents && g->n_steps == DSTEPS,
               "window %d range [%d, +%d]", s, g->latent_first, g->n_latents);
        MCHECK(!memcmp(g->latents, a->latents, sizeof(float) * M * (size_t)nl), "window %d latents", s);
        MCHECK(!a->means == !g->means, "window %d means present", s);
        if (a->means && g->means)
            MCHECK(!memcmp(g->means, a->means, sizeof(float) * (M - 1) * (size_t)nl), "window %d means", s);
        MCHECK(!memcmp(g->has_log_prob, a->has_log_prob, DSTEPS) && !memcmp(g->log_probs, a->log_probs, 4 * DSTEPS),
               "window %d log-probs", s);
        MCHECK(!core_traj_validate(g, "received"), "window %d: %s", s, core_last_error());
    }
    MCHECK(win[0].n_latents == 3 && win[0].means && !win[1].means && win[6].n_latents == DSTEPS + 1, "windows built");
    if (world->rank > 0) dp_batch_free(&wb);
    for (int s = 0; s < DN; s++) core_traj_free(&win[s]);

    trainer_config tc = {.seed = 3, .clip_eps = 0.2f, .beta = 0, .micro_batch_size = 3, .acts_mode = WAN_ACTS_STORE};
    MCHECK(!grpo_selection_parse("all", &tc.sel), "selection");
    trainer_batch full = {.n = DN, .traj = tr, .cond = cond, .text_len = DL, .adv = adv, .mask = mask};
    /* reference: one rank, whole batch */
    const int64_t np = m.layout.numel;
    float *ref = malloc(sizeof(float) * (size_t)np);
    wan_model_zero_grads(&m);
    grpo_loss_stats st_ref = {0};
    MCHECK(!trainer_accumulate(&m, NULL, NULL, &tc, &full, 1, &st_ref), "reference: %s", core_last_error());
    memcpy(ref, m.grads, sizeof(float) * (size_t)np);
    /* dp: this rank's share, global denominator, all-reduce */
    int lo, hi;
    dp_share(DN, world->rank, world->size, &lo, &hi);
    trainer_batch sub = full;
    MCHECK(!trainer_count_transitions(&tc, &full, 1, NULL, &sub.denom), "count");
    MCHECK(sub.denom == DN * DSTEPS, "denominator %lld", (long long)sub.denom);
    sub.n = hi - lo, sub.traj += lo, sub.cond += lo, sub.adv += lo, sub.mask += lo;
    wan_model_zero_grads(&m);
    grpo_loss_stats st = {0};
    MCHECK(!trainer_accumulate(&m, NULL, NULL, &tc, &sub, 1, &st), "share: %s", core_last_error());
    wan_model *pol[1] = {&m};
    dp_reduce_ctx red = {.grads = world, .stats = world};
    MCHECK(!dp_grad_reduce(&red, pol, 1, NULL, &st), "reduce: %s", core_last_error());
    double num = 0, den = 0;
    for (int64_t k = 0; k < np; k++) {
        const double d = (double)m.grads[k] - ref[k];
        num += d * d, den += (double)ref[k] * ref[k];
    }
    const double rel = sqrt(num / den);
    MCHECK(den > 0 && rel <= 1e-6, "reduced gradient vs one rank: relative L2 %.3g", rel);
    MCHECK(st.n_transitions == st_ref.n_transitions, "transitions %lld vs %lld", (long long)st.n_transitions,
           (long long)st_ref.n_transitions);
    MCHECK(fabs(st.loss - st_ref.loss) <= 1e-9 * (1 + fabs(st_ref.loss)), "loss %.9g vs %.9g", st.loss, st_ref.loss);
    if (world->rank == 0) printf("dp %d ranks: reduced gradient vs one rank: relative L2 %.3g\n", world->size, rel);
    for (int s = 0; s < DN; s++) core_traj_free(&tr[s]);
    free(ref), free(emb);
    wan_model_free(&m);
    return mpi_test_failures() ? 1 : 0;
}
