/* core/trajectory.c — the rollout trajectory, its validation and its stored form (see core/trajectory.h). */
#include "core/trajectory.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/safetensors.h"

#define FORMAT_NAME "vgrpo.trajectory"
#define FORMAT_VERSION "1"   /* a full trajectory without means: byte for byte the form before stored ranges */
#define FORMAT_VERSION_2 "2" /* a stored range (latent_first, fewer latents), the means and/or the condition */
/* Upper bound on N accepted from outside (a guard against absurd headers, far above any schedule). */
#define MAX_STEPS 100000

/* The version 1 tensors in their stored order, then the optional `means` and `condition` (version 2 only). */
enum { T_SIGMAS, T_TIMESTEPS, T_LATENTS, T_LOG_PROBS, T_HAS_LOG_PROB, T_EXPERT, T_REWARDS, T_MEANS, T_CONDITION,
       T_CONCAT };
static const char *const tensor_names[CORE_TRAJ_N_TENSORS] = {"sigmas", "timesteps", "latents", "log_probs",
                                                              "has_log_prob", "expert", "rewards", "means",
                                                              "condition", "concat"};
#define MAX_CONCAT_CHANNELS 4096

/* ---- Allocation ---- */

/* Allocates a trajectory that stores latents[first .. first + n_latents - 1] (no means); the caller checked the
 * range. */
static int alloc_range(core_traj *t, int n_steps, const int64_t shape[4], int first, int n_latents)
{
    memset(t, 0, sizeof *t);
    if (n_steps < 1 || n_steps > MAX_STEPS)
        return core_error("trajectory: step count %d must be in [1, %d]", n_steps, MAX_STEPS);
    int64_t numel = 1;
    for (int d = 0; d < 4; d++) {
        if (shape[d] < 1) return core_error("trajectory: latent shape dim %d = %lld must be >= 1", d, (long long)shape[d]);
        if (numel > INT64_MAX / shape[d]) return core_error("trajectory: latent shape overflows");
        numel *= shape[d];
    }
    const uint64_t total = (uint64_t)numel * (uint64_t)n_latents;
    if ((uint64_t)numel > (uint64_t)SIZE_MAX / sizeof(float) / (uint64_t)n_latents)
        return core_error("trajectory: %d latents x %lld elements overflow memory size", n_latents, (long long)numel);
    t->sigmas = calloc((size_t)n_steps + 1, sizeof(float));
    t->timesteps = calloc((size_t)n_steps, sizeof(float));
    t->latents = calloc((size_t)total, sizeof(float));
    t->log_probs = calloc((size_t)n_steps, sizeof(float));
    t->has_log_prob = calloc((size_t)n_steps, 1);
    t->expert = calloc((size_t)n_steps, 1);
    if (!t->sigmas || !t->timesteps || !t->latents || !t->log_probs || !t->has_log_prob || !t->expert) {
        core_traj_free(t);
        return core_error("trajectory: out of memory for %d steps, %d latents x %lld elements", n_steps, n_latents,
                          (long long)numel);
    }
    t->n_steps = n_steps;
    t->latent_first = first;
    t->n_latents = n_latents;
    memcpy(t->shape, shape, sizeof t->shape);
    return 0;
}

int core_traj_alloc(core_traj *t, int n_steps, const int64_t shape[4])
{
    if (n_steps < 1 || n_steps > MAX_STEPS) { /* checked before n_steps + 1 is formed */
        memset(t, 0, sizeof *t);
        return core_error("trajectory: step count %d must be in [1, %d]", n_steps, MAX_STEPS);
    }
    return alloc_range(t, n_steps, shape, 0, n_steps + 1);
}

void core_traj_free(core_traj *t)
{
    if (!t) return;
    free(t->sigmas);
    free(t->timesteps);
    free(t->latents);
    free(t->means);
    free(t->condition);
    free(t->concat);
    free(t->log_probs);
    free(t->has_log_prob);
    free(t->expert);
    memset(t, 0, sizeof *t);
}

int64_t core_traj_latent_numel(const core_traj *t) { return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3]; }

float *core_traj_latent(const core_traj *t, int i)
{
    return t->latents + (int64_t)(i - t->latent_first) * core_traj_latent_numel(t);
}

int core_traj_has_latent(const core_traj *t, int i)
{
    return t->latents && i >= t->latent_first && i < t->latent_first + t->n_latents;
}

float *core_traj_mean(const core_traj *t, int i)
{
    if (!t->means || i < t->latent_first || i > t->latent_first + t->n_latents - 2) return NULL;
    return t->means + (int64_t)(i - t->latent_first) * core_traj_latent_numel(t);
}

