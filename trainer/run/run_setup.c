/* trainer/run/run_setup.c — what the trainer's jobs set up before the first step: the recipe checks that need no weights
 * (trainer_check_recipe, also `vgrpo run --dry-run`), the parallel layout, the experts (policy, KL reference, Adam
 * state), the prompts and their conditioning (model/text/text_cond.h: the same bytes a rollout worker computes), and
 * the training config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/gpu_assign.h"
#include "kernels/cuda/k_cuda.h"
#include "model/flow/flow.h"
#include "model/flow/guidance.h"
#include "model/text/text_cond.h"
#include "model/text/word_embed.h"
#include "reward/learned.h"
#include "reward/scorers.h"
#include "sp/comm_nccl.h"
#include "trainer/budget/budget.h"
#include "trainer/step/grpo.h"
#include "trainer/run/images.h"
#include "trainer/optim/lora.h"
#include "trainer/run/run_internal.h"
#include "trainer/dp/dp_dev.h"
#include "trainer/dp/zero.h"

double trainer_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int trainer_optim_config(const core_recipe *r, optim_config *oc) {
    memset(oc, 0, sizeof *oc);
    oc->lr = r->lr, oc->beta1 = r->beta1, oc->beta2 = r->beta2, oc->eps = r->eps, oc->weight_decay = r->weight_decay;
    oc->max_grad_norm = r->max_grad_norm;
    oc->schedule = r->choice.schedule == CORE_SCHED_LINEAR   ? OPTIM_SCHED_LINEAR
                   : r->choice.schedule == CORE_SCHED_COSINE ? OPTIM_SCHED_COSINE
                                                             : OPTIM_SCHED_CONSTANT;
    oc->warmup_steps = r->warmup_steps;
    oc->total_steps = r->total_steps * r->optimizer_steps_per_rollout;
    return optim_config_validate(oc);
}

int trainer_check_prompts(const core_recipe *r, const core_prompts *p) {
    int need_color = 0;
    for (int i = 0; i < r->scorers.n; i++) need_color |= !strcmp(r->scorers.v[i], "color_match");
    const int words = r->choice.text_encoder == CORE_TEXT_WORD_EMBED;
    for (int i = 0; i < p->n; i++) {
        int n = wan_word_count(p->text[i]), c;
        char at[4200];
        if (words && n > r->text_len)
            return core_error("%s: the prompt \"%s\" has %d words, more than rollout.text_len %d",
                              core_prompts_where(p, i, at, sizeof at), p->text[i], n, r->text_len);
        if (need_color) {
            const char *col = json_string_value(json_object_get(p->meta[i], "color"));
            const char *keys[1] = {"color"}, *vals[1] = {col};
            reward_meta md = {col ? 1 : 0, keys, vals};
            if (reward_target_color(p->text[i], &md, &c))
                return core_error_push("%s (color_match): ", core_prompts_where(p, i, at, sizeof at));
        }
    }
    return 0;
}

/* At least one trainable transition per sample, computed as the trainer will: the flow schedule's SDE steps (a
 * log-prob exists where step_std > 0, so never with rollout.eta 0; a forward-process objective takes every step),
 * each routed to its expert, the frozen ones left out, then the timestep selection. The number of experts is whether model.path has transformer_2/, or where it has no
 * transformer yet the preset's (budget_transformer_config; no weights read). */
