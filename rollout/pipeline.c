/* rollout/pipeline.c — a rollout process's models, conditioning and decoder (see rollout/pipeline.h). */
#include "rollout/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fs.h"

static int load_decoder(rollout_pipeline *p, const core_recipe *r, const wan_config *wc) {
    char path[4200];
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    if (r->vae_scale_factor_spatial != WAN_LATENT_RGB_FACTOR)
        return core_error("model.vae_scale_factor_spatial: the CPU rollout decodes with spatial factor %d (Wan 2.1-style "
                          "VAE or latent_rgb), the recipe says %d", WAN_LATENT_RGB_FACTOR, r->vae_scale_factor_spatial);
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

int rollout_pipeline_load(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir) {
    memset(p, 0, sizeof *p);
    char dir[4200], dir2[4200];
    if (transformer_dir) {
        snprintf(dir, sizeof dir, "%s", transformer_dir);
        char *slash = strrchr(dir, '/');
        snprintf(dir2, sizeof dir2, "%.*s%s_2", slash ? (int)(slash - dir + 1) : 0, dir, slash ? slash + 1 : dir);
        if (!core_is_dir(dir2)) snprintf(dir2, sizeof dir2, "%s/transformer_2", r->model_path);
    } else {
        snprintf(dir, sizeof dir, "%s/transformer", r->model_path);
        snprintf(dir2, sizeof dir2, "%s/transformer_2", r->model_path);
    }
    if (!core_is_dir(dir))
        return core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run `vgrpo init-model "
                          "--preset tiny --out DIR`)", dir);
    if (wan_model_load(&p->model[0], dir)) return -1;
    p->experts.n = 1;
    p->experts.expert[0] = &p->model[0];
    if (core_is_dir(dir2)) {
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
    if (load_decoder(p, r, wc) || !(p->text = text_cond_load(r->text_encoder, r->model_path, r->text_len, wc->text_dim)))
        goto fail;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int64_t shape[4] = {wc->in_channels, F, H, W};
    if (rollout_config_init(&p->rc, r->num_steps, r->shift, r->eta, r->guidance_scale, shape, r->text_len,
                            (uint64_t)r->seed, r->batch_size))
        goto fail;
    p->rc.guidance_scale_2 = r->guidance_scale_2;
    p->rc.boundary_ratio = r->boundary_ratio;
    p->rc.neg = text_cond_negative(p->text);
    return 0;
fail:
    rollout_pipeline_free(p);
    return -1;
}

int rollout_pipeline_embed(rollout_pipeline *p, const char *prompt, const float **out) {
    return text_cond_embed(p->text, prompt, out);
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
    text_cond_free(p->text);
    vae_free(p->vae);
    memset(p, 0, sizeof *p);
}
