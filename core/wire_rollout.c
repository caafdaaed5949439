/* core/wire_rollout.c — rollout_request and trajectory messages (see core/wire_rollout.h). */
#include "core/wire_rollout.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"

/* A stored trajectory's tensors without the optional `means` and `condition` (core/trajectory.h). */
#define TRAJ_TENSORS_MIN CORE_TRAJ_N_REQUIRED

void core_hash_hex(uint64_t h, char buf[17]) { snprintf(buf, 17, "%016" PRIx64, h); }

int core_hash_parse(const char *s, uint64_t *h) {
    if (!s || strlen(s) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *h = v;
    return 0;
}

static int get_int(const json_t *o, const char *key, const char *where, int64_t lo, int64_t hi, int64_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return core_error("%s: \"%s\" must be an integer", where, key);
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) return core_error("%s: \"%s\" = %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", where, key, x, lo, hi);
    *out = x;
    return 0;
}

int core_rollout_request_build(const char *id, const core_rollout_request *req, core_wire_built *out) {
    if (req->n < 1 || req->n > CORE_WIRE_MAX_SAMPLES)
        return core_error("rollout_request: %d samples (1..%d)", req->n, CORE_WIRE_MAX_SAMPLES);
    json_t *f = json_object(), *arr = json_array();
    json_object_set_new(f, "policy_version", json_integer(req->policy_version));
    json_object_set_new(f, "stream", json_string(req->stream == CORE_STREAM_EVAL_NOISE ? "eval" : "rollout"));
    json_object_set_new(f, "eta", json_real(req->eta));
    json_object_set_new(f, "return_trajectories", json_boolean(req->return_trajectories));
    json_object_set_new(f, "return_videos", json_boolean(req->return_videos));
    if (req->return_velocities) json_object_set_new(f, "return_velocities", json_true());
    if (req->sde_type) json_object_set_new(f, "sde_type", json_string("cps"));
    if (req->logp_mode) json_object_set_new(f, "logp", json_string("flow_grpo"));
    if (req->window_hi > 0) {
        json_t *w = json_array();
        json_array_append_new(w, json_integer(req->window_lo));
        json_array_append_new(w, json_integer(req->window_hi));
        json_object_set_new(f, "sde_window", w);
    }
    if (req->return_means) json_object_set_new(f, "return_means", json_true());
    for (int j = 0; j < req->n; j++) {
        const core_rollout_sample *s = &req->samples[j];
        json_t *o = json_object();
        json_object_set_new(o, "uid", json_integer((json_int_t)s->uid));
        json_object_set_new(o, "prompt_index", json_integer(s->prompt_index));
        json_object_set_new(o, "prompt", json_string(s->prompt ? s->prompt : ""));
        if (s->metadata) json_object_set(o, "metadata", (json_t *)s->metadata);
        json_array_append_new(arr, o);
    }
    json_object_set_new(f, "samples", arr);
    /* image conditions (TI2V): one "<j>/condition" F32 [C, 1, h, w] per sample, in sample order */
    const int nc = req->cond_shape[0] > 0 ? req->n : 0;
    core_wire_tensor *ts = nc ? calloc((size_t)nc, sizeof *ts) : NULL;
    char (*names)[32] = nc ? calloc((size_t)nc, sizeof *names) : NULL;
    int rc = nc && (!ts || !names) ? core_error("out of memory") : 0;
    for (int j = 0; j < nc && !rc; j++) {
        if (!req->samples[j].condition) {
            rc = core_error("rollout_request: samples[%d] has no condition (a conditioned request gives every sample "
                            "one)", j);
            break;
        }
        snprintf(names[j], sizeof names[j], "%d/condition", j);
        ts[j] = (core_wire_tensor){.name = names[j], .dtype = CORE_F32, .ndim = 4, .data = req->samples[j].condition};
        memcpy(ts[j].shape, req->cond_shape, sizeof req->cond_shape);
        ts[j].nbytes = sizeof(float) * (size_t)(req->cond_shape[0] * req->cond_shape[1] * req->cond_shape[2] *
                                                req->cond_shape[3]);
    }
    if (!rc) rc = core_wire_build(CORE_WIRE_ROLLOUT_REQUEST, id, f, ts, nc, out);
    json_decref(f);
    free(ts), free(names);
    return rc;
}