static int check_trainable(const core_recipe *r, const grpo_selection *sel, const sde_window *win, int *second) {
    const int N = r->num_steps;
    *second = -1;
    float *sig = malloc(sizeof(float) * (size_t)(N + 1)), *ts = malloc(sizeof(float) * (size_t)(N + 1));
    uint8_t *has = malloc(2 * (size_t)N), *ex = malloc((size_t)N);
    int rc = -1;
    if (!sig || !ts || !has || !ex) {
        core_error("out of memory");
        goto done;
    }
    if (flow_schedule(N, r->shift, sig, ts)) goto done;
    char t2[4200];
    snprintf(t2, sizeof t2, "%s/transformer/config.json", r->model_path);
    int n_experts = 1;
    if (access(t2, R_OK)) { /* no pipeline yet (a dry run without weights): the experts of the preset the estimate
                               takes, the one model.init_preset would write or the folder's name names */
        wan_config pc;
        if (budget_transformer_config(r, &pc, &n_experts, NULL, 0) < 0) goto done;
    } else {
        snprintf(t2, sizeof t2, "%s/transformer_2", r->model_path);
        n_experts = core_is_dir(t2) ? 2 : 1;
    }
    const uint8_t trained[2] = {core_recipe_trains_expert(r, 0), n_experts == 2 && core_recipe_trains_expert(r, 1)};
    const int fp = core_recipe_forward_process(r); /* every step is a candidate: no log-prob needed */
    int any = 0;
    for (int i = 0; i < N; i++) {
        flow_step st;
        if (flow_step_init_kind(&st, trainer_flow_kind(r), sig[i], sig[i + 1], sig[1], r->eta)) goto done;
        has[i] = (uint8_t)(st.has_std || fp);
        ex[i] = (uint8_t)(n_experts == 2 ? flow_expert(ts[i], r->boundary_ratio) : 0);
        if (ex[i] && *second < 0) *second = i;
        any |= has[i];
    }
    if (!any) {
        core_error("rollout.eta: %g gives no SDE step, so no log-prob to train on (eta 0 is the ODE sampler: use it for "
                   "eval, data.eval_eta)", (double)r->eta);
        goto done;
    }
    int64_t count;
    if (!trained[0] && !trained[1]) {
        core_error("algorithm.train_experts: %s, but %s has one expert (no transformer_2/)", r->train_experts,
                   r->model_path);
        goto done;
    }
    if (win->size == 0) {
        if (grpo_count_transitions_experts(sel, N, has, ex, 0, 1, trained, n_experts, &count)) goto done;
    } else { /* every window position (the random draws' and the progressive schedule's) must have a trained step */
        for (int lo = win->lo; lo + win->size <= win->hi; lo++) {
            uint8_t *h = has + N; /* has holds N more bytes: the window's mask */
            for (int i = 0; i < N; i++) h[i] = (uint8_t)(has[i] && i >= lo && i < lo + win->size);
            if (grpo_count_transitions_experts(sel, N, h, ex, 0, 1, trained, n_experts, &count)) {
                core_error_push("rollout.sde_window: the window at steps %d..%d: ", lo, lo + win->size - 1);
                goto done;
            }
        }
    }
    rc = 0;
done:
    free(sig), free(ts), free(has), free(ex);
    return rc;
}

/* model.lora: the targets by name and the rank against the transformer's linears (its config.json, or the preset a
 * dry run would use: trainer/budget/budget.h), without weights. */
static int check_lora(const core_recipe *r) {
    wan_lora_config lc;
    wan_config c;
    if (r->lora_rank < 1) return 0;
    const int found = budget_transformer_config(r, &c, NULL, NULL, 0);
    if (found < 0) return -1;
    return trainer_lora_config(r, found == 0 ? &c : NULL, &lc) < 0 ? -1 : 0;
}

/* model.device cuda: data parallelism and ZeRO over trainer ranks (trainer/dp/dp_dev.h); what is not there yet is
 * refused. */
static int check_device(const core_recipe *r) {
    if (r->choice.device != CORE_CUDA) return 0;
    core_gpu_plan gp; /* who runs on which GPU (core/gpu_assign.h): an impossible assignment is refused here */
    if (core_gpu_plan_make(r, core_gpu_visible(), &gp)) return -1;
    if (r->lora_rank % 8)
        return core_error("model.lora.rank: %d is not a multiple of 8, which model.device cuda needs (cuBLASLt's leading "
                          "dimensions)", r->lora_rank);
    if (r->lora_rank > 0 && r->ema_decay > 0)
        return core_error("algorithm.ema_decay: an EMA of LoRA adapters on model.device cuda is not implemented yet "
                          "(0 with model.lora.rank %d)", r->lora_rank);
    return 0;
}

/* The checks of trainer_check_recipe that read no file; *second: the first rollout step that runs transformer_2
 * (-1: none; check_experts). */
