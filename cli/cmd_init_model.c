/* cli/cmd_init_model.c — `vgrpo init-model --preset P --out DIR [--seed N] [--experts 1|2] [--force]`: writes a
 * pipeline folder in diffusers' WanPipeline layout.
 *
 *   DIR/model_index.json     {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
 *                             "transformer_2": [...] or [null, null], "boundary_ratio": 0.875 or null,
 *                             "expand_timesteps": true for wan2.2-ti2v-5b and tiny-ti2v, ...; wan2.2-i2v-a14b:
 *                             "_class_name": "WanImageToVideoPipeline", "boundary_ratio": 0.9, "image_encoder" and
 *                             "image_processor" [null, null], as Wan-AI/Wan2.2-I2V-A14B-Diffusers)
 *   DIR/transformer/         config.json (+ diffusion_pytorch_model.safetensors for `tiny`)
 *   DIR/transformer_2/       the low-noise expert of wan2.2-t2v-a14b (config only), or of `tiny --experts 2`
 *                            (random weights from seed + 1; a two-expert test model, boundary_ratio 0.875)
 *   DIR/latent_rgb.safetensors  `tiny` only: the fixed latent-to-RGB map standing in for the VAE
 *                            (model/vae/latent_rgb.h; a vgrpo file, not a diffusers component, so not in model_index)
 *   DIR/text_encoder/, DIR/tokenizer/, DIR/vae/  `tiny` only: a random umT5 encoder (d_model = the DiT's
 *                            text_dim), a small Unigram tokenizer.json and a random Wan 2.1-style VAE decoder
 *                            (model/text/tiny_text.h, model/vae/tiny_vae.h), so `vgrpo generate` runs on the folder end to end
 * `tiny-ti2v` is `tiny` as an image-to-video pipeline (Wan 2.2 TI2V's first-frame conditioning, diffusers'
 * WanImageToVideoPipeline with expand_timesteps): model_index.json says "expand_timesteps": true and vae/ also has the
 * encoder (random, vae_tiny_write_with_encoder), which encodes each prompt's image as the first latent frame. Its VAE
 * is Wan 2.1-style (16 channels, 8x spatial, as the tiny DiT's 16 channels), where the real TI2V-5B has the
 * Wan 2.2 VAE (48 channels, 16x; the rollout decodes both). `tiny-i2v` is the same for Wan 2.2 I2V-A14B: two tiny
 * experts (seed, seed + 1) of 36 input and 16 output channels, the VAE with its encoder, model_index.json as WanImageToVideoPipeline with
 * boundary_ratio 0.875 (run, eval, parity and `vgrpo generate --image` sample it).
 *
 * `tiny` gets random F32 weights (wan_params_init_random, Philox with --seed, default 0), so the folder loads in
 * vgrpo and in diffusers (WanTransformer3DModel.from_pretrained(DIR, subfolder="transformer")). The real-size
 * presets get configs only (put the official weights beside them), unless --random: then random F32 transformer
 * weights the same way and latent_rgb.safetensors, but no text encoder, tokenizer or VAE (run with
 * model.text_encoder word_embed and model.decoder latent_rgb); a folder for timing a real shape (scripts/gpu_check.sh
 * --stage 3), never for training.
 * Every component folder present is listed in model_index.json (a scheduler folder is not written: vgrpo's
 * schedule is FlowMatchEulerDiscreteScheduler's, model/flow/flow.h). Exit status 0, 1 on failure, 2 on a usage error. */
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/vae/latent_rgb.h"
#include "model/vae/tiny_vae.h"
#include "model/text/tiny_text.h"
#include "model/dit/wan_dit.h"

/* The usage's text after the options: the presets (from model/dit's table) and what each writes. */
static void preset_list(char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "presets:");
    for (const char *const *p = wan_preset_names(); *p && n < cap; p++)
        n += (size_t)snprintf(buf + n, cap - n, "\n  %-16s %s", *p,
                              !strcmp(*p, "tiny") ? "random weights (seeded), for tests and the demo"
                              : !strcmp(*p, "tiny-ti2v") ? "tiny as image to video (first-frame conditioning)"
                              : !strcmp(*p, "tiny-i2v")  ? "two tiny experts as Wan 2.2 I2V-A14B (36 in, 16 out)"
                              : strstr(*p, "a14b") ? "two experts, configs only (no weights)"
                                                   : "config only (no weights)");
}

