/* trainer/run/run_files.c — the run folder of a GRPO run: config.resolved.yaml, metrics.jsonl and rewards.jsonl (rows
 * written whole or not at all: core/metrics.h), checkpoints (trainer/checkpoint/checkpoint.h) with the keys that may change on
 * resume, and --resume: a checkpoint's weights, Adam state, EMA, step counters and sampler position. The folders'
 * locks (one run per folder, core/run_lock.h: logging.run_dir and checkpoint.dir) are taken by the command that owns
 * the run (cli/cmd_run.c: trainer_claim_folders), which refuses a fresh run into a folder holding checkpoints unless
 * --overwrite. A fresh run (no --resume) replaces what an earlier run left in the folder: metrics, rewards and (with
 * --overwrite) its checkpoints. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/run/run_internal.h"
#include "trainer/dp/zero.h"

const char *const trainer_resume_free_keys[] = {
    "optim.total_steps",                /* a run may be extended (a linear/cosine lr then changes from there on) */
    "checkpoint.every", "checkpoint.dir", "checkpoint.total_limit",
    "logging.run_dir", "logging.eval_every", "logging.video_every", "logging.file_mode",
    "data.eval_prompt_file", "data.eval_samples_per_prompt", "data.eval_eta", /* eval only: never feeds training */
    "reward.endpoint", "reward.threads", "reward.timeout_s", "reward.max_attempts", /* where scoring runs */
    "rollout.batch_size",               /* trajectories do not depend on it (docs/design.md section 4) */
    "parallel.rollout_workers",         /* a sample does not depend on the worker that made it */
    "algorithm.activations",            /* store and recompute give bitwise-identical gradients */
    "data.max_prompt_file_mb", "data.max_prompt_bytes", /* limits on reading the prompt files, not their content */
    "limits.memory_mb", "limits.max_step_minutes",        /* start-up checks (trainer/budget/budget.h) */
    "guard.drift_warn_sd",              /* warning lines only */
    "guard.patience", "guard.patience_se", /* whether the run stops early: e.g. resume a stopped run with patience 0 */
    "parallel.zero_stage",              /* bit-identical at every stage; checkpoints hold the whole Adam state */
    "parallel.trainer_ranks",           /* nothing in a checkpoint depends on it; the run continues with the new
                                           count's split of the batch (its summation order) */
    "parallel.gpus", "parallel.share_gpus", /* which GPU a process runs on (core/gpu_assign.h) */
    "parallel.grad_bucket_mib",         /* when the gradients are reduced, not their sums (trainer/dp/dp_bucket.h) */
    "parallel.sync",                    /* how the weights travel; the same bits arrive (hash-checked) */
    NULL,
};

char *trainer_config_text(const core_recipe *r) {
    return trainer_ckpt_config_text(core_recipe_schema, r, trainer_resume_free_keys);
}

/* A resumed run cuts a JSON-lines file back to the rows before its step; a torn last row is reported. */
static int cut_back(const char *path, int64_t start) {
    int torn = 0;
    if (core_jsonl_truncate(path, start, &torn)) return -1;
    if (torn) core_log_warn("%s: dropped a torn last row (the previous run stopped while writing it)", path);
    return 0;
}

int trainer_claim_folders(const core_recipe *r, const char *resume, int overwrite, core_run_locks *L) {
    char note[1024] = "";
    if (core_file_mode_apply(r->file_mode) || core_run_locks_acquire(L, r->run_dir, r->ckpt_dir, note, sizeof note))
        return -1;
    if (note[0]) core_log_warn("%s", note);
    if (resume || overwrite) return 0;
    const char *home = r->ckpt_dir ? r->ckpt_dir : r->run_dir;
    const char *key = r->ckpt_dir ? "checkpoint.dir" : "logging.run_dir";
    int64_t *steps = NULL;
    const int n = trainer_ckpt_list(home, &steps);
    if (n == 0) return 0;
    if (n < 0) return core_run_locks_release(L), -1;
    const int64_t newest = steps[n - 1];
    free(steps);
    core_run_locks_release(L);
    return core_error("%s: %s holds the checkpoints of an earlier run (newest: %s/checkpoint-%" PRId64 ", %d in all); "
                      "a new run would delete them. Continue that run with --resume %s, or pass --overwrite to "
                      "replace them", key, home, home, newest, n, home);
}

