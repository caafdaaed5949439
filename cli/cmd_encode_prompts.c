/* cli/cmd_encode_prompts.c — `vgrpo encode-prompts --text-encoder DIR --tokenizer DIR --prompts FILE
 * --out cache.safetensors [--max-length N]`: encodes a prompt list once with umT5, so training never re-encodes.
 *
 * FILE: UTF-8, one prompt per line (a trailing "\r" is dropped; lines of only whitespace are skipped).
 * The cache holds, as WanPipeline._get_t5_prompt_embeds computes them (model/text/t5_prompt.h; ftfy not reproduced):
 *   embeds           F32 [P, N, D]  prompts in file order, each trimmed to its token count and zero-padded to N
 *   lengths          I64 [P]        token count of each prompt (with </s>, at most N)
 *   negative_embeds  F32 [1, N, D]  the empty prompt (the pipeline's default negative prompt)
 * with N = --max-length (default 512) and D the encoder's d_model. Exit status 0, 1 on failure, 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/text/t5_prompt.h"

#define ENCODE_BATCH 8 /* prompts per encoder call: bounds memory; results do not depend on it */

/* Reads the non-blank lines of path; *out is a malloc'd array of malloc'd strings. */
static int read_prompts(const char *path, char ***out, int *count) {
    struct stat st;
    if (stat(path, &st) != 0) return core_error("prompt file %s does not exist", path);
    FILE *f = fopen(path, "rb");
    if (!f) return core_error("prompt file %s cannot be opened", path);
    char **v = NULL, *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0, rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        ssize_t first = 0; /* blank lines and lines whose first non-blank character is '#' are skipped, as in
                              the recipes' prompt lists (core/prompts.c) */
        while (first < len && strchr(" \t\v\f", line[first])) first++;
        if (first == len || line[first] == '#') continue;
        char **nv = realloc(v, (size_t)(n + 1) * sizeof *v);
        if (!nv || !(nv[n] = strdup(line))) {
            if (nv) v = nv;
            rc = core_error("prompt file %s: out of memory", path);
            break;
        }
        v = nv, n++;
    }
    free(line);
    fclose(f);
    if (!rc && n == 0) rc = core_error("prompt file %s has no prompts (it is empty or blank)", path);
    if (rc) {
        for (int i = 0; i < n; i++) free(v[i]);
        free(v);
        return -1;
    }
    *out = v, *count = n;
    return 0;
}

static int run(const char *te_dir, const char *tok_dir, const char *prompts_path, const char *out_path, int N) {
    int rc = -1, P = 0;
    char **prompts = NULL;
    tok_tokenizer *tok = NULL;
    t5_encoder *enc = NULL;
    float *embeds = NULL, *neg = NULL;
    int64_t *lengths = NULL, neg_len = 0;
    st_writer *w = NULL;
    if (read_prompts(prompts_path, &prompts, &P)) goto done;
    if (!(tok = tok_load(tok_dir))) goto done;
    if (!(enc = t5_load(te_dir))) goto done;
    int D = t5_get_config(enc)->d_model;
    embeds = malloc((size_t)P * N * D * sizeof(float));
    neg = malloc((size_t)N * D * sizeof(float));
    lengths = malloc((size_t)P * sizeof *lengths);
    if (!embeds || !neg || !lengths) {
        core_error("out of memory for %d prompts x %d tokens x %d", P, N, D);
        goto done;
    }
    if (t5_encode_prompts(enc, tok, (const char *const *)prompts, P, N, ENCODE_BATCH, embeds, lengths)) goto done;
    const char *empty = "";
    if (t5_encode_prompts(enc, tok, &empty, 1, N, 1, neg, &neg_len)) goto done;
    int64_t se[3] = {P, N, D}, sl[1] = {P}, sn[3] = {1, N, D};
    if (!(w = st_writer_new()) || st_writer_add(w, "embeds", CORE_F32, 3, se, embeds) ||
        st_writer_add(w, "lengths", CORE_I64, 1, sl, lengths) ||
        st_writer_add(w, "negative_embeds", CORE_F32, 3, sn, neg) || st_writer_write(w, out_path))
        goto done;
    fprintf(stderr, "encode-prompts: %d prompts x %d tokens x %d -> %s\n", P, N, D, out_path);
    rc = 0;
done:
    for (int i = 0; i < P; i++) free(prompts[i]);
    free(prompts);
    tok_free(tok);
    t5_free(enc);
    free(embeds), free(neg), free(lengths);
    st_writer_free(w);
    return rc;
}

int cmd_encode_prompts(int argc, char **argv) {
    const char *te = NULL, *tk = NULL, *pr = NULL, *out = NULL;
    int N = 512;
    const opts_spec opts[] = {
        {.name = "text-encoder", .type = OPTS_STRING, .str = &te, .required = 1, .meta = "DIR",
         .help = "umT5 encoder folder (config.json + safetensors), e.g. PIPELINE/text_encoder"},
        {.name = "tokenizer", .type = OPTS_STRING, .str = &tk, .required = 1, .meta = "DIR",
         .help = "folder holding tokenizer.json, e.g. PIPELINE/tokenizer"},
        {.name = "prompts", .type = OPTS_STRING, .str = &pr, .required = 1, .meta = "FILE",
         .help = "one prompt per line (blank and #-comment lines skipped)"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .required = 1, .meta = "OUT.safetensors",
         .help = "writes embeds [P,N,D], lengths [P], negative_embeds [1,N,D]"},
        {.name = "max-length", .type = OPTS_INT, .i = &N, .min = 1, .max = 1 << 20, .meta = "N",
         .help = "tokens per prompt, padded/truncated (default 512)"},
        {0}};
    const opts_cmd cmd = {.name = "encode-prompts", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (run(te, tk, pr, out, N)) {
        fprintf(stderr, "vgrpo encode-prompts: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
