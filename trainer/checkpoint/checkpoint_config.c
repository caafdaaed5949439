/* trainer/checkpoint/checkpoint_config.c — the recipe text a checkpoint records (trainer_ckpt_config_text: the canonical dump
 * with the keys that may change on resume set to null) and the comparison that names the keys a resume changed
 * (trainer_ckpt_config_diff); see trainer/checkpoint/checkpoint.h. Split from checkpoint.c, which keeps the files. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "trainer/checkpoint/checkpoint.h"

char *trainer_ckpt_config_text(const core_cfg_entry *schema, const void *obj, const char *const *free_keys) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return core_error("config text: out of memory"), NULL;
    int bad = core_config_dump(schema, obj, f);
    if (fclose(f) || bad) return free(buf), core_error_push("config text: "), NULL;
    core_cfg_node *root = NULL;
    bad = core_config_load_string(buf, len, "resolved config", &root);
    free(buf);
    if (bad) return NULL;
    for (int i = 0; free_keys && free_keys[i] && !bad; i++) {
        char as[512];
        snprintf(as, sizeof as, "%s=", free_keys[i]);
        bad = core_config_set(root, as);
    }
    buf = NULL, len = 0;
    if (!bad && !(f = open_memstream(&buf, &len))) bad = core_error("config text: out of memory");
    if (!bad) {
        bad = core_config_write_flow(root, f);
        if (fclose(f)) bad = core_error("config text: write failed");
    }
    core_config_free(root);
    if (bad) return free(buf), NULL;
    return buf;
}

uint64_t trainer_ckpt_config_hash(const char *text) { return core_xxh64(text, strlen(text), 0); }

/* Appends s to out[*n..cap) (truncating with "..."). */
static void append(char *out, size_t cap, size_t *n, const char *s) {
    if (*n + 1 >= cap) return;
    size_t room = cap - 1 - *n, l = strlen(s);
    if (l > room) {
        memcpy(out + *n, s, room);
        *n += room;
        if (cap >= 4) memcpy(out + cap - 4, "...", 3);
    } else {
        memcpy(out + *n, s, l);
        *n += l;
    }
    out[*n] = 0;
}

/* One node as flow text, at most 60 characters ("(absent)" for NULL). */
static void node_str(const core_cfg_node *n, char *buf, size_t cap) {
    if (!n) {
        snprintf(buf, cap, "(absent)");
        return;
    }
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    if (f) core_config_write_flow(n, f), fclose(f);
    snprintf(buf, cap, "%.60s%s", s ? s : "?", s && len > 60 ? "..." : "");
    free(s);
}

static int nodes_equal(const core_cfg_node *a, const core_cfg_node *b) {
    if (a->kind != b->kind || a->n != b->n) return 0;
    if (a->kind == CORE_NODE_SCALAR) {
        int na = core_config_is_null(a), nb = core_config_is_null(b);
        if (na || nb) return na && nb;
        return a->quoted == b->quoted && !strcmp(a->text, b->text);
    }
    for (int i = 0; i < a->n; i++) {
        const core_cfg_node *bi = a->kind == CORE_NODE_MAP ? core_config_child(b, a->keys[i]) : b->items[i];
        if (!bi || !nodes_equal(a->items[i], bi)) return 0;
    }
    return 1;
}

static void report(const char *path, const core_cfg_node *a, const core_cfg_node *b, char *out, size_t cap,
                   size_t *n, int *count) {
    char va[80], vb[80], line[400];
    node_str(a, va, sizeof va);
    node_str(b, vb, sizeof vb);
    snprintf(line, sizeof line, "%s%s (checkpoint %s, now %s)", *count ? ", " : "", path, va, vb);
    append(out, cap, n, line);
    (*count)++;
}

/* Lists the leaves (map keys, whole lists) where a and b differ. */
static void diff_nodes(const char *path, const core_cfg_node *a, const core_cfg_node *b, char *out, size_t cap,
                       size_t *n, int *count) {
    if (a && b && a->kind == CORE_NODE_MAP && b->kind == CORE_NODE_MAP) {
        char sub[512];
        for (int i = 0; i < a->n; i++) {
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", a->keys[i]);
            diff_nodes(sub, a->items[i], core_config_child(b, a->keys[i]), out, cap, n, count);
        }
        for (int i = 0; i < b->n; i++)
            if (!core_config_child(a, b->keys[i])) {
                snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", b->keys[i]);
                report(sub, NULL, b->items[i], out, cap, n, count);
            }
        return;
    }
    if (!a || !b || !nodes_equal(a, b)) report(path, a, b, out, cap, n, count);
}

