/* sp/topology.h — who is who in Ulysses x Ring sequence parallelism (docs/design.md section 6), and the start-up checks.
 *
 * A trainer world of `trainer_ranks` MPI ranks is split into dp = trainer_ranks / sp data-parallel replicas of sp
 * ranks each; an SP group is split further into ring = sp / ulysses groups of `ulysses` ranks:
 *
 *   global_rank = dp_rank * sp + sp_rank           (SP groups are contiguous in the world)
 *   sp_rank     = ring_rank * ulysses + ulysses_rank (Ulysses groups contiguous, ring groups strided)
 *
 * e.g. trainer_ranks 8, sp 4, ulysses 2 (dp 2, ring 2): global 5 = dp 1, sp 1 = ring 0, ulysses 1; its Ulysses
 * group is {4, 5}, its ring group {5, 7}, its SP group {4, 5, 6, 7}, its DP group {1, 5}.
 * This is the layout of yunchang / xDiT's `set_seq_parallel_pg` with ring groups strided ("ulysses inner"): the
 * all-to-all, the heavier collective, runs between neighbouring ranks (the same node when sp spans nodes).
 *
 * Sequence sharding that goes with it: SP rank p owns tokens [p * S/sp, (p+1) * S/sp) of every sample of its dp
 * rank. A Ulysses group therefore owns one contiguous block of S/ring tokens (ring block = ring_rank).
 *
 * Everything here is a pure function of its arguments: no MPI, no allocation. */
#ifndef SP_TOPOLOGY_H
#define SP_TOPOLOGY_H

#include <stdint.h>

/* The degrees of one layout. Build with sp_topology_init (validated). */
typedef struct {
    int trainer_ranks; /* world size of the trainer */
    int sp;            /* sequence-parallel degree = ulysses * ring */
    int ulysses;       /* Ulysses degree (all-to-all group size) */
    int ring;          /* ring degree = sp / ulysses */
    int dp;            /* data-parallel degree = trainer_ranks / sp */
} sp_topology;

/* The coordinates of one rank. */
typedef struct {
    int global_rank, dp_rank, sp_rank, ulysses_rank, ring_rank;
} sp_rank_info;

/* Fills t from (trainer_ranks, sp, ulysses_degree) after checking sp >= 1, ulysses >= 1, trainer_ranks >= 1,
 * trainer_ranks % sp == 0 and sp % ulysses == 0. Returns 0, or -1 with core_error naming the rule and the values,
 * e.g. "parallel.trainer_ranks (6) is not a multiple of parallel.sp (4)". */
int sp_topology_init(sp_topology *t, int trainer_ranks, int sp, int ulysses_degree);

/* Coordinates of global rank g (0 <= g < trainer_ranks; out of range gives all fields -1). */
sp_rank_info sp_topology_rank(const sp_topology *t, int global_rank);

/* Global rank of (dp_rank, ring_rank, ulysses_rank); -1 when a coordinate is out of range. */
int sp_topology_global(const sp_topology *t, int dp_rank, int ring_rank, int ulysses_rank);

/* Member lists, in ascending order of the rank within the group (which is also ascending global rank).
 * Each writes the group's size entries to out and returns the size, or -1 when global_rank is out of range.
 *   SP group      (size sp):            the ranks with global_rank's dp_rank; rank within = sp_rank
 *   Ulysses group (size ulysses):       same dp_rank and ring_rank;           rank within = ulysses_rank
 *   ring group    (size ring):          same dp_rank and ulysses_rank;        rank within = ring_rank
 *   DP group      (size dp):            same sp_rank;                         rank within = dp_rank */
int sp_topology_sp_group(const sp_topology *t, int global_rank, int *out);
int sp_topology_ulysses_group(const sp_topology *t, int global_rank, int *out);
int sp_topology_ring_group(const sp_topology *t, int global_rank, int *out);
int sp_topology_dp_group(const sp_topology *t, int global_rank, int *out);

/* Colours for splitting the world into groups (sp_comm_split): ranks with equal colour form one group, and the
 * key (the rank within the group) orders it. Colours are in [0, number of groups of that kind). */
typedef enum { SP_GROUP_SP = 0, SP_GROUP_ULYSSES = 1, SP_GROUP_RING = 2, SP_GROUP_DP = 3 } sp_group_kind;
/* Colour and key of global_rank's group of the given kind; returns 0, or -1 (rank out of range, no error set). */
int sp_topology_colour(const sp_topology *t, int global_rank, sp_group_kind kind, int *colour, int *key);

/* What the self-attention is asked to do; any feature set here is refused under SP (sp > 1). */
typedef struct {
    int num_heads;        /* H of the self-attention */
    int64_t tokens;       /* video tokens per sample, S */
    int has_mask;         /* an attention mask is given */
    float dropout;        /* attention dropout probability */
    int causal;           /* causal attention */
    int explicit_scale;   /* a softmax scale other than the default 1/sqrt(Dh) was requested */
} sp_attn_request;

/* The start-up validation of docs/design.md section 6, run before any model is loaded. Checks in this order and fails
 * on the first broken rule with a message that names the values:
 *   sp < 1; ulysses < 1; trainer_ranks < 1; trainer_ranks % sp; sp % ulysses;
 *   and when req != NULL: num_heads % ulysses; tokens % sp; and, when sp > 1, an attention mask, dropout > 0,
 *   causal attention, an explicit scale ("not supported under sequence parallelism (parallel.sp = 4)").
 * Returns 0, or -1 with core_error. */
int sp_validate(int trainer_ranks, int sp, int ulysses_degree, const sp_attn_request *req);

#endif
