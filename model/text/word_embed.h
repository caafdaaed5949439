/* model/text/word_embed.h — the tiny preset's text conditioning until the UMT5 text encoder exists (docs/design.md section 5).
 *
 * A prompt is lower-cased (ASCII) and split on spaces (runs of spaces separate words; leading/trailing spaces are
 * ignored). Word w becomes text_dim standard normals from Philox (core/philox.h):
 *   key = WAN_WORD_EMBED_SEED (fixed, so the table is a property of the preset, not of a run),
 *   counter = (element / 4, slot 0, uid = fnv1a32(w), stream CORE_STREAM_WORD_EMBED = 4), element over text_dim.
 * The sequence is zero-padded to the recipe's text length L: rows [n_words, L) are 0. The empty (negative) prompt
 * is all zeros. No punctuation handling: "ball." and "ball" are different words. */
#ifndef MODEL_WORD_EMBED_H
#define MODEL_WORD_EMBED_H

#include <stdint.h>

#define WAN_WORD_EMBED_SEED 0u

/* 32-bit FNV-1a of n bytes: h = 0x811c9dc5; per byte h ^= b, h *= 0x01000193 (mod 2^32). */
uint32_t wan_fnv1a32(const char *s, int64_t n);

/* Number of words of a prompt under the rule above (0 for NULL or blank). */
int wan_word_count(const char *prompt);

/* Embeds prompt into out [L, text_dim] fp32 (row-major; row j = word j, zero rows after the last word).
 * prompt NULL or blank: all zeros. Errors (-1): L < 1 or text_dim < 1; more words than L (the message quotes the
 * prompt and both counts, and names rollout.text_len). Nothing is written on error. */
int wan_word_embed(const char *prompt, int L, int text_dim, float *out);

#endif
