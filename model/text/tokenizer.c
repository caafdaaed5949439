/* model/text/tokenizer.c — the umT5 tokenizer (Hugging Face tokenizer.json, SentencePiece Unigram); see tokenizer.h.
 *
 * References read to write this: Hugging Face tokenizers (normalizers/precompiled.rs, the spm_precompiled crate's
 * Darts trie, pre_tokenizers/metaspace.rs, models/unigram/model.rs encode_optimized and tokenize), transformers'
 * convert_slow_tokenizer.py (T5Converter / SpmConverter). */
#include "model/text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/strbuf.h"
#include "model/text/tok_internal.h"

#define MAX_STEPS 16
#define MAX_SPECIAL 8
#define UNK_PENALTY 10.0 /* tokenizers' K_UNK_PENALTY */

typedef enum { STEP_PRECOMPILED, STEP_STRIP, STEP_REPLACE_STR, STEP_REPLACE_SPACES } step_type;

typedef struct {
    step_type type;
    int left, right;        /* Strip */
    char *pattern, *content; /* Replace */
} norm_step;

struct tok_tokenizer {
    int nvocab;
    char **pieces;   /* [nvocab] NUL-terminated UTF-8 */
    int *plen;       /* [nvocab] byte lengths */
    double *scores;  /* [nvocab] log-probs */
    int *slot_id;    /* hash slots: vocab id or -1 */
    uint64_t *slot_h;
    uint64_t hmask;
    int maxlen, unk_id, byte_fallback;
    double min_score;
    int byte_ids[256]; /* id of "<0xXX>" or -1 */
    /* Precompiled charsmap */
    uint32_t *trie;
    size_t trie_units;
    char *normalized;
    size_t norm_len;
    norm_step steps[MAX_STEPS];
    int nsteps;
    /* Metaspace */
    int has_meta, prepend, split; /* prepend: 0 never, 1 always/first */
    char rep[8];
    int rep_len;
    int32_t pre_ids[MAX_SPECIAL], post_ids[MAX_SPECIAL];
    int npre, npost;
};

/* ---- vocabulary hash (FNV-1a over bytes, built incrementally for prefix search) ---- */
#define FNV_BASIS 1469598103934665603ULL
#define FNV_PRIME 1099511628211ULL

static int vocab_lookup(const tok_tokenizer *t, uint64_t h, const char *s, int len) {
    for (uint64_t i = h & t->hmask;; i = (i + 1) & t->hmask) {
        int id = t->slot_id[i];
        if (id < 0) return -1;
        if (t->slot_h[i] == h && t->plen[id] == len && memcmp(t->pieces[id], s, (size_t)len) == 0) return id;
    }
}

