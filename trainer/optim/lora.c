/* trainer/optim/lora.c — the recipe's model.lora and the adapters' hash (see trainer/optim/lora.h). */
#include "trainer/optim/lora.h"

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

