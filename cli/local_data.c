/* cli/local_data.c — prompt lists, the epoch shuffle and scoring for local mode (see cli/grpo_run.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/grpo_run.h"
#include "core/error.h"
#include "core/philox.h"

int local_prompts_read(local_prompts *p, const char *path) {
    memset(p, 0, sizeof *p);
    FILE *f = fopen(path, "r");
    if (!f) return core_error("%s: cannot open prompt file: %s", path, strerror(errno));
    char *line = NULL; /* getline: prompts of any length, never split */
    size_t linecap = 0;
    int cap = 0, oom = 0;
    while (getline(&line, &linecap, f) >= 0) {
        char *s = line, *e = line + strlen(line);
        while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
        while (isspace((unsigned char)*s)) s++;
        if (!*s || *s == '#') continue;
        if (p->n == cap) {
            cap = cap ? 2 * cap : 16;
            char **t = realloc(p->text, sizeof(char *) * (size_t)cap);
            if (!t) { oom = 1; break; }
            p->text = t;
        }
        if (!(p->text[p->n] = strdup(s))) { oom = 1; break; }
        p->n++;
    }
    int err = ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (oom || err) {
        local_prompts_free(p);
        return oom ? core_error("%s: out of memory reading prompts", path)
                   : core_error("%s: cannot read prompt file: %s", path, strerror(err));
    }
    if (p->n == 0) return core_error("%s: no prompts", path);
    return 0;
}

void local_prompts_free(local_prompts *p) {
    for (int i = 0; i < p->n; i++) free(p->text[i]);
    free(p->text);
    memset(p, 0, sizeof *p);
}

void local_epoch_order(uint64_t seed, uint32_t epoch, int n, int *perm) {
    for (int i = 0; i < n; i++) perm[i] = i;
    if (n < 2) return;
    double *u = malloc(sizeof(double) * (size_t)n);
    if (!u) return; /* identity order; n is a prompt count, this does not happen in practice */
    core_philox_uniform(u, n, seed, 0, epoch, CORE_STREAM_PROMPT_SHUFFLE);
    for (int j = 0; j < n - 1; j++) {
        int r = j + (int)floor(u[j] * (double)(n - j));
        if (r > n - 1) r = n - 1;
        int t = perm[j];
        perm[j] = perm[r];
        perm[r] = t;
    }
    free(u);
}

int local_sampler_init(local_sampler *s, int n, int B, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (B > n) return core_error("rollout.prompts_per_step: %d distinct prompts per step, but the prompt file has %d", B, n);
    if (!(s->perm = malloc(sizeof(int) * (size_t)n))) return core_error("out of memory");
    s->n = n, s->B = B, s->seed = seed;
    local_epoch_order(seed, 0, n, s->perm);
    return 0;
}

void local_sampler_next(local_sampler *s, int *out) {
    if (s->pos + s->B > s->n) {
        s->epoch++;
        s->pos = 0;
        local_epoch_order(s->seed, s->epoch, s->n, s->perm);
    }
    for (int i = 0; i < s->B; i++) out[i] = s->perm[s->pos + i];
    s->pos += s->B;
}

void local_sampler_free(local_sampler *s) {
    free(s->perm);
    memset(s, 0, sizeof *s);
}

int local_scoring_init(local_scoring *s, const core_recipe *r) {
    memset(s, 0, sizeof *s);
    if (r->scorers.n > CORE_TRAJ_MAX_REWARDS) return core_error("reward.scorers: at most %d", CORE_TRAJ_MAX_REWARDS);
    for (int i = 0; i < r->scorers.n; i++) {
        if (!(s->sc[i] = reward_find(r->scorers.v[i]))) return core_error_push("reward.scorers.%d: ", i);
        s->names[i] = s->sc[i]->name;
        s->weight[i] = r->weights.v[i];
    }
    s->n = r->scorers.n;
    return 0;
}

int local_score(const local_scoring *s, rollout_decoder *d, core_traj *t, const char *prompt, uint8_t *video) {
    if (rollout_decoder_decode(d, core_traj_latent(t, t->n_steps), video)) return -1;
    reward_video v = {.data = video, .frames = d->frames, .height = d->height, .width = d->width};
    float vals[CORE_TRAJ_MAX_REWARDS];
    double total = 0;
    for (int i = 0; i < s->n; i++) {
        double x;
        if (s->sc[i]->fn(&v, prompt, NULL, &x)) return core_error_push("scoring \"%s\": ", prompt);
        vals[i] = (float)x;
        total += s->weight[i] * x;
    }
    return core_traj_set_rewards(t, s->n, s->names, vals, (float)total);
}