int trainer_open_run_files(trainer_state *S, int resumed, int64_t start) {
    const core_recipe *r = S->r;
    char path[4200];
    if (!S->run_id[0]) trainer_run_id_make(S->run_id, sizeof S->run_id); /* fresh, or resumed from one without */
    if (core_mkdir_p(r->run_dir)) return -1;
    if (!resumed) { /* a fresh run replaces an earlier run's checkpoints (`vgrpo run --overwrite`), as its metrics */
        const char *home = r->ckpt_dir ? r->ckpt_dir : r->run_dir;
        char names[1024];
        const int n = trainer_ckpt_remove_all(home, names, sizeof names);
        if (n < 0) return -1;
        if (n > 0) core_log_warn("%s: removed %s of an earlier run (--overwrite)", home, names);
    }
    /* written beside and renamed into place: `vgrpo run --resume DIR` without RECIPE gives this file to every process
     * of the run as its recipe (cli/run_recipe.h), and a worker reading it while it is rewritten must see it whole */
    char tmp[4300];
    snprintf(path, sizeof path, "%s/config.resolved.yaml", r->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp); /* a leftover temporary of a write cut short */
    FILE *f = core_fopen_nofollow(tmp, "wx");
    if (!f) return -1;
    int bad = core_recipe_dump(r, f);
    if (fclose(f) || bad) return remove(tmp), core_error("%s: write failed: %s", tmp, strerror(errno));
    if (rename(tmp, path)) return remove(tmp), core_error("%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    snprintf(path, sizeof path, "%s/rewards.jsonl", r->run_dir);
    if (resumed && cut_back(path, start)) return -1;
    if (core_jsonl_open(&S->rewards_fd, path, resumed)) return -1;
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->run_dir);
    if (resumed && cut_back(path, start)) return -1;
    return core_metrics_open(&S->metrics, path, resumed);
}

/* What a checkpoint of this run holds per expert: every expert's weights, Adam state, EMA and old policy; with LoRA
 * the trained experts' adapters (with their Adam state, EMA and old policy) only. Returns the number of entries. */
static int ckpt_experts(trainer_state *S, trainer_ckpt_expert *ex, trainer_ckpt_lora *lx) {
    int n = 0;
    for (int e = 0; e < S->n_experts; e++) {
        if (S->lora_on && !S->trained[e]) continue;
        ex[n] = (trainer_ckpt_expert){wan_expert_folder(e), &S->pol[e], &S->opt[e],
                                      S->ema_on && !S->lora_on ? &S->ema[e] : NULL,
                                      S->old_on && !S->lora_on && S->trained[e] ? &S->old[e] : NULL};
        lx[n] = (trainer_ckpt_lora){S->lora_on ? &S->lora[e] : NULL, S->ema_on && S->lora_on ? &S->ema_lora[e] : NULL,
                                    S->old_on && S->lora_on ? &S->old_lora[e] : NULL};
        n++;
    }
    return n;
}

int trainer_save_checkpoint(trainer_state *S, int64_t step, const char *config_text) {
    const core_recipe *r = S->r;
    const trainer_sampler *smp = &S->smp;
    trainer_ckpt_state st = {.step = step, .policy_version = TRAINER_VERSION(S), .rollout_round = step,
                             .data_epoch = smp->epoch, .data_position = smp->pos, .data_size = smp->n,
                             .data_xxh64 = S->data_xxh64, .has_data_xxh64 = 1,
                             .base_xxh64 = S->base_hash, .has_base_xxh64 = TRAINER_BASE_HASHED(S),
                             .seed = r->seed, .config = (char *)config_text};
    snprintf(st.run_id, sizeof st.run_id, "%s", S->run_id);
    /* the guard's state at the step boundary this checkpoint is (st0: a save inside step `step` holds the state
     * before that step's eval, as a straight run's checkpoint-<step> does) */
    if (trainer_guard_active(&S->guard) && !(st.guard = trainer_guard_state_json(&S->guard.st0))) return -1;
    optim_adamw *opts[2] = {&S->opt[0], &S->opt[1]};
    if (S->dx && trainer_dev_sync_host(&S->dev, opts)) return free(st.guard), -1; /* the device's master, Adam state */
    trainer_ckpt_expert ex[2];
    trainer_ckpt_lora lx[2];
    const int n = ckpt_experts(S, ex, lx);
    char path[TRAINER_CKPT_PATH_MAX];
    const double t0 = trainer_now_s();
    optim_adamw full[2] = {{0}}; /* ZeRO: the Adam state gathered from every rank's shard (trainer/dp/zero.h) */
    int bad = 0;
    if (S->red.zero_stage > 0 && S->dp && S->dp->size > 1) {
        int64_t cmd = DP_CMD_ZERO_GATHER;
        bad = sp_comm_broadcast(S->dp, &cmd, 1, SP_I64, 0) || dp_zero_gather(S->red.grads, S->opt, 2, full);
        for (int i = 0; i < n && !bad; i++) ex[i].opt = &full[ex[i].opt - S->opt];
    }
    if (!bad)
        bad = trainer_ckpt_save_lora(r->ckpt_dir ? r->ckpt_dir : r->run_dir, &st, ex, S->lora_on ? lx : NULL, n,
                                     r->ckpt_total_limit, path, sizeof path);
    free(st.guard);
    for (int e = 0; e < 2; e++) optim_adamw_free(&full[e]);
    if (bad) return -1;
    printf("checkpoint %s (%.2fs)\n", path, trainer_now_s() - t0);
    fflush(stdout);
    return 0;
}

