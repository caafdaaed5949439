/* rollout/pipeline.c — a rollout process's models, conditioning and decoder (see rollout/pipeline.h). */
#include "rollout/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "model/t5_prompt.h"
#include "model/tokenizer.h"
#include "model/umt5.h"
#include "model/word_embed.h"

/* Prompt text -> embedding, a chained hash table keyed by the FNV-1a hash of the text. */
typedef struct cache_entry {
    char *text;
    float *emb;
    struct cache_entry *next;
} cache_entry;

struct rollout_embed_cache {
    cache_entry *bucket[1024];
};

static int is_dir(const char *path) {
    struct stat sb;
    return !stat(path, &sb) && S_ISDIR(sb.st_mode);
}

static int load_decoder(rollout_pipeline *p, const core_recipe *r, const wan_config *wc) {
    char path[4200];
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    if (!strcmp(r->decoder, "latent_rgb")) {
        snprintf(path, sizeof path, "%s/latent_rgb.safetensors", r->model_path);
        if (wan_latent_rgb_load(&p->map, path, wc->out_channels)) return core_error_push("model.decoder (latent_rgb): ");
        p->video_frames = F;
    } else {
        snprintf(path, sizeof path, "%s/vae", r->model_path);
        if (!(p->vae = vae_load(path))) return core_error_push("model.decoder (vae): ");
        const vae_config *vc = vae_get_config(p->vae);
        if (vc->z_dim != wc->in_channels)
            return core_error("model.decoder (vae): %s has z_dim %d but the transformer's in_channels is %d", path,
                              vc->z_dim, wc->in_channels);
        if (vae_spatial_factor(p->vae) != WAN_LATENT_RGB_FACTOR || vae_frames_out(p->vae, 2) != 5 ||
            vae_video_channels(p->vae) != 3)
            return core_error("model.decoder (vae): %s is not a Wan 2.1-style VAE (spatial factor %d, temporal 4, "
                              "RGB); the CPU rollout needs factor %d", path, vae_spatial_factor(p->vae),
                              WAN_LATENT_RGB_FACTOR);
        p->video_frames = vae_frames_out(p->vae, F);
    }
    p->video_height = H * WAN_LATENT_RGB_FACTOR;
    p->video_width = W * WAN_LATENT_RGB_FACTOR;
    return 0;
}

static int load_text(rollout_pipeline *p, const core_recipe *r) {
    if (strcmp(r->text_encoder, "umt5")) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", r->model_path);
    struct stat sb;
    if (stat(path, &sb))
        return core_error("model.text_encoder (umt5): %s does not exist (the pipeline needs tokenizer/tokenizer.json; "
                          "model.text_encoder: word_embed uses the tiny preset's word embeddings)", path);
    if (!(p->tok = tok_load(path))) return core_error_push("model.text_encoder (umt5): ");
    snprintf(path, sizeof path, "%s/text_encoder", r->model_path);
    if (!(p->t5 = t5_load(path))) return core_error_push("model.text_encoder (umt5): ");
    if (t5_get_config(p->t5)->d_model != p->text_dim)
        return core_error("model.text_encoder (umt5): %s has d_model %d but the transformer's text_dim is %d", path,
                          t5_get_config(p->t5)->d_model, p->text_dim);
    if (!(p->neg = malloc(sizeof(float) * (size_t)p->text_len * (size_t)p->text_dim))) return core_error("out of memory");
    const char *empty = "";
    int64_t len;
    if (t5_encode_prompts(p->t5, p->tok, &empty, 1, p->text_len, 1, p->neg, &len))
        return core_error_push("model.text_encoder (umt5): the empty negative prompt: ");
    return 0;
}