int core_traj_alloc_means(core_traj *t)
{
    if (t->means) return 0;
    if (!t->latents || t->n_latents < 2)
        return core_error("trajectory: means need at least 2 stored latents (n_latents = %d)", t->n_latents);
    const int64_t numel = core_traj_latent_numel(t);
    if ((uint64_t)numel > (uint64_t)SIZE_MAX / sizeof(float) / (uint64_t)(t->n_latents - 1))
        return core_error("trajectory: %d means x %lld elements overflow memory size", t->n_latents - 1, (long long)numel);
    if (!(t->means = calloc((size_t)numel * (size_t)(t->n_latents - 1), sizeof(float))))
        return core_error("trajectory: out of memory for %d means x %lld elements", t->n_latents - 1, (long long)numel);
    return 0;
}

int core_traj_alloc_condition(core_traj *t)
{
    if (t->condition) return 0;
    if (t->shape[1] < 2)
        return core_error("trajectory: a first-frame condition needs at least 2 latent frames (F = %lld)",
                          (long long)t->shape[1]);
    if (!(t->condition = calloc((size_t)(t->shape[0] * t->shape[2] * t->shape[3]), sizeof(float))))
        return core_error("trajectory: out of memory for the condition");
    return 0;
}

/* Index of the first element of latent x that differs from the condition in frame 0, or -1 when none does. */
static int64_t first_frame_mismatch(const core_traj *t, const float *x)
{
    const int64_t hw = t->shape[2] * t->shape[3];
    for (int64_t c = 0; c < t->shape[0]; c++)
        for (int64_t j = 0; j < hw; j++)
            if (memcmp(&x[c * t->shape[1] * hw + j], &t->condition[c * hw + j], sizeof(float)))
                return c * t->shape[1] * hw + j;
    return -1;
}

int core_traj_trim(core_traj *t, int first, int last)
{
    const int k = t->latent_first, M = t->n_latents;
    if (!t->latents) return core_error("trajectory: trim of a trajectory without latents");
    if (first > last || first < k || last > k + M - 1)
        return core_error("trajectory: trim to latents[%d .. %d] is not inside the stored latents[%d .. %d]", first, last, k,
                          k + M - 1);
    for (int i = 0; i < t->n_steps; i++)
        if (t->has_log_prob[i] && (i < first || i + 1 > last))
            return core_error("trajectory: trim to latents[%d .. %d] drops step %d, which has a log-prob (it needs "
                              "latents[%d] and latents[%d])", first, last, i, i, i + 1);
    if (first == k && last == k + M - 1) return 0;
    const size_t numel = (size_t)core_traj_latent_numel(t), m = (size_t)(last - first + 1);
    float *lat = malloc(sizeof(float) * numel * m), *mean = NULL;
    if (lat && t->means && m >= 2) mean = malloc(sizeof(float) * numel * (m - 1));
    if (!lat || (t->means && m >= 2 && !mean)) {
        free(lat), free(mean);
        return core_error("trajectory: out of memory trimming to %zu latents x %zu elements", m, numel);
    }
    memcpy(lat, core_traj_latent(t, first), sizeof(float) * numel * m);
    if (mean) memcpy(mean, core_traj_mean(t, first), sizeof(float) * numel * (m - 1));
    free(t->latents), free(t->means); /* means of a single kept latent: no step left, none kept */
    t->latents = lat, t->means = mean;
    t->latent_first = first, t->n_latents = (int)m;
    return 0;
}

/* ---- Rewards ---- */

/* Checks the reward block: count, names (non-empty, NUL-terminated in the buffer, distinct), values, total. */
static int check_rewards(int n, const char (*names)[CORE_TRAJ_NAME_MAX], const float *values, float total,
                         const char *label)
{
    if (n < 0 || n > CORE_TRAJ_MAX_REWARDS)
        return core_error("%s: reward count %d must be in [0, %d]", label, n, CORE_TRAJ_MAX_REWARDS);
    for (int i = 0; i < n; i++) {
        if (!memchr(names[i], 0, CORE_TRAJ_NAME_MAX))
            return core_error("%s: reward_names[%d] is longer than %d bytes", label, i, CORE_TRAJ_NAME_MAX - 1);
        if (!names[i][0]) return core_error("%s: reward_names[%d] is empty", label, i);
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return core_error("%s: reward_names[%d] '%s' repeats reward_names[%d]", label, i, names[i], j);
        if (!isfinite(values[i]))
            return core_error("%s: rewards[%d] ('%s') = %g is not finite", label, i, names[i], (double)values[i]);
    }
    if (!isfinite(total)) return core_error("%s: reward_total = %g is not finite", label, (double)total);
    return 0;
}

