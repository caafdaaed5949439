/* trainer/checkpoint/checkpoint.h — training checkpoints: save, validate and load, list, prune, find the latest
 * (docs/design.md section 7). A checkpoint is a folder `checkpoint-N` (N = GRPO steps completed) holding:
 *
 *   transformer/, transformer_2/   one per expert, diffusers layout (config.json + diffusion_pytorch_model.safetensors,
 *                                  F32), written by wan_model_save: WanTransformer3DModel.from_pretrained loads them,
 *                                  and so does wan_model_load
 *   ema/transformer[_2]/           (runs with algorithm.ema_decay > 0) the exponential moving average of the weights,
 *                                  same layout: `vgrpo eval --checkpoint checkpoint-N/ema` evaluates it
 *   old/transformer[_2]/           (algorithm.loss nft) the old policy, the soft-updated copy of the weights
 *                                  (trainer/step/nft.h), same layout (under LoRA its adapter, as ema/'s): `vgrpo eval
 *                                  --checkpoint checkpoint-N/old` evaluates it
 *   LoRA (model.lora, trainer/optim/lora.h): transformer/ (and transformer_2/) of each TRAINED expert hold its adapter
 *                                  instead, no base weights (the base is model.path's), in the two formats users load
 *                                  (wan_lora_save, model/dit/wan_lora.h): pytorch_lora_weights.safetensors (diffusers'
 *                                  load_lora_weights; transformer_2's with load_into_transformer_2=True) and
 *                                  adapter_model.safetensors + adapter_config.json (PeftModel.from_pretrained); the
 *                                  EMA of the adapters likewise under ema/; optimizer.safetensors then holds the
 *                                  adapters' moments, "E/exp_avg/blocks.0.attn1.to_q.lora_A.weight", ...; "experts"
 *                                  lists the trained experts only. `vgrpo eval/generate --checkpoint` put the adapters on
 *                                  the base (rollout/text_to_video.h: rollout_checkpoint_weights)
 *   optimizer.safetensors          AdamW state per expert E and parameter P (names as the state_dict's):
 *                                  "E/exp_avg/P" and "E/exp_avg_sq/P" (m and v, F32, the parameter's shape; torch's
 *                                  names) and "E/step" (I64, shape []: optimizer steps completed);
 *                                  __metadata__ {"format": "vgrpo-adamw"}. Weights are F32 already, so there are no
 *                                  separate master weights.
 *   trainer_state.json             {"format": "vgrpo-trainer-state", "version": 2,
 *                                   "step": N, "policy_version": V, "rollout_round": R,
 *                                   "data_epoch": E, "data_position": P, "data_size": D,
 *                                   "data_xxh64": "<16 hex digits>", "seed": S,
 *                                   "base_xxh64": "<16 hex digits>" (a run with a reference or LoRA only),
 *                                   "experts": ["transformer", ...],
 *                                   "config_hash": "<16 hex digits>", "config": "<canonical config text>",
 *                                   "guard": {...},
 *                                   "files": {"optimizer.safetensors": "<xxh64>", ...},
 *                                   "tensors": {"optimizer.safetensors": {"transformer/exp_avg/...": "<xxh64>", ...},
 *                                               ...},
 *                                   "state_xxh64": "<16 hex digits>"}
 *                                  step: GRPO steps completed; policy_version: optimizer steps completed; rollout_round:
 *                                  the next rollout round (the uid base of the next batch: every random stream is
 *                                  counter-based Philox, so this and the seed are the whole RNG state);
 *                                  data_*: the prompt sampler's epoch, prompts of that epoch already drawn, and the
 *                                  number of prompts, and their content hash (core_prompts_xxh64: texts, metadata,
 *                                  image files; optional on reading, as checkpoints before it lack it): a changed
 *                                  prompt file is refused on resume; config_hash: xxh64 (seed 0)
 *                                  of the config text (trainer_ckpt_config_text), which is kept so that a mismatch
 *                                  names the keys that differ; run_id (since 2026-12; optional on reading): the run
 *                                  that wrote it (trainer_run_id_make; a resumed run keeps it), which with seed and
 *                                  config_hash names the run (trainer_ckpt_run_line); guard (only in runs whose reward-hacking guard
 *                                  keeps state: trainer/run/guard.h) its state as an object (the step-0 video statistics,
 *                                  the best gold eval, the early stop's counter and sums): written as the guard gives
 *                                  it, read back as compact text; files, tensors, state_xxh64: the integrity
 *                                  record (trainer/checkpoint/checkpoint_sums.h): the xxh64 of every other file of the folder,
 *                                  of every tensor of its .safetensors files, and of this file's own fields.
 *
 * Integrity: a load verifies the record first (trainer_ckpt_verify): a missing file, a file whose bytes changed (a
 * flipped bit, a truncated copy: the error names the file and the tensors that differ), a state file whose fields
 * changed, and a non-finite value in any F32 tensor (weights, EMA, Adam moments: named with the tensor) are refused
 * before anything is read into the run.
 *
 * Atomicity: a checkpoint is written under `.checkpoint-N.tmp` in the same folder; every file and folder in it is
 * fsync'd, the folder is renamed to `checkpoint-N`, and the parent folder is fsync'd. A checkpoint is removed (the
 * rolling limit, a replaced checkpoint-N) by a rename first: to `.trash-checkpoint-N-XXXXXX` (or
 * `.checkpoint-N.old.tmp`), then deleted. A folder named checkpoint-N is therefore always complete, whenever the
 * process stops; the leftovers of a save or a removal cut short (`.checkpoint-*.tmp`, `.trash-checkpoint-*`) are never
 * read and are removed by the next save or resume (trainer_ckpt_clean). One process saves into a folder at a time.
 * The rolling limit removes the oldest complete checkpoints (by step) only after the new one is in place.
 *
 * best (the reward-hacking guard's best gold eval, trainer/run/guard.h): a symlink `best` -> `checkpoint-N` in the same
 * folder, replaced atomically (a new link `.best.tmp` renamed over it, the folder fsync'd), so `vgrpo eval
 * --checkpoint DIR/best` always opens a complete checkpoint. The rolling limit never removes best's target: one
 * older than the total_limit newest checkpoints is kept beside them (total_limit + 1 folders). */
