/* core/log.c — leveled, rank-prefixed, timestamped log lines; see log.h. */
#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/error.h"

static struct timespec start_time;
static atomic_int cur_level = CORE_LOG_INFO;
static atomic_int cur_rank = -1;
static FILE *_Atomic cur_stream;

/* Runs when the program (or the test binary) is loaded: the clock's zero and the level from the environment. */
__attribute__((constructor)) static void log_init(void) {
    clock_gettime(CLOCK_MONOTONIC, &start_time);
    const char *env = getenv("VGRPO_LOG_LEVEL");
    if (env && *env) {
        core_log_level lv;
        if (core_log_level_from_name(env, &lv) == 0)
            atomic_store(&cur_level, (int)lv);
        else
            core_log(CORE_LOG_WARN, "VGRPO_LOG_LEVEL=\"%s\" is not debug|info|warn|error|off; using info", env);
    }
}

void core_log_set_level(core_log_level level) { atomic_store(&cur_level, (int)level); }

core_log_level core_log_get_level(void) { return (core_log_level)atomic_load(&cur_level); }

int core_log_level_from_name(const char *name, core_log_level *out) {
    static const struct {
        const char *name;
        core_log_level level;
    } names[] = {{"debug", CORE_LOG_DEBUG},  {"info", CORE_LOG_INFO},   {"warn", CORE_LOG_WARN},
                 {"warning", CORE_LOG_WARN}, {"error", CORE_LOG_ERROR}, {"off", CORE_LOG_OFF}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(name, names[i].name)) {
            *out = names[i].level;
            return 0;
        }
    return core_error("log level \"%s\" is not one of debug, info, warn, error, off", name);
}

void core_log_set_rank(int rank) { atomic_store(&cur_rank, rank); }

void core_log_set_stream(FILE *f) { atomic_store(&cur_stream, f); }

double core_log_elapsed(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start_time.tv_sec) + 1e-9 * (double)(now.tv_nsec - start_time.tv_nsec);
}

void core_log(core_log_level level, const char *fmt, ...) {
    static const char *const tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    if (level < CORE_LOG_DEBUG || level >= CORE_LOG_OFF || (int)level < atomic_load(&cur_level)) return;
    char prefix[64];
    int rank = atomic_load(&cur_rank);
    int np;
    if (rank >= 0)
        np = snprintf(prefix, sizeof prefix, "[%10.3f] [rank %d] %s ", core_log_elapsed(), rank, tags[level]);
    else
        np = snprintf(prefix, sizeof prefix, "[%10.3f] %s ", core_log_elapsed(), tags[level]);
    if (np < 0) return;
    if (np >= (int)sizeof prefix) np = (int)sizeof prefix - 1;

    /* Format prefix + message + newline into one buffer (on the heap only when long), then write it once. */
    char small[1024];
    char *line = small;
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int nm = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (nm < 0) {
        va_end(ap2);
        return;
    }
    size_t need = (size_t)np + (size_t)nm + 2;
    if (need > sizeof small) {
        line = malloc(need);
        if (!line) {
            va_end(ap2);
            return;
        }
    }
    memcpy(line, prefix, (size_t)np);
    vsnprintf(line + np, (size_t)nm + 1, fmt, ap2);
    va_end(ap2);
    size_t len = (size_t)np + (size_t)nm;
    if (nm == 0 || line[len - 1] != '\n') line[len++] = '\n';

    FILE *f = atomic_load(&cur_stream);
    if (!f) f = stderr;
    flockfile(f);
    fwrite(line, 1, len, f);
    fflush(f);
    funlockfile(f);
    if (line != small) free(line);
}
