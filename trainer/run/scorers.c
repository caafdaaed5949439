/* trainer/run/scorers.c — the run's reward scorers: the names its metrics, in-run eval and checks use.
 *
 * Without reward.endpoint they are the recipe's reward.scorers (the in-process scorers or the reward server the job
 * starts with that list). With reward.endpoint the scorers and weights are the external server's, as its `hello`
 * reply lists them (reward/PROTOCOL.md section 2): the trainer asks once at start, and a recipe that lists scorers
 * (and weights) must match that list, in order; a recipe that leaves them out takes the server's. Every trajectory
 * then has to carry exactly these names (trainer_check_scorers), so a server restarted with another list mid-run
 * stops the run instead of labelling one scorer's values with another's name. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "reward/client.h"
#include "trainer/run/run.h"
#include "trainer/run/run_internal.h"

/* "a:1, b:0.5" (weights NULL: names only) into buf. */
static void list_text(char *buf, size_t cap, int n, const char *const *names, const double *weights) {
    buf[0] = 0;
    for (int j = 0; j < n; j++) {
        const size_t o = strlen(buf);
        if (weights) snprintf(buf + o, cap - o, "%s%s:%g", j ? ", " : "", names[j], weights[j]);
        else snprintf(buf + o, cap - o, "%s%s", j ? ", " : "", names[j]);
    }
}

/* The recipe's list against the server's (names in order; weights when the recipe gives them). */
static int recipe_matches(const core_recipe *r, const reward_result *srv) {
    if (r->scorers.n != srv->n_scores) return 0;
    for (int j = 0; j < r->scorers.n; j++) {
        if (strcmp(r->scorers.v[j], srv->scores[j].name)) return 0;
        const double a = r->weights.v[j], b = srv->scores[j].weight;
        if (r->weights_given && !(fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b)))) return 0;
    }
    return 1;
}

int trainer_scorers_init(trainer_state *S) {
    const core_recipe *r = S->r;
    if (!r->reward_endpoint) {
        if (r->scorers.n > CORE_TRAJ_MAX_REWARDS) return core_error("reward.scorers: at most %d", CORE_TRAJ_MAX_REWARDS);
        for (int j = 0; j < r->scorers.n; j++)
            snprintf(S->scorer_names[j], CORE_TRAJ_NAME_MAX, "%s", r->scorers.v[j]);
        S->n_scorers = r->scorers.n;
        return 0;
    }
    reward_client *c = reward_client_open(r->reward_endpoint, "trainer", r->reward_timeout_s, r->reward_max_attempts);
    reward_result srv;
    const int bad = !c || reward_client_scorers(c, &srv);
    reward_client_close(c);
    if (bad) return core_error_push("reward.endpoint: asking the server for its scorers: ");
    const char *names[REWARD_CLIENT_MAX_SCORERS];
    double weights[REWARD_CLIENT_MAX_SCORERS];
    for (int j = 0; j < srv.n_scores; j++) names[j] = srv.scores[j].name, weights[j] = srv.scores[j].weight;
    char got[1024], want[1024];
    list_text(got, sizeof got, srv.n_scores, names, weights);
    if (r->scorers.n > 0 && !recipe_matches(r, &srv)) {
        list_text(want, sizeof want, r->scorers.n, (const char *const *)r->scorers.v,
                  r->weights_given ? r->weights.v : NULL);
        return core_error("reward.scorers: the reward server at %s scores [%s], the recipe lists [%s]%s (they must "
                          "match, in order; or leave reward.scorers and reward.weights out to use the server's)",
                          r->reward_endpoint, got, want, r->weights_given ? " with reward.weights" : "");
    }
    if (srv.n_scores > CORE_TRAJ_MAX_REWARDS)
        return core_error("reward.endpoint: the reward server at %s scores %d scorers, a trajectory carries at most %d",
                          r->reward_endpoint, srv.n_scores, CORE_TRAJ_MAX_REWARDS);
    for (int j = 0; j < srv.n_scores; j++) {
        if (strlen(names[j]) >= CORE_TRAJ_NAME_MAX)
            return core_error("reward.endpoint: the reward server's scorer name \"%s\" is longer than %d bytes", names[j],
                              CORE_TRAJ_NAME_MAX - 1);
        snprintf(S->scorer_names[j], CORE_TRAJ_NAME_MAX, "%s", names[j]);
    }
    S->n_scorers = srv.n_scores;
    if (r->scorers.n == 0) { /* the prompt checks of trainer_setup, now for the server's list: a colour to match */
        core_recipe with = *r; /* a shallow copy that only lists the server's scorers */
        char *listed[REWARD_CLIENT_MAX_SCORERS];
        for (int j = 0; j < srv.n_scores; j++) listed[j] = srv.scores[j].name;
        with.scorers = (core_cfg_strings){srv.n_scores, listed};
        if (trainer_check_prompts(&with, &S->train) || trainer_check_prompts(&with, &S->eval))
            return core_error_push("reward.endpoint: the reward server at %s scores [%s]: ", r->reward_endpoint, got);
    }
    printf("  reward server %s: scorers [%s] (its hello reply%s)\n", r->reward_endpoint, got,
           r->scorers.n ? "; the recipe's list matches" : "; the recipe lists none");
    return 0;
}

int trainer_check_scorers(const trainer_state *S, const core_traj *t) {
    const core_recipe *r = S->r;
    int same = t->n_rewards == S->n_scorers;
    for (int j = 0; same && j < S->n_scorers; j++) same = !strcmp(t->reward_names[j], S->scorer_names[j]);
    if (same) return 0;
    const char *a[CORE_TRAJ_MAX_REWARDS], *b[CORE_TRAJ_MAX_REWARDS];
    for (int j = 0; j < t->n_rewards; j++) a[j] = t->reward_names[j];
    for (int j = 0; j < S->n_scorers; j++) b[j] = S->scorer_names[j];
    char got[1024], want[1024];
    list_text(got, sizeof got, t->n_rewards, a, NULL);
    list_text(want, sizeof want, S->n_scorers, b, NULL);
    return core_error("reward.scorers: the reward server%s%s scores [%s], the run's scorers are [%s] (%s; they must "
                      "match, in order)", r->reward_endpoint ? " at " : "", r->reward_endpoint ? r->reward_endpoint : "",
                      got, want, r->reward_endpoint ? "its hello reply at the start" : "the recipe's reward.scorers");
}
