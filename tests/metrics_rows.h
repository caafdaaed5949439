/* tests/metrics_rows.h — reading a run's metrics.jsonl for comparisons between runs: the rows as JSON objects with
 * the fields that legitimately differ removed (timing under "time/", weight_sync/seconds and weight_sync/gb_per_s; with drop_sync every
 * weight_sync/ field, for comparing a colocated run with a local one, which has none). */
#ifndef TESTS_METRICS_ROWS_H
#define TESTS_METRICS_ROWS_H

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* Reads up to cap rows into rows[] (caller json_decref's each); stops at the first line that is not a JSON object.
 * Returns the count, or -1 when the file cannot be opened. */
static inline int read_rows(const char *path, json_t **rows, int cap, int drop_sync) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    static char line[1 << 16];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &err);
        if (!json_is_object(o)) {
            json_decref(o);
            break;
        }
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(o, tmp, k, v) {
            if (!strncmp(k, "time/", 5) || !strcmp(k, "weight_sync/seconds") || !strcmp(k, "weight_sync/gb_per_s") ||
                (drop_sync && !strncmp(k, "weight_sync/", 12)))
                json_object_del(o, k);
        }
        rows[n++] = o;
    }
    fclose(f);
    return n;
}

#endif
