/* kernels/cuda/emu/emu_stream.h — the emulated device's streams and events (kernels/dev_ops.h: stream_new ..
 * stream_use). The emulated device runs every entry at once, in call order, so a second stream changes nothing it
 * computes; what its streams keep is the books of the ordering contract a GPU needs, so that a test fails where a
 * GPU would race:
 *   - the table's own stream counts its GEMMs (emu_stream_compute: every parameter gradient of the backward is a
 *     GEMM's or comes with one); an event recorded there carries that count, and a stream that waits for it holds
 *     it in `waited`. A collective enqueued on a stream (the fake NCCL, tests/fake_nccl/, reads this struct) or the
 *     exact reduction's block_sum launched there must find waited == the current count: the stream waited for
 *     everything the backward had enqueued (the gradients it reduces are final), else it is refused;
 *   - each stream counts the work enqueued on it (`launched`: block_sum here, the collectives in the fake NCCL); an
 *     event recorded on it carries that count, and the table's own stream waiting for it sets `joined`. The
 *     optimizer's entries (adamw_update, sumsq, scale) refuse to run while some stream has launched != joined: the
 *     step would read gradients still being reduced.
 * Not thread-safe (one host thread drives the device, as everywhere on it). */
#ifndef KERNELS_CUDA_EMU_EMU_STREAM_H
#define KERNELS_CUDA_EMU_EMU_STREAM_H

#include <stdint.h>

#define EMU_STREAM_MAGIC 0x454d555354524d31ULL /* "EMUSTRM1" */

typedef struct emu_stream {
    uint64_t magic;
    const uint64_t *compute; /* the table's stream's GEMM count (emu_stream_compute), for readers of this struct */
    uint64_t waited;         /* the count of the last table's-stream event this stream waited for */
    uint64_t launched;       /* work enqueued on this stream */
    uint64_t joined;         /* launched as of the last event of this stream the table's stream waited for */
    struct emu_stream *next; /* the live streams */
} emu_stream;

/* The stream entries of k_emu_ops. */
void *emu_stream_new(void);
void emu_stream_free(void *s);
void *emu_event_new(void);
void emu_event_free(void *e);
int emu_event_record(void *e, void *s);
int emu_stream_wait(void *s, void *e);
void *emu_stream_use(void *s);

/* Bookkeeping for the table's entries: a GEMM on the current stream (the table's own: counted); work launched on
 * the current stream by `op` (another stream: it must have waited for the table's stream, -1 naming op otherwise,
 * and is counted); an optimizer entry `op` (-1 while a stream's work is not joined). */
void emu_stream_gemm(void);
int emu_stream_launch(const char *op);
int emu_stream_joined(const char *op);

#endif
