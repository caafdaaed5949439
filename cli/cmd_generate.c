/* cli/cmd_generate.c — `vgrpo generate --pipeline DIR --prompt "..." --out out.mp4 [options]`: text to video with a
 * WanPipeline folder, as diffusers' WanPipeline.__call__ does with FlowMatchEulerDiscreteScheduler:
 *
 *   prompt, negative prompt -> tokenizer + umT5 (model/text/t5_prompt.h; max_sequence_length 512, zero-padded)
 *   latents [C, T, h, w] = normals of Philox (seed, slot 0, uid 0, CORE_STREAM_EVAL_NOISE)   (DESIGN.md section 4)
 *   per step i: expert = transformer, or transformer_2 when the pipeline has one and timestep < boundary_ratio * 1000
 *               (flow_expert); v = v_u + g (v_c - v_u) with g = --guidance (transformer) or --guidance-2
 *               (transformer_2); x <- x + v dt (flow_sde_step with eta 0: the Euler ODE step)
 *   VAE: un-normalise, decode, map to U8 (vae_latents_to_u8) -> out.mp4 (16 fps) + a PNG contact sheet out.png
 *
 * T = (frames - 1) / 4 + 1 latent frames, h = height / 8, w = width / 8 (factors of the VAE: 4 and 8 for Wan 2.1,
 * 4 and 16 for Wan 2.2). Checked before any sampling, each with a message naming it: tokenizer.json present, the
 * VAE's z_dim equal to the transformer's in_channels, the encoder's d_model equal to its text_dim, frames = 4k + 1,
 * height and width multiples of the VAE's spatial factor x the transformer's patch size (16 for Wan 2.1, 32 for 2.2).
 * Progress goes to stderr (one line rewritten with \r); a summary with timings to stdout.
 * Limits: the prompt is given on the command line (no prompt file); with two experts and one guidance scale of 1,
 * the unconditional row is still computed at that expert's steps (and ignored); expand_timesteps (Wan 2.2 TI2V) is
 * not read, which is exact for text-to-video (every token has the same timestep).
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/philox.h"
#include "model/flow/flow.h"
#include "model/flow/guidance.h"
#include "model/text/t5_prompt.h"
#include "model/dit/wan_dit.h"
#include "model/vae/wan_vae.h"
#include "rollout/png.h"
#include "rollout/video.h"

#define GEN_TEXT_LEN 512 /* WanPipeline's max_sequence_length */
#define GEN_FPS 16.0     /* Wan's frame rate */
#define GEN_SHEET_COLS 8

typedef struct {
    const char *pipeline, *prompt, *negative, *out;
    int steps, frames, height, width;
    double guidance, guidance2, shift;
    int have_guidance2;
    uint64_t seed;
} gen_args;

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

