/* core/json.h — loading a JSON object (a model's config.json, an index) with errors that name the file and line. */
#ifndef CORE_JSON_H
#define CORE_JSON_H

#include <jansson.h>

/* Parses text as one JSON object (duplicate keys refused, as a config must not say two things). Returns a new
 * reference, or NULL with core_error "<label>: line N: <jansson's reason>" or "<label>: not a JSON object". */
json_t *core_json_parse_object(const char *text, const char *label);

/* core_json_parse_object of the file at path (label = path); a missing or unreadable file is named too. */
json_t *core_json_load_object(const char *path);

/* json_dumpf of o (flags as json_dump_file's) into path, opened with core_fopen_nofollow: mode "w" (created or
 * truncated, never through a symlink) or "wx" (new: a temporary before a rename; an old one is removed first).
 * 0, or -1 with core_error naming path and the reason. */
int core_json_write_file(const json_t *o, const char *path, size_t flags, const char *mode);

#endif