static uint64_t hash_bytes(const char *s, int len) {
    uint64_t h = FNV_BASIS;
    for (int i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * FNV_PRIME;
    return h;
}

static void vocab_insert(tok_tokenizer *t, int id) { /* a later duplicate wins, as in tokenizers' HashMap */
    uint64_t h = hash_bytes(t->pieces[id], t->plen[id]);
    for (uint64_t i = h & t->hmask;; i = (i + 1) & t->hmask) {
        int o = t->slot_id[i];
        if (o < 0 || (t->slot_h[i] == h && t->plen[o] == t->plen[id] && !memcmp(t->pieces[o], t->pieces[id], (size_t)t->plen[id]))) {
            t->slot_id[i] = id, t->slot_h[i] = h;
            return;
        }
    }
}

/* ---- Precompiled character map ---- */
static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int parse_charsmap(tok_tokenizer *t, const char *b64, const char *file) {
    size_t n = strlen(b64), m = 0;
    unsigned char *raw = malloc(n / 4 * 3 + 3);
    if (!raw) return core_error("tokenizer: out of memory");
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (b64[i] == '=') break;
        int v = b64val((unsigned char)b64[i]);
        if (v < 0) {
            free(raw);
            return core_error("%s: precompiled_charsmap: invalid base64 character at %zu", file, i);
        }
        acc = (acc << 6) | (uint32_t)v, bits += 6;
        if (bits >= 8) bits -= 8, raw[m++] = (unsigned char)(acc >> bits);
    }
    if (m < 4) {
        free(raw);
        return core_error("%s: precompiled_charsmap: %zu bytes, too short", file, m);
    }
    uint32_t tsize = raw[0] | raw[1] << 8 | raw[2] << 16 | (uint32_t)raw[3] << 24;
    if (tsize % 4 || (size_t)tsize + 4 > m) {
        free(raw);
        return core_error("%s: precompiled_charsmap: trie size %u does not fit %zu bytes", file, tsize, m);
    }
    t->trie_units = tsize / 4;
    t->trie = malloc((t->trie_units ? t->trie_units : 1) * sizeof(uint32_t));
    t->norm_len = m - 4 - tsize;
    t->normalized = malloc(t->norm_len + 1);
    if (!t->trie || !t->normalized) {
        free(raw);
        return core_error("tokenizer: out of memory");
    }
    for (size_t i = 0; i < t->trie_units; i++) {
        const unsigned char *u = raw + 4 + 4 * i;
        t->trie[i] = u[0] | u[1] << 8 | u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(t->normalized, raw + 4 + tsize, t->norm_len);
    t->normalized[t->norm_len] = 0;
    free(raw);
    return 0;
}

/* Darts double-array common-prefix search, first (shortest) hit only, as spm_precompiled's transform uses.
 * Returns the replacement (into t->normalized) and its length, or NULL when no prefix of key matches. */
static const char *charsmap_lookup(const tok_tokenizer *t, const unsigned char *key, size_t n, size_t *outlen) {
    if (!t->trie_units) return NULL;
    size_t pos = 0;
    uint32_t unit = t->trie[0];
    pos ^= (unit >> 10) << ((unit & (1u << 9)) >> 6);
    for (size_t i = 0; i < n && key[i]; i++) {
        pos ^= key[i];
        if (pos >= t->trie_units) return NULL;
        unit = t->trie[pos];
        if ((unit & ((1u << 31) | 0xFF)) != key[i]) return NULL;
        pos ^= (unit >> 10) << ((unit & (1u << 9)) >> 6);
        if ((unit >> 8) & 1) {
            if (pos >= t->trie_units) return NULL;
            size_t idx = t->trie[pos] & 0x7FFFFFFFu;
            if (idx >= t->norm_len) return NULL;
            *outlen = strlen(t->normalized + idx);
            return t->normalized + idx;
        }
    }
    return NULL;
}

static int norm_precompiled(const tok_tokenizer *t, const char *s, size_t n, core_sbuf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t g = tok_grapheme_len(u + i, n - i), rl;
        const char *r;
        if (g < 6 && (r = charsmap_lookup(t, u + i, g, &rl))) {
            if (core_sbuf_add(out, r, rl)) return -1;
        } else {
            for (size_t j = i; j < i + g;) {
                uint32_t cp;
                size_t cl = (size_t)tok_utf8_decode(u + j, n - j, &cp);
                r = charsmap_lookup(t, u + j, cl, &rl);
                if (r ? core_sbuf_add(out, r, rl) : core_sbuf_add(out, s + j, cl)) return -1;
                j += cl;
            }
        }
        i += g;
    }
    return 0;
}

static int norm_strip(const char *s, size_t n, int left, int right, core_sbuf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n, i = 0, last_end = 0, first = n;
    int seen = 0;
    while (i < n) { /* first and last non-space character */
        uint32_t cp;
        size_t l = (size_t)tok_utf8_decode(u + i, n - i, &cp);
        if (!tok_is_rust_space(cp)) {
            if (!seen) first = i, seen = 1;
            last_end = i + l;
        }
        i += l;
    }
    if (left) a = seen ? first : n;
    if (right) b = seen ? last_end : (left ? n : 0);
    if (b < a) b = a;
    return core_sbuf_add(out, s + a, b - a);
}

static int norm_replace_str(const char *s, size_t n, const char *pat, const char *rep, core_sbuf *out) {
    size_t pl = strlen(pat), rl = strlen(rep), i = 0;
    if (!pl) return core_sbuf_add(out, s, n);
    while (i < n) {
        if (i + pl <= n && !memcmp(s + i, pat, pl)) {
            if (core_sbuf_add(out, rep, rl)) return -1;
            i += pl;
        } else {
            if (core_sbuf_add(out, s + i, 1)) return -1;
            i++;
        }
    }
    return 0;
}

