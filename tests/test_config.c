/* tests/test_config.c — YAML config trees, --set overrides, schema extraction and every error path (with the
 * message's file, line and key), and dump -> reload round trips. */
#include <stddef.h>
#include <string.h>

#include "core/config.h"
#include "tests/test.h"

/* Loads text named "recipe.yaml"; NULL (and the error in core_last_error) on failure. */
static core_cfg_node *load(const char *text) {
    core_cfg_node *r;
    return core_config_load_string(text, strlen(text), "recipe.yaml", &r) ? NULL : r;
}

/* Expects loading text to fail with an error containing want. */
#define CHECK_LOAD_ERROR(text, want)                                                                                   \
    do {                                                                                                               \
        core_cfg_node *r_ = load(text);                                                                                \
        CHECK_MSG(!r_, "loaded without error: %s", text);                                                              \
        core_config_free(r_);                                                                                          \
        CHECK_MSG(strstr(core_last_error(), want), "error \"%s\" lacks \"%s\"", core_last_error(), want);              \
    } while (0)

#define CHECK_ERR(expr, want)                                                                                          \
    do {                                                                                                               \
        int rc_ = (expr);                                                                                              \
        CHECK_MSG(rc_ == -1, "%s succeeded", #expr);                                                                   \
        CHECK_MSG(strstr(core_last_error(), want), "error \"%s\" lacks \"%s\"", core_last_error(), want);              \
    } while (0)

TEST(config_tree_nesting_lines) {
    const char *text = "# a recipe\n"                     /* 1 */
                       "mode: local\n"                    /* 2 */
                       "rollout:\n"                       /* 3 */
                       "  num_steps: 10\n"                /* 4 */
                       "  sizes:\n"                       /* 5 */
                       "    - 256\n"                      /* 6 */
                       "    - {h: 32, w: 48}\n"           /* 7 */
                       "  sde: {eta: 0.7, name: 'a b'}\n" /* 8 */
                       "empty:\n"                         /* 9 */
                       "quoted: \"12\"\n";                /* 10 */
    core_cfg_node *r = load(text);
    REQUIRE_OK(r ? 0 : -1);
    CHECK(r->kind == CORE_NODE_MAP && r->n == 4 && !strcmp(r->where, "recipe.yaml") && !strcmp(r->path, ""));
    const core_cfg_node *n = core_config_get(r, "rollout.num_steps");
    REQUIRE(n);
    CHECK(n->kind == CORE_NODE_SCALAR && !strcmp(n->text, "10") && n->line == 4 && n->col == 3);
    CHECK(!strcmp(n->where, "recipe.yaml:4") && !strcmp(n->path, "rollout.num_steps"));
    n = core_config_get(r, "rollout.sizes");
    REQUIRE(n && n->kind == CORE_NODE_SEQ && n->n == 2 && n->line == 5);
    CHECK(n->items[0]->line == 6 && !strcmp(n->items[0]->path, "rollout.sizes.0"));
    n = core_config_get(r, "rollout.sizes.1.w");
    REQUIRE(n);
    CHECK(!strcmp(n->text, "48") && n->line == 7 && !strcmp(n->path, "rollout.sizes.1.w"));
    CHECK(core_config_get(r, "rollout.sizes.2") == NULL);
    CHECK(core_config_get(r, "rollout.num_steps.x") == NULL);
    CHECK(core_config_get(r, "nope") == NULL);
    CHECK(core_config_get(r, "") == r && core_config_get(r, NULL) == r);
    CHECK(core_config_child(core_config_get(r, "rollout"), "sde")->n == 2);
    CHECK(core_config_is_null(core_config_get(r, "empty")));

    int64_t i;
    double d;
    bool b;
    const char *s;
    REQUIRE_OK(core_config_get_int(r, "rollout.num_steps", &i));
    CHECK(i == 10);
    REQUIRE_OK(core_config_get_double(r, "rollout.sde.eta", &d));
    CHECK(d == 0.7);
    REQUIRE_OK(core_config_get_double(r, "rollout.sizes.0", &d)); /* integers read as numbers */
    CHECK(d == 256.0);
    REQUIRE_OK(core_config_get_string(r, "rollout.sde.name", &s));
    CHECK(!strcmp(s, "a b"));
    REQUIRE_OK(core_config_get_string(r, "empty", &s));
    CHECK(s == NULL);
    REQUIRE_OK(core_config_get_string(r, "quoted", &s));
    CHECK(!strcmp(s, "12"));
    CHECK_ERR(core_config_get_int(r, "quoted", &i),
              "recipe.yaml:10: quoted: expected an integer, got the quoted string \"12\"");
    CHECK_ERR(core_config_get_int(r, "rollout.missing", &i), "recipe.yaml: missing key \"rollout.missing\"");
    CHECK_ERR(core_config_get_bool(r, "rollout.sde", &b),
              "recipe.yaml:8: rollout.sde: expected true or false, got a map");
    CHECK_ERR(core_config_get_string(r, "rollout.sizes", &s),
              "recipe.yaml:5: rollout.sizes: expected a string, got a list");
    CHECK_ERR(core_config_get_double(r, "empty", &d), "recipe.yaml:9: empty: expected a number, got null");
    CHECK_ERR(core_config_as_int(r, &i), "recipe.yaml: (top level): expected an integer, got a map");
    core_config_free(r);

    /* JSON (diffusers config.json) loads through the same path. */
    const char *json = "{\"_class_name\": \"WanTransformer3DModel\", \"num_layers\": 2, \"patch_size\": [1, 2, 2],\n"
                       " \"eps\": 1e-06, \"qk_norm\": \"rms_norm_across_heads\", \"added_kv_proj_dim\": null}";
    REQUIRE_OK(core_config_load_string(json, strlen(json), "config.json", &r));
    REQUIRE_OK(core_config_get_int(r, "patch_size.2", &i));
    CHECK(i == 2);
    REQUIRE_OK(core_config_get_double(r, "eps", &d));
    CHECK(d == 1e-06);
    CHECK(core_config_is_null(core_config_get(r, "added_kv_proj_dim")));
    core_config_free(r);

    /* An empty or comment-only document is an empty map. */
    r = load("# nothing\n");
    REQUIRE(r);
    CHECK(r->kind == CORE_NODE_MAP && r->n == 0);
    core_config_free(r);
}

TEST(config_scalar_types) {
    const char *text = "i1: 42\ni2: -7\ni3: +3\ni4: 0x1F\ni5: 0o17\ni6: 007\n"
                       "f1: 1e-4\nf2: .5\nf3: 2.\nf4: -.inf\nf5: .nan\nf6: 6.02E+23\nf7: 1_000\n"
                       "b1: true\nb2: False\nb3: yes\nb4: TRUE\n"
                       "n1: ~\nn2: null\nn3: NULL\nn4: ''\n"
                       "big: 9223372036854775808\nhuge: 1e999\nstr: !!str 5\nblock: |\n  two\n  lines\n";
    core_cfg_node *r = load(text);
    REQUIRE(r);
    int64_t i;
    double d;
    bool b;
    const int64_t want_i[6] = {42, -7, 3, 31, 15, 7};
    for (int k = 0; k < 6; k++) {
        char key[8];
        snprintf(key, sizeof key, "i%d", k + 1);
        REQUIRE_OK(core_config_get_int(r, key, &i));
        CHECK_MSG(i == want_i[k], "%s = %lld", key, (long long)i);
    }
    REQUIRE_OK(core_config_get_double(r, "f1", &d));
    CHECK(d == 1e-4);
    REQUIRE_OK(core_config_get_double(r, "f2", &d));
    CHECK(d == 0.5);
    REQUIRE_OK(core_config_get_double(r, "f3", &d));
    CHECK(d == 2.0);
    REQUIRE_OK(core_config_get_double(r, "f4", &d));
    CHECK(isinf(d) && d < 0);
    REQUIRE_OK(core_config_get_double(r, "f5", &d));
    CHECK(isnan(d));
    REQUIRE_OK(core_config_get_double(r, "f6", &d));
    CHECK(d == 6.02e23);
    REQUIRE_OK(core_config_get_double(r, "i4", &d));
    CHECK(d == 31.0);
    CHECK_ERR(core_config_get_double(r, "f7", &d), "recipe.yaml:13: f7: expected a number, got \"1_000\"");
    CHECK_ERR(core_config_get_int(r, "f1", &i), "recipe.yaml:7: f1: expected an integer, got \"1e-4\"");
    REQUIRE_OK(core_config_get_bool(r, "b1", &b));
    CHECK(b);
    REQUIRE_OK(core_config_get_bool(r, "b2", &b));
    CHECK(!b);
    REQUIRE_OK(core_config_get_bool(r, "b4", &b));
    CHECK(b);
    CHECK_ERR(core_config_get_bool(r, "b3", &b), "recipe.yaml:16: b3: expected true or false, got \"yes\"");
    for (int k = 1; k <= 3; k++) {
        char key[8];
        snprintf(key, sizeof key, "n%d", k);
        CHECK_MSG(core_config_is_null(core_config_get(r, key)), "%s not null", key);
    }
    CHECK(!core_config_is_null(core_config_get(r, "n4"))); /* quoted empty string is a string */
    CHECK_ERR(core_config_get_int(r, "big", &i),
              "recipe.yaml:22: big: 9223372036854775808 is out of range for a 64-bit integer");
    CHECK_ERR(core_config_get_double(r, "huge", &d), "recipe.yaml:23: huge: 1e999 is out of range for a double");
    CHECK_ERR(core_config_get_int(r, "str", &i), "expected an integer, got the quoted string \"5\"");
    const char *s;
    REQUIRE_OK(core_config_get_string(r, "block", &s));
    CHECK(!strcmp(s, "two\nlines\n"));
    core_config_free(r);
}

TEST(config_syntax_errors) {
    CHECK_LOAD_ERROR("a:\n\tb: 1\n", "recipe.yaml:2:1: YAML syntax error: found character that cannot start any token");
    CHECK_LOAD_ERROR("a:\n  b: 1\n\tc: 2\n", "recipe.yaml:3:1: YAML syntax error");
    CHECK_LOAD_ERROR("a: [1, 2\n", "recipe.yaml:2:1: YAML syntax error: did not find expected ',' or ']'");
    CHECK_LOAD_ERROR("a: b: c\n", "recipe.yaml:1:5: YAML syntax error: mapping values are not allowed");
    CHECK_LOAD_ERROR("x: 0\nrollout:\n  steps: 1\n  eta: 2\n  steps: 3\n",
                     "recipe.yaml:5: duplicate key \"rollout.steps\" (first at line 3)");
    CHECK_LOAD_ERROR("base: &b {x: 1}\nother: *b\n",
                     "recipe.yaml:1:7: YAML anchors and aliases are not supported (found &b)");
    CHECK_LOAD_ERROR("- *x\n", "recipe.yaml:1:3: YAML anchors and aliases are not supported (found *x)");
    CHECK_LOAD_ERROR("a: !!python/object 1\n",
                     "recipe.yaml:1:4: YAML tag \"tag:yaml.org,2002:python/object\" is not supported");
    CHECK_LOAD_ERROR("a: 1\n---\nb: 2\n", "recipe.yaml:2: more than one YAML document");
    CHECK_LOAD_ERROR("? [a]\n: b\n", "recipe.yaml:1:3: map keys must be plain text");
    CHECK_LOAD_ERROR("a: \"x\\0y\"\n", "recipe.yaml:1: a: text contains a NUL character");
    CHECK_LOAD_ERROR("a: \xff\n", "recipe.yaml: byte 3: cannot read the text: invalid leading UTF-8 octet");
    char deep[200];
    memset(deep, '[', 70);
    memset(deep + 70, ']', 70);
    deep[140] = '\0';
    CHECK_LOAD_ERROR(deep, "nesting deeper than 64 levels");
    core_cfg_node *r;
    CHECK_ERR(core_config_load_file("/nonexistent/recipe.yaml", &r),
              "/nonexistent/recipe.yaml: cannot open: No such file");
}

TEST(config_set_overrides) {
    core_cfg_node *r = load("rollout:\n  num_steps: 10\n  sizes: [1, 2]\nreward:\nname: x\n");
    REQUIRE(r);
    int64_t i;
    const char *s;
    REQUIRE_OK(core_config_set(r, "rollout.num_steps=4"));
    const core_cfg_node *n = core_config_get(r, "rollout.num_steps");
    REQUIRE(n);
    CHECK(!strcmp(n->text, "4") && n->line == 0 && !strcmp(n->where, "--set rollout.num_steps=4"));
    REQUIRE_OK(core_config_set(r, "optim.adam.beta2=0.99")); /* creates optim and optim.adam */
    n = core_config_get(r, "optim.adam");
    REQUIRE(n && n->kind == CORE_NODE_MAP && !strcmp(n->path, "optim.adam"));
    REQUIRE_OK(core_config_set(r, "rollout.sizes.1=7"));
    REQUIRE_OK(core_config_get_int(r, "rollout.sizes.1", &i));
    CHECK(i == 7);
    REQUIRE_OK(core_config_set(r, "rollout.sizes=[3, 4, 5]"));
    n = core_config_get(r, "rollout.sizes");
    REQUIRE(n && n->kind == CORE_NODE_SEQ && n->n == 3 && !strcmp(n->items[2]->path, "rollout.sizes.2"));
    CHECK(!strcmp(n->items[2]->where, "--set rollout.sizes=[3, 4, 5]"));
    REQUIRE_OK(core_config_set(r, "reward.scorer.weight=2")); /* `reward:` was null: becomes a map */
    REQUIRE_OK(core_config_get_int(r, "reward.scorer.weight", &i));
    CHECK(i == 2);
    REQUIRE_OK(core_config_set(r, "name=\"a = b\""));
    REQUIRE_OK(core_config_get_string(r, "name", &s));
    CHECK(!strcmp(s, "a = b"));
    REQUIRE_OK(core_config_set(r, "name="));
    CHECK(core_config_is_null(core_config_get(r, "name")));
    REQUIRE_OK(core_config_set(r, "model={preset: tiny, layers: 2}"));
    REQUIRE_OK(core_config_get_string(r, "model.preset", &s));
    CHECK(!strcmp(s, "tiny"));
    CHECK(!strcmp(core_config_get(r, "model.layers")->path, "model.layers"));

    CHECK_ERR(
        core_config_set(r, "rollout.num_steps.x=1"),
        "--set rollout.num_steps.x=1: \"rollout.num_steps\" is a single value (--set rollout.num_steps=4), not a map");
    CHECK_ERR(core_config_set(r, "model.preset.x=1"),
              "\"model.preset\" is a single value (--set model={preset: tiny, layers: 2}), not a map");
    core_config_free(r);
    r = load("a:\n  b: 3\n  c: [1]\n");
    REQUIRE(r);
    CHECK_ERR(core_config_set(r, "a.b.c=1"), "--set a.b.c=1: \"a.b\" is a single value (recipe.yaml:2), not a map");
    CHECK_ERR(core_config_set(r, "a.c.5=1"),
              "--set a.c.5=1: \"a.c\" is a list of 1 items (recipe.yaml:3); \"5\" is not an index");
    CHECK_ERR(core_config_set(r, "a.c.x=1"), "\"x\" is not an index");
    CHECK_ERR(core_config_set(r, "a.b"), "--set a.b: expected key.path=value");
    CHECK_ERR(core_config_set(r, "a..b=1"), "--set a..b=1: empty key in path \"a..b\"");
    CHECK_ERR(core_config_set(r, "=1"), "--set =1: empty key in path \"\"");
    CHECK_ERR(core_config_set(r, "a.\xff=1"), "--set a.\\xff=1: the key path is not printable UTF-8 text");
    CHECK_ERR(core_config_set(r, "a.\x01=1"), "the key path is not printable UTF-8 text");
    CHECK_ERR(core_config_set(r, "a.b=[1,"),
              "--set a.b=[1,: YAML syntax error: did not find expected node content (while parsing a flow node)");
    CHECK_ERR(core_config_set(r, "a.b=&x 1"), "--set a.b=&x 1: YAML anchors and aliases are not supported");
    /* A failed --set leaves the tree as it was. */
    REQUIRE_OK(core_config_get_int(r, "a.b", &i));
    CHECK(i == 3);
    core_config_free(r);
}

/* ---- schema ---- */

typedef struct {
    char *mode;
    int num_steps;
    int64_t seed;
    float eta;
    double lr;
    bool cfg;
    char *prompt_file;
    char *note;
    core_cfg_strings scorers;
    core_cfg_ints sizes;
    core_cfg_doubles weights;
    core_cfg_node *extra;
    double beta;
} recipe;

static const core_cfg_entry schema[] = {
    {.key = "mode",
     .type = CORE_CFG_STRING,
     .offset = offsetof(recipe, mode),
     .def = "local",
     .choices = "local|colocated",
     .help = "process layout"},
    {.key = "data.prompt_file",
     .type = CORE_CFG_STRING,
     .offset = offsetof(recipe, prompt_file),
     .flags = CORE_CFG_REQUIRED,
     .help = "training prompts"},
    {.key = "rollout.num_steps",
     .type = CORE_CFG_INT,
     .offset = offsetof(recipe, num_steps),
     .def = "20",
     .flags = CORE_CFG_MIN | CORE_CFG_MAX,
     .min = 1,
     .max = 1000,
     .help = "denoising steps"},
    {.key = "data.seed", .type = CORE_CFG_INT64, .offset = offsetof(recipe, seed), .def = "42"},
    {.key = "rollout.eta",
     .type = CORE_CFG_FLOAT,
     .offset = offsetof(recipe, eta),
     .def = "0.7",
     .flags = CORE_CFG_MIN | CORE_CFG_MAX_OPEN,
     .min = 0,
     .max = 1},
    {.key = "optim.lr",
     .type = CORE_CFG_DOUBLE,
     .offset = offsetof(recipe, lr),
     .def = "1e-5",
     .flags = CORE_CFG_MIN_OPEN,
     .min = 0},
    {.key = "rollout.cfg", .type = CORE_CFG_BOOL, .offset = offsetof(recipe, cfg), .def = "true"},
    {.key = "rollout.sizes",
     .type = CORE_CFG_INTS,
     .offset = offsetof(recipe, sizes),
     .def = "[256, 512]",
     .flags = CORE_CFG_MIN,
     .min = 16},
    {.key = "reward.scorers",
     .type = CORE_CFG_STRINGS,
     .offset = offsetof(recipe, scorers),
     .def = "[color]",
     .choices = "color|count|aesthetic"},
    {.key = "reward.weights", .type = CORE_CFG_DOUBLES, .offset = offsetof(recipe, weights)},
    {.key = "reward.extra", .type = CORE_CFG_TREE, .offset = offsetof(recipe, extra)},
    {.key = "algorithm.kl.beta",
     .type = CORE_CFG_DOUBLE,
     .offset = offsetof(recipe, beta),
     .def = "0.04",
     .flags = CORE_CFG_MIN,
     .min = 0},
    {.key = "logging.note", .type = CORE_CFG_STRING, .offset = offsetof(recipe, note)},
    {0},
};

/* Loads text, applies the sets, then the schema; returns apply's result (tree freed). */
static int apply_text(const char *text, const char *const *sets, recipe *rc) {
    core_cfg_node *r = load(text);
    if (!r) return -1;
    int ret = 0;
    for (int k = 0; sets && sets[k] && ret == 0; k++) ret = core_config_set(r, sets[k]);
    if (ret == 0) ret = core_config_apply(r, schema, rc);
    core_config_free(r);
    return ret;
}

#define CHECK_APPLY_ERROR(text, sets, want)                                                                            \
    do {                                                                                                               \
        recipe rr_;                                                                                                    \
        memset(&rr_, 0x5a, sizeof rr_); /* garbage: apply must reset before anything can fail */                       \
        CHECK_ERR(apply_text(text, sets, &rr_), want);                                                                 \
        core_config_release(schema, &rr_);                                                                             \
    } while (0)

static const char *good = "mode: colocated\n"                              /* 1 */
                          "data:\n"                                        /* 2 */
                          "  prompt_file: prompts/train.txt\n"             /* 3 */
                          "  seed: 7\n"                                    /* 4 */
                          "rollout:\n"                                     /* 5 */
                          "  num_steps: 10\n"                              /* 6 */
                          "  eta: 0.5\n"                                   /* 7 */
                          "  sizes: [32, 64]\n"                            /* 8 */
                          "reward:\n"                                      /* 9 */
                          "  scorers: [color, count]\n"                    /* 10 */
                          "  weights: [1, 0.25]\n"                         /* 11 */
                          "  extra: {endpoint: \"ipc://x\", retries: 3}\n" /* 12 */
                          "algorithm:\n"                                   /* 13 */
                          "  kl:\n"                                        /* 14 */
                          "    beta: 0.1\n";                               /* 15 */

TEST(config_apply_values_defaults) {
    recipe rc;
    REQUIRE_OK(apply_text(good, NULL, &rc));
    CHECK(!strcmp(rc.mode, "colocated") && !strcmp(rc.prompt_file, "prompts/train.txt"));
    CHECK(rc.seed == 7 && rc.num_steps == 10 && rc.eta == 0.5f && rc.beta == 0.1);
    CHECK(rc.sizes.n == 2 && rc.sizes.v[0] == 32 && rc.sizes.v[1] == 64);
    CHECK(rc.scorers.n == 2 && !strcmp(rc.scorers.v[1], "count"));
    CHECK(rc.weights.n == 2 && rc.weights.v[0] == 1.0 && rc.weights.v[1] == 0.25);
    REQUIRE(rc.extra);
    int64_t i;
    REQUIRE_OK(core_config_get_int(rc.extra, "retries", &i)); /* the copy outlives the tree */
    CHECK(i == 3);
    CHECK(!strcmp(core_config_get(rc.extra, "endpoint")->where, "recipe.yaml:12"));
    /* Defaults. */
    CHECK(rc.lr == 1e-5 && rc.cfg == true && rc.note == NULL);
    core_config_release(schema, &rc);
    CHECK(rc.mode == NULL && rc.sizes.n == 0 && rc.sizes.v == NULL && rc.extra == NULL);

    const char *minimal = "data: {prompt_file: p.txt}\n";
    REQUIRE_OK(apply_text(minimal, NULL, &rc));
    CHECK(!strcmp(rc.mode, "local") && rc.num_steps == 20 && rc.seed == 42 && rc.eta == 0.7f);
    CHECK(rc.sizes.n == 2 && rc.sizes.v[1] == 512 && rc.scorers.n == 1 && !strcmp(rc.scorers.v[0], "color"));
    CHECK(rc.weights.n == 0 && rc.extra == NULL && rc.beta == 0.04);
    core_config_release(schema, &rc);

    /* --set overrides in order, and empty sections are allowed. */
    const char *sets[] = {"rollout.num_steps=3",
                          "rollout.num_steps=5",
                          "optim.lr=2.5e-6",
                          "reward.weights=[]",
                          "logging.note='# not a comment'",
                          NULL};
    REQUIRE_OK(apply_text("data: {prompt_file: p.txt}\noptim:\n", sets, &rc));
    CHECK(rc.num_steps == 5 && rc.lr == 2.5e-6 && rc.weights.n == 0 && !strcmp(rc.note, "# not a comment"));
    core_config_release(schema, &rc);
}

TEST(config_apply_errors) {
    const char *p = "data: {prompt_file: p.txt}\n";
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  nm_steps: 3\n", NULL,
                      "recipe.yaml:3: unknown key \"rollout.nm_steps\" (did you mean \"rollout.num_steps\"?)");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  seed: 3\n", NULL,
                      "recipe.yaml:3: unknown key \"rollout.seed\" (did you mean \"data.seed\"?)");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrolout:\n  num_steps: 3\n", NULL,
                      "recipe.yaml:2: unknown key \"rolout\" (did you mean \"rollout\"?)");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nzzz_totally_else: 1\n", NULL,
                      "recipe.yaml:2: unknown key \"zzz_totally_else\"");
    {
        const char *sets[] = {"rollout.nm_steps=3", NULL};
        CHECK_APPLY_ERROR(
            p, sets,
            "--set rollout.nm_steps=3: unknown key \"rollout.nm_steps\" (did you mean \"rollout.num_steps\"?)");
        const char *sets2[] = {"rollout.num_steps=ten", NULL};
        CHECK_APPLY_ERROR(p, sets2, "--set rollout.num_steps=ten: rollout.num_steps: expected an integer, got \"ten\"");
    }
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  num_steps: ten\n", NULL,
                      "recipe.yaml:3: rollout.num_steps: expected an integer, got \"ten\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  num_steps: 0\n", NULL,
                      "recipe.yaml:3: rollout.num_steps: must be >= 1, got 0");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  num_steps: 1001\n", NULL,
                      "recipe.yaml:3: rollout.num_steps: must be <= 1000, got 1001");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {eta: 1.0}\n", NULL,
                      "recipe.yaml:2: rollout.eta: must be < 1, got 1.0");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {eta: .nan}\n", NULL,
                      "rollout.eta: must be >= 0, got .nan");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {eta: 0.9999999999}\n", NULL, /* rounds to 1.0f */
                      "rollout.eta: must be < 1, got 0.9999999999");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\noptim: {lr: 0}\n", NULL,
                      "recipe.yaml:2: optim.lr: must be > 0, got 0");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {eta: 1e39}\n", NULL,
                      "rollout.eta: 1e39 is out of range for a float");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {num_steps: 4294967296}\n", NULL,
                      "rollout.num_steps: 4294967296 is out of range for a 32-bit integer");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {cfg: yes}\n", NULL,
                      "recipe.yaml:2: rollout.cfg: expected true or false, got \"yes\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nmode: distributed\n", NULL,
                      "recipe.yaml:2: mode: must be one of local|colocated, got \"distributed\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nreward:\n  scorers:\n    - color\n    - size\n", NULL,
                      "recipe.yaml:5: reward.scorers.1: must be one of color|count|aesthetic, got \"size\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  sizes: [32, 8]\n", NULL,
                      "recipe.yaml:3: rollout.sizes.1: must be >= 16, got 8");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout:\n  sizes: 32\n", NULL,
                      "recipe.yaml:3: rollout.sizes: expected a list of integers, got \"32\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nreward: {weights: [1, x]}\n", NULL,
                      "recipe.yaml:2: reward.weights.1: expected a number, got \"x\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nreward: {scorers: [color, [a]]}\n", NULL,
                      "reward.scorers.1: expected a string, got a list");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: 3\n", NULL,
                      "recipe.yaml:2: rollout: expected a map of settings (it is a section), got \"3\"");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nalgorithm: {kl: [1]}\n", NULL,
                      "recipe.yaml:2: algorithm.kl: expected a map of settings (it is a section), got a list");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\nrollout: {num_steps: {a: 1}}\n", NULL,
                      "rollout.num_steps: expected an integer, got a map");
    CHECK_APPLY_ERROR("data: {prompt_file: p.txt}\n\"rollout.num_steps\": 3\n", NULL,
                      "recipe.yaml:2: key \"rollout.num_steps\" is not a plain name");
    CHECK_APPLY_ERROR("mode: local\n", NULL, "recipe.yaml: missing required key \"data.prompt_file\"");
    CHECK_APPLY_ERROR("data: {prompt_file: null}\n", NULL,
                      "recipe.yaml:1: data.prompt_file: a value is required, got null");
    CHECK_APPLY_ERROR("- a\n- b\n", NULL, "recipe.yaml: (top level): expected a map of settings, got a list");
}

