/* model/clip/clip_tokenizer.c — the CLIP tokenizer (byte-level BPE from tokenizer.json); see clip_tokenizer.h.
 *
 * References read to write this: Hugging Face tokenizers (tokenizer/added_vocabulary.rs: the split on added tokens
 * before and after normalisation; normalizers/unicode.rs, replace.rs, NormalizedString::lowercase;
 * pre_tokenizers/split.rs, byte_level.rs: bytes_char and the GPT-2 regex; models/bpe/model.rs and word.rs: the
 * merge order; processors/roberta.rs, template.rs) and transformers' models/clip/tokenization_clip.py (the
 * pipeline CLIPTokenizer builds). The BPE merge loop rescans the word for its lowest-ranked pair after each merge:
 * the order of tokenizers' heap (lowest rank, then leftmost), in O(word length^2), which is nothing for prompts. */
#include "model/clip/clip_tokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "core/error.h"
#include "core/strbuf.h"

#define MAX_NORM 8
#define MAX_SPECIAL 8
#define MAX_ADDED 64

/* The pre-tokenizer pattern of every CLIP tokenizer.json (transformers' CLIPConverter and CLIPTokenizer). */
static const char CLIP_PATTERN[] =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";

typedef enum { NORM_NFC, NORM_SPACES, NORM_LOWER } norm_step;

typedef struct {
    char *s;
    int len, id, normalized;
} added_tok;

struct clip_tokenizer {
    int nvocab;             /* max id + 1 */
    char **tok;             /* [nvocab] token strings (NULL where no token has that id) */
    int *toklen;            /* [nvocab] */
    int *slot;              /* string hash: ids, -1 empty */
    uint64_t smask;
    uint64_t *mkey;         /* merge hash: (left id << 32 | right id) + 1, 0 empty */
    int32_t *mrank, *mid;   /* rank and merged id per slot */
    uint64_t mmask;
    int byte_id[256], byte_eow_id[256]; /* the byte's symbol alone / with end_of_word_suffix, -1 if absent */
    char sym[256][3];       /* GPT-2's printable symbol of each byte, UTF-8 */
    int symlen[256];
    char *eow;              /* end_of_word_suffix ("" when none) */
    int unk_id, ignore_merges, byte_regex;
    norm_step norm[MAX_NORM];
    int nnorm;
    added_tok added[MAX_ADDED];
    int nadded;
    int32_t pre[MAX_SPECIAL], post[MAX_SPECIAL];
    int npre, npost;
    int32_t pad_id;
};


/* ---- Unicode classes (libutf8proc) ---- */
static int is_letter(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
static int is_number(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
/* Unicode White_Space: what Oniguruma's \s matches in tokenizers' regexes (U+0085 and U+00A0 in, U+200B and
 * U+180E out; checked by the fixtures). utf8proc has the categories but not this property list. */
static int is_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
/* 0: letter, 1: number, 2: other non-space, 3: space */
static int char_class(int32_t c) { return is_space(c) ? 3 : is_letter(c) ? 0 : is_number(c) ? 1 : 2; }

/* Decodes the code point at s[0..n) (valid UTF-8: checked on entry). */
static int next_cp(const char *s, size_t n, int32_t *c) {
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, c);
    return k > 0 ? (int)k : 1;
}

static int utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* ---- vocabulary hash (FNV-1a) ---- */
static uint64_t hash_bytes(const char *s, int len) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static int vocab_find(const clip_tokenizer *t, const char *s, int len) {
    for (uint64_t i = hash_bytes(s, len) & t->smask;; i = (i + 1) & t->smask) {
        int id = t->slot[i];
        if (id < 0) return -1;
        if (t->toklen[id] == len && !memcmp(t->tok[id], s, (size_t)len)) return id;
    }
}

static void vocab_insert(clip_tokenizer *t, int id) {
    for (uint64_t i = hash_bytes(t->tok[id], t->toklen[id]) & t->smask;; i = (i + 1) & t->smask) {
        int o = t->slot[i];
        if (o < 0 || (t->toklen[o] == t->toklen[id] && !memcmp(t->tok[o], t->tok[id], (size_t)t->toklen[id]))) {
            t->slot[i] = id;
            return;
        }
    }
}

static uint64_t merge_slot(const clip_tokenizer *t, int a, int b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    for (uint64_t i = (h >> 20) & t->mmask;; i = (i + 1) & t->mmask)
        if (t->mkey[i] == key || t->mkey[i] == 0) return i;
}

/* ---- loading ---- */
void clip_tok_free(clip_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->nvocab; i++) free(t->tok[i]);
    free(t->tok);
    free(t->toklen);
    free(t->slot);
    free(t->mkey);
    free(t->mrank);
    free(t->mid);
    free(t->eow);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].s);
    free(t);
}

