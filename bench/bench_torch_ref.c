/* bench/bench_torch_ref.c — PyTorch's figures for the same benchmarks, read from the JSON file
 * `scripts/bench_torch.py --json FILE` writes (`vgrpo bench dit|umt5|vae --torch FILE`; `make bench-compare` runs
 * both in one window), so a table can print vgrpo and PyTorch side by side. */
#include <jansson.h>
#include <stdio.h>

#include "bench/bench.h"

static json_t *torch_ref;

int bench_torch_load(const char *path) {
    json_error_t err;
    json_decref(torch_ref);
    torch_ref = json_load_file(path, 0, &err);
    if (!torch_ref) {
        fprintf(stderr, "vgrpo bench: --torch %s: %s (line %d); run scripts/bench_torch.py --json %s first\n", path,
                err.text, err.line, path);
        return -1;
    }
    return 0;
}

double bench_torch_figure(const char *section, const char *key, const char *field) {
    json_t *v = json_object_get(json_object_get(json_object_get(torch_ref, section), key), field);
    return json_is_number(v) ? json_number_value(v) : -1.0;
}

void bench_torch_describe(void) {
    if (!torch_ref) return;
    json_t *ver = json_object_get(torch_ref, "torch"), *th = json_object_get(torch_ref, "threads");
    printf("PyTorch figures: torch %s, %lld thread%s (scripts/bench_torch.py --json, same machine)\n",
           json_is_string(ver) ? json_string_value(ver) : "?", json_is_integer(th) ? (long long)json_integer_value(th) : 0,
           json_is_integer(th) && json_integer_value(th) == 1 ? "" : "s");
}
