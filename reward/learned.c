/* reward/learned.c — the model-backed scorers (see reward/learned.h): frame selection, the folder checks, loading,
 * and scoring one video with a CLIP (model/clip/). */
#include "reward/learned.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/log.h"
#include "model/clip/clip_aesthetic.h"
#include "model/clip/clip_image.h"
#include "model/clip/clip_tokenizer.h"

/* ---- Frames ---- */

int reward_frames_parse(const char *spec, reward_frames *f) {
    f->mode = REWARD_FRAMES_ALL, f->k = 0;
    if (!spec || !*spec || !strcmp(spec, "all")) return 0;
    if (!strcmp(spec, "first")) {
        f->mode = REWARD_FRAMES_FIRST, f->k = 1;
        return 0;
    }
    char *end;
    errno = 0;
    const long k = strtol(spec, &end, 10);
    if (end == spec || *end || errno || spec[0] == '+' || spec[0] == ' ')
        return core_error("reward.frames: \"%.40s\" is not first, all or a number of frames K >= 1", spec);
    if (k < 1 || k > (1 << 20)) return core_error("reward.frames: K = %ld frames; K must be >= 1", k);
    f->mode = REWARD_FRAMES_EVEN, f->k = (int)k;
    return 0;
}

int reward_frames_count(const reward_frames *f, int64_t F) {
    if (F < 1) return core_error("reward.frames: the video has %lld frames", (long long)F);
    if (f->mode == REWARD_FRAMES_FIRST) return 1;
    if (f->mode == REWARD_FRAMES_ALL) return F > (1 << 20) ? core_error("video of %lld frames", (long long)F) : (int)F;
    if (f->k > F)
        return core_error("reward.frames: %d frames asked, the video has %lld (at most its frame count)", f->k,
                          (long long)F);
    return f->k;
}

void reward_frames_pick(const reward_frames *f, int64_t F, int64_t *idx) {
    const int n = f->mode == REWARD_FRAMES_FIRST ? 1 : f->mode == REWARD_FRAMES_ALL ? (int)F : f->k;
    for (int j = 0; j < n; j++)
        idx[j] = f->mode == REWARD_FRAMES_ALL ? j : n == 1 ? 0 : (int64_t)j * (F - 1) / (n - 1);
}

/* ---- Kinds and folders ---- */

static const char *const kind_names[REWARD_N_LEARNED] = {"clip_score", "pickscore", "hpsv2", "aesthetic"};

int reward_learned_kind_of(const char *name) {
    for (int k = 0; name && k < REWARD_N_LEARNED; k++)
        if (!strcmp(name, kind_names[k])) return k;
    return -1;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A *.safetensors file in dir (other than the aesthetic MLP): 1, else 0. */
static int has_safetensors(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        const size_t n = strlen(e->d_name);
        found = n > 12 && !strcmp(e->d_name + n - 12, ".safetensors") && strcmp(e->d_name, REWARD_AESTHETIC_MLP_FILE);
    }
    closedir(d);
    return found;
}

/* The image preprocessing of kind k for a model of config c in dir. hpsv2: HPSv2's preprocess_val at the model's
 * image size, mean and std from open_clip_config.json's preprocess_cfg when it has them (else OpenAI's, open_clip's
 * default for ViT-H-14); the others: the folder's preprocessor_config.json (CLIPImageProcessor). */
