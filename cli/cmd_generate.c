/* cli/cmd_generate.c — `vgrpo generate --pipeline DIR --prompt "..." --out out.mp4 [options]`: text to video with a
 * WanPipeline folder (rollout/text_to_video.h: umT5, DiT sampling with CFG and two-expert routing, VAE), written as
 * out.mp4 (16 fps) and a PNG contact sheet out.png (one row, up to 8 evenly spaced frames, labelled with the seed,
 * steps and guidance, under a title band with the prompt: media/png.h). --checkpoint DIR takes
 * the transformer weights from a checkpoint-N folder of `vgrpo run` or a transformer folder
 * (rollout_checkpoint_transformer); a LoRA checkpoint (rollout_checkpoint_weights: its transformer/ holds an adapter,
 * no weights) puts its adapters on the pipeline's own transformer(s). Everything else comes from the pipeline.
 * Progress goes to stderr (cli/progress.h: a bar rewritten with \r on a terminal, else a line per tenth of the
 * steps); a summary with timings to stdout.
 * --recipe FILE samples as that recipe's eval does (cli/generate_recipe.h: model.path, its text encoder and decoder,
 * rollout.height / width / frames / num_steps / shift / guidance_scale[_2], data.eval_eta, data.seed, noise stream 3,
 * the uid of the prompt's first eval sample when data.eval_prompt_file holds it); the flags given override the recipe's
 * values (--pipeline model.path, --eta data.eval_eta, --seed data.seed; --set key=value any key), so that with a run's
 * recipe and checkpoint the video is that eval's, byte for byte (the summary prints its xxh64, eval.json's
 * video_xxh64). Without --recipe the defaults below hold (64 x 64, 9 frames, 20 steps, guidance 5, shift 5, eta 0).
 * Limits: the prompt is given on the command line (no prompt file), at most CORE_PROMPTS_MAX_BYTES (4096) bytes,
 * as a line of a prompt file (core/prompts.h); the negative prompt likewise.
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/generate_memory.h"
#include "cli/generate_recipe.h"
#include "cli/opts.h"
#include "cli/progress.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/prompts.h"
#include "core/wire_rollout.h"
#include "core/recipe.h"
#include "rollout/text_to_video.h"
#include "trainer/checkpoint/checkpoint.h"
#include "media/png.h"
#include "media/video.h"

#define GEN_SHEET_COLS 8
/* --shift: a flow shift outside this range only gives a degenerate schedule (near 0 every sigma but the first
 * collapses to 0 and the SDE step divides by it); Wan's models use 1 .. 17 */
#define GEN_SHIFT_MIN 0.01
#define GEN_SHIFT_MAX 1000.0
#define GEN_GUIDANCE_MAX 1000.0 /* --guidance, --guidance-2: 0 .. this (1: no unconditional pass) */
#define GEN_ETA_MAX 10.0        /* --eta: 0 .. this (data.eval_eta's range) */

typedef struct {
    rollout_t2v_args g;
    const char *out, *checkpoint, *recipe;
    const char *const *sets; /* --set key=value, with --recipe */
    int n_sets;
    int force, seen_uid;
    gen_recipe_given given; /* which flags were given: with --recipe they override the recipe's values */
    char eval_image[4200]; /* --recipe: the image of the prompt in data.eval_prompt_file ("" when none) */
    double t0;      /* start of the sampling loop, for the progress line */
    int stderr_tty; /* the progress line: a bar on a terminal, plain lines elsewhere (cli/progress.h) */
} gen_args;

static void progress(void *ctx, int done, int total) {
    gen_args *a = ctx;
    if (done == 0) a->t0 = cli_progress_now();
    cli_progress(stderr, a->stderr_tty, "generate: sampling steps", done, total, a->t0);
}

/* out.mp4 -> out.png (any other name: name + ".png"). */
static void sheet_path(const char *out, char *buf, size_t cap) {
    size_t n = strlen(out);
    if (n > 4 && !strcmp(out + n - 4, ".mp4")) snprintf(buf, cap, "%.*s.png", (int)(n - 4), out);
    else snprintf(buf, cap, "%s.png", out);
}

