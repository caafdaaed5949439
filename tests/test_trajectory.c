/* tests/test_trajectory.c — core/trajectory: bit-exact round trips through a file and through the named-tensor
 * form (full trajectories, and stored ranges with and without the step means), the stored layout (a full trajectory
 * without means byte for byte as before format_version 2), trimming, and rejection of bad files with the faulty
 * field named. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/checksum.h"
#include "core/safetensors.h"
#include "core/trajectory.h"
#include "rollout/pipeline.h"
#include "tests/test.h"

/* A trajectory with awkward values: N = 3, latent [2,3,4,5], step 1 without log-prob, two experts, fp32 scalars that
 * need 9 digits, a u64 uid above 2^63, a negative policy version. */
static void make_traj(core_traj *t) {
    const int64_t shape[4] = {2, 3, 4, 5};
    REQUIRE_OK(core_traj_alloc(t, 3, shape));
    const float sig[4] = {1.0f, 0.7123456789f, 0.1f, 0.0f};
    for (int i = 0; i < 4; i++) t->sigmas[i] = sig[i];
    for (int i = 0; i < 3; i++) t->timesteps[i] = sig[i] * 1000.0f;
    test_fill_uniform(t->latents, (size_t)(4 * core_traj_latent_numel(t)), 77, -3, 3);
    core_traj_latent(t, 2)[5] = 1e-40f; /* a subnormal */
    t->log_probs[0] = 1.2345679e-7f;
    t->log_probs[2] = -3.3333333f;
    t->has_log_prob[0] = 1;
    t->has_log_prob[2] = 1;
    t->expert[0] = 0;
    t->expert[1] = 1;
    t->expert[2] = 1;
    t->uid = (1ULL << 63) + 12345;
    t->prompt_index = 42;
    t->policy_version = -7;
    t->eta = 0.7f;
    t->guidance_scale = 5.0f;
    t->guidance_scale_2 = 0.1f;
    const char *names[2] = {"color_match", "brightness"};
    const float vals[2] = {0.333333343f, 1e-30f};
    REQUIRE_OK(core_traj_set_rewards(t, 2, names, vals, 0.333333343f + 1e-30f));
}

/* A make_traj trajectory whose only step with a log-prob is 1 (an SDE window), trimmed to latents[1 .. 2] (what
 * training reads), with the means of steps 0..2 filled before the trim when with_means. */
static void make_window(core_traj *t, int with_means) {
    make_traj(t);
    t->has_log_prob[0] = t->has_log_prob[2] = 0, t->log_probs[0] = t->log_probs[2] = 0;
    t->has_log_prob[1] = 1, t->log_probs[1] = -0.25f;
    if (with_means) {
        REQUIRE_OK(core_traj_alloc_means(t));
        test_fill_uniform(t->means, (size_t)(3 * core_traj_latent_numel(t)), 78, -1, 1);
    }
    REQUIRE_OK(core_traj_trim(t, 1, 2));
}

static void check_same(const core_traj *a, const core_traj *b) {
    CHECK(a->n_steps == b->n_steps && memcmp(a->shape, b->shape, sizeof a->shape) == 0);
    CHECK(a->latent_first == b->latent_first && a->n_latents == b->n_latents);
    const int N = a->n_steps;
    const size_t lat = sizeof(float) * (size_t)(a->n_latents * core_traj_latent_numel(a));
    CHECK(memcmp(a->sigmas, b->sigmas, sizeof(float) * (N + 1)) == 0);
    CHECK(memcmp(a->timesteps, b->timesteps, sizeof(float) * N) == 0);
    CHECK(a->n_latents == b->n_latents && memcmp(a->latents, b->latents, lat) == 0);
    CHECK(!a->means == !b->means);
    if (a->means && b->means && a->n_latents == b->n_latents)
        CHECK(memcmp(a->means, b->means, lat - sizeof(float) * (size_t)core_traj_latent_numel(a)) == 0);
    CHECK(memcmp(a->log_probs, b->log_probs, sizeof(float) * N) == 0);
    CHECK(memcmp(a->has_log_prob, b->has_log_prob, N) == 0 && memcmp(a->expert, b->expert, N) == 0);
    CHECK(a->uid == b->uid && a->prompt_index == b->prompt_index && a->policy_version == b->policy_version);
    CHECK(memcmp(&a->eta, &b->eta, 4) == 0 && memcmp(&a->guidance_scale, &b->guidance_scale, 4) == 0);
    CHECK(memcmp(&a->guidance_scale_2, &b->guidance_scale_2, 4) == 0);
    CHECK(memcmp(&a->reward_total, &b->reward_total, 4) == 0 && a->n_rewards == b->n_rewards);
    for (int i = 0; i < a->n_rewards && i < b->n_rewards; i++)
        CHECK(!strcmp(a->reward_names[i], b->reward_names[i]) && memcmp(&a->rewards[i], &b->rewards[i], 4) == 0);
}

