/* reward/learned.h — the model-backed scorers (CLIPScore, PickScore, HPSv2, LAION aesthetic): a CLIP (model/clip/)
 * loaded once from a folder, scoring the frames of a video against its prompt.
 *
 * They sit in the scorer registry (reward/scorers.h) beside the pure scorers, with fn NULL and `learned` set; a
 * reward_weighted entry carries the loaded model (reward_weighted.model) and reward_score_weighted calls
 * reward_model_score for it. A model is loaded once per process: in local mode by the in-process source
 * (rollout/source_local.c), else by the reward server (`vgrpo reward-server --models`, or the MPI launch's
 * reward rank). Calls on one model are serialised by its mutex (the CLIP forward itself runs on OpenMP threads), so
 * any number of the server's scoring threads may call it; the result does not depend on which thread scores. The
 * frames of a video go through the image tower in one batch; the reward server also batches a request's videos
 * (reward_model_score_batch), with results equal bit for bit to scoring them one by one. The same scorers in
 * Python (transformers, open_clip) for a GPU: reward/examples/clip_server.py, whose values are the fixtures'.
 *
 * Per scored frame (all four: float32 as their references compute, image and text embeddings not normalised until
 * the formula):
 *   clip_score  exp(logit_scale) cos(image, text) / 30: flow_grpo flow_grpo/clip_scorer.py ClipScorer.__call__
 *               (outputs.logits_per_image.diagonal() / 30, CLIPModel openai/clip-vit-large-patch14). The folder is a
 *               transformers CLIPModel folder; frames are preprocessed as its CLIPImageProcessor does (CLIP_IMAGE_HF).
 *               flow_grpo itself resizes float [0, 1] images with torchvision's bilinear T.Resize: where the frame
 *               is not already the model's size, its values differ from ours by that resampler.
 *   pickscore   exp(logit_scale) cos(image, text) / 26: PickScore's README (yuvalkirstain/PickScore: scores =
 *               model.logit_scale.exp() * (text_embs @ image_embs.T) on normalised embeddings) and flow_grpo
 *               flow_grpo/pickscore_scorer.py PickScoreScorer.__call__ (the same, then scores / 26 "norm to 0-1").
 *               Folder: yuvalkirstain/PickScore_v1 (a transformers CLIPModel, ViT-H/14) with tokenizer.json and the
 *               preprocessor_config.json of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (the processor flow_grpo loads).
 *   hpsv2       cos(image, text): HPSv2 hpsv2/img_score.py score() (model(image, text) gives L2-normalised
 *               image_features and text_features; hps_score = diagonal(image_features @ text_features.T)); flow_grpo
 *               flow_grpo/hpsv2_scorer.py HPSv2RewardInferencer.reward the same. Folder: an open_clip ViT-H-14
 *               checkpoint (open_clip_config.json + open_clip_model.safetensors, HPS_v2.1_compressed.pt's
 *               state_dict converted) and tokenizer.json (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's); frames
 *               preprocessed as HPSv2's preprocess_val (CLIP_IMAGE_HPSV2: longer side to the model's image size,
 *               zero padding to a square; OpenAI mean and std, open_clip's for ViT-H-14). The ids come from the
 *               tokenizer.json reader (transformers' CLIP tokenizer), not open_clip's SimpleTokenizer: for ASCII
 *               prompts without HTML entities they are equal (model/clip/clip_tokenizer.h lists the differences).
 *   aesthetic   MLP(image / |image|): improved-aesthetic-predictor simple_inference.py (normalized() of the CLIP
 *               ViT-L/14 image embedding, then the MLP; flow_grpo flow_grpo/aesthetic_scorer.py the same). Folder:
 *               openai/clip-vit-large-patch14 (config.json, model.safetensors, preprocessor_config.json; no
 *               tokenizer: the prompt is not used) plus aesthetic_mlp.safetensors (sac+logos+ava1-l14-linearMSE.pth
 *               converted, model/clip/clip_aesthetic.h). Scores near 1 .. 10 for real images.
 * Text: tokenizer.json ids padded and truncated to min(77, the model's positions) (CLIP_TOK_CONTEXT; truncation as
 * transformers' truncation=True: the end-of-text token stays last). The video's reward is the mean in double of
 * the scored frames' float scores, in frame order.
 *
 * Frames scored (reward.frames / --frames): "first" (frame 0), "all" (every frame), or an integer K >= 1: K frames
 * at indices floor(j (F - 1) / (K - 1)) for j = 0 .. K-1 in exact integers (K = 1: frame 0), F the video's frames:
 * the first and the last frame and K - 2 evenly spaced between them. K > F is an error. */