TEST(config_schema_errors) {
    recipe rc;
    core_cfg_node *r = load("data: {prompt_file: p}\n");
    REQUIRE(r);
    static const core_cfg_entry dup[] = {
        {.key = "a.b", .type = CORE_CFG_INT, .offset = 0}, {.key = "a.b", .type = CORE_CFG_INT, .offset = 4}, {0}};
    CHECK_ERR(core_config_apply(r, dup, &rc), "schema: key \"a.b\" declared twice");
    static const core_cfg_entry nest[] = {
        {.key = "a", .type = CORE_CFG_INT, .offset = 0}, {.key = "a.b", .type = CORE_CFG_INT, .offset = 4}, {0}};
    CHECK_ERR(core_config_apply(r, nest, &rc), "schema: \"a\" and \"a.b\": one is a setting inside the other");
    static const core_cfg_entry badkey[] = {{.key = "a..b", .type = CORE_CFG_INT}, {0}};
    CHECK_ERR(core_config_apply(r, badkey, &rc), "schema: bad key \"a..b\"");
    static const core_cfg_entry baddef[] = {
        {.key = "data.prompt_file", .type = CORE_CFG_STRING, .offset = offsetof(recipe, prompt_file)},
        {.key = "n", .type = CORE_CFG_INT, .offset = offsetof(recipe, num_steps), .def = "many"},
        {0}};
    CHECK_ERR(core_config_apply(r, baddef, &rc), "schema default: n: expected an integer, got \"many\"");
    core_config_release(baddef, &rc);
    static const core_cfg_entry defrange[] = {
        {.key = "data.prompt_file", .type = CORE_CFG_STRING, .offset = offsetof(recipe, prompt_file)},
        {.key = "n",
         .type = CORE_CFG_INT,
         .offset = offsetof(recipe, num_steps),
         .def = "0",
         .flags = CORE_CFG_MIN,
         .min = 1},
        {0}};
    CHECK_ERR(core_config_apply(r, defrange, &rc), "schema default: n: must be >= 1, got 0");
    core_config_release(defrange, &rc);
    core_config_free(r);
}