int rollout_pipeline_load(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir) {
    memset(p, 0, sizeof *p);
    char dir[4200], dir2[4200];
    if (transformer_dir) {
        snprintf(dir, sizeof dir, "%s", transformer_dir);
        char *slash = strrchr(dir, '/');
        snprintf(dir2, sizeof dir2, "%.*s%s_2", slash ? (int)(slash - dir + 1) : 0, dir, slash ? slash + 1 : dir);
        if (!is_dir(dir2)) snprintf(dir2, sizeof dir2, "%s/transformer_2", r->model_path);
    } else {
        snprintf(dir, sizeof dir, "%s/transformer", r->model_path);
        snprintf(dir2, sizeof dir2, "%s/transformer_2", r->model_path);
    }
    if (!is_dir(dir))
        return core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run `vgrpo init-model "
                          "--preset tiny --out DIR`)", dir);
    if (wan_model_load(&p->model[0], dir)) return -1;
    p->experts.n = 1;
    p->experts.expert[0] = &p->model[0];
    if (is_dir(dir2)) {
        if (wan_model_load(&p->model[1], dir2)) goto fail;
        p->experts.n = 2;
        p->experts.expert[1] = &p->model[1];
        if (!wan_config_equal(&p->model[0].cfg, &p->model[1].cfg)) {
            core_error("model.path: %s and %s have different configs (two experts must match)", dir, dir2);
            goto fail;
        }
    }
    const wan_config *wc = &p->model[0].cfg;
    p->text_len = r->text_len;
    p->text_dim = wc->text_dim;
    if (!(p->cache = calloc(1, sizeof *p->cache))) {
        core_error("out of memory");
        goto fail;
    }
    if (load_decoder(p, r, wc) || load_text(p, r)) goto fail;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int64_t shape[4] = {wc->in_channels, F, H, W};
    if (rollout_config_init(&p->rc, r->num_steps, r->shift, r->eta, r->guidance_scale, shape, r->text_len,
                            (uint64_t)r->seed, r->batch_size))
        goto fail;
    p->rc.guidance_scale_2 = r->guidance_scale_2;
    p->rc.boundary_ratio = r->boundary_ratio;
    p->rc.neg = p->neg;
    return 0;
fail:
    rollout_pipeline_free(p);
    return -1;
}

static uint32_t text_hash(const char *s) { return wan_fnv1a32(s, (int64_t)strlen(s)); }

int rollout_pipeline_embed(rollout_pipeline *p, const char *prompt, const float **out) {
    cache_entry **head = &p->cache->bucket[text_hash(prompt) % 1024];
    for (cache_entry *e = *head; e; e = e->next)
        if (!strcmp(e->text, prompt)) return *out = e->emb, 0;
    cache_entry *e = calloc(1, sizeof *e);
    if (e) e->text = strdup(prompt), e->emb = malloc(sizeof(float) * (size_t)p->text_len * (size_t)p->text_dim);
    if (!e || !e->text || !e->emb) {
        if (e) free(e->text), free(e->emb), free(e);
        return core_error("out of memory");
    }
    int rc;
    if (p->t5) {
        int64_t len;
        rc = t5_encode_prompts(p->t5, p->tok, &prompt, 1, p->text_len, 1, e->emb, &len);
    } else {
        rc = wan_word_embed(prompt, p->text_len, p->text_dim, e->emb);
    }
    if (rc) {
        free(e->text), free(e->emb), free(e);
        return core_error_push("prompt \"%.80s\": ", prompt);
    }
    e->next = *head;
    *head = e;
    *out = e->emb;
    return 0;
}

int64_t rollout_pipeline_video_bytes(const rollout_pipeline *p) {
    return (int64_t)p->video_frames * p->video_height * p->video_width * 3;
}

int rollout_pipeline_decode(rollout_pipeline *p, const core_traj *t, uint8_t *video) {
    const int64_t C = t->shape[0], F = t->shape[1], H = t->shape[2], W = t->shape[3];
    if (C != p->rc.shape[0] || F != p->rc.shape[1] || H != p->rc.shape[2] || W != p->rc.shape[3])
        return core_error("model.decoder: trajectory latent [%lld, %lld, %lld, %lld] is not the pipeline's",
                          (long long)C, (long long)F, (long long)H, (long long)W);
    const float *z = core_traj_latent(t, t->n_steps);
    if (p->vae) {
        if (vae_latents_to_u8(p->vae, z, 1, (int)C, (int)F, (int)H, (int)W, video))
            return core_error_push("model.decoder (vae): ");
    } else {
        wan_latent_rgb_decode(&p->map, z, F, H, W, video);
    }
    return 0;
}

void rollout_pipeline_free(rollout_pipeline *p) {
    wan_model_free(&p->model[0]);
    wan_model_free(&p->model[1]);
    t5_free(p->t5);
    tok_free(p->tok);
    free(p->neg);
    if (p->cache) {
        for (int b = 0; b < 1024; b++)
            for (cache_entry *e = p->cache->bucket[b], *nx; e; e = nx) {
                nx = e->next;
                free(e->text), free(e->emb), free(e);
            }
        free(p->cache);
    }
    vae_free(p->vae);
    memset(p, 0, sizeof *p);
}
