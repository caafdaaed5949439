/* model/text/text_cond.c — prompt conditioning with a per-text cache (see model/text/text_cond.h). */
#include "model/text/text_cond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/log.h"
#include "model/text/t5_prompt.h"
#include "model/text/tokenizer.h"
#include "model/text/umt5.h"
#include "model/text/word_embed.h"

#define TC_BUCKETS 1024

typedef struct tc_entry {
    char *text;
    float *emb;
    struct tc_entry *next;
} tc_entry;

struct text_cond {
    t5_encoder *t5;   /* NULL: word_embed */
    tok_tokenizer *tok;
    float *neg;
    int text_len, text_dim;
    tc_entry *bucket[TC_BUCKETS];
};

text_cond *text_cond_load(core_text_encoder kind, const char *pipeline_dir, int text_len, int text_dim,
                          const struct k_dev_ops *dev) {
    text_cond *t = calloc(1, sizeof *t);
    if (!t) return core_error("out of memory"), NULL;
    t->text_len = text_len, t->text_dim = text_dim;
    if (kind == CORE_TEXT_WORD_EMBED) return t;
    if (kind != CORE_TEXT_UMT5) {
        free(t);
        return core_error("model.text_encoder: %d is not umt5 (0) or word_embed (1)", (int)kind), NULL;
    }
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", pipeline_dir);
    if (stat(path, &sb)) {
        core_error("model.text_encoder (umt5): %s does not exist (the pipeline needs tokenizer/tokenizer.json; "
                   "model.text_encoder: word_embed uses the tiny preset's word embeddings)", path);
        goto fail;
    }
    if (!(t->tok = tok_load(path))) goto fail_push;
    snprintf(path, sizeof path, "%s/text_encoder", pipeline_dir);
    if (!(t->t5 = t5_load(path))) goto fail_push;
    if (dev) {
        if (t5_to_device(t->t5, dev)) goto fail_push;
        core_log_info("model.text_encoder umt5: on the device (%s; model.text_device auto)", dev->name);
    }
    if (t5_get_config(t->t5)->d_model != text_dim) {
        core_error("model.text_encoder (umt5): %s has d_model %d but the transformer's text_dim is %d", path,
                   t5_get_config(t->t5)->d_model, text_dim);
        goto fail;
    }
    if (!(t->neg = malloc(sizeof(float) * (size_t)text_len * (size_t)text_dim))) {
        core_error("out of memory");
        goto fail;
    }
    const char *empty = "";
    int64_t len;
    if (t5_encode_prompts(t->t5, t->tok, &empty, 1, text_len, 1, t->neg, &len)) {
        core_error_push("the empty negative prompt: ");
        goto fail_push;
    }
    return t;
fail_push:
    core_error_push("model.text_encoder (umt5): ");
fail:
    text_cond_free(t);
    return NULL;
}

int text_cond_embed(text_cond *t, const char *prompt, const float **out) {
    tc_entry **head = &t->bucket[wan_fnv1a32(prompt, (int64_t)strlen(prompt)) % TC_BUCKETS];
    for (tc_entry *e = *head; e; e = e->next)
        if (!strcmp(e->text, prompt)) return *out = e->emb, 0;
    tc_entry *e = calloc(1, sizeof *e);
    if (e) e->text = strdup(prompt), e->emb = malloc(sizeof(float) * (size_t)t->text_len * (size_t)t->text_dim);
    if (!e || !e->text || !e->emb) {
        if (e) free(e->text), free(e->emb), free(e);
        return core_error("out of memory");
    }
    int64_t len;
    int rc = t->t5 ? t5_encode_prompts(t->t5, t->tok, &prompt, 1, t->text_len, 1, e->emb, &len)
                   : wan_word_embed(prompt, t->text_len, t->text_dim, e->emb);
    if (rc) {
        free(e->text), free(e->emb), free(e);
        return core_error_push("prompt \"%.80s\": ", prompt);
    }
    e->next = *head;
    *head = e;
    *out = e->emb;
    return 0;
}

const float *text_cond_negative(const text_cond *t) { return t->neg; }

void text_cond_free(text_cond *t) {
    if (!t) return;
    for (int b = 0; b < TC_BUCKETS; b++)
        for (tc_entry *e = t->bucket[b], *nx; e; e = nx) {
            nx = e->next;
            free(e->text), free(e->emb), free(e);
        }
    t5_free(t->t5);
    tok_free(t->tok);
    free(t->neg);
    free(t);
}
