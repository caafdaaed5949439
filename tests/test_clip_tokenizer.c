/* tests/test_clip_tokenizer.c — model/clip/clip_tokenizer.c against transformers' CLIPTokenizer (5.24, the
 * tokenizers-backed class; CLIPTokenizerFast in 4.x) on the real CLIP vocabulary (scripts/fixtures_clip_text.py
 * builds it from open_clip's merges): hard strings, prompts over 77 tokens and every VBench prompt, ids equal.
 *
 * open_clip's SimpleTokenizer (HPSv2) gives other ids on 96 of the 304 fixture strings; the fixture lists them
 * ("open_clip"). The causes: ftfy.fix_text (curly quotes to ', ligatures and full-width forms folded, C1 controls
 * read as cp1252, control characters and U+FEFF dropped), html.unescape (&amp; -> &), Python's \s (U+001C..U+001F
 * are spaces there), str.lower()'s final sigma, its special tokens spelled <start_of_text> / <end_of_text> (so
 * "<|endoftext|>" in a prompt is plain text there), and padding with 0 instead of the pad token. On plain prompts
 * (all of VBench) the two agree up to the padding id. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "model/clip/clip_tokenizer.h"
#include "tests/test.h"

#define CLIP_TOK_DIR "tests/fixtures/clip_tok"

static int same_ids(const int32_t *got, int n, json_t *want) {
    if ((size_t)n != json_array_size(want)) return 0;
    for (int k = 0; k < n; k++)
        if (got[k] != json_integer_value(json_array_get(want, (size_t)k))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "    %s:", what);
    for (int k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
    fprintf(stderr, "\n");
}

/* Every fixture string: tokenizer(text, padding="max_length", truncation=True, max_length=77) exactly, and the
 * untruncated ids of the long ones. */
TEST(clip_tok_fixture_ids_match_transformers) {
    clip_tokenizer *t = clip_tok_load(CLIP_TOK_DIR);
    REQUIRE_OK(t ? 0 : -1);
    CHECK(clip_tok_vocab_size(t) == 49408);
    CHECK(clip_tok_bos_id(t) == 49406 && clip_tok_eos_id(t) == 49407 && clip_tok_pad_id(t) == 49407);
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/clip_tok_cases.json", JSON_ALLOW_NUL, &je);
    REQUIRE(root);
    json_t *cases = json_object_get(root, "cases"), *c;
    REQUIRE(json_array_size(cases) >= 300);
    int pad = (int)json_integer_value(json_object_get(root, "pad_id"));
    size_t i;
    int bad = 0, nlong = 0, ntrunc = 0;
    json_array_foreach(cases, i, c) {
        json_t *js = json_array_get(c, 0), *want = json_array_get(c, 1), *full = json_array_get(c, 2);
        const char *s = json_string_value(js);
        size_t len = json_string_length(js);
        int32_t ids[CLIP_TOK_CONTEXT];
        int n = -1, ok = clip_tok_encode_padded(t, s, len, CLIP_TOK_CONTEXT, ids, &n) == 0 && same_ids(ids, n, want);
        for (int k = n; ok && k < CLIP_TOK_CONTEXT; k++) ok = ids[k] == pad;
        if (ok && json_is_array(full)) { /* the same text without truncation */
            int32_t *all;
            int na;
            nlong++;
            ok = clip_tok_encode(t, s, len, 0, &all, &na) == 0;
            if (ok) {
                ok = same_ids(all, na, full) && na > CLIP_TOK_CONTEXT;
                free(all);
            }
        }
        if (n == CLIP_TOK_CONTEXT) ntrunc++;
        if (!ok) {
            if (bad < 5) {
                char *w = clip_tok_debug_words(t, s, len);
                fprintf(stderr, "  case %zu (\"%s\") mismatch; words %s\n", i, s, w ? w : "?");
                print_ids("got", ids, n < 0 ? 0 : n);
                free(w);
            }
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d of %zu strings tokenised differently from transformers", bad, json_array_size(cases));
    CHECK_MSG(nlong >= 10 && ntrunc >= 10, "%d long prompts, %d truncated: the fixture lost its long prompts", nlong,
              ntrunc);
    json_decref(root);
    clip_tok_free(t);
}

/* Every line of every VBench prompt file (the project's data folder, $VGRPO_VBENCH_DIR; skipped without it). */
TEST(clip_tok_vbench_prompts_match_transformers) {
    const char *dir = getenv("VGRPO_VBENCH_DIR");
    struct stat st;
    if (!dir || !*dir || stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        test_skip("VGRPO_VBENCH_DIR does not name the VBench prompt folder");
        return;
    }
    clip_tokenizer *t = clip_tok_load(CLIP_TOK_DIR);
    REQUIRE_OK(t ? 0 : -1);
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/clip_tok_vbench.json", 0, &je);
    REQUIRE(root);
    json_t *rows = json_object_get(root, "rows"), *files = json_object_get(root, "files"), *per;
    const char *name;
    int bad = 0, lines = 0, nfiles = 0;
    json_object_foreach(files, name, per) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "r");
        CHECK_MSG(f != NULL, "%s: missing (the fixture has it)", path);
        if (!f) continue;
        nfiles++;
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        size_t k = 0;
        while ((len = getline(&line, &cap, f)) >= 0) {
            if (len && line[len - 1] == '\n') line[--len] = 0;
            json_t *want = json_array_get(rows, (size_t)json_integer_value(json_array_get(per, k)));
            int32_t ids[CLIP_TOK_CONTEXT];
            int n = 0;
            if (k >= json_array_size(per) || clip_tok_encode_padded(t, line, (size_t)len, CLIP_TOK_CONTEXT, ids, &n) ||
                !same_ids(ids, n, want)) {
                if (bad++ < 5) fprintf(stderr, "  %s:%zu: \"%s\" differs from transformers\n", name, k + 1, line);
            }
            for (int j = n; j < CLIP_TOK_CONTEXT; j++) bad += ids[j] != clip_tok_pad_id(t);
            k++, lines++;
        }
        CHECK_MSG(k == json_array_size(per), "%s: %zu lines, the fixture has %zu", path, k, json_array_size(per));
        free(line);
        fclose(f);
    }
    CHECK_MSG(bad == 0, "%d VBench prompts tokenised differently from transformers", bad);
    CHECK_MSG(nfiles >= 10 && lines >= 1000, "%d files, %d lines", nfiles, lines);
    json_decref(root);
    clip_tok_free(t);
}

