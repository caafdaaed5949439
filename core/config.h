/* core/config.h — YAML configuration: a tree of nodes that remember their source line, `--set key.path=value`
 * overrides, and typed extraction into a caller's struct against a declared schema.
 *
 *   core_cfg_node *root;
 *   core_config_load_file("recipes/tiny.yaml", &root);          // parse (libyaml) into a tree
 *   core_config_set(root, "rollout.num_steps=4");               // --set overrides, in command-line order
 *   core_config_apply(root, recipe_schema, &recipe);            // unknown keys, types, bounds -> errors
 *   core_config_dump(recipe_schema, &recipe, f);                // config.resolved.yaml
 *   core_config_release(recipe_schema, &recipe);  core_config_free(root);
 *
 * Every error names where the value came from and the key: `recipe.yaml:12: rollout.num_steps: expected an
 * integer, got "ten"`, `recipe.yaml:7: unknown key "rollout.nm_steps" (did you mean "rollout.num_steps"?)`,
 * `--set rollout.nm_steps=3: unknown key ...`.
 *
 * Scalars follow YAML 1.2's core schema, stricter where YAML 1.1 surprises people: null is ~, null, Null, NULL or
 * empty; booleans are true/false (True, TRUE, False, FALSE) only, so `yes` is a string and an error for a bool;
 * integers are decimal, 0x hex or 0o octal; floats are decimal with optional exponent (1e-4 is a float, unlike
 * YAML 1.1), .inf, -.inf, .nan. A quoted scalar is always a string. Refused, with the line and column: syntax
 * errors and tabs (libyaml's message), duplicate keys in one map, anchors and aliases, tags other than !!str /
 * !!map / !!seq, non-scalar keys, more than one document, nesting deeper than 64. JSON files load too (JSON is
 * YAML flow syntax), which is how diffusers' config.json files are read through the accessors below. */
#ifndef CORE_CONFIG_H
#define CORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { CORE_NODE_SCALAR = 0, CORE_NODE_MAP, CORE_NODE_SEQ } core_node_kind;

/* One node of a loaded document. Read-only for users; build and change trees only with the functions here. */
typedef struct core_cfg_node {
    core_node_kind kind;
    char *text;    /* SCALAR: its text, escapes resolved */
    int quoted;    /* SCALAR: quoted, block (| >) or !!str: a string whatever it looks like */
    int line, col; /* 1-based source position (of the key, for a map's value); 0 if made by --set or a default */
    char *where;   /* prefix for messages: "recipe.yaml:12", "--set a.b=1", or the file name alone for the root */
    char *path;    /* dotted key path from the root: "rollout.num_steps", "reward.scorers.0.name"; "" for root */
    int n;         /* MAP, SEQ: number of children */
    char **keys;   /* MAP: keys[i] names items[i], in document order */
    struct core_cfg_node **items;
} core_cfg_node;

/* ---- Trees ---- */

/* Parses the YAML (or JSON) file at path into *out. An empty document gives an empty map. Returns 0, or -1 with
 * an error that starts with "path:line:col:" where the problem is. The file may be at most 64 MiB. */
int core_config_load_file(const char *path, core_cfg_node **out);
/* The same for text in memory (len bytes, need not be NUL-terminated); name is used in messages. */
int core_config_load_string(const char *text, size_t len, const char *name, core_cfg_node **out);
/* Frees a tree (NULL allowed). */
void core_config_free(core_cfg_node *node);
/* A deep copy of a subtree (NULL if out of memory, with an error). */
core_cfg_node *core_config_copy(const core_cfg_node *node);

/* Applies one override "a.b.c=value" to the tree under root (a map): creates the maps along the path that do not
 * exist and creates or replaces the value at its end. value is YAML flow text: a scalar (`4`, `"x y"`, empty for
 * null), a list (`[1, 2]`) or a map (`{a: 1}`). A numeric segment indexes into an existing list. Nodes made here
 * report "--set <assignment>" as their source. Returns 0, or -1 (no '=', an empty key segment, a key path that is
 * not printable UTF-8, the path walks through a scalar, a bad list index, a value that is not valid YAML, a value
 * holding a raw line break: LF, CR, NEL, LS or PS, which YAML would fold into a space) with an
 * error naming the assignment; the tree is unchanged then (except when out of memory). */
int core_config_set(core_cfg_node *root, const char *assignment);

/* ---- Accessors (for any tree: recipes, diffusers config.json, ...) ---- */

/* The node at dotted path under node ("" or NULL: node itself); NULL if absent or if the path walks through a
 * scalar. Numeric segments index lists. Keys that contain '.' are reachable only with core_config_child. */
const core_cfg_node *core_config_get(const core_cfg_node *node, const char *path);
/* The value of key in a map (no path splitting); NULL if absent or node is not a map. */
const core_cfg_node *core_config_child(const core_cfg_node *map, const char *key);

/* 1 if node is a plain null scalar (~, null, Null, NULL, empty). */
int core_config_is_null(const core_cfg_node *node);
/* Typed reads of a scalar node. Return 0 and set *out, or -1 with "where: path: expected ..., got ..." (quoted
 * text, "a map", "a list"; out of range for int64). as_double accepts integers too. as_string sets *out to the
 * node's text (owned by the tree) and to NULL for a null scalar. */