int core_rollout_request_parse(const core_wire_msg *m, core_rollout_request *req) {
    memset(req, 0, sizeof *req);
    const json_t *h = m->header;
    if (m->type != CORE_WIRE_ROLLOUT_REQUEST) return core_error("rollout_request: message type is not rollout_request");
    if (get_int(h, "policy_version", "rollout_request", 0, INT64_MAX, &req->policy_version)) return -1;
    const char *st = json_string_value(json_object_get(h, "stream"));
    if (!st || (strcmp(st, "rollout") && strcmp(st, "eval")))
        return core_error("rollout_request: \"stream\" must be \"rollout\" or \"eval\"");
    req->stream = !strcmp(st, "eval") ? CORE_STREAM_EVAL_NOISE : CORE_STREAM_ROLLOUT_NOISE;
    const json_t *eta = json_object_get(h, "eta");
    if (!json_is_number(eta) || !(json_number_value(eta) >= 0) || !isfinite(json_number_value(eta)) ||
        json_number_value(eta) > 100)
        return core_error("rollout_request: \"eta\" must be a number in [0, 100]");
    req->eta = (float)json_number_value(eta);
    const json_t *rt = json_object_get(h, "return_trajectories"), *rv = json_object_get(h, "return_videos");
    if (!json_is_boolean(rt)) return core_error("rollout_request: \"return_trajectories\" must be true or false");
    if (!json_is_boolean(rv)) return core_error("rollout_request: \"return_videos\" must be true or false");
    req->return_trajectories = json_is_true(rt), req->return_videos = json_is_true(rv);
    const json_t *rvel = json_object_get(h, "return_velocities");
    if (rvel && !json_is_boolean(rvel)) return core_error("rollout_request: \"return_velocities\" must be true or false");
    req->return_velocities = json_is_true(rvel);
    if (req->return_velocities && !req->return_trajectories)
        return core_error("rollout_request: \"return_velocities\" needs \"return_trajectories\"");
    const json_t *sty = json_object_get(h, "sde_type"), *lpm = json_object_get(h, "logp");
    const json_t *win = json_object_get(h, "sde_window"), *rme = json_object_get(h, "return_means");
    if (sty && (!json_is_string(sty) || (strcmp(json_string_value(sty), "sde") && strcmp(json_string_value(sty), "cps"))))
        return core_error("rollout_request: \"sde_type\" must be \"sde\" or \"cps\"");
    req->sde_type = sty && !strcmp(json_string_value(sty), "cps");
    if (lpm && (!json_is_string(lpm) ||
                (strcmp(json_string_value(lpm), "exact") && strcmp(json_string_value(lpm), "flow_grpo"))))
        return core_error("rollout_request: \"logp\" must be \"exact\" or \"flow_grpo\"");
    req->logp_mode = lpm && !strcmp(json_string_value(lpm), "flow_grpo");
    if (win) {
        const json_t *a = json_array_get(win, 0), *b = json_array_get(win, 1);
        if (!json_is_array(win) || json_array_size(win) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 0 || json_integer_value(b) <= json_integer_value(a) || json_integer_value(b) > 1000)
            return core_error("rollout_request: \"sde_window\" must be [lo, hi] with 0 <= lo < hi <= 1000");
        req->window_lo = (int)json_integer_value(a), req->window_hi = (int)json_integer_value(b);
    }
    if (rme && !json_is_boolean(rme)) return core_error("rollout_request: \"return_means\" must be true or false");
    req->return_means = json_is_true(rme);
    if (req->return_means && !req->return_trajectories)
        return core_error("rollout_request: \"return_means\" needs \"return_trajectories\"");
    const json_t *arr = json_object_get(h, "samples");
    if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > CORE_WIRE_MAX_SAMPLES)
        return core_error("rollout_request: \"samples\" must be an array of 1..%d objects", CORE_WIRE_MAX_SAMPLES);
    req->n = (int)json_array_size(arr);
    if (!(req->samples = calloc((size_t)req->n, sizeof *req->samples))) return core_error("out of memory");
    for (int j = 0; j < req->n; j++) {
        const json_t *o = json_array_get(arr, (size_t)j);
        char where[64];
        snprintf(where, sizeof where, "rollout_request: samples[%d]", j);
        core_rollout_sample *s = &req->samples[j];
        int64_t u = 0;
        if (!json_is_object(o)) goto bad_obj;
        if (get_int(o, "uid", where, 0, 0xffffffffll, &u) || get_int(o, "prompt_index", where, 0, INT64_MAX, &s->prompt_index))
            goto fail;
        s->uid = (uint64_t)u;
        for (int k = 0; k < j; k++)
            if (req->samples[k].uid == s->uid) {
                core_error("%s: uid %" PRIu64 " repeats samples[%d]", where, s->uid, k);
                goto fail;
            }
        if (!(s->prompt = json_string_value(json_object_get(o, "prompt")))) {
            core_error("%s: \"prompt\" must be a string", where);
            goto fail;
        }
        const json_t *md = json_object_get(o, "metadata");
        if (md && !json_is_null(md)) {
            if (!json_is_object(md)) {
                core_error("%s: \"metadata\" must be an object of strings", where);
                goto fail;
            }
            const char *k;
            const json_t *v;
            json_object_foreach((json_t *)md, k, v) if (!json_is_string(v)) {
                core_error("%s: metadata \"%s\" must be a string", where, k);
                goto fail;
            }
            s->metadata = md;
        }
        continue;
    bad_obj:
        core_error("%s: must be an object", where);
        goto fail;
    }
    if (m->n_tensors && m->n_tensors != req->n) {
        core_error("rollout_request: carries %d tensors (none, or one \"<j>/condition\" per sample: %d)", m->n_tensors,
                   req->n);
        goto fail;
    }
    for (int j = 0; j < m->n_tensors; j++) { /* copied: a frame's bytes need not be aligned for floats */
        const core_wire_tensor *t = &m->tensors[j];
        char want[32];
        snprintf(want, sizeof want, "%d/condition", j);
        const core_wire_tensor *t0 = &m->tensors[0];
        if (strcmp(t->name, want) || t->dtype != CORE_F32 || t->ndim != 4 || t->shape[1] < 1 || t->shape[0] < 1 ||
            t->shape[2] < 1 || t->shape[3] < 1 || t->shape[0] > 4096 || t->shape[1] > 4096 ||
            memcmp(t->shape, t0->shape, sizeof(int64_t) * 4)) {
            core_error("rollout_request: tensor %d must be \"%s\" F32 [C, 1, h, w] or [K, F, h, w] (the shape of "
                       "tensor 0)", j, want);
            goto fail;
        }
        if (j == 0) {
            memcpy(req->cond_shape, t->shape, sizeof req->cond_shape);
            if (!(req->cond_buf = malloc(t->nbytes * (size_t)req->n))) {
                core_error("out of memory");
                goto fail;
            }
        }
        float *c = req->cond_buf + (size_t)j * (t->nbytes / sizeof(float));
        memcpy(c, t->data, t->nbytes);
        for (size_t k = 0; k < t->nbytes / sizeof(float); k++)
            if (!isfinite(c[k])) {
                core_error("rollout_request: \"%s\" element %zu is not finite", want, k);
                goto fail;
            }
        req->samples[j].condition = c;
    }
    return 0;
