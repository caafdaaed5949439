/* model/text/text_cond.h — prompt conditioning for the Wan DiT, shared by rollout workers and trainer ranks: the
 * pipeline's umT5 (WanPipeline's _get_t5_prompt_embeds: max length text_len, trimmed and zero-padded; the negative
 * prompt is the empty prompt) or the tiny preset's fixed word embeddings (model/text/word_embed.h; negative: zeros),
 * with a cache per prompt text so each prompt is encoded once per process. */
#ifndef MODEL_TEXT_COND_H
#define MODEL_TEXT_COND_H

#include "core/recipe.h"

struct k_dev_ops;

typedef struct text_cond text_cond;

/* kind (model.text_encoder, parsed by core/recipe.h) CORE_TEXT_UMT5 (pipeline_dir/tokenizer/tokenizer.json +
 * text_encoder/, whose d_model must equal text_dim) or CORE_TEXT_WORD_EMBED. dev: the device table umT5 runs on
 * (model/text/umt5.h t5_to_device: its weights stay there until text_cond_free), or NULL: the CPU (the caller
 * resolves model.text_device, core_recipe_text_on_device). Returns the encoder, or NULL with core_error naming
 * model.text_encoder and the path. */
text_cond *text_cond_load(core_text_encoder kind, const char *pipeline_dir, int text_len, int text_dim,
                          const struct k_dev_ops *dev);

/* The embedding [text_len, text_dim] fp32 of `prompt`, owned by the cache (valid until text_cond_free). Errors
 * (-1): a word_embed prompt longer than text_len words (names rollout.text_len), tokenizer or encoder failure, out
 * of memory. Not thread-safe. */
int text_cond_embed(text_cond *t, const char *prompt, const float **out);

/* The negative (unconditional) embedding [text_len, text_dim]: umT5's empty prompt, or NULL (all zeros). */
const float *text_cond_negative(const text_cond *t);

void text_cond_free(text_cond *t);

#endif