static const char *jstr(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

static int parse_normalizer(clip_tokenizer *t, json_t *n, const char *file) {
    if (!n || json_is_null(n)) return 0;
    const char *type = jstr(n, "type");
    if (!type) return core_error("%s: normalizer without a \"type\"", file);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *m;
        size_t i;
        if (!json_is_array(list)) return core_error("%s: normalizer Sequence without \"normalizers\"", file);
        json_array_foreach(list, i, m) if (parse_normalizer(t, m, file)) return -1;
        return 0;
    }
    if (t->nnorm == MAX_NORM) return core_error("%s: more than %d normalizer steps", file, MAX_NORM);
    if (!strcmp(type, "NFC")) {
        t->norm[t->nnorm++] = NORM_NFC;
    } else if (!strcmp(type, "Lowercase")) {
        t->norm[t->nnorm++] = NORM_LOWER;
    } else if (!strcmp(type, "Replace")) {
        const char *re = jstr(json_object_get(n, "pattern"), "Regex"), *content = jstr(n, "content");
        if (!re || strcmp(re, "\\s+") || !content || strcmp(content, " "))
            return core_error("%s: normalizer Replace: only Regex \"\\s+\" -> \" \" is supported (CLIP's)", file);
        t->norm[t->nnorm++] = NORM_SPACES;
    } else {
        return core_error("%s: unsupported normalizer \"%s\" (supported: NFC, Replace \\s+, Lowercase, Sequence)", file,
                          type);
    }
    return 0;
}

static int parse_pre_tokenizer(clip_tokenizer *t, json_t *p, const char *file) {
    const char *type = p ? jstr(p, "type") : NULL;
    json_t *list = type && !strcmp(type, "Sequence") ? json_object_get(p, "pretokenizers") : NULL;
    if (json_array_size(list) != 2)
        return core_error("%s: pre_tokenizer: expected CLIP's Sequence [Split, ByteLevel], got %s", file,
                          type ? type : "none");
    json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    const char *st = jstr(split, "type"), *bt = jstr(bl, "type");
    if (!st || strcmp(st, "Split") || !bt || strcmp(bt, "ByteLevel"))
        return core_error("%s: pre_tokenizer: expected CLIP's Sequence [Split, ByteLevel], got [%s, %s]", file,
                          st ? st : "?", bt ? bt : "?");
    const char *re = jstr(json_object_get(split, "pattern"), "Regex"), *beh = jstr(split, "behavior");
    if (!re || strcmp(re, CLIP_PATTERN))
        return core_error("%s: pre_tokenizer Split: pattern %s is not CLIP's (%s)", file, re ? re : "(not a Regex)",
                          CLIP_PATTERN);
    if (!beh || strcmp(beh, "Removed") || !json_is_true(json_object_get(split, "invert")))
        return core_error("%s: pre_tokenizer Split: expected behavior \"Removed\" with invert true", file);
    if (json_is_true(json_object_get(bl, "add_prefix_space")))
        return core_error("%s: pre_tokenizer ByteLevel: add_prefix_space true is not supported", file);
    json_t *ur = json_object_get(bl, "use_regex");
    t->byte_regex = ur ? json_is_true(ur) : 1; /* tokenizers' default: true */
    return 0;
}

