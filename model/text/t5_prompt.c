/* model/text/t5_prompt.c — Wan prompt cleaning and encoding (see t5_prompt.h). */
#include "model/text/t5_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/text/tok_internal.h"

/* Named entities kept (name, UTF-8, 1 = also accepted without ';' as Python's html5 table does). */
static const struct {
    const char *name, *utf8;
    int legacy;
} entities[] = {
    {"amp", "&", 1},          {"lt", "<", 1},           {"gt", ">", 1},           {"quot", "\"", 1},
    {"apos", "'", 0},         {"nbsp", "\xC2\xA0", 1},  {"copy", "\xC2\xA9", 1},  {"reg", "\xC2\xAE", 1},
    {"deg", "\xC2\xB0", 1},   {"times", "\xC3\x97", 1}, {"middot", "\xC2\xB7", 1}, {"laquo", "\xC2\xAB", 1},
    {"raquo", "\xC2\xBB", 1}, {"pound", "\xC2\xA3", 1}, {"yen", "\xC2\xA5", 1},   {"cent", "\xC2\xA2", 1},
    {"sect", "\xC2\xA7", 1},  {"eacute", "\xC3\xA9", 1}, {"egrave", "\xC3\xA8", 1}, {"aacute", "\xC3\xA1", 1},
    {"agrave", "\xC3\xA0", 1}, {"ccedil", "\xC3\xA7", 1}, {"uuml", "\xC3\xBC", 1},  {"ouml", "\xC3\xB6", 1},
    {"auml", "\xC3\xA4", 1},  {"szlig", "\xC3\x9F", 1}, {"ntilde", "\xC3\xB1", 1}, {"trade", "\xE2\x84\xA2", 0},
    {"hellip", "\xE2\x80\xA6", 0}, {"mdash", "\xE2\x80\x94", 0}, {"ndash", "\xE2\x80\x93", 0},
    {"lsquo", "\xE2\x80\x98", 0}, {"rsquo", "\xE2\x80\x99", 0}, {"ldquo", "\xE2\x80\x9C", 0},
    {"rdquo", "\xE2\x80\x9D", 0}, {"euro", "\xE2\x82\xAC", 0},
};

/* Windows-1252 meanings of references to 0x80..0x9F (Python html._invalid_charrefs; 0 = the code point itself). */
static const uint16_t cp1252[32] = {0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
                                    0x2039, 0x0152, 0, 0x017D, 0, 0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013,
                                    0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0, 0x017E, 0x0178};

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static int put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return core_error("prompt: out of memory");
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int put_cp(buf *b, uint32_t cp) {
    char u[4];
    return put(b, u, (size_t)tok_utf8_encode(cp, u));
}

static int is_hex(int c) { return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'f'); }

/* A numeric reference's replacement, Python html._replace_charref rules. */
static int put_charref(buf *b, unsigned long long num) {
    if (num == 0x0D) return put(b, "\r", 1);
    if (num == 0) return put_cp(b, 0xFFFD);
    if (num >= 0x80 && num <= 0x9F && cp1252[num - 0x80]) return put_cp(b, cp1252[num - 0x80]);
    if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) return put_cp(b, 0xFFFD);
    if ((num >= 0x1 && num <= 0x8) || (num >= 0xE && num <= 0x1F) || (num >= 0x7F && num <= 0x9F) ||
        (num >= 0xFDD0 && num <= 0xFDEF) || num == 0xB || (num & 0xFFFE) == 0xFFFE)
        return 0; /* invalid code points are dropped */
    return put_cp(b, (uint32_t)num);
}

/* One pass of Python's html.unescape. */
static char *unescape(const char *s) {
    buf b = {0};
    if (put(&b, "", 0)) return NULL;
    size_t n = strlen(s), i = 0;
    while (i < n) {
        if (s[i] != '&') {
            if (put(&b, s + i, 1)) goto fail;
            i++;
            continue;
        }
        size_t j = i + 1;
        if (j < n && s[j] == '#') { /* &#123; &#x1F; (';' optional) */
            size_t k = j + 1;
            int hex = k < n && (s[k] == 'x' || s[k] == 'X');
            if (hex) k++;
            size_t d0 = k;
            unsigned long long num = 0;
            while (k < n && (hex ? is_hex((unsigned char)s[k]) : (s[k] >= '0' && s[k] <= '9'))) {
                int dv = s[k] <= '9' ? s[k] - '0' : (s[k] | 32) - 'a' + 10;
                if (num < (1ULL << 40)) num = num * (hex ? 16 : 10) + (unsigned)dv;
                k++;
            }
            if (k == d0) {
                if (put(&b, "&", 1)) goto fail;
                i++;
                continue;
            }
            if (k < n && s[k] == ';') k++;
            if (put_charref(&b, num)) goto fail;
            i = k;
            continue;
        }
        size_t k = j; /* [^\t\n\f <&#;]{1,32};? */
        while (k < n && k - j < 32 && !strchr("\t\n\f <&#;", s[k])) k++;
        if (k == j) {
            if (put(&b, "&", 1)) goto fail;
            i++;
            continue;
        }
        int semi = k < n && s[k] == ';';
        size_t len = k - j, done = 0;
        for (size_t e = 0; e < sizeof entities / sizeof entities[0] && !done; e++) /* whole name */
            if (strlen(entities[e].name) == len && !memcmp(entities[e].name, s + j, len) && (semi || entities[e].legacy)) {
                if (put(&b, entities[e].utf8, strlen(entities[e].utf8))) goto fail;
                i = k + (size_t)semi, done = 1;
            }
        /* longest legacy prefix of the text matched (Python: s[:x] for x = len(s)-1 .. 2, s including ';') */
        size_t slen = len + (size_t)semi;
        for (size_t x = slen - 1; !done && x >= 2; x--)
            for (size_t e = 0; e < sizeof entities / sizeof entities[0]; e++)
                if (entities[e].legacy && x <= len && strlen(entities[e].name) == x && !memcmp(entities[e].name, s + j, x)) {
                    if (put(&b, entities[e].utf8, strlen(entities[e].utf8))) goto fail;
                    i = j + x, done = 1;
                    break;
                }
        if (!done) {
            if (put(&b, "&", 1)) goto fail;
            i++;
        }
    }
    return b.p;
fail:
    free(b.p);
    return NULL;
}

