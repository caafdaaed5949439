/* trainer/run/images.c — start-up checks and conditions of image-to-video prompt files (see trainer/run/images.h). */
#include "trainer/run/images.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "media/image.h"
#include "media/png.h"
#include "model/dit/wan_dit.h"
#include "model/flow/first_frame.h"
#include "model/vae/wan_vae_i2v.h"
#include "model/vae/wan_vae_encode.h"
#include "trainer/budget/budget.h"

/* 1 when model.path's transformer is a Wan 2.2 I2V-A14B one (latents, a 4-channel mask and the condition video's
 * latents in: in = 2 out + 4; *wc its config), else 0 (also when there is no readable config). */
static int is_i2v_a14b(const char *model_path, wan_config *wc) {
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/transformer/config.json", model_path);
    if (access(cfg_path, F_OK)) return 0;
    if (!wan_config_load(wc, cfg_path) && wan_cond_kind(wc) == WAN_COND_CONCAT) return 1;
    core_error_clear();
    return 0;
}

enum { PIPE_UNKNOWN, PIPE_T2V, PIPE_TI2V, PIPE_I2V_A14B };

/* What model.path holds: its pipeline, or when it has none yet the preset the job writes there (model.init_preset) or
 * its folder's name names, as the estimate takes it (trainer/budget/budget.h), so a dry run checks it too. *wc: the
 * transformer's config where one was read (PIPE_I2V_A14B always); what: how messages name it. -1 on a bad
 * model_index.json. */
static int pipeline_kind(const core_recipe *r, wan_config *wc, char *what, size_t cap) {
    snprintf(what, cap, "model.path %s", r->model_path);
    const int ff = flow_ff_pipeline_conditions(r->model_path);
    if (ff < 0) return -1;
    if (ff == 1) return PIPE_TI2V;
    if (is_i2v_a14b(r->model_path, wc)) return PIPE_I2V_A14B;
    if (ff == 0) return PIPE_T2V;
    const char *p = budget_model_preset(r); /* no model_index.json yet */
    if (!p || wan_config_preset(wc, p)) return core_error_clear(), PIPE_UNKNOWN;
    snprintf(what, cap, "%s %s (%s has no pipeline yet)", p == r->init_preset ? "model.init_preset" : "the preset", p,
             r->model_path);
    if (!strcmp(p, "tiny-ti2v") || !strcmp(p, "wan2.2-ti2v-5b")) return PIPE_TI2V; /* init-model's expand_timesteps */
    return wan_cond_kind(wc) == WAN_COND_CONCAT ? PIPE_I2V_A14B : PIPE_T2V;
}

int trainer_images_check(const core_recipe *r, const core_prompts *const *lists, int n_lists, const char *key) {
    for (int k = 1; k < n_lists; k++)
        if (!lists[k]->n_images != !lists[0]->n_images)
            return core_error("%s: %s images (image to video), but %s %s: the prompt files give images or none does",
                              lists[k]->path, lists[k]->n_images ? "gives" : "has no", lists[0]->path,
                              lists[0]->n_images ? "does" : "does not");
    wan_config wc;
    char what[4400];
    const int kind = pipeline_kind(r, &wc, what, sizeof what);
    if (kind < 0) return -1;
    if (!lists[0]->n_images) {
        if (kind == PIPE_I2V_A14B)
            return core_error("%s: %s has no images, but %s is a Wan 2.2 I2V-A14B model (its transformer takes %d "
                              "channels for %d out: latents, a 4-channel mask and the condition video's latents): it "
                              "needs prompt files with an image per prompt (JSON lines)", key, lists[0]->path, what,
                              wc.in_channels, wc.out_channels);
        return 0;
    }
    /* every image's header (its size within the reader's limit), as the job will read it; a path repeated on the
     * next prompt is read once */
    for (int k = 0; k < n_lists; k++)
        for (int i = 0; i < lists[k]->n; i++)
            if ((!i || strcmp(lists[k]->image[i], lists[k]->image[i - 1])) &&
                media_png_probe(lists[k]->image[i], NULL, NULL))
                return core_error_push("%s:%d: image: ", lists[k]->path, lists[k]->line[i]);
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    if (F < 2 && kind != PIPE_I2V_A14B) /* I2V-A14B generates every latent frame, the first one too */
        return core_error("rollout.frames: %d frames are one latent frame, the image's: TI2V image to video needs at "
                          "least 5 (2 latent frames)", r->frames);
    if (kind == PIPE_T2V)
        return core_error("%s: %s gives images (image to video), but %s is a text-to-video pipeline (no "
                          "\"expand_timesteps\": true in its model_index.json, and its transformer takes as many "
                          "channels as it gives); image to video needs a Wan 2.2 TI2V pipeline (init-model presets "
                          "wan2.2-ti2v-5b, tiny-ti2v) or a Wan 2.2 I2V-A14B one (wan2.2-i2v-a14b, tiny-i2v); Wan 2.1 "
                          "I2V (CLIP image embeddings) is not supported", key, lists[0]->path, what);
    return 0;
}

