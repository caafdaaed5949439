/* trainer/budget/budget.c — the estimate of trainer/budget/budget.h: the model's configs found without loading weights, the model's
 * limits, memory per process and phase, and the FLOPs of a step. The DiT's activation sizes, the VAE decoder's
 * parameters and decode state and umT5's weights are the models' own (wan_acts_plan_bytes: the counting pass of
 * model/dit/wan_acts.c; vae_decoder_estimate: the planning walk of model/vae/wan_vae_decode.c; t5_param_floats), not
 * replayed here. */
#include "trainer/budget/budget.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/prompts.h"
#include "core/trajectory.h"
#include "media/png.h" /* media_png_probe: the sizes of the input images */
#include "model/flow/flow.h"
#include "model/dit/wan_lora.h"
#include "model/flow/guidance.h"
#include "model/vae/wan_vae_encode.h"
#include "reward/learned.h"
#include "trainer/step/grpo.h"
#include "trainer/optim/lora.h"
#include "trainer/optim/train_dev.h"
#include "trainer/dp/zero.h"

#define F32 4.0

/* ---------------------------------------------------------------------------------------------------------------
 * DiT: activations and FLOPs */

/* Bytes of the DiT's activations for a call of this shape: what wan_acts_new_sp allocates (wan_acts_plan_bytes);
 * 0 for a shape the model refuses (it says so when the job allocates). */
static double dit_acts(const wan_config *c, const wan_shape *shape, wan_acts_mode mode, int sp) {
    const size_t b = wan_acts_plan_bytes(c, shape, mode, sp);
    if (!b) core_error_clear();
    return (double)b;
}

double budget_dit_flop(const wan_config *c, int64_t S, int L) {
    const double D = wan_dim(c), Fd = c->ffn_dim, s = (double)S, l = L;
    const double P = (double)c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
    const double block = 12 * s * D * D + 4 * s * s * D + 4 * s * l * D + 4 * l * D * D + 4 * s * D * Fd;
    const double embed = 2 * s * c->in_channels * P * D + 2 * s * D * c->out_channels * P + /* patch, proj_out */
                         2 * l * c->text_dim * D + 2 * l * D * D +                          /* text embedder */
                         2 * c->freq_dim * D + 2 * D * D + 12 * D * D;                      /* time embedder */
    return c->num_layers * block + embed;
}

/* ---------------------------------------------------------------------------------------------------------------
 * VAE decoder: parameters and decode state */

/* The model's own figures (vae_decoder_estimate: the layer list vae_load builds, the decode state's planning walk);
 * 0 and 0 for a config the decoder refuses (it says so when the job loads it). */