/* The mp4 and the contact sheet of video (U8 [frames, h, w, 3]); *codec the encoder used, png the sheet's path.
 * 0 or -1 (core_error). */
static int write_outputs(const gen_args *a, const uint8_t *video, int frames, int h, int w, const char **codec,
                         char *png, size_t cap) {
    const rollout_t2v_args *g = &a->g;
    if (media_video_write_mp4(a->out, video, frames, h, w, ROLLOUT_T2V_FPS, NULL, codec)) return -1;
    sheet_path(a->out, png, cap);
    char label[160];
    snprintf(label, sizeof label, "seed %llu, %d steps, guidance %g%s", (unsigned long long)g->seed, g->steps,
             g->guidance, g->eta > 0 ? ", eta" : "");
    if (g->eta > 0) snprintf(label + strlen(label), sizeof label - strlen(label), " %g", g->eta);
    const char *labels[1] = {label};
    return media_png_write_sheet_titled(png, video, 1, frames, h, w, GEN_SHEET_COLS, g->prompt, labels);
}

/* The output folder before the minutes of sampling, not after. */
static int out_folder_ok(const char *out) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if (slash && dir[0] && (!core_is_dir(dir) || access(dir, W_OK)))
        return core_error("--out: the folder %s does not exist or cannot be written", dir);
    return 0;
}

/* Generates the video and writes the mp4, the sheet and the summary line. Returns 0 or -1 (core_error). */
static int generate(gen_args *a) {
    const rollout_t2v_args *g = &a->g;
    double t_start = cli_progress_now();
    rollout_t2v_stats st;
    char png[4200];
    const char *codec = NULL;
    uint8_t *video = malloc((size_t)g->frames * g->height * g->width * 3);
    if (!video) return core_error("out of memory for a %d x %d x %d video", g->frames, g->height, g->width);
    if (out_folder_ok(a->out)) return free(video), -1;
    int rc = rollout_text_to_video(g, video, &st);
    if (!rc) rc = write_outputs(a, video, g->frames, g->height, g->width, &codec, png, sizeof png);
    const uint64_t hash = rc ? 0 : core_xxh64(video, (size_t)g->frames * g->height * g->width * 3, 0);
    free(video);
    if (rc) return -1;
    if (g->adapter) {
        char sib[4300];
        snprintf(sib, sizeof sib, "%s_2", g->adapter);
        printf("generate: LoRA adapter(s) from %s%s%s on the transformer(s) of %s\n", g->adapter,
               st.two_experts && core_is_dir(sib) ? " and " : "", st.two_experts && core_is_dir(sib) ? sib : "",
               g->pipeline);
    }
    if (g->transformer) {
        char sib[4300], pipe2[4300];
        snprintf(sib, sizeof sib, "%s_2", g->transformer);
        snprintf(pipe2, sizeof pipe2, "%s/transformer_2", g->pipeline);
        printf("generate: transformer weights from %s\n", g->transformer);
        if (st.two_experts) printf("generate: transformer_2 weights from %s\n", core_is_dir(sib) ? sib : pipe2);
        else if (core_is_dir(sib))
            printf("generate: %s not used: the pipeline %s has one expert (no transformer_2 in model_index.json)\n", sib,
                   g->pipeline);
    }
    char hx[17];
    core_hash_hex(hash, hx);
    printf("generate: %s (%d frames, %d x %d, %s) and %s\n"
           "generate: %d steps%s, guidance %g; encode %.2f s, sampling %.2f s, decode %.2f s, total %.2f s\n"
           "generate: video xxh64 %s\n",
           a->out, g->frames, g->height, g->width, codec, png, g->steps, st.two_experts ? " (two experts)" : "",
           g->guidance, st.encode_s, st.sample_s, st.decode_s, cli_progress_now() - t_start, hx);
    return 0;
}