static int make_dir(const char *path) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return core_error("%s: cannot create folder: %s", path, strerror(errno));
    return 0;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* --force: removes what an earlier init-model wrote into dir (and nothing else), so a different preset leaves no
 * stale weights or expert folder behind. Files of other origin stay; a component folder is removed once empty. */
static void remove_previous(const char *dir) {
    static const char *const files[] = {"model_index.json", "latent_rgb.safetensors"};
    static const char *const subs[] = {"transformer", "transformer_2"};
    static const char *const tiny_files[] = {"text_encoder/config.json", "text_encoder/model.safetensors",
                                             "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
                                             "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
                                             "text_encoder", "tokenizer", "vae"};
    char path[4200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    for (size_t i = 0; i < sizeof tiny_files / sizeof tiny_files[0]; i++) { /* files, then the emptied folders */
        snprintf(path, sizeof path, "%s/%s", dir, tiny_files[i]);
        if (unlink(path) != 0) rmdir(path);
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s/config.json", dir, subs[i]);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s/diffusion_pytorch_model*.safetensors*", dir, subs[i]);
        glob_t g;
        if (glob(path, 0, NULL, &g) == 0)
            for (size_t k = 0; k < g.gl_pathc; k++) unlink(g.gl_pathv[k]);
        globfree(&g);
        snprintf(path, sizeof path, "%s/%s", dir, subs[i]);
        rmdir(path);
    }
}

/* model_index.json: every component folder present in dir, plus the pipeline's config values. */
static int write_model_index(const char *dir, const char *preset, int two_experts) {
    json_t *root = json_object();
    /* Wan-AI/Wan2.2-I2V-A14B-Diffusers' model_index.json; tiny-i2v as it with boundary_ratio 0.875 */
    const int i2v = !strcmp(preset, "wan2.2-i2v-a14b") || !strcmp(preset, "tiny-i2v");
    json_object_set_new(root, "_class_name", json_string(i2v ? "WanImageToVideoPipeline" : "WanPipeline"));
    json_object_set_new(root, "_diffusers_version", json_string("0.42.1"));
    json_object_set_new(root, "boundary_ratio", !strcmp(preset, "wan2.2-i2v-a14b") ? json_real(0.9)
                                                : two_experts                      ? json_real(0.875)
                                                                                   : json_null());
    if (i2v) { /* no CLIP image encoder (Wan 2.1 I2V's) */
        for (int k = 0; k < 2; k++) {
            json_t *none = json_array();
            json_array_append_new(none, json_null());
            json_array_append_new(none, json_null());
            json_object_set_new(root, k ? "image_processor" : "image_encoder", none);
        }
    }
    json_object_set_new(root, "expand_timesteps",
                        json_boolean(!strcmp(preset, "wan2.2-ti2v-5b") || !strcmp(preset, "tiny-ti2v")));
    static const struct {
        const char *name, *lib, *cls;
    } comps[] = {
        {"scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler"},
        {"text_encoder", "transformers", "UMT5EncoderModel"},
        {"tokenizer", "transformers", "T5TokenizerFast"},
        {"transformer", "diffusers", "WanTransformer3DModel"},
        {"transformer_2", "diffusers", "WanTransformer3DModel"},
        {"vae", "diffusers", "AutoencoderKLWan"},
    };
    char path[4096];
    for (size_t i = 0; i < sizeof comps / sizeof comps[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, comps[i].name);
        json_t *pair = json_array();
        if (exists(path)) {
            json_array_append_new(pair, json_string(comps[i].lib));
            json_array_append_new(pair, json_string(comps[i].cls));
        } else if (!strcmp(comps[i].name, "transformer_2")) { /* optional component: [null, null] as diffusers */
            json_array_append_new(pair, json_null());
            json_array_append_new(pair, json_null());
        } else {
            json_decref(pair);
            continue;
        }
        json_object_set_new(root, comps[i].name, pair);
    }
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (rc) return core_error("%s: cannot write", path);
    return 0;
}