static int special_ids(json_t *pair, int32_t *out, int *n, const char *what, const char *file) {
    json_t *id = json_array_get(pair, 1);
    if (!json_is_integer(id)) return core_error("%s: post_processor %s: expected [token, id]", file, what);
    out[(*n)++] = (int32_t)json_integer_value(id);
    return 0;
}

static int parse_post(clip_tokenizer *t, json_t *p, const char *file) {
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (!type) return core_error("%s: post_processor without a \"type\"", file);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "processors"), *m;
        size_t i;
        json_array_foreach(list, i, m) if (parse_post(t, m, file)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        if (t->npre || t->npost) return core_error("%s: post_processor: two processors add special tokens", file);
        return special_ids(json_object_get(p, "cls"), t->pre, &t->npre, "cls", file) ||
                       special_ids(json_object_get(p, "sep"), t->post, &t->npost, "sep", file)
                   ? -1
                   : 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        if (t->npre || t->npost) return core_error("%s: post_processor: two processors add special tokens", file);
        json_t *single = json_object_get(p, "single"), *sp = json_object_get(p, "special_tokens"), *e;
        size_t i;
        int seen_a = 0;
        json_array_foreach(single, i, e) {
            json_t *st = json_object_get(e, "SpecialToken");
            if (json_object_get(e, "Sequence")) {
                if (seen_a++) return core_error("%s: TemplateProcessing: \"single\" has two sequences", file);
                continue;
            }
            const char *name = jstr(st, "id");
            json_t *ids = json_object_get(json_object_get(sp, name ? name : ""), "ids"), *v;
            size_t k;
            if (!name || !json_is_array(ids))
                return core_error("%s: TemplateProcessing: special token %s not in special_tokens", file,
                                  name ? name : "?");
            json_array_foreach(ids, k, v) {
                int32_t *dst = seen_a ? t->post : t->pre;
                int *nn = seen_a ? &t->npost : &t->npre;
                if (*nn == MAX_SPECIAL) return core_error("%s: TemplateProcessing: too many special tokens", file);
                dst[(*nn)++] = (int32_t)json_integer_value(v);
            }
        }
        if (!seen_a) return core_error("%s: TemplateProcessing: \"single\" has no $A", file);
        return 0;
    }
    return core_error("%s: unsupported post_processor \"%s\" (supported: RobertaProcessing, BertProcessing, "
                      "TemplateProcessing, ByteLevel, Sequence)", file, type);
}

static int set_token(clip_tokenizer *t, int id, const char *s, size_t len, const char *file) {
    if (id < 0 || id >= t->nvocab) return core_error("%s: token id %d out of range", file, id);
    if (t->tok[id]) {
        if ((size_t)t->toklen[id] == len && !memcmp(t->tok[id], s, len)) return 0;
        return core_error("%s: id %d names two tokens", file, id);
    }
    t->tok[id] = malloc(len + 1);
    if (!t->tok[id]) return core_error("clip tokenizer: out of memory");
    memcpy(t->tok[id], s, len);
    t->tok[id][len] = 0;
    t->toklen[id] = (int)len;
    return 0;
}