/* A hand-made tokenizer: the vocabulary of the bytes a..e alone and with </w>, a few merges, one normalized and
 * one raw added token, TemplateProcessing, pad from tokenizer_config.json. Word boundaries, the end-of-word
 * suffix, merge order (rank before position), contractions and added tokens are checked by hand. */
static const char *hand_tokenizer(const char *pad_token) {
    const char *dir = test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    /* ids: a b c d e ' s = 0..6, the same with </w> 7..13, merges: "b c</w>" -> bc</w> 14 (rank 0),
     * "a b" -> ab 15 (rank 1), "ab c</w>" -> abc</w> 16 (rank 2), "' s</w>" -> 's</w> 17 (rank 3); added: <X> 18
     * (raw), <y> 19 (normalized); <s> 20, </s> 21. */
    fprintf(f, "{\"added_tokens\": [{\"id\": 18, \"content\": \"<X>\", \"normalized\": false},"
               " {\"id\": 19, \"content\": \"<y>\", \"normalized\": true}, {\"id\": 20, \"content\": \"<s>\"},"
               " {\"id\": 21, \"content\": \"</s>\"}],\n"
               " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Replace\","
               " \"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \" \"}, {\"type\": \"Lowercase\"}]},\n"
               " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
               " {\"Regex\": \"<\\\\|startoftext\\\\|>|<\\\\|endoftext\\\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\\\p{L}]+|"
               "[\\\\p{N}]|[^\\\\s\\\\p{L}\\\\p{N}]+\"}, \"behavior\": \"Removed\", \"invert\": true},"
               " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}]},\n"
               " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}},"
               " {\"Sequence\": {\"id\": \"A\"}}, {\"SpecialToken\": {\"id\": \"</s>\"}}], \"special_tokens\":"
               " {\"<s>\": {\"ids\": [20]}, \"</s>\": {\"ids\": [21]}}},\n"
               " \"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"unk_token\": \"</s>\", \"vocab\":"
               " {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"e\": 4, \"'\": 5, \"s\": 6, \"a</w>\": 7, \"b</w>\": 8,"
               " \"c</w>\": 9, \"d</w>\": 10, \"e</w>\": 11, \"'</w>\": 12, \"s</w>\": 13, \"bc</w>\": 14, \"ab\": 15,"
               " \"abc</w>\": 16, \"'s</w>\": 17},\n"
               " \"merges\": [[\"b\", \"c</w>\"], \"a b\", [\"ab\", \"c</w>\"], \"' s</w>\"]}}\n");
    fclose(f);
    if (pad_token) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        f = fopen(path, "w");
        if (!f) return NULL;
        fprintf(f, "{\"pad_token\": {\"content\": \"%s\"}}\n", pad_token);
        fclose(f);
    }
    return dir;
}

