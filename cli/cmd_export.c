/* cli/cmd_export.c — `vgrpo export --base DIR --adapter PATH [--adapter-2 PATH] [--merge] --out DIR
 * [--pipeline-out DIR]`: a LoRA adapter for users of diffusers and peft, merged into the transformer or as adapter files.
 *
 * --base: the base weights: a transformer folder (config.json + weights) or a pipeline folder with
 *   transformer/ (and transformer_2/, Wan 2.2 A14B). The adapter files hold no base weights, so the base is named
 *   here. --checkpoint is its old name (kept, with a one-line deprecation on stderr; a LoRA checkpoint given there is
 *   refused with the way on: it is the --adapter).
 * --adapter: the adapter of transformer (the high-noise expert): a pytorch_lora_weights.safetensors (diffusers),
 *   an adapter_model.safetensors (peft, adapter_config.json beside it), a folder holding one of them, or a folder
 *   with transformer/ (and transformer_2/) subfolders holding them (a LoRA checkpoint-N of `vgrpo run`: both experts
 *   at once).
 *   --adapter-2: the adapter of transformer_2 (the low-noise expert).
 * Output, per expert with an adapter (OUT/transformer, OUT/transformer_2):
 *   --merge: a diffusers transformer folder with W += alpha/r * B A for every adapted linear (config.json +
 *     diffusion_pytorch_model.safetensors, F32), which WanTransformer3DModel.from_pretrained loads; an expert of a
 *     two-expert base without an adapter is written unchanged, so OUT has every transformer of the base.
 *   otherwise: the adapter in both formats (pytorch_lora_weights.safetensors for pipe.load_lora_weights(dir) /
 *     pipe.load_lora_weights(dir_2, load_into_transformer_2=True), and adapter_model.safetensors +
 *     adapter_config.json for PeftModel.from_pretrained): converts a peft adapter, which diffusers would silently
 *     load as nothing, to the diffusers file, and back.
 * --pipeline-out DIR (with --merge, a pipeline folder as --base): a whole pipeline folder instead of OUT: the base's
 *   components (cli/export_pipeline.h) and the merged transformer(s), written as DIR.partial and renamed to DIR when
 *   complete; `vgrpo generate --pipeline DIR` loads it.
 * Exit status 0, 1 on failure (nothing half-written: every file goes through a temporary name), 2 on a usage
 * error. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/export_pipeline.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The base folder of expert e (0 transformer, 1 transformer_2) under ckpt, into out; 0 when it exists. */
static int base_folder(const char *ckpt, int e, char *out, size_t cap) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/config.json", ckpt);
    if (is_file(probe)) { /* a transformer folder: one expert */
        if (e) return -1;
        snprintf(out, cap, "%s", ckpt);
        return 0;
    }
    snprintf(out, cap, "%s/%s", ckpt, wan_expert_folder(e));
    snprintf(probe, sizeof probe, "%s/config.json", out);
    return is_file(probe) ? 0 : -1;
}

/* The adapter of expert e given --adapter (a, may hold both experts) and --adapter-2 (a2). NULL: none. */
static const char *adapter_of(const char *a, const char *a2, int e, char *buf, size_t cap) {
    if (e == 1 && a2) return a2;
    if (!a) return NULL;
    snprintf(buf, cap, "%s/%s", a, wan_expert_folder(e));
    if (core_is_dir(buf)) return buf; /* a LoRA checkpoint folder: transformer/, transformer_2/ */
    return e == 0 ? a : NULL;
}

