/* tests/test_wan_config.c — WanTransformer3DModel config.json parsing, rejections, writing; the parameter table
 * against the names and shapes diffusers builds on the meta device (tests/fixtures/wan_names_<preset>.txt). */
#include <stdio.h>

#include "tests/test.h"
#include "tests/wan_test_util.h"

/* The diffusers unit-test config as save_pretrained wrote it. */
TEST(wan_config_fixture_values) {
    wan_config c;
    REQUIRE_OK(wan_config_load(&c, "tests/fixtures/wan_difftest/config.json"));
    CHECK(c.patch_size[0] == 1 && c.patch_size[1] == 2 && c.patch_size[2] == 2);
    CHECK(c.num_attention_heads == 2 && c.attention_head_dim == 12);
    CHECK(c.in_channels == 4 && c.out_channels == 4 && c.text_dim == 16 && c.freq_dim == 256);
    CHECK(c.ffn_dim == 32 && c.num_layers == 2 && c.cross_attn_norm == 1 && c.rope_max_seq_len == 32);
    CHECK(c.eps == 1e-6);
    REQUIRE_OK(wan_config_load(&c, "tests/fixtures/wan_multihead/config.json"));
    CHECK(c.cross_attn_norm == 0 && c.eps == 1e-5 && c.out_channels == 6 && c.num_attention_heads == 3);
}

/* The diffusers unit-test config as key/value pairs; make_json replaces one key's value (or appends the key). */
static const char *base_kv[][2] = {
    {"_class_name", "\"WanTransformer3DModel\""}, {"_diffusers_version", "\"0.33.0\""},
    {"patch_size", "[1, 2, 2]"}, {"num_attention_heads", "2"}, {"attention_head_dim", "12"},
    {"in_channels", "4"}, {"out_channels", "4"}, {"text_dim", "16"}, {"freq_dim", "256"}, {"ffn_dim", "32"},
    {"num_layers", "2"}, {"cross_attn_norm", "true"}, {"qk_norm", "\"rms_norm_across_heads\""},
    {"eps", "1e-06"}, {"image_dim", "null"}, {"added_kv_proj_dim", "null"}, {"rope_max_seq_len", "32"},
    {"pos_embed_seq_len", "null"}};

static void make_json(char *buf, size_t cap, const char *key, const char *value) {
    size_t n = (size_t)snprintf(buf, cap, "{");
    int found = 0;
    for (size_t i = 0; i < sizeof base_kv / sizeof base_kv[0]; i++) {
        const char *v = base_kv[i][1];
        if (key && !strcmp(key, base_kv[i][0])) v = value, found = 1;
        n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\": %s", i ? ", " : "", base_kv[i][0], v);
    }
    if (key && !found) n += (size_t)snprintf(buf + n, cap - n, ", \"%s\": %s", key, value);
    snprintf(buf + n, cap - n, "}");
}