fail:
    core_rollout_request_free(req);
    return -1;
}

void core_rollout_request_free(core_rollout_request *req) {
    free(req->samples);
    free(req->cond_buf);
    memset(req, 0, sizeof *req);
}

/* ---- trajectory replies ---- */

void core_rollout_result_free(core_rollout_result *r) {
    core_traj_free(&r->traj);
    free(r->velocity);
    r->velocity = NULL;
}

int core_trajectory_reply_build(const char *id, int64_t policy_version, int n, const core_traj *tr,
                                const uint64_t *video_hash, int with_traj, const uint8_t *videos,
                                const int64_t vshape[4], core_wire_built *out) {
    return core_trajectory_reply_build_v(id, policy_version, n, tr, video_hash, with_traj, NULL, videos, vshape, out);
}

int core_trajectory_reply_build_v(const char *id, int64_t policy_version, int n, const core_traj *tr,
                                  const uint64_t *video_hash, int with_traj, const float *const *vel,
                                  const uint8_t *videos, const int64_t vshape[4], core_wire_built *out) {
    memset(out, 0, sizeof *out);
    if (n < 1 || n > CORE_WIRE_MAX_SAMPLES) return core_error("trajectory: %d samples", n);
    if (vel && !with_traj) return core_error("trajectory: velocities need the trajectories");
    /* At most: a sample's trajectory has CORE_TRAJ_N_TENSORS tensors with means and condition, fewer without. */
    const int per = with_traj ? CORE_TRAJ_N_TENSORS + (vel ? 1 : 0) : 0;
    core_wire_tensor *ts = calloc((size_t)(n * per + 1), sizeof *ts);
    char (*names)[48] = calloc((size_t)(n * per + 1), sizeof *names);
    core_traj_fields *flds = calloc((size_t)n, sizeof *flds);
    json_t *f = json_object(), *arr = json_array();
    int nt = 0, rc = -1, nf = 0;
    if (!ts || !names || !flds) {
        core_error("out of memory");
        goto done;
    }
    for (int j = 0; j < n; j++) {
        const core_traj *t = &tr[j];
        json_t *o = json_object(), *rw = json_object();
        json_object_set_new(o, "uid", json_integer((json_int_t)t->uid));
        json_object_set_new(o, "prompt_index", json_integer(t->prompt_index));
        json_object_set_new(o, "reward_total", json_real(t->reward_total));
        for (int r = 0; r < t->n_rewards; r++) json_object_set_new(rw, t->reward_names[r], json_real(t->rewards[r]));
        json_object_set_new(o, "rewards", rw);
        char hx[17];
        core_hash_hex(video_hash[j], hx);
        json_object_set_new(o, "video_xxh64", json_string(hx));
        json_array_append_new(arr, o);
        if (!with_traj) continue;
        if (core_traj_to_fields(t, &flds[j])) {
            core_error_push("trajectory: sample %d (uid %" PRIu64 "): ", j, t->uid);
            goto done;
        }
        nf = j + 1;
        json_t *md = json_object();
        for (int k = 0; k < flds[j].n_meta; k++) json_object_set_new(md, flds[j].meta_keys[k], json_string(flds[j].meta_values[k]));
        json_object_set_new(o, "trajectory", md);
        for (int k = 0; k < flds[j].n_tensors; k++) {
            const core_tensor *x = &flds[j].tensors[k];
            snprintf(names[nt], sizeof names[nt], "%d/%s", j, flds[j].tensor_names[k]);
            ts[nt].name = names[nt];
            ts[nt].dtype = x->dtype;
            ts[nt].ndim = x->ndim;
            memcpy(ts[nt].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
            ts[nt].data = x->data;
            ts[nt].nbytes = core_tensor_nbytes(x);
            nt++;
        }
        if (vel) {
            snprintf(names[nt], sizeof names[nt], "%d/velocity", j);
            ts[nt] = (core_wire_tensor){.name = names[nt], .dtype = CORE_F32, .ndim = 5, .data = vel[j]};
            ts[nt].shape[0] = t->n_steps;
            memcpy(ts[nt].shape + 1, t->shape, sizeof(int64_t) * 4);
            ts[nt].nbytes = sizeof(float) * (size_t)t->n_steps * (size_t)core_traj_latent_numel(t);
            nt++;
        }
    }
    if (videos) {
        ts[nt] = (core_wire_tensor){.name = "videos", .dtype = CORE_U8, .ndim = 5, .data = videos};
        ts[nt].shape[0] = n;
        memcpy(ts[nt].shape + 1, vshape, sizeof(int64_t) * 4);
        ts[nt].nbytes = (size_t)n * (size_t)(vshape[0] * vshape[1] * vshape[2] * vshape[3]);
        nt++;
    }
    json_object_set_new(f, "policy_version", json_integer(policy_version));
    json_object_set_new(f, "samples", arr);
    arr = NULL;
    rc = core_wire_build(CORE_WIRE_TRAJECTORY, id, f, ts, nt, out);
done:
    json_decref(arr);
    json_decref(f);
    for (int j = 0; j < nf; j++) core_traj_fields_free(&flds[j]);
    free(flds), free(ts), free(names);
    return rc;
}

int core_trajectory_reply_parse(const core_wire_msg *m, const core_rollout_request *req, core_rollout_result *out,
                                const uint8_t **videos, int64_t vshape[4]) {
    const json_t *h = m->header;
    memset(out, 0, sizeof *out * (size_t)req->n);
    *videos = NULL;
    if (m->type != CORE_WIRE_TRAJECTORY) return core_error("trajectory: message type is not trajectory");
    int64_t pv = 0;
    if (get_int(h, "policy_version", "trajectory", 0, INT64_MAX, &pv)) return -1;
    if (pv != req->policy_version)
        return core_error("trajectory: policy_version %" PRId64 ", the request asked for %" PRId64, pv, req->policy_version);
    const json_t *arr = json_object_get(h, "samples");
    if (!json_is_array(arr) || (int)json_array_size(arr) != req->n)
        return core_error("trajectory: \"samples\" must be an array of %d objects (one per requested sample)", req->n);
    /* Per sample with trajectories: its trajectory's tensors (TRAJ_TENSORS_MIN, or up to two more with the optional
     * means and condition), then its velocity when asked; the videos last. The samples' tensors are counted as they
     * are read. */
    const int nv = req->return_velocities ? 1 : 0, nvid = req->return_videos ? 1 : 0;
    const int per = req->return_trajectories ? CORE_TRAJ_N_TENSORS + nv : 0;
    const int per_min = req->return_trajectories ? TRAJ_TENSORS_MIN + nv : 0;
    const int end = m->n_tensors - nvid; /* the samples' tensors are [0, end) */
    if (m->n_tensors < req->n * per_min + nvid || m->n_tensors > req->n * per + nvid) {
        if (per == per_min) return core_error("trajectory: %d tensors, expected %d", m->n_tensors, req->n * per + nvid);
        return core_error("trajectory: %d tensors, expected %d .. %d", m->n_tensors, req->n * per_min + nvid,
                          req->n * per + nvid);
    }
    int pos = 0; /* the next sample tensor */
    for (int j = 0; j < req->n; j++) {
        const json_t *o = json_array_get(arr, (size_t)j);
        char where[64];
        snprintf(where, sizeof where, "trajectory: samples[%d]", j);
        core_rollout_result *res = &out[j];
        int64_t u = 0, pi = 0;
        if (!json_is_object(o)) {
            core_error("%s: must be an object", where);
            goto fail;
        }
        if (get_int(o, "uid", where, 0, 0xffffffffll, &u) || get_int(o, "prompt_index", where, 0, INT64_MAX, &pi)) goto fail;
        if ((uint64_t)u != req->samples[j].uid || pi != req->samples[j].prompt_index) {
            core_error("%s: uid %" PRId64 " / prompt_index %" PRId64 " do not match the request's %" PRIu64 " / %" PRId64,
                       where, u, pi, req->samples[j].uid, req->samples[j].prompt_index);
            goto fail;
        }
        if (core_hash_parse(json_string_value(json_object_get(o, "video_xxh64")), &res->video_hash)) {
            core_error("%s: \"video_xxh64\" must be 16 hex digits", where);
            goto fail;
        }
        const json_t *tot = json_object_get(o, "reward_total"), *rw = json_object_get(o, "rewards");
        if (!json_is_number(tot) || !isfinite(json_number_value(tot))) {
            core_error("%s: \"reward_total\" must be a finite number", where);
            goto fail;
        }
        if (!json_is_object(rw) || json_object_size(rw) > CORE_TRAJ_MAX_REWARDS) {
            core_error("%s: \"rewards\" must be an object of at most %d numbers", where, CORE_TRAJ_MAX_REWARDS);
            goto fail;
        }
        const char *names[CORE_TRAJ_MAX_REWARDS];
        float vals[CORE_TRAJ_MAX_REWARDS];
        int nr = 0;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)rw, k, v) {
            if (!json_is_number(v) || !isfinite(json_number_value(v))) {
                core_error("%s: reward \"%s\" must be a finite number", where, k);
                goto fail;
            }
            names[nr] = k, vals[nr] = (float)json_number_value(v), nr++;
        }
        if (per) {
            const json_t *md = json_object_get(o, "trajectory");
            if (!json_is_object(md) || json_object_size(md) > 32) {
                core_error("%s: \"trajectory\" must be an object of metadata strings", where);
                goto fail;
            }
            const char *keys[32], *values[32];
            int nm = 0;
            json_object_foreach((json_t *)md, k, v) {
                if (!json_is_string(v)) {
                    core_error("%s: trajectory metadata \"%s\" must be a string", where, k);
                    goto fail;
                }
                keys[nm] = k, values[nm] = json_string_value(v), nm++;
            }
            const char *tn[CORE_TRAJ_N_TENSORS];
            core_tensor tt[CORE_TRAJ_N_TENSORS];
            char prefix[24];
            const int plen = snprintf(prefix, sizeof prefix, "%d/", j);
            int q = 0; /* the sample's trajectory tensors: those named "<j>/..." up to its velocity */
            for (; q < CORE_TRAJ_N_TENSORS && pos < end; q++, pos++) {
                const core_wire_tensor *w = &m->tensors[pos];
                if (strncmp(w->name, prefix, (size_t)plen) || (nv && !strcmp(w->name + plen, "velocity"))) break;
                tn[q] = w->name + plen;
                core_tensor_wrap(&tt[q], (void *)w->data, w->dtype, w->ndim, w->shape);
            }
            if (q == 0 && pos < end) {
                core_error("%s: tensor %d is \"%s\", expected a \"%s...\" tensor", where, pos, m->tensors[pos].name, prefix);
                goto fail;
            }
            if (core_traj_from_fields(&res->traj, q, tn, tt, nm, keys, values, where)) goto fail;
            if (req->return_means && !res->traj.means) { /* GRPO-Guard reads them: asked, so they must be there */
                core_error("%s: the request asked for the step means (return_means) but the trajectory has no \"means\"",
                           where);
                goto fail;
            }
            if (nv) {
                if (pos >= end) {
                    core_error("%s: tensor \"%svelocity\" missing", where, prefix);
                    goto fail;
                }
                const core_wire_tensor *w = &m->tensors[pos++];
                const core_traj *t = &res->traj;
                int ok = !strncmp(w->name, prefix, (size_t)plen) && !strcmp(w->name + plen, "velocity") &&
                         w->dtype == CORE_F32 && w->ndim == 5 && w->shape[0] == t->n_steps;
                for (int d = 0; ok && d < 4; d++) ok = w->shape[d + 1] == t->shape[d];
                if (!ok) {
                    core_error("%s: tensor \"%s\" must be \"%svelocity\" F32 [N, C, F, H, W] of the trajectory", where,
                               w->name, prefix);
                    goto fail;
                }
                if (!(res->velocity = malloc(w->nbytes))) {
                    core_error("out of memory");
                    goto fail;
                }
                memcpy(res->velocity, w->data, w->nbytes);
            }
            if (res->traj.uid != (uint64_t)u || res->traj.policy_version != pv) {
                core_error("%s: trajectory metadata uid/policy_version differ from the sample's", where);
                goto fail;
            }
        }
        res->traj.uid = (uint64_t)u;
        res->traj.prompt_index = pi;
        res->traj.policy_version = pv;
        if (core_traj_set_rewards(&res->traj, nr, names, vals, (float)json_number_value(tot))) {
            core_error_push("%s: ", where);
            goto fail;
        }
    }
    if (pos != end) {
        core_error("trajectory: %d tensors, expected %d (tensor %d \"%s\" belongs to no sample)", m->n_tensors, pos + nvid,
                   pos, m->tensors[pos].name);
        goto fail;
    }
    if (req->return_videos) {
        const core_wire_tensor *w = &m->tensors[m->n_tensors - 1];
        if (strcmp(w->name, "videos") || w->dtype != CORE_U8 || w->ndim != 5 || w->shape[0] != req->n || w->shape[4] != 3) {
            core_error("trajectory: the last tensor must be \"videos\" U8 [%d, F, H, W, 3]", req->n);
            goto fail;
        }
        memcpy(vshape, w->shape + 1, sizeof(int64_t) * 4);
        *videos = w->data;
    }
    return 0;
