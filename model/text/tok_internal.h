/* model/text/tok_internal.h — Unicode helpers shared by the tokenizer and the prompt cleaner (model/text/tok_unicode.c).
 * Internal to model/: not part of the public tokenizer API. */
#ifndef MODEL_TOK_INTERNAL_H
#define MODEL_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Decodes one UTF-8 character at s[0..n): returns its byte length (1..4) and stores the code point in *cp.
 * Invalid or truncated sequences count as one byte with *cp = 0xFFFD (the tokenizer only sees valid UTF-8 from
 * callers that checked it; this keeps a bad byte from derailing the scan). n must be >= 1. */
int tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encodes cp as UTF-8 into out[0..4); returns the byte length. */
int tok_utf8_encode(uint32_t cp, char *out);
/* 1 when s[0..n) is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
int tok_utf8_valid(const char *s, size_t n);

/* Length in bytes of the (approximate) extended grapheme cluster starting at s[0..n) — see tok_unicode.c for
 * the rules kept and dropped. */
size_t tok_grapheme_len(const unsigned char *s, size_t n);

/* Rust char::is_whitespace (Unicode White_Space), as the tokenizers Strip normalizer uses. */
int tok_is_rust_space(uint32_t cp);
/* Python str.isspace() / re's \s on str, as diffusers' whitespace_clean uses. */
int tok_is_py_space(uint32_t cp);

#endif
