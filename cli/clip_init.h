/* cli/clip_init.h — the files of `vgrpo init-clip` (cli/cmd_init_clip.c describes them): a tiny random CLIP in
 * transformers' CLIPModel folder layout. */
#ifndef CLI_CLIP_INIT_H
#define CLI_CLIP_INIT_H

#include <jansson.h>
#include <stdint.h>

/* The tiny preset's sizes. */
enum { CLIP_INIT_WIDTH = 32, CLIP_INIT_LAYERS = 2, CLIP_INIT_HEADS = 2, CLIP_INIT_MLP = 64, CLIP_INIT_PROJ = 16,
       CLIP_INIT_VOCAB = 514, CLIP_INIT_POSITIONS = 77, CLIP_INIT_PATCH = 8 };

/* config.json, preprocessor_config.json and model.safetensors (Philox with `seed`) for image size `image`, into
 * the existing folder dir. 0, or -1 with core_error naming the file. */
int clip_init_write_model(const char *dir, uint64_t seed, int image);
/* tokenizer.json and tokenizer_config.json (the byte-level vocabulary). 0 or -1. */
int clip_init_write_tokenizer(const char *dir);
/* Writes `root` (stolen) to dir/name, indented. 0 or -1 naming the file. */
int clip_init_dump(json_t *root, const char *dir, const char *name);

#endif