TEST(wan_config_rejections_name_the_key) {
    wan_config c;
    char buf[2048];
    make_json(buf, sizeof buf, NULL, NULL);
    REQUIRE_OK(wan_config_parse(&c, buf, "cfg.json"));
    CHECK(c.num_attention_heads == 2 && c.rope_max_seq_len == 32);
    struct {
        const char *key, *value, *want;
    } bad[] = {
        {"image_dim", "1280", "I2V"},
        {"added_kv_proj_dim", "5120", "I2V"},
        {"pos_embed_seq_len", "514", "I2V"},
        {"qk_norm", "\"layer_norm\"", "rms_norm_across_heads"},
        {"qk_norm", "null", "rms_norm_across_heads"},
        {"window_size", "[-1, -1]", "unknown key"},
        {"num_layers", "\"two\"", "integer"},
        {"cross_attn_norm", "1", "true or false"},
        {"patch_size", "[1, 2]", "3"},
        {"attention_head_dim", "7", "even"},
        {"num_attention_heads", "0", ">= 1"},
        {"eps", "-1.0", "positive"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        make_json(buf, sizeof buf, bad[i].key, bad[i].value);
        core_error_clear();
        int rc = wan_config_parse(&c, buf, "cfg.json");
        const char *msg = core_last_error();
        CHECK_MSG(rc == -1, "accepted %s = %s", bad[i].key, bad[i].value);
        CHECK_MSG(strstr(msg, "cfg.json") && strstr(msg, bad[i].key) && strstr(msg, bad[i].want),
                  "message for %s = %s: \"%s\"", bad[i].key, bad[i].value, msg);
    }
    /* not JSON at all; duplicate keys */
    CHECK(wan_config_parse(&c, "{\"a\": ", "cfg.json") == -1 && strstr(core_last_error(), "cfg.json"));
    CHECK(wan_config_parse(&c, "{\"num_layers\": 1, \"num_layers\": 2}", "cfg.json") == -1);
}

TEST(wan_config_out_channels_null_is_in_channels) {
    wan_config c;
    const char *j = "{\"in_channels\": 48, \"out_channels\": null, \"num_layers\": 1}";
    REQUIRE_OK(wan_config_parse(&c, j, "x"));
    CHECK(c.out_channels == 48 && c.in_channels == 48);
    CHECK(c.num_attention_heads == 40 && c.ffn_dim == 13824 && c.text_dim == 4096); /* diffusers defaults */
}

TEST(wan_config_save_roundtrip) {
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    wan_config a, b;
    REQUIRE_OK(wan_config_load(&a, "tests/fixtures/wan_multihead/config.json"));
    REQUIRE_OK(wan_config_save(&a, path));
    REQUIRE_OK(wan_config_load(&b, path));
    CHECK(wan_config_equal(&a, &b));
    /* byte-identical to what diffusers' save_pretrained wrote for the same config */
    FILE *f1 = fopen(path, "rb"), *f2 = fopen("tests/fixtures/wan_multihead/config.json", "rb");
    REQUIRE(f1 && f2);
    char s1[2048] = {0}, s2[2048] = {0};
    size_t n1 = fread(s1, 1, sizeof s1 - 1, f1), n2 = fread(s2, 1, sizeof s2 - 1, f2);
    fclose(f1), fclose(f2);
    CHECK_MSG(n1 == n2 && !strcmp(s1, s2), "config.json differs from diffusers':\n%s\nvs\n%s", s1, s2);
}

/* Every preset's table equals the diffusers state_dict list: same names, order and shapes; total count too. */
TEST(wan_params_match_diffusers_names) {
    for (const char *const *p = wan_preset_names(); *p; p++) {
        wan_config c;
        REQUIRE_OK(wan_config_preset(&c, *p));
        wan_layout L;
        REQUIRE_OK(wan_layout_init(&L, &c));
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/wan_names_%s.txt", *p);
        FILE *f = fopen(path, "r");
        REQUIRE(f != NULL);
        char line[512];
        int i = 0, bad = 0;
        long long total = -1;
        while (fgets(line, sizeof line, f)) {
            if (line[0] == '#') {
                long long v;
                if (sscanf(line, "# %lld parameters", &v) == 1) total = v;
                continue;
            }
            char name[256];
            int off = 0;
            if (sscanf(line, "%255s%n", name, &off) != 1) continue;
            int64_t shape[8];
            int nd = 0, k;
            long long d;
            const char *s = line + off;
            while (nd < 8 && sscanf(s, "%lld%n", &d, &k) == 1) shape[nd++] = d, s += k;
            if (i >= L.count) {
                bad++;
                CHECK_MSG(0, "%s: extra diffusers tensor %s", *p, name);
                i++;
                continue;
            }
            const wan_tensor *t = &L.tensors[i];
            int same = !strcmp(t->name, name) && t->ndim == nd;
            for (int j = 0; same && j < nd; j++) same = t->shape[j] == shape[j];
            if (!same && bad++ < 5) CHECK_MSG(0, "%s: tensor %d: vgrpo %s, diffusers %s", *p, i, t->name, line);
            i++;
        }
        fclose(f);
        CHECK_MSG(i == L.count, "%s: %d names in the list, %d in vgrpo's table", *p, i, L.count);
        CHECK_MSG(total == L.numel, "%s: %lld parameters in the list, %lld in vgrpo's table", *p, total,
                  (long long)L.numel);
        CHECK(bad == 0);
        wan_layout_free(&L);
    }
}

TEST(wan_preset_unknown_lists_presets) {
    wan_config c;
    CHECK(wan_config_preset(&c, "wan9") == -1);
    CHECK(strstr(core_last_error(), "wan9") && strstr(core_last_error(), "wan2.1-t2v-1.3b"));
}