static int export_expert(const char *base_dir, const char *adapter, int e, int merge, const char *out_dir) {
    wan_model m;
    wan_lora l;
    memset(&l, 0, sizeof l);
    char dst[4200];
    snprintf(dst, sizeof dst, "%s/%s", out_dir, wan_expert_folder(e));
    if (wan_model_load(&m, base_dir)) return -1;
    int rc = 0;
    if (adapter) {
        char file[4200], targets[1024];
        wan_lora_format fmt;
        wan_lora_config c;
        rc = wan_lora_inspect(adapter, &c, &fmt, file, sizeof file);
        if (!rc) rc = wan_lora_load(&l, &m.cfg, adapter, e);
        if (!rc)
            printf("export: %s: adapter %s (%s, rank %d, alpha %g, scale %g, targets %s; %lld parameters)\n",
                   wan_expert_folder(e), file, wan_lora_format_name(fmt), l.cfg.rank, l.cfg.alpha, (double)l.scale,
                   wan_lora_targets_format(l.cfg.targets, targets, sizeof targets), (long long)l.layout.numel);
    }
    if (!rc && merge) {
        if (adapter) rc = wan_lora_merge(&m, &l);
        if (!rc) rc = wan_model_save(&m, dst);
        if (!rc)
            printf("export: %s: %s -> %s\n", wan_expert_folder(e), adapter ? "merged" : "no adapter, copied", dst);
    } else if (!rc && adapter) {
        rc = wan_lora_save(&l, dst);
        if (!rc)
            printf("export: %s: -> %s/{%s, %s, %s}\n", wan_expert_folder(e), dst, WAN_LORA_DIFFUSERS_FILE,
                   WAN_LORA_PEFT_FILE, WAN_LORA_PEFT_CONFIG);
    }
    wan_lora_free(&l);
    wan_model_free(&m);
    return rc;
}

/* The base named by --base (or the old --checkpoint): refused, naming the way on, when it is a LoRA checkpoint (no
 * transformer config, an adapter in transformer/): that is what --adapter takes. */
static int base_is_adapter(const char *base) {
    char probe[4200];
    for (int k = 0; k < 3; k++) {
        snprintf(probe, sizeof probe, "%s/%s", base, k == 0 ? "transformer/config.json" : k == 1 ? "config.json" :
                 "transformer/" WAN_LORA_DIFFUSERS_FILE);
        if (is_file(probe)) return k == 2;
    }
    snprintf(probe, sizeof probe, "%s/transformer/" WAN_LORA_PEFT_FILE, base);
    return is_file(probe);
}