static int recipes_equal(const recipe *a, const recipe *b) {
    int ok = !strcmp(a->mode, b->mode) && !strcmp(a->prompt_file, b->prompt_file) && a->num_steps == b->num_steps &&
             a->seed == b->seed && memcmp(&a->eta, &b->eta, sizeof a->eta) == 0 &&
             memcmp(&a->lr, &b->lr, sizeof a->lr) == 0 && a->cfg == b->cfg &&
             memcmp(&a->beta, &b->beta, sizeof a->beta) == 0 && a->sizes.n == b->sizes.n &&
             a->scorers.n == b->scorers.n && a->weights.n == b->weights.n && (a->note == NULL) == (b->note == NULL) &&
             (!a->note || !strcmp(a->note, b->note));
    for (int i = 0; ok && i < a->sizes.n; i++) ok = a->sizes.v[i] == b->sizes.v[i];
    for (int i = 0; ok && i < a->scorers.n; i++) ok = !strcmp(a->scorers.v[i], b->scorers.v[i]);
    for (int i = 0; ok && i < a->weights.n; i++) ok = !memcmp(&a->weights.v[i], &b->weights.v[i], sizeof(double));
    return ok;
}

/* Loads the YAML written by core_config_dump back through the schema. */
static int dump_reload(const recipe *in, recipe *out, char *text, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.resolved.yaml", test_tmpdir());
    FILE *f = fopen(path, "w");
    if (!f || core_config_dump(schema, in, f) != 0) return -1;
    fclose(f);
    f = fopen(path, "r");
    size_t n = fread(text, 1, cap - 1, f);
    text[n] = '\0';
    fclose(f);
    core_cfg_node *r;
    if (core_config_load_file(path, &r)) return -1;
    int rc = core_config_apply(r, schema, out);
    core_config_free(r);
    return rc;
}

