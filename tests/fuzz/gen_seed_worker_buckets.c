/* tests/fuzz/gen_seed_worker_buckets.c — writes seeds-fuzz_worker_msg/update_buckets: fuzz_worker_msg's micro model
 * (one expert, version 0) sent as a complete bucketed update of version 1 (32-byte buckets: a bucket holds part of a
 * tensor or spans two; at most 3 pieces, the target's frame limit), then weights_end with the right whole-model hash.
 * Not built by make; run once after a change to the bucket format:
 *   cc -O1 -std=c11 -D_GNU_SOURCE -I. -o /tmp/gen tests/fuzz/gen_seed_worker_buckets.c build/libvgrpo.a \
 *      -lyaml -ljansson -lxxhash -lm -fopenmp && /tmp/gen > tests/fuzz/seeds-fuzz_worker_msg/update_buckets */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire_rollout.h"
#include "model/dit/wan_dit.h"
#include "trainer/net/sync_bucket.h"

static void put(const core_wire_built *b) {
    /* one record: u16 length, then byte 0 = k tensor frames, k u16 lengths, the header, the frames */
    const int k = b->n_frames - 1;
    size_t len = 1 + 2 * (size_t)k;
    for (int i = 0; i < b->n_frames; i++) len += b->frames[i].len;
    if (len > 65535 || k > 3) fprintf(stderr, "record too long\n"), exit(1);
    putchar((int)(len & 255)), putchar((int)(len >> 8)), putchar(k);
    for (int i = 1; i <= k; i++) putchar((int)(b->frames[i].len & 255)), putchar((int)(b->frames[i].len >> 8));
    for (int i = 0; i < b->n_frames; i++) fwrite(b->frames[i].data, 1, b->frames[i].len, stdout);
}

static void fields(core_wire_type t, const char *id, json_t *f) {
    core_wire_built b;
    if (core_wire_build(t, id, f, NULL, 0, &b)) exit(1);
    put(&b);
    core_wire_built_free(&b);
    json_decref(f);
}

int main(void) {
    const wan_config c = {.patch_size = {1, 2, 2}, .num_attention_heads = 1, .attention_head_dim = 8, .in_channels = 4,
                          .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 16, .num_layers = 1,
                          .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};
    wan_model m;
    if (wan_model_init(&m, &c)) return 1;
    wan_params_init_random(&m, 99); /* other weights than the target's (seed 11) */
    const wan_layout *L[1] = {&m.layout};
    const uint8_t send[1] = {1};
    const int nb = sync_bucket_plan(L, send, 1, 32, NULL, 0);
    sync_bucket *bk = malloc(sizeof *bk * (size_t)nb);
    if (!bk || sync_bucket_plan(L, send, 1, 32, bk, nb) != nb) return 1;
    putchar(0); /* one expert, version 0 */
    fields(CORE_WIRE_WEIGHTS_BEGIN, "w1-begin",
           json_pack("{s:i, s:i, s:i}", "policy_version", 1, "tensors_count", m.layout.count, "buckets_count", nb));
    for (int k = 0; k < nb; k++) {
        core_wire_built b;
        char id[32];
        snprintf(id, sizeof id, "w1-b%d", k);
        if (sync_bucket_build(id, &bk[k], &m.layout, m.params, &b)) return 1;
        put(&b);
        core_wire_built_free(&b);
    }
    const wan_model *ms[1] = {&m};
    uint64_t h;
    char hx[17];
    if (wan_models_hash(ms, 1, &h)) return 1;
    core_hash_hex(h, hx);
    fields(CORE_WIRE_WEIGHTS_END, "w1-end", json_pack("{s:i, s:s}", "policy_version", 1, "model_xxh64", hx));
    free(bk);
    wan_model_free(&m);
    return 0;
}