#ifndef TRAINER_CHECKPOINT_H
#define TRAINER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "trainer/optim/optim.h"

#define TRAINER_CKPT_MAX_EXPERTS 2
#define TRAINER_CKPT_PATH_MAX 4096

/* One expert: its folder name ("transformer" or "transformer_2"), weights and optimizer state. The optimizer is over
 * the model's flat parameters: opt->n == model->layout.numel, m and v in the layout's order. ema (NULL: none) is the
 * moving average of the weights, same config: saved to / loaded from ema/<name>/ (a checkpoint without it is refused
 * when ema is given). */
typedef struct {
    const char *name;
    wan_model *model;
    optim_adamw *opt;
    wan_model *ema;
    wan_model *old; /* the old policy (algorithm.loss nft; NULL: none): old/<name>/, as ema is ema/<name>/ */
} trainer_ckpt_expert;

/* LoRA (trainer_ckpt_save_lora / trainer_ckpt_load_lora): per expert, its adapter, saved instead of the model (see
 * the top comment; the model then only names the base's config), the optimizer over the adapter's flat parameters
 * (opt->n == lora->layout.numel), and the EMA of the adapter (ema/<name>/, or NULL) instead of ema. */
typedef struct {
    wan_lora *lora;
    wan_lora *ema;
    wan_lora *old; /* the old policy's adapter (old/<name>/, or NULL) instead of trainer_ckpt_expert's old */
} trainer_ckpt_lora;

/* What trainer_state.json holds (see the top comment). config and guard: NUL-terminated text; borrowed by
 * trainer_ckpt_save, owned (malloc) after trainer_ckpt_read_state / trainer_ckpt_load (trainer_ckpt_state_free). */
