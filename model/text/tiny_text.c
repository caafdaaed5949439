/* model/text/tiny_text.c — the tiny preset's tokenizer.json and random umT5 encoder (see model/text/tiny_text.h, model/vae/tiny_vae.h). */
#include "model/text/tiny_text.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/safetensors.h"

#define META "\xe2\x96\x81" /* U+2581, SentencePiece's word boundary */

static int make_dir(const char *path) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return core_error("%s: cannot create folder: %s", path, strerror(errno));
    return 0;
}

static int dump(json_t *root, const char *path) {
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(root);
    return rc ? core_error("%s: cannot write", path) : 0;
}

static void add_piece(json_t *vocab, const char *piece, double score) {
    json_t *p = json_array();
    json_array_append_new(p, json_string(piece));
    json_array_append_new(p, json_real(score));
    json_array_append_new(vocab, p);
}

static json_t *metaspace(void) {
    return json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", META, "prepend_scheme", "always",
                     "split", 1);
}

/* Scores are log-probabilities: a whole word (-3) beats "▁" + letters; "▁x" (-6) beats "▁" (-5) + "x" (-7). */
int tok_tiny_write(const char *dir, int *vocab_size) {
    static const char *const words[] = {"the", "an", "of", "and", "in", "on", "with", "at", "to", "is",
                                        "red", "green", "blue", "yellow", "white", "black", "orange", "purple",
                                        "cat", "dog", "bird", "car", "tree", "sky", "sea", "sun", "city", "night",
                                        "man", "woman", "running", "walking", "flying", "video", "light", "water"};
    static const char *const specials[] = {"<pad>", "</s>", "<unk>"};
    if (make_dir(dir)) return -1;
    json_t *vocab = json_array(), *added = json_array();
    int n = 0;
    for (int i = 0; i < 3; i++, n++) {
        add_piece(vocab, specials[i], 0.0);
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", specials[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    }
    add_piece(vocab, META, -5.0), n++;
    char piece[64];
    for (int c = 'a'; c <= 'z'; c++, n++) {
        snprintf(piece, sizeof piece, META "%c", c);
        add_piece(vocab, piece, -6.0);
    }
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++, n++) {
        snprintf(piece, sizeof piece, META "%s", words[i]);
        add_piece(vocab, piece, -3.0 - 0.01 * (double)i);
    }
    /* every printable ASCII character except the space (replaced by "▁"), lower case first (more likely) */
    for (int c = 'a'; c <= 'z'; c++, n++) add_piece(vocab, (char[2]){(char)c, 0}, -7.0);
    for (int c = 33; c < 127; c++)
        if (c < 'a' || c > 'z') add_piece(vocab, (char[2]){(char)c, 0}, -9.0), n++;
    json_t *model =
        json_pack("{s:s, s:i, s:o, s:b}", "type", "Unigram", "unk_id", 2, "vocab", vocab, "byte_fallback", 0);
    json_t *norm = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}]}", "type", "Sequence", "normalizers", "type", "Replace",
                             "pattern", "Regex", " {2,}", "content", " ");
    json_t *post = json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, "
                             "{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                             "type", "TemplateProcessing",
                             "single", "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", "</s>", "type_id", 0,
                             "pair", "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", "</s>", "type_id", 0,
                             "Sequence", "id", "B", "type_id", 0, "SpecialToken", "id", "</s>", "type_id", 0,
                             "special_tokens", "</s>", "id", "</s>", "ids", 1, "tokens", "</s>");
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation",
                             "padding", "added_tokens", added, "normalizer", norm, "pre_tokenizer", metaspace(),
                             "post_processor", post, "decoder", metaspace(), "model", model);
    if (!root) return core_error("tokenizer.json: cannot build the JSON (out of memory)");
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (dump(root, path)) return -1;
    json_t *tc = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:[], s:b}", "tokenizer_class", "T5TokenizerFast",
                           "eos_token", "</s>", "unk_token", "<unk>", "pad_token", "<pad>", "model_max_length", 512,
                           "extra_ids", 0, "additional_special_tokens", "clean_up_tokenization_spaces", 1);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!tc || dump(tc, path)) return tc ? -1 : core_error("%s: cannot build the JSON", path);
    if (vocab_size) *vocab_size = n;
    return 0;
}

/* ---- umT5 encoder ---- */

typedef struct {
    st_writer *w;
    float *buf; /* every tensor's values, one after another: st_writer_add borrows the data until the write */
    int64_t off, cap;
    uint64_t seed;
    uint32_t slot;
} init_ctx;

