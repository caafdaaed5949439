/* core/json.c — see json.h. */
#include "core/json.h"

#include "core/error.h"
#include "core/fs.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static json_t *object_or_error(json_t *root, const json_error_t *je, const char *label) {
    if (!root) {
        core_error("%s: line %d: %s", label, je->line, je->text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        core_error("%s: not a JSON object", label);
        return NULL;
    }
    return root;
}

json_t *core_json_parse_object(const char *text, const char *label) {
    json_error_t je;
    return object_or_error(json_loads(text, JSON_REJECT_DUPLICATES, &je), &je, label);
}

json_t *core_json_load_object(const char *path) {
    json_error_t je;
    return object_or_error(json_load_file(path, JSON_REJECT_DUPLICATES, &je), &je, path);
}

int core_json_write_file(const json_t *o, const char *path, size_t flags, const char *mode) {
    if (!strcmp(mode, "wx")) unlink(path); /* a leftover temporary of a write cut short */
    FILE *f = core_fopen_nofollow(path, mode);
    if (!f) return -1;
    int rc = json_dumpf(o, f, flags) ? core_error("%s: write failed: %s", path, strerror(errno)) : 0;
    if (fclose(f) && !rc) rc = core_error("%s: write failed: %s", path, strerror(errno));
    return rc;
}
