/* core/error.h — one error channel for library code.
 *
 * Library functions return 0 on success and -1 on failure after recording a message a user can act on
 * (it names the file, key, tensor or field that is wrong). The message is per thread; callers that add context
 * prefix it with core_error_push(). Only main() and tests print and exit. (Same idea as SDL_GetError.) */
#ifndef CORE_ERROR_H
#define CORE_ERROR_H

#include <stddef.h>

#define CORE_ERROR_MAX 1024

/* Records a printf-style message for this thread, replacing the previous one. Always returns -1. */
int core_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prefixes the current message with more context ("loading model/x: " + old message). Returns -1. */
int core_error_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The last message recorded on this thread ("" if none). */
const char *core_last_error(void);
/* Copies in to out (cap bytes, NUL-terminated, cut at a character boundary) with control bytes (other than newline and
 * tab) and bytes that are not valid UTF-8 written as \xNN. core_error and core_error_push apply it to every message. */
void core_text_printable(const char *in, char *out, size_t cap);

/* Clears this thread's message. */
void core_error_clear(void);

#endif
