/* model/text/t5_prompt.h — Wan prompt handling: clean, tokenise, encode with umT5, trim and zero-pad.
 *
 * Reference: diffusers pipelines/wan/pipeline_wan.py, prompt_clean and WanPipeline._get_t5_prompt_embeds.
 * ftfy.fix_text (run by diffusers only when the ftfy package is installed) is NOT reproduced: prompts with
 * mojibake or the other text faults ftfy repairs encode differently from a diffusers install that has ftfy.
 * html.unescape is reproduced for numeric character references (with Python's replacement rules) and a table of
 * common named entities (t5_prompt.c lists them); other named entities are left as written. */
#ifndef MODEL_T5_PROMPT_H
#define MODEL_T5_PROMPT_H

#include <stdint.h>

#include "model/text/tokenizer.h"
#include "model/text/umt5.h"

/* prompt_clean: html.unescape twice, strip, every run of Python-\s whitespace -> one space, strip. Returns a
 * malloc'd UTF-8 string, or NULL (invalid UTF-8 or out of memory; error recorded). */
char *t5_prompt_clean(const char *text);

/* Encodes P prompts as _get_t5_prompt_embeds(max_sequence_length = N) does: clean, tokenise with </s> (truncated
 * to N tokens), pad to N with mask 0, run the encoder on all prompts with the mask, keep each prompt's first
 * length rows and zero the rest. embeds [P, N, d_model] F32; lengths [P] (tokens incl. </s>, <= N).
 * Encodes in batches of up to `batch` prompts (<= 0: all at once; results do not depend on it), each batch run at
 * the length of its longest prompt rather than N (same real-token outputs, see t5_prompt.c).
 * Returns 0, or -1 naming the prompt index and the fault. */
int t5_encode_prompts(const t5_encoder *enc, const tok_tokenizer *tok, const char *const *prompts, int P, int N,
                      int batch, float *embeds, int64_t *lengths);

#endif