/* The metadata value of key in f, or NULL. */
static const char *field_meta(const core_traj_fields *f, const char *key) {
    for (int k = 0; k < f->n_meta; k++)
        if (!strcmp(f->meta_keys[k], key)) return f->meta_values[k];
    return NULL;
}

TEST(traj_roundtrip_bit_exact) {
    core_traj a, b, c;
    make_traj(&a);
    char path[512];
    snprintf(path, sizeof path, "%s/t.safetensors", test_tmpdir());
    REQUIRE_OK(core_traj_save(&a, path));
    REQUIRE_OK(core_traj_load(&b, path));
    check_same(&a, &b);

    /* The stored layout, read back with the generic reader. */
    st_file *f = st_open(path);
    REQUIRE_OK(f == NULL);
    CHECK(st_count(f) == 7);
    const st_info *li = st_info_at(f, st_find(f, "latents"));
    REQUIRE(li);
    CHECK(li->dtype == CORE_F32 && li->ndim == 5 && li->shape[0] == 4 && li->shape[1] == 2 && li->shape[4] == 5);
    const st_info *hi = st_info_at(f, st_find(f, "has_log_prob"));
    REQUIRE(hi);
    CHECK(hi->dtype == CORE_U8 && hi->ndim == 1 && hi->shape[0] == 3);
    CHECK(!strcmp(st_metadata(f, "uid"), "9223372036854788153"));
    CHECK(!strcmp(st_metadata(f, "reward_names"), "[\"color_match\",\"brightness\"]"));
    CHECK(!strcmp(st_metadata(f, "format"), "vgrpo.trajectory") && !strcmp(st_metadata(f, "policy_version"), "-7"));
    st_close(f);

    /* The in-memory form (what a wire message carries), unchanged. */
    core_traj_fields fl;
    REQUIRE_OK(core_traj_to_fields(&a, &fl));
    CHECK(fl.n_tensors == 7 && fl.n_meta == 10);
    REQUIRE_OK(core_traj_from_fields(&c, fl.n_tensors, fl.tensor_names, fl.tensors, fl.n_meta, fl.meta_keys,
                                     (const char *const *)fl.meta_values, "msg"));
    check_same(&a, &c);
    core_traj_fields_free(&fl);

    /* No rewards yet (R = 0) is a legal trajectory. */
    core_traj_free(&c);
    REQUIRE_OK(core_traj_set_rewards(&a, 0, NULL, NULL, 0.0f));
    REQUIRE_OK(core_traj_save(&a, path));
    REQUIRE_OK(core_traj_load(&c, path));
    check_same(&a, &c);
    core_traj_free(&a);
    core_traj_free(&b);
    core_traj_free(&c);
}

/* A full trajectory without means keeps format_version 1 exactly: the file's bytes are those the code wrote before
 * stored ranges existed (xxh64 recorded from commit 36fcab4 with this make_traj), and the fields list the same 7
 * tensors and 10 metadata keys in the same order. */