static int check_settings(const core_recipe *r, int *second) {
    grpo_selection sel;
    if (grpo_selection_parse(r->timestep_selection, &sel) || grpo_selection_validate(&sel, r->num_steps)) return -1;
    sde_window win;
    if (sde_window_from_recipe(r, &win) || check_trainable(r, &sel, &win, second) || check_lora(r) || check_device(r))
        return -1;
    for (int i = 0; i < r->gold_scorers.n; i++) {
        const reward_scorer *g = reward_find(r->gold_scorers.v[i]);
        if (!g) return core_error_push("guard.gold_scorers.%d: ", i);
        if (g->learned)
            return core_error("guard.gold_scorers.%d: %s is a learned scorer; gold scorers are the built-in pure ones "
                              "(the trainer loads no reward model)", i, g->name);
    }
    if (r->scorers.n > CORE_TRAJ_MAX_REWARDS) return core_error("reward.scorers: at most %d", CORE_TRAJ_MAX_REWARDS);
    /* the built-in scorers serve the in-process source and the reward server a job starts; an external
     * reward.endpoint serves its own list, checked against its hello reply at the start (trainer/run/scorers.c) */
    for (int i = 0; !r->reward_endpoint && i < r->scorers.n; i++)
        if (!reward_find(r->scorers.v[i])) return core_error_push("reward.scorers.%d: ", i);
    /* learned scorers: their folders (config, tokenizer, processor; no weights read; one not there yet is a warning
     * here, an error where a run or eval starts) and reward.frames */
    if (reward_recipe_check(r, 0)) return -1;
    optim_config oc;
    return trainer_optim_config(r, &oc);
}

/* Reads both prompt files (the recipe's limits) and checks them; on error nothing is left to free. */
static int read_prompts(const core_recipe *r, core_prompts *train, core_prompts *eval) {
    const core_prompts_limits lim = core_recipe_prompt_limits(r);
    memset(eval, 0, sizeof *eval);
    if (core_prompts_read_limited(train, r->prompt_file, &lim)) return -1;
    int bad = trainer_check_prompts(r, train);
    if (!bad && r->prompts_per_step > train->n)
        bad = core_error("rollout.prompts_per_step: %d distinct prompts per step, but %s has %d", r->prompts_per_step,
                         r->prompt_file, train->n);
    if (!bad) bad = core_prompts_read_limited(eval, r->eval_prompt_file, &lim) || trainer_check_prompts(r, eval);
    const core_prompts *lists[2] = {train, eval};
    if (!bad) bad = trainer_images_check(r, lists, 2, "data.prompt_file");
    if (!bad && core_recipe_forward_process(r) && train->n_images) /* refused at --dry-run too */
        bad = core_error("algorithm.loss: %s trains text to video only; data.prompt_file %s gives images (image to "
                         "video is not implemented for it yet)", r->loss, r->prompt_file);
    if (bad) core_prompts_free(train), core_prompts_free(eval);
    return bad ? -1 : 0;
}

/* After the prompts (whose image-to-video refusal comes first): Flow-DPO's pass trains one expert
 * (trainer/step/dpo_step.h), so a rollout that runs transformer_2 at some step (second >= 0: check_settings) is
 * refused here, not after the first rollout. */
static int check_experts(const core_recipe *r, int second) {
    if (r->choice.loss != CORE_LOSS_DPO || second < 0) return 0;
    return core_error("algorithm.loss: dpo trains one expert, but %s has two and the rollout runs transformer_2 from "
                      "step %d of %d on (timesteps below model.boundary_ratio %g x 1000): use grpo, grpo_guard or nft "
                      "with a two-expert model", r->model_path, second, r->num_steps, r->boundary_ratio);
}

int trainer_check_recipe(const core_recipe *r) {
    core_prompts train, eval;
    int second;
    if (check_settings(r, &second) || read_prompts(r, &train, &eval)) return -1;
    const int bad = check_experts(r, second);
    core_prompts_free(&train);
    core_prompts_free(&eval);
    return bad ? -1 : 0;
}

/* Every prompt's conditioning [n, L, td], contiguous so a sample's embedding is base + prompt index x L x td. */
static float *embed_prompts(text_cond *tc, const core_prompts *p, int64_t ne) {
    float *e = malloc(sizeof(float) * (size_t)p->n * (size_t)ne);
    if (!e) return core_error("out of memory"), NULL;
    for (int i = 0; i < p->n; i++) {
        const float *x;
        if (text_cond_embed(tc, p->text[i], &x)) return free(e), NULL;
        memcpy(e + (int64_t)i * ne, x, sizeof(float) * (size_t)ne);
    }
    return e;
}

