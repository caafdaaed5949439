/* core/strbuf.c — the growable byte string and id list of core/strbuf.h. */
#include "core/strbuf.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int core_sbuf_add(core_sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return core_error("out of memory for a string of %zu bytes", b->n + n + 1);
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int core_ibuf_add(core_ibuf *b, int32_t v) {
    if (b->n == b->cap) {
        const int cap = b->cap ? 2 * b->cap : 64;
        int32_t *p = realloc(b->p, (size_t)cap * sizeof *p);
        if (!p) return core_error("out of memory for a list of %d token ids", cap);
        b->p = p, b->cap = cap;
    }
    b->p[b->n++] = v;
    return 0;
}
