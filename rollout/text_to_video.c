/* rollout/text_to_video.c — text to video with a WanPipeline folder: umT5, DiT sampling (flow-matching ODE, CFG,
 * two-expert routing), VAE. The contract is in rollout/text_to_video.h. Moved here from cli/cmd_generate.c. */
#include "rollout/text_to_video.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/error.h"
#include "core/philox.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "media/image.h"
#include "model/vae/wan_vae_i2v.h"
#include "model/flow/denoise.h"
#include "model/flow/first_frame.h"
#include "model/flow/flow.h"
#include "model/flow/guidance.h"
#include "model/text/t5_prompt.h"
#include "model/vae/wan_vae.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* model_index.json: whether transformer_2 is a component (a non-null entry and its folder), and boundary_ratio. */
static int read_index(const char *dir, int *two, double *boundary) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return core_error("%s: cannot read (%s)", path, je.text);
    json_t *t2 = json_object_get(root, "transformer_2"), *br = json_object_get(root, "boundary_ratio");
    *two = json_is_array(t2) && json_is_string(json_array_get(t2, 0));
    *boundary = 0.0;
    int rc = 0;
    if (*two) {
        if (!json_is_number(br) || json_number_value(br) <= 0 || json_number_value(br) >= 1)
            rc = core_error("%s: \"boundary_ratio\" must be a number in (0, 1) when transformer_2 is present", path);
        else *boundary = json_number_value(br);
    }
    json_decref(root);
    return rc;
}

/* Expert e's folder: a->transformer (e 0) and its "_2" sibling when that is a folder (e 1), else the pipeline's. */
static void expert_dir(const rollout_t2v_args *a, int e, char *out, size_t cap) {
    struct stat st;
    if (a->transformer) {
        snprintf(out, cap, "%s%s", a->transformer, e ? "_2" : "");
        if (!e || (stat(out, &st) == 0 && S_ISDIR(st.st_mode))) return;
    }
    snprintf(out, cap, "%s/%s", a->pipeline, e ? "transformer_2" : "transformer");
}

/* 1 when path is a LoRA adapter wan_lora_inspect accepts; 0 when it holds none (nothing that looks like one: the
 * error is cleared); -1 when it holds one that is refused (the error names the file and key). */
static int adapter_at(const char *path) {
    char f[4300];
    struct stat st;
    if (stat(path, &st)) return 0;
    int looks = S_ISREG(st.st_mode);
    const char *names[2] = {WAN_LORA_DIFFUSERS_FILE, WAN_LORA_PEFT_FILE};
    for (int k = 0; k < 2 && !looks; k++) snprintf(f, sizeof f, "%s/%s", path, names[k]), looks = is_file(f);
    if (!looks) return 0;
    wan_lora_config c;
    wan_lora_format fmt;
    return wan_lora_inspect(path, &c, &fmt, NULL, 0) ? -1 : 1;
}

int rollout_checkpoint_weights(const char *dir, char *out, size_t cap, int *adapter) {
    char probe[4300];
    *adapter = 0;
    snprintf(probe, sizeof probe, "%s/transformer/config.json", dir);
    const int full = is_file(probe);
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    if (full || is_file(probe)) return rollout_checkpoint_transformer(dir, out, cap);
    /* a LoRA checkpoint: transformer/ and/or transformer_2/ hold adapters; or an adapter folder or file itself */
    for (int e = 0; e < 2; e++) {
        snprintf(probe, sizeof probe, "%s/%s", dir, e ? "transformer_2" : "transformer");
        const int a = adapter_at(probe);
        if (a < 0) return core_error_push("LoRA checkpoint %s: ", dir);
        if (a) {
            snprintf(out, cap, "%s/transformer", dir);
            *adapter = 1;
            return 0;
        }
    }
    const int a = adapter_at(dir);
    if (a < 0) return -1;
    if (a) {
        snprintf(out, cap, "%s", dir);
        *adapter = 1;
        return 0;
    }
    return core_error("%s has neither transformer/config.json (a checkpoint-N folder of `vgrpo run`) nor config.json "
                      "(a transformer folder), nor a LoRA adapter (" WAN_LORA_DIFFUSERS_FILE " or " WAN_LORA_PEFT_FILE
                      ": a LoRA checkpoint's transformer/, or an adapter folder)", dir);
}

