/* core/error.c — per-thread error message; see error.h. */
#include "core/error.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_buf[CORE_ERROR_MAX];

/* Length of the valid UTF-8 sequence (shortest form, no surrogates, <= U+10FFFF) starting at s, or 0. */
static int utf8_len(const unsigned char *s) {
    const unsigned c = s[0];
    int k;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07;
    else return 0;
    for (int j = 1; j <= k; j++) {
        if ((s[j] & 0xc0) != 0x80) return 0; /* also stops at the terminating NUL */
        cp = (cp << 6) | (s[j] & 0x3f);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k + 1;
}

void core_text_printable(const char *in, char *out, size_t cap) {
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0;
    if (!cap) return;
    while (*s) {
        int k = *s >= 0x80 ? utf8_len(s) : (*s >= 0x20 && *s != 0x7f) || *s == '\n' || *s == '\t' ? 1 : 0;
        if (k) {
            if (o + (size_t)k >= cap) break;
            memcpy(out + o, s, (size_t)k);
            o += (size_t)k, s += k;
        } else {
            if (o + 4 >= cap) break;
            snprintf(out + o, cap - o, "\\x%02x", *s);
            o += 4, s++;
        }
    }
    out[o] = 0;
}

/* err_buf made printable in place (control bytes and invalid UTF-8 as \xNN): user text quoted in a message (a
 * path, a --set value) never reaches the terminal raw. */
static void sanitize(void) {
    char t[CORE_ERROR_MAX];
    core_text_printable(err_buf, t, sizeof t);
    memcpy(err_buf, t, sizeof t);
}

int core_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    sanitize();
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
    sanitize();
    return -1;
}

const char *core_last_error(void) { return err_buf; }

void core_error_clear(void) { err_buf[0] = '\0'; }