int trainer_ckpt_config_diff(const char *ckpt_text, const char *now_text, char *out, size_t cap) {
    core_cfg_node *a = NULL, *b = NULL;
    if (cap) out[0] = 0;
    if (core_config_load_string(ckpt_text, strlen(ckpt_text), "checkpoint config", &a)) return -1;
    if (core_config_load_string(now_text, strlen(now_text), "config", &b)) return core_config_free(a), -1;
    size_t n = 0;
    int count = 0;
    diff_nodes("", a, b, out, cap, &n, &count);
    core_config_free(a);
    core_config_free(b);
    return count;
}


/* Keys added to the recipe after checkpoints were first written, with the values that compute what the older
 * builds computed (NULL: any value, for keys that change no number or matter only beside another key listed here at
 * its old value, e.g. the window's range with size 0). A checkpoint written before a key existed does not record it;
 * it resumes when the key is at such a value now. */
static const char *const added_keys[][2] = {
    {"model.device", "cpu"},
    {"model.dtype", NULL}, /* only fp32 runs on the CPU (core_recipe_check) */
    {"rollout.sde_type", "sde"},
    {"rollout.sde_window.size", "0"},
    {"rollout.sde_window.range", NULL},
    {"rollout.sde_window.schedule", NULL},
    {"rollout.sde_window.shift", NULL},
    {"rollout.sde_window.iters_per_window", NULL},
    {"rollout.sde_window.at_end", NULL},
    {"algorithm.loss", "grpo"},
    {"algorithm.cps_logprob", "exact"},
    {"guard.gold_scorers", "[]"},
    {"guard.gold_weights", "[]"},
    {"guard.video_stats", NULL},
    {"guard.drift_warn_sd", NULL},
    {"reward.models", NULL}, /* learned scorers (null: none, as every older checkpoint) */
    {"reward.frames", NULL}, /* matters only with learned scorers, which older builds did not have */
    {NULL, NULL},
};

/* 1 when every leaf where the texts differ is a key the checkpoint predates at a value of added_keys, or a key that
 * is null now (a key made free on resume after the checkpoint was written, or a new free key). */
static int only_added(const char *path, const core_cfg_node *a, const core_cfg_node *b) {
    if (b && b->kind == CORE_NODE_SCALAR && core_config_is_null(b)) return 1;
    if (a && b && a->kind == CORE_NODE_MAP && b->kind == CORE_NODE_MAP) {
        char sub[512];
        for (int i = 0; i < a->n; i++) {
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", a->keys[i]);
            if (!only_added(sub, a->items[i], core_config_child(b, a->keys[i]))) return 0;
        }
        for (int i = 0; i < b->n; i++)
            if (!core_config_child(a, b->keys[i])) {
                snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", b->keys[i]);
                if (!only_added(sub, NULL, b->items[i])) return 0;
            }
        return 1;
    }
    if (a && b) return nodes_equal(a, b);
    if (a || !b) return 0; /* a key the recipe no longer has */
    if (b->kind == CORE_NODE_MAP) { /* a whole section the checkpoint predates */
        char sub[512];
        for (int i = 0; i < b->n; i++) {
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", b->keys[i]);
            if (!only_added(sub, NULL, b->items[i])) return 0;
        }
        return 1;
    }
    for (int k = 0; added_keys[k][0]; k++)
        if (!strcmp(path, added_keys[k][0])) {
            if (!added_keys[k][1]) return 1;
            char v[80];
            node_str(b, v, sizeof v);
            return !strcmp(v, added_keys[k][1]);
        }
    return 0;
}

int trainer_ckpt_config_predates(const char *ckpt_text, const char *now_text) {
    core_cfg_node *a = NULL, *b = NULL;
    if (core_config_load_string(ckpt_text, strlen(ckpt_text), "checkpoint config", &a)) return core_error_clear(), 0;
    if (core_config_load_string(now_text, strlen(now_text), "config", &b)) return core_config_free(a), core_error_clear(), 0;
    const int ok = only_added("", a, b);
    core_config_free(a);
    core_config_free(b);
    return ok;
}