static void vae_bytes(const vae_config *c, int h, int w, double *params, double *state_bytes) {
    if (vae_decoder_estimate(c, h, w, params, state_bytes)) {
        core_error_clear();
        *params = *state_bytes = 0;
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * The model's configs, found without loading weights */

/* umT5-XXL (the text_encoder/config.json of the Wan-AI Diffusers pipelines) and the tiny preset's (model/text/tiny_text.h). */
static const t5_config t5_xxl = {256384, 4096, 64, 10240, 24, 64, 32, 128, 1e-6f};

/* The preset whose name is path's last folder lower-cased without "-diffusers", or NULL. */
static const char *preset_by_name(const char *path) {
    char b[256];
    const char *s = path;
    size_t n = strlen(path);
    while (n > 0 && path[n - 1] == '/') n--;
    for (size_t i = 0; i < n; i++)
        if (path[i] == '/') s = path + i + 1;
    size_t k = (size_t)(path + n - s);
    if (k == 0 || k >= sizeof b) return NULL;
    for (size_t i = 0; i < k; i++) b[i] = (char)tolower((unsigned char)s[i]);
    b[k] = 0;
    if (k > 10 && !strcmp(b + k - 10, "-diffusers")) b[k - 10] = 0;
    for (const char *const *p = wan_preset_names(); *p; p++)
        if (!strcmp(*p, b)) return *p;
    return NULL;
}

/* A Wan VAE config as JSON text: tiny (model/vae/tiny_vae.h), Wan 2.2 (TI2V-5B: z 48) or Wan 2.1 (diffusers'
 * defaults). */
static int preset_vae(vae_config *v, const char *preset, int z) {
    char buf[4096];
    size_t o;
    if (!strcmp(preset, "tiny") || !strcmp(preset, "tiny-ti2v") || !strcmp(preset, "tiny-i2v"))
        o = (size_t)snprintf(buf, sizeof buf, "{\"base_dim\": 4, \"dim_mult\": [1, 2, 2, 2], \"num_res_blocks\": 1, "
                                              "\"temperal_downsample\": [false, true, true], \"z_dim\": %d", z);
    else if (z == 48)
        o = (size_t)snprintf(buf, sizeof buf, "{\"base_dim\": 160, \"decoder_base_dim\": 256, \"z_dim\": 48, "
                                              "\"is_residual\": true, \"in_channels\": 12, \"out_channels\": 12, "
                                              "\"patch_size\": 2, \"scale_factor_spatial\": 16");
    else o = (size_t)snprintf(buf, sizeof buf, "{\"z_dim\": %d", z);
    for (int k = 0; k < 2 && o < sizeof buf; k++) {
        o += (size_t)snprintf(buf + o, sizeof buf - o, ", \"%s\": [", k ? "latents_std" : "latents_mean");
        for (int i = 0; i < z && o < sizeof buf; i++) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%d", i ? ", " : "", k);
        if (o < sizeof buf) o += (size_t)snprintf(buf + o, sizeof buf - o, "]");
    }
    if (o + 2 >= sizeof buf) return core_error("budget: VAE preset text too long");
    strcat(buf, "}");
    return vae_config_parse(v, buf, "VAE preset");
}

static int read_vae_config(vae_config *v, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return core_error("%s: cannot open", path);
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return core_error("out of memory");
    buf[n] = 0;
    const int rc = vae_config_parse(v, buf, path);
    free(buf);
    return rc;
}

/* The transformer's config: model.path/transformer/config.json, else the preset the job would write or the folder
 * name names. 0, 1 (none found; source says why), -1 (error). *preset: the preset used, or NULL. */
static int find_dit(const core_recipe *r, wan_config *c, int *n_experts, char *source, size_t cap, const char **preset) {
    char path[4400];
    *preset = NULL;
    snprintf(path, sizeof path, "%s/transformer/config.json", r->model_path);
    if (!access(path, R_OK)) {
        if (wan_config_load(c, path)) return -1;
        snprintf(path, sizeof path, "%s/transformer_2", r->model_path);
        *n_experts = core_is_dir(path) ? 2 : 1;
        snprintf(source, cap, "%s/transformer/config.json", r->model_path);
        return 0;
    }
    const int init = r->init_preset && r->init_preset[0];
    const char *p = init ? r->init_preset : preset_by_name(r->model_path);
    if (!p) {
        snprintf(source, cap, "%s/transformer/config.json does not exist yet and no preset names it (model.init_preset)",
                 r->model_path);
        return 1;
    }
    if (wan_config_preset(c, p)) return core_error_push("model.init_preset: ");
    *n_experts = strstr(p, "a14b") || !strcmp(p, "tiny-i2v") ? 2 : 1;
    snprintf(source, cap, "preset %s (%s; %s has no transformer yet)", p, init ? "model.init_preset" : "model.path's folder name",
             r->model_path);
    *preset = p;
    return 0;
}

int budget_vae_config(const core_recipe *r, int z_dim, vae_config *v) {
    char path[4400];
    snprintf(path, sizeof path, "%s/vae/config.json", r->model_path);
    if (!access(path, R_OK)) return read_vae_config(v, path) ? -1 : 1;
    snprintf(path, sizeof path, "%s/transformer/config.json", r->model_path);
    const char *preset = budget_model_preset(r);
    if (access(path, R_OK) && preset) return preset_vae(v, preset, z_dim) ? -1 : 1;
    return 0;
}

const char *budget_model_preset(const core_recipe *r) {
    return r->init_preset && r->init_preset[0] ? r->init_preset : preset_by_name(r->model_path);
}

int budget_transformer_config(const core_recipe *r, wan_config *c, int *n_experts, char *source, size_t cap) {
    const char *preset;
    char buf[700];
    int n = 1;
    const int rc = find_dit(r, c, &n, source ? source : buf, source ? cap : sizeof buf, &preset);
    if (n_experts) *n_experts = n;
    return rc;
}

/* Fills e's model fields. 0, 1 (no transformer config), -1 (error). */
static int find_model(budget_estimate *e, const core_recipe *r) {
    char path[4400];
    const char *preset = NULL;
    const int found = find_dit(r, &e->dit, &e->n_experts, e->source, sizeof e->source, &preset);
    if (found) return found;
    wan_layout lay;
    if (wan_layout_init(&lay, &e->dit)) return -1;
    e->params = lay.numel;
    wan_layout_free(&lay);
    if (r->choice.text_encoder == CORE_TEXT_UMT5) {
        snprintf(path, sizeof path, "%s/text_encoder/config.json", r->model_path);
        if (!access(path, R_OK)) {
            snprintf(path, sizeof path, "%s/text_encoder", r->model_path);
            if (t5_config_load(path, &e->t5)) return -1;
            e->have_t5 = 1;
        } else if (preset) {
            const int dm = e->dit.text_dim;
            e->t5 = !strncmp(preset, "tiny", 4) ? (t5_config){160, dm, 16, 2 * dm, 2, dm / 16 > 0 ? dm / 16 : 1, 32, 128, 1e-6f}
                                            : t5_xxl;
            e->have_t5 = 1;
        }
    }
    /* the VAE's config: the decoder's (model.decoder vae) and the image encoder's (prompt files with images) */
    snprintf(path, sizeof path, "%s/vae/config.json", r->model_path);
    if (!access(path, R_OK)) {
        if (read_vae_config(&e->vae, path)) return -1;
        e->have_vae_config = 1;
    } else if (preset) {
        if (preset_vae(&e->vae, preset, e->dit.out_channels)) return -1;
        e->have_vae_config = 1;
    }
    e->have_vae = e->have_vae_config && r->choice.decoder == CORE_DECODER_VAE;
    return 0;
}

/* What model/dit, model/vae and model/text require of the recipe's sizes (see the top of budget.h). */
static int check_limits(const budget_estimate *e, const core_recipe *r) {
    const wan_config *c = &e->dit;
    const int *p = c->patch_size, rope = c->rope_max_seq_len, fac = r->vae_scale_factor_spatial;
    if (e->F % p[0] || e->H % p[1] || e->W % p[2])
        return core_error("rollout.frames / rollout.height / rollout.width: the latent %d x %d x %d is not divisible by "
                          "the transformer's patch (%d, %d, %d) (%s)", e->F, e->H, e->W, p[0], p[1], p[2], e->source);
    const int Fp = e->F / p[0], Hp = e->H / p[1], Wp = e->W / p[2];
    if (Fp > rope)
        return core_error("rollout.frames: %d frames are %d latent frames, %d patches along time, past the transformer's "
                          "rope_max_seq_len %d (%s): at most %d frames", r->frames, e->F, Fp, rope, e->source,
                          (rope * p[0] - 1) * 4 + 1);
    if (Hp > rope)
        return core_error("rollout.height: %d pixels are %d patches, past the transformer's rope_max_seq_len %d (%s): at "
                          "most %d", r->height, Hp, rope, e->source, rope * p[1] * fac);
    if (Wp > rope)
        return core_error("rollout.width: %d pixels are %d patches, past the transformer's rope_max_seq_len %d (%s): at "
                          "most %d", r->width, Wp, rope, e->source, rope * p[2] * fac);
    /* Wan 2.2 I2V-A14B: latents, a 4-channel mask and the condition video's latents in (36), the latents out (16);
     * the estimate takes it (the sampler runs it with an image condition per sample: rollout/engine.c) */
    if (wan_cond_kind(c) == WAN_COND_UNKNOWN)
        return core_error("model.path: the transformer has %d input and %d output channels (%s); sampling needs them "
                          "equal (or 2 x out + 4: Wan 2.2 I2V-A14B)", c->in_channels, c->out_channels, e->source);
    if (e->have_vae || e->have_enc) { /* the decoder's, or the image encoder's (the same config) */
        const vae_config *v = &e->vae;
        if (v->scale_factor_spatial != fac)
            return core_error("model.vae_scale_factor_spatial: %d, but the VAE in %s/vae has spatial factor %d (Wan "
                              "2.1's VAE 8, Wan 2.2's 16): set model.vae_scale_factor_spatial: %d", fac, r->model_path,
                              v->scale_factor_spatial, v->scale_factor_spatial);
        if (v->scale_factor_temporal != 4)
            return core_error("rollout.frames: the VAE's temporal factor is %d (%s); vgrpo decodes Wan's 4 (frames 4k+1)",
                              v->scale_factor_temporal, r->model_path);
        if (v->z_dim != c->out_channels) /* named by what uses the VAE: latent_rgb leaves it the image encoder's */
            return core_error("%s z_dim is %d, the transformer's out_channels %d (%s)",
                              e->have_vae ? "model.decoder: the VAE's" : "image conditions: the VAE encoder's", v->z_dim,
                              c->out_channels, r->model_path);
    }
    if (e->have_t5 && e->t5.d_model != c->text_dim)
        return core_error("model.text_encoder: the text encoder's d_model is %d, the transformer's text_dim %d (%s)",
                          e->t5.d_model, c->text_dim, r->model_path);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Memory per process */

static void add(budget_proc *p, const char *name, const char *keys, unsigned phases, double bytes) {
    if (!(bytes > 0) || p->n_parts == BUDGET_MAX_PARTS) return;
    p->part[p->n_parts++] = (budget_part){name, keys, phases, bytes};
}

static void finish(budget_proc *p) {
    double always = 0, best = 0;
    for (int i = 0; i < p->n_parts; i++)
        if (!p->part[i].phases) always += p->part[i].bytes;
    for (unsigned ph = 1; ph <= BUDGET_SYNC; ph <<= 1) {
        double s = 0;
        for (int i = 0; i < p->n_parts; i++)
            if (p->part[i].phases & ph) s += p->part[i].bytes;
        if (s > best) best = s;
    }
    p->peak = always + best;
}

#define K_TRAJ "rollout.prompts_per_step, rollout.samples_per_prompt, rollout.num_steps, rollout.height, rollout.width, rollout.frames"
#define K_SIZE "rollout.height, rollout.width, rollout.frames"
#define K_ROLL "rollout.batch_size, " K_SIZE ", rollout.guidance_scale"
#define K_EVAL "data.eval_samples_per_prompt, data.eval_prompt_file, rollout.num_steps, " K_SIZE
#define K_TRAIN "algorithm.micro_batch_size, algorithm.activations, " K_SIZE
#define K_EMB "data.prompt_file, data.eval_prompt_file, rollout.text_len"
#define K_ZERO "parallel.zero_stage, parallel.trainer_ranks"

/* The per-job sizes the parts are made from. */
typedef struct {
    const core_recipe *r;
    const budget_estimate *e;
    int64_t nl, ne;        /* latent floats per sample, conditioning floats per prompt */
    int64_t nin;           /* the model's input floats per sample: nl, or I2V-A14B's latent + concatenated condition */
    double traj;           /* bytes of one trajectory as the rollout makes it (every latent; step means for GRPO-Guard) */
    double traj_kept;      /* bytes of one as the trainer keeps it (an SDE window's latents only) */
    double weights;        /* bytes of one expert's weights */
    int cfg_any, nocfg_any; /* some rollout step with CFG / without */
    int cfg_train;         /* some trained step with CFG */
    int video_frames;      /* decoded frames */
    double video;          /* U8 bytes of one decoded video */
    wan_lora_config lora;  /* model.lora (rank 0: none) */
    double adapters;       /* LoRA: bytes of the trained experts' adapters together (0 without LoRA) */
    int dev;               /* model.device cuda: the DiT's activations and gradients live on the GPU (trainer/optim/
                              train_dev.h), not here; the host keeps the fp32 weights, AdamW's host state, the flow's
                              rows (x, enc, out, dout) and what is not the DiT's */
    int vae_dev;           /* the VAE decodes on the GPU (model.vae_device auto with model.device cuda): its decode
                              state is device memory; the host keeps its fp32 weights */
} sizes;

/* The DiT's shape for a call of B rows: timesteps [B], or [B, S] for image to video through the latent (TI2V's
 * first-frame conditioning, model/flow/denoise.h's per_token; I2V-A14B's concatenated condition keeps one per row). */
static wan_shape dit_shape(const sizes *z, int B) {
    const int per_token = z->e->n_images > 0 && wan_cond_kind(&z->e->dit) == WAN_COND_LATENT;
    return (wan_shape){.B = B, .F = z->e->F, .H = z->e->H, .W = z->e->W, .L = z->r->text_len,
                       .per_token_timestep = per_token};
}

/* LoRA's two [rows, r] scratch buffers of one wan_acts (model/dit/wan_lora.h: wan_lora_scratch_floats). */
static double lora_scratch(const sizes *z, int B, int sp) {
    if (z->lora.rank < 1) return 0;
    const wan_shape sh = dit_shape(z, B);
    return F32 * (double)wan_lora_scratch_floats(&z->e->dit, &z->lora, &sh, sp);
}

/* The sampler's activations and scratch for a call of n samples (chunks of rollout.batch_size). */
static double rollout_bytes(const sizes *z, int n) {
    const int b = n < z->r->batch_size ? n : z->r->batch_size;
    const wan_config *c = &z->e->dit;
    const wan_shape two = dit_shape(z, 2 * b), one = dit_shape(z, b);
    double a = 0;
    if (z->cfg_any && !z->dev) a += dit_acts(c, &two, WAN_ACTS_INFER, 1) + lora_scratch(z, 2 * b, 1);
    if (z->nocfg_any && !z->dev) a += dit_acts(c, &one, WAN_ACTS_INFER, 1) + lora_scratch(z, b, 1);
    return a + F32 * (2.0 * b * (z->nin + z->nl) + 2.0 * b * z->ne + z->nl); /* the step's x, out, enc; eps */
}

/* The decoder: its weights and decode state (held once decoded) and, while decoding, the fp32 video. */
static void decoder_parts(budget_proc *p, const sizes *z, unsigned phases) {
    const budget_estimate *e = z->e;
    if (e->have_vae) {
        double params, state;
        vae_bytes(&e->vae, e->H, e->W, &params, &state);
        if (z->vae_dev) /* the decode state and the bf16 copy are device memory */
            add(p, "VAE decoder (fp32 weights; decodes on the GPU)", "model.decoder, model.vae_device", 0, F32 * params);
        else
            add(p, "VAE decoder (weights, decode state)", "model.decoder, rollout.height, rollout.width", 0,
                F32 * params + state);
        add(p, "decoded video (fp32, one sample)", K_SIZE, phases, F32 * z->video);
    }
}

/* Image to video: the conditions of n prompts, held the whole job, and while the images are encoded at start-up the
 * VAE encoder (weights, encode state) and one image's buffers (trainer/run/images.c: the trainer's rank 0 or the eval
 * process encodes; counted on every trainer rank, which the conditions reach in the trajectories). */
static void image_parts(budget_proc *p, const sizes *z, int n) {
    const budget_estimate *e = z->e;
    if (!e->have_enc) return;
    add(p, "image conditions", "data.prompt_file, data.eval_prompt_file, " K_SIZE, 0,
        F32 * (double)e->cond_floats * n);
    add(p, "image encoder (VAE encoder, one image)", "data.prompt_file, rollout.height, rollout.width", BUDGET_START,
        F32 * e->enc_params + e->enc_state + e->enc_pixels);
}

/* The trainer's parts for a micro-batch of the training pass (forward only for parity). */
static void train_parts(budget_proc *p, const sizes *z, int samples, int backward) {
    const core_recipe *r = z->r;
    const budget_estimate *e = z->e;
    const int64_t per = e->transitions / ((int64_t)r->prompts_per_step * r->samples_per_prompt);
    const int64_t mine = per * samples;
    const int cap = (int)(r->micro_batch_size < mine ? r->micro_batch_size : mine);
    /* two rows per CFG transition, and per dpo term (the preferred and the rejected sample) */
    const int rows = cap * (z->cfg_train || r->choice.loss == CORE_LOSS_DPO ? 2 : 1), sp = r->sp > 0 ? r->sp : 1;
    const wan_acts_mode mode = !backward ? WAN_ACTS_INFER
                               : r->choice.activations == CORE_ACTS_RECOMPUTE ? WAN_ACTS_RECOMPUTE
                                                                               : WAN_ACTS_STORE;
    const wan_shape sh = dit_shape(z, rows);
    if (!z->dev) { /* on a GPU the activations are the device's (trainer/optim/train_dev.h) */
        add(p, backward ? "training activations" : "recompute activations", K_TRAIN, BUDGET_TRAIN,
            dit_acts(&e->dit, &sh, mode, sp) + lora_scratch(z, rows, sp));
        if (r->beta > 0)
            add(p, "reference activations", "algorithm.beta, " K_TRAIN, BUDGET_TRAIN,
                dit_acts(&e->dit, &sh, WAN_ACTS_INFER, sp));
        if (core_recipe_forward_process(r)) /* nft's old policy's forward, dpo's reference's (nft_step.h, dpo_step.h) */
            add(p, r->choice.loss == CORE_LOSS_DPO ? "reference activations" : "old policy activations",
                "algorithm.loss, " K_TRAIN, BUDGET_TRAIN,
                dit_acts(&e->dit, &sh, WAN_ACTS_INFER, sp));
    }
    /* the step's rows x, enc, out and dout (model/flow/denoise.h); the SDE means and reference means; dv */
    add(p, "training scratch", K_TRAIN, BUDGET_TRAIN,
        F32 * (2.0 * cap * (2.0 * z->nl + z->nin + z->ne) + 2.0 * cap * z->nl + z->nl));
}

/* Weights, gradients, AdamW, reference and EMA of the trainer; prompt embeddings; the text encoder at start-up.
 * With LoRA the base is frozen: no gradients or moments of its own, no reference copy (the KL reference is the same
 * weights with the adapters off); the adapters have gradients and moments, and the EMA averages them. */
static void trainer_common(budget_proc *p, const sizes *z, int ema) {
    const core_recipe *r = z->r;
    const budget_estimate *e = z->e;
    const double W = z->weights * e->n_experts;
    add(p, e->n_experts > 1 ? "weights (2 experts)" : "weights", "model.path", 0, W);
    const int zero = e->zero_stage > 0 && e->zero_ranks > 1; /* trainer/dp/zero.h: m, v of this rank's shard */
    if (z->lora.rank > 0) {
        add(p, "LoRA adapters", "model.lora.rank, model.lora.targets", 0, z->adapters);
        if (zero) {
            add(p, "adapter gradients", "model.lora.rank, model.lora.targets", 0, z->adapters);
            add(p, "adapter AdamW m, v (this rank's shard)", K_ZERO, 0, e->adam_shard);
        } else {
            add(p, "adapter gradients + AdamW m, v", "model.lora.rank, model.lora.targets", 0, 3 * z->adapters);
        }
        if (ema && r->ema_decay > 0) add(p, "EMA of the adapters", "algorithm.ema_decay", 0, z->adapters);
        if (r->choice.loss == CORE_LOSS_NFT) add(p, "old policy's adapters", "algorithm.loss", 0, z->adapters);
    } else {
        /* on a GPU the gradients are the device's (the host keeps AdamW's state, as checkpoints read it) */
        if (zero) {
            if (!z->dev) add(p, "gradients", "model.path", 0, W);
            add(p, "AdamW m, v (this rank's shard)", "model.path, " K_ZERO, 0, e->adam_shard);
        } else {
            add(p, z->dev ? "AdamW m, v" : "gradients + AdamW m, v", "model.path", 0, (z->dev ? 2 : 3) * W);
        }
        if (trainer_dev_expert_window(r, e->n_experts)) /* trainer/dp/dp_dev.h: transformer's reduced shard */
            add(p, "transformer's gradient shard (the expert window)", K_ZERO, BUDGET_TRAIN, e->shard);
        if (r->beta > 0) add(p, "KL reference weights", "algorithm.beta", 0, W);
        if (ema && r->ema_decay > 0) add(p, "EMA weights", "algorithm.ema_decay", 0, W);
        if (core_recipe_forward_process(r))
            add(p, r->choice.loss == CORE_LOSS_DPO ? "reference weights" : "old policy weights", "algorithm.loss", 0, W);
    }
    add(p, "prompt embeddings", K_EMB, 0, F32 * (double)(e->n_train_prompts + e->n_eval_prompts + 1) * z->ne);
}

/* umT5's weights (t5_param_floats: the embedding stays mapped), its activations for L tokens (the hidden states,
 * q, k, v, attention output, the gated FFN's, one head's scores: an estimate, not the allocations one by one) and the
 * tokenizer's pieces. */
static double t5_bytes(const t5_config *t, int L) {
    const double d = t->d_model, inner = (double)t->num_heads * t->d_kv;
    const double acts = (double)L * (8 * d + 3.0 * t->d_ff + 4 * inner) + (double)t->num_heads * L * L;
    return F32 * ((double)t5_param_floats(t) + acts) + 64.0 * t->vocab_size; /* + the tokenizer's pieces */
}

/* On the host: the encoder's weights and activations, or with umT5 on the GPU (core_recipe_text_on_device) the fp32
 * copy t5_load makes until t5_to_device frees it (start-up only), the tokenizer and the forward's host staging (the
 * looked-up embedding rows and the output, fp32); its weights then count in the device estimate. */
static void text_encoder_part(budget_proc *p, const sizes *z, unsigned phases) {
    const t5_config *t = &z->e->t5;
    if (!z->e->have_t5) return;
    if (!core_recipe_text_on_device(z->r)) {
        add(p, "text encoder (umT5) + tokenizer", "model.text_encoder", phases, t5_bytes(t, z->r->text_len));
        return;
    }
    add(p, "text encoder (umT5) fp32 weights, freed once on the GPU", "model.text_encoder, model.text_device",
        BUDGET_START, F32 * (double)t5_param_floats(t));
    add(p, "text encoder (umT5) tokenizer + staging (weights on the GPU)", "model.text_encoder, model.text_device",
        phases, 2.0 * F32 * z->r->text_len * t->d_model + 64.0 * t->vocab_size);
}

/* A rollout worker: the pipeline, the embedding cache, one chunk of samples, its reply, a staged weight sync. */
static void worker_proc(budget_proc *p, const sizes *z, int eval_only, int videos_back, int velocities) {
    const core_recipe *r = z->r;
    const budget_estimate *e = z->e;
    const int n = eval_only ? e->n_eval_prompts * r->eval_samples_per_prompt : r->prompts_per_step * r->samples_per_prompt;
    const int b = n < r->batch_size ? n : r->batch_size;
    const unsigned ph = eval_only ? BUDGET_EVAL : BUDGET_ROLLOUT | BUDGET_EVAL;
    add(p, "runtime", "", 0, BUDGET_RUNTIME_MIB * 1048576.0);
    add(p, e->n_experts > 1 ? "weights (2 experts)" : "weights", "model.path", 0, z->weights * e->n_experts);
    add(p, "LoRA adapters", "model.lora.rank, model.lora.targets", 0, z->adapters);
    text_encoder_part(p, z, 0);
    add(p, "prompt embeddings (cache)", K_EMB, 0, F32 * (double)(e->n_train_prompts + e->n_eval_prompts + 1) * z->ne);
    decoder_parts(p, z, ph);
    const double vel = velocities ? F32 * (double)r->num_steps * z->nl : 0;
    add(p, "trajectories of a chunk", "rollout.batch_size, rollout.num_steps, " K_SIZE, ph, b * (z->traj + vel));
    add(p, z->dev ? "rollout inputs + outputs (the DiT on the GPU)" : "rollout activations + scratch", K_ROLL, ph,
        rollout_bytes(z, b));
    add(p, "videos of a chunk (U8)", "rollout.batch_size, " K_SIZE, ph, b * z->video);
    add(p, "reply message", "rollout.batch_size, " K_SIZE, ph, b * (z->traj + vel + (videos_back ? z->video : 0)));
    if (!eval_only) /* LoRA: only the adapters are synced (and staged) */
        add(p, "staged weight sync", z->lora.rank > 0 ? "model.lora.rank, model.lora.targets" : "model.path",
            BUDGET_SYNC, z->lora.rank > 0 ? z->adapters : z->weights * e->n_experts);
}

/* The learned scorers' models (reward/learned.h: parameters from their configs, one call's scratch). */
static void learned_parts(budget_proc *p, const sizes *z, unsigned phases, int batched) {
    double params, act;
    reward_recipe_models_bytes(z->r, batched, &params, &act);
    add(p, "learned reward models (F32)", "reward.models", 0, params);
    add(p, "learned reward scratch (one call)", "reward.models, reward.frames, " K_SIZE, phases, act);
}

static void reward_proc(budget_proc *p, const sizes *z) {
    const int b = z->r->batch_size;
    add(p, "runtime", "", 0, BUDGET_RUNTIME_MIB * 1048576.0);
    add(p, "videos of a request (message + copy)", "rollout.batch_size, " K_SIZE, BUDGET_ROLLOUT, 2.0 * b * z->video);
    learned_parts(p, z, BUDGET_ROLLOUT, 1); /* the server scores a request's videos together */
}

static budget_proc *proc(budget_estimate *e, const char *name, int count) {
    budget_proc *p = &e->proc[e->n_procs++];
    memset(p, 0, sizeof *p);
    p->name = name, p->count = count;
    return p;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The estimate */

/* Per-step facts of the schedule: which steps have CFG, how many transitions a sample trains, rows per sample. */
static int schedule_facts(budget_estimate *e, const core_recipe *r, sizes *z, double *cfg_steps, double *train_rows) {
    const int N = r->num_steps;
    float *sig = malloc(sizeof(float) * (size_t)(N + 1)), *ts = malloc(sizeof(float) * (size_t)(N + 1));
    uint8_t *has = malloc((size_t)N), *ex = malloc((size_t)N), *cfg = malloc((size_t)N);
    int *steps = malloc(sizeof(int) * (size_t)N), rc = -1, k = 0;
    grpo_selection sel;
    if (!sig || !ts || !has || !ex || !cfg || !steps) {
        core_error("out of memory");
        goto done;
    }
    if (flow_schedule(N, r->shift, sig, ts) || grpo_selection_parse(r->timestep_selection, &sel)) goto done;
    *cfg_steps = 0;
    const flow_kind kind = {r->choice.sde_type == CORE_SDE_TYPE_CPS ? FLOW_CPS : FLOW_SDE,
                            r->choice.cps_logprob == CORE_CPS_LOGP_FLOW_GRPO ? FLOW_LOGP_FLOW_GRPO : FLOW_LOGP_EXACT};
    const int wlo = r->sde_window_size > 0 && r->sde_window_range.n == 2 ? (int)r->sde_window_range.v[0] : 0;
    const int whi = r->sde_window_size > 0 ? wlo + r->sde_window_size : N; /* a window's first position */
    const int fp = core_recipe_forward_process(r); /* nft: every step a candidate, trained CFG-free */
    for (int i = 0; i < N; i++) {
        flow_step st;
        if (flow_step_init_kind(&st, kind, sig[i], sig[i + 1], sig[1], r->eta)) goto done;
        has[i] = (uint8_t)((st.has_std || fp) && i >= wlo && i < whi); /* a forward-process objective: every step */
        ex[i] = (uint8_t)(e->n_experts == 2 ? flow_expert(ts[i], r->boundary_ratio) : 0);
        cfg[i] = (uint8_t)flow_cfg_active(ex[i] ? r->guidance_scale_2 : r->guidance_scale);
        *cfg_steps += cfg[i] ? 2 : 1;
        z->cfg_any |= cfg[i], z->nocfg_any |= !cfg[i];
    }
    const uint8_t trained[2] = {core_recipe_trains_expert(r, 0), e->n_experts == 2 && core_recipe_trains_expert(r, 1)};
    int64_t per = 0;
    /* a recipe the trainer refuses (checked before) leaves no transitions: estimate rollout only */
    if ((trained[0] || trained[1]) &&
        !grpo_select_steps_experts(&sel, N, has, ex, trained, e->n_experts, (uint64_t)r->seed, 0, steps, &k)) {
        grpo_count_transitions_experts(&sel, N, has, ex, 0, 1, trained, e->n_experts, &per);
    }
    core_error_clear();
    *train_rows = 0;
    for (int j = 0; j < k; j++) {
        *train_rows += cfg[steps[j]] && !fp ? 2 : 1;
        z->cfg_train |= cfg[steps[j]] && !fp;
    }
    e->transitions = per * r->prompts_per_step * r->samples_per_prompt;
    rc = 0;
done:
    free(sig), free(ts), free(has), free(ex), free(cfg), free(steps);
    return rc;
}

static int read_prompts(const core_recipe *r, const char *path, core_prompts *p) {
    const core_prompts_limits lim = core_recipe_prompt_limits(r);
    return core_prompts_read_limited(p, path, &lim);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Distinct image files over the n lists (each encoded once: trainer/run/images.c), and in *max_px the largest one's
 * pixels as its PNG header states them (media_png_probe). -1 out of memory, or an image's header refused. */
static int distinct_images(const core_prompts *const *lists, int n, double *max_px) {
    int total = 0, k = 0;
    for (int i = 0; i < n; i++) total += lists[i]->n_images ? lists[i]->n : 0;
    const char **v = malloc(sizeof(char *) * (size_t)(total > 0 ? total : 1));
    if (!v) return core_error("out of memory");
    for (int i = 0; i < n; i++)
        for (int j = 0; lists[i]->n_images && j < lists[i]->n; j++) v[k++] = lists[i]->image[j];
    qsort(v, (size_t)k, sizeof *v, cmp_str);
    int d = 0, w, h;
    *max_px = 0;
    for (int j = 0; j < k; j++)
        if (!j || strcmp(v[j], v[j - 1])) {
            d++;
            if (media_png_probe(v[j], &w, &h)) return free(v), -1;
            if ((double)w * h > *max_px) *max_px = (double)w * h;
        }
    free(v);
    return d;
}

/* Bytes of one image's buffers while it is encoded (trainer/run/images.c, rollout/text_to_video.c): the PNG decoded at
 * its own size (src_px pixels), stretched to H x W (U8), as floats in [-1, 1]; I2V-A14B (cat) also the condition
 * video [3, frames, H, W]. */
static double image_buffers(double src_px, int H, int W, int cat, int frames) {
    const double px = (double)H * W;
    return 3 * src_px + 3 * px + F32 * 3 * px + (cat ? F32 * 3.0 * frames * px : 0);
}

/* Floats of one prompt's condition on latent T x h x w: I2V-A14B's [in - out, T, h, w] (mask and condition video
 * latents), else TI2V's first frame [out, 1, h, w]. */
static int64_t cond_floats(const wan_config *c, int64_t T, int64_t h, int64_t w) {
    return wan_cond_kind(c) == WAN_COND_CONCAT ? (int64_t)wan_cond_channels(c) * T * h * w
                                               : (int64_t)c->out_channels * h * w;
}

/* Image to video: the encoder's sizes and work (e->n_images distinct images, conditions per prompt) from the VAE
 * config (vae_encoder_estimate); TI2V encodes the image alone, I2V-A14B [image, zeros] as a rollout.frames video. */
static int image_encoder(budget_estimate *e, const core_recipe *r) {
    const wan_config *c = &e->dit;
    const int cat = wan_cond_kind(c) == WAN_COND_CONCAT; /* I2V-A14B: K = in - out channels concatenated */
    const int frames = cat ? r->frames : 1;
    double flop;
    if (vae_encoder_estimate(&e->vae, frames, r->height, r->width, &e->enc_params, &e->enc_state, &flop))
        return core_error_push("image conditions: %s/vae: ", r->model_path);
    e->flop_images = flop * e->n_images;
    e->enc_pixels = image_buffers(e->src_pixels, r->height, r->width, cat, frames); /* the largest source image */
    e->cond_floats = cond_floats(c, e->F, e->H, e->W);
    return 0;
}

int budget_estimate_job(budget_estimate *e, const core_recipe *r, const budget_request *q) {
    memset(e, 0, sizeof *e);
    const int found = find_model(e, r);
    if (found) return found;
    core_recipe_latent_size(r, &e->F, &e->H, &e->W);
    const budget_job job = q ? q->job : BUDGET_JOB_RUN;
    e->job = job;
    core_prompts pt = {0}, pe = {0};
    if ((job != BUDGET_JOB_EVAL && read_prompts(r, r->prompt_file, &pt)) ||
        read_prompts(r, job == BUDGET_JOB_EVAL && q->eval_prompts ? q->eval_prompts : r->eval_prompt_file, &pe)) {
        core_prompts_free(&pt);
        return -1;
    }
    e->n_train_prompts = job != BUDGET_JOB_EVAL ? pt.n : 0, e->n_eval_prompts = pe.n;
    const core_prompts *lists[2] = {&pe, &pt};
    e->n_images = pe.n_images ? distinct_images(lists, job != BUDGET_JOB_EVAL ? 2 : 1, &e->src_pixels) : 0;
    core_prompts_free(&pt), core_prompts_free(&pe);
    if (e->n_images < 0) return -1;
    e->have_enc = e->n_images > 0 && e->have_vae_config;
    if (check_limits(e, r) || (e->have_enc && image_encoder(e, r))) return -1;
    const wan_config *c = &e->dit;
    e->tokens = (int64_t)(e->F / c->patch_size[0]) * (e->H / c->patch_size[1]) * (e->W / c->patch_size[2]);
    sizes z = {.r = r, .e = e, .dev = r->choice.device == CORE_CUDA};
    z.vae_dev = z.dev && r->choice.decoder == CORE_DECODER_VAE && r->choice.vae_device == CORE_VAE_DEVICE_AUTO;
    /* the latent has out_channels (I2V-A14B: 16 of its 36 inputs; the trajectory keeps the concatenated condition
     * once, core_traj.concat) */
    z.nl = (int64_t)c->out_channels * e->F * e->H * e->W;
    z.nin = (int64_t)c->in_channels * e->F * e->H * e->W;
    z.ne = (int64_t)r->text_len * c->text_dim;
    const int N = r->num_steps;
    const int guard = r->choice.loss == CORE_LOSS_GRPO_GUARD, W = r->sde_window_size;
    /* ... and TI2V's its first-frame condition [C, 1, H, W] (core_traj.condition) */
    const double concat = F32 * (double)(z.nin - z.nl) +
                          (e->n_images > 0 && z.nin == z.nl ? F32 * (double)(z.nl / e->F) : 0);
    z.traj = F32 * ((double)(N + 1 + (guard ? N : 0)) * z.nl + 3.0 * N + 1) + 2.0 * N + sizeof(core_traj) + concat;
    z.traj_kept = W > 0 ? F32 * ((double)(W + 1 + (guard ? W : 0)) * z.nl + 3.0 * N + 1) + 2.0 * N +
                              sizeof(core_traj) + concat
                        : z.traj;
    z.weights = F32 * (double)e->params;
    if (trainer_lora_config(r, c, &z.lora) < 0) return -1;
    if (z.lora.rank > 0) {
        const int n_ad = core_recipe_trains_expert(r, 0) + (e->n_experts == 2 && core_recipe_trains_expert(r, 1));
        e->lora_params = wan_lora_numel(c, &z.lora);
        e->n_adapters = n_ad;
        z.adapters = F32 * (double)e->lora_params * n_ad;
    }
    /* AdamW m and v of every buffer that has them (trainer/dp/zero.h): whole, and the largest rank's shard */
    e->zero_stage = r->zero_stage;
    e->zero_ranks = r->choice.mode == CORE_MODE_LOCAL ? 1 : r->trainer_ranks;
    {
        const int64_t nb = z.lora.rank > 0 ? e->lora_params : e->params;
        const int nbuf = z.lora.rank > 0 ? e->n_adapters : e->n_experts;
        int64_t most = 0;
        for (int k = 0; k < e->zero_ranks; k++) {
            int64_t lo, len;
            dp_zero_shard(nb, k, e->zero_ranks, &lo, &len);
            most = len > most ? len : most;
        }
        e->adam_whole = 2 * F32 * (double)nb * nbuf;
        e->shard = F32 * (double)(e->zero_stage > 0 ? most : nb);
        e->adam_shard = 2 * e->shard * nbuf;
    }
    z.video_frames = e->have_vae ? r->frames : e->F;
    z.video = (double)z.video_frames * r->height * r->width * 3;
    double cfg_steps, rows;
    if (schedule_facts(e, r, &z, &cfg_steps, &rows)) return -1;
    const int n_step = r->prompts_per_step * r->samples_per_prompt;
    const int n_eval = e->n_eval_prompts * r->eval_samples_per_prompt;
    const double fwd = budget_dit_flop(c, e->tokens, r->text_len);
    /* forward + backward (3 forwards' work), the KL reference's forward, nft's old policy forward */
    const double train_pass =
        rows * n_step * fwd * (3.0 + (r->beta > 0 ? 1.0 : 0.0) + (core_recipe_forward_process(r) ? 1.0 : 0.0));
    const int local = job == BUDGET_JOB_RUN && r->choice.mode == CORE_MODE_LOCAL;
    e->cuda_only = r->choice.device == CORE_CUDA ? 2 : !local && job != BUDGET_JOB_EVAL && wan_dim(c) >= 1536;
    if (job == BUDGET_JOB_EVAL) {
        const int M = q->workers > 0 ? q->workers : r->rollout_workers;
        e->flop_rollout = cfg_steps * n_eval * fwd;
        worker_proc(proc(e, "rollout worker", M), &z, 1, 1, 0);
        if (!r->reward_endpoint) reward_proc(proc(e, "reward server", 1), &z);
        budget_proc *p = proc(e, "eval process", 1);
        add(p, "runtime", "", 0, BUDGET_RUNTIME_MIB * 1048576.0);
        image_parts(p, &z, e->n_eval_prompts);
    } else if (local) {
        e->flop_rollout = cfg_steps * n_step * fwd;
        e->flop_train = train_pass * r->optimizer_steps_per_rollout;
        e->flop_eval = cfg_steps * n_eval * fwd;
        budget_proc *p = proc(e, "local process", 1);
        add(p, "runtime", "", 0, BUDGET_RUNTIME_MIB * 1048576.0);
        trainer_common(p, &z, 1);
        text_encoder_part(p, &z, BUDGET_START);
        image_parts(p, &z, e->n_train_prompts + e->n_eval_prompts);
        decoder_parts(p, &z, BUDGET_ROLLOUT | BUDGET_EVAL);
        add(p, "trajectories of a step", K_TRAJ, BUDGET_ROLLOUT | BUDGET_TRAIN, n_step * z.traj_kept);
        add(p, z.dev ? "rollout inputs + outputs (the DiT on the GPU)" : "rollout activations + scratch", K_ROLL,
            BUDGET_ROLLOUT, rollout_bytes(&z, n_step));
        train_parts(p, &z, n_step, 1);
        add(p, "eval trajectories (all at once)", K_EVAL, BUDGET_EVAL, n_eval * z.traj);
        add(p, z.dev ? "eval inputs + outputs (the DiT on the GPU)" : "eval activations + scratch",
            "rollout.batch_size, " K_SIZE, BUDGET_EVAL, rollout_bytes(&z, n_eval));
        add(p, "video (U8)", K_SIZE, BUDGET_ROLLOUT | BUDGET_EVAL, z.video * (r->video_every > 0 ? 5 : 1));
        learned_parts(p, &z, BUDGET_ROLLOUT | BUDGET_EVAL, 0);
    } else {
        const int parity = job == BUDGET_JOB_PARITY, R = r->trainer_ranks, dp = R / (r->sp > 0 ? r->sp : 1);
        const int share = (n_step + dp - 1) / dp;
        e->flop_rollout = cfg_steps * n_step * fwd;
        e->flop_train = parity ? rows * n_step * fwd * (1.0 + (r->beta > 0 ? 1.0 : 0.0))
                               : train_pass * r->optimizer_steps_per_rollout;
        e->flop_eval = parity ? 0 : cfg_steps * n_eval * fwd;
        budget_proc *p = proc(e, "trainer rank", R);
        add(p, "runtime", "", 0, BUDGET_RUNTIME_MIB * 1048576.0);
        trainer_common(p, &z, 1);
        text_encoder_part(p, &z, BUDGET_START);
        image_parts(p, &z, e->n_train_prompts + e->n_eval_prompts);
        const double vel = parity ? 2 * F32 * (double)N * z.nl * n_step : 0; /* the rollout's and the recomputed */
        add(p, parity ? "trajectories + velocities of the batch" : "trajectories of a step", K_TRAJ,
            BUDGET_ROLLOUT | BUDGET_TRAIN, n_step * z.traj_kept + vel);
        add(p, "received message (one chunk)", "rollout.batch_size, " K_SIZE, BUDGET_ROLLOUT,
            (n_step < r->batch_size ? n_step : r->batch_size) * z.traj_kept);
        train_parts(p, &z, share, !parity);
        worker_proc(proc(e, "rollout worker", r->rollout_workers), &z, 0, 0, parity);
        if (!r->reward_endpoint) reward_proc(proc(e, "reward server", 1), &z);
        add(proc(e, "supervisor", 1), "runtime", "", 0, BUDGET_RUNTIME_MIB * 1048576.0);
    }
    for (int i = 0; i < e->n_procs; i++) {
        finish(&e->proc[i]);
        e->total += e->proc[i].count * e->proc[i].peak;
    }
    return 0;
}

int budget_generate_bytes(budget_generate *g, const char *pipeline, int frames, int height, int width, int rows,
                          int text_len, double image_px) {
    memset(g, 0, sizeof *g);
    char path[4200];
    wan_config c;
    vae_config v;
    snprintf(path, sizeof path, "%s/transformer/config.json", pipeline);
    if (access(path, R_OK)) return 1;
    if (wan_config_load(&c, path)) return -1;
    snprintf(path, sizeof path, "%s/vae/config.json", pipeline);
    if (access(path, R_OK)) return 1;
    if (read_vae_config(&v, path)) return -1;
    wan_layout lay;
    if (wan_layout_init(&lay, &c)) return -1;
    const double params = (double)lay.numel;
    wan_layout_free(&lay);
    snprintf(path, sizeof path, "%s/transformer_2", pipeline);
    g->experts = core_is_dir(path) ? 2 : 1;
    const int fac = v.scale_factor_spatial > 0 ? v.scale_factor_spatial : 8;
    const int64_t T = 1 + (frames > 1 ? (frames - 1) / 4 : 0), h = height / fac, w = width / fac;
    g->tokens = (T / c.patch_size[0]) * (h / c.patch_size[1]) * (w / c.patch_size[2]);
    g->weights = F32 * params * g->experts;
    const wan_shape sh = {.B = rows, .F = (int)T, .H = (int)h, .W = (int)w, .L = text_len};
    g->acts = g->experts * dit_acts(&c, &sh, WAN_ACTS_INFER, 1);
    g->flop_step = rows * budget_dit_flop(&c, g->tokens, text_len);
    double vp, vs;
    vae_bytes(&v, (int)h, (int)w, &vp, &vs);
    g->vae = F32 * vp + vs;
    t5_config t;
    snprintf(path, sizeof path, "%s/text_encoder/config.json", pipeline);
    if (!access(path, R_OK)) {
        snprintf(path, sizeof path, "%s/text_encoder", pipeline);
        if (t5_config_load(path, &t)) return -1;
        g->text = t5_bytes(&t, text_len);
    }
    const double nl = (double)c.out_channels * T * h * w, nin = (double)c.in_channels * T * h * w;
    g->other = F32 * (rows * (nin + nl) + 6.0 * nl) + (double)frames * height * width * 3 * (1 + F32);
    if (image_px > 0) { /* rollout/text_to_video.c: the encoder is kept to the end; as image_encoder above */
        const int cat = wan_cond_kind(&c) == WAN_COND_CONCAT;
        double ep, es, flop;
        if (vae_encoder_estimate(&v, cat ? frames : 1, height, width, &ep, &es, &flop))
            return core_error_push("--image: %s/vae: ", pipeline);
        g->image = F32 * ep + es + image_buffers(image_px, height, width, cat, frames) + F32 * cond_floats(&c, T, h, w);
    }
    g->total = g->weights + g->acts + g->vae + g->text + g->image + g->other + BUDGET_RUNTIME_MIB * 1048576.0;
    return 0;
}
