/* tests/fuzz/fuzz_config.c — libFuzzer target for the YAML config loader (`make fuzz`).
 *
 * The input's first line is a --set assignment, the rest a YAML document. When the document loads: its flow-style
 * rewrite must load back to an equal tree; the --set is applied; a schema with every value type is applied; and
 * when that succeeds, the dumped resolved config must apply again to the same values. Any crash, sanitizer report,
 * leak or broken round trip (abort) is a finding. Seeds: seeds-fuzz_config/. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"

typedef struct {
    int i;
    int64_t i64;
    float f;
    double d;
    bool b;
    char *s;
    core_cfg_strings ss;
    core_cfg_ints is;
    core_cfg_doubles ds;
    core_cfg_node *t;
} fz;

static const core_cfg_entry schema[] = {
    {.key = "i", .type = CORE_CFG_INT, .offset = offsetof(fz, i), .def = "1", .flags = CORE_CFG_MIN, .min = -5},
    {.key = "a.i64", .type = CORE_CFG_INT64, .offset = offsetof(fz, i64)},
    {.key = "a.f", .type = CORE_CFG_FLOAT, .offset = offsetof(fz, f), .def = "0.5"},
    {.key = "a.b.d", .type = CORE_CFG_DOUBLE, .offset = offsetof(fz, d), .flags = CORE_CFG_MAX_OPEN, .max = 1e300},
    {.key = "b", .type = CORE_CFG_BOOL, .offset = offsetof(fz, b)},
    {.key = "s", .type = CORE_CFG_STRING, .offset = offsetof(fz, s), .def = "x"},
    {.key = "l.s", .type = CORE_CFG_STRINGS, .offset = offsetof(fz, ss)},
    {.key = "l.i", .type = CORE_CFG_INTS, .offset = offsetof(fz, is)},
    {.key = "l.d", .type = CORE_CFG_DOUBLES, .offset = offsetof(fz, ds)},
    {.key = "t", .type = CORE_CFG_TREE, .offset = offsetof(fz, t)},
    {0},
};

static int same_tree(const core_cfg_node *a, const core_cfg_node *b) {
    if (a->kind != b->kind || a->n != b->n) return 0;
    if (a->kind == CORE_NODE_SCALAR)
        return !strcmp(a->text, b->text) || (core_config_is_null(a) && core_config_is_null(b));
    for (int i = 0; i < a->n; i++)
        if ((a->keys && strcmp(a->keys[i], b->keys[i])) || !same_tree(a->items[i], b->items[i])) return 0;
    return 1;
}

static int same_bits(const void *a, const void *b, size_t n) { return !memcmp(a, b, n); }

static int same_values(const fz *x, const fz *y) {
    if (x->i != y->i || x->i64 != y->i64 || !same_bits(&x->f, &y->f, 4) || !same_bits(&x->d, &y->d, 8) ||
        x->b != y->b || (!x->s != !y->s) || (x->s && strcmp(x->s, y->s)) || x->ss.n != y->ss.n || x->is.n != y->is.n ||
        x->ds.n != y->ds.n || !x->t != !y->t || (x->t && !same_tree(x->t, y->t)))
        return 0;
    for (int k = 0; k < x->ss.n; k++)
        if (strcmp(x->ss.v[k], y->ss.v[k])) return 0;
    for (int k = 0; k < x->is.n; k++)
        if (x->is.v[k] != y->is.v[k]) return 0;
    for (int k = 0; k < x->ds.n; k++)
        if (!same_bits(&x->ds.v[k], &y->ds.v[k], 8)) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data, *nl = memchr(data, '\n', size);
    size_t setlen = nl ? (size_t)(nl - text) : 0;
    char *set = strndup(text, setlen);
    const char *doc = nl ? nl + 1 : text;
    size_t doclen = size - (size_t)(doc - text);
    core_cfg_node *r = NULL, *r2 = NULL;
    if (!set || core_config_load_string(doc, doclen, "fuzz.yaml", &r) != 0) goto done;

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f || core_config_write_flow(r, f) != 0) abort();
    fclose(f);
    if (core_config_load_string(buf, len, "flow", &r2) != 0 || !same_tree(r, r2)) abort();
    free(buf);

    if (memchr(set, '\0', setlen) == NULL && *set) (void)core_config_set(r, set);
    fz a, b;
    if (core_config_apply(r, schema, &a) == 0) {
        buf = NULL;
        f = open_memstream(&buf, &len);
        if (!f || core_config_dump(schema, &a, f) != 0) abort();
        fclose(f);
        core_cfg_node *r3;
        if (core_config_load_string(buf, len, "dump", &r3) != 0) abort();
        if (core_config_apply(r3, schema, &b) != 0 || !same_values(&a, &b)) abort();
        core_config_release(schema, &b);
        core_config_free(r3);
        free(buf);
    }
    core_config_release(schema, &a);
done:
    core_config_free(r);
    core_config_free(r2);
    free(set);
    return 0;
}