static int norm_replace_spaces(const char *s, size_t n, const char *rep, core_sbuf *out) { /* Regex " {2,}" */
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] == ' ') j++;
        if (j - i >= 2) {
            if (core_sbuf_add(out, rep, strlen(rep))) return -1;
            i = j;
        } else {
            if (core_sbuf_add(out, s + i, 1)) return -1;
            i++;
        }
    }
    return 0;
}

/* Runs the normaliser steps; *res is malloc'd (possibly ""). */
static int normalize(const tok_tokenizer *t, const char *text, char **res, size_t *reslen) {
    core_sbuf cur = {0};
    if (core_sbuf_add(&cur, text, strlen(text))) return -1;
    for (int k = 0; k < t->nsteps; k++) {
        const norm_step *st = &t->steps[k];
        core_sbuf nx = {0};
        int rc = core_sbuf_add(&nx, "", 0);
        if (!rc) {
            if (st->type == STEP_PRECOMPILED) rc = norm_precompiled(t, cur.p, cur.n, &nx);
            else if (st->type == STEP_STRIP) rc = norm_strip(cur.p, cur.n, st->left, st->right, &nx);
            else if (st->type == STEP_REPLACE_STR) rc = norm_replace_str(cur.p, cur.n, st->pattern, st->content, &nx);
            else rc = norm_replace_spaces(cur.p, cur.n, st->content, &nx);
        }
        free(cur.p);
        if (rc) {
            free(nx.p);
            return -1;
        }
        cur = nx;
    }
    *res = cur.p, *reslen = cur.n;
    return 0;
}

/* ---- Unigram Viterbi on one word; appends ids ---- */

typedef struct {
    double score;
    int start; /* -1: not reached */
    int id;
} lnode;

static int emit_unk(const tok_tokenizer *t, const char *s, int len, core_ibuf *out) {
    uint64_t h = hash_bytes(s, len);
    int id = vocab_lookup(t, h, s, len);
    if (id >= 0) return core_ibuf_add(out, id);
    if (t->byte_fallback) {
        int ok = 1;
        for (int i = 0; i < len; i++) ok &= t->byte_ids[(unsigned char)s[i]] >= 0;
        if (ok) {
            for (int i = 0; i < len; i++)
                if (core_ibuf_add(out, t->byte_ids[(unsigned char)s[i]])) return -1;
            return 0;
        }
    }
    if (t->unk_id < 0) return core_error("tokenizer: a character is not in the vocabulary and there is no unk_id");
    return core_ibuf_add(out, t->unk_id);
}

static int viterbi(const tok_tokenizer *t, const char *s, int n, core_ibuf *out) {
    lnode *best = malloc((size_t)(n + 1) * sizeof *best);
    int *path = malloc((size_t)(n + 1) * sizeof *path);
    if (!best || !path) {
        free(best), free(path);
        return core_error("tokenizer: out of memory");
    }
    for (int i = 0; i <= n; i++) best[i].score = 0, best[i].start = -1, best[i].id = -1;
    double unk_score = t->min_score - UNK_PENALTY;
    int pos = 0;
    while (pos < n) {
        uint32_t cp;
        int mblen = tok_utf8_decode((const unsigned char *)s + pos, (size_t)(n - pos), &cp);
        double here = best[pos].score;
        int single = 0;
        uint64_t h = FNV_BASIS;
        for (int l = 1; l <= t->maxlen && pos + l <= n; l++) {
            h = (h ^ (unsigned char)s[pos + l - 1]) * FNV_PRIME;
            int id = vocab_lookup(t, h, s + pos, l);
            if (id < 0) continue;
            double cand = t->scores[id] + here;
            lnode *tg = &best[pos + l];
            if (tg->start < 0 || cand > tg->score) tg->score = cand, tg->start = pos, tg->id = id;
            if (l == mblen) single = 1;
        }
        if (!single) {
            double cand = unk_score + here;
            lnode *tg = &best[pos + mblen];
            if (tg->start < 0 || cand > tg->score) tg->score = cand, tg->start = pos, tg->id = -2; /* unk */
        }
        pos += mblen;
    }
    int np = 0; /* backtrack: node end positions, last first */
    for (int e = n; e > 0; e = best[e].start) path[np++] = e;
    int rc = 0;
    for (int k = np - 1; k >= 0 && !rc;) {
        int e = path[k];
        if (best[e].id == -2) { /* fuse a run of unknowns */
            int a = best[e].start, b = e;
            while (k - 1 >= 0 && best[path[k - 1]].id == -2) b = path[--k];
            rc = emit_unk(t, s + a, b - a, out);
        } else {
            rc = core_ibuf_add(out, best[e].id);
        }
        k--;
    }
    free(best), free(path);
    return rc;
}