static int parse_model(clip_tokenizer *t, json_t *m, json_t *added, const char *file) {
    const char *type = jstr(m, "type");
    if (!type || strcmp(type, "BPE"))
        return core_error("%s: model type %s: only BPE is supported", file, type ? type : "none");
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges"), *v, *e;
    if (!json_is_object(vocab) || !json_is_array(merges))
        return core_error("%s: BPE model without \"vocab\" object or \"merges\" list", file);
    const char *prefix = jstr(m, "continuing_subword_prefix");
    if (prefix && *prefix) return core_error("%s: BPE continuing_subword_prefix \"%s\" is not supported", file, prefix);
    if (json_is_true(json_object_get(m, "byte_fallback")))
        return core_error("%s: BPE byte_fallback is not supported", file);
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout)) return core_error("%s: BPE dropout is not supported", file);
    const char *eow = jstr(m, "end_of_word_suffix");
    t->eow = strdup(eow ? eow : "");
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    const char *key;
    size_t i;
    int maxid = -1;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT_MAX / 2)
            return core_error("%s: vocab[\"%s\"] is not a valid id", file, key);
        if (json_integer_value(v) > maxid) maxid = (int)json_integer_value(v);
    }
    json_array_foreach(added, i, e) {
        json_int_t id = json_integer_value(json_object_get(e, "id"));
        if (id < 0 || id >= INT_MAX / 2)
            return core_error("%s: added_tokens[%zu]: id %lld out of range", file, i, (long long)id);
        if (id > maxid) maxid = (int)id;
    }
    t->nvocab = maxid + 1;
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)t->nvocab) cap *= 2;
    t->smask = cap - 1;
    t->tok = calloc((size_t)t->nvocab + 1, sizeof *t->tok);
    t->toklen = calloc((size_t)t->nvocab + 1, sizeof *t->toklen);
    t->slot = malloc(cap * sizeof *t->slot);
    if (!t->tok || !t->toklen || !t->slot || !t->eow) return core_error("clip tokenizer: out of memory");
    memset(t->slot, -1, cap * sizeof *t->slot);
    json_object_foreach(vocab, key, v) if (set_token(t, (int)json_integer_value(v), key, strlen(key), file)) return -1;
    json_array_foreach(added, i, e) {
        const char *s = jstr(e, "content");
        json_t *id = json_object_get(e, "id");
        if (!s || !json_is_integer(id)) return core_error("%s: added_tokens[%zu]: expected content and id", file, i);
        if (set_token(t, (int)json_integer_value(id), s, strlen(s), file)) return -1;
        if (json_is_true(json_object_get(e, "lstrip")) || json_is_true(json_object_get(e, "rstrip")) ||
            json_is_true(json_object_get(e, "single_word")))
            return core_error("%s: added token \"%s\": lstrip / rstrip / single_word are not supported", file, s);
        if (!*s) continue;
        if (t->nadded == MAX_ADDED) return core_error("%s: more than %d added tokens", file, MAX_ADDED);
        added_tok *a = &t->added[t->nadded++];
        a->s = strdup(s), a->len = (int)strlen(s), a->id = (int)json_integer_value(id);
        a->normalized = json_is_true(json_object_get(e, "normalized"));
        if (!a->s) return core_error("clip tokenizer: out of memory");
    }
    for (int id = 0; id < t->nvocab; id++)
        if (t->tok[id]) vocab_insert(t, id);
    const char *unk = jstr(m, "unk_token");
    t->unk_id = unk ? vocab_find(t, unk, (int)strlen(unk)) : -1;
    if (unk && t->unk_id < 0) return core_error("%s: unk_token \"%s\" is not in the vocabulary", file, unk);

    /* merges: "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20) */
    size_t nm = json_array_size(merges);
    uint64_t mcap = 16;
    while (mcap < 2 * (uint64_t)nm + 2) mcap *= 2;
    t->mmask = mcap - 1;
    t->mkey = calloc(mcap, sizeof *t->mkey);
    t->mrank = malloc(mcap * sizeof *t->mrank);
    t->mid = malloc(mcap * sizeof *t->mid);
    if (!t->mkey || !t->mrank || !t->mid) return core_error("clip tokenizer: out of memory");
    core_sbuf cat = {0};
    int rc = 0;
    json_array_foreach(merges, i, e) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = core_error("%s: merges[%zu] \"%s\" is not \"a b\"", file, i, a);
                break;
            }
            la = (size_t)(sp - a), b = sp + 1, lb = strlen(b);
        } else if (json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0)), b = json_string_value(json_array_get(e, 1));
            la = strlen(a), lb = strlen(b);
        } else {
            rc = core_error("%s: merges[%zu] is neither \"a b\" nor [a, b]", file, i);
            break;
        }
        int ia = vocab_find(t, a, (int)la), ib = vocab_find(t, b, (int)lb);
        cat.n = 0;
        if (core_sbuf_add(&cat, a, la) || core_sbuf_add(&cat, b, lb)) {
            rc = -1;
            break;
        }
        int im = vocab_find(t, cat.p, (int)cat.n);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = core_error("%s: merges[%zu] (\"%.*s\" \"%.*s\"): %s not in the vocabulary", file, i, (int)la, a, (int)lb,
                            b, ia < 0 ? "the left part is" : ib < 0 ? "the right part is" : "the merged token is");
            break;
        }
        uint64_t s = merge_slot(t, ia, ib);
        if (t->mkey[s]) continue; /* a repeated merge keeps its first rank */
        t->mkey[s] = ((uint64_t)(uint32_t)ia << 32 | (uint32_t)ib) + 1;
        t->mrank[s] = (int32_t)i, t->mid[s] = im;
    }
    free(cat.p);
    return rc;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for U+0100 onwards. */