typedef struct {
    int64_t step;
    int64_t policy_version;
    int64_t rollout_round;
    int64_t data_epoch, data_position, data_size;
    uint64_t data_xxh64; /* core_prompts_xxh64 of data.prompt_file's prompts */
    int has_data_xxh64;  /* written since 2026-12 (checkpoints before have no "data_xxh64") */
    uint64_t base_xxh64; /* wan_models_hash of model.path's transformer weights as the run started: what the KL or
                            DPO reference and a LoRA base are; a resume compares them */
    int has_base_xxh64;  /* written by runs with a reference or LoRA (others need model.path's weights no more) */
    int64_t seed;
    char run_id[64]; /* the run that wrote it (trainer_run_id_make); "" in checkpoints written before runs had one */
    int n_experts;
    char experts[TRAINER_CKPT_MAX_EXPERTS][32];
    uint64_t config_hash;
    char *config;
    char *guard; /* the reward-hacking guard's state (trainer/run/guard.h) as JSON object text, or NULL: none */
} trainer_ckpt_state;

void trainer_ckpt_state_free(trainer_ckpt_state *s);

/* One line naming the run a checkpoint belongs to (its run id, seed and recipe hash: the config_hash), e.g.
 * "runs/x/checkpoint-20: step 20 of run 20261207-011530-4242-3fa2 (seed 42, recipe 0123456789abcdef)"; a checkpoint
 * written before runs were recorded says "run not recorded". Into buf (cap bytes). */
void trainer_ckpt_run_line(const char *ckpt, const trainer_ckpt_state *st, char *buf, size_t cap);
/* For `vgrpo eval/generate --checkpoint PATH`: prints trainer_ckpt_run_line to out when PATH (or its parent, for
 * PATH = checkpoint-N/ema) holds a trainer_state.json; nothing when neither does (a transformer folder); a state
 * that does not read is named in a warning. */
void trainer_ckpt_print_run(const char *path, FILE *out);
/* A new run's id: "YYYYMMDD-HHMMSS-PID-XXXX" (local time, the process id, 4 hex digits of the clock's nanoseconds),
 * into buf (cap >= 40). Uses no random stream of the run. */
void trainer_run_id_make(char *buf, size_t cap);

/* ---- config hash ---- */

/* The canonical config text of a resolved config: core_config_dump(schema, obj) read back, every key of free_keys
 * (NULL-terminated dotted paths: keys that may change on resume) set to null, written as one line of YAML flow text.
 * Returns malloc'd text, or NULL with an error. */
char *trainer_ckpt_config_text(const core_cfg_entry *schema, const void *obj, const char *const *free_keys);
/* xxh64 (seed 0) of the text's bytes. */
uint64_t trainer_ckpt_config_hash(const char *text);
/* Writes into out (cap bytes) the dotted keys whose values differ between two config texts, with both values:
 * "optim.lr (checkpoint 0.0005, now 0.001), rollout.eta (...)". Returns the number of differing keys (0: the same
 * tree), or -1 when a text does not parse. */
int trainer_ckpt_config_diff(const char *ckpt_text, const char *now_text, char *out, size_t cap);
/* 1 when the texts differ only where the checkpoint predates a recipe key that is now at a value computing what the
 * older build computed (rollout.sde_type sde, rollout.sde_window.size 0, algorithm.loss grpo, ..., the list in
 * trainer/checkpoint/checkpoint_config.c), or where a key is null now (made free on resume since); 0 otherwise or when a text
 * does not parse. Resume accepts such a checkpoint although its config hash differs. */
int trainer_ckpt_config_predates(const char *ckpt_text, const char *now_text);
/* The recipe config_text against checkpoint ckpt's state st: 0 when its hash is the recorded one, or it differs only
 * by keys the checkpoint predates (trainer_ckpt_config_predates; logged at info); else -1 with "CKPT: the recipe
 * differs from the checkpoint's (config hash ... vs checkpoint ...): <the keys, trainer_ckpt_config_diff>". */
int trainer_ckpt_config_check(const char *ckpt, const trainer_ckpt_state *st, const char *config_text);

/* ---- save ---- */

