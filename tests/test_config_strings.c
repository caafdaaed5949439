/* tests/test_config_strings.c — strings survive the config round trip (core/config.h): every string key of the
 * recipe schema, given text that YAML reads as line breaks (NEL U+0085, LS U+2028, PS U+2029), characters YAML does
 * not allow raw (C1 controls, U+FEFF, U+FFFF), quotes, backslashes and text that looks like another YAML type, is
 * dumped (config.resolved.yaml), loaded again and extracted to the same bytes; a --set value holding a raw line
 * break is refused naming the key instead of becoming a space. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/recipe.h"
#include "tests/test.h"

/* One string as YAML double-quoted text (yaml) and the bytes it loads as (want). */
typedef struct {
    const char *yaml, *want;
} nasty;

static const nasty NASTY[] = {
    {"p\\Lq", "p\xe2\x80\xa8q"},             /* LS */
    {"p\\Pq", "p\xe2\x80\xa9q"},             /* PS */
    {"p\\Nq", "p\xc2\x85q"},                 /* NEL */
    {"\\x80\\x9f\\x85", "\xc2\x80\xc2\x9f\xc2\x85"}, /* C1 controls */
    {"\\uFEFFx\\uFFFE\\uFFFF", "\xef\xbb\xbfx\xef\xbf\xbe\xef\xbf\xbf"},
    {"a\\\"b\\\\c", "a\"b\\c"},
    {" lead and trail ", " lead and trail "},
    {"tab\\tnl\\ncr\\r\\x01\\x7f", "tab\tnl\ncr\r\x01\x7f"},
    {"k: v # c", "k: v # c"},
    {"- [a, {b}]", "- [a, {b}]"},
    {"null", "null"},
    {"yes", "yes"},
    {"1e3", "1e3"},
    {".inf", ".inf"},
    {"", ""},
    {"\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\xa8 \\xa0nbsp", "\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\xa8 \xc2\xa0nbsp"},
};
#define N_NASTY ((int)(sizeof NASTY / sizeof NASTY[0]))

/* The recipe's dump as text (malloc'd). */
static char *dump(const core_recipe *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    REQUIRE_OK(core_config_dump(core_recipe_schema, r, f));
    fclose(f);
    return buf;
}

/* Applies text (a whole recipe) to *r. */
static int apply_text(const char *text, const char *name, core_recipe *r) {
    core_cfg_node *root;
    memset(r, 0, sizeof *r); /* releasable even when the text does not load */
    if (core_config_load_string(text, strlen(text), name, &root)) return -1;
    const int rc = core_config_apply(root, core_recipe_schema, r);
    core_config_free(root);
    return rc;
}

TEST(config_string_keys_roundtrip) {
    static const char base[] = "model: {path: m, dtype: fp32}\ndata: {prompt_file: p}\n";
    int keys = 0;
    for (const core_cfg_entry *e = core_recipe_schema; e->key; e++) {
        if ((e->type != CORE_CFG_STRING && e->type != CORE_CFG_STRINGS) || e->choices) continue;
        keys++;
        for (int k = 0; k < N_NASTY; k++) {
            core_cfg_node *root;
            REQUIRE_OK(core_config_load_string(base, strlen(base), "recipe.yaml", &root));
            char set[512];
            if (e->type == CORE_CFG_STRING) snprintf(set, sizeof set, "%s=\"%s\"", e->key, NASTY[k].yaml);
            else snprintf(set, sizeof set, "%s=[\"%s\", x]", e->key, NASTY[k].yaml);
            REQUIRE_OK(core_config_set(root, set));
            core_recipe r, r2;
            const int rc = core_config_apply(root, core_recipe_schema, &r);
            core_config_free(root);
            CHECK_MSG(rc == 0, "%s: %s", set, core_last_error());
            if (rc) {
                core_config_release(core_recipe_schema, &r);
                continue;
            }
            const char *got = e->type == CORE_CFG_STRING ? *(char **)((char *)&r + e->offset)
                                                         : ((core_cfg_strings *)((char *)&r + e->offset))->v[0];
            CHECK_MSG(got && !strcmp(got, NASTY[k].want), "%s: loaded other bytes", set);
            char *text = dump(&r);
            const int rc2 = apply_text(text, "config.resolved.yaml", &r2);
            CHECK_MSG(rc2 == 0, "%s: the dump does not load again: %s\n%s", set, core_last_error(), text);
            if (rc2 == 0) {
                const char *back = e->type == CORE_CFG_STRING ? *(char **)((char *)&r2 + e->offset)
                                                              : ((core_cfg_strings *)((char *)&r2 + e->offset))->v[0];
                CHECK_MSG(back && !strcmp(back, NASTY[k].want), "%s: the dump loads back as other bytes", set);
                char *text2 = dump(&r2);
                CHECK_MSG(!strcmp(text, text2), "%s: the second dump differs", set);
                free(text2);
            }
            free(text);
            core_config_release(core_recipe_schema, &r);
            core_config_release(core_recipe_schema, &r2);
        }
    }
    CHECK_MSG(keys >= 8, "only %d free string keys in the recipe schema", keys);
}

