/* model/text/word_embed.c — word-embedding conditioning of the tiny preset (see model/text/word_embed.h). */
#include "model/text/word_embed.h"

#include <string.h>

#include "core/error.h"
#include "core/philox.h"

uint32_t wan_fnv1a32(const char *s, int64_t n) {
    uint32_t h = 0x811c9dc5u;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x01000193u;
    }
    return h;
}

/* Next word of s from *pos: sets *start and *len; 0 when there is none. */
static int next_word(const char *s, int64_t *pos, int64_t *start, int64_t *len) {
    int64_t i = *pos;
    while (s[i] == ' ') i++;
    if (!s[i]) return 0;
    *start = i;
    while (s[i] && s[i] != ' ') i++;
    *len = i - *start;
    *pos = i;
    return 1;
}

int wan_word_count(const char *prompt) {
    if (!prompt) return 0;
    int64_t pos = 0, st, len;
    int n = 0;
    while (next_word(prompt, &pos, &st, &len)) n++;
    return n;
}

int wan_word_embed(const char *prompt, int L, int text_dim, float *out) {
    if (L < 1 || text_dim < 1) return core_error("word embedding: text length %d and text_dim %d must be >= 1", L, text_dim);
    int n = wan_word_count(prompt);
    if (n > L)
        return core_error("rollout.text_len: prompt \"%s\" has %d words, more than the text length %d", prompt, n, L);
    memset(out, 0, sizeof(float) * (size_t)L * (size_t)text_dim);
    if (!n) return 0;
    int64_t pos = 0, st, len;
    char word[256];
    for (int j = 0; next_word(prompt, &pos, &st, &len); j++) {
        uint32_t h;
        if (len < (int64_t)sizeof word) {
            for (int64_t k = 0; k < len; k++) {
                char c = prompt[st + k];
                word[k] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
            }
            h = wan_fnv1a32(word, len);
        } else { /* long word: hash incrementally with the same lower-casing */
            h = 0x811c9dc5u;
            for (int64_t k = 0; k < len; k++) {
                char c = prompt[st + k];
                c = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
                h ^= (uint8_t)c;
                h *= 0x01000193u;
            }
        }
        core_philox_normal(out + (int64_t)j * text_dim, text_dim, WAN_WORD_EMBED_SEED, 0, h, CORE_STREAM_WORD_EMBED);
    }
    return 0;
}
