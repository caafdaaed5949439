/* cli/clip_init_tokenizer.c — `vgrpo init-clip`'s tokenizer.json and tokenizer_config.json: CLIP's pipeline over
 * a byte-level vocabulary without merges (cli/cmd_init_clip.c describes it). */
#include <stdio.h>
#include <string.h>

#include "cli/clip_init.h"
#include "core/error.h"

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

int clip_init_write_tokenizer(const char *dir) {
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
    json_array_append_new(added, special(CLIP_INIT_VOCAB - 2, "<|startoftext|>"));
    json_array_append_new(added, special(CLIP_INIT_VOCAB - 1, "<|endoftext|>"));
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
    json_object_set_new(vocab, "<|startoftext|>", json_integer(CLIP_INIT_VOCAB - 2));
    json_object_set_new(vocab, "<|endoftext|>", json_integer(CLIP_INIT_VOCAB - 1));
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
    if (clip_init_dump(t, dir, "tokenizer.json")) return -1;
    json_t *tc = json_object();
    json_object_set_new(tc, "tokenizer_class", json_string("CLIPTokenizer"));
    json_object_set_new(tc, "pad_token", json_string("<|endoftext|>"));
    json_object_set_new(tc, "bos_token", json_string("<|startoftext|>"));
    json_object_set_new(tc, "eos_token", json_string("<|endoftext|>"));
    json_object_set_new(tc, "unk_token", json_string("<|endoftext|>"));
    json_object_set_new(tc, "model_max_length", json_integer(77));
    return clip_init_dump(tc, dir, "tokenizer_config.json");
}

