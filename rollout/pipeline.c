/* rollout/pipeline.c — a rollout process's models, conditioning and decoder (see rollout/pipeline.h). */
#include "rollout/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

int rollout_decoder_check(const core_recipe *r) {
    if (r->choice.decoder == CORE_DECODER_LATENT_RGB && r->vae_scale_factor_spatial != WAN_LATENT_RGB_FACTOR)
        return core_error("model.vae_scale_factor_spatial: %d, but model.decoder latent_rgb paints %d x %d pixels per "
                          "latent pixel (set %d, or model.decoder: vae)", r->vae_scale_factor_spatial,
                          WAN_LATENT_RGB_FACTOR, WAN_LATENT_RGB_FACTOR, WAN_LATENT_RGB_FACTOR);
    return 0;
}

int rollout_decoder_load(rollout_decoder *d, const core_recipe *r, const wan_config *wc) {
    memset(d, 0, sizeof *d);
    char path[4200];
    int F, H, W, fac;
    core_recipe_latent_size(r, &F, &H, &W);
    if (rollout_decoder_check(r)) return -1;
    if (r->choice.decoder == CORE_DECODER_LATENT_RGB) {
        snprintf(path, sizeof path, "%s/latent_rgb.safetensors", r->model_path);
        if (wan_latent_rgb_load(&d->map, path, wc->out_channels)) return core_error_push("model.decoder (latent_rgb): ");
        d->frames = F;
        fac = WAN_LATENT_RGB_FACTOR;
    } else {
        snprintf(path, sizeof path, "%s/vae", r->model_path);
        if (!(d->vae = vae_load(path))) return core_error_push("model.decoder (vae): ");
        const vae_config *vc = vae_get_config(d->vae);
        fac = vae_spatial_factor(d->vae);
        int bad = 0;
        if (vc->z_dim != wc->out_channels) /* the latent's channels (I2V-A14B: 16 of its 36 inputs) */
            bad = core_error("model.decoder (vae): %s has z_dim %d but the transformer's out_channels is %d", path,
                             vc->z_dim, wc->out_channels);
        else if (vae_frames_out(d->vae, 2) != 5 || vae_video_channels(d->vae) != 3)
            bad = core_error("model.decoder (vae): %s decodes 2 latent frames to %d frames of %d channels; vgrpo "
                             "decodes Wan VAEs (temporal factor 4, RGB: 5 frames of 3)", path, vae_frames_out(d->vae, 2),
                             vae_video_channels(d->vae));
        else if (fac != r->vae_scale_factor_spatial)
            bad = core_error("model.vae_scale_factor_spatial: %d, but the VAE in %s has spatial factor %d (Wan 2.1's "
                             "VAE 8, Wan 2.2's 16): set model.vae_scale_factor_spatial: %d", r->vae_scale_factor_spatial,
                             path, fac, fac);
        /* model.vae_device auto: the decode runs where the transformer does (the process's device executor) */
        if (!bad && r->choice.device == CORE_CUDA && r->choice.vae_device == CORE_VAE_DEVICE_AUTO) {
            if (wan_dev_exec_open(r->device, &d->dx) || vae_set_device(d->vae, wan_dev_exec_ops(d->dx)))
                bad = core_error_push("model.decoder (vae) on model.device cuda (model.vae_device auto; cpu decodes "
                                      "on the CPU): ");
            else
                core_log_info("model.decoder (vae): decoding on %s (bf16 weights %.1f MiB)", vae_device_name(d->vae),
                              vae_device_weight_bytes(d->vae) / 1048576.0);
        }
        if (bad) {
            rollout_decoder_free(d);
            return -1;
        }
        d->frames = vae_frames_out(d->vae, F);
    }
    d->latent[0] = wc->out_channels, d->latent[1] = F, d->latent[2] = H, d->latent[3] = W;
    d->height = H * fac; /* the recipe's rollout.height: it is a multiple of the factor (core/recipe.c) */
    d->width = W * fac;
    return 0;
}

int rollout_decoder_decode(rollout_decoder *d, const float *z, uint8_t *video) {
    const int64_t *s = d->latent;
    if (d->vae) {
        const int rc = vae_latents_to_u8(d->vae, z, 1, (int)s[0], (int)s[1], (int)s[2], (int)s[3], video);
        if (d->dx) vae_release_state(d->vae); /* on a device: the decode is a phase (trainer/optim/train_dev.h) */
        if (rc) return core_error_push("model.decoder (vae): ");
    } else {
        if (wan_latent_rgb_decode(&d->map, z, s[1], s[2], s[3], video)) return core_error_push("model.decoder: ");
    }
    return 0;
}

int64_t rollout_decoder_video_bytes(const rollout_decoder *d) { return (int64_t)d->frames * d->height * d->width * 3; }

void rollout_decoder_free(rollout_decoder *d) {
    vae_free(d->vae); /* its device memory first, then the executor's reference */
    wan_dev_exec_close(d->dx);
    memset(d, 0, sizeof *d);
}

/* The recipe's model.lora as the trainer reads it (trainer/optim/lora.h: trainer_lora_config), and a fresh adapter for
 * every trained expert. */
