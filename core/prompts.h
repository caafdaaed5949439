/* core/prompts.h — prompt files, read the same way by every job (the run's training and eval prompts, `vgrpo eval`'s
 * --prompts): a text file (one prompt per line), a VBench-style JSON list ([{"prompt_en": "...", "color_en":
 * "red", ...}, ...]; the string attributes become the prompt's metadata, "color_en" as "color"), or JSON lines
 * (a name ending in ".jsonl"): one object per line, {"prompt": "...", "image": "path.png", ...}, the other attributes
 * metadata, each a string (a number, list, object, boolean or null is refused naming file:line and the key: the
 * scorers and the reward protocol take metadata as strings, so the user writes the text meant, e.g. "3"; a VBench
 * list's non-string attributes, such as "dimension", are VBench's own and left out) (blank lines and lines starting
 * with '#' are skipped, numbered as in a text file; a "prompt" or "prompt_en" of only spaces and tabs is refused). "image" (image to video) is a PNG file's path, relative to the prompt file's folder
 * unless absolute, without control characters; when one prompt of a file has an image, every prompt must. Each image is checked while reading
 * (it opens, is a regular file, starts with the PNG signature): an error names file:line and the image.
 *
 * Text files: surrounding white space is trimmed; blank lines and lines starting with '#' are skipped; a prompt
 * keeps the 1-based line it came from, so later checks can name file:line. Every prompt must be valid UTF-8 (no NUL
 * byte, no control character other than tab): an error names file:line and the byte offset, and quotes the line
 * with non-printable bytes escaped as \xNN, never raw.
 *
 * Limits (core_prompts_limits; a recipe's data.max_prompt_file_mb and data.max_prompt_bytes, core_recipe.h): a file
 * larger than the file limit is refused before it is read (its size from stat; a pipe or a file that grows is cut off
 * at the limit while reading), and a line (text) or a "prompt_en" (JSON) longer than the line limit is refused naming
 * file:line (JSON: the entry) and its length. A text file is read through one buffer of the line limit, so reading
 * never holds more than the file limit in prompts plus one line; nothing downstream (tokenizer, text encoder) ever
 * sees a prompt over the line limit. */
#ifndef CORE_PROMPTS_H
#define CORE_PROMPTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Defaults of the recipe keys data.max_prompt_file_mb and data.max_prompt_bytes: 64 MiB is a million VBench-style
 * prompts; 4096 bytes is more text than umT5's 512 tokens take in any script (English runs ~4.5 bytes a token, CJK
 * ~3), so a longer line is a mistake (a file that is not a prompt list), not a prompt. */
#define CORE_PROMPTS_MAX_FILE_MB 64
#define CORE_PROMPTS_MAX_BYTES 4096

typedef struct {
    int64_t max_file_bytes; /* whole file, bytes; <= 0: CORE_PROMPTS_MAX_FILE_MB MiB */
    int64_t max_line_bytes; /* one text line (before trimming, without its newline) or one JSON "prompt_en"; <= 0:
                               CORE_PROMPTS_MAX_BYTES */
} core_prompts_limits;

typedef struct {
    int n;
    char **text;   /* [n] prompts (UTF-8) */
    int *line;     /* [n] 1-based line in the file (text) or entry index + 1 (JSON) */
    json_t **meta; /* [n] objects of strings, possibly empty (never NULL once read) */
    char **image;  /* [n] image paths as found (the prompt file's folder prepended), NULL where none */
    int n_images;  /* prompts with an image: 0 or n */
    int json;      /* read from a JSON list */
    int jsonl;     /* read as JSON lines (numbered by line, like a text file) */
    char path[4096];
} core_prompts;

/* Reads path: JSON when the name ends in ".json", else text. -1 with core_error naming the path (missing, no
 * prompts, invalid UTF-8 or a control byte at path:line, a JSON entry without a non-empty "prompt_en"), or out of
 * memory; p then holds nothing. */
int core_prompts_read(core_prompts *p, const char *path);
/* core_prompts_read under limits lim (NULL: the defaults; core_prompts_read is this with NULL). Errors also: the file
 * over lim->max_file_bytes ("path: the prompt file is N MiB, over data.max_prompt_file_mb M"), a line or prompt over
 * lim->max_line_bytes ("path:LINE: a line of N bytes, over data.max_prompt_bytes M"). */
int core_prompts_read_limited(core_prompts *p, const char *path, const core_prompts_limits *lim);
void core_prompts_free(core_prompts *p);

/* The content hash of a prompt list, for a resumed run to find that its prompt file changed: xxh64 (seed 0) of the
 * prompts' digests (8 little-endian bytes each, in file order), each digest xxh64 (seed 0) of the prompt's text, a
 * NUL, its metadata as compact JSON with sorted keys, a NUL, and for a prompt with an image the xxh64 (seed 0) of the
 * image file's bytes (8 little-endian bytes). The file's name, line numbers and comments do not count. 0 and *out,
 * or -1 with an error naming the image that cannot be read (file:line and the path), or out of memory. */
int core_prompts_xxh64(const core_prompts *p, uint64_t *out);

/* The start-up check of an image file: it opens, is a regular file and starts with the PNG signature. -1 with
 * "<where>: image <path>: cannot open: ..." / "not a PNG file ..." (where: e.g. core_prompts_where's). */
int core_prompts_check_image(const char *path, const char *where);

/* Prompt i's metadata as a rollout sample carries it to the scorers (core_rollout_sample.metadata, the rollout and
 * score requests' "metadata"): the object of strings, or NULL when it is empty, so a prompt without metadata sends
 * none. Borrowed from p. */
const json_t *core_prompts_meta(const core_prompts *p, int i);

/* Where prompt i came from, for messages: "path:line" (text files) or "path: prompt N" (JSON, N 1-based). Returns
 * buf. */
char *core_prompts_where(const core_prompts *p, int i, char *buf, size_t cap);

/* Writes s (at most n bytes of it) into buf (cap >= 8) with bytes outside printable ASCII escaped as \xNN, cut with
 * "..." when it does not fit: for error messages that quote user text. Returns buf. */
char *core_quote_bytes(const char *s, size_t n, char *buf, size_t cap);

/* 0 when s[0..n) is valid UTF-8 (shortest forms, no surrogates, <= U+10FFFF) without NUL or control bytes other
 * than tab; else -1 with *bad = the offset of the first offending byte. */
int core_utf8_check(const char *s, size_t n, size_t *bad);

#endif
