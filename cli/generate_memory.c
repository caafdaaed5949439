/* cli/generate_memory.c — `vgrpo generate`'s estimate of memory and time before any weights are read
 * (cli/generate_memory.h). Moved here from cli/cmd_generate.c. */
#include "cli/generate_memory.h"

#include <stdio.h>

#include "core/error.h"
#include "media/png.h"
#include "model/flow/guidance.h"
#include "trainer/budget/budget.h"

int gen_memory_check(const rollout_t2v_args *g, int force) {
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
    if (!force) return core_error("memory: %s; lower --frames, --height or --width, or --force", what);
    fprintf(stderr, "vgrpo generate: warning: memory: %s (--force: going on)\n", what);
    return 0;
}