/* The trainer ranks' layout (parallel.trainer_ranks = dp x sp, parallel.ulysses_degree), validated against the
 * transformer's config before any weights are read (sp_validate: heads % Ulysses degree, video tokens % sp), then
 * the groups: the dp group of this rank and, with sp > 1, the SP/Ulysses/ring groups of USP attention. */
static int setup_parallel(trainer_state *S, const core_recipe *r, const char *transformer_dir) {
    const int world = S->dp ? S->dp->size : 1, rank = S->dp ? S->dp->rank : 0;
    if (sp_topology_init(&S->topo, world, r->sp, r->ulysses_degree)) return -1;
    S->me = sp_topology_rank(&S->topo, rank);
    char cfgp[4300];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", transformer_dir);
    wan_config c;
    if (wan_config_load(&c, cfgp)) return -1;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int pt = c.patch_size[0], ph = c.patch_size[1], pw = c.patch_size[2];
    sp_attn_request req = {.num_heads = c.num_attention_heads,
                           .tokens = (int64_t)(F / pt) * (H / ph) * (W / pw)};
    if (sp_validate(world, r->sp, r->ulysses_degree, &req)) return -1;
    S->red.grads = S->dp;
    S->red.stats = S->dp;
    S->red.zero_stage = r->zero_stage;
    if (world == 1) return 0;
    /* model.device cuda: the device buffers move over the MPI world here, which the emulated device's host memory
     * allows; setup_device puts NCCL in its place on a GPU (trainer/dp/dp_dev.h) */
    if (r->choice.device == CORE_CUDA) S->red.dev = S->dp;
    int colour, key;
    if (sp_topology_colour(&S->topo, rank, SP_GROUP_DP, &colour, &key) ||
        sp_comm_split(S->dp, colour, key, "dp", &S->dpg))
        return core_error_push("trainer rank %d: dp group: ", rank);
    S->red.stats = S->dpg;
    if (r->sp > 1) {
        if (sp_usp_init(&S->usp, S->dp, &S->topo, NULL)) return -1;
        S->exec = (wan_exec){.ops = NULL, .attn_fwd = sp_usp_forward, .attn_bwd = sp_usp_backward, .attn_ctx = &S->usp,
                             .sp = S->usp.sp};
        S->ex = &S->exec;
    }
    return 0;
}

/* The experts of model.path: transformer/ and, when present, transformer_2/ (same config), with gradients, Adam
 * state and the reference (a copy of the initial weights: algorithm.beta > 0's KL, algorithm.loss dpo). With model.lora (trainer/optim/lora.h):
 * the base without gradients, and each trained expert's adapter (A from Philox with model.lora.init_seed and the
 * expert's index, B = 0: the policy equals the base bit for bit) with its gradients and Adam state. With
 * parallel.zero_stage 1 or 2 the Adam state is this rank's shard (trainer/dp/zero.h). */