int core_config_as_int(const core_cfg_node *node, int64_t *out);
int core_config_as_double(const core_cfg_node *node, double *out);
int core_config_as_bool(const core_cfg_node *node, bool *out);
int core_config_as_string(const core_cfg_node *node, const char **out);
/* core_config_get + core_config_as_*: -1 also when the key is absent ("where: missing key \"path\""). */
int core_config_get_int(const core_cfg_node *root, const char *path, int64_t *out);
int core_config_get_double(const core_cfg_node *root, const char *path, double *out);
int core_config_get_bool(const core_cfg_node *root, const char *path, bool *out);
int core_config_get_string(const core_cfg_node *root, const char *path, const char **out);

/* Writes a subtree as one line of YAML flow text ({a: 1, b: [x, "y z"]}), which loads back to an equal tree.
 * Returns 0, or -1 if writing fails. */
int core_config_write_flow(const core_cfg_node *node, FILE *f);
/* Writes s as a YAML scalar that loads back as the string s: plain when safe (not null/bool/number-like, no
 * indicator characters), else double-quoted with escapes; never raw: the characters YAML does not allow in a
 * document (C0 and C1 controls, DEL, U+FEFF, U+FFFE, U+FFFF: \xNN, \uNNNN) or reads as line breaks (NEL U+0085,
 * LS U+2028, PS U+2029: \N, \L, \P). */
void core_config_write_string(const char *s, FILE *f);

/* ---- Schemas: typed extraction into a struct ---- */

typedef enum {
    CORE_CFG_INT = 0, /* int */
    CORE_CFG_INT64,   /* int64_t */
    CORE_CFG_FLOAT,   /* float (a double out of float range is an error) */
    CORE_CFG_DOUBLE,  /* double */
    CORE_CFG_BOOL,    /* bool */
    CORE_CFG_STRING,  /* char *, owned; NULL for null or when absent without a default */
    CORE_CFG_STRINGS, /* core_cfg_strings, owned */
    CORE_CFG_INTS,    /* core_cfg_ints, owned */
    CORE_CFG_DOUBLES, /* core_cfg_doubles, owned */
    CORE_CFG_TREE     /* core_cfg_node *, an owned copy of the subtree (free-form settings the caller checks with
                         the accessors; NULL for null or when absent); keys under it are not checked */
} core_cfg_type;

typedef struct {
    int n;
    char **v;
} core_cfg_strings;
typedef struct {
    int n;
    int64_t *v;
} core_cfg_ints;
typedef struct {
    int n;
    double *v;
} core_cfg_doubles;

/* flags of an entry */
#define CORE_CFG_REQUIRED 1u  /* absent is an error */
#define CORE_CFG_MIN 2u       /* value >= min */
#define CORE_CFG_MAX 4u       /* value <= max */
#define CORE_CFG_MIN_OPEN 8u  /* value > min */
#define CORE_CFG_MAX_OPEN 16u /* value < max */

/* One setting. A schema is an array of entries ending with one whose key is NULL. */
typedef struct {
    const char *key; /* dotted path: "rollout.num_steps"; sections are implied by the paths */
    core_cfg_type type;
    size_t offset;       /* offsetof(struct, field) */
    const char *def;     /* default as YAML text ("20", "0.5", "true", "tiny", "[256, 512]", "{a: 1}"); NULL: none
                            (zero, NULL, empty list); checked against bounds and choices like a given value */
    unsigned flags;      /* CORE_CFG_REQUIRED, CORE_CFG_MIN / MAX / MIN_OPEN / MAX_OPEN */
    double min, max;     /* bounds for numbers and for each element of a number list */
    const char *choices; /* STRING / STRINGS: allowed values, "local|colocated"; NULL: any */
    const char *help;    /* one line for --help-config */
} core_cfg_entry;

/* Fills the schema's fields of obj from the tree. First every field is reset (pointers NULL, lists empty), so
 * core_config_release is always safe afterwards, even after an error. Then: the schema is checked (a duplicate
 * key, a key that is also a section of another, or a bad default is a programming error reported as "schema:
 * ..."); every key in the tree must be a schema key or a section leading to one (else "unknown key", with a
 * did-you-mean); each value must have its entry's type and satisfy its bounds and choices; required keys must be
 * present; absent keys take their defaults. Returns 0, or -1 at the first problem. */
int core_config_apply(const core_cfg_node *root, const core_cfg_entry *schema, void *obj);

/* Frees the strings, lists and trees the schema's fields of obj own, and resets them. */
void core_config_release(const core_cfg_entry *schema, void *obj);

/* Writes the schema's fields of obj as a YAML document, nested by section in schema order, which
 * core_config_apply reads back to the same values (doubles and floats bit for bit). Returns 0, or -1 if writing
 * fails. */
int core_config_dump(const core_cfg_entry *schema, const void *obj, FILE *f);

/* Writes one line per entry: key, type, default, bounds or choices, required, help. */
void core_config_help(const core_cfg_entry *schema, FILE *f);

#endif