/* The raw characters are never written: the dump escapes them (and so stays one line per key). */
TEST(config_write_string_escapes_breaks) {
    static const struct {
        const char *s, *want;
    } cases[] = {
        {"p\xe2\x80\xa8q", "\"p\\Lq\""},
        {"p\xe2\x80\xa9q", "\"p\\Pq\""},
        {"p\xc2\x85q", "\"p\\Nq\""},
        {"\xc2\x80\xef\xbb\xbf", "\"\\x80\\ufeff\""},
        {"plain \xc3\xa9t\xc3\xa9", "plain \xc3\xa9t\xc3\xa9"}, /* printable non-ASCII stays plain and raw */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        REQUIRE(f);
        core_config_write_string(cases[i].s, f);
        fclose(f);
        CHECK_MSG(!strcmp(buf, cases[i].want), "case %zu: wrote %s, want %s", i, buf, cases[i].want);
        free(buf);
    }
    /* a map key with a line break, written as flow text, loads back as the same key */
    static const char doc[] = "{\"a\\Lb\": \"c\\Nd\", \"\\P\": [\"\\x85\"]}";
    core_cfg_node *r, *r2;
    REQUIRE_OK(core_config_load_string(doc, strlen(doc), "t.yaml", &r));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    REQUIRE_OK(core_config_write_flow(r, f));
    fclose(f);
    CHECK_MSG(core_config_load_string(buf, len, "flow", &r2) == 0, "%s: %s", buf, core_last_error());
    const core_cfg_node *v = core_config_child(r2, "a\xe2\x80\xa8" "b");
    CHECK(v && !strcmp(v->text, "c\xc2\x85" "d"));
    v = core_config_child(r2, "\xe2\x80\xa9");
    CHECK(v && v->kind == CORE_NODE_SEQ && v->n == 1 && !strcmp(v->items[0]->text, "\xc2\x85"));
    free(buf);
    core_config_free(r);
    core_config_free(r2);
}

/* --set: a raw line break in the value was folded into a space (U+0085 in logging.run_dir became ' '); now it is
 * refused naming the key, and the escape in double quotes gives the character. */
TEST(config_set_refuses_raw_line_breaks) {
    static const struct {
        const char *set, *what;
    } bad[] = {
        {"logging.run_dir=p\xc2\x85q", "U+0085 NEL at byte 2"},
        {"logging.run_dir=p\xe2\x80\xa8q", "U+2028 LS"},
        {"logging.run_dir=\"p\xe2\x80\xa9q\"", "U+2029 PS at byte 3"},
        {"logging.run_dir=p\nq", "LF"},
        {"logging.run_dir=p\rq", "CR"},
    };
    core_cfg_node *root;
    static const char base[] = "logging: {run_dir: a}\n";
    REQUIRE_OK(core_config_load_string(base, strlen(base), "recipe.yaml", &root));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_MSG(core_config_set(root, bad[i].set) == -1, "case %zu accepted", i);
        const char *err = core_last_error();
        CHECK_MSG(strstr(err, "--set logging.run_dir: the value holds a line break") && strstr(err, bad[i].what),
                  "case %zu: %s", i, err);
        CHECK(!strcmp(core_config_get(root, "logging.run_dir")->text, "a")); /* unchanged */
    }
    REQUIRE_OK(core_config_set(root, "logging.run_dir=\"p\\Nq\""));
    CHECK(!strcmp(core_config_get(root, "logging.run_dir")->text, "p\xc2\x85q"));
    core_config_free(root);
}