static int image_config(int k, const char *dir, const clip_config *c, clip_image_config *ic, const char *key) {
    char path[4200];
    if (k == REWARD_HPSV2) {
        clip_image_config_default(ic);
        if (c->image_h != c->image_w)
            return core_error("%s: %s: hpsv2 needs a square image size, the model's is %d x %d", key, dir, c->image_h,
                              c->image_w);
        ic->shortest_edge = ic->crop_h = ic->crop_w = c->image_h;
        ic->variant = CLIP_IMAGE_HPSV2;
        snprintf(path, sizeof path, "%s/open_clip_config.json", dir);
        json_t *root = c->format == CLIP_FORMAT_OPEN_CLIP ? json_load_file(path, 0, NULL) : NULL;
        json_t *pc = json_object_get(root, "preprocess_cfg");
        const char *fields[2] = {"mean", "std"};
        for (int f = 0; f < 2 && pc; f++) {
            json_t *a = json_object_get(pc, fields[f]);
            if (!a) continue;
            if (!json_is_array(a) || json_array_size(a) != 3) {
                json_decref(root);
                return core_error("%s: %s: preprocess_cfg.%s is not a list of 3 numbers", key, path, fields[f]);
            }
            for (int i = 0; i < 3; i++) {
                const double v = json_number_value(json_array_get(a, (size_t)i));
                if (!json_is_number(json_array_get(a, (size_t)i)) || !(f == 0 || v > 0)) {
                    json_decref(root);
                    return core_error("%s: %s: preprocess_cfg.%s[%d] is not a %snumber", key, path, fields[f], i,
                                      f ? "positive " : "");
                }
                (f ? ic->image_std : ic->image_mean)[i] = (float)v;
            }
        }
        json_decref(root);
        return 0;
    }
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    if (!is_file(path))
        return core_error("%s: %s has no preprocessor_config.json (the CLIPImageProcessor settings of the model's hub "
                          "folder)", key, dir);
    if (clip_image_config_load(path, ic)) return core_error_push("%s: ", key);
    if (ic->crop_h != c->image_h || ic->crop_w != c->image_w)
        return core_error("%s: %s: crop_size %d x %d is not the model's image size %d x %d (config.json "
                          "vision_config.image_size)", key, path, ic->crop_h, ic->crop_w, c->image_h, c->image_w);
    return 0;
}

/* The checks of reward_model_check, also giving the image preprocessing. */
static int check_folder(const char *name, const char *dir, const char *key, clip_config *c, clip_image_config *ic) {
    const int k = reward_learned_kind_of(name);
    if (k < 0)
        return core_error("%s: \"%.60s\" is not a learned scorer (clip_score, pickscore, hpsv2, aesthetic)", key, name);
    char path[4200];
    struct stat st;
    if (!dir || !*dir) return core_error("%s: empty folder", key);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return core_error("%s: %s is not a folder (%s)", key, dir, k == REWARD_HPSV2
                              ? "an open_clip ViT-H-14 checkpoint: open_clip_config.json, open_clip_model.safetensors, "
                                "tokenizer.json"
                              : "a transformers CLIPModel folder: config.json, model.safetensors, tokenizer.json, "
                                "preprocessor_config.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (is_file(path)) {
        if (clip_config_load_transformers(path, c)) return core_error_push("%s: ", key);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!is_file(path) && !has_safetensors(dir))
            return core_error("%s: %s has config.json but no model.safetensors (or its index)", key, dir);
    } else {
        snprintf(path, sizeof path, "%s/open_clip_config.json", dir);
        if (!is_file(path))
            return core_error("%s: %s has neither config.json (transformers CLIPModel) nor open_clip_config.json "
                              "(open_clip)", key, dir);
        if (clip_config_load_open_clip(path, c)) return core_error_push("%s: ", key);
        if (!has_safetensors(dir))
            return core_error("%s: %s has open_clip_config.json but no *.safetensors weights (convert a .pt "
                              "checkpoint: safetensors.torch.save_file of its state_dict)", key, dir);
    }
    if (k != REWARD_AESTHETIC) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (!is_file(path))
            return core_error("%s: %s has no tokenizer.json (copy it from the model's hub folder%s)", key, dir,
                              k == REWARD_HPSV2 ? ", e.g. laion/CLIP-ViT-H-14-laion2B-s32B-b79K" : "");
    } else {
        snprintf(path, sizeof path, "%s/" REWARD_AESTHETIC_MLP_FILE, dir);
        if (!is_file(path))
            return core_error("%s: %s has no " REWARD_AESTHETIC_MLP_FILE " (the aesthetic MLP, "
                              "sac+logos+ava1-l14-linearMSE.pth converted with safetensors.torch.save_file)", key, dir);
    }
    return image_config(k, dir, c, ic, key);
}

