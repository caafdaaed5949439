/* core/error.c — per-thread error message; see error.h. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_buf[CORE_ERROR_MAX];

int core_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return -1;
}

int core_error_push(const char *fmt, ...) {
    char prefix[CORE_ERROR_MAX], old[CORE_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old);
    snprintf(err_buf, sizeof err_buf, "%s%s", prefix, old);
    return -1;
}

const char *core_last_error(void) { return err_buf; }

void core_error_clear(void) { err_buf[0] = '\0'; }
