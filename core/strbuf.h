/* core/strbuf.h — growable buffers the tokenizers build in (model/text/tokenizer.c, model/clip/clip_tokenizer.c): a
 * byte string, always NUL-terminated after its n bytes, and a list of token ids. Zero-initialise (core_sbuf b = {0}),
 * append, free(b.p). */
#ifndef CORE_STRBUF_H
#define CORE_STRBUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *p;         /* n bytes and a NUL; NULL until the first append */
    size_t n, cap;   /* bytes held (the NUL not counted), bytes allocated */
} core_sbuf;

/* Appends s[0..n) (any bytes, NULs included) and keeps the NUL after them; the capacity doubles from 64 bytes.
 * 0, or -1 with core_error "out of memory" (b is unchanged then). */
int core_sbuf_add(core_sbuf *b, const char *s, size_t n);

typedef struct {
    int32_t *p;   /* n ids; NULL until the first append */
    int n, cap;   /* ids held, ids allocated */
} core_ibuf;

/* Appends one id; the capacity doubles from 64. 0, or -1 with core_error "out of memory" (b unchanged). */
int core_ibuf_add(core_ibuf *b, int32_t v);

#endif
