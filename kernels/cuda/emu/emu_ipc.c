/* kernels/cuda/emu/emu_ipc.c — the emulated device's ipc_* entries (kernels/dev_ops.h): what CUDA IPC does between
 * two processes on one GPU host, done with POSIX shared memory so that the weight sync's IPC handshake and copy
 * (trainer/net/sync_ipc.h) run in `make test` without a GPU.
 *
 * One difference, stated: CUDA exports the live allocation (a reader sees later writes); the emulated export copies
 * the bytes into a new shared-memory object "/vgrpo-ipc-<pid>-<n>" (mode 0600: this user only) at the time of the
 * export, and ipc_unexport removes it. The weight sync exports after the optimizer step and unexports once every
 * reader has acknowledged, so for the sync the two are the same. The handle: "vgrpo-emu-ipc" (16 bytes), the size
 * (u64 little-endian), the object's name. VGRPO_EMULATE_IPC=refuse makes ipc_open refuse every handle (tests of the
 * fallback to buckets). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "kernels/cuda/emu/k_emu.h"

static const char magic[16] = "vgrpo-emu-ipc";
enum { NAME_AT = 24, NAME_MAX_ = K_IPC_HANDLE_BYTES - NAME_AT };

/* The mappings ipc_open made (ipc_close needs their sizes). Not thread-safe, as the rest of the table. */
#define MAPS 64
static struct {
    const void *p;
    size_t len;
} maps[MAPS];

int k_emu_ipc_export(const void *dev, size_t bytes, uint8_t *handle) {
    static unsigned seq;
    char name[NAME_MAX_];
    snprintf(name, sizeof name, "/vgrpo-ipc-%ld-%u", (long)getpid(), seq++);
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return core_error("emulated device: ipc_export: shm_open %s: %s", name, strerror(errno));
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)(bytes ? bytes : 1)) == 0)
        p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return core_error("emulated device: ipc_export of %zu bytes: %s", bytes, strerror(e));
    }
    memcpy(p, dev, bytes);
    munmap(p, bytes ? bytes : 1);
    memset(handle, 0, K_IPC_HANDLE_BYTES);
    memcpy(handle, magic, sizeof magic);
    for (int i = 0; i < 8; i++) handle[16 + i] = (uint8_t)((uint64_t)bytes >> (8 * i));
    memcpy(handle + NAME_AT, name, strlen(name));
    return 0;
}

/* The object's name and size from a handle: 0, or -1 (not one of ours). */
static int parse(const uint8_t *handle, char name[NAME_MAX_], size_t *bytes) {
    if (memcmp(handle, magic, sizeof magic))
        return core_error("emulated device: the IPC handle is not one of the emulated device's");
    uint64_t b = 0;
    for (int i = 0; i < 8; i++) b |= (uint64_t)handle[16 + i] << (8 * i);
    memcpy(name, handle + NAME_AT, NAME_MAX_ - 1);
    name[NAME_MAX_ - 1] = 0;
    if (name[0] != '/' || strchr(name + 1, '/'))
        return core_error("emulated device: the IPC handle names no shared-memory object");
    *bytes = (size_t)b;
    return 0;
}

int k_emu_ipc_unexport(const uint8_t *handle) {
    char name[NAME_MAX_];
    size_t bytes;
    if (parse(handle, name, &bytes)) return -1;
    if (shm_unlink(name)) return core_error("emulated device: ipc_unexport %s: %s", name, strerror(errno));
    return 0;
}

int k_emu_ipc_open(const uint8_t *handle, size_t bytes, const void **dev) {
    char name[NAME_MAX_];
    size_t have;
    *dev = NULL;
    if (parse(handle, name, &have)) return -1;
    /* tests of the fallback to buckets: a worker whose device refuses every handle, as another host's would */
    const char *env = getenv("VGRPO_EMULATE_IPC");
    if (env && !strcmp(env, "refuse"))
        return core_error("emulated device: ipc_open refused (VGRPO_EMULATE_IPC=refuse: a test of the fallback)");
    if (have != bytes)
        return core_error("emulated device: ipc_open %s: it holds %zu bytes, %zu expected", name, have, bytes);
    int slot = -1;
    for (int i = 0; i < MAPS && slot < 0; i++)
        if (!maps[i].p) slot = i;
    if (slot < 0) return core_error("emulated device: ipc_open: %d handles open already", MAPS);
    const int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) return core_error("emulated device: ipc_open %s: %s", name, strerror(errno));
    struct stat sb;
    void *p = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= (bytes ? bytes : 1))
        p = mmap(NULL, bytes ? bytes : 1, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (p == MAP_FAILED) return core_error("emulated device: ipc_open %s (%zu bytes): %s", name, bytes, strerror(e));
    maps[slot].p = p, maps[slot].len = bytes ? bytes : 1;
    *dev = p;
    return 0;
}

int k_emu_ipc_close(const void *dev) {
    for (int i = 0; i < MAPS; i++)
        if (dev && maps[i].p == dev) {
            munmap((void *)dev, maps[i].len);
            maps[i].p = NULL;
            return 0;
        }
    return core_error("emulated device: ipc_close of a pointer ipc_open did not return");
}
