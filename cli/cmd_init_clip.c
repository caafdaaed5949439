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
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/safetensors.h"

enum { WIDTH = 32, LAYERS = 2, HEADS = 2, MLP = 64, PROJ = 16, VOCAB = 514, POSITIONS = 77, PATCH = 8 };
#define PHILOX_STREAM_CLIP 11u /* Philox stream of init-clip's weights (a stream no run uses) */

typedef struct {
    st_writer *w;
    float *bufs[512];
    int n;
    uint64_t seed;
} wr;

/* Adds tensor `name` of the shape, filled with offset + scale x normal (slot = the tensor's index). */
static int add(wr *W, const char *name, int ndim, const int64_t *shape, double offset, double scale) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!x || W->n == 512) return free(x), core_error("init-clip: out of memory");
    core_philox_normal(x, n, W->seed, (uint32_t)W->n, 0, PHILOX_STREAM_CLIP);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(offset + scale * x[i]);
    W->bufs[W->n++] = x;
    return st_writer_add(W->w, name, CORE_F32, ndim, shape, x);
}

static int add_linear(wr *W, const char *prefix, int out, int in, int bias) {
    char name[256];
    const int64_t ws[2] = {out, in}, bs[1] = {out};
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (add(W, name, 2, ws, 0.0, 1.0 / sqrt((double)in))) return -1;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return bias ? add(W, name, 1, bs, 0.0, 0.02) : 0;
}

static int add_ln(wr *W, const char *prefix) {
    char name[256];
    const int64_t s[1] = {WIDTH};
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (add(W, name, 1, s, 1.0, 0.1)) return -1;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return add(W, name, 1, s, 0.0, 0.05);
}

static int add_encoder(wr *W, const char *tower) {
    static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    char p[256];
    for (int l = 0; l < LAYERS; l++) {
        snprintf(p, sizeof p, "%s.encoder.layers.%d.layer_norm1", tower, l);
        if (add_ln(W, p)) return -1;
        for (int k = 0; k < 4; k++) {
            snprintf(p, sizeof p, "%s.encoder.layers.%d.self_attn.%s", tower, l, proj[k]);
            if (add_linear(W, p, WIDTH, WIDTH, 1)) return -1;
        }
        snprintf(p, sizeof p, "%s.encoder.layers.%d.layer_norm2", tower, l);
        if (add_ln(W, p)) return -1;
        snprintf(p, sizeof p, "%s.encoder.layers.%d.mlp.fc1", tower, l);
        if (add_linear(W, p, MLP, WIDTH, 1)) return -1;
        snprintf(p, sizeof p, "%s.encoder.layers.%d.mlp.fc2", tower, l);
        if (add_linear(W, p, WIDTH, MLP, 1)) return -1;
    }
    return 0;
}

static int write_weights(const char *dir, uint64_t seed, int image) {
    wr W = {.w = st_writer_new(), .seed = seed};
    if (!W.w) return -1;
    const int grid = image / PATCH;
    const int64_t tok[2] = {VOCAB, WIDTH}, tpos[2] = {POSITIONS, WIDTH}, cls[1] = {WIDTH},
                  patch[4] = {WIDTH, 3, PATCH, PATCH}, vpos[2] = {(int64_t)grid * grid + 1, WIDTH}, scalar[1] = {1};
    int rc = add(&W, "text_model.embeddings.token_embedding.weight", 2, tok, 0.0, 1.0) ||
             add(&W, "text_model.embeddings.position_embedding.weight", 2, tpos, 0.0, 0.5) ||
             add_encoder(&W, "text_model") || add_ln(&W, "text_model.final_layer_norm") ||
             add(&W, "vision_model.embeddings.class_embedding", 1, cls, 0.0, 0.5) ||
             add(&W, "vision_model.embeddings.patch_embedding.weight", 4, patch, 0.0, 1.0 / sqrt(3.0 * PATCH * PATCH)) ||
             add(&W, "vision_model.embeddings.position_embedding.weight", 2, vpos, 0.0, 0.5) ||
             add_ln(&W, "vision_model.pre_layrnorm") || add_encoder(&W, "vision_model") ||
             add_ln(&W, "vision_model.post_layernorm") ||
             add_linear(&W, "visual_projection", PROJ, WIDTH, 0) || add_linear(&W, "text_projection", PROJ, WIDTH, 0);
    /* logit_scale: a 0-dim tensor, ln(1 / 0.07) (CLIP's initial temperature) */
    float *ls = malloc(sizeof(float));
    if (!rc && ls) {
        *ls = (float)log(1.0 / 0.07);
        W.bufs[W.n++] = ls;
        rc = st_writer_add(W.w, "logit_scale", CORE_F32, 0, scalar, ls);
    } else {
        free(ls);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!rc) rc = st_writer_set_metadata(W.w, "format", "pt") || st_writer_write(W.w, path);
    st_writer_free(W.w);
    for (int i = 0; i < W.n; i++) free(W.bufs[i]);
    return rc ? -1 : 0;
}

