/* model/clip/clip_tokenizer.h — the CLIP tokenizer: byte-level BPE read from a Hugging Face tokenizer.json.
 *
 * Follows transformers' CLIPTokenizer of 5.x (CLIPTokenizerFast in 4.x; the tokenizers library underneath), the
 * tokenizer the CLIP scorers' references call with padding="max_length", truncation=True, max_length=77:
 *   added tokens    split out of the raw text first (leftmost longest; "normalized": true ones on the normalised
 *                   text of each piece), e.g. "<|endoftext|>" written in a prompt becomes its id;
 *   normalizer      NFC, Replace(Regex "\s+" -> " ") (\s: Unicode White_Space), Lowercase (per code point, the full
 *                   mapping: U+0130 becomes "i" + U+0307, no final-sigma rule), in the order listed (a Sequence of
 *                   these, one alone, or null);
 *   pre_tokenizer   Split(Regex CLIP's pattern, behavior "Removed", invert true): the words are the pattern's matches
 *                   (<|startoftext|>, <|endoftext|>, 's 't 're 've 'm 'll 'd, a run of letters \p{L}, one number
 *                   character \p{N}, a run of other non-space characters); then ByteLevel (add_prefix_space false;
 *                   with use_regex, GPT-2's split of each word); each UTF-8 byte mapped to GPT-2's printable symbol;
 *   model           BPE (merges by rank, lowest first, leftmost on ties; end_of_word_suffix, e.g. "</w>", on a word's
 *                   last symbol; a symbol missing from the vocabulary becomes unk_token);
 *   post_processor  RobertaProcessing / BertProcessing (cls $A sep) or TemplateProcessing ("single"), e.g.
 *                   <|startoftext|> ... <|endoftext|>.
 * Unicode (NFC, lowercase, \p{L} / \p{N}) comes from libutf8proc. Differences from open_clip's SimpleTokenizer
 * (which HPSv2 uses) are listed in tests/test_clip_tokenizer.c: it runs ftfy and html.unescape first, its \s is
 * Python's, it lowercases with final sigma, its special tokens are spelled <start_of_text> / <end_of_text>, and
 * it pads with 0. */
#ifndef MODEL_CLIP_TOKENIZER_H
#define MODEL_CLIP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* CLIP's context length: the text transformer's 77 positions. */
#define CLIP_TOK_CONTEXT 77

typedef struct clip_tokenizer clip_tokenizer;

/* Loads `path`: a folder holding tokenizer.json (a transformers model or tokenizer folder) or the tokenizer.json
 * file itself. The padding id is, in this order: the folder's tokenizer_config.json "pad_token" (a string or
 * {"content": ...}), tokenizer.json's "padding"."pad_id", or the end-of-text id (the post-processor's last special
 * token; transformers' CLIPTokenizer default). Returns the tokenizer, or NULL with core_error naming the file and
 * the fault: missing tokenizer.json, bad JSON, a model other than BPE, a normalizer / pre-tokenizer /
 * post-processor step this reader does not implement (named), a Split pattern other than CLIP's, a merge or token
 * that is not in the vocabulary, a pad_token not in the vocabulary. */
clip_tokenizer *clip_tok_load(const char *path);
void clip_tok_free(clip_tokenizer *t);

/* Vocabulary size (49408 for CLIP: the BPE vocabulary with the added tokens). */
int clip_tok_vocab_size(const clip_tokenizer *t);
/* The ids of the start-of-text / end-of-text tokens (first / last special token of the post-processor; -1 when it
 * adds none) and of the padding token. */
int32_t clip_tok_bos_id(const clip_tokenizer *t);
int32_t clip_tok_eos_id(const clip_tokenizer *t);
int32_t clip_tok_pad_id(const clip_tokenizer *t);

/* Encodes UTF-8 text[0..len) (NUL bytes allowed inside) with the special tokens, as tokenizer(text).input_ids.
 * Thread-safe: the tokenizer is read-only after loading (no cache).
 * With max_len > 0 the text's tokens are cut to max_len minus the number of special tokens before the special
 * tokens are added (truncation=True, max_length=max_len: the end-of-text token stays last). On success *ids is a
 * malloc'd int32 array of *n ids (free() it; never NULL on success). Returns 0, or -1: text not valid UTF-8,
 * max_len smaller than the number of special tokens, out of memory. */
int clip_tok_encode(const clip_tokenizer *t, const char *text, size_t len, int max_len, int32_t **ids, int *n);

/* As transformers' tokenizer(text, padding="max_length", truncation=True, max_length=max_len).input_ids:
 * ids[0..max_len) (int32, caller's buffer) = the truncated encoding, then the padding id. *n_real (may be NULL)
 * gets the number of ids before the padding (the attention mask's ones). Errors as clip_tok_encode. */
int clip_tok_encode_padded(const clip_tokenizer *t, const char *text, size_t len, int max_len, int32_t *ids,
                           int *n_real);

/* The words after normalisation and pre-tokenisation, joined by '|', in the byte-level alphabet (added tokens
 * shown as written): for debugging and tests. malloc'd string, or NULL (invalid UTF-8, out of memory). */
char *clip_tok_debug_words(const clip_tokenizer *t, const char *text, size_t len);

#endif