/* The run continues in the checkpoint's own folder: resuming into another run's folder would truncate its metrics
 * and prune its checkpoints. */
static int check_home_of(const trainer_state *S, const char *parent, const char *shown) {
    const char *home = S->r->ckpt_dir ? S->r->ckpt_dir : S->r->run_dir;
    const char *key = S->r->ckpt_dir ? "checkpoint.dir" : "logging.run_dir";
    char a[PATH_MAX], b[PATH_MAX];
    if (!realpath(parent, a) || !realpath(home, b) || strcmp(a, b))
        return core_error("--resume: %s is not in this run's checkpoint folder %s (%s): set it to the checkpoint's "
                          "folder, e.g. --set %s=%s", shown, home, key, key, parent);
    return 0;
}

/* The checkpoint folder ck must be in the run's checkpoint folder. */
static int check_home(const trainer_state *S, const char *ck) {
    char parent[TRAINER_CKPT_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", ck);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0;
    else snprintf(parent, sizeof parent, ".");
    return check_home_of(S, parent, ck);
}

/* 1 when path names one checkpoint (a folder checkpoint-<digits>, or one holding trainer_state.json). */
static int is_checkpoint(const char *path) {
    char p[TRAINER_CKPT_PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    size_t l = strlen(p);
    while (l > 1 && p[l - 1] == '/') p[--l] = 0;
    const char *base = strrchr(p, '/');
    base = base ? base + 1 : p;
    if (!strncmp(base, "checkpoint-", 11) && base[11] && strspn(base + 11, "0123456789") == strlen(base + 11)) return 1;
    char f[TRAINER_CKPT_PATH_MAX + 32];
    struct stat sb;
    snprintf(f, sizeof f, "%s/trainer_state.json", p);
    return !stat(f, &sb) && S_ISREG(sb.st_mode);
}

int trainer_resume_check(const core_recipe *r, const char *resume, int strict, FILE *f) {
    char ck[TRAINER_CKPT_PATH_MAX];
    int found = 0;
    if (is_checkpoint(resume)) {
        found = !trainer_ckpt_resolve(resume, ck, sizeof ck);
        if (!found && strict) return core_error_push("--resume: ");
    } else if (core_is_dir(resume)) {
        int64_t *steps = NULL;
        const int n = trainer_ckpt_list(resume, &steps);
        if (n > 0) snprintf(ck, sizeof ck, "%s/checkpoint-%" PRId64, resume, steps[n - 1]);
        free(steps);
        if (n < 0 && strict) return core_error_push("--resume: ");
        if (n == 0 && strict)
            return core_error("--resume: %s: no complete checkpoint (no checkpoint-N folder; .checkpoint-N.tmp folders "
                              "are incomplete saves)", resume);
        found = n > 0;
    } else if (strict) {
        return core_error("--resume: %s: no such checkpoint folder", resume);
    }
    if (!found) return 0; /* not strict: the resume names what is wrong */
    trainer_ckpt_state st;
    if (trainer_ckpt_read_state(ck, &st)) return strict ? core_error_push("--resume: ") : 0;
    char *text = trainer_config_text(r);
    int rc = text ? 0 : -1;
    if (text && trainer_ckpt_config_check(ck, &st, text)) {
        rc = core_error_push("--resume: ");
    } else if (text && f) {
        char line[1024];
        trainer_ckpt_run_line(ck, &st, line, sizeof line);
        fprintf(f, "--resume: would continue from %s (trainer_state.json read; the files are verified at the start)\n",
                line);
    }
    free(text);
    trainer_ckpt_state_free(&st);
    return rc;
}

/* Loads the checkpoint to resume from into S: dir itself when it is one (any failure is an error naming the file),
 * else dir's latest checkpoint that verifies; a damaged or incomplete one (TRAINER_CKPT_DAMAGED) is skipped, named
 * with its reason, and the one before it tried; one that does not fit this run is an error. Rank 0 first removes
 * the leftovers of saves and removals cut short. ck receives the checkpoint's folder, skipped the names of those
 * skipped ("checkpoint-5, checkpoint-4"; "" when none). */
static int load_latest(trainer_state *S, const char *dir, const char *config_text, trainer_ckpt_state *st, char *ck,
                       size_t cap, char *skipped, size_t skipped_cap) {
    trainer_ckpt_expert ex[2];
    trainer_ckpt_lora lx_buf[2];
    const int n_ex = ckpt_experts(S, ex, lx_buf);
    const trainer_ckpt_lora *lx = S->lora_on ? lx_buf : NULL;
    const int rank0 = !S->dp || S->dp->rank == 0;
    if (is_checkpoint(dir)) {
        if (trainer_ckpt_resolve(dir, ck, cap)) return core_error_push("--resume: ");
        if (check_home(S, ck)) return -1;
        return trainer_ckpt_load_lora(ck, config_text, ex, lx, n_ex, st) ? core_error_push("--resume: ") : 0;
    }
    if (!core_is_dir(dir)) return core_error("--resume: %s: no such checkpoint folder", dir);
    int64_t *steps = NULL;
    if (check_home_of(S, dir, dir)) return -1;
    if (rank0 && trainer_ckpt_clean(dir) < 0) return core_error_push("--resume: ");
    const int n = trainer_ckpt_list(dir, &steps);
    if (n < 0) return core_error_push("--resume: ");
    if (n == 0)
        return core_error("--resume: %s: no complete checkpoint (no checkpoint-N folder; .checkpoint-N.tmp folders are "
                          "incomplete saves)", dir);
    char why[2048] = "";
    int rc = -1;
    for (int i = n - 1; i >= 0; i--) {
        snprintf(ck, cap, "%s/checkpoint-%" PRId64, dir, steps[i]);
        rc = trainer_ckpt_load_lora(ck, config_text, ex, lx, n_ex, st);
        if (rc != TRAINER_CKPT_DAMAGED) break;
        if (rank0) core_log_warn("--resume: skipping checkpoint-%" PRId64 ": %s", steps[i], core_last_error());
        size_t k = strlen(skipped);
        snprintf(skipped + k, skipped_cap - k, "%scheckpoint-%" PRId64, k ? ", " : "", steps[i]);
        size_t l = strlen(why);
        snprintf(why + l, sizeof why - l, "%scheckpoint-%" PRId64 ": %s", l ? "; " : "", steps[i], core_last_error());
    }
    free(steps);
    if (rc == TRAINER_CKPT_DAMAGED) return core_error("--resume: %s: no checkpoint verifies (%s)", dir, why);
    return rc ? core_error_push("--resume: ") : 0;
}

int trainer_restore_best(trainer_state *S) {
    const core_recipe *r = S->r;
    const char *home = r->ckpt_dir ? r->ckpt_dir : r->run_dir;
    const int64_t b = S->guard.st.best_step;
    int64_t now = -1;
    if (S->guard.n_gold == 0 || r->ckpt_every <= 0) return 0;
    const int have = trainer_ckpt_get_best(home, &now);
    if (have < 0) return -1;
    if (b < 0) return have ? trainer_ckpt_clear_best(home) : 0;
    if (have && now == b) return 0;
    char ck[TRAINER_CKPT_PATH_MAX + 32];
    snprintf(ck, sizeof ck, "%s/checkpoint-%" PRId64, home, b);
    if (!core_is_dir(ck)) {
        core_log_warn("%s: the best gold eval's checkpoint (step %" PRId64 ") is gone; %s/best removed until the next "
                      "best", ck, b, home);
        return trainer_ckpt_clear_best(home);
    }
    return trainer_ckpt_set_best(home, b);
}

int trainer_resume(trainer_state *S, const char *dir, const char *config_text, int64_t total, int64_t *step) {
    char ck[TRAINER_CKPT_PATH_MAX], skipped[256] = "";
    trainer_ckpt_state st;
    trainer_sampler *smp = &S->smp;
    if (load_latest(S, dir, config_text, &st, ck, sizeof ck, skipped, sizeof skipped)) return -1;
    int rc = -1;
    if (st.data_size != smp->n)
        core_error("--resume: %s: the checkpoint drew from %" PRId64 " prompts, data.prompt_file %s has %d. Resume "
                   "with the prompt file it was trained on, or start a new run", ck, st.data_size, S->r->prompt_file,
                   smp->n);
    else if (st.has_data_xxh64 && st.data_xxh64 != S->data_xxh64)
        core_error("--resume: %s: data.prompt_file %s changed since the checkpoint (its prompts' content hash was "
                   "%016" PRIx64 ", now %016" PRIx64 ": a prompt's text, metadata or image differs; the run would not "
                   "continue as it started). Resume with the prompt file it was trained on, or start a new run", ck,
                   S->r->prompt_file, st.data_xxh64, S->data_xxh64);
    else if (st.has_base_xxh64 && TRAINER_BASE_HASHED(S) && st.base_xxh64 != S->base_hash)
        core_error("--resume: %s: the transformer weights of model.path %s hash to %016" PRIx64 ", the run started "
                   "from weights hashing to %016" PRIx64 " (its %s). Resume with the model folder the run "
                   "started from, or start a new run", ck, S->r->model_path, S->base_hash, st.base_xxh64,
                   S->lora_on ? "LoRA adapters' frozen base" : "reference model");
    else if (st.data_position > smp->n || st.data_epoch > 0xffffffffll)
        core_error("--resume: %s/trainer_state.json: data_epoch %" PRId64 " / data_position %" PRId64
                   " out of range", ck, st.data_epoch, st.data_position);
    else if (st.rollout_round != st.step || st.policy_version != TRAINER_VERSION(S) ||
             st.policy_version != st.step * S->r->optimizer_steps_per_rollout)
        core_error("--resume: %s: step %" PRId64 ", rollout_round %" PRId64 ", policy_version %" PRId64
                   " and the optimizer's step %" PRId64 " disagree for a local run", ck, st.step, st.rollout_round,
                   st.policy_version, TRAINER_VERSION(S));
    else if (st.step > total)
        core_error("--resume: %s is at step %" PRId64 ", past this run's %" PRId64 " steps (optim.total_steps or "
                   "--steps)", ck, st.step, total);
    else
        rc = 0;
    if (!rc && !st.has_data_xxh64 && (!S->dp || S->dp->rank == 0))
        core_log_warn("--resume: %s/trainer_state.json records no prompt hash (written before checkpoints kept one): "
                      "data.prompt_file %s is checked by its count only; the checkpoints from here on record it", ck,
                      S->r->prompt_file);
    if (!rc && trainer_guard_active(&S->guard)) { /* rank 0's guard (other ranks keep none) */
        char label[TRAINER_CKPT_PATH_MAX + 32];
        snprintf(label, sizeof label, "%s/trainer_state.json", ck);
        if (!st.guard) /* written without the guard (video_stats off, no gold scorers) or before it existed */
            core_log_info("--resume: %s holds no guard state: the guard starts afresh (its statistics' baseline is "
                          "the first step from here, no gold eval seen yet)", label);
        else if (trainer_guard_state_load(&S->guard.st, st.guard, label))
            rc = core_error_push("--resume: ");
        if (!rc) trainer_guard_boundary(&S->guard);
        if (!rc) rc = trainer_restore_best(S);
    }
    if (!rc && S->dx) { /* the checkpoint's weights and Adam state onto the device (trainer/optim/train_dev.h) */
        optim_adamw *opts[2] = {&S->opt[0], &S->opt[1]};
        rc = trainer_dev_upload(&S->dev, opts);
        if (!rc) rc = trainer_old_sync_device(S); /* the checkpoint's old policy (algorithm.loss nft) */
    }
    if (!rc) {
        trainer_sampler_seek(smp, (uint32_t)st.data_epoch, (int)st.data_position);
        *step = st.step;
        printf("resumed from %s: step %" PRId64 ", policy version %" PRId64 "%s%s%s\n", ck, st.step, st.policy_version,
               skipped[0] ? " (skipped, damaged or incomplete: " : "", skipped, skipped[0] ? ")" : "");
        char line[TRAINER_CKPT_PATH_MAX + 256];
        trainer_ckpt_run_line(ck, &st, line, sizeof line);
        printf("checkpoint %s\n", line); /* the run it continues */
        snprintf(S->run_id, sizeof S->run_id, "%s", st.run_id);
        fflush(stdout);
    }
    trainer_ckpt_state_free(&st);
    return rc;
}