/* Normalise + Metaspace; calls fn(word) for each word. */
static int pretokenize(const tok_tokenizer *t, const char *text, int (*fn)(const tok_tokenizer *, const char *, int, void *),
                       void *ctx) {
    char *norm;
    size_t nl;
    if (normalize(t, text, &norm, &nl)) return -1;
    core_sbuf m = {0};
    int rc = core_sbuf_add(&m, "", 0);
    if (!rc && t->has_meta) {
        /* spaces become the replacement first; the prefix is added only when the result does not start with it */
        if (t->prepend && nl > 0 && norm[0] != ' ' && !(nl >= (size_t)t->rep_len && !memcmp(norm, t->rep, (size_t)t->rep_len)))
            rc = core_sbuf_add(&m, t->rep, (size_t)t->rep_len);
        for (size_t i = 0; i < nl && !rc; i++) rc = norm[i] == ' ' ? core_sbuf_add(&m, t->rep, (size_t)t->rep_len) : core_sbuf_add(&m, norm + i, 1);
    } else if (!rc) {
        rc = core_sbuf_add(&m, norm, nl);
    }
    free(norm);
    if (rc) {
        free(m.p);
        return -1;
    }
    size_t start = 0;
    if (t->has_meta && t->split) { /* MergedWithNext: every replacement starts a new word */
        for (size_t i = 1; i <= m.n && !rc; i++) {
            if (i == m.n || (i + (size_t)t->rep_len <= m.n && !memcmp(m.p + i, t->rep, (size_t)t->rep_len))) {
                if (i > start) rc = fn(t, m.p + start, (int)(i - start), ctx);
                start = i;
            }
        }
    } else if (m.n > 0) {
        rc = fn(t, m.p, (int)m.n, ctx);
    }
    free(m.p);
    return rc;
}

static int word_ids(const tok_tokenizer *t, const char *w, int n, void *ctx) { return viterbi(t, w, n, ctx); }

int tok_encode(const tok_tokenizer *t, const char *text, int max_len, int32_t **ids, int *n) {
    *ids = NULL, *n = 0;
    if (!tok_utf8_valid(text, strlen(text))) return core_error("tokenizer: the text is not valid UTF-8");
    core_ibuf body = {0}, all = {0};
    if (pretokenize(t, text, word_ids, &body)) {
        free(body.p);
        return -1;
    }
    int keep = body.n;
    if (max_len > 0) {
        int room = max_len - t->npre - t->npost;
        if (room < 0) room = 0;
        if (keep > room) keep = room;
    }
    int rc = 0;
    for (int i = 0; i < t->npre && !rc; i++) rc = core_ibuf_add(&all, t->pre_ids[i]);
    for (int i = 0; i < keep && !rc; i++) rc = core_ibuf_add(&all, body.p[i]);
    for (int i = 0; i < t->npost && !rc; i++) rc = core_ibuf_add(&all, t->post_ids[i]);
    if (!rc && all.n == 0) rc = core_ibuf_add(&all, 0), all.n = 0; /* a non-NULL empty array */
    free(body.p);
    if (rc) {
        free(all.p);
        return -1;
    }
    *ids = all.p, *n = all.n;
    return 0;
}

static int word_join(const tok_tokenizer *t, const char *w, int n, void *ctx) {
    (void)t;
    core_sbuf *b = ctx;
    if (b->n && core_sbuf_add(b, "|", 1)) return -1;
    return core_sbuf_add(b, w, (size_t)n);
}

char *tok_debug_normalize(const tok_tokenizer *t, const char *text) {
    core_sbuf b = {0};
    if (core_sbuf_add(&b, "", 0) || pretokenize(t, text, word_join, &b)) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

int tok_vocab_size(const tok_tokenizer *t) { return t->nvocab; }
int tok_num_special(const tok_tokenizer *t) { return t->npre + t->npost; }

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->nvocab; i++) free(t->pieces[i]);
    for (int k = 0; k < t->nsteps; k++) free(t->steps[k].pattern), free(t->steps[k].content);
    free(t->pieces), free(t->plen), free(t->scores), free(t->slot_id), free(t->slot_h);
    free(t->trie), free(t->normalized);
    free(t);
}