/* rollout_checkpoint_fits for one expert: transformer_dir/config.json against pipeline/<folder>/config.json. */
static int expert_fits(const char *transformer_dir, const char *pipeline, const char *folder, const char *flag) {
    char a[4400], b[4400], diff[512] = "";
    snprintf(a, sizeof a, "%s/config.json", transformer_dir);
    snprintf(b, sizeof b, "%s/%s/config.json", pipeline, folder);
    if (!is_file(b)) return 0; /* nothing to compare with: the pipeline's own loading says what is missing */
    wan_config x, y;
    if (wan_config_load(&x, a)) return core_error_push("%s: ", flag);
    if (wan_config_load(&y, b)) return -1;
    if (wan_config_equal(&x, &y)) return 0;
    size_t n = 0;
#define FIT_DIFF(name, u, v)                                                                                      \
    if ((u) != (v) && n < sizeof diff)                                                                             \
        n += (size_t)snprintf(diff + n, sizeof diff - n, "%s%s %d here, %d there", n ? ", " : "", name, (int)(u), (int)(v));
    FIT_DIFF("in_channels", x.in_channels, y.in_channels)
    FIT_DIFF("out_channels", x.out_channels, y.out_channels)
    FIT_DIFF("dim", wan_dim(&x), wan_dim(&y))
    FIT_DIFF("num_layers", x.num_layers, y.num_layers)
    FIT_DIFF("ffn_dim", x.ffn_dim, y.ffn_dim)
    FIT_DIFF("text_dim", x.text_dim, y.text_dim)
#undef FIT_DIFF
    return core_error("%s: %s is another transformer than %s (%s): a checkpoint runs on the pipeline it was trained "
                      "from", flag, a, b, n ? diff : "other settings");
}

int rollout_checkpoint_fits(const char *transformer_dir, const char *pipeline, const char *flag) {
    char two[4300];
    snprintf(two, sizeof two, "%s_2", transformer_dir); /* expert 1's, beside it (a checkpoint-N's transformer_2) */
    struct stat st;
    return expert_fits(transformer_dir, pipeline, "transformer", flag) ||
           (stat(two, &st) == 0 && S_ISDIR(st.st_mode) && expert_fits(two, pipeline, "transformer_2", flag)) ? -1 : 0;
}

int rollout_checkpoint_transformer(const char *dir, char *out, size_t cap) {
    char probe[4300];
    snprintf(probe, sizeof probe, "%s/transformer/config.json", dir);
    if (is_file(probe)) {
        snprintf(out, cap, "%s/transformer", dir);
        return 0;
    }
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    if (is_file(probe)) {
        snprintf(out, cap, "%s", dir);
        return 0;
    }
    return core_error("%s has neither transformer/config.json (a checkpoint-N folder of `vgrpo run`) nor config.json "
                      "(a transformer folder)", dir);
}

