/* cli/cmd_init_clip.c — `vgrpo init-clip --preset tiny --out DIR [--seed N] [--image-size N] [--force]`: writes a
 * tiny random CLIP in transformers' CLIPModel folder layout, for the learned scorers (reward/learned.h) on the tiny
 * recipes (recipes/tiny-cpu-clip.yaml) and their tests, on a machine without Python or downloads:
 *
 *   DIR/config.json               CLIPConfig: text and vision towers of width 32, 2 layers, 2 heads, MLP 64,
 *                                 quick_gelu, projection_dim 16; text vocab 514, 77 positions, bos 512, eos 513
 *                                 (pooled at the first eos: transformers' rule for eos_token_id != 2); vision
 *                                 image_size --image-size (default 32), patch 8
 *   DIR/model.safetensors         random F32 weights named as CLIPModel.state_dict() (Philox with --seed: matrices
 *                                 normal / sqrt(fan_in), LayerNorm gains 1 + 0.1 z, biases 0.02 z, embeddings z,
 *                                 positions and class embedding 0.5 z), logit_scale ln(1 / 0.07) as CLIP's init
 *   DIR/tokenizer.json            a byte-level BPE without merges: ids 0..255 the 256 byte symbols of GPT-2's
 *                                 byte-to-unicode map (CLIP's order), 256..511 the same with "</w>" (a word's last
 *                                 byte), 512 <|startoftext|>, 513 <|endoftext|>; CLIP's normalizer, pre-tokenizer and
 *                                 post-processor (so every UTF-8 prompt tokenizes: a word is its bytes)
 *   DIR/tokenizer_config.json     CLIPTokenizer, pad = eos, model_max_length 77
 *   DIR/preprocessor_config.json  CLIPImageProcessor: shortest_edge and crop --image-size, bicubic, OpenAI mean/std
 * transformers loads the folder (CLIPModel.from_pretrained, AutoTokenizer, AutoImageProcessor): the fixtures of
 * scripts/fixtures_clip_score.py are made that way. Exit status 0, 1 on failure, 2 on a usage error. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/clip_init.h"
#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"

int cmd_init_clip(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    uint64_t seed = 0;
    int image = 32, force = 0;
    const opts_spec opts[] = {
        {.name = "preset", .type = OPTS_STRING, .str = &preset, .required = 1, .meta = "P",
         .help = "tiny (the one preset: random weights, for tests and the tiny recipes)"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .required = 1, .meta = "DIR", .help = "folder to write"},
        {.name = "seed", .type = OPTS_U64, .u64 = &seed, .meta = "N",
         .help = "Philox key of the weights (default 0)"},
        {.name = "image-size", .type = OPTS_INT, .i = &image, .min = CLIP_INIT_PATCH, .max = 1024, .meta = "N",
         .help = "the vision tower's image size and the processor's resize and crop (default 32; patch 8)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force, .help = "overwrite a folder that holds a config.json"},
        {0}};
    const opts_cmd cmd = {.name = "init-clip", .opts = opts,
                          .epilog = "Writes a transformers CLIPModel folder (config.json, model.safetensors, "
                                    "tokenizer.json, tokenizer_config.json, preprocessor_config.json)."};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (strcmp(preset, "tiny"))
        return opts_exit_status(opts_fail(&cmd, stderr, "--preset: unknown preset \"%s\" (known: tiny)", preset));
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", out);
    struct stat st;
    if (!force && stat(path, &st) == 0) {
        fprintf(stderr, "init-clip: %s exists (--force to overwrite)\n", path);
        return 1;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "init-clip: %s: cannot create folder: %s\n", out, strerror(errno));
        return 1;
    }
    if (clip_init_write_model(out, seed, image) || clip_init_write_tokenizer(out)) {
        fprintf(stderr, "init-clip: %s\n", core_last_error());
        return 1;
    }
    printf("init-clip: wrote the tiny random CLIP (seed %llu, image %d) to %s\n", (unsigned long long)seed, image, out);
    return 0;
}
