/* tests/test_bench_clip.c — `vgrpo bench clip` (bench/bench_clip.c) on a tiny CLIP fixture: the FLOP count per
 * image and per prompt against the formula worked by hand, the table's rows and fields, PyTorch's figures from a
 * --torch file printed beside vgrpo's (and left out at another batch), the option errors; and `vgrpo bench reward
 * --models` with a learned scorer (clip_score on the tiny fixture) through the real server path. Timings are not
 * checked (benchmarks are commands, not timed tests). */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "tests/test.h"

#define TINY "tests/fixtures/clip_tf_qg"

TEST(bench_clip_flops) {
    /* vision: 8x8 pixels, patch 4 (grid 4, N 5), width 4, 2 layers, MLP 8, 3 channels; projection 6.
     * patch 2*4*3*16*4 = 1536; layers 2*(8*5*16 + 4*25*4 + 4*5*4*8) = 3360; projection 2*4*6 = 48 */
    clip_config c = {.channels = 3, .image_h = 8, .image_w = 8, .patch = 4, .projection_dim = 6};
    c.vision = (clip_tower_config){.width = 4, .layers = 2, .heads = 1, .mlp = 8};
    c.text = (clip_tower_config){.width = 4, .layers = 1, .heads = 1, .mlp = 8};
    CHECK_NEAR(bench_clip_image_flops(&c), 4944.0, 0);
    /* text, S 3: 8*3*16 + 4*9*4 + 4*3*4*8 + 48 */
    CHECK_NEAR(bench_clip_text_flops(&c, 3), 960.0, 0);
    c.image_w = 11; /* a 2 x 2 grid still: the convolution's floor */
    CHECK_NEAR(bench_clip_image_flops(&c), 4944.0, 0);
}

TEST(bench_clip_table) {
    const char *bin = test_vgrpo_bin();
    static char out[16384];
    CHECK(test_run(out, sizeof out, "%s bench clip --model " TINY " --batch 3 --reps 2 --threads 1", bin) == 0);
    CHECK_MSG(strstr(out, "vgrpo bench clip: " TINY " (transformers layout), "), "got: %s", out);
    CHECK_MSG(strstr(out, ", 1 thread, batch 3, median of 2 calls"), "got: %s", out);
    CHECK_MSG(strstr(out, "vision: 30x30, patch 6, width 30, 2 layers, 3 heads, MLP 37; text: 20 tokens, width 36"),
              "got: %s", out);
    CHECK_MSG(strstr(out, "ms/call") && strstr(out, "items/s") && strstr(out, "GFLOP/s") && strstr(out, "%peak"),
              "got: %s", out);
    /* the FLOPs of this config: grid 25, N 26; text N 20 */
    CHECK_MSG(strstr(out, "0.0009307 GFLOP per image, 0.0008194 GFLOP per prompt"), "got: %s", out);
    const char *img = strstr(out, "  image, vgrpo                  3 "), *txt = strstr(out, "  text, vgrpo                   3 ");
    CHECK_MSG(img && txt && img < txt && strstr(img, "(images/s)") && strstr(txt, "(texts/s)"), "got: %s", out);
    CHECK(!strstr(out, "image, PyTorch eager") && !strstr(out, "PyTorch figures"));

    CHECK(test_run(out, sizeof out, "%s bench clip --model " TINY " --batch 1 --reps 1 --tower text", bin) == 0);
    CHECK_MSG(strstr(out, "text, vgrpo") && !strstr(out, "image, vgrpo"), "got: %s", out);
}

TEST(bench_clip_torch_side) {
    const char *bin = test_vgrpo_bin(), *dir = test_tmpdir();
    static char out[16384];
    test_write_text(dir, "t.json",
                    "{\"clip\": {\"image\": {\"ms\": 50.0, \"batch\": 2}, \"text\": {\"ms\": 40.0, \"batch\": 3}}, "
                    "\"torch\": \"9.9\", \"threads\": 1}");
    CHECK(test_run(out, sizeof out, "%s bench clip --model " TINY " --batch 2 --reps 1 --threads 1 --torch %s/t.json",
                   bin, dir) == 0);
    CHECK_MSG(strstr(out, "PyTorch figures: torch 9.9, 1 thread"), "got: %s", out);
    /* 2 images in 50 ms: 40 images/s */
    CHECK_MSG(strstr(out, "  image, PyTorch eager          2      50.00     40.000 "), "got: %s", out);
    CHECK_MSG(strstr(out, "PyTorch's speed"), "got: %s", out);
    CHECK_MSG(strstr(out, "(PyTorch's text figure is for batch 3, not 2: not shown)"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s bench clip --model " TINY " --torch %s/absent.json", bin, dir) == 1);
    CHECK_MSG(strstr(out, "run scripts/bench_torch.py --json"), "got: %s", out);
}

TEST(bench_clip_usage) {
    const char *bin = test_vgrpo_bin(), *dir = test_tmpdir();
    static char out[8192];
    CHECK(test_run(out, sizeof out, "%s bench clip --help", bin) == 0);
    CHECK_MSG(strstr(out, "--model DIR") && strstr(out, "--batch B") && strstr(out, "--tower image|text|both") &&
                  strstr(out, "--torch FILE"),
              "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s bench --help", bin) == 0);
    CHECK_MSG(strstr(out, "  clip "), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s bench clip", bin) == 2);
    CHECK_MSG(strstr(out, "--model"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s bench clip --model " TINY " --tower vision", bin) == 2);
    CHECK_MSG(strstr(out, "--tower: expected image, text or both, got \"vision\""), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s bench clip --model %s", bin, dir) == 1); /* an empty folder */
    CHECK_MSG(strstr(out, "vgrpo bench clip: ") && strstr(out, dir), "got: %s", out);
}

/* The reward server with a learned scorer: the batched rows, every reply checked against in-process scores. */
TEST(bench_reward_learned) {
    const char *bin = test_vgrpo_bin();
    static char out[16384];
    CHECK(test_run(out, sizeof out,
                   "%s bench reward --scorers clip_score --models clip_score=tests/fixtures/clip_score_tf --frames 4 "
                   "--videos 4 --batch 2 --threads 1",
                   bin) == 0);
    CHECK_MSG(strstr(out, "models clip_score=tests/fixtures/clip_score_tf, frames 4;"), "got: %s", out);
    CHECK_MSG(strstr(out, "in process, 1 thread (no server)") && strstr(out, "batched, reward client"), "got: %s", out);
    CHECK_MSG(!strstr(out, "unbatched"), "got: %s", out);
    CHECK_MSG(strstr(out, "stats:"), "got: %s", out);
    /* a learned scorer without its folder: refused before the server starts */
    CHECK(test_run(out, sizeof out, "%s bench reward --scorers clip_score --videos 2", bin) == 1);
    CHECK_MSG(strstr(out, "needs a model folder"), "got: %s", out);
}