/* Adds tensor `name` [rows, cols] (cols 0: a vector of rows) = std * N(0, 1), or all ones when std == 0. */
static int add(init_ctx *c, const char *name, int64_t rows, int64_t cols, double std) {
    int64_t n = rows * (cols ? cols : 1), shape[2] = {rows, cols};
    if (c->off + n > c->cap) return core_error("tiny text encoder: %s does not fit the init buffer", name);
    float *x = c->buf + c->off;
    c->off += n;
    if (std > 0) {
        core_philox_normal(x, n, c->seed, TINY_SLOT_TEXT + c->slot, 0, CORE_STREAM_MODEL_INIT);
        for (int64_t i = 0; i < n; i++) x[i] *= (float)std;
    } else {
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
    }
    c->slot++;
    return st_writer_add(c->w, name, CORE_F32, cols ? 2 : 1, shape, x);
}

int t5_tiny_write(const char *dir, int d_model, int vocab_size, uint64_t seed) {
    const int D = d_model, dkv = 16, H = D / 16, F = 2 * D, layers = 2, buckets = 32;
    if (D < 16 || D % 16) return core_error("tiny text encoder: d_model %d is not a positive multiple of 16", D);
    if (vocab_size < 4) return core_error("tiny text encoder: vocab_size %d too small", vocab_size);
    if (make_dir(dir)) return -1;
    char path[4200];
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:b, s:f, s:f, s:f, "
                            "s:b, s:b, s:b, s:i, s:i, s:i, s:s, s:s, s:b}",
                            "architectures", "UMT5EncoderModel", "model_type", "umt5", "vocab_size", vocab_size,
                            "d_model", D, "d_kv", dkv, "d_ff", F, "num_layers", layers, "num_decoder_layers", layers,
                            "num_heads", H, "relative_attention_num_buckets", buckets,
                            "feed_forward_proj", "gated-gelu", "dense_act_fn", "gelu_new", "is_gated_act", 1,
                            "layer_norm_epsilon", 1e-6, "dropout_rate", 0.0, "initializer_factor", 1.0,
                            "is_encoder_decoder", 1, "scalable_attention", 1, "tie_word_embeddings", 0,
                            "pad_token_id", 0, "eos_token_id", 1, "decoder_start_token_id", 0,
                            "tokenizer_class", "T5Tokenizer", "torch_dtype", "float32", "use_cache", 1);
    if (!cfg) return core_error("%s: cannot build config.json", dir);
    json_object_set_new(cfg, "relative_attention_max_distance", json_integer(128));
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (dump(cfg, path)) return -1;
    const int64_t I = (int64_t)H * dkv;
    const int64_t total = (int64_t)vocab_size * D + layers * (4 * I * D + buckets * H + 2 * D + 3 * (int64_t)F * D) + D;
    init_ctx c = {st_writer_new(), malloc(sizeof(float) * (size_t)total), 0, total, seed, 0};
    int rc = -1;
    if (!c.w || !c.buf) {
        core_error("tiny text encoder: out of memory");
        goto done;
    }
    if (add(&c, "shared.weight", vocab_size, D, 1.0)) goto done;
    char name[128];
#define ADD(suffix, r, k, std)                                                        \
    do {                                                                              \
        snprintf(name, sizeof name, "encoder.block.%d.layer.%s", l, suffix);          \
        if (add(&c, name, r, k, std)) goto done;                                      \
    } while (0)
    for (int l = 0; l < layers; l++) {
        const int I = H * dkv;
        ADD("0.SelfAttention.q.weight", I, D, 1.0 / sqrt((double)D * dkv));
        ADD("0.SelfAttention.k.weight", I, D, 1.0 / sqrt((double)D));
        ADD("0.SelfAttention.v.weight", I, D, 1.0 / sqrt((double)D));
        ADD("0.SelfAttention.o.weight", D, I, 1.0 / sqrt((double)I));
        ADD("0.SelfAttention.relative_attention_bias.weight", buckets, H, 1.0 / sqrt((double)D));
        ADD("0.layer_norm.weight", D, 0, 0.0);
        ADD("1.DenseReluDense.wi_0.weight", F, D, 1.0 / sqrt((double)D));
        ADD("1.DenseReluDense.wi_1.weight", F, D, 1.0 / sqrt((double)D));
        ADD("1.DenseReluDense.wo.weight", D, F, 1.0 / sqrt((double)F));
        ADD("1.layer_norm.weight", D, 0, 0.0);
    }
#undef ADD
    if (add(&c, "encoder.final_layer_norm.weight", D, 0, 0.0)) goto done;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_writer_set_metadata(c.w, "format", "pt") || st_writer_write(c.w, path)) goto done;
    rc = 0;
done:
    st_writer_free(c.w);
    free(c.buf);
    return rc;
}