int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *base_opt = NULL, *adapter = NULL, *adapter2 = NULL, *out = NULL, *pipe_out = NULL;
    int merge = 0;
    const opts_spec opts[] = {
        {.name = "base", .type = OPTS_STRING, .str = &base_opt, .meta = "DIR",
         .help = "the base: a transformer folder, or a pipeline folder with transformer/\n(and transformer_2/)"},
        {.name = "checkpoint", .type = OPTS_STRING, .str = &ckpt, .meta = "DIR",
         .help = "deprecated name of --base (a run's checkpoint-N is an --adapter)"},
        {.name = "adapter", .type = OPTS_STRING, .str = &adapter, .meta = "PATH",
         .help = "LoRA of transformer: a run's checkpoint-N folder (its transformer/ and\n"
                 "transformer_2/), pytorch_lora_weights.safetensors, a peft\nadapter_model.safetensors, a folder "
                 "holding one, or a folder with\ntransformer/ (and transformer_2/) holding them"},
        {.name = "adapter-2", .type = OPTS_STRING, .str = &adapter2, .meta = "PATH",
         .help = "LoRA of transformer_2 (the low-noise expert)"},
        {.name = "merge", .type = OPTS_FLAG, .flag = &merge,
         .help = "write merged diffusers transformer folders (W += alpha/r B A) instead of\nthe adapter files"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .meta = "DIR",
         .help = "output folder: OUT/transformer (and OUT/transformer_2); required without\n--pipeline-out"},
        {.name = "pipeline-out", .type = OPTS_STRING, .str = &pipe_out, .meta = "DIR",
         .help = "with --merge and a pipeline as --base: a whole pipeline folder (the base's\n"
                 "components and the merged transformer(s)), for `vgrpo generate --pipeline DIR`"},
        {0}};
    const opts_cmd cmd = {
        .name = "export", .opts = opts,
        .about = "Exports a LoRA adapter for diffusers and peft: merged into the base transformer (--merge), or as\n"
                 "pytorch_lora_weights.safetensors + a peft adapter folder per expert."};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (ckpt) {
        fprintf(stderr, "vgrpo export: --checkpoint is deprecated (it names the base model): use --base; a run's "
                        "checkpoint-N goes to --adapter\n");
        if (base_opt && strcmp(base_opt, ckpt))
            return opts_exit_status(opts_fail(&cmd, stderr, "--base %s and --checkpoint %s: give the base once "
                                              "(--base)", base_opt, ckpt));
        if (!base_opt) base_opt = ckpt;
    }
    if (!base_opt) return opts_exit_status(opts_fail(&cmd, stderr, "--base is required (the base model)"));
    if (!adapter && !adapter2) return opts_exit_status(opts_fail(&cmd, stderr, "give --adapter and/or --adapter-2"));
    if (pipe_out && !merge)
        return opts_exit_status(opts_fail(&cmd, stderr, "--pipeline-out writes merged weights: add --merge"));
    if (pipe_out && out)
        return opts_exit_status(opts_fail(&cmd, stderr, "give --out or --pipeline-out, not both"));
    if (!pipe_out && !out) return opts_exit_status(opts_fail(&cmd, stderr, "--out is required (or --pipeline-out)"));
    if (base_is_adapter(base_opt)) {
        fprintf(stderr, "vgrpo export: %s%s holds a LoRA adapter, not base weights: give it as --adapter %s and the "
                        "base model (the run's model.path) as --base\n", ckpt ? "--checkpoint " : "--base ", base_opt,
                base_opt);
        return 1;
    }
    ckpt = base_opt;
    char partial[4200];
    if (pipe_out) {
        struct stat st;
        if (!stat(pipe_out, &st)) {
            fprintf(stderr, "vgrpo export: --pipeline-out %s already exists (choose a new folder)\n", pipe_out);
            return 1;
        }
        export_pipeline_partial(pipe_out, partial, sizeof partial);
        export_pipeline_remove(partial); /* an earlier failed export's */
        out = partial;
    }
    char base[2][4200], abuf[2][4200];
    const char *ad[2];
    int have[2];
    for (int e = 0; e < 2; e++) {
        have[e] = base_folder(ckpt, e, base[e], sizeof base[e]) == 0;
        ad[e] = adapter_of(adapter, adapter2, e, abuf[e], sizeof abuf[e]);
    }
    if (!have[0]) {
        fprintf(stderr, "vgrpo export: %s: no transformer here (config.json, or transformer/config.json)\n", ckpt);
        return 1;
    }
    if (ad[1] && !have[1]) {
        fprintf(stderr, "vgrpo export: an adapter for transformer_2 (%s) but %s has no transformer_2/\n", ad[1], ckpt);
        return 1;
    }
    if (pipe_out ? export_pipeline_copy(ckpt, out) : core_mkdir_p(out)) {
        fprintf(stderr, "vgrpo export: %s\n", core_last_error());
        if (pipe_out) export_pipeline_remove(out);
        return 1;
    }
    for (int e = 0; e < 2; e++) {
        if (!have[e] || (!ad[e] && !merge)) continue;
        if (export_expert(base[e], ad[e], e, merge, out)) {
            fprintf(stderr, "vgrpo export: %s\n", core_last_error());
            if (pipe_out) export_pipeline_remove(out);
            return 1;
        }
    }
    if (pipe_out) {
        if (rename(out, pipe_out)) {
            fprintf(stderr, "vgrpo export: renaming %s to %s failed: %s\n", out, pipe_out, strerror(errno));
            export_pipeline_remove(out);
            return 1;
        }
        printf("export: pipeline %s (the components of %s, the merged transformer%s): vgrpo generate --pipeline %s\n",
               pipe_out, ckpt, have[1] ? "s" : "", pipe_out);
    }
    return 0;
}