TEST(traj_full_form_unchanged_v1) {
    core_traj a;
    make_traj(&a);
    CHECK(a.latent_first == 0 && a.n_latents == 4 && a.means == NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/full.safetensors", test_tmpdir());
    REQUIRE_OK(core_traj_save(&a, path));
    static char buf[8192];
    const long n = test_slurp(path, buf, sizeof buf);
    CHECK_MSG(n == 2742 && core_xxh64(buf, (size_t)n, 0) == 0xa3a67ffb373ae3b3ull, "file of %ld bytes, xxh64 %016llx", n,
              (unsigned long long)core_xxh64(buf, (size_t)(n > 0 ? n : 0), 0));
    core_traj_fields fl;
    REQUIRE_OK(core_traj_to_fields(&a, &fl));
    const char *tn[7] = {"sigmas", "timesteps", "latents", "log_probs", "has_log_prob", "expert", "rewards"};
    const char *mk[10] = {"format", "format_version", "uid", "prompt_index", "policy_version", "eta", "guidance_scale",
                          "guidance_scale_2", "reward_total", "reward_names"};
    CHECK(fl.n_tensors == 7 && fl.n_meta == 10);
    for (int k = 0; k < 7 && k < fl.n_tensors; k++) CHECK_MSG(!strcmp(fl.tensor_names[k], tn[k]), "tensor %d", k);
    for (int k = 0; k < 10 && k < fl.n_meta; k++) CHECK_MSG(!strcmp(fl.meta_keys[k], mk[k]), "metadata %d", k);
    CHECK(!strcmp(field_meta(&fl, "format_version"), "1") && field_meta(&fl, "latent_first") == NULL);
    CHECK(fl.tensors[2].shape[0] == 4);
    core_traj_fields_free(&fl);
    core_traj_free(&a);
}

/* Stored ranges: a trimmed trajectory with and without means, and a full one with means, through a file and through
 * the fields (format_version 2, latent_first, the means tensor last), bit for bit. */
TEST(traj_stored_range_roundtrip) {
    core_traj full;
    make_traj(&full);
    const int64_t nl = core_traj_latent_numel(&full);
    for (int variant = 0; variant < 3; variant++) {
        core_traj a, b, c;
        if (variant < 2) make_window(&a, variant);
        else {
            make_traj(&a);
            REQUIRE_OK(core_traj_alloc_means(&a));
            a.means[5] = -2.5f;
        }
        const int means = variant >= 1;
        if (variant < 2) {
            CHECK(a.latent_first == 1 && a.n_latents == 2 && !core_traj_has_latent(&a, 0) && core_traj_has_latent(&a, 2));
            CHECK(!core_traj_has_latent(&a, 3) && core_traj_latent(&a, 1) == a.latents);
            CHECK(!memcmp(core_traj_latent(&a, 2), core_traj_latent(&full, 2), sizeof(float) * (size_t)nl));
            CHECK(core_traj_mean(&a, 0) == NULL && core_traj_mean(&a, 2) == NULL);
            CHECK(means ? core_traj_mean(&a, 1) == a.means : core_traj_mean(&a, 1) == NULL);
        } else {
            CHECK(core_traj_mean(&a, 2) == a.means + 2 * nl && core_traj_mean(&a, 3) == NULL);
        }
        if (variant == 1) { /* the mean of step 1 kept: the trim kept row 1 of the filled means */
            float m3[3 * 120];
            test_fill_uniform(m3, (size_t)(3 * nl), 78, -1, 1);
            CHECK(!memcmp(a.means, m3 + nl, sizeof(float) * (size_t)nl));
        }
        char path[512];
        snprintf(path, sizeof path, "%s/w%d.safetensors", test_tmpdir(), variant);
        REQUIRE_OK(core_traj_save(&a, path));
        REQUIRE_OK(core_traj_load(&b, path));
        check_same(&a, &b);
        st_file *f = st_open(path);
        REQUIRE_OK(f == NULL);
        CHECK(st_count(f) == 7 + means && !strcmp(st_metadata(f, "format_version"), "2"));
        CHECK(!strcmp(st_metadata(f, "latent_first"), variant < 2 ? "1" : "0"));
        const st_info *li = st_info_at(f, st_find(f, "latents"));
        REQUIRE(li);
        CHECK(li->ndim == 5 && li->shape[0] == (variant < 2 ? 2 : 4) && li->shape[4] == 5);
        if (means) {
            const st_info *mi = st_info_at(f, st_find(f, "means"));
            REQUIRE(mi);
            CHECK(mi->dtype == CORE_F32 && mi->ndim == 5 && mi->shape[0] == (variant < 2 ? 1 : 3) && mi->shape[1] == 2);
        }
        st_close(f);
        core_traj_fields fl;
        REQUIRE_OK(core_traj_to_fields(&a, &fl));
        CHECK(fl.n_tensors == 7 + means && fl.n_meta == 11 && !strcmp(fl.meta_keys[10], "latent_first"));
        CHECK(!means || !strcmp(fl.tensor_names[7], "means"));
        REQUIRE_OK(core_traj_from_fields(&c, fl.n_tensors, fl.tensor_names, fl.tensors, fl.n_meta, fl.meta_keys,
                                         (const char *const *)fl.meta_values, "msg"));
        check_same(&a, &c);
        core_traj_fields_free(&fl);
        core_traj_free(&a), core_traj_free(&b), core_traj_free(&c);
    }
    core_traj_free(&full);
}

/* core_traj_trim and core_traj_alloc_means refuse bad requests naming the step and leave the trajectory as it was. */
TEST(traj_trim_errors_leave_it_unchanged) {
    core_traj t;
    make_traj(&t); /* log-probs at steps 0 and 2 */
    REQUIRE_OK(core_traj_alloc_means(&t));
    float *lat = t.latents, *mean = t.means;
    REQUIRE_OK(core_traj_alloc_means(&t)); /* a second call is a no-op */
    CHECK(t.means == mean);
    struct {
        int first, last;
        const char *expect;
    } bad[] = {
        {1, 3, "drops step 0, which has a log-prob"},
        {0, 2, "drops step 2, which has a log-prob"},
        {2, 1, "is not inside the stored latents[0 .. 3]"},
        {-1, 3, "is not inside"},
        {0, 4, "is not inside"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_MSG(core_traj_trim(&t, bad[i].first, bad[i].last) == -1 && strstr(core_last_error(), bad[i].expect),
                  "trim %d..%d: '%s'", bad[i].first, bad[i].last, core_last_error());
        CHECK(t.latents == lat && t.means == mean && t.latent_first == 0 && t.n_latents == 4);
    }
    REQUIRE_OK(core_traj_trim(&t, 0, 3)); /* the whole range: nothing to do */
    CHECK(t.latents == lat && t.n_latents == 4);
    /* Once trimmed, the stored range bounds the next trim; a single latent keeps no means. */
    t.has_log_prob[0] = t.has_log_prob[2] = 0, t.log_probs[0] = t.log_probs[2] = 0;
    REQUIRE_OK(core_traj_trim(&t, 1, 3));
    CHECK(t.latent_first == 1 && t.n_latents == 3 && core_traj_mean(&t, 3) == NULL && core_traj_mean(&t, 2) != NULL);
    CHECK(core_traj_trim(&t, 0, 2) == -1 && strstr(core_last_error(), "stored latents[1 .. 3]"));
    REQUIRE_OK(core_traj_trim(&t, 3, 3));
    CHECK(t.latent_first == 3 && t.n_latents == 1 && t.means == NULL && core_traj_has_latent(&t, 3));
    REQUIRE_OK(core_traj_validate(&t, "one"));
    CHECK(core_traj_alloc_means(&t) == -1 && strstr(core_last_error(), "n_latents = 1") && t.means == NULL);
    core_traj_free(&t);
}

/* Decoding needs the final latent: a trajectory trimmed before decoding is refused, naming what it stores (the
 * check comes before the decoder is touched, so a zeroed pipeline with the recipe's latent shape is enough). */
TEST(traj_decode_needs_final_latent) {
    core_traj t;
    make_window(&t, 1);
    rollout_pipeline p;
    memset(&p, 0, sizeof p);
    memcpy(p.dec.latent, t.shape, sizeof t.shape);
    static uint8_t video[64];
    CHECK(rollout_pipeline_decode(&p, &t, video) == -1 &&
          strstr(core_last_error(), "stores latents[1 .. 2], not the final latents[3]: decode before trimming"));
    core_traj_free(&t);
}

/* A fault applied to the fields of a valid trajectory before they are written. */
typedef struct {
    const char *what;     /* test label */
    const char *drop;     /* tensor or metadata key to leave out */
    const char *key, *val; /* metadata to replace (or add) */
    int tensor;           /* tensor index to replace with `bad` (-1: none) */
    core_tensor bad;
    void (*poke)(core_traj *t); /* change the values in place (bypassing validation at save) */
    const char *expect;   /* substring of the error */
    void (*prep)(core_traj *t); /* builds the trajectory written (NULL: make_traj) */
} fault;

static void poke_has(core_traj *t) { t->has_log_prob[1] = 2; }
static void poke_logp_nan(core_traj *t) { t->log_probs[0] = NAN; }
static void poke_logp_nonzero(core_traj *t) { t->log_probs[1] = 0.5f; }
static void poke_sigma(core_traj *t) { t->sigmas[2] = 0.9f; }
static void poke_sigma_end(core_traj *t) { t->sigmas[3] = 0.01f; }
static void poke_latent(core_traj *t) { core_traj_latent(t, 1)[7] = INFINITY; }
static void poke_expert(core_traj *t) { t->expert[2] = 3; }
static void poke_mean(core_traj *t) { t->means[3] = NAN; }
static void poke_window_logp(core_traj *t) { t->has_log_prob[2] = 1; } /* latents[3] is not stored */
static void prep_window(core_traj *t) { make_window(t, 0); }
static void prep_window_means(core_traj *t) { make_window(t, 1); }
static void prep_full_means(core_traj *t) {
    make_traj(t);
    REQUIRE_OK(core_traj_alloc_means(t));
}
/* latents[0 .. 1] stored (step 0 trained): with latent_first dropped it reads as the same range. */
static void prep_head(core_traj *t) {
    make_traj(t);
    t->has_log_prob[2] = 0, t->log_probs[2] = 0;
    REQUIRE_OK(core_traj_trim(t, 0, 1));
}

/* Writes the faulty file with the generic writer (core_traj_save would refuse it) and returns its path. */
static const char *write_faulty(core_traj *t, const fault *fa, int idx) {
    static char path[512];
    snprintf(path, sizeof path, "%s/bad%d.safetensors", test_tmpdir(), idx);
    core_traj_fields fl;
    if (core_traj_to_fields(t, &fl)) return NULL;
    if (fa->poke) fa->poke(t);
    st_writer *w = st_writer_new();
    for (int k = 0; k < fl.n_tensors; k++) {
        if (fa->drop && !strcmp(fa->drop, fl.tensor_names[k])) continue;
        const core_tensor *x = k == fa->tensor ? &fa->bad : &fl.tensors[k];
        st_writer_add_tensor(w, fl.tensor_names[k], x);
    }
    if (fa->tensor == 99) st_writer_add_tensor(w, "foo", &fa->bad);
    for (int k = 0; k < fl.n_meta; k++) {
        if (fa->drop && !strcmp(fa->drop, fl.meta_keys[k])) continue;
        st_writer_set_metadata(w, fl.meta_keys[k], fa->key && !strcmp(fa->key, fl.meta_keys[k]) ? fa->val : fl.meta_values[k]);
    }
    int rc = st_writer_write(w, path);
    st_writer_free(w);
    core_traj_fields_free(&fl);
    return rc ? NULL : path;
}

TEST(traj_rejects_bad_files_naming_field) {
    static float f2[2], f3x[3 * 2 * 3 * 4 * 5], f4[4];
    static uint16_t h3[3];
    const int64_t s2[1] = {2}, s3[1] = {3}, s4[1] = {4}, slat4[4] = {3, 2, 3, 20}, slat5[5] = {3, 2, 3, 4, 5};
    fault faults[] = {
        {"missing latents", "latents", 0, 0, -1, {0}, 0, "tensor 'latents' missing", 0},
        {"missing rewards", "rewards", 0, 0, -1, {0}, 0, "tensor 'rewards' missing", 0},
        {"short timesteps", 0, 0, 0, 1, {0}, 0, "tensor 'timesteps' has shape [2], expected [3] (N = 3 from 'sigmas')", 0},
        {"log_probs F16", 0, 0, 0, 3, {0}, 0, "tensor 'log_probs' has dtype F16, expected F32", 0},
        {"latents 4-D", 0, 0, 0, 2, {0}, 0, "tensor 'latents' has shape [3,2,3,20], expected [N+1 = 4", 0},
        {"latents N rows", 0, 0, 0, 2, {0}, 0, "tensor 'latents' has shape [3,2,3,4,5], expected [N+1 = 4", 0},
        {"expert length", 0, 0, 0, 5, {0}, 0, "tensor 'expert' has", 0},
        {"sigmas as timesteps", 0, 0, 0, 1, {0}, 0, "tensor 'timesteps' has shape [4]", 0},
        {"unknown tensor", 0, 0, 0, 99, {0}, 0, "unknown tensor 'foo'", 0},
        {"missing uid", "uid", 0, 0, -1, {0}, 0, "metadata 'uid' missing", 0},
        {"bad uid", 0, "uid", "-5", -1, {0}, 0, "metadata 'uid' = '-5' is not an unsigned", 0},
        {"bad eta", 0, "eta", "abc", -1, {0}, 0, "metadata 'eta' = 'abc' is not a finite number", 0},
        {"inf guidance", 0, "guidance_scale_2", "inf", -1, {0}, 0, "metadata 'guidance_scale_2'", 0},
        {"negative eta", 0, "eta", "-0.5", -1, {0}, 0, "eta = -0.5 must be", 0},
        {"missing format", "format", 0, 0, -1, {0}, 0, "metadata 'format' missing", 0},
        {"bad version", 0, "format_version", "3", -1, {0}, 0, "metadata 'format_version' is '3', expected '1' or '2'", 0},
        {"names count", 0, "reward_names", "[\"a\"]", -1, {0}, 0, "'reward_names' has 1 names but tensor 'rewards' has 2", 0},
        {"names json", 0, "reward_names", "[1,2]", -1, {0}, 0, "'reward_names' entry 0 is not a string", 0},
        {"names dup", 0, "reward_names", "[\"a\",\"a\"]", -1, {0}, 0, "reward_names[1] 'a' repeats", 0},
        {"prompt index", 0, "prompt_index", "-3", -1, {0}, 0, "prompt_index = -3 must be >= 0", 0},
        {"has_log_prob 2", 0, 0, 0, -1, {0}, poke_has, "has_log_prob[1] = 2", 0},
        {"log_probs nan", 0, 0, 0, -1, {0}, poke_logp_nan, "log_probs[0] = nan is not finite", 0},
        {"log_probs not 0", 0, 0, 0, -1, {0}, poke_logp_nonzero, "log_probs[1] = 0.5 where has_log_prob[1] = 0", 0},
        {"sigmas order", 0, 0, 0, -1, {0}, poke_sigma, "sigmas[2] = 0.899999976 is not below sigmas[1]", 0},
        {"sigmas end", 0, 0, 0, -1, {0}, poke_sigma_end, "sigmas[3] (the last)", 0},
        {"latent inf", 0, 0, 0, -1, {0}, poke_latent, "latents[1] element 7 = inf", 0},
        {"expert 3", 0, 0, 0, -1, {0}, poke_expert, "expert[2] = 3 must be below 2", 0},
        /* stored ranges (format_version 2) */
        {"means rows", 0, 0, 0, 7, {0}, 0, "tensor 'means' has shape [2,2,3,4,5], expected [M - 1 = 1, 2, 3, 4, 5]",
         prep_window_means},
        {"means dims", 0, 0, 0, 7, {0}, 0, "tensor 'means' has shape [1,2,3,20], expected [M - 1 = 1", prep_window_means},
        {"means nan", 0, 0, 0, -1, {0}, poke_mean, "means[0] (step 1) element 3 = nan", prep_window_means},
        {"means F16", 0, 0, 0, 7, {0}, 0, "tensor 'means' has dtype F16, expected F32", prep_window_means},
        {"latent_first > N", 0, "latent_first", "4", -1, {0}, 0, "metadata 'latent_first' = '4' is not an integer in [0, 3]",
         prep_window},
        {"latent_first < 0", 0, "latent_first", "-1", -1, {0}, 0, "metadata 'latent_first' = '-1'", prep_window},
        {"latent_first text", 0, "latent_first", "one", -1, {0}, 0, "metadata 'latent_first' = 'one'", prep_window},
        {"range past N", 0, "latent_first", "3", -1, {0}, 0,
         "tensor 'latents' has shape [2,2,3,4,5], expected [M, C, F, H, W] with 1 <= M <= N + 1 - latent_first = 1",
         prep_window},
        {"log-prob outside range", 0, 0, 0, -1, {0}, poke_window_logp,
         "has_log_prob[2] = 1 but the stored latents are latents[1 .. 2]", prep_window},
        {"no latent_first: 0", "latent_first", 0, 0, -1, {0}, 0,
         "has_log_prob[1] = 1 but the stored latents are latents[0 .. 1]", prep_window},
        {"latent_first in v1", 0, "format_version", "1", -1, {0}, 0, "metadata 'latent_first' needs format_version '2'",
         prep_window},
        {"means in v1", "latent_first", "format_version", "1", -1, {0}, 0, "tensor 'means' needs format_version '2'", prep_full_means},
        {"short latents in v1", "latent_first", "format_version", "1", -1, {0}, 0,
         "tensor 'latents' has shape [2,2,3,4,5], expected [N+1 = 4", prep_head},
    };
    core_tensor_wrap(&faults[2].bad, f2, CORE_F32, 1, s2);
    core_tensor_wrap(&faults[3].bad, h3, CORE_F16, 1, s3);
    core_tensor_wrap(&faults[4].bad, f3x, CORE_F32, 4, slat4);
    core_tensor_wrap(&faults[5].bad, f3x, CORE_F32, 5, slat5);
    core_tensor_wrap(&faults[6].bad, f2, CORE_U8, 1, s2);
    core_tensor_wrap(&faults[7].bad, f4, CORE_F32, 1, s4);
    core_tensor_wrap(&faults[8].bad, f2, CORE_F32, 1, s2);
    const int nf0 = 27; /* the stored-range faults follow */
    core_tensor_wrap(&faults[nf0].bad, f3x, CORE_F32, 5, (const int64_t[5]){2, 2, 3, 4, 5});
    core_tensor_wrap(&faults[nf0 + 1].bad, f3x, CORE_F32, 4, (const int64_t[4]){1, 2, 3, 20});
    core_tensor_wrap(&faults[nf0 + 3].bad, h3, CORE_F16, 5, (const int64_t[5]){1, 1, 1, 1, 3});
    REQUIRE(!strcmp(faults[nf0].what, "means rows"));
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        core_traj t, u;
        if (faults[i].prep) faults[i].prep(&t);
        else make_traj(&t);
        const char *path = write_faulty(&t, &faults[i], (int)i);
        REQUIRE_OK(path == NULL);
        memset(&u, 0x5a, sizeof u);
        int rc = core_traj_load(&u, path);
        const char *e = core_last_error();
        CHECK_MSG(rc == -1 && strstr(e, faults[i].expect) && strstr(e, path), "%s: rc %d, error '%s'", faults[i].what, rc,
                  e);
        CHECK_MSG(u.latents == NULL && u.n_steps == 0, "%s: output not zeroed", faults[i].what);
        core_traj_free(&t);
    }
    core_traj u;
    char path[512];
    snprintf(path, sizeof path, "%s/absent.safetensors", test_tmpdir());
    CHECK(core_traj_load(&u, path) == -1 && strstr(core_last_error(), "absent.safetensors"));
}

TEST(traj_api_errors) {
    core_traj t;
    const int64_t bad[4] = {2, 0, 4, 5}, ok[4] = {1, 1, 2, 2};
    CHECK(core_traj_alloc(&t, 3, bad) == -1 && strstr(core_last_error(), "dim 1 = 0") && t.latents == NULL);
    CHECK(core_traj_alloc(&t, 0, ok) == -1 && strstr(core_last_error(), "step count 0"));
    REQUIRE_OK(core_traj_alloc(&t, 2, ok));
    CHECK(core_traj_latent(&t, 1) == t.latents + 4 && core_traj_latent_numel(&t) == 4);
    const char *dup[2] = {"a", "a"}, *empty[1] = {""};
    const float v[2] = {1, 2}, nanv[1] = {NAN};
    CHECK(core_traj_set_rewards(&t, 2, dup, v, 3) == -1 && strstr(core_last_error(), "repeats"));
    CHECK(core_traj_set_rewards(&t, 1, empty, v, 3) == -1 && strstr(core_last_error(), "empty"));
    CHECK(core_traj_set_rewards(&t, 1, dup, nanv, 3) == -1 && strstr(core_last_error(), "rewards[0]"));
    CHECK(core_traj_set_rewards(&t, 1, dup, v, INFINITY) == -1 && strstr(core_last_error(), "reward_total"));
    CHECK(t.n_rewards == 0);
    /* Zeroed sigmas are not a schedule: saving refuses and names the field. */
    char path[512];
    snprintf(path, sizeof path, "%s/x.safetensors", test_tmpdir());
    CHECK(core_traj_save(&t, path) == -1 && strstr(core_last_error(), "sigmas[1]"));
    core_traj_free(&t);
    core_traj_free(&t); /* twice is safe */
}