static int hand_ids(const clip_tokenizer *t, const char *s, const int32_t *want, int nwant) {
    int32_t *ids;
    int n;
    if (clip_tok_encode(t, s, strlen(s), 0, &ids, &n)) return 0;
    int ok = n == nwant;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        fprintf(stderr, "  \"%s\":", s);
        print_ids("got", ids, n);
    }
    free(ids);
    return ok;
}

TEST(clip_tok_bpe_by_hand) {
    clip_tokenizer *t = clip_tok_load(hand_tokenizer("a"));
    REQUIRE_OK(t ? 0 : -1);
    CHECK(clip_tok_pad_id(t) == 0 && clip_tok_bos_id(t) == 20 && clip_tok_eos_id(t) == 21);
    /* "abc": a b c</w>; "b c</w>" (rank 0) merges before "a b" (rank 1) although it is to the right */
    CHECK(hand_ids(t, "abc", (int32_t[]){20, 0, 14, 21}, 4));
    /* "ab": a b</w>; "a b" needs b without </w>: no merge applies */
    CHECK(hand_ids(t, "ab", (int32_t[]){20, 0, 8, 21}, 4));
    /* "abd": a b -> ab (rank 1); "ab d</w>" is no merge */
    CHECK(hand_ids(t, "ABD", (int32_t[]){20, 15, 10, 21}, 4));
    /* contraction 's is its own word; "'" alone at the end is a word of its own; spaces drop */
    CHECK(hand_ids(t, "  a's '  ", (int32_t[]){20, 7, 17, 12, 21}, 5));
    /* a byte not in the vocabulary is unk (</s>); a digit is a word of one character */
    CHECK(hand_ids(t, "a1", (int32_t[]){20, 7, 21, 21}, 4));
    /* raw added token <X> split out before lowercasing; "<x>" is plain text (< and > unknown, x unknown) */
    CHECK(hand_ids(t, "a<X>b", (int32_t[]){20, 7, 18, 8, 21}, 5));
    /* normalized added token <y> is found after lowercasing */
    CHECK(hand_ids(t, "a<Y>b", (int32_t[]){20, 7, 19, 8, 21}, 5));
    const char *dw = "Ab\xC3\xA9!! c's \xE2\x80\x99";
    char *w = clip_tok_debug_words(t, dw, strlen(dw));
    REQUIRE(w);
    /* é (C3 A9) maps to the byte symbols Ã (C3) and © (A9); ’ (E2 80 99) to â, Ģ (U+0122 for 0x80), Ļ (0x99) */
    CHECK_MSG(!strcmp(w, "ab\xC3\x83\xC2\xA9|!!|c|'s|\xC3\xA2\xC4\xA2\xC4\xBB"), "got %s", w);
    free(w);
    int32_t ids[6];
    int n;
    REQUIRE_OK(clip_tok_encode_padded(t, "abc abc abc", 11, 6, ids, &n)); /* truncated: </s> kept last */
    CHECK(n == 6 && ids[0] == 20 && ids[1] == 0 && ids[2] == 14 && ids[3] == 0 && ids[4] == 14 && ids[5] == 21);
    REQUIRE_OK(clip_tok_encode_padded(t, "", 0, 6, ids, &n)); /* empty prompt: <s> </s> then pad */
    CHECK(n == 2 && ids[0] == 20 && ids[1] == 21 && ids[2] == 0 && ids[5] == 0);
    clip_tok_free(t);
}

/* The padding id comes from tokenizer_config.json (laion's folders pad with "!", id 0 in CLIP's vocabulary). */
TEST(clip_tok_pad_from_tokenizer_config) {
    const char *dir = test_tmpdir();
    char cmd[2048], out[256];
    snprintf(cmd, sizeof cmd, "ln -s \"$PWD/%s/tokenizer.json\" %s/tokenizer.json", CLIP_TOK_DIR, dir);
    REQUIRE(test_run(out, sizeof out, "%s", cmd) == 0);
    test_write_text(dir, "tokenizer_config.json", "{\"pad_token\": \"!\", \"model_max_length\": 77}\n");
    clip_tokenizer *t = clip_tok_load(dir);
    REQUIRE_OK(t ? 0 : -1);
    CHECK(clip_tok_pad_id(t) == 0);
    int32_t ids[CLIP_TOK_CONTEXT];
    int n;
    REQUIRE_OK(clip_tok_encode_padded(t, "a cat", 5, CLIP_TOK_CONTEXT, ids, &n));
    CHECK(n == 4 && ids[0] == 49406 && ids[3] == 49407 && ids[4] == 0 && ids[76] == 0);
    clip_tok_free(t);
    /* the file alone: no tokenizer_config.json, so the end-of-text id pads (transformers' CLIPTokenizer default) */
    t = clip_tok_load(CLIP_TOK_DIR "/tokenizer.json");
    REQUIRE_OK(t ? 0 : -1);
    CHECK(clip_tok_pad_id(t) == 49407);
    clip_tok_free(t);
}

