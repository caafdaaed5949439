/* cli/cmd_generate.c — `vgrpo generate --pipeline DIR --prompt "..." --out out.mp4 [options]`: text to video with a
 * WanPipeline folder (rollout/text_to_video.h: umT5, DiT sampling with CFG and two-expert routing, VAE), written as
 * out.mp4 (16 fps) and a PNG contact sheet out.png (one row, up to 8 evenly spaced frames, labelled with the seed,
 * steps and guidance, under a title band with the prompt: media/png.h). --checkpoint DIR takes
 * the transformer weights from a checkpoint-N folder of `vgrpo run` or a transformer folder
 * (rollout_checkpoint_transformer); a LoRA checkpoint (rollout_checkpoint_weights: its transformer/ holds an adapter,
 * no weights) puts its adapters on the pipeline's own transformer(s). Everything else comes from the pipeline.
 * Progress goes to stderr (cli/progress.h: a bar rewritten with \r on a terminal, else a line per tenth of the
 * steps); a summary with timings to stdout.
 * Limits: the prompt is given on the command line (no prompt file), at most CORE_PROMPTS_MAX_BYTES (4096) bytes,
 * as a line of a prompt file (core/prompts.h); the negative prompt likewise.
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/prompts.h"
#include "model/flow/guidance.h"
#include "rollout/text_to_video.h"
#include "trainer/budget.h"
#include "trainer/checkpoint.h"
#include "media/png.h"
#include "media/video.h"

#define GEN_SHEET_COLS 8

typedef struct {
    rollout_t2v_args g;
    const char *out, *checkpoint;
    int have_guidance2, force;
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

/* Generates the video and writes the mp4, the sheet and the summary line. Returns 0 or -1 (core_error). */
static int generate(gen_args *a) {
    const rollout_t2v_args *g = &a->g;
    double t_start = cli_progress_now();
    rollout_t2v_stats st;
    char png[4200];
    const char *codec = NULL;
    uint8_t *video = malloc((size_t)g->frames * g->height * g->width * 3);
    if (!video) return core_error("out of memory for a %d x %d x %d video", g->frames, g->height, g->width);
    /* the output folder before the minutes of sampling, not after */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", a->out);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if (slash && dir[0] && (!core_is_dir(dir) || access(dir, W_OK)))
        return free(video), core_error("--out: the folder %s does not exist or cannot be written", dir);
    int rc = rollout_text_to_video(g, video, &st);
    if (!rc) rc = media_video_write_mp4(a->out, video, g->frames, g->height, g->width, ROLLOUT_T2V_FPS, NULL, &codec);
    sheet_path(a->out, png, sizeof png);
    char label[128];
    snprintf(label, sizeof label, "seed %llu, %d steps, guidance %g", (unsigned long long)g->seed, g->steps,
             g->guidance);
    const char *labels[1] = {label};
    if (!rc)
        rc = media_png_write_sheet_titled(png, video, 1, g->frames, g->height, g->width, GEN_SHEET_COLS, g->prompt,
                                            labels);
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
    printf("generate: %s (%d frames, %d x %d, %s) and %s\n"
           "generate: %d steps%s, guidance %g; encode %.2f s, sampling %.2f s, decode %.2f s, total %.2f s\n",
           a->out, g->frames, g->height, g->width, codec, png, g->steps, st.two_experts ? " (two experts)" : "",
           g->guidance, st.encode_s, st.sample_s, st.decode_s, cli_progress_now() - t_start);
    return 0;
}

/* Before any weights are read: what the video needs (trainer/budget.h budget_generate_bytes: everything
 * rollout/text_to_video.c holds at once) against the memory available (budget_memory_available, as run's start-up
 * estimate). Over it: -1 naming the figures and the options, or with --force a warning on stderr. 0 also when the
 * pipeline's configs are missing (the loading says so). */