static int tok_load_json(tok_tokenizer *t, json_t *root, const char *file); /* below */

tok_tokenizer *tok_load(const char *path) {
    char file[4096];
    struct stat st;
    if (stat(path, &st) != 0) {
        core_error("tokenizer: \"%s\" does not exist", path);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (stat(file, &st) != 0) {
            core_error("tokenizer: %s: missing tokenizer.json", path);
            return NULL;
        }
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) {
        core_error("%s: invalid JSON at line %d: %s", file, je.line, je.text);
        return NULL;
    }
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        core_error("tokenizer: out of memory");
        return NULL;
    }
    int rc = tok_load_json(t, root, file);
    json_decref(root);
    if (rc) {
        tok_free(t);
        return NULL;
    }
    return t;
}

/* ---- tokenizer.json sections (used by tok_load_json) ---- */
static int load_step(tok_tokenizer *t, json_t *n, const char *file) {
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return core_error("%s: normalizer without a \"type\"", file);
    if (t->nsteps == MAX_STEPS) return core_error("%s: more than %d normalizers", file, MAX_STEPS);
    norm_step *st = &t->steps[t->nsteps];
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(n, "normalizers"), *v;
        size_t i;
        if (!json_is_array(arr)) return core_error("%s: normalizer Sequence without \"normalizers\"", file);
        json_array_foreach(arr, i, v) if (load_step(t, v, file)) return -1;
        return 0;
    }
    if (!strcmp(type, "Precompiled")) {
        const char *b64 = json_string_value(json_object_get(n, "precompiled_charsmap"));
        if (!b64) return core_error("%s: Precompiled normalizer without \"precompiled_charsmap\"", file);
        if (t->trie) return core_error("%s: two Precompiled normalizers", file);
        if (parse_charsmap(t, b64, file)) return -1;
        st->type = STEP_PRECOMPILED;
    } else if (!strcmp(type, "Strip")) {
        st->type = STEP_STRIP;
        st->left = json_is_true(json_object_get(n, "strip_left"));
        st->right = json_is_true(json_object_get(n, "strip_right"));
    } else if (!strcmp(type, "Replace")) {
        json_t *pat = json_object_get(n, "pattern");
        const char *content = json_string_value(json_object_get(n, "content"));
        const char *s = json_string_value(json_object_get(pat, "String"));
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        if (!content || (!s && !re)) return core_error("%s: Replace normalizer without pattern/content", file);
        if (re && strcmp(re, " {2,}") != 0)
            return core_error("%s: Replace normalizer: unsupported regex \"%s\" (only \" {2,}\")", file, re);
        st->type = s ? STEP_REPLACE_STR : STEP_REPLACE_SPACES;
        st->pattern = strdup(s ? s : " {2,}");
        st->content = strdup(content);
        if (!st->pattern || !st->content) return core_error("tokenizer: out of memory");
    } else {
        return core_error("%s: unsupported normalizer type \"%s\"", file, type);
    }
    t->nsteps++;
    return 0;
}

static int load_pre(tok_tokenizer *t, json_t *p, const char *file) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return core_error("%s: pre_tokenizer without a \"type\"", file);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr) || json_array_size(arr) != 1)
            return core_error("%s: pre_tokenizer Sequence: only a single Metaspace is supported", file);
        return load_pre(t, json_array_get(arr, 0), file);
    }
    if (strcmp(type, "Metaspace") != 0) return core_error("%s: unsupported pre_tokenizer type \"%s\"", file, type);
    const char *rep = json_string_value(json_object_get(p, "replacement"));
    if (!rep || strlen(rep) >= sizeof t->rep || !*rep) return core_error("%s: Metaspace: bad \"replacement\"", file);
    strcpy(t->rep, rep);
    t->rep_len = (int)strlen(rep);
    const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
    if (scheme) {
        if (!strcmp(scheme, "always") || !strcmp(scheme, "first")) t->prepend = 1;
        else if (!strcmp(scheme, "never")) t->prepend = 0;
        else return core_error("%s: Metaspace: unknown prepend_scheme \"%s\"", file, scheme);
    } else {
        json_t *aps = json_object_get(p, "add_prefix_space");
        t->prepend = aps ? json_is_true(aps) : 1;
    }
    json_t *split = json_object_get(p, "split");
    t->split = split ? json_is_true(split) : 1;
    t->has_meta = 1;
    return 0;
}