char *t5_prompt_clean(const char *text) {
    if (!tok_utf8_valid(text, strlen(text))) {
        core_error("prompt is not valid UTF-8");
        return NULL;
    }
    char *a = unescape(text);
    char *u = a ? unescape(a) : NULL;
    free(a);
    if (!u) return NULL;
    /* strip + collapse runs of \s into one space + strip: words joined by single spaces */
    buf b = {0};
    if (put(&b, "", 0)) {
        free(u);
        return NULL;
    }
    const unsigned char *s = (const unsigned char *)u;
    size_t n = strlen(u), i = 0;
    int pending = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = (size_t)tok_utf8_decode(s + i, n - i, &cp);
        if (tok_is_py_space(cp)) {
            pending = 1;
        } else {
            if ((pending && b.n > 0 && put(&b, " ", 1)) || put(&b, u + i, l)) {
                free(u), free(b.p);
                return NULL;
            }
            pending = 0;
        }
        i += l;
    }
    free(u);
    return b.p;
}

int t5_encode_prompts(const t5_encoder *enc, const tok_tokenizer *tok, const char *const *prompts, int P, int N,
                      int batch, float *embeds, int64_t *lengths) {
    if (N <= 0) return core_error("encode prompts: max length %d must be positive", N);
    int D = t5_get_config(enc)->d_model;
    if (batch <= 0 || batch > P) batch = P;
    int32_t *ids = calloc((size_t)batch * N, sizeof *ids), *mask = calloc((size_t)batch * N, sizeof *mask);
    float *out = malloc((size_t)batch * N * D * sizeof(float));
    int rc = 0;
    if (!ids || !mask || !out) rc = core_error("encode prompts: out of memory");
    for (int p0 = 0; p0 < P && !rc; p0 += batch) {
        int nb = P - p0 < batch ? P - p0 : batch;
        memset(ids, 0, (size_t)nb * N * sizeof *ids); /* pad id 0, mask 0 */
        memset(mask, 0, (size_t)nb * N * sizeof *mask);
        for (int b = 0; b < nb && !rc; b++) {
            char *clean = t5_prompt_clean(prompts[p0 + b]);
            int32_t *t = NULL;
            int n = 0;
            if (!clean || tok_encode(tok, clean, N, &t, &n)) {
                rc = core_error_push("prompt %d: ", p0 + b);
            } else {
                memcpy(ids + (size_t)b * N, t, (size_t)n * sizeof *t);
                for (int j = 0; j < n; j++) mask[(size_t)b * N + j] = 1;
                lengths[p0 + b] = n;
            }
            free(clean), free(t);
        }
        /* Run only the longest prompt's length S <= N: padded keys are left out of attention and the position
         * bias depends on j - i only, so the real tokens' outputs equal those of the padded-to-N forward (bit for
         * bit: gemm rows do not depend on the row count); the padded rows are discarded anyway. */
        int S = 1;
        for (int b = 0; b < nb && !rc; b++) S = lengths[p0 + b] > S ? (int)lengths[p0 + b] : S;
        for (int b = 1; b < nb && !rc; b++) {
            memmove(ids + (size_t)b * S, ids + (size_t)b * N, (size_t)S * sizeof *ids);
            memmove(mask + (size_t)b * S, mask + (size_t)b * N, (size_t)S * sizeof *mask);
        }
        if (!rc) rc = t5_forward(enc, ids, mask, nb, S, out);
        for (int b = 0; b < nb && !rc; b++) {
            float *dst = embeds + (size_t)(p0 + b) * N * D;
            size_t keep = (size_t)lengths[p0 + b] * D;
            memcpy(dst, out + (size_t)b * S * D, keep * sizeof(float));
            memset(dst + keep, 0, ((size_t)N * D - keep) * sizeof(float));
        }
    }
    free(ids), free(mask), free(out);
    return rc;
}