static int memory_check(const gen_args *a) {
    const rollout_t2v_args *g = &a->g;
    const int rows = flow_cfg_active((float)g->guidance) || flow_cfg_active((float)g->guidance2) ? 2 : 1;
    budget_generate e;
    int iw = 0, ih = 0;
    if (g->image && media_png_probe(g->image, &iw, &ih)) return core_error_push("--image: ");
    const int rc = budget_generate_bytes(&e, g->pipeline, g->frames, g->height, g->width, rows, ROLLOUT_T2V_TEXT_LEN,
                                         (double)iw * ih);
    if (rc) return rc < 0 ? core_error_push("--pipeline %s: ", g->pipeline) : 0;
    budget_memory m;
    budget_memory_available(&m, 0, NULL);
    const double G = 1024.0 * 1024.0 * 1024.0, gflops = budget_gflops();
    char fs[32], ts[32], tt[32];
    budget_format_flop(fs, sizeof fs, e.flop_step);
    budget_format_duration(ts, sizeof ts, gflops > 0 ? e.flop_step / (gflops * 1e9) : 0);
    budget_format_duration(tt, sizeof tt, gflops > 0 ? g->steps * e.flop_step / (gflops * 1e9) : 0);
    printf("generate: estimate %.2g GiB of memory (%.1f GiB available); %s a denoising step, about %s each and %s for "
           "%d step%s at this machine's %.0f GFLOP/s\n", e.total / G, m.bytes / G, fs, ts, tt, g->steps,
           g->steps == 1 ? "" : "s", gflops);
    fflush(stdout);
    if (e.total <= m.bytes) return 0;
    char what[600];
    snprintf(what, sizeof what, "--frames %d --height %d --width %d (%lld video tokens) need about %.1f GiB: "
             "transformer activations %.1f GiB (%s%s), weights %.1f GiB, VAE %.1f GiB, text encoder %.1f GiB, "
             "%s%.1f GiB; %.1f GiB is available (%s)", g->frames, g->height, g->width, (long long)e.tokens,
             e.total / G, e.acts / G, rows > 1 ? "2 rows: guidance" : "1 row", e.experts > 1 ? ", two experts" : "",
             e.weights / G, e.vae / G, e.text / G, g->image ? "image encoding and video and latents " : "video and latents ",
             (e.image + e.other) / G, m.bytes / G, m.source);
    if (!a->force) return core_error("memory: %s; lower --frames, --height or --width, or --force", what);
    fprintf(stderr, "vgrpo generate: warning: memory: %s (--force: going on)\n", what);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    gen_args a = {.g = {.negative = "", .steps = 20, .frames = 9, .height = 64, .width = 64, .guidance = 5.0,
                  .shift = 5.0}};
    const opts_spec opts[] = {
        {.name = "pipeline", .type = OPTS_STRING, .str = &a.g.pipeline, .required = 1, .meta = "DIR",
         .help = "WanPipeline folder (model_index.json, transformer/, text_encoder/, tokenizer/,\n"
                 "vae/; transformer_2/ for two experts), e.g. from `vgrpo init-model --preset tiny`"},
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
        {.name = "steps", .type = OPTS_INT, .i = &a.g.steps, .min = 1, .max = 1000, .meta = "N",
         .help = "sampling steps (default 20)"},
        {.name = "guidance", .type = OPTS_DOUBLE, .d = &a.g.guidance, .meta = "G",
         .help = "guidance scale (default 5.0; 1 = no unconditional pass)"},
        {.name = "guidance-2", .type = OPTS_DOUBLE, .d = &a.g.guidance2, .seen = &a.have_guidance2, .meta = "G",
         .help = "guidance scale of transformer_2 (default: --guidance)"},
        {.name = "shift", .type = OPTS_DOUBLE, .d = &a.g.shift, .meta = "X",
         .help = "flow shift of the sigma schedule (default 5.0)"},
        {.name = "seed", .type = OPTS_U64, .u64 = &a.g.seed, .meta = "S", .help = "noise seed (default 0)"},
        {.name = "frames", .type = OPTS_INT, .i = &a.g.frames, .min = 1, .max = 100000, .meta = "F",
         .help = "video frames, 4k + 1 (default 9)"},
        {.name = "height", .type = OPTS_INT, .i = &a.g.height, .min = 1, .max = 16384, .meta = "H",
         .help = "pixels, a multiple of 16 (Wan 2.1 VAE) or 32 (Wan 2.2 VAE) (default 64)"},
        {.name = "width", .type = OPTS_INT, .i = &a.g.width, .min = 1, .max = 16384, .meta = "W",
         .help = "pixels, likewise (default 64)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &a.force,
         .help = "go on when the memory estimate says the video does not fit (a warning instead)"},
        {0}};
    const opts_cmd cmd = {.name = "generate", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (!a.have_guidance2) a.g.guidance2 = a.g.guidance;
    for (int k = 0; k < 2; k++) { /* what a prompt file may hold (core/prompts.h); nothing longer is tokenized */
        const size_t n = strlen(k ? a.g.negative : a.g.prompt);
        if (n > CORE_PROMPTS_MAX_BYTES)
            return opts_exit_status(opts_fail(&cmd, stderr, "--%s: %zu bytes, over the %d bytes of a prompt (the "
                                              "default of a recipe's data.max_prompt_bytes)", k ? "negative-prompt" :
                                              "prompt", n, CORE_PROMPTS_MAX_BYTES));
    }
    char transformer[4200];
    if (a.checkpoint) {
        int lora = 0;
        if (rollout_checkpoint_weights(a.checkpoint, transformer, sizeof transformer, &lora)) {
            fprintf(stderr, "vgrpo generate: --checkpoint: %s\n", core_last_error());
            return 1;
        }
        trainer_ckpt_print_run(a.checkpoint, stdout); /* the run it belongs to, one line */
        if (lora) a.g.adapter = transformer; /* a LoRA checkpoint: its adapters on the pipeline's transformer(s) */
        else a.g.transformer = transformer;
    }
    a.g.progress = progress, a.g.progress_ctx = &a, a.stderr_tty = isatty(fileno(stderr));
    if (memory_check(&a)) {
        fprintf(stderr, "vgrpo generate: %s\n", core_last_error());
        return 1;
    }
    if (generate(&a)) {
        fprintf(stderr, "vgrpo generate: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
