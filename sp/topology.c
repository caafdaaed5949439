/* sp/topology.c — rank coordinates, group member lists and start-up validation for Ulysses x Ring sequence
 * parallelism; see topology.h for the layout (global = dp*sp + sp_rank, sp_rank = ring*ulysses + ulysses_rank). */
#include "sp/topology.h"

#include <inttypes.h>

#include "core/error.h"

static int check_degrees(int trainer_ranks, int sp, int ulysses) {
    if (sp < 1) return core_error("parallel.sp must be >= 1, got %d", sp);
    if (ulysses < 1) return core_error("parallel.ulysses_degree must be >= 1, got %d", ulysses);
    if (trainer_ranks < 1) return core_error("parallel.trainer_ranks must be >= 1, got %d", trainer_ranks);
    if (trainer_ranks % sp != 0)
        return core_error("parallel.trainer_ranks (%d) is not a multiple of parallel.sp (%d)", trainer_ranks, sp);
    if (sp % ulysses != 0)
        return core_error("parallel.sp (%d) is not a multiple of parallel.ulysses_degree (%d)", sp, ulysses);
    return 0;
}

int sp_topology_init(sp_topology *t, int trainer_ranks, int sp, int ulysses_degree) {
    if (check_degrees(trainer_ranks, sp, ulysses_degree)) return -1;
    t->trainer_ranks = trainer_ranks;
    t->sp = sp;
    t->ulysses = ulysses_degree;
    t->ring = sp / ulysses_degree;
    t->dp = trainer_ranks / sp;
    return 0;
}

sp_rank_info sp_topology_rank(const sp_topology *t, int g) {
    sp_rank_info r = {-1, -1, -1, -1, -1};
    if (g < 0 || g >= t->trainer_ranks) return r;
    r.global_rank = g;
    r.dp_rank = g / t->sp;
    r.sp_rank = g % t->sp;
    r.ring_rank = r.sp_rank / t->ulysses;
    r.ulysses_rank = r.sp_rank % t->ulysses;
    return r;
}

int sp_topology_global(const sp_topology *t, int dp_rank, int ring_rank, int ulysses_rank) {
    if (dp_rank < 0 || dp_rank >= t->dp || ring_rank < 0 || ring_rank >= t->ring || ulysses_rank < 0 ||
        ulysses_rank >= t->ulysses)
        return -1;
    return dp_rank * t->sp + ring_rank * t->ulysses + ulysses_rank;
}

int sp_topology_sp_group(const sp_topology *t, int g, int *out) {
    sp_rank_info r = sp_topology_rank(t, g);
    if (r.global_rank < 0) return -1;
    for (int i = 0; i < t->sp; i++) out[i] = r.dp_rank * t->sp + i;
    return t->sp;
}

int sp_topology_ulysses_group(const sp_topology *t, int g, int *out) {
    sp_rank_info r = sp_topology_rank(t, g);
    if (r.global_rank < 0) return -1;
    for (int i = 0; i < t->ulysses; i++) out[i] = sp_topology_global(t, r.dp_rank, r.ring_rank, i);
    return t->ulysses;
}

int sp_topology_ring_group(const sp_topology *t, int g, int *out) {
    sp_rank_info r = sp_topology_rank(t, g);
    if (r.global_rank < 0) return -1;
    for (int i = 0; i < t->ring; i++) out[i] = sp_topology_global(t, r.dp_rank, i, r.ulysses_rank);
    return t->ring;
}

int sp_topology_dp_group(const sp_topology *t, int g, int *out) {
    sp_rank_info r = sp_topology_rank(t, g);
    if (r.global_rank < 0) return -1;
    for (int i = 0; i < t->dp; i++) out[i] = i * t->sp + r.sp_rank;
    return t->dp;
}

int sp_topology_colour(const sp_topology *t, int g, sp_group_kind kind, int *colour, int *key) {
    sp_rank_info r = sp_topology_rank(t, g);
    if (r.global_rank < 0) return -1;
    switch (kind) {
    case SP_GROUP_SP: *colour = r.dp_rank, *key = r.sp_rank; return 0;
    case SP_GROUP_ULYSSES: *colour = r.dp_rank * t->ring + r.ring_rank, *key = r.ulysses_rank; return 0;
    case SP_GROUP_RING: *colour = r.dp_rank * t->ulysses + r.ulysses_rank, *key = r.ring_rank; return 0;
    case SP_GROUP_DP: *colour = r.sp_rank, *key = r.dp_rank; return 0;
    }
    return -1;
}

int sp_validate(int trainer_ranks, int sp, int ulysses, const sp_attn_request *req) {
    if (check_degrees(trainer_ranks, sp, ulysses)) return -1;
    if (!req) return 0;
    if (req->num_heads < 1) return core_error("attention heads must be >= 1, got %d", req->num_heads);
    if (req->num_heads % ulysses != 0)
        return core_error("attention heads (%d) are not a multiple of parallel.ulysses_degree (%d)", req->num_heads,
                          ulysses);
    if (req->tokens < 1) return core_error("video tokens per sample must be >= 1, got %" PRId64, req->tokens);
    if (req->tokens % sp != 0)
        return core_error("video tokens per sample (%" PRId64 ") are not a multiple of parallel.sp (%d)", req->tokens,
                          sp);
    if (sp > 1) {
        if (req->has_mask)
            return core_error("an attention mask is not supported under sequence parallelism (parallel.sp = %d)", sp);
        if (req->dropout != 0.0f)
            return core_error("attention dropout (%g) is not supported under sequence parallelism (parallel.sp = %d)",
                              (double)req->dropout, sp);
        if (req->causal)
            return core_error("causal attention is not supported under sequence parallelism (parallel.sp = %d)", sp);
        if (req->explicit_scale)
            return core_error("an explicit attention scale is not supported under sequence parallelism "
                              "(parallel.sp = %d): the default 1/sqrt(head_dim) is used",
                              sp);
    }
    return 0;
}