int reward_model_check(const char *name, const char *dir, const char *key, clip_config *cfg) {
    clip_config c;
    clip_image_config ic;
    if (check_folder(name, dir, key, &c, &ic)) return -1;
    if (cfg) *cfg = c;
    return 0;
}

/* ---- Loaded models ---- */

struct reward_model {
    int kind;
    char name[32];
    clip_model *clip;
    clip_tokenizer *tok;      /* NULL for aesthetic */
    clip_aesthetic *mlp;      /* aesthetic only */
    clip_image_config image;
    reward_frames frames;
    int text_len;             /* min(77, max_positions) */
    pthread_mutex_t mu;
};

static int text_len_of(const clip_config *c) {
    return c->max_positions < CLIP_TOK_CONTEXT ? c->max_positions : CLIP_TOK_CONTEXT;
}

reward_model *reward_model_load(const char *name, const char *dir, const reward_frames *frames, const char *key) {
    clip_config c;
    reward_model *m = calloc(1, sizeof *m);
    if (!m) return core_error("%s: out of memory", key), NULL;
    m->kind = reward_learned_kind_of(name);
    m->frames = *frames;
    pthread_mutex_init(&m->mu, NULL);
    if (check_folder(name, dir, key, &c, &m->image)) goto fail;
    snprintf(m->name, sizeof m->name, "%s", name);
    if (!(m->clip = clip_load(dir))) {
        core_error_push("%s: ", key);
        goto fail;
    }
    m->text_len = text_len_of(clip_get_config(m->clip));
    char path[4200];
    if (m->kind != REWARD_AESTHETIC) {
        if (!(m->tok = clip_tok_load(dir))) {
            core_error_push("%s: ", key);
            goto fail;
        }
        if (clip_tok_vocab_size(m->tok) > clip_get_config(m->clip)->vocab_size) {
            core_error("%s: %s: tokenizer.json has %d tokens, the model's text vocab_size is %d", key, dir,
                       clip_tok_vocab_size(m->tok), clip_get_config(m->clip)->vocab_size);
            goto fail;
        }
    } else {
        snprintf(path, sizeof path, "%s/" REWARD_AESTHETIC_MLP_FILE, dir);
        if (!(m->mlp = clip_aesthetic_load(path))) {
            core_error_push("%s: ", key);
            goto fail;
        }
        if (clip_aesthetic_dim(m->mlp) != clip_get_config(m->clip)->projection_dim) {
            core_error("%s: %s takes %d-wide embeddings, the CLIP's projection_dim is %d", key, path,
                       clip_aesthetic_dim(m->mlp), clip_get_config(m->clip)->projection_dim);
            goto fail;
        }
    }
    return m;
fail:
    reward_model_free(m);
    return NULL;
}