TEST(config_dump_roundtrip) {
    recipe a, b;
    char text[4096];
    REQUIRE_OK(apply_text(good, NULL, &a));
    REQUIRE_OK(dump_reload(&a, &b, text, sizeof text));
    CHECK(recipes_equal(&a, &b));
    /* Sections nested once each, in schema order; values in their shortest form. */
    const char *want = "mode: colocated\n"
                       "data:\n"
                       "  prompt_file: prompts/train.txt\n"
                       "  seed: 7\n"
                       "rollout:\n"
                       "  num_steps: 10\n"
                       "  eta: 0.5\n"
                       "  cfg: true\n"
                       "  sizes: [32, 64]\n"
                       "optim:\n"
                       "  lr: 1e-05\n"
                       "reward:\n"
                       "  scorers: [color, count]\n"
                       "  weights: [1.0, 0.25]\n"
                       "  extra: {endpoint: \"ipc://x\", retries: 3}\n"
                       "algorithm:\n"
                       "  kl:\n"
                       "    beta: 0.1\n"
                       "logging:\n"
                       "  note: null\n";
    CHECK_MSG(!strcmp(text, want), "dump:\n%s", text);
    REQUIRE(b.extra);
    int64_t i;
    REQUIRE_OK(core_config_get_int(b.extra, "retries", &i));
    CHECK(i == 3);
    core_config_release(schema, &b);

    /* Awkward values: strings that look like other types or hold YAML syntax; doubles needing 17 digits. */
    static const char *const tricky[] = {"true",        "123", "null", "",           " lead",
                                         "a: b",        "#x",  "[x]",  "it's \"q\"", "line\nbreak\ttab",
                                         "caf\xc3\xa9", "-",   "yes",  "1e5",        "back\\slash"};
    for (size_t k = 0; k < sizeof tricky / sizeof tricky[0]; k++) {
        free(a.note);
        a.note = strdup(tricky[k]);
        free(a.prompt_file);
        a.prompt_file = strdup(tricky[k]);
        a.lr = k % 2 ? 1.0 / 3.0 : 5e-324;
        a.beta = k % 3 ? -0.0 : 0.1 + 0.2;
        a.eta = k % 2 ? 0.1f : 1.0f / 3.0f;
        a.weights.v[0] = k % 2 ? INFINITY : 1e300;
        a.seed = INT64_MIN + (int64_t)k;
        REQUIRE_OK(dump_reload(&a, &b, text, sizeof text));
        CHECK_MSG(recipes_equal(&a, &b), "value %zu: \"%s\" did not round-trip:\n%s", k, tricky[k], text);
        core_config_release(schema, &b);
    }
    core_config_release(schema, &a);
}