/* Writes `root` (stolen) to dir/name, indented. */
static int dump(json_t *root, const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const int rc = !root || json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0;
    json_decref(root);
    return rc ? core_error("%s: cannot write", path) : 0;
}

static json_t *tower_json(const char *type, int vision, int image) {
    json_t *t = json_object();
    json_object_set_new(t, "model_type", json_string(type));
    json_object_set_new(t, "hidden_size", json_integer(WIDTH));
    json_object_set_new(t, "intermediate_size", json_integer(MLP));
    json_object_set_new(t, "num_hidden_layers", json_integer(LAYERS));
    json_object_set_new(t, "num_attention_heads", json_integer(HEADS));
    json_object_set_new(t, "hidden_act", json_string("quick_gelu"));
    json_object_set_new(t, "layer_norm_eps", json_real(1e-5));
    json_object_set_new(t, "projection_dim", json_integer(PROJ));
    if (vision) {
        json_object_set_new(t, "image_size", json_integer(image));
        json_object_set_new(t, "patch_size", json_integer(PATCH));
        json_object_set_new(t, "num_channels", json_integer(3));
    } else {
        json_object_set_new(t, "vocab_size", json_integer(VOCAB));
        json_object_set_new(t, "max_position_embeddings", json_integer(POSITIONS));
        json_object_set_new(t, "bos_token_id", json_integer(VOCAB - 2));
        json_object_set_new(t, "eos_token_id", json_integer(VOCAB - 1));
        json_object_set_new(t, "pad_token_id", json_integer(VOCAB - 1));
    }
    return t;
}

static int write_config(const char *dir, int image) {
    json_t *c = json_object(), *arch = json_array();
    json_array_append_new(arch, json_string("CLIPModel"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("clip"));
    json_object_set_new(c, "projection_dim", json_integer(PROJ));
    json_object_set_new(c, "logit_scale_init_value", json_real(2.6592));
    json_object_set_new(c, "text_config", tower_json("clip_text_model", 0, image));
    json_object_set_new(c, "vision_config", tower_json("clip_vision_model", 1, image));
    return dump(c, dir, "config.json");
}

static int write_preprocessor(const char *dir, int image) {
    static const double mean[3] = {0.48145466, 0.4578275, 0.40821073}, std[3] = {0.26862954, 0.26130258, 0.27577711};
    json_t *p = json_object(), *size = json_object(), *crop = json_object(), *m = json_array(), *s = json_array();
    json_object_set_new(p, "image_processor_type", json_string("CLIPImageProcessor"));
    json_object_set_new(p, "do_resize", json_true());
    json_object_set_new(size, "shortest_edge", json_integer(image));
    json_object_set_new(p, "size", size);
    json_object_set_new(p, "resample", json_integer(3));
    json_object_set_new(p, "do_center_crop", json_true());
    json_object_set_new(crop, "height", json_integer(image));
    json_object_set_new(crop, "width", json_integer(image));
    json_object_set_new(p, "crop_size", crop);
    json_object_set_new(p, "do_rescale", json_true());
    json_object_set_new(p, "rescale_factor", json_real(1.0 / 255.0));
    json_object_set_new(p, "do_normalize", json_true());
    for (int i = 0; i < 3; i++) json_array_append_new(m, json_real(mean[i])), json_array_append_new(s, json_real(std[i]));
    json_object_set_new(p, "image_mean", m);
    json_object_set_new(p, "image_std", s);
    json_object_set_new(p, "do_convert_rgb", json_true());
    return dump(p, dir, "preprocessor_config.json");
}

/* GPT-2's byte-to-unicode map in its order: the printable bytes keep their code point, the others get 256 + n. */
static void byte_symbols(int order[256], int cp[256]) {
    int k = 0, extra = 0;
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) order[k++] = b, cp[b] = b;
    for (int b = 0; b < 256; b++)
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)))
            order[k++] = b, cp[b] = 256 + extra++;
}

static void utf8(int c, char *out) {
    if (c < 0x80) out[0] = (char)c, out[1] = 0;
    else out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
}

