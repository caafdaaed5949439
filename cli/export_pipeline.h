/* cli/export_pipeline.h — `vgrpo export --merge --pipeline-out DIR`: a whole WanPipeline folder, the base pipeline's
 * components (model_index.json, text_encoder/, tokenizer/, vae/, scheduler/, ...) copied beside the merged
 * transformer(s), so that `vgrpo generate --pipeline DIR` and diffusers' WanPipeline.from_pretrained(DIR) load it. */
#ifndef CLI_EXPORT_PIPELINE_H
#define CLI_EXPORT_PIPELINE_H

#include <stddef.h>

/* Copies every entry of the pipeline folder `base` except transformer/ and transformer_2/ (the caller writes those)
 * into `dst`, a new folder (created; its parent must exist). Files are copied byte for byte (a symbolic link is
 * copied as what it points to). -1 naming the file or folder that failed (base without model_index.json: "not a
 * pipeline folder"). */
int export_pipeline_copy(const char *base, const char *dst);

/* A temporary name beside dir for the pipeline being written: "<dir>.partial". */
void export_pipeline_partial(const char *dir, char *out, size_t cap);

/* Removes a folder tree written by export_pipeline_copy (a failed export). Best effort. */
void export_pipeline_remove(const char *dir);

#endif
