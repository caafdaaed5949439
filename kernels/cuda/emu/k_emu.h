/* kernels/cuda/emu/k_emu.h — the emulated device: the k_dev_ops table (kernels/cuda/k_cuda.h) on the host, for
 * testing code written against the device table on a machine without a GPU.
 *
 * What it is: device memory is host memory (mem_* entries: malloc, memcpy, the bf16 conversions of kb_base.h); the
 * layer, flow, optimizer and glue ops run the kernel bodies of kernels/body/ through kernels/body/kb_host.h, in the
 * CUDA kernels' decomposition (so the arithmetic, bf16 rounding included, is the GPU kernels' arithmetic); GEMM and
 * attention widen their bf16 operands to fp32, run k_cpu_ops (fixed-order, batch-invariant) and round the outputs
 * to their storage, where cuBLASLt and cuDNN would accumulate in fp32 and round once as well (epilogues: the bias
 * in C's dtype, GELU aux in bf16, bias gradients summed in double). It proves code's use of the table (shapes,
 * dtypes, accumulate conventions, order of ops) and the figures of bf16 storage; it proves nothing about CUDA.
 *
 * Users: `make test` (tests/test_wan_dev.c: the Wan DiT on the device table vs the fp32 CPU DiT) links k_emu_ops
 * from libvgrpo; `make gpu-check-emu` builds the same source with -DCK_EMULATE, where the table takes the CUDA
 * backend's name k_cuda_ops (kernels/cuda/check/emu/emulate.c supplies the rest of k_cuda.h) so that the GPU check
 * runs unchanged over it. Single-threaded bodies, OpenMP GEMM/attention: slow, for small shapes. Not exposed to
 * users (no recipe key or option selects it). */
#ifndef KERNELS_CUDA_EMU_K_EMU_H
#define KERNELS_CUDA_EMU_K_EMU_H

#include "kernels/cuda/k_cuda.h"
#include "kernels/cuda/precond/kc_vae.h"

#ifdef CK_EMULATE
#define k_emu_ops k_cuda_ops /* the GPU check over the emulated device: the table stands in for the backend's */
#endif

/* The emulated device ("emulated"). Every entry is set. */
extern const k_dev_ops k_emu_ops;

/* Bytes of emulated device memory (what mem_alloc was asked for, the header and alignment not counted) held now
 * and at most since the process started: the actual allocation that trainer/optim/train_dev.h's estimate is tested
 * against (tests/test_dev_budget.c). Either pointer may be NULL. */
void k_emu_mem_stats(size_t *held, size_t *peak);

/* What crossed between host and emulated device through the mem_upload* / mem_download* entries since the process
 * started (tests: e.g. that the trainer's master weights stay on the device between steps). Not thread-safe. */
typedef struct {
    unsigned long long uploads, upload_bytes, downloads, download_bytes;
} k_emu_traffic;
void k_emu_traffic_get(k_emu_traffic *t);

/* The table's ipc_* entries (kernels/cuda/emu/emu_ipc.c: POSIX shared memory between processes of one host). */
int k_emu_ipc_export(const void *dev, size_t bytes, uint8_t *handle);
int k_emu_ipc_unexport(const uint8_t *handle);
int k_emu_ipc_open(const uint8_t *handle, size_t bytes, const void **dev);
int k_emu_ipc_close(const void *dev);

/* The Wan VAE entries' element and row work (kernels/cuda/emu/emu_vae.c: kernels/body/kb_vae.h on the host): the
 * im2col rows and the softmax of kernels/cuda/precond/kc_vae.h's kc_vae_backend, and the vae_rms_norm and
 * vae_dupup_add entries (kernels/dev_ops.h). */
int k_emu_vae_im2col(kb_bf16 *col, int ldc, int K, kb_in x, kb_in cache, kb_vae_conv_geom g, int f, size_t pix0,
                     size_t rows);
int k_emu_vae_softmax(kb_bf16 *p, const float *s, int S, int ld);
int k_emu_vae_rms_norm(kb_out out, kb_in x, kb_in gamma, int64_t n, int C, int silu);
int k_emu_vae_dupup_add(kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft, int drop);

#endif