/* Writes dir/checkpoint-<st->step> atomically (see the top comment): the experts' folders, optimizer.safetensors,
 * trainer_state.json (config_hash is computed here from st->config; st->n_experts/experts are taken from ex).
 * dir is created if missing; leftover `.checkpoint-*.tmp` folders in dir are removed first; an existing
 * checkpoint-N is replaced (after the new one is complete). Then, when total_limit > 0, the oldest complete
 * checkpoints beyond total_limit are removed (never the one just written). path (may be NULL) receives the
 * checkpoint's folder. Returns 0, or -1 naming the file or folder that failed (the temporary folder is removed). A
 * NaN or infinite value in the weights, EMA or Adam moments (which a load would refuse) is refused before anything
 * is written: "nothing written: DIR/checkpoint-N: tensor \"transformer/exp_avg_sq/...\" holds a non-finite value
 * (inf at element i of n): refused"; the earlier checkpoints are untouched. */
int trainer_ckpt_save(const char *dir, const trainer_ckpt_state *st, const trainer_ckpt_expert *ex, int n_ex,
                      int total_limit, char *path, size_t path_cap);
/* trainer_ckpt_save of LoRA experts: lx[e] (lx NULL: trainer_ckpt_save) names expert e's adapter and its EMA. */
int trainer_ckpt_save_lora(const char *dir, const trainer_ckpt_state *st, const trainer_ckpt_expert *ex,
                           const trainer_ckpt_lora *lx, int n_ex, int total_limit, char *path, size_t path_cap);

/* ---- find, list, prune ---- */

/* The steps of the complete checkpoints in dir (folders named checkpoint-<digits>), ascending, in *steps (malloc'd,
 * caller frees; NULL when none). Returns the count (0 when dir is missing or holds none), or -1 (unreadable dir,
 * out of memory). */
int trainer_ckpt_list(const char *dir, int64_t **steps);

/* Removes the oldest complete checkpoints of dir until at most keep remain (keep >= 1), never the one at step
 * `spare` (-1: none) nor the target of dir/best (kept beside the keep newest when older than them), each renamed
 * away first (see
 * the top comment), and every leftover (trainer_ckpt_clean). A renamed checkpoint that cannot be deleted is left for
 * the next clean-up with a warning. Returns the number removed, or -1 naming the folder. */
int trainer_ckpt_prune(const char *dir, int keep, int64_t spare);

/* dir/best -> checkpoint-<step> (which must be a complete checkpoint of dir), replacing any earlier link atomically
 * (see the top comment). -1 naming the path (a `best` that is not a symlink is refused, never removed). */
int trainer_ckpt_set_best(const char *dir, int64_t step);
/* The step dir/best points at: 1 with *step, 0 when there is no best link (or it names no checkpoint-N), -1 on an
 * unreadable link. */
int trainer_ckpt_get_best(const char *dir, int64_t *step);
/* Removes dir/best (a symlink; absent: fine). -1 naming it. */
int trainer_ckpt_clear_best(const char *dir);

/* Removes every complete checkpoint of dir (each renamed away first), its best link and the leftovers: what a fresh
 * run does to the checkpoints an earlier run left in its folder, so that `--resume FOLDER` never mixes two runs.
 * names (cap bytes; may be NULL) gets "checkpoint-3, checkpoint-4". Returns the number removed (0 when dir is
 * missing), or -1 naming the folder. */
int trainer_ckpt_remove_all(const char *dir, char *names, size_t cap);

/* Removes the leftovers of saves and removals cut short in dir: `.checkpoint-*.tmp` and `.trash-checkpoint-*`
 * folders, and a `.best.tmp` link. Returns the number removed (0 when dir is missing), or -1 naming the folder. */
int trainer_ckpt_clean(const char *dir);

/* Resolves `path` to one checkpoint folder into out: a folder named checkpoint-<digits> (or one holding
 * trainer_state.json) is itself (not verified here: trainer_ckpt_load does); any other folder means its latest
 * checkpoint that verifies (trainer_ckpt_verify; highest step first), each one skipped named in a warning with the
 * reason. -1 when path does not exist, holds no checkpoint-N folder, or none verifies (each named with its reason). */
int trainer_ckpt_resolve(const char *path, char *out, size_t cap);