int core_traj_set_rewards(core_traj *t, int n, const char *const *names, const float *values, float total)
{
    if (n < 0 || n > CORE_TRAJ_MAX_REWARDS)
        return core_error("trajectory: reward count %d must be in [0, %d]", n, CORE_TRAJ_MAX_REWARDS);
    char tmp[CORE_TRAJ_MAX_REWARDS][CORE_TRAJ_NAME_MAX];
    for (int i = 0; i < n; i++) {
        if (strlen(names[i]) >= CORE_TRAJ_NAME_MAX)
            return core_error("trajectory: reward name '%s' is longer than %d bytes", names[i], CORE_TRAJ_NAME_MAX - 1);
        snprintf(tmp[i], CORE_TRAJ_NAME_MAX, "%s", names[i]);
    }
    if (check_rewards(n, (const char(*)[CORE_TRAJ_NAME_MAX])tmp, values, total, "trajectory")) return -1;
    memcpy(t->reward_names, tmp, sizeof tmp[0] * (size_t)n);
    for (int i = 0; i < n; i++) t->rewards[i] = values[i];
    t->n_rewards = n;
    t->reward_total = total;
    return 0;
}

/* ---- Validation ---- */

int core_traj_validate(const core_traj *t, const char *label)
{
    const int N = t->n_steps;
    if (N < 1 || N > MAX_STEPS) return core_error("%s: step count %d must be in [1, %d]", label, N, MAX_STEPS);
    if (!t->sigmas || !t->timesteps || !t->latents || !t->log_probs || !t->has_log_prob || !t->expert)
        return core_error("%s: trajectory arrays not allocated", label);
    for (int d = 0; d < 4; d++)
        if (t->shape[d] < 1) return core_error("%s: latent shape dim %d = %lld must be >= 1", label, d, (long long)t->shape[d]);
    for (int i = 0; i <= N; i++) {
        const float s = t->sigmas[i];
        if (!isfinite(s)) return core_error("%s: sigmas[%d] = %g is not finite", label, i, (double)s);
        if (i == 0 && s > 1.0f) return core_error("%s: sigmas[0] = %.9g must be <= 1", label, (double)s);
        if (i > 0 && !(s < t->sigmas[i - 1]))
            return core_error("%s: sigmas[%d] = %.9g is not below sigmas[%d] = %.9g (must strictly decrease)", label, i,
                              (double)s, i - 1, (double)t->sigmas[i - 1]);
    }
    if (t->sigmas[N] != 0.0f) return core_error("%s: sigmas[%d] (the last) = %.9g must be 0", label, N, (double)t->sigmas[N]);
    const int k = t->latent_first, M = t->n_latents;
    if (k < 0 || k > N) return core_error("%s: latent_first = %d must be in [0, %d] (N = %d)", label, k, N, N);
    if (M < 1 || M > N + 1 - k)
        return core_error("%s: %d stored latents from latent_first = %d: must be 1 .. %d (latents[%d .. %d] at most)", label,
                          M, k, N + 1 - k, k, N);
    for (int i = 0; i < N; i++) {
        if (!isfinite(t->timesteps[i]))
            return core_error("%s: timesteps[%d] = %g is not finite", label, i, (double)t->timesteps[i]);
        const uint8_t h = t->has_log_prob[i];
        if (h > 1) return core_error("%s: has_log_prob[%d] = %u must be 0 or 1", label, i, (unsigned)h);
        if (h && !isfinite(t->log_probs[i]))
            return core_error("%s: log_probs[%d] = %g is not finite", label, i, (double)t->log_probs[i]);
        if (!h && t->log_probs[i] != 0.0f)
            return core_error("%s: log_probs[%d] = %g where has_log_prob[%d] = 0 (must be 0)", label, i,
                              (double)t->log_probs[i], i);
        if (h && (i < k || i + 1 > k + M - 1))
            return core_error("%s: has_log_prob[%d] = 1 but the stored latents are latents[%d .. %d] (step %d needs "
                              "latents[%d] and latents[%d])", label, i, k, k + M - 1, i, i, i + 1);
        if (t->expert[i] >= CORE_TRAJ_MAX_EXPERTS)
            return core_error("%s: expert[%d] = %u must be below %d", label, i, (unsigned)t->expert[i],
                              CORE_TRAJ_MAX_EXPERTS);
    }
    const int64_t numel = core_traj_latent_numel(t);
    for (int i = k; i < k + M; i++) {
        const float *l = core_traj_latent(t, i);
        for (int64_t j = 0; j < numel; j++)
            if (!isfinite(l[j]))
                return core_error("%s: latents[%d] element %lld = %g is not finite", label, i, (long long)j, (double)l[j]);
    }
    if (t->means && M < 2)
        return core_error("%s: means stored with a single latent (latents[%d]): no step to hold a mean of", label, k);
    for (int i = k; t->means && i < k + M - 1; i++) {
        const float *l = core_traj_mean(t, i);
        for (int64_t j = 0; j < numel; j++)
            if (!isfinite(l[j]))
                return core_error("%s: means[%d] (step %d) element %lld = %g is not finite", label, i - k, i, (long long)j,
                                  (double)l[j]);
    }
    if (t->condition) {
        if (t->shape[1] < 2)
            return core_error("%s: a condition with a single latent frame (F = 1): nothing is generated", label);
        const int64_t nc = t->shape[0] * t->shape[2] * t->shape[3];
        for (int64_t j = 0; j < nc; j++)
            if (!isfinite(t->condition[j]))
                return core_error("%s: condition element %lld = %g is not finite", label, (long long)j,
                                  (double)t->condition[j]);
        for (int i = k; i < k + M; i++) {
            const int64_t e = first_frame_mismatch(t, core_traj_latent(t, i));
            if (e >= 0)
                return core_error("%s: latents[%d] element %lld (frame 0) differs from the condition (frame 0 of every "
                                  "latent is the image's)", label, i, (long long)e);
        }
        for (int i = k; t->means && i < k + M - 1; i++) {
            const int64_t e = first_frame_mismatch(t, core_traj_mean(t, i));
            if (e >= 0)
                return core_error("%s: means[%d] (step %d) element %lld (frame 0) differs from the condition", label,
                                  i - k, i, (long long)e);
        }
    }
    if (t->concat) {
        if (t->concat_channels < 1 || t->concat_channels > MAX_CONCAT_CHANNELS)
            return core_error("%s: concat has %lld channels (1 .. %d)", label, (long long)t->concat_channels,
                              MAX_CONCAT_CHANNELS);
        if (t->condition) return core_error("%s: both a first-frame condition and a concat condition", label);
        const int64_t nc = t->concat_channels * t->shape[1] * t->shape[2] * t->shape[3];
        for (int64_t j = 0; j < nc; j++)
            if (!isfinite(t->concat[j]))
                return core_error("%s: concat element %lld = %g is not finite", label, (long long)j, (double)t->concat[j]);
    }
    if (!isfinite(t->eta) || t->eta < 0.0f) return core_error("%s: eta = %g must be finite and >= 0", label, (double)t->eta);
    if (!isfinite(t->guidance_scale))
        return core_error("%s: guidance_scale = %g is not finite", label, (double)t->guidance_scale);
    if (!isfinite(t->guidance_scale_2))
        return core_error("%s: guidance_scale_2 = %g is not finite", label, (double)t->guidance_scale_2);
    if (t->prompt_index < 0) return core_error("%s: prompt_index = %lld must be >= 0", label, (long long)t->prompt_index);
    return check_rewards(t->n_rewards, (const char(*)[CORE_TRAJ_NAME_MAX])t->reward_names, t->rewards,
                         t->reward_total, label);
}