/* Structural equality of two trees (flow writing may quote a plain string that holds ':' or ',': same string). */
static int trees_equal(const core_cfg_node *a, const core_cfg_node *b) {
    if (a->kind != b->kind || a->n != b->n) return 0;
    if (a->kind == CORE_NODE_SCALAR) {
        if (strcmp(a->text, b->text) && !(core_config_is_null(a) && core_config_is_null(b))) return 0;
        return 1;
    }
    for (int i = 0; i < a->n; i++) {
        if (a->kind == CORE_NODE_MAP && strcmp(a->keys[i], b->keys[i])) return 0;
        if (!trees_equal(a->items[i], b->items[i])) return 0;
    }
    return 1;
}

TEST(config_flow_roundtrip) {
    const char *text = "a:\n  b: [1, -2.5, x, 'q, r', \"s: t\", ~, '']\n  c: {d: true, 'e f': {g: []}}\n"
                       "h: |\n  multi\n  line\ni: \"tab\\there\"\nj: -x\nk: a:b\nl: folded\n\n\n  plain\n";
    core_cfg_node *r = load(text);
    REQUIRE(r);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    REQUIRE_OK(core_config_write_flow(r, f));
    fclose(f);
    core_cfg_node *r2;
    REQUIRE_OK(core_config_load_string(buf, len, "flow", &r2));
    CHECK_MSG(trees_equal(r, r2), "flow text: %s", buf);
    /* Plain numbers stay plain (numbers), quoted stay strings. */
    CHECK(!core_config_get(r2, "a.b.1")->quoted && core_config_get(r2, "a.b.6")->quoted);
    free(buf);
    core_cfg_node *c = core_config_copy(r);
    REQUIRE(c);
    CHECK(trees_equal(r, c) && !strcmp(core_config_get(c, "a.c.d")->where, "recipe.yaml:3"));
    core_config_free(c);
    core_config_free(r);
    core_config_free(r2);
}

TEST(config_help_lists_entries) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    core_config_help(schema, f);
    fclose(f);
    CHECK(strstr(buf, "rollout.num_steps") && strstr(buf, "default 20, >= 1, <= 1000  (denoising steps)"));
    CHECK(strstr(buf, "data.prompt_file") && strstr(buf, "required"));
    CHECK(strstr(buf, "one of local|colocated"));
    free(buf);
}

TEST(config_load_file_lines) {
    char path[600];
    snprintf(path, sizeof path, "%s/recipe.yaml", test_tmpdir());
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("data:\n  prompt_file: p.txt\n\nrollout:\n  num_steps: 1\n  nm_steps: 2\n", f);
    fclose(f);
    core_cfg_node *r;
    REQUIRE_OK(core_config_load_file(path, &r));
    recipe rc;
    CHECK_ERR(core_config_apply(r, schema, &rc), "recipe.yaml:6: unknown key \"rollout.nm_steps\"");
    CHECK(strstr(core_last_error(), path) == core_last_error()); /* starts with the file's path */
    core_config_release(schema, &rc);
    core_config_free(r);
}