static void progress(int done, int total, double t0) {
    char bar[31];
    int k = total ? done * 30 / total : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < k ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\rgenerate: [%s] %d/%d steps  %.1f s", bar, done, total, now_s() - t0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* out.mp4 -> out.png (any other name: name + ".png"). */
static void sheet_path(const char *out, char *buf, size_t cap) {
    size_t n = strlen(out);
    if (n > 4 && !strcmp(out + n - 4, ".mp4")) snprintf(buf, cap, "%.*s.png", (int)(n - 4), out);
    else snprintf(buf, cap, "%s.png", out);
}

static int generate(const gen_args *a) {
    char path[4200];
    int rc = -1, two = 0;
    double boundary = 0, t_start = now_s(), t_enc = 0, t_sample = 0, t_dec = 0;
    tok_tokenizer *tok = NULL;
    t5_encoder *enc = NULL;
    vae_model *vae = NULL;
    wan_model dit[2];
    int n_dit = 0;
    wan_acts *acts[2] = {NULL, NULL};
    float *emb = NULL, *x = NULL, *xin = NULL, *vout = NULL, *v = NULL, *ts = NULL;
    uint8_t *video = NULL;
    if (read_index(a->pipeline, &two, &boundary)) goto done;
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", a->pipeline);
    if (!is_file(path)) {
        core_error("tokenizer.json is missing: %s does not exist (the pipeline needs tokenizer/tokenizer.json)", path);
        goto done;
    }
    if (!(tok = tok_load(path))) goto done;
    for (int e = 0; e < 1 + two; e++, n_dit++) {
        snprintf(path, sizeof path, "%s/%s", a->pipeline, e ? "transformer_2" : "transformer");
        if (wan_model_load(&dit[e], path)) goto done;
    }
    const wan_config *dc = &dit[0].cfg;
    if (two && !wan_config_equal(dc, &dit[1].cfg)) {
        core_error("%s: transformer and transformer_2 have different configs", a->pipeline);
        goto done;
    }
    snprintf(path, sizeof path, "%s/vae", a->pipeline);
    if (!(vae = vae_load(path))) goto done;
    const vae_config *vc = vae_get_config(vae);
    if (vc->z_dim != dc->in_channels || dc->out_channels != dc->in_channels) {
        core_error("%s: the VAE's z_dim is %d but the transformer's in_channels is %d (out_channels %d): the VAE does "
                   "not belong to this transformer",
                   path, vc->z_dim, dc->in_channels, dc->out_channels);
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
    const int L = GEN_TEXT_LEN, D = dc->text_dim, C = dc->in_channels;
    const int T = (a->frames - 1) / ft + 1, h = a->height / sf, w = a->width / sf;
    const int64_t ne = (int64_t)L * D, nl = (int64_t)C * T * h * w;
    const int cfg_on = flow_cfg_active((float)a->guidance) || (two && flow_cfg_active((float)a->guidance2));
    const int rows = cfg_on ? 2 : 1;
    emb = malloc(sizeof(float) * (size_t)(2 * ne));
    x = malloc(sizeof(float) * (size_t)nl);
    xin = malloc(sizeof(float) * (size_t)(rows * nl));
    vout = malloc(sizeof(float) * (size_t)(rows * nl));
    v = malloc(sizeof(float) * (size_t)nl);
    ts = malloc(sizeof(float) * (size_t)rows);
    video = malloc((size_t)a->frames * a->height * a->width * 3);
    if (!emb || !x || !xin || !vout || !v || !ts || !video) {
        core_error("out of memory for a %d x %d x %d video", a->frames, a->height, a->width);
        goto done;
    }
    double t0 = now_s();
    const char *texts[2] = {a->prompt, a->negative};
    int64_t lens[2];
    if (t5_encode_prompts(enc, tok, texts, 2, L, 2, emb, lens)) goto done;
    t_enc = now_s() - t0;

    /* sampling */
    float sigmas[1001], timesteps[1000];
    if (flow_schedule(a->steps, a->shift, sigmas, timesteps)) {
        core_error_push("--shift / --steps: ");
        goto done;
    }
    wan_shape sh = {.B = rows, .F = T, .H = h, .W = w, .L = L};
    for (int e = 0; e < n_dit; e++)
        if (!(acts[e] = wan_acts_new(&dit[e].cfg, &sh, WAN_ACTS_INFER))) goto done;
    core_philox_normal(x, nl, a->seed, 0, 0, CORE_STREAM_EVAL_NOISE);
    t0 = now_s();
    progress(0, a->steps, t0);
    for (int i = 0; i < a->steps; i++) {
        const int e = two ? flow_expert(timesteps[i], boundary) : 0;
        const float g = (float)(e ? a->guidance2 : a->guidance);
        const int r = flow_cfg_active(g) ? rows : 1;
        for (int k = 0; k < rows; k++) memcpy(xin + k * nl, x, sizeof(float) * (size_t)nl), ts[k] = timesteps[i];
        if (wan_forward(&dit[e], acts[e], NULL, vout, xin, ts, emb)) goto done;
        if (r == 2) flow_cfg_combine(v, vout, vout + nl, g, nl);
        else memcpy(v, vout, sizeof(float) * (size_t)nl);
        flow_step st;
        if (flow_sde_step(x, v, NULL, NULL, nl, sigmas[i], sigmas[i + 1], sigmas[1], 0.0f, NULL, x, &st)) goto done;
        progress(i + 1, a->steps, t0);
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
    const char *codec = NULL;
    if (rollout_video_write_mp4(a->out, video, a->frames, a->height, a->width, GEN_FPS, NULL, &codec)) goto done;
    sheet_path(a->out, path, sizeof path);
    const char *label[1] = {a->prompt};
    if (rollout_png_write_sheet(path, video, 1, a->frames, a->height, a->width, GEN_SHEET_COLS, label)) goto done;
    printf("generate: %s (%d frames, %d x %d, %s) and %s\n"
           "generate: %d steps%s, guidance %g; encode %.2f s, sampling %.2f s, decode %.2f s, total %.2f s\n",
           a->out, a->frames, a->height, a->width, codec, path, a->steps, two ? " (two experts)" : "", a->guidance,
           t_enc, t_sample, t_dec, now_s() - t_start);
    rc = 0;
done:
    tok_free(tok);
    t5_free(enc);
    vae_free(vae);
    for (int e = 0; e < n_dit; e++) wan_acts_free(acts[e]), wan_model_free(&dit[e]);
    free(emb), free(x), free(xin), free(vout), free(v), free(ts), free(video);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    gen_args a = {.negative = "", .steps = 20, .frames = 9, .height = 64, .width = 64, .guidance = 5.0,
                  .shift = 5.0};
    const opts_spec opts[] = {
        {.name = "pipeline", .type = OPTS_STRING, .str = &a.pipeline, .required = 1, .meta = "DIR",
         .help = "WanPipeline folder (model_index.json, transformer/, text_encoder/, tokenizer/,\n"
                 "vae/; transformer_2/ for two experts), e.g. from `vgrpo init-model --preset tiny`"},
        {.name = "prompt", .type = OPTS_STRING, .str = &a.prompt, .required = 1, .meta = "TEXT", .help = "the prompt"},
        {.name = "out", .type = OPTS_STRING, .str = &a.out, .required = 1, .meta = "OUT.mp4",
         .help = "the video; the contact sheet goes next to it (OUT.png)"},
        {.name = "negative-prompt", .type = OPTS_STRING, .str = &a.negative, .meta = "TEXT",
         .help = "negative prompt for classifier-free guidance (default: empty)"},
        {.name = "steps", .type = OPTS_INT, .i = &a.steps, .min = 1, .max = 1000, .meta = "N",
         .help = "sampling steps (default 20)"},
        {.name = "guidance", .type = OPTS_DOUBLE, .d = &a.guidance, .meta = "G",
         .help = "guidance scale (default 5.0; 1 = no unconditional pass)"},
        {.name = "guidance-2", .type = OPTS_DOUBLE, .d = &a.guidance2, .seen = &a.have_guidance2, .meta = "G",
         .help = "guidance scale of transformer_2 (default: --guidance)"},
        {.name = "shift", .type = OPTS_DOUBLE, .d = &a.shift, .meta = "X",
         .help = "flow shift of the sigma schedule (default 5.0)"},
        {.name = "seed", .type = OPTS_U64, .u64 = &a.seed, .meta = "S", .help = "noise seed (default 0)"},
        {.name = "frames", .type = OPTS_INT, .i = &a.frames, .min = 1, .max = 100000, .meta = "F",
         .help = "video frames, 4k + 1 (default 9)"},
        {.name = "height", .type = OPTS_INT, .i = &a.height, .min = 1, .max = 16384, .meta = "H",
         .help = "pixels, a multiple of 16 (Wan 2.1 VAE) or 32 (Wan 2.2 VAE) (default 64)"},
        {.name = "width", .type = OPTS_INT, .i = &a.width, .min = 1, .max = 16384, .meta = "W",
         .help = "pixels, likewise (default 64)"},
        {0}};
    const opts_cmd cmd = {.name = "generate", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (!a.have_guidance2) a.guidance2 = a.guidance;
    if (generate(&a)) {
        fprintf(stderr, "vgrpo generate: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
