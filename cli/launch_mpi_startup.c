/* cli/launch_mpi_startup.c — the start-up of a rank of an MPI launch (cli/launch_mpi_rank.h; the steps at the top of
 * cli/launch_mpi.c): each step ends with an all-gather of one status record per rank (launch_all_ok), the roles and
 * hosts (step 2), the keys from rank 0 (step 5) and the endpoints (step 6). Every function here is collective over
 * the world's duplicate: every rank calls it at the same point. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/launch_mpi_rank.h"
#include "core/error.h"
#include "core/gpu_assign.h"
#include "core/host_addr.h"

/* An MPI failure during the start-up (not a rank's own error: the collective itself): no clean way out. */
void launch_fatal(const launch *L, const char *what) {
    fprintf(stderr, "vgrpo mpi-rank (rank %d): %s: %s\n", L->rank, what, core_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* "rank 3 (rollout-worker on host h)" into buf. */
static const char *who(const launch *L, int rank, char *buf, size_t cap) {
    if (L->roles) snprintf(buf, cap, "rank %d (%s on %s)", rank, launch_role_names[L->roles[rank]], L->hosts[rank]);
    else snprintf(buf, cap, "rank %d", rank);
    return buf;
}

/* All-gather of one record per rank (mine: REC bytes) into all (size x REC). */
static void gather(launch *L, const char *mine, char *all, const char *what) {
    if (sp_comm_all_gather(L->world, mine, all, REC, SP_U8)) launch_fatal(L, what);
}

/* Every rank's status (failed: this rank's core_last_error). 0 when every rank succeeded; else -1 with core_error
 * naming the first failing rank. Collective over the world. */
int launch_all_ok(launch *L, int failed, const char *what) {
    char mine[REC] = "";
    if (failed) snprintf(mine, sizeof mine, "%s", core_last_error()[0] ? core_last_error() : "failed");
    char *all = malloc((size_t)L->size * REC);
    if (!all) core_error("out of memory"), launch_fatal(L, what);
    gather(L, mine, all, what);
    int rc = 0;
    for (int k = 0; k < L->size && !rc; k++)
        if (all[(size_t)k * REC]) {
            char w[REC + 64];
            all[(size_t)k * REC + REC - 1] = 0;
            rc = core_error("%s: %s", who(L, k, w, sizeof w), all + (size_t)k * REC);
        }
    free(all);
    return rc;
}

/* This process's MPI app number (MPI_APPNUM), -1 when the MPI library sets none. */
static int64_t appnum(void) {
    int *v = NULL, flag = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &v, &flag) != MPI_SUCCESS || !flag || !v) return -1;
    return *v;
}

/* Part of step 2: the job's nodes for the GPU plan (core/gpu_assign.h). A rank's node is MPI's shared-memory node
 * (MPI_Comm_split_type MPI_COMM_TYPE_SHARED), named by its lowest world rank's host, unless VGRPO_NODE names it
 * (CORE_GPU_NODE_ENV: tests simulate nodes on one host). The nodes in order of their first rank, each with its trainer
 * ranks and workers, and this rank's index among its role's ranks on its node, go to core_gpu_set_nodes. Collective;
 * -1 with core_error (out of memory). */
static int find_nodes(launch *L) {
    MPI_Comm shm;
    int lead = L->rank;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, L->rank, MPI_INFO_NULL, &shm) != MPI_SUCCESS ||
        MPI_Allreduce(&L->rank, &lead, 1, MPI_INT, MPI_MIN, shm) != MPI_SUCCESS)
        core_error("MPI_Comm_split_type (the node of each rank) failed"), launch_fatal(L, "nodes");
    MPI_Comm_free(&shm);
    const char *env = getenv(CORE_GPU_NODE_ENV);
    char mine[REC] = "";
    if (env && *env) snprintf(mine, sizeof mine, "n%.*s", CORE_GPU_NODE_NAME_MAX - 1, env);
    else snprintf(mine, sizeof mine, "r%d", lead);
    char *all = malloc((size_t)L->size * REC);
    int *node_of = malloc((size_t)L->size * sizeof *node_of);
    core_gpu_node *nodes = calloc((size_t)L->size, sizeof *nodes);
    if (!all || !node_of || !nodes) core_error("out of memory"), launch_fatal(L, "nodes");
    gather(L, mine, all, "nodes");
    int n = 0;
    for (int k = 0; k < L->size; k++) {
        const char *key = all + (size_t)k * REC;
        node_of[k] = -1;
        for (int j = 0; j < k && node_of[k] < 0; j++)
            if (!strcmp(key, all + (size_t)j * REC)) node_of[k] = node_of[j];
        if (node_of[k] >= 0) continue;
        node_of[k] = n;
        if (key[0] == 'n') snprintf(nodes[n].name, sizeof nodes[n].name, "%s", key + 1);
        else snprintf(nodes[n].name, sizeof nodes[n].name, "%.40s (rank %d)", L->hosts[atoi(key + 1)], atoi(key + 1));
        n++;
    }
    int local = 0;
    for (int k = 0; k < L->size; k++) {
        if (L->roles[k] == ROLE_TRAINER) nodes[node_of[k]].n_trainer++;
        if (L->roles[k] == ROLE_WORKER) nodes[node_of[k]].n_workers++;
        if (k < L->rank && L->roles[k] == L->roles[L->rank] && node_of[k] == node_of[L->rank]) local++;
    }
    const int rc = core_gpu_set_nodes(nodes, n, node_of[L->rank], local);
    free(all), free(node_of), free(nodes);
    return rc;
}