static int build_byte_symbols(clip_tokenizer *t, const char *file) {
    int extra = 0;
    size_t eowl = strlen(t->eow);
    char buf[64];
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int32_t cp = printable ? b : 256 + extra++;
        t->symlen[b] = (int)utf8proc_encode_char(cp, (utf8proc_uint8_t *)t->sym[b]);
    }
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = vocab_find(t, t->sym[b], t->symlen[b]);
        if (eowl < sizeof buf - 4) {
            memcpy(buf, t->sym[b], (size_t)t->symlen[b]);
            memcpy(buf + t->symlen[b], t->eow, eowl);
            t->byte_eow_id[b] = vocab_find(t, buf, t->symlen[b] + (int)eowl);
        } else {
            t->byte_eow_id[b] = -1;
        }
        if ((t->byte_id[b] < 0 || t->byte_eow_id[b] < 0) && t->unk_id < 0)
            return core_error("%s: byte 0x%02X has no symbol in the vocabulary and there is no unk_token", file, b);
    }
    return 0;
}

static int32_t lookup_pad(clip_tokenizer *t, json_t *root, const char *dir, const char *file) {
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        struct stat st;
        if (!stat(path, &st)) {
            json_error_t je;
            json_t *cfg = json_load_file(path, 0, &je);
            if (!cfg) return core_error("%s:%d: %s", path, je.line, je.text);
            json_t *p = json_object_get(cfg, "pad_token");
            const char *s = json_is_object(p) ? jstr(p, "content") : json_string_value(p);
            int32_t id = -2;
            if (s) {
                id = vocab_find(t, s, (int)strlen(s));
                if (id < 0) core_error("%s: pad_token \"%s\" is not in the vocabulary", path, s);
            }
            json_decref(cfg);
            if (id != -2) return id < 0 ? -1 : (t->pad_id = id, 0);
        }
    }
    json_t *pid = json_object_get(json_object_get(root, "padding"), "pad_id");
    if (json_is_integer(pid)) {
        t->pad_id = (int32_t)json_integer_value(pid);
        if (t->pad_id < 0 || t->pad_id >= t->nvocab) return core_error("%s: padding.pad_id %d out of range", file, t->pad_id);
        return 0;
    }
    t->pad_id = t->npost ? t->post[t->npost - 1] : 0;
    return 0;
}

clip_tokenizer *clip_tok_load(const char *path) {
    char file[4096], dir[4096];
    struct stat st;
    int is_dir = !stat(path, &st) && S_ISDIR(st.st_mode);
    if (is_dir) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    if (stat(file, &st)) {
        core_error("%s: missing tokenizer.json (the CLIP tokenizer)", is_dir ? path : file);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) {
        core_error("%s:%d: %s", file, je.line, je.text);
        return NULL;
    }
    clip_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        core_error("clip tokenizer: out of memory");
        json_decref(root);
        return NULL;
    }
    if (parse_model(t, json_object_get(root, "model"), json_object_get(root, "added_tokens"), file) ||
        parse_normalizer(t, json_object_get(root, "normalizer"), file) ||
        parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), file) ||
        parse_post(t, json_object_get(root, "post_processor"), file) || build_byte_symbols(t, file) ||
        lookup_pad(t, root, is_dir ? dir : NULL, file)) {
        json_decref(root);
        clip_tok_free(t);
        return NULL;
    }
    json_decref(root);
    for (int i = 0; i < t->npre + t->npost; i++) {
        int32_t id = i < t->npre ? t->pre[i] : t->post[i - t->npre];
        if (id < 0 || id >= t->nvocab) {
            core_error("%s: post_processor: special token id %d is outside the vocabulary", file, id);
            clip_tok_free(t);
            return NULL;
        }
    }
    return t;
}

