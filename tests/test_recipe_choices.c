/* tests/test_recipe_choices.c — the recipe's choice keys are parsed once, by core_recipe_check (core_recipe_load),
 * into r->choice (core/recipe.h): every choice of every such key in core_recipe_schema loads into the enum value of
 * its position in the schema's "a|b|c", the text stays as written (config.resolved.yaml), and a text filled in some
 * other way than the schema's apply is refused naming the key and its choices. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/recipe.h"
#include "tests/test.h"

/* A choice key, its parsed field in core_recipe_choices, and a --set its choices after the first need beside them. */
static const struct {
    const char *key;
    size_t at;
    const char *with;
} keys[] = {
    {"mode", offsetof(core_recipe_choices, mode), NULL},
    {"model.text_encoder", offsetof(core_recipe_choices, text_encoder), NULL},
    {"model.decoder", offsetof(core_recipe_choices, decoder), NULL},
    {"model.device", offsetof(core_recipe_choices, device), NULL},
    {"model.text_device", offsetof(core_recipe_choices, text_device), NULL},
    {"model.dtype", offsetof(core_recipe_choices, dtype), "model.device=cuda"}, /* bf16: cuda only */
    {"model.vae_device", offsetof(core_recipe_choices, vae_device), NULL},
    {"rollout.sde_type", offsetof(core_recipe_choices, sde_type), NULL},
    {"rollout.sde_window.schedule", offsetof(core_recipe_choices, sde_window_schedule), NULL},
    {"rollout.sde_window.at_end", offsetof(core_recipe_choices, sde_window_at_end), NULL},
    {"algorithm.std_mode", offsetof(core_recipe_choices, std_mode), NULL},
    {"algorithm.loss", offsetof(core_recipe_choices, loss), NULL},
    {"algorithm.cps_logprob", offsetof(core_recipe_choices, cps_logprob), "rollout.sde_type=cps"},
    {"algorithm.dpo_pairs", offsetof(core_recipe_choices, dpo_pairs), NULL},
    {"algorithm.train_experts", offsetof(core_recipe_choices, train_experts), NULL},
    {"algorithm.activations", offsetof(core_recipe_choices, activations), "model.device=cuda"}, /* checkpoint */
    {"optim.schedule", offsetof(core_recipe_choices, schedule), NULL},
    {"parallel.reduce", offsetof(core_recipe_choices, reduce), "model.device=cuda"}, /* nccl: cuda only */
    {"parallel.sync", offsetof(core_recipe_choices, sync), "model.device=cuda"},     /* nccl: cuda only */
};

static int choice_value(const core_recipe *r, size_t at) {
    int v; /* every field is an enum whose values fit an int */
    memcpy(&v, (const char *)&r->choice + at, sizeof v);
    return v;
}

TEST(recipe_choices_parsed_once) {
    CHECK(sizeof(core_sde_type) == sizeof(int) && sizeof(core_device) == sizeof(int));
    int n_keys = 0;
    for (const core_cfg_entry *e = core_recipe_schema; e->key; e++) {
        if (!e->choices || !strcmp(e->key, "logging.file_mode")) continue; /* the mode's text is its value */
        int k = 0;
        while (k < (int)(sizeof keys / sizeof keys[0]) && strcmp(keys[k].key, e->key)) k++;
        CHECK_MSG(k < (int)(sizeof keys / sizeof keys[0]), "%s has choices but no parsed field", e->key);
        REQUIRE(k < (int)(sizeof keys / sizeof keys[0]));
        n_keys++;
        int i = 0;
        for (const char *c = e->choices; *c; i++) {
            const size_t len = strcspn(c, "|");
            char set[256], text[64];
            snprintf(text, sizeof text, "%.*s", (int)len, c);
            snprintf(set, sizeof set, "%s=%s", e->key, text);
            const char *with = i > 0 ? keys[k].with : NULL, *sets[2] = {set, with};
            core_recipe r;
            const int rc = core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, with ? 2 : 1);
            CHECK_MSG(rc == 0, "%s: %s", set, core_last_error());
            if (!rc) {
                CHECK_MSG(choice_value(&r, keys[k].at) == i, "%s: parsed %d, want %d", set,
                          choice_value(&r, keys[k].at), i);
                char **field = NULL;
                for (const core_cfg_entry *f = core_recipe_schema; f->key; f++)
                    if (!strcmp(f->key, e->key)) field = (char **)((char *)&r + f->offset);
                CHECK_MSG(field && *field && !strcmp(*field, text), "%s: text \"%s\"", set, field && *field ? *field : "");
            }
            core_recipe_release(&r);
            c += len + (c[len] == '|');
        }
    }
    CHECK(n_keys == (int)(sizeof keys / sizeof keys[0]));
    /* the defaults: the first choice, except model.dtype, which follows model.device */
    core_recipe r;
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", NULL, 0));
    CHECK(r.choice.device == CORE_CPU && r.choice.dtype == CORE_COMPUTE_FP32 && r.choice.sde_type == CORE_SDE_TYPE_SDE);
    CHECK(core_recipe_trains_expert(&r, 0) && core_recipe_trains_expert(&r, 1));
    /* a text the schema did not see (a recipe changed after loading): refused by core_recipe_check */
    free(r.sde_type);
    r.sde_type = strdup("ode");
    CHECK(core_recipe_check(&r) == -1);
    CHECK_MSG(!strcmp(core_last_error(), "rollout.sde_type: must be one of sde|cps, got \"ode\""), "%s",
              core_last_error());
    free(r.sde_type);
    r.sde_type = strdup("cps");
    free(r.train_experts);
    r.train_experts = strdup("transformer_2");
    CHECK_MSG(core_recipe_check(&r) == 0, "%s", core_last_error());
    CHECK(r.choice.sde_type == CORE_SDE_TYPE_CPS && r.choice.train_experts == CORE_EXPERTS_TRANSFORMER_2);
    CHECK(!core_recipe_trains_expert(&r, 0) && core_recipe_trains_expert(&r, 1));
    core_recipe_release(&r);
}
