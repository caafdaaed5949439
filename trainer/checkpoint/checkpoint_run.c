/* trainer/checkpoint/checkpoint_run.c — the run a checkpoint belongs to (see trainer/checkpoint/checkpoint.h): a run's id, and the one line
 * `eval`, `generate` and `--resume` print (run id, seed, recipe hash). Its own file because it reads a checkpoint's
 * state (checkpoint.c) while checkpoint.c uses checkpoint_dir.c's helpers: no circle among the three. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/error.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_files.h"

void trainer_ckpt_run_line(const char *ckpt, const trainer_ckpt_state *st, char *buf, size_t cap) {
    char run[96];
    if (st->run_id[0]) snprintf(run, sizeof run, "run %s", st->run_id);
    else snprintf(run, sizeof run, "a run not recorded (written before checkpoints named their run)");
    snprintf(buf, cap, "%s: step %" PRId64 " of %s (seed %" PRId64 ", recipe %016" PRIx64 ")", ckpt, st->step, run,
             st->seed, st->config_hash);
}

void trainer_ckpt_print_run(const char *path, FILE *out) {
    char ck[TRAINER_CKPT_PATH_MAX], f[TRAINER_CKPT_PATH_MAX + 32];
    snprintf(ck, sizeof ck, "%s", path);
    size_t l = strlen(ck);
    while (l > 1 && ck[l - 1] == '/') ck[--l] = 0;
    snprintf(f, sizeof f, "%s/" STATE_FILE, ck);
    if (!ckpt_is_file(f)) { /* checkpoint-N/ema, checkpoint-N/transformer: the state is the parent's */
        char *slash = strrchr(ck, '/');
        if (!slash) return;
        *slash = 0;
        snprintf(f, sizeof f, "%s/" STATE_FILE, ck);
        if (!ckpt_is_file(f)) return;
    }
    trainer_ckpt_state st;
    if (trainer_ckpt_read_state(ck, &st)) {
        core_log_warn("%s: cannot say which run it belongs to: %s", ck, core_last_error());
        return;
    }
    char line[TRAINER_CKPT_PATH_MAX + 256];
    trainer_ckpt_run_line(ck, &st, line, sizeof line);
    trainer_ckpt_state_free(&st);
    fprintf(out, "checkpoint %s\n", line);
    fflush(out);
}

void trainer_run_id_make(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    char t[32] = "00000000-000000";
    const time_t now = ts.tv_sec;
    if (localtime_r(&now, &tm)) strftime(t, sizeof t, "%Y%m%d-%H%M%S", &tm);
    snprintf(buf, cap, "%s-%ld-%04lx", t, (long)getpid(), ((unsigned long)ts.tv_nsec >> 10) & 0xffff);
}
