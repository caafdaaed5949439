/* kernels/cuda/streams.c — the CUDA table's streams and events (kernels/dev_ops.h: stream_new .. stream_use): a
 * second stream for the gradient reduction overlapping the backward (trainer/dp/dp_bucket.h), ordered against the
 * backend's own stream (kc_stream) by events. stream_use switches the stream the table's own kernels launch on
 * (the exact reduction's block_sum runs on the comm's stream, sp/comm_nccl.c); only the kernels of kern_*.cu
 * follow it, so it is for those alone (cuBLASLt and cuDNN keep kc_stream's handles: not switched while they run). */
#include "core/error.h"
#include "kernels/cuda/internal.h"

static cudaStream_t own; /* kc_stream as k_cuda_init made it (set on the first switch) */
static int own_set;

void *kc_stream_new(void) {
    cudaStream_t s = NULL;
    if (kc_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags")) return NULL;
    return (void *)s;
}

void kc_stream_free(void *s) {
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

void *kc_event_new(void) {
    cudaEvent_t e = NULL;
    if (kc_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags")) return NULL;
    return (void *)e;
}

void kc_event_free(void *e) {
    if (e) cudaEventDestroy((cudaEvent_t)e);
}

static cudaStream_t resolve(void *s) { return s ? (cudaStream_t)s : own_set ? own : kc_stream; }

int kc_event_record(void *e, void *s) {
    if (!e) return core_error("event_record: no event");
    return kc_check(cudaEventRecord((cudaEvent_t)e, resolve(s)), "cudaEventRecord");
}

int kc_stream_wait(void *s, void *e) {
    if (!e) return core_error("stream_wait: no event");
    return kc_check(cudaStreamWaitEvent(resolve(s), (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
}

void *kc_stream_use(void *s) {
    if (!own_set) own = kc_stream, own_set = 1;
    cudaStream_t prev = kc_stream;
    kc_stream = s ? (cudaStream_t)s : own;
    return prev == own ? NULL : (void *)prev;
}