fail:
    for (int j = 0; j < req->n; j++) core_rollout_result_free(&out[j]);
    return -1;
}

/* a x b, saturating at SIZE_MAX (a, b >= 0). */
static size_t mul_sat(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

size_t core_rollout_reply_max_frame(int num_steps, int c_in, int c_out, int F, int H, int W, int batch,
                                    size_t video_bytes) {
    const size_t fhw = mul_sat(mul_sat((size_t)(F > 0 ? F : 0), (size_t)(H > 0 ? H : 0)), (size_t)(W > 0 ? W : 0));
    const size_t rows = max_sz(mul_sat((size_t)(num_steps > 0 ? num_steps : 0) + 1, (size_t)(c_out > 0 ? c_out : 0)),
                               (size_t)(c_in > c_out ? c_in - c_out : 0)); /* latents (and velocities), concat */
    size_t b = mul_sat(mul_sat(rows, fhw), sizeof(float));
    b = max_sz(b, mul_sat((size_t)(batch > 0 ? batch : 0), video_bytes));
    return max_sz(b, core_wire_limits_default().max_header_bytes);
}

size_t core_rollout_worker_max_frame(int64_t max_tensor_numel, int c_in, int F, int H, int W) {
    const size_t fhw = mul_sat(mul_sat((size_t)(F > 0 ? F : 0), (size_t)(H > 0 ? H : 0)), (size_t)(W > 0 ? W : 0));
    size_t b = mul_sat(mul_sat((size_t)(c_in > 0 ? c_in : 0), fhw), sizeof(float));
    b = max_sz(b, mul_sat((size_t)(max_tensor_numel > 0 ? max_tensor_numel : 0), sizeof(float)));
    return max_sz(b, core_wire_limits_default().max_header_bytes);
}