static json_t *special(int id, const char *content) {
    json_t *t = json_object();
    json_object_set_new(t, "id", json_integer(id));
    json_object_set_new(t, "content", json_string(content));
    json_object_set_new(t, "single_word", json_false());
    json_object_set_new(t, "lstrip", json_false());
    json_object_set_new(t, "rstrip", json_false());
    json_object_set_new(t, "normalized", json_false());
    json_object_set_new(t, "special", json_true());
    return t;
}

static int write_tokenizer(const char *dir) {
    /* CLIP's tokenizer.json pipeline (as openai/clip-vit-base-patch32's), with a byte-level vocabulary */
    static const char *const pipeline =
        "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Replace\", "
        "\"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \" \"}, {\"type\": \"Lowercase\"}]},"
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"<\\\\|startoftext\\\\|>|<\\\\|endoftext\\\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\\\p{L}]+|[\\\\p{N}]|"
        "[^\\\\s\\\\p{L}\\\\p{N}]+\"}, \"behavior\": \"Removed\", \"invert\": true}, {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}]},"
        "\"post_processor\": {\"type\": \"RobertaProcessing\", \"sep\": [\"<|endoftext|>\", 513], \"cls\": "
        "[\"<|startoftext|>\", 512], \"trim_offsets\": false, \"add_prefix_space\": false},"
        "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}}";
    json_error_t err;
    json_t *pipe = json_loads(pipeline, 0, &err);
    if (!pipe) return core_error("init-clip: tokenizer template: %s", err.text);
    json_t *t = json_object(), *added = json_array(), *model = json_object(), *vocab = json_object();
    json_object_set_new(t, "version", json_string("1.0"));
    json_object_set_new(t, "truncation", json_null());
    json_object_set_new(t, "padding", json_null());
    json_array_append_new(added, special(VOCAB - 2, "<|startoftext|>"));
    json_array_append_new(added, special(VOCAB - 1, "<|endoftext|>"));
    json_object_set_new(t, "added_tokens", added);
    json_object_set(t, "normalizer", json_object_get(pipe, "normalizer"));
    json_object_set(t, "pre_tokenizer", json_object_get(pipe, "pre_tokenizer"));
    json_object_set(t, "post_processor", json_object_get(pipe, "post_processor"));
    json_object_set(t, "decoder", json_object_get(pipe, "decoder"));
    json_decref(pipe);
    int order[256], cp[256];
    byte_symbols(order, cp);
    char sym[16], word[24];
    for (int i = 0; i < 256; i++) {
        utf8(cp[order[i]], sym);
        json_object_set_new(vocab, sym, json_integer(i));
    }
    for (int i = 0; i < 256; i++) {
        utf8(cp[order[i]], sym);
        snprintf(word, sizeof word, "%s</w>", sym);
        json_object_set_new(vocab, word, json_integer(256 + i));
    }
    json_object_set_new(vocab, "<|startoftext|>", json_integer(VOCAB - 2));
    json_object_set_new(vocab, "<|endoftext|>", json_integer(VOCAB - 1));
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token", json_string("<|endoftext|>"));
    json_object_set_new(model, "continuing_subword_prefix", json_string(""));
    json_object_set_new(model, "end_of_word_suffix", json_string("</w>"));
    json_object_set_new(model, "fuse_unk", json_false());
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "ignore_merges", json_false());
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(t, "model", model);
    if (dump(t, dir, "tokenizer.json")) return -1;
    json_t *tc = json_object();
    json_object_set_new(tc, "tokenizer_class", json_string("CLIPTokenizer"));
    json_object_set_new(tc, "pad_token", json_string("<|endoftext|>"));
    json_object_set_new(tc, "bos_token", json_string("<|startoftext|>"));
    json_object_set_new(tc, "eos_token", json_string("<|endoftext|>"));
    json_object_set_new(tc, "unk_token", json_string("<|endoftext|>"));
    json_object_set_new(tc, "model_max_length", json_integer(77));
    return dump(tc, dir, "tokenizer_config.json");
}

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
        {.name = "image-size", .type = OPTS_INT, .i = &image, .min = PATCH, .max = 1024, .meta = "N",
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
    if (write_config(out, image) || write_preprocessor(out, image) || write_tokenizer(out) ||
        write_weights(out, seed, image)) {
        fprintf(stderr, "init-clip: %s\n", core_last_error());
        return 1;
    }
    printf("init-clip: wrote the tiny random CLIP (seed %llu, image %d) to %s\n", (unsigned long long)seed, image, out);
    return 0;
}