/* For `vgrpo eval --checkpoint DIR`: resolves DIR (trainer_ckpt_resolve) and writes the transformer folder paths
 * into dirs[0] ("<ckpt>/transformer") and, for a two-expert checkpoint, dirs[1] ("<ckpt>/transformer_2").
 * Returns the number of experts (1 or 2), or -1 (no checkpoint, a missing transformer/config.json). */
int trainer_ckpt_transformer_dirs(const char *path, char dirs[TRAINER_CKPT_MAX_EXPERTS][TRAINER_CKPT_PATH_MAX]);

/* ---- load ---- */

/* Reads ckpt/trainer_state.json into st (validated: every field present with its type, version 2, step/policy/
 * round/data fields >= 0, config_hash equal to the hash of config, state_xxh64 equal to the hash of the fields). -1
 * naming the file and field. */
int trainer_ckpt_read_state(const char *ckpt, trainer_ckpt_state *st);

/* The checks of a checkpoint folder that do not depend on the run loading it: trainer_ckpt_read_state, a folder
 * named checkpoint-N holds step N, and the integrity record (see the top comment): every recorded file present
 * ("missing file F (incomplete checkpoint)"), its xxh64 as recorded ("F: damaged file: ...", with the tensors that
 * differ), every F32 tensor finite ("F: tensor \"T\" holds a non-finite value (nan at element i of n)"). Reads
 * every file once. st (may be NULL) receives the state (trainer_ckpt_state_free). -1 with the error. */
int trainer_ckpt_verify(const char *ckpt, trainer_ckpt_state *st);

/* trainer_ckpt_load's return when the checkpoint fails trainer_ckpt_verify (damaged or incomplete: nothing was
 * read into the experts), as opposed to -1 (it does not fit this run, or a read failed mid-way). */
#define TRAINER_CKPT_DAMAGED (-2)

/* Loads checkpoint folder ckpt into the experts ex[0..n_ex) (models initialised with their config; opt allocated
 * with n == layout.numel, whole or a ZeRO shard: trainer/dp/zero.h, which then reads only its range of the moments;
 * trainer_ckpt_save takes whole states only, the shards gathered first) and st. First trainer_ckpt_verify: on
 * failure TRAINER_CKPT_DAMAGED with its error, nothing overwritten. Then, each error (-1) naming the file (and
 * tensor / key):
 *   every file present (trainer_state.json, optimizer.safetensors, <expert>/config.json, the weights): "missing
 *   file"; the checkpoint's experts are exactly ex's names in order; when config_text is not NULL, the config hash
 *   equals trainer_ckpt_config_hash(config_text), else the error lists the differing keys (trainer_ckpt_config_diff)
 *   and both hashes; <expert>/config.json equals the model's config; every weight tensor by name and shape
 *   (wan_model_load_weights); optimizer.safetensors: every m and v tensor present, F32, with the parameter's shape,
 *   no extra tensor, E/step an I64 scalar >= 0. Truncated files are refused by the readers, naming the file.
 * The record, the state, the config, the file list and optimizer.safetensors are validated before anything is overwritten, each
 * expert's weights before they are read; a load that fails later (a second expert's bad tensor, an I/O error) may
 * leave the models and optimizers partly overwritten: the caller must not train on them. On success st owns its
 * config text; on failure st holds nothing to free. */
int trainer_ckpt_load(const char *ckpt, const char *config_text, trainer_ckpt_expert *ex, int n_ex,
                      trainer_ckpt_state *st);
/* trainer_ckpt_load into LoRA experts (lx as for trainer_ckpt_save_lora; NULL: trainer_ckpt_load): each adapter is
 * read with wan_lora_load_weights (its rank, alpha and targets must equal the run's: the file and key are named; a
 * recipe whose model.lora differs is refused first by the config hash, naming model.lora.*), no config.json is
 * needed, and a checkpoint of full weights is refused ("missing file transformer/pytorch_lora_weights.safetensors
 * (the checkpoint holds full weights ...)"). */
int trainer_ckpt_load_lora(const char *ckpt, const char *config_text, trainer_ckpt_expert *ex,
                           const trainer_ckpt_lora *lx, int n_ex, trainer_ckpt_state *st);

#endif