/* Step 2: every rank's role and host, this rank's role, index and neighbours on its host. -1 with core_error (the
 * same on every rank, except a --role that disagrees). */
int launch_find_roles(launch *L, const char *role_opt) {
    const core_recipe *r = L->r;
    const int want[N_ROLES] = {r->trainer_ranks, r->rollout_workers, r->reward_endpoint ? 0 : 1};
    int64_t mine = appnum(), *app = malloc((size_t)L->size * sizeof *app);
    L->roles = calloc((size_t)L->size, sizeof *L->roles);
    L->hosts = calloc((size_t)L->size, sizeof *L->hosts);
    if (!app || !L->roles || !L->hosts) core_error("out of memory"), launch_fatal(L, "roles");
    char host[REC] = "";
    gethostname(host, sizeof host - 1);
    gather(L, host, (char *)L->hosts, "host names");
    if (sp_comm_all_gather(L->world, &mine, app, 1, SP_I64)) launch_fatal(L, "app numbers");
    for (int k = 0; k < L->size; k++) L->hosts[k][REC - 1] = 0;
    int mpmd = 0, rc = 0;
    for (int k = 1; k < L->size; k++) mpmd |= app[k] != app[0];
    if (L->size != want[0] + want[1] + want[2])
        rc = core_error("the job has %d rank(s) but the recipe needs %d: parallel.trainer_ranks %d + "
                        "parallel.rollout_workers %d%s", L->size, want[0] + want[1] + want[2], want[0], want[1],
                        want[2] ? " + 1 reward server" : " (reward.endpoint names an external reward server)");
    L->reward_rank = -1;
    for (int k = 0; k < L->size && !rc; k++) {
        int role;
        if (mpmd) {
            role = (int)app[k];
            if (role < 0 || role >= N_ROLES || !want[role])
                rc = core_error("rank %d is in app context %lld: the app contexts are the trainer ranks, the rollout "
                                "workers%s, in that order", k, (long long)app[k], want[2] ? " and the reward server" : "");
        } else {
            role = k < want[0] ? ROLE_TRAINER : k < want[0] + want[1] ? ROLE_WORKER : ROLE_REWARD;
        }
        if (rc) break;
        L->roles[k] = (launch_role)role;
        if (role == ROLE_REWARD) L->reward_rank = k;
        L->n_role[role]++;
    }
    for (int role = 0; role < N_ROLES && !rc; role++)
        if (L->n_role[role] != want[role])
            rc = core_error("%d %s rank(s) were started, the recipe needs %d (parallel.trainer_ranks, "
                            "parallel.rollout_workers, reward.endpoint)", L->n_role[role], launch_role_names[role],
                            want[role]);
    if (!rc && L->roles[0] != ROLE_TRAINER)
        rc = core_error("rank 0 must be trainer rank 0 (it generates the run's keys): list the trainer ranks first");
    free(app);
    if (rc) {
        free(L->roles), L->roles = NULL;
        return -1;
    }
    L->role = L->roles[L->rank];
    for (int k = 0; k < L->size; k++) {
        if (L->roles[k] != L->role) continue;
        if (k < L->rank) L->role_rank++;
        if (!strcmp(L->hosts[k], L->hosts[L->rank])) L->local_same_role++;
    }
    if (find_nodes(L)) return -1;
    if (role_opt && strcmp(role_opt, launch_role_names[L->role]))
        return core_error("--role %s, but this rank's place in the job makes it a %s (%s)", role_opt,
                          launch_role_names[L->role], mpmd ? "MPI_APPNUM" : "rank ranges");
    return 0;
}