static void expect_load_error(const char *dir, const char *json, const char *needle) {
    test_write_text(dir, "tokenizer.json", json);
    clip_tokenizer *t = clip_tok_load(dir);
    CHECK_MSG(t == NULL && strstr(core_last_error(), needle), "%s: want an error naming \"%s\", got \"%s\"", json,
              needle, t ? "(loaded)" : core_last_error());
    clip_tok_free(t);
}

TEST(clip_tok_errors_name_the_problem) {
    const char *dir = test_tmpdir();
    CHECK(clip_tok_load(dir) == NULL);
    CHECK_MSG(strstr(core_last_error(), "missing tokenizer.json") != NULL, "error: %s", core_last_error());
    expect_load_error(dir, "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "only BPE");
    expect_load_error(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
                      "merges[0]");
    expect_load_error(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                           " \"normalizer\": {\"type\": \"NFKC\"}}", "unsupported normalizer \"NFKC\"");
    expect_load_error(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                           " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "Sequence [Split, ByteLevel]");
    expect_load_error(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                           " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\","
                           " \"pattern\": {\"Regex\": \"\\\\w+\"}}, {\"type\": \"ByteLevel\"}]}}", "is not CLIP's");
    expect_load_error(dir, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []", "tokenizer.json:");
    /* a pad_token the vocabulary lacks */
    const char *hd = hand_tokenizer("<pad>");
    REQUIRE(hd);
    CHECK(clip_tok_load(hd) == NULL);
    CHECK_MSG(strstr(core_last_error(), "pad_token \"<pad>\"") != NULL, "error: %s", core_last_error());
    /* invalid UTF-8 and a max_length below the special tokens */
    clip_tokenizer *t = clip_tok_load(CLIP_TOK_DIR);
    REQUIRE_OK(t ? 0 : -1);
    int32_t *ids, buf[4];
    int n;
    CHECK(clip_tok_encode(t, "bad \xC3", 5, 0, &ids, &n) == -1);
    CHECK_MSG(strstr(core_last_error(), "UTF-8") != NULL, "error: %s", core_last_error());
    CHECK(clip_tok_encode_padded(t, "a", 1, 1, buf, &n) == -1);
    CHECK_MSG(strstr(core_last_error(), "max_length 1") != NULL, "error: %s", core_last_error());
    clip_tok_free(t);
}

/* Random code points from every plane (controls, marks, unassigned, private use, emoji) and random bytes: valid
 * UTF-8 encodes to in-range ids framed by <|startoftext|> ... <|endoftext|>, invalid UTF-8 is refused. */
TEST(clip_tok_random_text) {
    clip_tokenizer *t = clip_tok_load(CLIP_TOK_DIR);
    REQUIRE_OK(t ? 0 : -1);
    uint64_t s = 12345;
    int bad = 0, refused = 0;
    for (int k = 0; k < 300; k++) {
        char buf[256];
        size_t n = 0;
        int raw = k % 3 == 2; /* every third string: raw bytes, mostly invalid UTF-8 */
        while (n < sizeof buf - 4) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            uint32_t r = (uint32_t)(s >> 33);
            if (raw) {
                buf[n++] = (char)(r & 0xFF);
                continue;
            }
            uint32_t cp = r % 4 == 0 ? r % 0x80 : r % 4 == 1 ? r % 0x800 : r % 4 == 2 ? r % 0x10000 : r % 0x110000;
            if (cp >= 0xD800 && cp < 0xE000) continue;
            n += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)buf + n);
        }
        int32_t ids[CLIP_TOK_CONTEXT];
        int nr;
        if (clip_tok_encode_padded(t, buf, n, CLIP_TOK_CONTEXT, ids, &nr)) {
            refused++;
            bad += !raw;
            continue;
        }
        int ok = nr >= 2 && ids[0] == 49406 && ids[nr - 1] == 49407;
        for (int i = 0; i < CLIP_TOK_CONTEXT; i++) ok = ok && ids[i] >= 0 && ids[i] < 49408;
        bad += !ok;
    }
    CHECK_MSG(bad == 0, "%d random strings gave bad ids (or valid UTF-8 was refused)", bad);
    CHECK_MSG(refused >= 90, "only %d of the 100 raw-byte strings were refused as invalid UTF-8", refused);
    clip_tok_free(t);
}