int cmd_init_model(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    uint64_t seed = 0;
    int force = 0, experts = 0, random = 0; /* experts 0: the preset's own count */
    char presets[1024];
    preset_list(presets, sizeof presets);
    const opts_spec opts[] = {
        {.name = "preset", .type = OPTS_STRING, .str = &preset, .required = 1, .meta = "P",
         .help = "the preset (listed below)"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .required = 1, .meta = "DIR", .help = "the pipeline folder"},
        {.name = "seed", .type = OPTS_U64, .u64 = &seed, .meta = "N",
         .help = "seed of the tiny preset's random weights (default 0)"},
        {.name = "experts", .type = OPTS_INT, .i = &experts, .min = 1, .max = 2, .meta = "1|2",
         .help = "tiny only: 2 also writes transformer_2/ (seed + 1), a two-expert model\nas Wan 2.2 A14B"},
        {.name = "random", .type = OPTS_FLAG, .flag = &random,
         .help = "real-size presets: random transformer weights (seeded) and the latent-to-RGB\nmap, no text encoder or VAE: "
                 "for timing a real shape, not for training"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force,
         .help = "replace an earlier init-model's files in DIR (other files are kept)"},
        {0}};
    const opts_cmd cmd = {.name = "init-model", .opts = opts, .epilog = presets,
                          .about = "Writes a Wan pipeline folder (diffusers WanPipeline layout) for preset P."};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    wan_config cfg;
    if (wan_config_preset(&cfg, preset)) return opts_exit_status(opts_fail(&cmd, stderr, "%s", core_last_error()));
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", out);
    if (exists(path) && !force) {
        fprintf(stderr, "vgrpo init-model: %s already exists (use --force to overwrite)\n", path);
        return 1;
    }
    /* tiny-i2v: two tiny experts as the I2V-A14B (36 in, 16 out) and a VAE with its encoder */
    const int a14b = strstr(preset, "a14b") != NULL || !strcmp(preset, "tiny-i2v"), tiny_i2v = !strcmp(preset, "tiny-i2v");
    const int ti2v = !strcmp(preset, "tiny-ti2v") || tiny_i2v;
    const int weights = !strcmp(preset, "tiny") || ti2v;
    const int rand_only = random && !weights; /* --random on a real-size preset: the transformer and latent_rgb only */
    if ((a14b && experts == 1) || (!a14b && !weights && experts == 2)) {
        return opts_exit_status(opts_fail(&cmd, stderr, "--experts %d: preset %s has %s (--experts 2 is for the tiny test "
                                                      "model)", experts, preset, a14b ? "two experts" : "one expert"));
    }
    const int two = a14b || experts == 2;
    if (force) remove_previous(out);
    int rc = core_mkdir_p(out); /* with its parents, as a run's folders (core/fs.h) */
    for (int e = 0; e < 1 + two && !rc; e++) {
        snprintf(path, sizeof path, "%s/%s", out, e ? "transformer_2" : "transformer");
        if (weights || rand_only) {
            wan_model m;
            rc = wan_model_init(&m, &cfg);
            if (!rc) {
                wan_params_init_random(&m, seed + (uint64_t)e);
                rc = wan_model_save(&m, path);
                wan_model_free(&m);
            }
        } else {
            rc = make_dir(path);
            char cpath[4200];
            snprintf(cpath, sizeof cpath, "%s/config.json", path);
            if (!rc) rc = wan_config_save(&cfg, cpath);
        }
    }
    if (!rc && (weights || rand_only)) {
        wan_latent_rgb map;
        snprintf(path, sizeof path, "%s/latent_rgb.safetensors", out);
        rc = wan_latent_rgb_default(&map, cfg.out_channels);
        if (!rc) rc = wan_latent_rgb_save(&map, path);
    }
    if (!rc && weights) {
        int vocab = 0;
        snprintf(path, sizeof path, "%s/tokenizer", out);
        if (!rc) rc = tok_tiny_write(path, &vocab);
        snprintf(path, sizeof path, "%s/text_encoder", out);
        if (!rc) rc = t5_tiny_write(path, cfg.text_dim, (vocab + 63) / 64 * 64, seed);
        snprintf(path, sizeof path, "%s/vae", out);
        if (!rc)
            rc = ti2v ? vae_tiny_write_with_encoder(path, cfg.out_channels, seed) : vae_tiny_write(path, cfg.out_channels, seed);
    }
    if (!rc) rc = write_model_index(out, preset, two);
    if (rc) {
        fprintf(stderr, "vgrpo init-model: %s\n", core_last_error());
        return 1;
    }
    wan_layout L;
    int64_t n = 0;
    if (!wan_layout_init(&L, &cfg)) n = L.numel, wan_layout_free(&L);
    printf("%s: preset %s, %d x %d heads, %d layers, %" PRId64 " parameters per transformer%s%s\n", out, preset,
           cfg.num_attention_heads, cfg.attention_head_dim, cfg.num_layers, n, two ? ", two experts" : "",
           weights ? "" : rand_only ? " (random weights for timing: no text encoder or VAE)" : " (configs only: no weights written)");
    return 0;
}