#ifndef REWARD_LEARNED_H
#define REWARD_LEARNED_H

#include <stddef.h>
#include <stdint.h>

#include "core/recipe.h"
#include "model/clip/clip_model.h"
#include "reward/scorers.h"

typedef enum { REWARD_FRAMES_ALL = 0, REWARD_FRAMES_FIRST, REWARD_FRAMES_EVEN } reward_frames_mode;

typedef struct {
    reward_frames_mode mode;
    int k; /* REWARD_FRAMES_EVEN: frames scored, >= 1 */
} reward_frames;

/* Parses "first", "all" or a decimal K >= 1 (NULL or "": all). 0, or -1 with core_error quoting the value. */
int reward_frames_parse(const char *spec, reward_frames *f);
/* The number of frames scored of a video of F >= 1 frames, or -1 with core_error when K > F. */
int reward_frames_count(const reward_frames *f, int64_t F);
/* idx[0 .. reward_frames_count) = the frame indices scored (ascending), rule at the top. */
void reward_frames_pick(const reward_frames *f, int64_t F, int64_t *idx);

/* The registry's name of a learned scorer's kind. */
typedef enum { REWARD_CLIP_SCORE = 0, REWARD_PICKSCORE, REWARD_HPSV2, REWARD_AESTHETIC, REWARD_N_LEARNED } reward_learned_kind;

/* The kind of scorer `name`, or -1 when it is not a learned scorer. */
int reward_learned_kind_of(const char *name);

/* The file of a folder's aesthetic MLP. */
#define REWARD_AESTHETIC_MLP_FILE "aesthetic_mlp.safetensors"

/* Checks folder `dir` for scorer `name` without reading weights: the files its kind needs are present (config.json
 * or open_clip_config.json and a *.safetensors, tokenizer.json, preprocessor_config.json, aesthetic_mlp.safetensors
 * as above), the configs parse (clip_config_load_*, clip_image_config_load) and agree (the processor's crop is the
 * model's image size). `key` (e.g. "reward.models.pickscore") starts every message. On success *cfg (may be NULL)
 * gets the model's config. 0, or -1 with core_error. */
int reward_model_check(const char *name, const char *dir, const char *key, clip_config *cfg);

/* Loads scorer `name`'s model from `dir` (reward_model_check's files, then the weights: clip_load, clip_tok_load,
 * clip_aesthetic_load, with their errors), scoring `frames`. NULL with core_error starting with `key`. */
reward_model *reward_model_load(const char *name, const char *dir, const reward_frames *frames, const char *key);
void reward_model_free(reward_model *m);

/* Scores one video (rules at the top): *out = the mean over the scored frames. Thread-safe (serialised per model).
 * Errors (-1, core_error naming the scorer): bad video, more frames asked than the video has, the tokenizer's or
 * the forward's error. */
int reward_model_score(reward_model *m, const reward_video *video, const char *prompt, double *out);

/* Frames one image forward of reward_model_score_batch takes at most (whole videos; a video with more scored
 * frames goes alone). */
#define REWARD_MODEL_BATCH_FRAMES 32

/* Scores nv >= 1 videos of one shape (a score_request's) with their prompts: out[v] as reward_model_score gives it,
 * bit for bit, with the frames of several videos in one image forward (blocks of whole videos of at most
 * REWARD_MODEL_BATCH_FRAMES frames). The reward server calls it (reward_weighted.model_batch_fn). Thread-safe.
 * Errors (-1): as reward_model_score, for the batch (the server then scores video by video to name the item). */