void reward_model_free(reward_model *m) {
    if (!m) return;
    clip_free(m->clip);
    clip_tok_free(m->tok);
    clip_aesthetic_free(m->mlp);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* Scores a block of frames src [T, H, W, 3] (u8) holding nv videos' scored frames one after another, counts[v] of
 * video v, against prompts[v]: score[T] per frame (float, as the references). One image forward for the block (rows
 * do not depend on batch mates: clip_encode_image), then per video its prompt's text forward, the logits of its rows
 * (or the MLP of its rows), exactly as for the video alone. Called under m->mu. */
static int score_block(reward_model *m, const uint8_t *src, int T, int H, int W, const int *counts, int nv,
                       const char *const *prompts, float *score) {
    const clip_config *c = clip_get_config(m->clip);
    const int64_t px = (int64_t)3 * m->image.crop_h * m->image.crop_w;
    const int E = c->projection_dim;
    float *pix = malloc(sizeof(float) * (size_t)(T * px)), *img = malloc(sizeof(float) * (size_t)T * (size_t)E);
    float txt[4096], *txt_h = E > 4096 ? malloc(sizeof(float) * (size_t)E) : txt;
    int rc = -1;
    if (!pix || !img || !txt_h) {
        core_error("%s: out of memory", m->name);
        goto done;
    }
    if (clip_image_preprocess(&m->image, src, T, H, W, pix) || clip_encode_image(m->clip, pix, T, img)) goto done;
    const float div = m->kind == REWARD_PICKSCORE ? 26.0f : m->kind == REWARD_CLIP_SCORE ? 30.0f : 1.0f;
    for (int v = 0, off = 0; v < nv; off += counts[v++]) {
        const int n = counts[v];
        if (m->kind == REWARD_AESTHETIC) {
            if (clip_aesthetic_score(m->mlp, img + (size_t)off * E, n, score + off)) goto done;
            continue;
        }
        int32_t ids[CLIP_TOK_CONTEXT];
        const char *p = prompts[v] ? prompts[v] : "";
        if (clip_tok_encode_padded(m->tok, p, strlen(p), m->text_len, ids, NULL) ||
            clip_encode_text(m->clip, ids, 1, m->text_len, txt_h))
            goto done;
        /* logits_per_image [n, 1] = exp(logit_scale) cos; hpsv2 the plain cosine (a scale of exp(0) = 1) */
        clip_logits(score + off, img + (size_t)off * E, n, txt_h, 1, E,
                    m->kind == REWARD_HPSV2 ? 0.0f : clip_logit_scale(m->clip));
        if (m->kind != REWARD_HPSV2)
            for (int i = 0; i < n; i++) score[off + i] /= div;
    }
    rc = 0;
done:
    if (txt_h != txt) free(txt_h);
    free(pix);
    free(img);
    return rc;
}

static int check_video(const reward_model *m, const reward_video *v) {
    if (!v || !v->data || v->frames < 1 || v->height < 1 || v->width < 1 || v->height > 65536 || v->width > 65536)
        return core_error("%s: bad video (NULL data or a dim out of 1 .. 65536)", m->name);
    return 0;
}

/* Copies video v's scored frames (rule of m->frames, n of them) to dst [n, H, W, 3]. */
static void gather(const reward_model *m, const reward_video *v, int n, int64_t *idx, uint8_t *dst) {
    const int64_t fp = v->height * v->width * 3;
    reward_frames_pick(&m->frames, v->frames, idx);
    for (int i = 0; i < n; i++) memcpy(dst + i * fp, v->data + idx[i] * fp, (size_t)fp);
}

/* The mean in double of score[0 .. n), in order: a video's reward. */
static int mean_of(const reward_model *m, const float *score, int n, double *out) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)score[i];
    *out = s / (double)n;
    return isfinite(*out) ? 0 : core_error("%s: the score is not finite", m->name);
}

int reward_model_score(reward_model *m, const reward_video *v, const char *prompt, double *out) {
    if (check_video(m, v)) return -1;
    const int n = reward_frames_count(&m->frames, v->frames);
    if (n < 0) return core_error_push("%s: ", m->name);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    float *score = malloc(sizeof(float) * (size_t)n);
    uint8_t *sel = n < v->frames ? malloc((size_t)(n * v->height * v->width * 3)) : NULL;
    int rc = -1;
    if (!idx || !score || (n < v->frames && !sel)) {
        core_error("%s: out of memory", m->name);
        goto done;
    }
    if (sel) gather(m, v, n, idx, sel); /* else every frame, in order */
    pthread_mutex_lock(&m->mu);
    rc = score_block(m, sel ? sel : v->data, n, (int)v->height, (int)v->width, &n, 1, &prompt, score);
    pthread_mutex_unlock(&m->mu);
    if (rc) core_error_push("%s: ", m->name);
    else rc = mean_of(m, score, n, out);
done:
    free(idx);
    free(score);
    free(sel);
    return rc;
}