static int load_experts(trainer_state *S, const core_recipe *r, const char *path0) {
    char path[4200];
    if (wan_model_load(&S->pol[0], path0)) return -1;
    S->n_experts = 1;
    snprintf(path, sizeof path, "%s/transformer_2", r->model_path);
    if (core_is_dir(path)) {
        if (wan_model_load(&S->pol[1], path)) return -1;
        if (!wan_config_equal(&S->pol[0].cfg, &S->pol[1].cfg))
            return core_error("model.path: %s/transformer and transformer_2 have different configs", r->model_path);
        S->n_experts = 2;
    }
    S->trained[0] = core_recipe_trains_expert(r, 0);
    S->trained[1] = S->n_experts == 2 && core_recipe_trains_expert(r, 1);
    if (r->choice.train_experts == CORE_EXPERTS_TRANSFORMER_2 && S->n_experts == 1)
        return core_error("algorithm.train_experts: transformer_2, but %s has one expert (no transformer_2/)", r->model_path);
    S->first = S->trained[0] ? 0 : 1;
    S->have_ref = r->beta > 0 || r->choice.loss == CORE_LOSS_DPO; /* dpo: its reference, the initial weights */
    const int lora = trainer_lora_config(r, &S->pol[0].cfg, &S->lc);
    if (lora < 0) return -1;
    S->lora_on = lora;
    if (TRAINER_BASE_HASHED(S)) { /* model.path's weights as loaded: checkpoints record it (trainer_resume) */
        const wan_model *mm[2] = {&S->pol[0], &S->pol[1]};
        if (wan_models_hash(mm, S->n_experts, &S->base_hash)) return -1;
    }
    if (lora) { /* a frozen base: no gradients, no moments, no reference copy; an adapter per trained expert */
        for (int e = 0; e < S->n_experts; e++) {
            if (!S->trained[e]) continue;
            if (wan_lora_init(&S->lora[e], &S->pol[e].cfg, &S->lc, e) || wan_lora_alloc_grads(&S->lora[e]) ||
                wan_model_attach_lora(&S->pol[e], &S->lora[e]) ||
                dp_zero_optim_init(&S->opt[e], S->lora[e].layout.numel, r->zero_stage, S->red.grads))
                return -1;
        }
        return 0;
    }
    for (int e = 0; e < S->n_experts; e++) {
        if ((!S->dx && wan_model_alloc_grads(&S->pol[e])) || /* on a device the gradients live there */
            dp_zero_optim_init(&S->opt[e], S->pol[e].layout.numel, r->zero_stage, S->red.grads))
            return -1;
        if (S->have_ref) {
            if (wan_model_init(&S->ref[e], &S->pol[e].cfg)) return -1;
            memcpy(S->ref[e].params, S->pol[e].params, sizeof(float) * (size_t)S->pol[e].layout.numel);
        }
    }
    return 0;
}

/* The conditioning of the training and eval prompts (read by trainer_setup; computed once; the negative prompt's
 * too). */
static int embed_all(trainer_state *S, const core_recipe *r) {
    const int td = S->pol[0].cfg.text_dim;
    S->ne = (int64_t)r->text_len * td;
    wan_dev_exec *tx = NULL; /* model.text_device auto with model.device cuda: umT5 on the device */
    if (core_recipe_text_on_device(r) && wan_dev_exec_open(r->device, &tx)) return -1;
    text_cond *tc = text_cond_load(r->choice.text_encoder, r->model_path, r->text_len, td, tx ? wan_dev_exec_ops(tx) : NULL);
    if (!tc) return wan_dev_exec_close(tx), -1;
    const float *neg = text_cond_negative(tc);
    int bad = !(S->emb_train = embed_prompts(tc, &S->train, S->ne)) || !(S->emb_eval = embed_prompts(tc, &S->eval, S->ne));
    if (!bad && neg && !(S->emb_neg = malloc(sizeof(float) * (size_t)S->ne))) bad = core_error("out of memory");
    if (!bad && neg) memcpy(S->emb_neg, neg, sizeof(float) * (size_t)S->ne);
    text_cond_free(tc);
    wan_dev_exec_close(tx);
    return bad ? -1 : 0;
}

/* Image to video: the prompts' image conditions (rank 0, which rolls out; trainer/run/images.h), set on the rollout source
 * (core/rollout_source.h). */
static int setup_images(trainer_state *S, const core_recipe *r) {
    if (!S->train.n_images || !S->src) return 0;
    const core_prompts *lists[2] = {&S->train, &S->eval};
    float *tab[2];
    const int64_t K = wan_cond_channels(&S->pol[0].cfg); /* I2V-A14B: concatenated channels */
    if (trainer_images_encode(r, S->shape[0], K, lists, 2, tab)) return -1;
    S->img_train = tab[0], S->img_eval = tab[1];
    S->src->images = (core_rollout_images){.train = S->img_train, .eval = S->img_eval, .n_train = S->train.n,
                                           .n_eval = S->eval.n, .shape = {S->shape[0], 1, S->shape[2], S->shape[3]},
                                           .numel = S->shape[0] * S->shape[2] * S->shape[3]};
    if (K) {
        const int64_t s[4] = {K, S->shape[1], S->shape[2], S->shape[3]};
        memcpy(S->src->images.shape, s, sizeof s);
        S->src->images.numel = K * S->shape[1] * S->shape[2] * S->shape[3];
    }
    return 0;
}

/* model.device cuda: the DiT runs through the device executor (the forwards and backwards of trainer/step/train_step.c),
 * the trained experts' master weights and moments live on the device and the optimizer step runs there
 * (trainer/optim/train_dev.h, as tc.opt_step); the KL reference's bf16 copy is uploaded once. */
