/* tests/ckpt_edit.h — deliberate edits of a checkpoint for tests: a file's bytes, bytes written into one tensor's
 * data (poke), and the integrity record recomputed afterwards (reseal), so that only the checks after the checksums
 * (trainer/checkpoint/checkpoint_sums.h) see the edit. Static helpers for the test files that include it. */
#ifndef TESTS_CKPT_EDIT_H
#define TESTS_CKPT_EDIT_H

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/safetensors.h"
#include "tests/test.h"

/* The whole file's bytes (malloc'd) and their count. */
static inline unsigned char *slurp_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)l + 1);
    if (b && fread(b, 1, (size_t)l, f) != (size_t)l) free(b), b = NULL;
    fclose(f);
    *n = (size_t)l;
    return b;
}

static inline json_t *hexs(uint64_t h) {
    char s[17];
    snprintf(s, sizeof s, "%016llx", (unsigned long long)h);
    return json_string(s);
}

/* Recomputes ck's integrity record in trainer_state.json (as trainer/checkpoint/checkpoint_sums.h defines it) after a deliberate
 * edit, so that only the checks after the checksums see the edit. */
static inline void reseal(const char *ck) {
    char p[1024], fp[1024];
    snprintf(p, sizeof p, "%s/trainer_state.json", ck);
    json_t *o = json_load_file(p, 0, NULL);
    REQUIRE(o);
    json_t *files = json_object_get(o, "files"), *tensors = json_object_get(o, "tensors");
    REQUIRE(json_is_object(files) && json_is_object(tensors));
    const char *rel;
    json_t *v;
    json_object_foreach(files, rel, v) {
        size_t n;
        snprintf(fp, sizeof fp, "%s/%s", ck, rel);
        unsigned char *b = slurp_bytes(fp, &n);
        REQUIRE(b);
        char h[17];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)core_xxh64(b, n, 0));
        json_string_set(v, h);
        free(b);
        if (strlen(rel) < 12 || strcmp(rel + strlen(rel) - 12, ".safetensors")) continue;
        st_file *f = st_open(fp);
        REQUIRE(f);
        json_t *t = json_object();
        for (int i = 0; i < st_count(f); i++) {
            core_tensor x;
            uint64_t th;
            REQUIRE_OK(st_get(f, st_info_at(f, i)->name, &x));
            REQUIRE_OK(core_tensor_xxh64(&x, &th));
            core_tensor_free(&x);
            json_object_set_new(t, st_info_at(f, i)->name, hexs(th));
        }
        st_close(f);
        json_object_set_new(tensors, rel, t);
    }
    json_object_del(o, "state_xxh64");
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    REQUIRE(s);
    json_object_set_new(o, "state_xxh64", hexs(core_xxh64(s, strlen(s), 0)));
    free(s);
    REQUIRE(json_dump_file(o, p, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0);
    json_decref(o);
}

/* Writes `len` bytes at byte `at` of tensor `name`'s data in the safetensors file at path (xor_mask != 0: flips those
 * bits of one byte instead). */
static inline void poke(const char *path, const char *name, int64_t at, const void *bytes, size_t len,
                        unsigned xor_mask) {
    st_file *f = st_open(path);
    REQUIRE(f);
    const int i = st_find(f, name);
    REQUIRE(i >= 0);
    const uint64_t begin = st_info_at(f, i)->begin;
    st_close(f);
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    uint64_t hlen = 0;
    REQUIRE(pread(fd, &hlen, 8, 0) == 8); /* little-endian header length; the data region follows the header */
    const off_t off = (off_t)(8 + hlen + begin + (uint64_t)at);
    if (xor_mask) {
        unsigned char c;
        REQUIRE(pread(fd, &c, 1, off) == 1);
        c ^= (unsigned char)xor_mask;
        REQUIRE(pwrite(fd, &c, 1, off) == 1);
    } else {
        REQUIRE(pwrite(fd, bytes, len, off) == (ssize_t)len);
    }
    close(fd);
}

#endif