/* ---- Stored form ---- */

static int add_meta(core_traj_fields *f, const char *key, const char *value)
{
    char *v = strdup(value);
    if (!v) return core_error("trajectory: out of memory");
    f->meta_keys[f->n_meta] = key;
    f->meta_values[f->n_meta] = v;
    f->n_meta++;
    return 0;
}

static int add_meta_f32(core_traj_fields *f, const char *key, float x)
{
    char buf[48];
    snprintf(buf, sizeof buf, "%.9g", (double)x);
    return add_meta(f, key, buf);
}

static int to_fields(const core_traj *t, core_traj_fields *f, const char *label)
{
    memset(f, 0, sizeof *f);
    if (core_traj_validate(t, label)) return -1;
    const int64_t N = t->n_steps, M = t->n_latents;
    /* Version 1 exactly as before stored ranges, so such files and wire messages keep every byte. */
    const int v1 = t->latent_first == 0 && M == N + 1 && !t->means && !t->condition && !t->concat;
    const int64_t s_n1[1] = {N + 1}, s_n[1] = {N}, s_r[1] = {t->n_rewards};
    const int64_t s_lat[5] = {M, t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
    const int64_t s_mean[5] = {M - 1, t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
    core_tensor_wrap(&f->tensors[T_SIGMAS], t->sigmas, CORE_F32, 1, s_n1);
    core_tensor_wrap(&f->tensors[T_TIMESTEPS], t->timesteps, CORE_F32, 1, s_n);
    core_tensor_wrap(&f->tensors[T_LATENTS], t->latents, CORE_F32, 5, s_lat);
    core_tensor_wrap(&f->tensors[T_LOG_PROBS], t->log_probs, CORE_F32, 1, s_n);
    core_tensor_wrap(&f->tensors[T_HAS_LOG_PROB], t->has_log_prob, CORE_U8, 1, s_n);
    core_tensor_wrap(&f->tensors[T_EXPERT], t->expert, CORE_U8, 1, s_n);
    core_tensor_wrap(&f->tensors[T_REWARDS], (void *)t->rewards, CORE_F32, 1, s_r);
    const int64_t s_cond[4] = {t->shape[0], 1, t->shape[2], t->shape[3]};
    for (int k = 0; k <= T_REWARDS; k++) f->tensor_names[k] = tensor_names[k];
    f->n_tensors = T_REWARDS + 1;
    if (t->means) {
        core_tensor_wrap(&f->tensors[f->n_tensors], t->means, CORE_F32, 5, s_mean);
        f->tensor_names[f->n_tensors++] = tensor_names[T_MEANS];
    }
    if (t->condition) {
        core_tensor_wrap(&f->tensors[f->n_tensors], t->condition, CORE_F32, 4, s_cond);
        f->tensor_names[f->n_tensors++] = tensor_names[T_CONDITION];
    }
    const int64_t s_cat[4] = {t->concat_channels, t->shape[1], t->shape[2], t->shape[3]};
    if (t->concat) {
        core_tensor_wrap(&f->tensors[f->n_tensors], t->concat, CORE_F32, 4, s_cat);
        f->tensor_names[f->n_tensors++] = tensor_names[T_CONCAT];
    }

    char buf[48];
    json_t *names = json_array();
    if (!names) return core_error("trajectory: out of memory");
    for (int i = 0; i < t->n_rewards; i++) json_array_append_new(names, json_string(t->reward_names[i]));
    char *names_json = json_dumps(names, JSON_COMPACT);
    json_decref(names);
    if (!names_json) return core_error("trajectory: cannot encode reward_names");
    int rc = add_meta(f, "format", FORMAT_NAME);
    rc = rc ? rc : add_meta(f, "format_version", v1 ? FORMAT_VERSION : FORMAT_VERSION_2);
    snprintf(buf, sizeof buf, "%" PRIu64, t->uid);
    rc = rc ? rc : add_meta(f, "uid", buf);
    snprintf(buf, sizeof buf, "%" PRId64, t->prompt_index);
    rc = rc ? rc : add_meta(f, "prompt_index", buf);
    snprintf(buf, sizeof buf, "%" PRId64, t->policy_version);
    rc = rc ? rc : add_meta(f, "policy_version", buf);
    rc = rc ? rc : add_meta_f32(f, "eta", t->eta);
    rc = rc ? rc : add_meta_f32(f, "guidance_scale", t->guidance_scale);
    rc = rc ? rc : add_meta_f32(f, "guidance_scale_2", t->guidance_scale_2);
    rc = rc ? rc : add_meta_f32(f, "reward_total", t->reward_total);
    rc = rc ? rc : add_meta(f, "reward_names", names_json);
    free(names_json);
    snprintf(buf, sizeof buf, "%d", t->latent_first);
    if (!v1) rc = rc ? rc : add_meta(f, "latent_first", buf);
    if (rc) core_traj_fields_free(f);
    return rc;
}

int core_traj_to_fields(const core_traj *t, core_traj_fields *f) { return to_fields(t, f, "trajectory"); }

void core_traj_fields_free(core_traj_fields *f)
{
    for (int i = 0; i < f->n_meta; i++) free(f->meta_values[i]);
    memset(f, 0, sizeof *f);
}

static void shape_str(const core_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* 1-D tensor of length want, or an error naming it. */
static int expect_1d(const core_tensor *t, const char *name, int64_t want, const char *why, const char *label)
{
    if (t->ndim == 1 && t->shape[0] == want) return 0;
    char s[160];
    shape_str(t, s, sizeof s);
    return core_error("%s: tensor '%s' has shape %s, expected [%lld] (%s)", label, name, s, (long long)want, why);
}

static const char *meta_get(int n, const char *const *keys, const char *const *values, const char *key)
{
    for (int i = 0; i < n; i++)
        if (keys[i] && !strcmp(keys[i], key)) return values[i];
    return NULL;
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!s[0] || s[0] < '0' || s[0] > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_i64(const char *s, int64_t *out)
{
    const char *d = s[0] == '-' ? s + 1 : s;
    if (!d[0] || d[0] < '0' || d[0] > '9') return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_f32(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* Reads metadata `key` with parser `kind` ('u' u64, 'i' i64, 'f' f32) into out. */
static int read_meta(int n, const char *const *keys, const char *const *values, const char *key, char kind, void *out,
                     const char *label)
{
    const char *v = meta_get(n, keys, values, key);
    if (!v) return core_error("%s: metadata '%s' missing", label, key);
    int rc = kind == 'u' ? parse_u64(v, out) : kind == 'i' ? parse_i64(v, out) : parse_f32(v, out);
    if (rc)
        return core_error("%s: metadata '%s' = '%.40s' is not %s", label, key, v,
                          kind == 'u' ? "an unsigned 64-bit integer" : kind == 'i' ? "a 64-bit integer" : "a finite number");
    return 0;
}

/* Reward names from the JSON list, exactly R of them. */
static int read_reward_names(core_traj *t, const char *v, int R, const char *label)
{
    if (!v) return core_error("%s: metadata 'reward_names' missing", label);
    json_error_t err;
    json_t *a = json_loads(v, 0, &err);
    if (!a || !json_is_array(a)) {
        json_decref(a);
        return core_error("%s: metadata 'reward_names' is not a JSON list of strings", label);
    }
    int rc = 0;
    if ((int)json_array_size(a) != R) {
        rc = core_error("%s: metadata 'reward_names' has %zu names but tensor 'rewards' has %d values", label,
                        json_array_size(a), R);
    } else {
        for (int i = 0; i < R && !rc; i++) {
            const json_t *s = json_array_get(a, (size_t)i);
            if (!json_is_string(s)) rc = core_error("%s: metadata 'reward_names' entry %d is not a string", label, i);
            else if (json_string_length(s) >= CORE_TRAJ_NAME_MAX || strlen(json_string_value(s)) != json_string_length(s))
                rc = core_error("%s: reward_names[%d] is longer than %d bytes or holds a NUL", label, i,
                                CORE_TRAJ_NAME_MAX - 1);
            else snprintf(t->reward_names[i], CORE_TRAJ_NAME_MAX, "%s", json_string_value(s));
        }
    }
    json_decref(a);
    return rc;
}

static int from_fields(core_traj *t, int n_tensors, const char *const *names, const core_tensor *tensors, int n_meta,
                       const char *const *keys, const char *const *values, const char *label)
{
    const core_tensor *tv[CORE_TRAJ_N_TENSORS] = {0};
    for (int i = 0; i < n_tensors; i++) {
        int k = 0;
        while (k < CORE_TRAJ_N_TENSORS && strcmp(names[i], tensor_names[k])) k++;
        if (k == CORE_TRAJ_N_TENSORS) return core_error("%s: unknown tensor '%s'", label, names[i]);
        if (tv[k]) return core_error("%s: tensor '%s' given twice", label, names[i]);
        if (tensors[i].device != CORE_CPU || !core_tensor_is_contiguous(&tensors[i]))
            return core_error("%s: tensor '%s' must be a contiguous CPU tensor", label, names[i]);
        tv[k] = &tensors[i];
    }
    for (int k = 0; k < CORE_TRAJ_N_TENSORS; k++) {
        if ((k == T_MEANS || k == T_CONDITION || k == T_CONCAT) && !tv[k]) continue; /* optional */
        if (!tv[k]) return core_error("%s: tensor '%s' missing", label, tensor_names[k]);
        const core_dtype want = (k == T_HAS_LOG_PROB || k == T_EXPERT) ? CORE_U8 : CORE_F32;
        if (tv[k]->dtype != want)
            return core_error("%s: tensor '%s' has dtype %s, expected %s", label, tensor_names[k],
                              core_dtype_name(tv[k]->dtype), core_dtype_name(want));
    }
    char s[160];
    const core_tensor *sg = tv[T_SIGMAS];
    if (sg->ndim != 1 || sg->shape[0] < 2 || sg->shape[0] > MAX_STEPS + 1) {
        shape_str(sg, s, sizeof s);
        return core_error("%s: tensor 'sigmas' has shape %s, expected [N+1] with 1 <= N <= %d", label, s, MAX_STEPS);
    }
    const int N = (int)(sg->shape[0] - 1);
    char why[64];
    snprintf(why, sizeof why, "N = %d from 'sigmas'", N);
    if (expect_1d(tv[T_TIMESTEPS], "timesteps", N, why, label) || expect_1d(tv[T_LOG_PROBS], "log_probs", N, why, label) ||
        expect_1d(tv[T_HAS_LOG_PROB], "has_log_prob", N, why, label) || expect_1d(tv[T_EXPERT], "expert", N, why, label))
        return -1;
    const core_tensor *rw = tv[T_REWARDS];
    if (rw->ndim != 1 || rw->shape[0] > CORE_TRAJ_MAX_REWARDS) {
        shape_str(rw, s, sizeof s);
        return core_error("%s: tensor 'rewards' has shape %s, expected [R] with R <= %d", label, s, CORE_TRAJ_MAX_REWARDS);
    }

    const char *fmt = meta_get(n_meta, keys, values, "format");
    if (!fmt) return core_error("%s: metadata 'format' missing (expected '%s')", label, FORMAT_NAME);
    if (strcmp(fmt, FORMAT_NAME)) return core_error("%s: metadata 'format' is '%.40s', expected '%s'", label, fmt, FORMAT_NAME);
    const char *ver = meta_get(n_meta, keys, values, "format_version");
    if (!ver || (strcmp(ver, FORMAT_VERSION) && strcmp(ver, FORMAT_VERSION_2)))
        return core_error("%s: metadata 'format_version' is '%.20s', expected '%s' or '%s'", label, ver ? ver : "(missing)",
                          FORMAT_VERSION, FORMAT_VERSION_2);
    const int v1 = !strcmp(ver, FORMAT_VERSION);

    /* The stored range: version 1 is always the full table (a version 1 message with the version 2 fields is
     * refused rather than read two ways: a reader from before version 2 would take it as a full table). */
    const char *lf = meta_get(n_meta, keys, values, "latent_first");
    int64_t first = 0;
    if (v1 && lf) return core_error("%s: metadata 'latent_first' needs format_version '%s'", label, FORMAT_VERSION_2);
    if (v1 && tv[T_MEANS]) return core_error("%s: tensor 'means' needs format_version '%s'", label, FORMAT_VERSION_2);
    if (v1 && tv[T_CONDITION])
        return core_error("%s: tensor 'condition' needs format_version '%s'", label, FORMAT_VERSION_2);
    if (v1 && tv[T_CONCAT]) return core_error("%s: tensor 'concat' needs format_version '%s'", label, FORMAT_VERSION_2);
    if (lf && (parse_i64(lf, &first) || first < 0 || first > N))
        return core_error("%s: metadata 'latent_first' = '%.40s' is not an integer in [0, %d] (N = %d)", label, lf, N, N);
    const core_tensor *la = tv[T_LATENTS];
    int lat_ok = la->ndim == 5 && (v1 ? la->shape[0] == N + 1 : la->shape[0] >= 1 && la->shape[0] <= N + 1 - first);
    for (int d = 1; lat_ok && d < 5; d++) lat_ok = la->shape[d] >= 1;
    if (!lat_ok) {
        shape_str(la, s, sizeof s);
        if (v1)
            return core_error("%s: tensor 'latents' has shape %s, expected [N+1 = %d, C, F, H, W] with every dim >= 1", label,
                              s, N + 1);
        return core_error("%s: tensor 'latents' has shape %s, expected [M, C, F, H, W] with 1 <= M <= N + 1 - latent_first "
                          "= %lld and every dim >= 1", label, s, (long long)(N + 1 - first));
    }
    const int M = (int)la->shape[0];
    const core_tensor *me = tv[T_MEANS];
    if (me) {
        int ok = M >= 2 && me->ndim == 5 && me->shape[0] == M - 1;
        for (int d = 1; ok && d < 5; d++) ok = me->shape[d] == la->shape[d];
        if (!ok) {
            shape_str(me, s, sizeof s);
            return core_error("%s: tensor 'means' has shape %s, expected [M - 1 = %d, %lld, %lld, %lld, %lld] (M = %d stored "
                              "latents; at least 2)", label, s, M - 1, (long long)la->shape[1], (long long)la->shape[2],
                              (long long)la->shape[3], (long long)la->shape[4], M);
        }
    }
    const core_tensor *co = tv[T_CONDITION];
    if (co) {
        const int ok = co->ndim == 4 && co->shape[0] == la->shape[1] && co->shape[1] == 1 &&
                       co->shape[2] == la->shape[3] && co->shape[3] == la->shape[4] && la->shape[2] >= 2;
        if (!ok) {
            shape_str(co, s, sizeof s);
            return core_error("%s: tensor 'condition' has shape %s, expected [C = %lld, 1, H = %lld, W = %lld] with at "
                              "least 2 latent frames (F = %lld)", label, s, (long long)la->shape[1],
                              (long long)la->shape[3], (long long)la->shape[4], (long long)la->shape[2]);
        }
    }
    const core_tensor *ca = tv[T_CONCAT];
    if (ca) {
        const int ok = ca->ndim == 4 && ca->shape[0] >= 1 && ca->shape[0] <= MAX_CONCAT_CHANNELS &&
                       ca->shape[1] == la->shape[2] && ca->shape[2] == la->shape[3] && ca->shape[3] == la->shape[4];
        if (!ok) {
            shape_str(ca, s, sizeof s);
            return core_error("%s: tensor 'concat' has shape %s, expected [K, F = %lld, H = %lld, W = %lld] with 1 <= K "
                              "<= %d", label, s, (long long)la->shape[2], (long long)la->shape[3],
                              (long long)la->shape[4], MAX_CONCAT_CHANNELS);
        }
    }

    core_traj tmp;
    memset(&tmp, 0, sizeof tmp);
    if (read_meta(n_meta, keys, values, "uid", 'u', &tmp.uid, label) ||
        read_meta(n_meta, keys, values, "prompt_index", 'i', &tmp.prompt_index, label) ||
        read_meta(n_meta, keys, values, "policy_version", 'i', &tmp.policy_version, label) ||
        read_meta(n_meta, keys, values, "eta", 'f', &tmp.eta, label) ||
        read_meta(n_meta, keys, values, "guidance_scale", 'f', &tmp.guidance_scale, label) ||
        read_meta(n_meta, keys, values, "guidance_scale_2", 'f', &tmp.guidance_scale_2, label) ||
        read_meta(n_meta, keys, values, "reward_total", 'f', &tmp.reward_total, label))
        return -1;
    const int R = (int)rw->shape[0];
    if (read_reward_names(&tmp, meta_get(n_meta, keys, values, "reward_names"), R, label)) return -1;

    if (alloc_range(t, N, &la->shape[1], (int)first, M) || (me && core_traj_alloc_means(t)) ||
        (co && core_traj_alloc_condition(t))) {
        core_traj_free(t);
        return core_error_push("%s: ", label);
    }
    if (ca && !(t->concat = malloc(core_tensor_nbytes(ca)))) {
        core_traj_free(t);
        return core_error("%s: out of memory for the concat condition", label);
    }
    /* Keep the arrays alloc_range made; take everything else from tmp. */
    tmp.n_steps = t->n_steps;
    memcpy(tmp.shape, t->shape, sizeof tmp.shape);
    tmp.latent_first = t->latent_first;
    tmp.n_latents = t->n_latents;
    tmp.sigmas = t->sigmas;
    tmp.timesteps = t->timesteps;
    tmp.latents = t->latents;
    tmp.means = t->means;
    tmp.condition = t->condition;
    tmp.concat = t->concat;
    tmp.concat_channels = ca ? ca->shape[0] : 0;
    tmp.log_probs = t->log_probs;
    tmp.has_log_prob = t->has_log_prob;
    tmp.expert = t->expert;
    tmp.n_rewards = R;
    *t = tmp;
    memcpy(t->sigmas, sg->data, core_tensor_nbytes(sg));
    memcpy(t->timesteps, tv[T_TIMESTEPS]->data, core_tensor_nbytes(tv[T_TIMESTEPS]));
    memcpy(t->latents, la->data, core_tensor_nbytes(la));
    if (me) memcpy(t->means, me->data, core_tensor_nbytes(me));
    if (co) memcpy(t->condition, co->data, core_tensor_nbytes(co));
    if (ca) memcpy(t->concat, ca->data, core_tensor_nbytes(ca));
    memcpy(t->log_probs, tv[T_LOG_PROBS]->data, core_tensor_nbytes(tv[T_LOG_PROBS]));
    memcpy(t->has_log_prob, tv[T_HAS_LOG_PROB]->data, (size_t)N);
    memcpy(t->expert, tv[T_EXPERT]->data, (size_t)N);
    if (R) memcpy(t->rewards, rw->data, sizeof(float) * (size_t)R);
    if (core_traj_validate(t, label)) {
        core_traj_free(t);
        return -1;
    }
    return 0;
}

int core_traj_from_fields(core_traj *t, int n_tensors, const char *const *names, const core_tensor *tensors,
                          int n_meta, const char *const *keys, const char *const *values, const char *label)
{
    memset(t, 0, sizeof *t);
    return from_fields(t, n_tensors, names, tensors, n_meta, keys, values, label);
}

int core_traj_save(const core_traj *t, const char *path)
{
    core_traj_fields f;
    if (to_fields(t, &f, path)) return -1;
    st_writer *w = st_writer_new();
    int rc = w ? 0 : -1;
    for (int k = 0; k < f.n_tensors && !rc; k++) rc = st_writer_add_tensor(w, f.tensor_names[k], &f.tensors[k]);
    for (int k = 0; k < f.n_meta && !rc; k++) rc = st_writer_set_metadata(w, f.meta_keys[k], f.meta_values[k]);
    if (!rc) rc = st_writer_write(w, path);
    st_writer_free(w);
    core_traj_fields_free(&f);
    return rc;
}

int core_traj_load(core_traj *t, const char *path)
{
    memset(t, 0, sizeof *t);
    st_file *f = st_open(path);
    if (!f) return -1;
    const int n = st_count(f), m = st_metadata_count(f);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    core_tensor *views = calloc((size_t)n + 1, sizeof *views);
    const char **keys = calloc((size_t)m + 1, sizeof *keys);
    const char **values = calloc((size_t)m + 1, sizeof *values);
    int rc = (names && views && keys && values) ? 0 : core_error("%s: out of memory", path);
    int got = 0;
    for (; got < n && !rc; got++) {
        names[got] = st_name(f, got);
        rc = st_get(f, names[got], &views[got]);
    }
    for (int i = 0; i < m && !rc; i++) {
        keys[i] = st_metadata_key(f, i);
        values[i] = st_metadata(f, keys[i]);
    }
    if (!rc) rc = from_fields(t, n, names, views, m, keys, values, path);
    for (int i = 0; i < got; i++) core_tensor_free(&views[i]);
    free(names);
    free(views);
    free(keys);
    free(values);
    st_close(f);
    return rc;
}

int core_traj_batch_steps(const core_traj *t, int n, const char *who, int *n_steps) {
    if (n < 1) return core_error("%s: empty batch", who);
    const int N = t[0].n_steps;
    for (int s = 1; s < n; s++)
        if (t[s].n_steps != N)
            return core_error("%s: trajectory %d (uid %llu) has %d steps, trajectory 0 has %d", who, s,
                              (unsigned long long)t[s].uid, t[s].n_steps, N);
    *n_steps = N;
    return 0;
}
