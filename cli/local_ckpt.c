/* cli/local_ckpt.c — what `vgrpo run` adds around trainer/checkpoint.h: the recipe's config text for the resume
 * check (which keys may change on resume), cutting metrics.jsonl back to a checkpoint's step, and SIGINT/SIGTERM
 * turned into "finish the step, save, stop". */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/grpo_run.h"
#include "core/error.h"
#include "trainer/checkpoint.h"

const char *const local_resume_free_keys[] = {
    "optim.total_steps",                /* a run may be extended (a linear/cosine lr then changes from there on) */
    "checkpoint.every", "checkpoint.dir", "checkpoint.total_limit",
    "logging.run_dir", "logging.eval_every", "logging.video_every",
    "data.eval_prompt_file", "data.eval_samples_per_prompt", "data.eval_eta", /* eval only: never feeds training */
    "reward.endpoint", "reward.threads", "reward.timeout_s", "reward.max_attempts", /* where scoring runs */
    "rollout.batch_size",               /* trajectories do not depend on it (DESIGN.md section 4) */
    "parallel.rollout_workers",         /* a sample does not depend on the worker that made it */
    "algorithm.activations",            /* store and recompute give bitwise-identical gradients */
    NULL,
};

char *local_config_text(const core_recipe *r) {
    return trainer_ckpt_config_text(core_recipe_schema, r, local_resume_free_keys);
}

int local_metrics_truncate(const char *path, int64_t step) {
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : core_error("%s: cannot read: %s", path, strerror(errno));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *o = fopen(tmp, "w");
    if (!o) return fclose(f), core_error("%s: cannot create: %s", tmp, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] != '\n') break; /* a row cut by a crash */
        json_error_t je;
        json_t *row = json_loads(line, 0, &je);
        json_t *s = json_object_get(row, "step");
        const int keep = json_is_integer(s) && json_integer_value(s) < step;
        json_decref(row);
        if (!keep) break;
        if (fwrite(line, 1, (size_t)len, o) != (size_t)len) {
            rc = core_error("%s: write failed: %s", tmp, strerror(errno));
            break;
        }
    }
    free(line);
    fclose(f);
    if (!rc && (fflush(o) || fsync(fileno(o)))) rc = core_error("%s: write failed: %s", tmp, strerror(errno));
    if (fclose(o) && !rc) rc = core_error("%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path)) rc = core_error("%s: cannot replace with %s: %s", path, tmp, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

static volatile sig_atomic_t pending_signal;
static struct sigaction old_int, old_term;

static void on_signal(int sig) { pending_signal = sig; }

void local_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND; /* a second signal takes the default action: stop at once */
    pending_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
}

int local_signal_pending(void) { return pending_signal; }

void local_signals_restore(void) {
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
}