int reward_model_score_batch(reward_model *m, const reward_video *videos, const char *const *prompts, int nv,
                             double *out) {
    if (nv < 1) return core_error("%s: no videos", m->name);
    const int64_t F = videos[0].frames, H = videos[0].height, W = videos[0].width;
    for (int v = 0; v < nv; v++) {
        if (check_video(m, &videos[v])) return -1;
        if (videos[v].frames != F || videos[v].height != H || videos[v].width != W)
            return core_error("%s: a batch's videos differ in shape", m->name);
    }
    const int n = reward_frames_count(&m->frames, F);
    if (n < 0) return core_error_push("%s: ", m->name);
    /* blocks of whole videos, at most max(REWARD_MODEL_BATCH_FRAMES, n) frames each */
    const int per = n >= REWARD_MODEL_BATCH_FRAMES ? 1 : REWARD_MODEL_BATCH_FRAMES / n;
    const int64_t fp = H * W * 3;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
    float *score = malloc(sizeof(float) * (size_t)(per * n));
    int *counts = malloc(sizeof(int) * (size_t)per);
    uint8_t *buf = malloc((size_t)(per * n * fp));
    int rc = 0;
    if (!idx || !score || !counts || !buf) rc = core_error("%s: out of memory", m->name);
    for (int v0 = 0; !rc && v0 < nv; v0 += per) {
        const int k = nv - v0 < per ? nv - v0 : per;
        for (int j = 0; j < k; j++) counts[j] = n, gather(m, &videos[v0 + j], n, idx, buf + (int64_t)j * n * fp);
        pthread_mutex_lock(&m->mu);
        rc = score_block(m, buf, k * n, (int)H, (int)W, counts, k, prompts + v0, score);
        pthread_mutex_unlock(&m->mu);
        if (rc) core_error_push("%s: ", m->name);
        for (int j = 0; !rc && j < k; j++) rc = mean_of(m, score + j * n, n, &out[v0 + j]);
    }
    free(idx);
    free(score);
    free(counts);
    free(buf);
    return rc;
}

/* ---- Memory ---- */

static size_t act_bytes(const clip_config *c, const clip_image_config *ic, int n) {
    const size_t pix = sizeof(float) * (size_t)n * 3 * (size_t)ic->crop_h * (size_t)ic->crop_w;
    return pix + sizeof(float) * (size_t)n * (size_t)c->projection_dim + clip_act_bytes(c, n, 1, text_len_of(c));
}

size_t reward_model_param_bytes(const reward_model *m) { return clip_param_bytes(clip_get_config(m->clip)); }

/* Frames of one forward: a video's scored frames n, or with batching whole videos up to the batch size. */
static int block_frames(int n, int batched) {
    return batched && n < REWARD_MODEL_BATCH_FRAMES ? REWARD_MODEL_BATCH_FRAMES / n * n : n;
}

size_t reward_model_act_bytes(const reward_model *m, int64_t F, int batched) {
    const int n = F >= 1 && reward_frames_count(&m->frames, F) > 0 ? reward_frames_count(&m->frames, F) : 1;
    return act_bytes(clip_get_config(m->clip), &m->image, block_frames(n, batched));
}

int reward_model_estimate(const char *name, const char *dir, const reward_frames *frames, int64_t F, int batched,
                          size_t *param_bytes, size_t *act) {
    clip_config c;
    clip_image_config ic;
    if (check_folder(name, dir, "reward.models", &c, &ic)) return -1;
    const int n = reward_frames_count(frames, F);
    if (n < 0) return -1;
    *param_bytes = clip_param_bytes(&c);
    *act = act_bytes(&c, &ic, block_frames(n, batched));
    return 0;
}

/* ---- Attaching models to a scorer list ---- */

