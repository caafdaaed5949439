/* tests/test_tokenizer.c — model/text/tokenizer.c against Hugging Face tokenizers on the fixture of
 * scripts/fixtures_text.py (a SentencePiece nmt_nfkc Unigram model converted by transformers' T5Converter). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/text/tokenizer.h"
#include "tests/test.h"

#define TOK_DIR "tests/fixtures/text_tiny/tokenizer"

/* Every fixture string encodes to exactly the ids of the Python fast tokenizer. */
TEST(tok_fixture_ids_match_python) {
    tok_tokenizer *t = tok_load(TOK_DIR);
    REQUIRE_OK(t ? 0 : -1);
    CHECK(tok_vocab_size(t) == 700);
    CHECK(tok_num_special(t) == 1);
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/text_tok_cases.json", 0, &je);
    REQUIRE(root);
    json_t *cases = json_object_get(root, "cases"), *c;
    REQUIRE(json_array_size(cases) >= 1000);
    size_t i;
    int bad = 0, total = 0;
    json_array_foreach(cases, i, c) {
        const char *s = json_string_value(json_array_get(c, 0));
        json_t *want = json_array_get(c, 1);
        int32_t *ids;
        int n;
        total++;
        if (tok_encode(t, s, 0, &ids, &n) != 0) {
            bad++;
            continue;
        }
        int ok = (size_t)n == json_array_size(want);
        for (int k = 0; ok && k < n; k++) ok = ids[k] == json_integer_value(json_array_get(want, (size_t)k));
        if (!ok) {
            if (bad < 5) {
                char *dbg = tok_debug_normalize(t, s);
                fprintf(stderr, "  case %zu mismatch: normalised \"%s\"; got", i, dbg ? dbg : "?");
                for (int k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
                fprintf(stderr, "\n");
                free(dbg);
            }
            bad++;
        }
        free(ids);
    }
    CHECK_MSG(bad == 0, "%d of %d strings tokenised differently from Python", bad, total);
    json_decref(root);
    tok_free(t);
}

/* The pieces of the pipeline, by hand: nmt_nfkc folds full-width forms and U+3000 to ASCII, Strip drops trailing
 * space, runs of spaces become one "▁", Metaspace prefixes "▁" and splits before each "▁". */
TEST(tok_normalise_by_hand) {
    tok_tokenizer *t = tok_load(TOK_DIR "/tokenizer.json");
    REQUIRE_OK(t ? 0 : -1);
    char *a = tok_debug_normalize(t, "\xEF\xBC\xA8\xEF\xBD\x89\xE3\x80\x80" "a   b  "); /* "Ｈｉ　a   b  " */
    REQUIRE(a);
    CHECK_MSG(!strcmp(a, "\xE2\x96\x81Hi|\xE2\x96\x81" "a|\xE2\x96\x81" "b"), "got \"%s\"", a);
    free(a);
    char *e = tok_debug_normalize(t, "e\xCC\x81"); /* e + U+0301 composes to U+00E9 */
    REQUIRE(e);
    CHECK_MSG(!strcmp(e, "\xE2\x96\x81\xC3\xA9"), "got \"%s\"", e);
    free(e);
    int32_t *ids;
    int n;
    REQUIRE_OK(tok_encode(t, "", 0, &ids, &n));
    CHECK(n == 1 && ids[0] == 1); /* only </s> */
    free(ids);
    REQUIRE_OK(tok_encode(t, "hello world hello world", 5, &ids, &n)); /* truncation keeps </s> last */
    CHECK(n == 5 && ids[4] == 1);
    free(ids);
    CHECK(tok_encode(t, "bad \xC3", 0, &ids, &n) == -1);
    tok_free(t);
}

TEST(tok_errors_name_the_problem) {
    const char *dir = test_tmpdir();
    CHECK(tok_load(dir) == NULL);
    CHECK_MSG(strstr(core_last_error(), "missing tokenizer.json") != NULL, "error: %s", core_last_error());
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", f);
    fclose(f);
    CHECK(tok_load(dir) == NULL);
    CHECK_MSG(strstr(core_last_error(), "BPE") != NULL, "error: %s", core_last_error());
}

/* Writes a hand-made Unigram tokenizer.json into a fresh folder and returns the folder. */
static const char *hand_tokenizer(int byte_fallback) {
    const char *dir = test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f,
            "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": "
            "{\"String\": \"x\"}, \"content\": \"c\"}, {\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": "
            "true}]},\n \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": "
            "\"always\", \"split\": true},\n \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
            "[{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], "
            "\"special_tokens\": {\"</s>\": {\"id\": \"</s>\", \"ids\": [1], \"tokens\": [\"</s>\"]}}},\n"
            " \"model\": {\"type\": \"Unigram\", \"unk_id\": 2, \"byte_fallback\": %s, \"vocab\": [[\"<pad>\", 0.0], "
            "[\"</s>\", 0.0], [\"<unk>\", 0.0], [\"\\u2581\", -2.0], [\"\\u2581a\", -1.0], [\"b\", -1.5], "
            "[\"\\u2581ab\", -3.0], [\"a\", -2.5], [\"<0xC3>\", 0.0], [\"<0xA9>\", 0.0], [\"c\", -4.0]]}}\n",
            byte_fallback ? "true" : "false");
    fclose(f);
    return dir;
}

