/* tests/st_test_util.h — small file helpers shared by the safetensors tests (hand-built files, whole-file reads). */
#ifndef TESTS_ST_TEST_UTIL_H
#define TESTS_ST_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes n bytes to path. Returns 0 or -1. */
static inline int st_test_write_bytes(const char *path, const void *bytes, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = n ? fwrite(bytes, 1, n, fp) : 0;
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

/* Writes a safetensors file by hand: u64 LE header length, the JSON padded with spaces to a multiple of pad_to,
 * then dlen data bytes. Returns 0 or -1. */
static inline int st_test_write_raw(const char *path, const char *json, size_t pad_to, const void *data, size_t dlen) {
    size_t jl = strlen(json), hl = (jl + pad_to - 1) / pad_to * pad_to;
    uint8_t *buf = malloc(8 + hl + dlen + 1);
    if (!buf) return -1;
    for (int b = 0; b < 8; b++) buf[b] = (uint8_t)((uint64_t)hl >> (8 * b));
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, ' ', hl - jl);
    if (dlen) memcpy(buf + 8 + hl, data, dlen);
    int rc = st_test_write_bytes(path, buf, 8 + hl + dlen);
    free(buf);
    return rc;
}

/* The whole file in a malloc'd buffer (NULL on error); *n = its size. */
static inline uint8_t *st_test_slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(sz > 0 ? (size_t)sz : 1);
    if (b && fread(b, 1, (size_t)sz, fp) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    *n = (size_t)sz;
    return b;
}

#endif