/* Pairs every learned scorer of sc with its folder: dir_of[i] (NULL for the pure scorers). */
static int match(const reward_weighted *sc, int n, int n_models, const char *const *names, const char *const *dirs,
                 const reward_frames *frames, int64_t video_frames, const char *prefix, const char **dir_of) {
    for (int j = 0; j < n_models; j++) {
        int found = 0;
        for (int i = 0; i < n; i++) found |= !strcmp(sc[i].scorer->name, names[j]);
        if (!found)
            return core_error("%s.%s: scorer \"%s\" is not in the scorer list (list it in reward.scorers, or remove "
                              "its model folder)", prefix, names[j], names[j]);
        for (int i = 0; i < j; i++)
            if (!strcmp(names[i], names[j])) return core_error("%s.%s: named twice", prefix, names[j]);
    }
    int any = 0;
    for (int i = 0; i < n; i++) {
        dir_of[i] = NULL;
        if (!sc[i].scorer->learned) continue;
        any = 1;
        for (int j = 0; j < n_models && !dir_of[i]; j++)
            if (!strcmp(sc[i].scorer->name, names[j])) dir_of[i] = dirs[j];
        if (!dir_of[i])
            return core_error("%s.%s: scorer %s needs a model folder (e.g. %s.%s: /data/%s)", prefix,
                              sc[i].scorer->name, sc[i].scorer->name, prefix, sc[i].scorer->name,
                              sc[i].scorer->learned_folder);
    }
    if (any && video_frames >= 1 && reward_frames_count(frames, video_frames) < 0) return -1;
    return 0;
}

int reward_models_check(const reward_weighted *sc, int n, int n_models, const char *const *names,
                        const char *const *dirs, const reward_frames *frames, int64_t video_frames, const char *prefix,
                        int absent_ok) {
    const char *dir_of[64];
    if (n > 64) return core_error("%s: more than 64 scorers", prefix);
    if (match(sc, n, n_models, names, dirs, frames, video_frames, prefix, dir_of)) return -1;
    char key[256];
    for (int i = 0; i < n; i++) {
        if (!dir_of[i]) continue;
        snprintf(key, sizeof key, "%s.%s", prefix, sc[i].scorer->name);
        struct stat st;
        if (absent_ok && stat(dir_of[i], &st) != 0 && errno == ENOENT) {
            core_log_warn("%s: %s does not exist yet (checked when the run starts; the model folder of %s)", key,
                          dir_of[i], sc[i].scorer->name);
            continue;
        }
        if (reward_model_check(sc[i].scorer->name, dir_of[i], key, NULL)) return -1;
    }
    return 0;
}

int reward_models_attach(reward_weighted *sc, int n, int n_models, const char *const *names, const char *const *dirs,
                         const reward_frames *frames, int64_t video_frames, const char *prefix) {
    const char *dir_of[64];
    if (n > 64) return core_error("%s: more than 64 scorers", prefix);
    for (int i = 0; i < n; i++) sc[i].model = NULL;
    if (match(sc, n, n_models, names, dirs, frames, video_frames, prefix, dir_of)) return -1;
    char key[256];
    for (int i = 0; i < n; i++) {
        if (!dir_of[i]) continue;
        snprintf(key, sizeof key, "%s.%s", prefix, sc[i].scorer->name);
        if (!(sc[i].model = reward_model_load(sc[i].scorer->name, dir_of[i], frames, key))) {
            reward_models_detach(sc, n);
            return -1;
        }
        sc[i].model_fn = reward_model_score, sc[i].model_batch_fn = reward_model_score_batch;
    }
    return 0;
}

void reward_models_detach(reward_weighted *sc, int n) {
    for (int i = 0; i < n; i++) {
        reward_model_free(sc[i].model);
        sc[i].model = NULL, sc[i].model_fn = NULL, sc[i].model_batch_fn = NULL;
    }
}