static int ids_equal(const tok_tokenizer *t, const char *s, const int32_t *want, int nwant) {
    int32_t *ids;
    int n;
    if (tok_encode(t, s, 0, &ids, &n)) return 0;
    int ok = n == nwant;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        fprintf(stderr, "  \"%s\":", s);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

/* Viterbi, unknown fusion and byte fallback, by hand: "▁a"+"b" (-2.5) beats "▁ab" (-3) and "▁"+"a"+"b" (-6);
 * "é" is not a piece: its bytes C3 A9 are; "d" has neither a piece nor a byte piece, so "éd" fuses to one <unk>. */
TEST(tok_viterbi_and_byte_fallback_by_hand) {
    tok_tokenizer *t = tok_load(hand_tokenizer(1));
    REQUIRE_OK(t ? 0 : -1);
    CHECK(ids_equal(t, "ab", (int32_t[]){4, 5, 1}, 3));
    /* strip both sides, x -> c; "▁ab▁▁c" splits into "▁ab" "▁" "▁c" */
    CHECK(ids_equal(t, "  ab  x ", (int32_t[]){4, 5, 3, 3, 10, 1}, 6));
    CHECK(ids_equal(t, "\xC3\xA9", (int32_t[]){3, 8, 9, 1}, 4));
    CHECK(ids_equal(t, "\xC3\xA9\xC3\xA9", (int32_t[]){3, 8, 9, 8, 9, 1}, 6));
    CHECK(ids_equal(t, "\xC3\xA9" "d", (int32_t[]){3, 2, 1}, 3));
    tok_free(t);
    t = tok_load(hand_tokenizer(0));
    REQUIRE_OK(t ? 0 : -1);
    CHECK(ids_equal(t, "\xC3\xA9\xC3\xA9" "b", (int32_t[]){3, 2, 5, 1}, 4));
    tok_free(t);
}

/* Random code points (every plane, controls, marks, lone combining characters) and random '&' soup never crash
 * and always give in-range ids ending in </s>, with and without truncation. */
TEST(tok_random_text_robust) {
    tok_tokenizer *t = tok_load(TOK_DIR);
    REQUIRE_OK(t ? 0 : -1);
    unsigned long long s = 12345;
    char buf[512];
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        int len = 0, nch = (int)(s % 40);
        for (int c = 0; c < nch; c++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            uint32_t r = (uint32_t)(s >> 33), cp;
            switch (r % 5) {
            case 0: cp = 1 + r % 0x7F; break;
            case 1: cp = 0x300 + r % 0x70; break;
            case 2: cp = 0x80 + r % 0x3000; break;
            case 3: cp = 0xFF00 + r % 0x100; break;
            default: cp = 0x10000 + r % 0x100000; break;
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = ' ';
            if (cp < 0x80) buf[len++] = (char)cp;
            else if (cp < 0x800) buf[len++] = (char)(0xC0 | cp >> 6), buf[len++] = (char)(0x80 | (cp & 63));
            else if (cp < 0x10000)
                buf[len++] = (char)(0xE0 | cp >> 12), buf[len++] = (char)(0x80 | ((cp >> 6) & 63)),
                buf[len++] = (char)(0x80 | (cp & 63));
            else
                buf[len++] = (char)(0xF0 | cp >> 18), buf[len++] = (char)(0x80 | ((cp >> 12) & 63)),
                buf[len++] = (char)(0x80 | ((cp >> 6) & 63)), buf[len++] = (char)(0x80 | (cp & 63));
        }
        buf[len] = 0;
        for (int max_len = 0; max_len <= 8; max_len += 8) {
            int32_t *ids;
            int n;
            if (tok_encode(t, buf, max_len, &ids, &n)) {
                bad++;
                continue;
            }
            int ok = n >= 1 && ids[n - 1] == 1 && (max_len == 0 || n <= max_len);
            for (int k = 0; k < n; k++) ok &= ids[k] >= 0 && ids[k] < tok_vocab_size(t);
            bad += !ok;
            free(ids);
        }
    }
    CHECK_MSG(bad == 0, "%d random strings gave bad ids", bad);
    tok_free(t);
}
