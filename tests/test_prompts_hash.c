/* tests/test_prompts_hash.c — core_prompts_xxh64, the prompt list's content hash that checkpoints record and a resume
 * compares (trainer/run/run_files.c): the same prompts read from a text file and from JSON lines hash the same (comments
 * and blank lines do not count); a changed word, a changed metadata value, an image file's changed bytes and a
 * changed order each change it; the image's path alone does not (nor whether prompts share one file); an image that
 * cannot be read is named with its file:line. The resume's refusal itself: tests/test_checkpoint.c
 * checkpoint_resume_exact. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/prompts.h"
#include "tests/test.h"

/* core_prompts_xxh64 of dir/name, or 0 with a test failure naming the error. */
static uint64_t hash_of(const char *dir, const char *name, int line) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    core_prompts p;
    uint64_t h = 0;
    if (core_prompts_read(&p, path) || core_prompts_xxh64(&p, &h)) {
        test_fail(__FILE__, line, "%s: %s", path, core_last_error());
        return 0;
    }
    core_prompts_free(&p);
    return h;
}

static const char png_a[] = "\x89PNG\r\n\x1a\n-a", png_b[] = "\x89PNG\r\n\x1a\n-b";

TEST(prompts_hash_content_not_form) {
    const char *dir = test_tmpdir();
    test_write_text(dir, "a.txt", "a red kite\n# a comment\n\na green frog\n");
    test_write_text(dir, "b.jsonl", "{\"prompt\": \"a red kite\"}\n\n{\"prompt\": \"a green frog\"}\n");
    test_write_text(dir, "word.txt", "a red kite\na green frogs\n");
    test_write_text(dir, "order.txt", "a green frog\na red kite\n");
    test_write_text(dir, "meta1.jsonl", "{\"prompt\": \"a red kite\", \"color\": \"red\"}\n{\"prompt\": \"a green frog\", \"color\": \"green\"}\n");
    test_write_text(dir, "meta2.jsonl", "{\"prompt\": \"a red kite\", \"color\": \"blue\"}\n{\"prompt\": \"a green frog\", \"color\": \"green\"}\n");
    const uint64_t a = hash_of(dir, "a.txt", __LINE__), b = hash_of(dir, "b.jsonl", __LINE__);
    CHECK_MSG(a == b, "text %016llx, JSON lines %016llx", (unsigned long long)a, (unsigned long long)b);
    CHECK(a != hash_of(dir, "word.txt", __LINE__));
    CHECK(a != hash_of(dir, "order.txt", __LINE__));
    const uint64_t m1 = hash_of(dir, "meta1.jsonl", __LINE__), m2 = hash_of(dir, "meta2.jsonl", __LINE__);
    CHECK(m1 != a && m1 != m2);
}

TEST(prompts_hash_image_bytes) {
    const char *dir = test_tmpdir();
    char path[700];
    test_write_text(dir, "one.png", png_a);
    test_write_text(dir, "two.png", png_a); /* the same bytes under another name */
    test_write_text(dir, "p1.jsonl", "{\"prompt\": \"a cat\", \"image\": \"one.png\"}\n");
    test_write_text(dir, "p2.jsonl", "{\"prompt\": \"a cat\", \"image\": \"two.png\"}\n");
    const uint64_t h1 = hash_of(dir, "p1.jsonl", __LINE__);
    CHECK(h1 == hash_of(dir, "p2.jsonl", __LINE__));
    /* an image shared by several prompts (read once) counts for each as a file of its own with those bytes would */
    test_write_text(dir, "three.png", png_b);
    test_write_text(dir, "s1.jsonl", "{\"prompt\": \"a\", \"image\": \"one.png\"}\n{\"prompt\": \"b\", \"image\": "
                                     "\"three.png\"}\n{\"prompt\": \"c\", \"image\": \"one.png\"}\n");
    test_write_text(dir, "s2.jsonl", "{\"prompt\": \"a\", \"image\": \"one.png\"}\n{\"prompt\": \"b\", \"image\": "
                                     "\"three.png\"}\n{\"prompt\": \"c\", \"image\": \"two.png\"}\n");
    test_write_text(dir, "s3.jsonl", "{\"prompt\": \"a\", \"image\": \"one.png\"}\n{\"prompt\": \"b\", \"image\": "
                                     "\"one.png\"}\n{\"prompt\": \"c\", \"image\": \"one.png\"}\n");
    const uint64_t s1 = hash_of(dir, "s1.jsonl", __LINE__);
    CHECK(s1 == hash_of(dir, "s2.jsonl", __LINE__) && s1 != hash_of(dir, "s3.jsonl", __LINE__));
    test_write_text(dir, "one.png", png_b); /* one byte changed */
    const uint64_t h1b = hash_of(dir, "p1.jsonl", __LINE__);
    CHECK(h1b != h1 && h1b != 0);
    /* an image gone between reading and hashing: named with file:line */
    core_prompts p;
    snprintf(path, sizeof path, "%s/p1.jsonl", dir);
    REQUIRE_OK(core_prompts_read(&p, path));
    snprintf(path, sizeof path, "%s/one.png", dir);
    REQUIRE(remove(path) == 0);
    uint64_t h = 0;
    CHECK(core_prompts_xxh64(&p, &h) == -1);
    CHECK_MSG(strstr(core_last_error(), "p1.jsonl:1") && strstr(core_last_error(), "one.png"), "got: %s",
              core_last_error());
    core_prompts_free(&p);
}
