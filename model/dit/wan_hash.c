/* model/dit/wan_hash.c — whole-model xxh64 of one or two experts (docs/design.md section 3, core/checksum.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"

const char *wan_expert_folder(int expert) { return expert ? "transformer_2" : "transformer"; }

uint64_t wan_tensor_hash(const wan_model *m, int i) {
    const wan_tensor *t = &m->layout.tensors[i];
    return core_xxh64(m->params + t->offset, sizeof(float) * (size_t)t->numel, 0);
}

int wan_tensor_sets_hash(const wan_layout *const *layouts, const float *const *params, int n, uint64_t *out) {
    return wan_tensor_sets_hash_given(layouts, params, NULL, n, out);
}

int wan_tensor_sets_hash_given(const wan_layout *const *layouts, const float *const *params,
                               const uint64_t *const *hashes, int n, uint64_t *out) {
    int total = 0;
    for (int e = 0; e < n; e++) total += layouts[e] ? layouts[e]->count : 0;
    char **names = calloc((size_t)total + 1, sizeof *names);
    uint64_t *h = malloc(sizeof(uint64_t) * ((size_t)total + 1));
    int k = 0, rc = -1;
    if (!names || !h) {
        core_error("out of memory");
        goto done;
    }
    for (int e = 0; e < n; e++)
        for (int i = 0; layouts[e] && i < layouts[e]->count; i++, k++) {
            const wan_tensor *t = &layouts[e]->tensors[i];
            size_t len = strlen(wan_expert_folder(e)) + strlen(t->name) + 2;
            if (!(names[k] = malloc(len))) {
                core_error("out of memory");
                goto done;
            }
            snprintf(names[k], len, "%s/%s", wan_expert_folder(e), t->name);
            h[k] = hashes && hashes[e] ? hashes[e][i] : core_xxh64(params[e] + t->offset, sizeof(float) * (size_t)t->numel, 0);
        }
    rc = core_model_hash((const char *const *)names, h, (size_t)total, out);
done:
    if (names)
        for (int i = 0; i < total; i++) free(names[i]);
    free(names), free(h);
    return rc;
}

int wan_models_hash(const wan_model *const *experts, int n, uint64_t *out) {
    const wan_layout *L[WAN_HASH_MAX_SETS];
    const float *P[WAN_HASH_MAX_SETS];
    if (n < 0 || n > WAN_HASH_MAX_SETS) return core_error("wan_models_hash: %d experts", n);
    for (int e = 0; e < n; e++) L[e] = &experts[e]->layout, P[e] = experts[e]->params;
    return wan_tensor_sets_hash(L, P, n, out);
}

int wan_models_adapters_hash(const wan_model *const *experts, int n, uint64_t *out) {
    *out = 0;
    const wan_layout *L[WAN_HASH_MAX_SETS];
    const float *P[WAN_HASH_MAX_SETS];
    int count = 0;
    if (n < 0 || n > WAN_HASH_MAX_SETS) return core_error("wan_models_adapters_hash: %d experts", n);
    for (int e = 0; e < n; e++) {
        const wan_lora *l = experts[e] ? experts[e]->lora : NULL;
        L[e] = l ? &l->layout : NULL, P[e] = l ? l->params : NULL;
        count += l != NULL;
    }
    if (!count) return 0;
    return wan_tensor_sets_hash(L, P, n, out) ? -1 : count;
}