/* I2V-A14B: the PNG stretched to the recipe's size, then its condition [K, F, h, w] (model/vae/wan_vae_i2v.h). */
static int i2v_encode(vae_encoder *enc, const core_recipe *r, int64_t K, const char *png, float *dst) {
    if (K != VAE_I2V_MASK_CHANNELS + vae_encoder_get_config(enc)->z_dim)
        return core_error("the transformer takes %lld condition channels, the mask's %d and the VAE's %d latents are %d",
                          (long long)K, VAE_I2V_MASK_CHANNELS, vae_encoder_get_config(enc)->z_dim,
                          VAE_I2V_MASK_CHANNELS + vae_encoder_get_config(enc)->z_dim);
    const size_t npx = (size_t)r->height * (size_t)r->width;
    uint8_t *px = malloc(3 * npx);
    float *img = malloc(sizeof(float) * 3 * npx);
    int rc = !px || !img ? core_error("out of memory for the image") : media_image_load(png, r->height, r->width, px);
    if (!rc) {
        vae_video_from_u8(px, 1, 1, r->height, r->width, img);
        rc = vae_i2v_condition(enc, img, r->frames, r->height, r->width, dst);
    }
    free(px), free(img);
    return rc;
}

int trainer_images_encode(const core_recipe *r, int64_t C, int64_t K, const core_prompts *const *lists, int n_lists,
                          float **out) {
    int F, h, w;
    core_recipe_latent_size(r, &F, &h, &w);
    const int64_t nc = K ? K * F * h * w : C * h * w;
    for (int k = 0; k < n_lists; k++) out[k] = NULL;
    vae_encoder *enc = vae_encoder_load(r->model_path);
    if (!enc) return core_error_push("image conditions: model.path's VAE encoder: ");
    const vae_config *vc = vae_encoder_get_config(enc);
    int rc = -1;
    if (vc->z_dim != C || vae_encoder_spatial_factor(enc) * h != r->height) {
        core_error("image conditions: model.path %s's VAE encodes %d channels at spatial factor %d, but the transformer "
                   "takes %lld channels and rollout.height %d is %d latent rows (model.vae_scale_factor_spatial %d)",
                   r->model_path, vc->z_dim, vae_encoder_spatial_factor(enc), (long long)C, r->height, h,
                   r->vae_scale_factor_spatial);
        goto done;
    }
    for (int k = 0; k < n_lists; k++) {
        const core_prompts *p = lists[k];
        if (!(out[k] = malloc(sizeof(float) * (size_t)nc * (size_t)p->n))) {
            core_error("out of memory for the image conditions");
            goto done;
        }
        for (int i = 0; i < p->n; i++) {
            const float *same = NULL; /* this image file, encoded already */
            for (int q = 0; q <= k && !same; q++)
                for (int j = 0; j < (q < k ? lists[q]->n : i) && !same; j++)
                    if (!strcmp(lists[q]->image[j], p->image[i])) same = out[q] + (int64_t)j * nc;
            float *dst = out[k] + (int64_t)i * nc;
            char at[4200];
            if (same) memcpy(dst, same, sizeof(float) * (size_t)nc);
            else if (K ? i2v_encode(enc, r, K, p->image[i], dst) : media_image_encode(enc, p->image[i], r->height, r->width, dst)) {
                core_error_push("%s: image: ", core_prompts_where(p, i, at, sizeof at));
                goto done;
            }
        }
    }
    rc = 0;
done:
    if (rc)
        for (int k = 0; k < n_lists; k++) free(out[k]), out[k] = NULL;
    vae_encoder_free(enc);
    return rc;
}