/* --recipe: the recipe with the flags given applied (gen_recipe_apply), the uid of the prompt's first eval sample
 * unless --uid and its image unless --image. */
static int recipe_settings(gen_args *a, core_recipe *r, int *uid_found) {
    rollout_t2v_args *g = &a->g;
    if (core_recipe_load(r, a->recipe, a->sets, a->n_sets)) return core_error_push("--recipe: ");
    if (gen_recipe_apply(r, &a->given, g)) return core_error_push("--recipe %s with the flags given: ", a->recipe);
    uint64_t uid = 0;
    if (gen_recipe_eval_uid(r, g->prompt, &uid, uid_found, a->eval_image, sizeof a->eval_image)) return -1;
    if (!a->seen_uid) g->uid = uid;
    if (!g->image && a->eval_image[0]) g->image = a->eval_image;
    return 0;
}

/* generate --recipe: the video as the recipe's eval samples it (cli/generate_recipe.h), its files and summary. */
static int generate_recipe(gen_args *a, const core_recipe *r, int uid_found) {
    const rollout_t2v_args *g = &a->g;
    const double t_start = cli_progress_now();
    if (out_folder_ok(a->out)) return -1;
    printf("generate: recipe %s: model.path %s, %d x %d, %d frames, %d steps, shift %g, guidance %g", a->recipe,
           r->model_path, r->width, r->height, r->frames, r->num_steps, r->shift, (double)r->guidance_scale);
    if (r->guidance_scale_2 != r->guidance_scale) printf(" (transformer_2: %g)", (double)r->guidance_scale_2);
    printf(", eta %g (data.eval_eta), seed %lld (data.seed), uid %llu", (double)r->eval_eta, (long long)r->seed,
           (unsigned long long)g->uid);
    if (uid_found && !a->seen_uid) printf(" (the first eval sample of this prompt in %s)", r->eval_prompt_file);
    if (g->image == a->eval_image) printf(", image %s (the prompt's in data.eval_prompt_file)", g->image);
    printf("\n");
    fflush(stdout);
    const gen_recipe_args ga = {.r = r, .prompt = g->prompt, .negative = g->negative, .image = g->image,
                                .transformer = g->transformer, .adapter = g->adapter, .uid = g->uid,
                                .progress = progress, .progress_ctx = a};
    gen_recipe_video v;
    if (gen_recipe_generate(&ga, &v)) return -1;
    char png[4200];
    const char *codec = NULL;
    const int rc = write_outputs(a, v.video, v.frames, v.height, v.width, &codec, png, sizeof png);
    char hx[17];
    core_hash_hex(core_xxh64(v.video, (size_t)v.frames * v.height * v.width * 3, 0), hx);
    free(v.video);
    if (rc) return -1;
    if (g->adapter) printf("generate: LoRA adapter(s) from %s on the transformer(s) of %s\n", g->adapter, r->model_path);
    if (g->transformer) printf("generate: transformer weights from %s\n", g->transformer);
    printf("generate: %s (%d frames, %d x %d, %s) and %s\n"
           "generate: %d steps%s, guidance %g, eta %g; encode %.2f s, sampling %.2f s, decode %.2f s, total %.2f s\n"
           "generate: video xxh64 %s\n",
           a->out, v.frames, v.height, v.width, codec, png, g->steps, v.experts > 1 ? " (two experts)" : "",
           g->guidance, g->eta, v.encode_s, v.sample_s, v.decode_s, cli_progress_now() - t_start, hx);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    gen_args a = {.g = {.negative = "", .steps = 20, .frames = 9, .height = 64, .width = 64, .guidance = 5.0,
                  .shift = 5.0}};
    opts_list sets = {.v = calloc((size_t)argc + 1, sizeof(char *)), .cap = argc + 1};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "pipeline", .type = OPTS_STRING, .str = &a.g.pipeline, .seen = &a.given.pipeline, .meta = "DIR",
         .help = "WanPipeline folder (model_index.json, transformer/, text_encoder/, tokenizer/,\n"
                 "vae/; transformer_2/ for two experts), e.g. from `vgrpo init-model --preset tiny`;\n"
                 "required without --recipe (with it: model.path)"},
        {.name = "recipe", .type = OPTS_STRING, .str = &a.recipe, .meta = "FILE",
         .help = "sample as this recipe's eval does: its model.path, text encoder, decoder, size,\n"
                 "steps, shift, guidance, data.eval_eta, data.seed and eval noise (the flags given\n"
                 "override them); with a run's checkpoint the video is that eval's"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "with --recipe: override a recipe key (repeatable)"},
        {.name = "prompt", .type = OPTS_STRING, .str = &a.g.prompt, .required = 1, .meta = "TEXT", .help = "the prompt"},
        {.name = "out", .type = OPTS_STRING, .str = &a.out, .required = 1, .meta = "OUT.mp4",
         .help = "the video; the contact sheet goes next to it (OUT.png)"},
        {.name = "checkpoint", .type = OPTS_STRING, .str = &a.checkpoint, .meta = "DIR",
         .help = "transformer weights instead of the pipeline's: a checkpoint-N folder of `vgrpo run`\n"
                 "(its transformer/ and transformer_2/) or a transformer folder; a LoRA checkpoint (or an\n"
                 "adapter folder): its adapters on the pipeline's transformer(s); the text encoder,\n"
                 "tokenizer and VAE still come from --pipeline"},
        {.name = "image", .type = OPTS_STRING, .str = &a.g.image, .meta = "PNG",
         .help = "image to video: the first frame (stretched to the size), for a TI2V pipeline\n"
                 "(model_index.json \"expand_timesteps\": true, e.g. init-model --preset tiny-ti2v) or\n"
                 "an I2V-A14B one (36 input channels, e.g. --preset tiny-i2v; required there)"},
        {.name = "negative-prompt", .type = OPTS_STRING, .str = &a.g.negative, .meta = "TEXT",
         .help = "negative prompt for classifier-free guidance (default: empty)"},
        {.name = "steps", .type = OPTS_INT, .i = &a.g.steps, .seen = &a.given.steps, .min = 1, .max = 1000, .meta = "N",
         .help = "sampling steps (default 20; --recipe: rollout.num_steps)"},
        {.name = "guidance", .type = OPTS_DOUBLE, .d = &a.g.guidance, .seen = &a.given.guidance, .min = 0,
         .max = GEN_GUIDANCE_MAX, .meta = "G",
         .help = "guidance scale (default 5.0; 1 = no unconditional pass; --recipe:\n"
                 "rollout.guidance_scale)"},
        {.name = "guidance-2", .type = OPTS_DOUBLE, .d = &a.g.guidance2, .seen = &a.given.guidance2, .min = 0,
         .max = GEN_GUIDANCE_MAX, .meta = "G",
         .help = "guidance scale of transformer_2 (default: --guidance; --recipe:\n"
                 "rollout.guidance_scale_2)"},
        {.name = "shift", .type = OPTS_DOUBLE, .d = &a.g.shift, .seen = &a.given.shift, .min = GEN_SHIFT_MIN,
         .max = GEN_SHIFT_MAX, .meta = "X",
         .help = "flow shift of the sigma schedule (default 5.0; --recipe: rollout.shift)"},
        {.name = "eta", .type = OPTS_DOUBLE, .d = &a.g.eta, .seen = &a.given.eta, .min = 0, .max = GEN_ETA_MAX,
         .meta = "E",
         .help = "noise level: 0 = the deterministic ODE sampler (default), > 0 the SDE step\n"
                 "with the eval's noise (--recipe: data.eval_eta)"},
        {.name = "seed", .type = OPTS_U64, .u64 = &a.g.seed, .seen = &a.given.seed, .meta = "S",
         .help = "noise seed (default 0; --recipe: data.seed)"},
        {.name = "uid", .type = OPTS_U64, .u64 = &a.g.uid, .seen = &a.seen_uid, .meta = "U",
         .help = "the eval sample whose noise to draw: eval.json's uid (prompt i, sample k:\n"
                 "i x data.eval_samples_per_prompt + k; default 0; --recipe: the prompt's first\n"
                 "sample when data.eval_prompt_file holds the prompt)"},
        {.name = "frames", .type = OPTS_INT, .i = &a.g.frames, .seen = &a.given.frames, .min = 1, .max = 100000,
         .meta = "F", .help = "video frames, 4k + 1 (default 9; --recipe: rollout.frames)"},
        {.name = "height", .type = OPTS_INT, .i = &a.g.height, .seen = &a.given.height, .min = 1, .max = 16384,
         .meta = "H",
         .help = "pixels, a multiple of 16 (Wan 2.1 VAE) or 32 (Wan 2.2 VAE) (default 64;\n"
                 "--recipe: rollout.height)"},
        {.name = "width", .type = OPTS_INT, .i = &a.g.width, .seen = &a.given.width, .min = 1, .max = 16384,
         .meta = "W", .help = "pixels, likewise (default 64; --recipe: rollout.width)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &a.force,
         .help = "go on when the memory estimate says the video does not fit (a warning instead)"},
        {0}};
    const opts_cmd cmd = {.name = "generate", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return free(sets.v), opts_exit_status(prc);
    a.sets = sets.v, a.n_sets = sets.n;
    if (!a.recipe && !a.g.pipeline)
        prc = opts_fail(&cmd, stderr, "--pipeline is required (or --recipe FILE: its model.path)");
    else if (!a.recipe && sets.n)
        prc = opts_fail(&cmd, stderr, "--set %s: takes effect with --recipe only", sets.v[0]);
    if (prc != OPTS_OK) return free(sets.v), opts_exit_status(prc);
    if (!a.given.guidance2) a.g.guidance2 = a.g.guidance;
    for (int k = 0; k < 2; k++) { /* what a prompt file may hold (core/prompts.h); nothing longer is tokenized */
        const size_t n = strlen(k ? a.g.negative : a.g.prompt);
        if (n > CORE_PROMPTS_MAX_BYTES) {
            free(sets.v);
            return opts_exit_status(opts_fail(&cmd, stderr, "--%s: %zu bytes, over the %d bytes of a prompt (the "
                                              "default of a recipe's data.max_prompt_bytes)", k ? "negative-prompt" :
                                              "prompt", n, CORE_PROMPTS_MAX_BYTES));
        }
    }
    core_recipe r;
    memset(&r, 0, sizeof r);
    int uid_found = 0, status = 1;
    if (a.recipe && recipe_settings(&a, &r, &uid_found)) {
        fprintf(stderr, "vgrpo generate: %s\n", core_last_error());
        goto done;
    }
    char transformer[4200];
    if (a.checkpoint) {
        int lora = 0;
        if (rollout_checkpoint_weights(a.checkpoint, transformer, sizeof transformer, &lora) ||
            (a.recipe && !lora && rollout_checkpoint_fits(transformer, r.model_path, "--checkpoint"))) {
            fprintf(stderr, "vgrpo generate: --checkpoint: %s\n", core_last_error());
            goto done;
        }
        trainer_ckpt_print_run(a.checkpoint, stdout); /* the run it belongs to, one line */
        if (lora) a.g.adapter = transformer; /* a LoRA checkpoint: its adapters on the pipeline's transformer(s) */
        else a.g.transformer = transformer;
    }
    a.g.progress = progress, a.g.progress_ctx = &a, a.stderr_tty = isatty(fileno(stderr));
    if (gen_memory_check(&a.g, a.force) || (a.recipe ? generate_recipe(&a, &r, uid_found) : generate(&a))) {
        fprintf(stderr, "vgrpo generate: %s\n", core_last_error());
        goto done;
    }
    status = 0;
done:
    if (a.recipe) core_recipe_release(&r);
    free(sets.v);
    return status;
}
