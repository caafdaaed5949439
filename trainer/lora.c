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
    int total = 0, count = 0;
    for (int e = 0; e < n; e++)
        if (experts[e] && experts[e]->lora) total += experts[e]->lora->layout.count, count++;
    if (!count) return 0;
    char **names = calloc((size_t)total, sizeof *names);
    uint64_t *h = malloc(sizeof(uint64_t) * (size_t)total);
    int k = 0, rc = -1;
    if (!names || !h) {
        core_error("out of memory");
        goto done;
    }
    for (int e = 0; e < n; e++) {
        const wan_lora *l = experts[e] ? experts[e]->lora : NULL;
        for (int i = 0; l && i < l->layout.count; i++, k++) {
            const size_t len = strlen(wan_expert_folder(e)) + strlen(l->layout.tensors[i].name) + 2;
            if (!(names[k] = malloc(len))) {
                core_error("out of memory");
                goto done;
            }
            snprintf(names[k], len, "%s/%s", wan_expert_folder(e), l->layout.tensors[i].name);
            h[k] = wan_lora_tensor_hash(l, i);
        }
    }
    rc = core_model_hash((const char *const *)names, h, (size_t)total, out) ? -1 : count;
done:
    for (int i = 0; names && i < total; i++) free(names[i]);
    free(names), free(h);
    return rc;
}