int clip_tok_vocab_size(const clip_tokenizer *t) { return t->nvocab; }
int32_t clip_tok_bos_id(const clip_tokenizer *t) { return t->npre ? t->pre[0] : -1; }
int32_t clip_tok_eos_id(const clip_tokenizer *t) { return t->npost ? t->post[t->npost - 1] : -1; }
int32_t clip_tok_pad_id(const clip_tokenizer *t) { return t->pad_id; }

/* ---- encoding ---- */

/* The normalizer steps on s[0..n), into *out (malloc'd, NUL-terminated; *outn bytes). */
static int normalize(const clip_tokenizer *t, const char *s, size_t n, char **out, size_t *outn) {
    core_sbuf cur = {0};
    if (core_sbuf_add(&cur, s, n)) return -1;
    for (int k = 0; k < t->nnorm; k++) {
        core_sbuf nx = {0};
        if (t->norm[k] == NORM_NFC) {
            utf8proc_uint8_t *m = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur.p, (utf8proc_ssize_t)cur.n, &m,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0) {
                free(cur.p);
                return core_error("clip tokenizer: NFC: %s", utf8proc_errmsg(r));
            }
            int rc = core_sbuf_add(&nx, (const char *)m, (size_t)r);
            free(m);
            if (rc) {
                free(cur.p);
                return -1;
            }
        } else {
            int in_space = 0;
            for (size_t i = 0; i < cur.n;) {
                int32_t c;
                int l = next_cp(cur.p + i, cur.n - i, &c);
                int rc = 0;
                if (t->norm[k] == NORM_SPACES) {
                    if (is_space(c)) {
                        if (!in_space) rc = core_sbuf_add(&nx, " ", 1);
                        in_space = 1;
                    } else {
                        rc = core_sbuf_add(&nx, cur.p + i, (size_t)l), in_space = 0;
                    }
                } else if (c == 0x130) { /* the one unconditional multi-character lowercase mapping */
                    rc = core_sbuf_add(&nx, "i\xCC\x87", 3);
                } else {
                    utf8proc_uint8_t e[4];
                    rc = core_sbuf_add(&nx, (const char *)e, (size_t)utf8proc_encode_char(utf8proc_tolower(c), e));
                }
                if (rc) {
                    free(cur.p), free(nx.p);
                    return -1;
                }
                i += (size_t)l;
            }
        }
        free(cur.p);
        cur = nx;
        if (!cur.p && core_sbuf_add(&cur, "", 0)) return -1;
    }
    *out = cur.p, *outn = cur.n;
    return 0;
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd) at s[0..n), or 0. */
static size_t contraction(const char *s, size_t n) {
    if (n < 2 || s[0] != '\'') return 0;
    if (strchr("stmd", s[1])) return 2;
    if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') || (s[1] == 'l' && s[2] == 'l'))) return 3;
    return 0;
}

/* End of the run of characters of class cls starting at s[i] (one character when cls is a number and single). */
static size_t run_end(const char *s, size_t n, size_t i, int cls, int single) {
    int32_t c;
    i += (size_t)next_cp(s + i, n - i, &c);
    if (single) return i;
    while (i < n) {
        int l = next_cp(s + i, n - i, &c);
        if (char_class(c) != cls) break;
        i += (size_t)l;
    }
    return i;
}