static int setup_device(trainer_state *S) {
    const core_recipe *r = S->r;
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    optim_adamw *opt[2] = {&S->opt[0], &S->opt[1]};
    /* the estimate first (nothing allocated on the device yet): the one `vgrpo run --dry-run` prints */
    trainer_dev_budget bud;
    if (trainer_dev_estimate_recipe(r, &S->pol[0].cfg, S->n_experts, S->train.n_images > 0, 0, &bud)) return -1;
    t5_config t5; /* umT5 on the device at start-up (embed_all), freed by now: the estimate's start-up phase */
    char te[4200];
    snprintf(te, sizeof te, "%s/text_encoder", r->model_path);
    if (core_recipe_text_on_device(r) && t5_config_load(te, &t5)) return -1;
    trainer_dev_budget_text(&bud, r, core_recipe_text_on_device(r) ? &t5 : NULL, 0);
    if (trainer_dev_check_memory(S->dx, &bud, r->activations)) return -1;
    /* ZeRO stage 3 over several ranks: each rank's device holds its shard of the fp32 master (trainer/dp/dp_dev.h) */
    const int shard_master = r->zero_stage == 3 && S->red.grads && S->red.grads->size > 1;
    /* and with both experts trained, one window for the two (trainer/dp/dp_dev.h: the expert window) */
    const int window = shard_master && trainer_dev_expert_window(r, S->n_experts);
    if (window ? trainer_dev_init_window(&S->dev, S->dx, pol, S->trained, opt)
               : trainer_dev_init_sharded(&S->dev, S->dx, pol, S->n_experts, S->trained, opt, shard_master))
        return -1;
    if (window) {
        S->tc.expert_phase = dp_dev_expert_phase, S->tc.expert_phase_ctx = &S->red_dev;
        core_log_info("trainer rank %d: parallel.zero_stage 3: transformer and transformer_2 share one window on the "
                      "device (one bf16 copy, one gradient buffer; transformer's reduced shard waits in host memory)", S->dp->rank);
    }
    /* nothing reads the host params between steps when the rollouts run in process on the device copy and no EMA
     * averages them: the master's host copy only for checkpoints (trainer_dev_sync_host); a sharded master's host
     * copy is gathered every step (a collective the checkpoint's rank alone could not make) */
    S->dev.lazy_host = r->choice.mode == CORE_MODE_LOCAL && !(r->ema_decay > 0) && !core_recipe_forward_process(r) &&
                      !shard_master;
    for (int e = 0; e < S->n_experts && shard_master; e++)
        if (S->dev.trained[e])
            core_log_info("trainer rank %d: parallel.zero_stage 3: %s's fp32 master [%lld, %lld) of %lld on the device",
                          S->dp->rank, wan_expert_folder(e), (long long)S->dev.mlo[e],
                          (long long)(S->dev.mlo[e] + S->dev.mlen[e]), (long long)S->dev.numel[e]);
    for (int e = 0; e < S->n_experts && S->have_ref && !S->lora_on; e++)
        if (S->trained[e] && wan_dev_exec_sync(S->dx, &S->ref[e], 0)) return -1;
    S->exec = (wan_exec){.dev = S->dx};
    S->ex = &S->exec;
    S->tc.opt_step = trainer_dev_opt_step;
    S->tc.opt_step_ctx = &S->dev;
    /* several trainer ranks: the gradients and weights move between devices over NCCL (sp/comm_nccl.h: exact
     * rank-order sums unless parallel.reduce says nccl) on a GPU, and on the emulated device when VGRPO_NCCL_LIB
     * names a library (the tests' fake NCCL, tests/fake_nccl/); otherwise the emulated device's host memory moves over
     * the MPI world (setup_parallel) */
    if (S->red.dev && (!wan_dev_exec_emulating() || getenv("VGRPO_NCCL_LIB"))) {
        const sp_nccl_opts o = {.stream = k_cuda_stream(), .dev = wan_dev_exec_ops(S->dx),
                                .reduce = (sp_reduce_mode)r->choice.reduce};
        if (sp_comm_nccl_world(S->dp, &o, &S->nccl)) return core_error_push("trainer rank %d: ", S->dp->rank);
        S->red.dev = S->nccl;
        core_log_info("trainer rank %d: gradients and weights over NCCL %d (%s), parallel.reduce %s", S->dp->rank,
                      sp_nccl_version(), sp_nccl_lib_path(), r->reduce);
    }
    /* sequence parallelism on the device: the DiT's SP branches on its bf16 activations, the USP attention on the
     * device's table, every message over the comm that moves device buffers (setup_parallel's MPI groups on the
     * emulated device; groups split from the NCCL world on a GPU) */
    if (r->sp > 1) {
        sp_usp *u = &S->usp;
        if (S->nccl) {
            if (sp_usp_init(&S->usp_dev, S->nccl, &S->topo, wan_dev_exec_ops(S->dx)))
                return core_error_push("trainer rank %d: NCCL groups of sequence parallelism: ", S->dp->rank);
            u = &S->usp_dev;
        } else {
            S->usp.dev = wan_dev_exec_ops(S->dx);
        }
        S->exec.attn_fwd = sp_usp_forward, S->exec.attn_bwd = sp_usp_backward, S->exec.attn_ctx = u;
        S->exec.sp = u->sp;
    }
    if (dp_dev_shards(&S->red_dev, &S->red, &S->dev)) return -1; /* ZeRO over several ranks (trainer/dp/dp_dev.h) */
    if (S->red.dev && S->red.grads && S->red.grads->size > 1 && r->grad_bucket_mib > 0) { /* trainer/dp/dp_bucket.h */
        if (dp_buckets_init(&S->bk, &S->dev, S->red.grads, S->red.dev, S->red.zero_stage, r->grad_bucket_mib))
            return core_error_push("trainer rank %d: ", S->dp->rank);
        S->red_dev.bk = &S->bk;
    }
    return 0;
}

