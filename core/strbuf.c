/* core/strbuf.c — the growable byte string of core/strbuf.h. */
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