/* BPE of one word (bytes s[0..n)), its ids appended to out; or with dbg, the word appended in byte symbols. */
static int bpe_word(const clip_tokenizer *t, const char *s, size_t n, core_ibuf *out, core_sbuf *dbg) {
    if (!n) return 0;
    if (dbg) {
        if (dbg->n && core_sbuf_add(dbg, "|", 1)) return -1;
        for (size_t i = 0; i < n; i++)
            if (core_sbuf_add(dbg, t->sym[(unsigned char)s[i]], (size_t)t->symlen[(unsigned char)s[i]])) return -1;
        return 0;
    }
    if (t->ignore_merges) {
        core_sbuf w = {0};
        int rc = 0;
        for (size_t i = 0; i < n && !rc; i++) rc = core_sbuf_add(&w, t->sym[(unsigned char)s[i]], (size_t)t->symlen[(unsigned char)s[i]]);
        if (!rc) rc = core_sbuf_add(&w, t->eow, strlen(t->eow));
        int id = rc ? -1 : vocab_find(t, w.p, (int)w.n);
        free(w.p);
        if (rc) return -1;
        if (id >= 0) return core_ibuf_add(out, id);
    }
    int32_t *sym = malloc(n * sizeof *sym);
    if (!sym) return core_error("clip tokenizer: out of memory");
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int id = i + 1 == n ? t->byte_eow_id[b] : t->byte_id[b];
        sym[m++] = id >= 0 ? id : t->unk_id;
    }
    for (;;) {
        int best = INT_MAX, at = -1;
        int32_t merged = -1;
        for (int i = 0; i + 1 < m; i++) {
            uint64_t k = merge_slot(t, sym[i], sym[i + 1]);
            if (t->mkey[k] && t->mrank[k] < best) best = t->mrank[k], at = i, merged = t->mid[k];
        }
        if (at < 0) break;
        sym[at] = merged;
        memmove(sym + at + 1, sym + at + 2, (size_t)(m - at - 2) * sizeof *sym);
        m--;
    }
    int rc = 0;
    for (int i = 0; i < m && !rc; i++) rc = core_ibuf_add(out, sym[i]);
    free(sym);
    return rc;
}

/* ByteLevel's GPT-2 split of one word (no whitespace inside): contractions, then runs of letters, numbers, others. */
static int byte_level(const clip_tokenizer *t, const char *s, size_t n, core_ibuf *out, core_sbuf *dbg) {
    if (!t->byte_regex) return bpe_word(t, s, n, out, dbg);
    for (size_t i = 0; i < n;) {
        size_t e = contraction(s + i, n - i);
        if (e) {
            e += i;
        } else {
            int32_t c;
            next_cp(s + i, n - i, &c);
            e = run_end(s, n, i, char_class(c), 0);
        }
        if (bpe_word(t, s + i, e - i, out, dbg)) return -1;
        i = e;
    }
    return 0;
}

/* The Split pre-tokenizer (CLIP's pattern, matches kept, the rest dropped) over normalised text. */
static int pre_tokenize(const clip_tokenizer *t, const char *s, size_t n, core_ibuf *out, core_sbuf *dbg) {
    static const char *lit[2] = {"<|startoftext|>", "<|endoftext|>"};
    for (size_t i = 0; i < n;) {
        int32_t c;
        int l = next_cp(s + i, n - i, &c);
        int cls = char_class(c);
        if (cls == 3) {
            i += (size_t)l;
            continue;
        }
        size_t e = 0;
        for (int k = 0; k < 2 && !e; k++)
            if (n - i >= strlen(lit[k]) && !memcmp(s + i, lit[k], strlen(lit[k]))) e = i + strlen(lit[k]);
        if (!e && (e = contraction(s + i, n - i))) e += i;
        if (!e) e = run_end(s, n, i, cls, cls == 1);
        if (byte_level(t, s + i, e - i, out, dbg)) return -1;
        i = e;
    }
    return 0;
}

