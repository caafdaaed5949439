/* tests/fuzz/fuzz_frames.h — how the wire fuzz targets cut one input into message frames: byte 0 gives
 * k = byte % (max_k + 1) tensor frames; the next 2k bytes are their lengths (u16 little-endian); the frames are cut
 * from the end of the input (short inputs give short frames), and what is left is the header frame fr[0]. */
#ifndef TESTS_FUZZ_FRAMES_H
#define TESTS_FUZZ_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"

/* fr must hold max_k + 1 frames. Returns k (>= 0), or -1 when the input is too short to say. */
static inline int fuzz_cut_frames(const uint8_t *data, size_t size, int max_k, core_wire_frame *fr) {
    if (size < 1) return -1;
    const int k = data[0] % (max_k + 1);
    size_t pos = 1, end = size, lens[64];
    if (k > 64 || size < pos + 2 * (size_t)k) return -1;
    for (int i = 0; i < k; i++) lens[i] = (size_t)data[pos + 2 * i] | ((size_t)data[pos + 2 * i + 1] << 8);
    pos += 2 * (size_t)k;
    for (int i = k - 1; i >= 0; i--) {
        const size_t n = lens[i] < end - pos ? lens[i] : end - pos;
        fr[i + 1].data = data + end - n;
        fr[i + 1].len = n;
        end -= n;
    }
    fr[0].data = data + pos;
    fr[0].len = end - pos;
    return k;
}

#endif