int trainer_setup(trainer_state *S, const core_recipe *r, sp_comm *dp) {
    char path[4200];
    S->r = r;
    S->dp = dp;
    S->rewards_fd = -1;
    /* every check that needs no weights, the prompt files read once (and kept) */
    int second;
    if (check_settings(r, &second) || read_prompts(r, &S->train, &S->eval) || check_experts(r, second) ||
        core_prompts_xxh64(&S->train, &S->data_xxh64))
        return -1;
    snprintf(path, sizeof path, "%s/transformer", r->model_path);
    struct stat sb;
    if (stat(path, &sb)) return core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run "
                                           "`vgrpo init-model --preset tiny --out DIR`)", path);
    if (setup_parallel(S, r, path) ||
        (r->choice.mode == CORE_MODE_COLOCATED && core_gpu_select(r, CORE_GPU_TRAINER, S->dp ? S->dp->rank : 0)) ||
        wan_dev_exec_open(r->device, &S->dx) || load_experts(S, r, path) ||
        trainer_optim_config(r, &S->oc) ||
        embed_all(S, r))
        return -1;
    if (wan_cond_kind(&S->pol[0].cfg) == WAN_COND_CONCAT && !S->train.n_images)
        return core_error("model.path: %s takes %d channels for %d out (Wan 2.2 I2V-A14B: latents, a 4-channel mask and "
                          "the condition video's latents): it needs prompt files with an image per prompt (JSON lines)",
                          path, S->pol[0].cfg.in_channels, S->pol[0].cfg.out_channels);
    if (trainer_sampler_init(&S->smp, S->train.n, r->prompts_per_step, (uint64_t)r->seed)) return -1;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    S->shape[0] = S->pol[0].cfg.out_channels, S->shape[1] = F, S->shape[2] = H, S->shape[3] = W;
    S->nl = S->shape[0] * F * H * W;
    if (setup_images(S, r)) return -1;
    memset(&S->tc, 0, sizeof S->tc);
    if (grpo_selection_parse(r->timestep_selection, &S->tc.sel)) return -1;
    S->tc.seed = (uint64_t)r->seed;
    S->tc.clip_eps = r->clip_range;
    S->tc.beta = r->beta;
    S->tc.micro_batch_size = r->micro_batch_size;
    S->tc.acts_mode = r->choice.activations == CORE_ACTS_RECOMPUTE    ? WAN_ACTS_RECOMPUTE
                      : r->choice.activations == CORE_ACTS_CHECKPOINT ? WAN_ACTS_CHECKPOINT
                                                                      : WAN_ACTS_STORE;
    S->tc.kind = trainer_flow_kind(r);
    S->tc.guard = r->choice.loss == CORE_LOSS_GRPO_GUARD;
    if (S->dx && setup_device(S)) return -1;
    /* same-host workers may copy synced weights out of the masters (not a sharded master: the sync then sends the
     * host copy, whole after every step) */
    if (S->dx && S->src && S->src->device_weights && !S->dev.master_sharded) {
        const wan_model *ex[2] = {&S->pol[0], &S->pol[1]};
        const void *bufs[2] = {S->dev.master[0], S->dev.master[1]};
        S->src->device_weights(S->src->ctx, wan_dev_exec_ops(S->dx), ex, bufs, S->dev.numel, S->n_experts);
    }
    /* a sharded master: NCCL syncs send the host copy through the device gradients of a trained expert, idle between
     * the optimizer step and the next accumulation (which zeroes them first); made now, as the estimate counts them */
    if (S->dx && S->src && S->src->sync_staging && S->dev.master_sharded) {
        const int e = S->dev.trained[0] ? 0 : 1;
        wan_dev_model *d = wan_dev_exec_model(S->dx, &S->pol[e]);
        if (!d || wan_dev_alloc_grads(d)) return core_error_push("trainer: the weight sync's staging: ");
        S->src->sync_staging(S->src->ctx, wan_dev_exec_ops(S->dx), d->grads, S->dev.numel[e] * (int64_t)sizeof(float));
    }
    return sde_window_from_recipe(r, &S->win);
}