static int recipe_adapters(rollout_pipeline *p, const core_recipe *r) {
    if (r->lora_rank < 1) return 0;
    wan_lora_config c = {.rank = r->lora_rank, .alpha = r->lora_alpha, .init_seed = (uint64_t)r->lora_init_seed};
    if (wan_lora_targets_parse(&c.targets, (const char *const *)r->lora_targets.v, r->lora_targets.n,
                               "model.lora.targets") ||
        wan_lora_config_validate(&c, &p->model[0].cfg, "model.lora.rank"))
        return -1;
    for (int e = 0; e < p->experts.n; e++) {
        const int trained = core_recipe_trains_expert(r, e);
        if (trained && (wan_lora_init(&p->lora[e], &p->model[e].cfg, &c, e) ||
                        wan_model_attach_lora(&p->model[e], &p->lora[e])))
            return -1;
    }
    return 0;
}

/* Adapters read from adapter_path (expert 0) and adapter_path + "_2" (expert 1), where present. */
static int file_adapters(rollout_pipeline *p, const char *adapter_path) {
    char path[4200];
    struct stat sb;
    int n = 0;
    for (int e = 0; e < p->experts.n; e++) {
        snprintf(path, sizeof path, "%s%s", adapter_path, e ? "_2" : "");
        if (stat(path, &sb)) continue;
        if (wan_lora_load(&p->lora[e], &p->model[e].cfg, path, e) || wan_model_attach_lora(&p->model[e], &p->lora[e]))
            return core_error_push("--adapter: ");
        n++;
    }
    if (!n) return core_error("--adapter: %s: no LoRA adapter there%s", adapter_path, p->experts.n > 1 ? " (nor in its _2 sibling)" : "");
    return 0;
}

static int pipeline_load(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir) {
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
    /* model.text_device auto with model.device cuda: umT5 on the device executor's GPU (opened here, kept for the
     * experts) */
    if (core_recipe_text_on_device(r) && !p->dx && wan_dev_exec_open(r->device, &p->dx)) goto fail;
    if (rollout_decoder_load(&p->dec, r, wc) ||
        !(p->text = text_cond_load(r->choice.text_encoder, r->model_path, r->text_len, wc->text_dim,
                                   p->dx ? wan_dev_exec_ops(p->dx) : NULL)))
        goto fail;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int64_t shape[4] = {wc->out_channels, F, H, W}; /* the latent (I2V-A14B takes a condition besides) */
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

int rollout_pipeline_load_lora(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir,
                               const char *adapter_path) {
    if (pipeline_load(p, r, transformer_dir)) return -1;
    if (!adapter_path ? recipe_adapters(p, r) : file_adapters(p, adapter_path)) {
        rollout_pipeline_free(p);
        return -1;
    }
    /* model.device cuda: the experts (with their adapters) run on the device executor (open already when umT5 is
     * there too) */
    if (!p->dx && wan_dev_exec_open(r->device, &p->dx)) {
        rollout_pipeline_free(p);
        return -1;
    }
    p->exec = (wan_exec){.dev = p->dx};
    return 0;
}

int rollout_pipeline_load(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir) {
    return rollout_pipeline_load_lora(p, r, transformer_dir, NULL);
}

int rollout_pipeline_embed(rollout_pipeline *p, const char *prompt, const float **out) {
    return text_cond_embed(p->text, prompt, out);
}

int64_t rollout_pipeline_video_bytes(const rollout_pipeline *p) { return rollout_decoder_video_bytes(&p->dec); }

int rollout_pipeline_decode(rollout_pipeline *p, const core_traj *t, uint8_t *video) {
    return rollout_decoder_decode_traj(&p->dec, t, video);
}

int rollout_decoder_decode_traj(rollout_decoder *d, const core_traj *t, uint8_t *video) {
    if (memcmp(t->shape, d->latent, sizeof t->shape))
        return core_error("model.decoder: trajectory latent [%lld, %lld, %lld, %lld] is not the pipeline's",
                          (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3]);
    if (!core_traj_has_latent(t, t->n_steps))
        return core_error("model.decoder: trajectory uid %llu stores latents[%d .. %d], not the final latents[%d]: decode "
                          "before trimming it (core_traj_trim)", (unsigned long long)t->uid, t->latent_first,
                          t->latent_first + t->n_latents - 1, t->n_steps);
    return rollout_decoder_decode(d, core_traj_latent(t, t->n_steps), video);
}

void rollout_pipeline_free(rollout_pipeline *p) {
    text_cond_free(p->text); /* first: its umT5 may hold device memory */
    p->text = NULL;
    if (p->dx) {
        wan_dev_exec_forget(p->dx, &p->model[0]);
        wan_dev_exec_forget(p->dx, &p->model[1]);
        wan_dev_exec_close(p->dx);
    }
    wan_model_free(&p->model[0]);
    wan_model_free(&p->model[1]);
    wan_lora_free(&p->lora[0]);
    wan_lora_free(&p->lora[1]);
    rollout_decoder_free(&p->dec);
    memset(p, 0, sizeof *p);
}
