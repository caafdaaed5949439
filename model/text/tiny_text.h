/* model/text/tiny_text.h — the tiny preset's tokenizer and umT5 text encoder: small random components written in the
 * layouts transformers uses, so that `vgrpo init-model --preset tiny` gives a complete WanPipeline folder (tests,
 * demo). Not trained: the text encoder has seeded random weights, the tokenizer a hand-made vocabulary. The tiny
 * VAE is model/vae/tiny_vae.h.
 *
 * Randomness: Philox (core/philox.h) with key = seed, counter (element / 4, slot, uid 0, CORE_STREAM_MODEL_INIT),
 * slot = TINY_SLOT_TEXT + tensor index (text encoder) or TINY_SLOT_VAE + tensor index (VAE), so neither overlaps
 * the transformer's slots (0 .. a few hundred, wan_params_init_random). */
#ifndef MODEL_TEXT_TINY_TEXT_H
#define MODEL_TEXT_TINY_TEXT_H

#include <stdint.h>

#define TINY_SLOT_TEXT 100000u

/* Writes dir/tokenizer.json (tokenizers' JSON: Unigram model over single characters, "▁" + letters and some
 * common English words; Replace(" {2,}" -> " ") normaliser, Metaspace pre-tokeniser, TemplateProcessing
 * "$A </s>"; ids 0 <pad>, 1 </s>, 2 <unk>) and dir/tokenizer_config.json (T5TokenizerFast). dir is created.
 * *vocab_size (may be NULL) receives the number of pieces. Returns 0, or -1 naming the path. */
int tok_tiny_write(const char *dir, int *vocab_size);

/* Writes dir/config.json (transformers UMT5EncoderModel: d_model, d_kv 16, d_ff 2 d_model, 2 layers, d_model/16
 * heads, 32 buckets, max distance 128, gated-gelu) and dir/model.safetensors (F32) with T5's initialisation
 * (transformers T5PreTrainedModel._init_weights, factor 1): shared N(0, 1); q N(0, 1/(d_model d_kv)); k, v,
 * relative_attention_bias, wi_0, wi_1 N(0, 1/d_model); o N(0, 1/(heads d_kv)); wo N(0, 1/d_ff); norms 1.
 * d_model: a positive multiple of 16; vocab_size >= the tokenizer's. Returns 0, or -1 naming the path. */
int t5_tiny_write(const char *dir, int d_model, int vocab_size, uint64_t seed);

#endif