/* Step 5: the keys, from rank 0 to each rank (its role's subset). -1 with core_error on this rank. */
int launch_share_keys(launch *L) {
    char text[CORE_CURVE_TEXT_MAX], none = 0;
    int rc = 0;
    memset(text, 0, sizeof text);
    if (L->rank == 0) {
        core_curve_keys all, sub;
        rc = core_curve_generate(&all);
        if (!rc && L->reward_rank < 0) /* an external reward server holds none of the run's keys (cli/job.h) */
            memset(all.pub[CORE_CURVE_REWARD], 0, sizeof all.pub[0]), memset(all.sec[CORE_CURVE_REWARD], 0, sizeof all.sec[0]);
        for (int k = 0; k < L->size; k++) {
            memset(&sub, 0, sizeof sub);
            memset(text, 0, sizeof text);
            if (!rc && L->roles[k] != ROLE_TRAINER) {
                core_curve_subset(&all, L->roles[k] == ROLE_WORKER ? CORE_CURVE_CLIENT : CORE_CURVE_REWARD, &sub);
            } else if (!rc && k == 0) { /* the controller, and the client pair for the reward server's shutdown */
                core_curve_subset(&all, CORE_CURVE_CONTROLLER, &sub);
                memcpy(sub.sec[CORE_CURVE_CLIENT], all.sec[CORE_CURVE_CLIENT], sizeof sub.sec[0]);
            }
            if (!rc && core_curve_format(&sub, text, sizeof text)) rc = -1;
            if (k == 0) L->keys = sub;
            else if (sp_comm_sendrecv(L->world, text, sizeof text, k, &none, 0, k, SP_U8))
                launch_fatal(L, "sending the keys");
        }
        memset(&all, 0, sizeof all);
        memset(&sub, 0, sizeof sub);
    } else {
        if (sp_comm_sendrecv(L->world, &none, 0, 0, text, sizeof text, 0, SP_U8)) launch_fatal(L, "receiving the keys");
        text[sizeof text - 1] = 0;
        /* empty: rank 0 failed to make them and says why in the next status exchange */
        if (text[0] && core_curve_parse(text, strlen(text), &L->keys)) rc = core_error_push("the keys from rank 0: ");
    }
    memset(text, 0, sizeof text);
    return rc;
}

/* Step 6: all-gather of the endpoints (mine: this rank's bound endpoint, "" for none, NULL after a failure, whose
 * core_last_error is sent), then the world's duplicate is freed. Fills ctl_ep (rank 0's) and rew_ep (the reward
 * server's, or reward.endpoint). -1 with core_error when any rank failed. */
int launch_exchange(launch *L, const char *mine) {
    char rec[REC] = "";
    snprintf(rec, sizeof rec, "%c%s", mine ? 'A' : 'E', mine ? mine : core_last_error());
    char *all = malloc((size_t)L->size * REC);
    if (!all) core_error("out of memory"), launch_fatal(L, "endpoints");
    gather(L, rec, all, "endpoints");
    L->exchanged = 1;
    int rc = 0;
    for (int k = 0; k < L->size && !rc; k++) {
        char *x = all + (size_t)k * REC, w[REC + 64];
        x[REC - 1] = 0;
        if (x[0] == 'E') rc = core_error("%s: %s", who(L, k, w, sizeof w), x + 1);
    }
    if (!rc) {
        snprintf(L->ctl_ep, sizeof L->ctl_ep, "%s", all + 1);
        if (L->reward_rank >= 0) snprintf(L->rew_ep, sizeof L->rew_ep, "%s", all + (size_t)L->reward_rank * REC + 1);
        else snprintf(L->rew_ep, sizeof L->rew_ep, "%s", L->r->reward_endpoint);
    }
    free(all);
    sp_comm_destroy(L->world); /* nothing uses the world after this */
    L->world = NULL;
    return rc;
}

/* This host's address for a server (core/host_addr.h) as "tcp://ADDR:*". */
int launch_bind_endpoint(launch *L, char *ep, size_t cap) {
    const char **hosts = malloc((size_t)L->size * sizeof *hosts);
    if (!hosts) return core_error("out of memory");
    for (int k = 0; k < L->size; k++) hosts[k] = L->hosts[k];
    char addr[64];
    const int rc = core_host_addr_pick(L->bind_host, L->hosts[L->rank], hosts, L->size, addr, sizeof addr, L->addr_how,
                                       sizeof L->addr_how);
    free(hosts);
    if (rc) return -1;
    snprintf(ep, cap, "tcp://%s:*", addr);
    return 0;
}