int reward_models_parse(const char *spec, int *n, char ***names, char ***dirs) {
    *n = 0, *names = *dirs = NULL;
    if (!spec || !*spec) return 0;
    int cap = 1;
    for (const char *p = spec; *p; p++) cap += *p == ',';
    const size_t len = strlen(spec) + 1;
    char **blk = malloc(2 * sizeof(char *) * (size_t)cap + len);
    if (!blk) return core_error("--models: out of memory");
    char *s = (char *)(blk + 2 * cap), *save = NULL;
    memcpy(s, spec, len);
    int k = 0;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || !eq[1]) {
            core_error("--models: entry \"%.80s\" is not SCORER=FOLDER", tok); /* before tok is freed */
            free(blk);
            return -1;
        }
        *eq = 0;
        blk[k] = tok, blk[cap + k] = eq + 1;
        k++;
    }
    *n = k, *names = blk, *dirs = blk + cap;
    return 0;
}

/* ---- The recipe's keys ---- */

int64_t reward_recipe_video_frames(const core_recipe *r) {
    return r->choice.decoder == CORE_DECODER_LATENT_RGB ? (r->frames - 1) / 4 + 1 : r->frames;
}

int reward_recipe_models(const core_recipe *r, reward_weighted *sc, int n, int load) {
    reward_frames fr;
    if (reward_frames_parse(r->reward_frames, &fr)) return -1;
    const core_cfg_node *mm = r->reward_models;
    const int nm = mm && mm->kind == CORE_NODE_MAP ? mm->n : 0;
    const char *dirs[64];
    if (nm > 64) return core_error("reward.models: more than 64 entries");
    for (int i = 0; i < nm; i++) dirs[i] = mm->items[i]->text;
    const char *const *names = nm ? (const char *const *)mm->keys : NULL;
    const int64_t F = reward_recipe_video_frames(r);
    return load > 0 ? reward_models_attach(sc, n, nm, names, dirs, &fr, F, "reward.models")
                : reward_models_check(sc, n, nm, names, dirs, &fr, F, "reward.models", load < 0);
}

int reward_recipe_check(const core_recipe *r, int strict) {
    if (r->reward_endpoint) return 0;
    reward_weighted sc[64];
    if (r->scorers.n > 64) return core_error("reward.scorers: more than 64");
    for (int i = 0; i < r->scorers.n; i++) {
        sc[i] = (reward_weighted){.scorer = reward_find(r->scorers.v[i]), .weight = 1.0};
        if (!sc[i].scorer) return core_error_push("reward.scorers.%d: ", i);
    }
    return reward_recipe_models(r, sc, r->scorers.n, strict ? 0 : -1);
}

int reward_recipe_models_spec(const core_recipe *r, char *buf, size_t cap) {
    const core_cfg_node *mm = r->reward_models;
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; mm && mm->kind == CORE_NODE_MAP && i < mm->n; i++) {
        const char *d = mm->items[i]->text ? mm->items[i]->text : "";
        if (strpbrk(mm->keys[i], ",=") || strchr(d, ','))
            return core_error("reward.models.%s: a folder holding ',' cannot be passed to the reward server", mm->keys[i]);
        const int w = snprintf(buf + o, cap - o, "%s%s=%s", i ? "," : "", mm->keys[i], d);
        if (w < 0 || (size_t)w >= cap - o) return core_error("reward.models: the folders are too long (%zu bytes)", cap);
        o += (size_t)w;
    }
    return 0;
}

void reward_recipe_models_bytes(const core_recipe *r, int batched, double *param_bytes, double *act_bytes) {
    *param_bytes = *act_bytes = 0;
    reward_frames fr;
    const core_cfg_node *mm = r->reward_models;
    if (!mm || mm->kind != CORE_NODE_MAP || reward_frames_parse(r->reward_frames, &fr)) return;
    for (int i = 0; i < mm->n; i++) {
        size_t p = 0, a = 0;
        if (reward_learned_kind_of(mm->keys[i]) < 0 || !mm->items[i]->text ||
            reward_model_estimate(mm->keys[i], mm->items[i]->text, &fr, reward_recipe_video_frames(r), batched, &p, &a))
            continue;
        *param_bytes += (double)p;
        if ((double)a > *act_bytes) *act_bytes = (double)a;
    }
}