/* Leftmost-longest added token among those with the given `normalized` flag in s[0..n): its index, and *at. */
static int find_added(const clip_tokenizer *t, const char *s, size_t n, int normalized, size_t *at) {
    for (size_t i = 0; i < n; i++) {
        int best = -1;
        for (int k = 0; k < t->nadded; k++) {
            const added_tok *a = &t->added[k];
            if (a->normalized != normalized || (size_t)a->len > n - i || memcmp(s + i, a->s, (size_t)a->len)) continue;
            if (best < 0 || a->len > t->added[best].len) best = k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

static int emit_added(const clip_tokenizer *t, int k, core_ibuf *out, core_sbuf *dbg) {
    if (!dbg) return core_ibuf_add(out, t->added[k].id);
    return (dbg->n && core_sbuf_add(dbg, "|", 1)) || core_sbuf_add(dbg, t->added[k].s, (size_t)t->added[k].len) ? -1 : 0;
}

/* Normalised text: split on the normalized added tokens, the rest pre-tokenised and BPE'd. */
static int encode_normalized(const clip_tokenizer *t, const char *s, size_t n, core_ibuf *out, core_sbuf *dbg) {
    while (n) {
        size_t at;
        int k = find_added(t, s, n, 1, &at);
        size_t stop = k < 0 ? n : at;
        if (pre_tokenize(t, s, stop, out, dbg)) return -1;
        if (k < 0) break;
        if (emit_added(t, k, out, dbg)) return -1;
        s += at + (size_t)t->added[k].len, n -= at + (size_t)t->added[k].len;
    }
    return 0;
}

/* The content tokens of text[0..len) (no special tokens of the post-processor). */
static int encode_content(const clip_tokenizer *t, const char *s, size_t n, core_ibuf *out, core_sbuf *dbg) {
    if (!utf8_valid(s, n)) return core_error("clip tokenizer: the text is not valid UTF-8");
    while (n) {
        size_t at;
        int k = find_added(t, s, n, 0, &at);
        size_t stop = k < 0 ? n : at;
        if (stop) {
            char *norm;
            size_t nn;
            if (normalize(t, s, stop, &norm, &nn)) return -1;
            int rc = encode_normalized(t, norm, nn, out, dbg);
            free(norm);
            if (rc) return -1;
        }
        if (k < 0) break;
        if (emit_added(t, k, out, dbg)) return -1;
        s += at + (size_t)t->added[k].len, n -= at + (size_t)t->added[k].len;
    }
    return 0;
}

int clip_tok_encode(const clip_tokenizer *t, const char *text, size_t len, int max_len, int32_t **ids, int *n) {
    int nspecial = t->npre + t->npost;
    if (max_len > 0 && max_len < nspecial)
        return core_error("clip tokenizer: max_length %d is smaller than the %d special tokens", max_len, nspecial);
    core_ibuf b = {0};
    for (int i = 0; i < t->npre; i++)
        if (core_ibuf_add(&b, t->pre[i])) goto fail;
    if (encode_content(t, text, len, &b, NULL)) goto fail;
    if (max_len > 0 && b.n + t->npost > max_len) b.n = max_len - t->npost;
    for (int i = 0; i < t->npost; i++)
        if (core_ibuf_add(&b, t->post[i])) goto fail;
    *ids = b.p, *n = b.n;
    return 0;
fail:
    free(b.p);
    return -1;
}

int clip_tok_encode_padded(const clip_tokenizer *t, const char *text, size_t len, int max_len, int32_t *ids,
                           int *n_real) {
    if (max_len <= 0) return core_error("clip tokenizer: max_length %d must be positive for padding", max_len);
    int32_t *e;
    int n;
    if (clip_tok_encode(t, text, len, max_len, &e, &n)) return -1;
    memcpy(ids, e, (size_t)n * sizeof *ids);
    for (int i = n; i < max_len; i++) ids[i] = t->pad_id;
    free(e);
    if (n_real) *n_real = n;
    return 0;
}

char *clip_tok_debug_words(const clip_tokenizer *t, const char *text, size_t len) {
    core_sbuf d = {0};
    if (core_sbuf_add(&d, "", 0) || encode_content(t, text, len, NULL, &d)) {
        free(d.p);
        return NULL;
    }
    return d.p;
}