int reward_model_score_batch(reward_model *m, const reward_video *videos, const char *const *prompts, int nv,
                             double *out);

/* Bytes a loaded model holds (parameters, F32) and the largest scratch of one call for videos of F frames (the
 * scored frames' pixels and the forwards' activations: clip_act_bytes); batched: of reward_model_score_batch. */
size_t reward_model_param_bytes(const reward_model *m);
size_t reward_model_act_bytes(const reward_model *m, int64_t F, int batched);
/* The same from a folder's config without weights (reward_model_check), for budgets: 0 and -1 on error. */
int reward_model_estimate(const char *name, const char *dir, const reward_frames *frames, int64_t F, int batched,
                          size_t *param_bytes, size_t *act_bytes);

/* Attaches models to the learned scorers of sc[0 .. n): for each, the folder dirs[j] whose names[j] is its name
 * (0 <= j < n_models) is loaded (reward_model_load) and kept in sc[i].model. Errors (-1, core_error; nothing left
 * loaded): a learned scorer with no folder ("<prefix>.<name>: ... needs a model folder"), a folder for a scorer
 * that sc does not list, a folder named twice, a load error. `prefix` names the option in messages
 * ("reward.models" or "--models"). With video_frames >= 1, a reward.frames K larger than it is refused too. */
int reward_models_attach(reward_weighted *sc, int n, int n_models, const char *const *names, const char *const *dirs,
                         const reward_frames *frames, int64_t video_frames, const char *prefix);
/* The same checks without loading weights (reward_model_check), for --dry-run and start-up checks. With
 * absent_ok, a folder that does not exist yet is not an error but a warning line (core_log_warn, naming the key
 * and folder): a recipe's placeholder path passes --dry-run, as an absent model.path does. */
int reward_models_check(const reward_weighted *sc, int n, int n_models, const char *const *names,
                        const char *const *dirs, const reward_frames *frames, int64_t video_frames, const char *prefix,
                        int absent_ok);
/* Frees the models attached to sc[0 .. n) and sets them to NULL. */
void reward_models_detach(reward_weighted *sc, int n);

/* The decoded video's frame count of a recipe: rollout.frames, or (frames - 1) / 4 + 1 with model.decoder
 * latent_rgb (one frame per latent frame). */
int64_t reward_recipe_video_frames(const core_recipe *r);
/* The recipe's reward.models and reward.frames applied to sc[0 .. n) (the recipe's scorers, in order): load 1
 * loads (reward_models_attach), 0 checks (reward_models_check), -1 checks letting an absent folder pass. Messages
 * name reward.models.<scorer> and reward.frames. 0 or -1. */
int reward_recipe_models(const core_recipe *r, reward_weighted *sc, int n, int load);
/* The checks of the recipe's learned scorers without weights (reward.scorers found, reward_models_check): strict 0
 * lets an absent folder pass with a warning (--dry-run, trainer_check_recipe), strict 1 refuses it (a run's or an
 * eval's start, before any process starts). Nothing to check with reward.endpoint (the server's own). 0 or -1. */
int reward_recipe_check(const core_recipe *r, int strict);
/* Bytes of the recipe's learned models (parameters, F32) and of their largest scratch at once (every model's
 * reward_model_estimate for the recipe's video, batched as the reward server or not as local mode; the models run
 * one after another, so the largest), from the configs alone; folders that fail their checks count 0 (the checks
 * report them). */
void reward_recipe_models_bytes(const core_recipe *r, int batched, double *param_bytes, double *act_bytes);
/* The recipe's reward.models as "NAME=DIR,..." for `vgrpo reward-server --models` into buf (cap bytes); "" when
 * none. -1 with core_error when it does not fit or a name or folder holds ',' or '='. */
int reward_recipe_models_spec(const core_recipe *r, char *buf, size_t cap);

/* Parses "NAME=DIR,NAME=DIR" (the reward server's --models) into malloc'd arrays (*names, *dirs point into one
 * block: free(*names) frees all). 0, or -1 with core_error naming the entry (no '=', empty name or folder). */
int reward_models_parse(const char *spec, int *n, char ***names, char ***dirs);

#endif
