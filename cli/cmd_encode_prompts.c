/* cli/cmd_encode_prompts.c — `vgrpo encode-prompts --text-encoder DIR --tokenizer DIR --prompts FILE
 * --out cache.safetensors [--max-length N]`: encodes a prompt list once with umT5, so training never re-encodes.
 *
 * FILE: read as every job reads prompt files (core/prompts.h): text (one prompt per line, trimmed, blank and #-comment
 * lines skipped, UTF-8 checked with errors at file:line) or a VBench-style JSON list.
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
#include "core/prompts.h"
#include "core/safetensors.h"
#include "model/text/t5_prompt.h"

#define ENCODE_BATCH 8 /* prompts per encoder call: bounds memory; results do not depend on it */

/* The prompts of path as every job reads them (core/prompts.h: text or VBench JSON, UTF-8 checked, errors at
 * file:line, the recipes' default limits). *out is a malloc'd array of malloc'd strings. */
static int read_prompts(const char *path, char ***out, int *count) {
    struct stat st;
    if (stat(path, &st) != 0) return core_error("prompt file %s does not exist", path);
    core_prompts p;
    if (core_prompts_read(&p, path)) return -1;
    *out = p.text, *count = p.n; /* the texts move to the caller; the rest (a JSON-lines file's images too) is freed */
    for (int i = 0; i < p.n; i++) {
        json_decref(p.meta[i]);
        if (p.image) free(p.image[i]);
    }
    free(p.line), free(p.meta), free(p.image);
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
