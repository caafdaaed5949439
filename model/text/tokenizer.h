/* model/text/tokenizer.h — the umT5 tokenizer: Hugging Face `tokenizer.json` with a SentencePiece Unigram model.
 *
 * What is read (the layout transformers' T5Converter writes, which is how umT5's tokenizer.json was made):
 *   normalizer     Precompiled (SentencePiece's character map, e.g. nmt_nfkc: a Darts double-array trie plus a
 *                  blob of replacement strings, base64 in "precompiled_charsmap"), Strip, Replace (a String
 *                  pattern, or the Regex " {2,}"), or a Sequence of these; null allowed.
 *   pre_tokenizer  Metaspace (replacement, prepend_scheme "always"/"first"/"never" or the older add_prefix_space,
 *                  split), alone or as the only member of a Sequence; null allowed.
 *   model          Unigram (vocab [[piece, score], ...], unk_id, byte_fallback).
 *   post_processor TemplateProcessing ("single": special tokens around $A, e.g. $A </s>); null allowed.
 * Encoding follows tokenizers 0.2x: normalise, pre-tokenise, Viterbi over piece log-probs per word (an unknown
 * character scores min_score - 10; consecutive unknowns fuse into one <unk>, or become <0xXX> byte pieces with
 * byte_fallback), then add the template's special tokens.
 * Limits (documented, not needed for prompts): added tokens written literally in the text (e.g. "</s>") are not
 * split out first; the grapheme segmentation is the approximation described in model/text/tok_unicode.c. */
#ifndef MODEL_TOKENIZER_H
#define MODEL_TOKENIZER_H

#include <stdint.h>

typedef struct tok_tokenizer tok_tokenizer;

/* Loads `path`: a tokenizer.json file, or a folder holding one. Returns the tokenizer, or NULL with core_error
 * naming the file and the fault (missing tokenizer.json, bad JSON, unsupported model/normalizer/pre-tokenizer type,
 * bad base64 or trie in precompiled_charsmap, unk_id out of range). */
tok_tokenizer *tok_load(const char *path);
void tok_free(tok_tokenizer *t);

/* Number of pieces in the model's vocabulary. */
int tok_vocab_size(const tok_tokenizer *t);
/* Number of special tokens the post-processor adds to one sequence (1 for umT5: </s>). */
int tok_num_special(const tok_tokenizer *t);

/* Encodes UTF-8 `text` (NUL-terminated) with special tokens, as tokenizers' Tokenizer.encode(text).ids does.
 * On success *ids is a malloc'd int32 array of *n ids (free() it; never NULL on success, even when *n is 0; with
 * umT5's template *n >= 1, the </s>). When max_len > 0 the result is
 * truncated as transformers does with truncation=True, max_length=max_len: the text's tokens are cut to
 * max_len - tok_num_special, then the special tokens are added. Returns 0, or -1 (invalid UTF-8, out of memory). */
int tok_encode(const tok_tokenizer *t, const char *text, int max_len, int32_t **ids, int *n);

/* The normalised and pre-tokenised text (words joined by '|'), for debugging and tests: malloc'd string or NULL. */
char *tok_debug_normalize(const tok_tokenizer *t, const char *text);

#endif
