/* trainer/checkpoint/checkpoint_sums.h — the integrity record of a checkpoint (trainer/checkpoint/checkpoint.h): what trainer_state.json
 * says about every other file of the folder, and its check on load. Not a public interface: trainer/checkpoint/checkpoint.c is
 * its one user.
 *
 * The record, written into trainer_state.json:
 *   "files":   {"<relative path>": "<xxh64 of the file's bytes, 16 hex digits>", ...}: every regular file of the
 *              checkpoint folder but trainer_state.json, paths sorted bytewise;
 *   "tensors": {"<relative path of a .safetensors file>": {"<tensor>": "<xxh64 of its bytes>", ...}, ...}: the
 *              per-tensor hashes (core/checksum.h: seed 0, the bytes as stored), in the file's header order, so a
 *              damaged file names the tensor that changed;
 *   "state_xxh64": xxh64 of trainer_state.json's own object without this field, written as compact JSON with sorted
 *              keys (jansson JSON_COMPACT | JSON_SORT_KEYS): a flipped digit of the step or the sampler position is
 *              caught too.
 * xxh64 is a checksum against damage (a flipped bit, a torn or truncated copy), not a signature. */
#ifndef TRAINER_CHECKPOINT_SUMS_H
#define TRAINER_CHECKPOINT_SUMS_H

#include <jansson.h>
#include <stdint.h>

/* The "files" and "tensors" objects of the checkpoint folder dir, written before its trainer_state.json (new
 * references). -1 naming the file that could not be read. */
int trainer_ckpt_sums_record(const char *dir, json_t **files, json_t **tensors);

/* xxh64 of o without its "state_xxh64" field, as compact JSON with sorted keys. -1 on out of memory. */
int trainer_ckpt_sums_state_hash(const json_t *o, uint64_t *h);

/* Checks the folder ckpt against the record (label: the state file's path, for messages): every recorded file
 * present ("missing file REL (incomplete checkpoint)"), its xxh64 equal to the record (else the error names the file
 * and, for a .safetensors file, the tensors that differ, are missing or were added, or its header), then every F32
 * tensor of every .safetensors file finite (else the error names the file, the tensor and the first bad element).
 * A recorded path must be relative without ".." (else the field is named). -1 with the error. */
int trainer_ckpt_sums_verify(const char *ckpt, const json_t *files, const json_t *tensors, const char *label);

#endif