static int load_post(tok_tokenizer *t, json_t *p, const char *file) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return core_error("%s: unsupported post_processor type \"%s\"", file, type ? type : "(none)");
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *it;
    size_t i;
    int after = 0;
    if (!json_is_array(single)) return core_error("%s: TemplateProcessing without \"single\"", file);
    json_array_foreach(single, i, it) {
        if (json_object_get(it, "Sequence")) {
            after = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(it, "SpecialToken"), "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *v;
        size_t j;
        if (!name || !json_is_array(ids))
            return core_error("%s: TemplateProcessing: special token \"%s\" has no ids", file, name ? name : "?");
        json_array_foreach(ids, j, v) {
            int *cnt = after ? &t->npost : &t->npre;
            int32_t *dst = after ? t->post_ids : t->pre_ids;
            json_int_t id = json_integer_value(v);
            if (*cnt == MAX_SPECIAL || !json_is_integer(v) || id < 0 || id >= t->nvocab)
                return core_error("%s: TemplateProcessing: bad id for \"%s\"", file, name);
            dst[(*cnt)++] = (int32_t)id;
        }
    }
    return 0;
}

static int tok_load_json(tok_tokenizer *t, json_t *root, const char *file) {
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab"), *e;
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "Unigram") != 0)
        return core_error("%s: model type \"%s\" is not supported (only Unigram)", file, mtype ? mtype : "(none)");
    if (!json_is_array(vocab) || json_array_size(vocab) == 0) return core_error("%s: model.vocab missing or empty", file);
    size_t nv = json_array_size(vocab), i;
    if (nv > 0x7FFFFFF) return core_error("%s: model.vocab too large", file);
    t->nvocab = (int)nv;
    t->pieces = calloc(nv, sizeof *t->pieces);
    t->plen = calloc(nv, sizeof *t->plen);
    t->scores = calloc(nv, sizeof *t->scores);
    uint64_t cap = 16;
    while (cap < 2 * nv) cap *= 2;
    t->hmask = cap - 1;
    t->slot_id = malloc(cap * sizeof *t->slot_id);
    t->slot_h = calloc(cap, sizeof *t->slot_h);
    if (!t->pieces || !t->plen || !t->scores || !t->slot_id || !t->slot_h) return core_error("tokenizer: out of memory");
    for (uint64_t k = 0; k < cap; k++) t->slot_id[k] = -1;
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    t->min_score = 1e300;
    json_array_foreach(vocab, i, e) {
        const char *p = json_string_value(json_array_get(e, 0));
        json_t *sc = json_array_get(e, 1);
        if (!p || !json_is_number(sc)) return core_error("%s: model.vocab[%zu] is not [piece, score]", file, i);
        if (!(t->pieces[i] = strdup(p))) return core_error("tokenizer: out of memory");
        t->plen[i] = (int)strlen(p);
        t->scores[i] = json_number_value(sc);
        if (t->scores[i] < t->min_score) t->min_score = t->scores[i];
        if (t->plen[i] > t->maxlen) t->maxlen = t->plen[i];
        vocab_insert(t, (int)i);
        unsigned bv;
        char tail;
        if (t->plen[i] == 6 && sscanf(p, "<0x%2X%c", &bv, &tail) == 2 && tail == '>') t->byte_ids[bv & 0xFF] = (int)i;
    }
    json_t *unk = json_object_get(model, "unk_id");
    t->unk_id = json_is_integer(unk) ? (int)json_integer_value(unk) : -1;
    if (json_is_integer(unk) && (t->unk_id < 0 || t->unk_id >= t->nvocab))
        return core_error("%s: model.unk_id %d outside the vocabulary (%d pieces)", file, t->unk_id, t->nvocab);
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    json_t *n = json_object_get(root, "normalizer");
    if (n && !json_is_null(n) && load_step(t, n, file)) return -1;
    json_t *p = json_object_get(root, "pre_tokenizer");
    if (p && !json_is_null(p) && load_pre(t, p, file)) return -1;
    json_t *pp = json_object_get(root, "post_processor");
    if (pp && !json_is_null(pp) && load_post(t, pp, file)) return -1;
    return 0;
}
