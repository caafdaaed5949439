/* model/dit/wan_hash.c — whole-model xxh64 of one or two experts (DESIGN.md section 3, core/checksum.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "model/dit/wan_dit.h"

const char *wan_expert_folder(int expert) { return expert ? "transformer_2" : "transformer"; }

uint64_t wan_tensor_hash(const wan_model *m, int i) {
    const wan_tensor *t = &m->layout.tensors[i];
    return core_xxh64(m->params + t->offset, sizeof(float) * (size_t)t->numel, 0);
}

int wan_models_hash(const wan_model *const *experts, int n, uint64_t *out) {
    int total = 0;
    for (int e = 0; e < n; e++) total += experts[e]->layout.count;
    char **names = calloc((size_t)total + 1, sizeof *names);
    uint64_t *h = malloc(sizeof(uint64_t) * ((size_t)total + 1));
    int k = 0, rc = -1;
    if (!names || !h) {
        core_error("out of memory");
        goto done;
    }
    for (int e = 0; e < n; e++)
        for (int i = 0; i < experts[e]->layout.count; i++, k++) {
            const char *nm = experts[e]->layout.tensors[i].name;
            size_t len = strlen(wan_expert_folder(e)) + strlen(nm) + 2;
            if (!(names[k] = malloc(len))) {
                core_error("out of memory");
                goto done;
            }
            snprintf(names[k], len, "%s/%s", wan_expert_folder(e), nm);
            h[k] = wan_tensor_hash(experts[e], i);
        }
    rc = core_model_hash((const char *const *)names, h, (size_t)total, out);
done:
    if (names)
        for (int i = 0; i < total; i++) free(names[i]);
    free(names), free(h);
    return rc;
}
