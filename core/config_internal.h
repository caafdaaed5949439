/* core/config_internal.h — helpers shared by config.c (trees) and config_schema.c (schemas); not a public API. */
#ifndef CORE_CONFIG_INTERNAL_H
#define CORE_CONFIG_INTERNAL_H

#include "core/config.h"

/* Gives n and its subtree a new key path and source label (line 0). Returns 0, or -1 when out of memory. */
int core_cfgi_retarget(core_cfg_node *n, const char *path, const char *where);
/* Records "where: path: expected <expected>, got <what n is>" and returns -1. */
int core_cfgi_type_error(const core_cfg_node *n, const char *expected);

#endif