flow_kind trainer_flow_kind(const core_recipe *r) {
    flow_kind k = {r->choice.sde_type == CORE_SDE_TYPE_CPS ? FLOW_CPS : FLOW_SDE,
                   r->choice.cps_logprob == CORE_CPS_LOGP_FLOW_GRPO ? FLOW_LOGP_FLOW_GRPO : FLOW_LOGP_EXACT};
    return k;
}

void trainer_rollout_settings(const trainer_state *S, int64_t round, core_rollout_request *req) {
    const core_recipe *r = S->r;
    req->sde_type = S->tc.kind.type == FLOW_CPS;
    req->logp_mode = S->tc.kind.logp == FLOW_LOGP_FLOW_GRPO;
    req->return_means = S->tc.guard && req->return_trajectories;
    if (S->win.size > 0) sde_window_of_round(&S->win, r->num_steps, round, &req->window_lo, &req->window_hi);
}

void trainer_teardown(trainer_state *S) {
    dp_buckets_free(&S->bk); /* its group and stream before the device's */
    if (S->dx) { /* the executor may outlive us (shared with the local source): our models' device copies go now */
        trainer_dev_free(&S->dev);
        for (int e = 0; e < 2; e++) {
            wan_dev_exec_forget(S->dx, &S->pol[e]);
            wan_dev_exec_forget(S->dx, &S->ref[e]);
            wan_dev_exec_forget(S->dx, &S->ema[e]);
        }
        sp_usp_free_workspace(&S->usp_dev), sp_usp_free_workspace(&S->usp); /* the USP attention's, on the device */
        wan_dev_exec_close(S->dx);
        S->dx = NULL;
    }
    for (int e = 0; e < 2; e++) {
        wan_model_free(&S->pol[e]); /* leaves the attached adapter: the trainer's own (wan_lora.h) */
        wan_model_free(&S->ema[e]);
        wan_model_free(&S->ref[e]);
        wan_lora_free(&S->lora[e]);
        wan_lora_free(&S->ema_lora[e]);
        optim_adamw_free(&S->opt[e]);
    }
    trainer_old_free(S);
    if (S->ex) sp_usp_release(&S->usp_dev), sp_usp_release(&S->usp);
    sp_comm_destroy(S->dpg);
    sp_comm_destroy(S->nccl);
    core_prompts_free(&S->train);
    core_prompts_free(&S->eval);
    trainer_sampler_free(&S->smp);
    free(S->emb_train), free(S->emb_eval), free(S->emb_neg), free(S->img_train), free(S->img_eval);
    core_metrics_close(S->metrics);
    if (S->rewards_fd >= 0) close(S->rewards_fd);
}
