/* trainer/lora.c — the recipe's model.lora and the adapters' hash (see trainer/lora.h). */
#include "trainer/lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"

int trainer_lora_config(const core_recipe *r, const wan_config *model, wan_lora_config *c) {
    memset(c, 0, sizeof *c);
    if (r->lora_rank < 1) return 0;
    c->rank = r->lora_rank;
    c->alpha = r->lora_alpha;
    c->init_seed = (uint64_t)r->lora_init_seed;
    if (!(c->alpha > 0))
        return core_error("model.lora.alpha: must be > 0 with model.lora.rank %d, got %g", c->rank, c->alpha);
    if (wan_lora_targets_parse(&c->targets, (const char *const *)r->lora_targets.v, r->lora_targets.n,
                               "model.lora.targets"))
        return -1;
    if (model && wan_lora_config_validate(c, model, "model.lora.rank")) return -1;
    return 1;
}

int trainer_lora_hash(const wan_model *const *experts, int n, uint64_t *out) {
    *out = 0;
    const wan_layout *L[WAN_HASH_MAX_SETS];
    const float *P[WAN_HASH_MAX_SETS];
    int count = 0;
    if (n < 0 || n > WAN_HASH_MAX_SETS) return core_error("%d experts", n);
    for (int e = 0; e < n; e++) {
        const wan_lora *l = experts[e] ? experts[e]->lora : NULL;
        L[e] = l ? &l->layout : NULL, P[e] = l ? l->params : NULL;
        count += l != NULL;
    }
    if (!count) return 0;
    return wan_tensor_sets_hash(L, P, n, out) ? -1 : count;
}
