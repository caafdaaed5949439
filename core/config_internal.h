/* core/config_internal.h — helpers shared by config.c (trees) and config_schema.c (schemas); not a public API. */
#ifndef CORE_CONFIG_INTERNAL_H
#define CORE_CONFIG_INTERNAL_H

#include "core/config.h"

/* Gives n and its subtree a new key path and source label (line 0). Returns 0, or -1 when out of memory. */
int core_cfgi_retarget(core_cfg_node *n, const char *path, const char *where);
/* Records "where: path: expected <expected>, got <what n is>" and returns -1. */
int core_cfgi_type_error(const core_cfg_node *n, const char *expected);

/* Plain-scalar typing (config.h's YAML 1.2 core rules). text_int: 1 (and *v) for an integer, 0 for other text, -1
 * for one out of int64 range; text_double: the same for a number (integers too), -1 for a float out of range;
 * text_bool: 1 for true/false in their three spellings, else 0. */
int core_cfgi_text_int(const char *s, int64_t *v);
int core_cfgi_text_double(const char *s, double *v);
int core_cfgi_text_bool(const char *s, bool *v);

#endif