int rollout_text_to_video(const rollout_t2v_args *a, uint8_t *video, rollout_t2v_stats *stats) {
    char path[4200];
    int rc = -1, two = 0;
    double boundary = 0, t_enc = 0, t_sample = 0, t_dec = 0;
    tok_tokenizer *tok = NULL;
    t5_encoder *enc = NULL;
    vae_model *vae = NULL;
    wan_model dit[2];
    wan_lora lora[2];
    memset(lora, 0, sizeof lora);
    int n_dit = 0;
    wan_exec_acts *acts[2] = {NULL, NULL}; /* [cfg off, cfg on] */
    flow_denoise step = {0};
    float *emb = NULL, *x = NULL, *cond = NULL, *work = NULL;
    float *eps = NULL, *xn = NULL; /* eta > 0: the step's noise and the next latent */
    vae_encoder *venc = NULL;
    if (!(a->eta >= 0 && a->eta <= 1e6)) return core_error("--eta %g: must be finite and >= 0", a->eta);
    if (a->uid > 0xffffffffull) return core_error("--uid %llu: over 2^32 - 1", (unsigned long long)a->uid);
    if (read_index(a->pipeline, &two, &boundary)) goto done;
    const int ff_pipe = a->image ? flow_ff_pipeline_conditions(a->pipeline) : 0; /* 1: TI2V first-frame */
    if (ff_pipe < 0) goto done;
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", a->pipeline);
    if (!is_file(path)) {
        core_error("tokenizer.json is missing: %s does not exist (the pipeline needs tokenizer/tokenizer.json)", path);
        goto done;
    }
    if (!(tok = tok_load(path))) goto done;
    if (a->transformer && rollout_checkpoint_fits(a->transformer, a->pipeline, "--checkpoint")) goto done;
    for (int e = 0; e < 1 + two; e++, n_dit++) {
        expert_dir(a, e, path, sizeof path);
        if (wan_model_load(&dit[e], path)) goto done;
    }
    int n_ad = 0;
    for (int e = 0; a->adapter && e < n_dit; e++) { /* LoRA: expert 0's at a->adapter, expert 1's at its _2 sibling */
        struct stat sb;
        snprintf(path, sizeof path, "%s%s", a->adapter, e ? "_2" : "");
        if (stat(path, &sb)) continue;
        if (wan_lora_load(&lora[e], &dit[e].cfg, path, e) || wan_model_attach_lora(&dit[e], &lora[e])) goto done;
        n_ad++;
    }
    if (a->adapter && !n_ad) {
        core_error("%s: no LoRA adapter there%s", a->adapter, n_dit > 1 ? " (nor in its _2 sibling)" : "");
        goto done;
    }
    const wan_config *dc = &dit[0].cfg;
    if (two && !wan_config_equal(dc, &dit[1].cfg)) {
        char p2[4200];
        expert_dir(a, 0, path, sizeof path), expert_dir(a, 1, p2, sizeof p2);
        core_error("%s and %s have different configs (two experts must match)", path, p2);
        goto done;
    }
    /* Wan 2.2 I2V-A14B (model/vae/wan_vae_i2v.h): latents, a 4-channel mask and the condition video's latents in */
    const int cat = wan_cond_kind(dc) == WAN_COND_CONCAT;
    if (a->image && ff_pipe != 1 && !cat) {
        core_error("--image: %s is a text-to-video pipeline (its model_index.json has no \"expand_timesteps\": "
                   "true and its transformer takes as many channels as it gives); image to video needs a Wan 2.2 TI2V "
                   "pipeline (init-model presets wan2.2-ti2v-5b, tiny-ti2v) or a Wan 2.2 I2V-A14B one (wan2.2-i2v-a14b, "
                   "tiny-i2v)", a->pipeline);
        goto done;
    }
    if (cat && !a->image) {
        core_error("%s is an image-to-video pipeline (Wan 2.2 I2V-A14B: its transformer takes %d channels for %d out): "
                   "give the first frame with --image PNG", a->pipeline, dc->in_channels, dc->out_channels);
        goto done;
    }
    snprintf(path, sizeof path, "%s/vae", a->pipeline);
    if (!(vae = vae_load(path))) goto done;
    const vae_config *vc = vae_get_config(vae);
    if (vc->z_dim != dc->out_channels || wan_cond_kind(dc) == WAN_COND_UNKNOWN) {
        core_error("%s: the VAE's z_dim is %d but the transformer's out_channels is %d (in_channels %d): the VAE does "
                   "not belong to this transformer",
                   path, vc->z_dim, dc->out_channels, dc->in_channels);
        goto done;
    }
    const int ft = vae_frames_out(vae, 2) - 1, sf = vae_spatial_factor(vae);
    const int mh = sf * dc->patch_size[1], mw = sf * dc->patch_size[2];
    if (a->frames < 1 || (a->frames - 1) % ft) {
        core_error("--frames %d is not %dk+1 (the VAE decodes T latent frames to 1 + %d (T - 1) frames)", a->frames, ft,
                   ft);
        goto done;
    }
    if (a->height % mh || a->width % mw || a->height < mh || a->width < mw) {
        core_error("--height %d / --width %d: both must be positive multiples of %d (the VAE's spatial factor %d x "
                   "the transformer's patch size %d)",
                   a->height, a->width, mh, sf, dc->patch_size[1]);
        goto done;
    }
    snprintf(path, sizeof path, "%s/text_encoder", a->pipeline);
    if (!(enc = t5_load(path))) goto done;
    if (t5_get_config(enc)->d_model != dc->text_dim) {
        core_error("%s: the text encoder's d_model is %d but the transformer's text_dim is %d", path,
                   t5_get_config(enc)->d_model, dc->text_dim);
        goto done;
    }

    /* text */
    const int L = ROLLOUT_T2V_TEXT_LEN, D = dc->text_dim, C = dc->out_channels, cc = wan_cond_channels(dc);
    const int T = (a->frames - 1) / ft + 1, h = a->height / sf, w = a->width / sf;
    const int64_t ne = (int64_t)L * D, nl = (int64_t)C * T * h * w;
    const int ti2v = a->image && !cat; /* first-frame conditioning; else cat: the condition concatenated */
    /* image to video: per-token timesteps over S = T x tokens per frame (one-frame patches), the step over frames
     * 1 .. T-1 */
    if (ti2v && (T < 2 || dc->patch_size[0] != 1)) {
        core_error("--image: %s", T < 2 ? "--frames must give at least 2 latent frames (5 or more): the first is the "
                                         "image's" : "the transformer's patch must be one frame deep");
        goto done;
    }
    const int64_t shape[4] = {C, T, h, w};
    if (flow_denoise_init(&step, dc, shape, L, ti2v, 1, 0)) goto done;
    emb = malloc(sizeof(float) * (size_t)(2 * ne));
    x = malloc(sizeof(float) * (size_t)nl);
    if (ti2v) cond = malloc(sizeof(float) * (size_t)(nl / T)), work = malloc(sizeof(float) * (size_t)(5 * nl));
    if (cat) cond = malloc(sizeof(float) * (size_t)cc * T * h * w);
    if (a->eta > 0) eps = malloc(sizeof(float) * (size_t)nl), xn = malloc(sizeof(float) * (size_t)nl);
    if (!emb || !x || (a->image && !cond) || (ti2v && !work) || (a->eta > 0 && (!eps || !xn))) {
        core_error("out of memory for a %d x %d x %d video", a->frames, a->height, a->width);
        goto done;
    }
    double t0 = now_s();
    const char *texts[2] = {a->prompt, a->negative};
    int64_t lens[2];
    if (t5_encode_prompts(enc, tok, texts, 2, L, 2, emb, lens)) goto done;
    if (a->image) { /* the image's latent: stretched, encoded alone, normalised (WanImageToVideoPipeline) */
        snprintf(path, sizeof path, "%s/vae", a->pipeline);
        if (!(venc = vae_encoder_load(path))) {
            core_error_push("--image: ");
            goto done;
        }
        if (cat) { /* I2V-A14B: [image, zeros] encoded as one video, after the mask (model/vae/wan_vae_i2v.h) */
            uint8_t *px = malloc((size_t)3 * a->height * a->width);
            float *img = malloc(sizeof(float) * (size_t)3 * a->height * a->width);
            int bad = !px || !img ? core_error("out of memory for the image") : 0;
            if (!bad) bad = media_image_load(a->image, a->height, a->width, px);
            if (!bad) vae_video_from_u8(px, 1, 1, a->height, a->width, img);
            if (!bad) bad = vae_i2v_condition(venc, img, a->frames, a->height, a->width, cond);
            free(px), free(img);
            if (bad) {
                core_error_push("--image: ");
                goto done;
            }
        } else if (media_image_encode(venc, a->image, a->height, a->width, cond)) {
            core_error_push("--image: ");
            goto done;
        }
    }
    t_enc = now_s() - t0;

    /* sampling */
    float sigmas[1001], timesteps[1000];
    if (flow_schedule(a->steps, a->shift, sigmas, timesteps)) {
        core_error_push("--shift / --steps: ");
        goto done;
    }
    const flow_ff ff = flow_ff_make(shape, ti2v ? cond : NULL);
    for (int e = 0; e < n_dit; e++) { /* one or two rows (CFG) per forward: the activations of each form in use */
        const int k = flow_cfg_active((float)(e ? a->guidance2 : a->guidance));
        if (!acts[k] && !(acts[k] = flow_denoise_acts_new(&step, NULL, 1 + k, WAN_ACTS_INFER))) goto done;
    }
    core_philox_normal(x, nl, a->seed, 0, (uint32_t)a->uid, CORE_STREAM_EVAL_NOISE);
    flow_ff_apply(&ff, x); /* frame 0 is the image's latent (no-op without --image) */
    t0 = now_s();
    if (a->progress) a->progress(a->progress_ctx, 0, a->steps);
    for (int i = 0; i < a->steps; i++) {
        const int e = two ? flow_expert(timesteps[i], boundary) : 0;
        const float g = (float)(e ? a->guidance2 : a->guidance);
        const int k = flow_cfg_active(g);
        step.in[0] = (flow_denoise_sample){x, cat ? cond : NULL, emb, timesteps[i], g};
        if (flow_denoise_build(&step, 1, emb + ne) < 0 || flow_denoise_forward(&step, &dit[e], acts[k], NULL))
            goto done; /* emb + ne: the negative prompt's, the unconditional row's text */
        const float *v = flow_denoise_velocity(&step, 0);
        flow_step st;
        if (a->eta > 0) { /* the SDE step with the eval's noise of this step (rollout/engine.c: slot i + 1) */
            core_philox_normal(eps, nl, a->seed, (uint32_t)(i + 1), (uint32_t)a->uid, CORE_STREAM_EVAL_NOISE);
            if (flow_ff_sde_step(flow_kind_default(), &ff, x, v, eps, NULL, sigmas[i], sigmas[i + 1], sigmas[1],
                                 (float)a->eta, NULL, xn, &st, work))
                goto done;
            memcpy(x, xn, sizeof(float) * (size_t)nl);
        } else if (flow_ff_sde_step(flow_kind_default(), &ff, x, v, NULL, NULL, sigmas[i], sigmas[i + 1], sigmas[1],
                                    0.0f, NULL, x, &st, work))
            goto done;
        if (a->progress) a->progress(a->progress_ctx, i + 1, a->steps);
    }
    t_sample = now_s() - t0;

    /* pixels */
    t0 = now_s();
    if (vae_frames_out(vae, T) != a->frames) {
        core_error("the VAE decodes %d latent frames to %d frames, not %d", T, vae_frames_out(vae, T), a->frames);
        goto done;
    }
    if (vae_latents_to_u8(vae, x, 1, C, T, h, w, video)) goto done;
    t_dec = now_s() - t0;
    if (stats) *stats = (rollout_t2v_stats){.two_experts = two, .encode_s = t_enc, .sample_s = t_sample, .decode_s = t_dec};
    rc = 0;
done:
    tok_free(tok);
    t5_free(enc);
    vae_free(vae);
    for (int e = 0; e < n_dit; e++) wan_model_free(&dit[e]);
    for (int e = 0; e < 2; e++) wan_lora_free(&lora[e]), wan_exec_acts_free(acts[e]);
    flow_denoise_free(&step);
    free(emb), free(x), free(cond), free(work), free(eps), free(xn);
    vae_encoder_free(venc);
    return rc;
}
