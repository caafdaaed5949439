/* kernels/cuda/check/emu/emulate.c — an emulated device for the GPU check's own logic: the rest of the k_cuda.h
 * interface around the emulated op table of kernels/cuda/emu/ (k_emu.h: host memory, the kernel bodies through
 * kernels/body/kb_host.h, k_cpu_ops for GEMM and attention on widened operands), which this build names k_cuda_ops
 * (-DCK_EMULATE). Linked with the check's sources instead of the CUDA backend it builds $(BUILD)/gpu_check_emu
 * (`make gpu-check-emu`), which runs the whole check on a machine without a GPU: it proves the check's plumbing
 * (uploads, row sampling, gathers, references, bands, the repeat column, the Wan DiT rows) before GPU time is spent,
 * and times its CPU reference. It proves nothing about CUDA. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/emu/k_emu.h"

int k_cuda_init(char *why) {
    if (why) why[0] = 0;
    return 0;
}
int k_cuda_available(char *why) { return k_cuda_init(why) == 0; }
void k_cuda_shutdown(void) {}
int k_cuda_get_info(k_cuda_info *in) {
    memset(in, 0, sizeof *in);
    snprintf(in->gpu, sizeof in->gpu, "EMULATED device (host memory, kernel bodies, k_cpu_ops)");
    in->cc_major = 9;
    snprintf(in->cublaslt_path, sizeof in->cublaslt_path, "(none: k_cpu_ops.gemm)");
    snprintf(in->cudnn_path, sizeof in->cudnn_path, "(none: k_cpu_ops.attention)");
    in->cudnn_version = 91900;
    return 0;
}
void *k_cuda_stream(void) { return NULL; }

void *k_dev_alloc(size_t bytes) { return k_cuda_ops.mem_alloc(bytes); }
void k_dev_free(void *p) { k_cuda_ops.mem_free(p); }
int k_dev_upload(void *d, const void *s, size_t b) { return k_cuda_ops.mem_upload(d, s, b); }
int k_dev_download(void *d, const void *s, size_t b) { return k_cuda_ops.mem_download(d, s, b); }
int k_dev_upload_bf16(kb_bf16 *d, const float *s, size_t n) { return k_cuda_ops.mem_upload_bf16(d, s, n); }
int k_dev_download_bf16(float *d, const kb_bf16 *s, size_t n) { return k_cuda_ops.mem_download_bf16(d, s, n); }
int k_dev_zero(void *p, size_t b) { return k_cuda_ops.mem_zero(p, b); }
int k_dev_copy2d(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h) {
    return k_cuda_ops.mem_copy2d(d, dp, s, sp, w, h);
}
int k_dev_sync(void) { return k_cuda_ops.mem_sync(); }
int k_dev_mem_info(size_t *free_bytes, size_t *total_bytes) { return k_cuda_ops.mem_info(free_bytes, total_bytes); }

int k_gemm_algo_of(const k_gemm_args *g, k_gemm_algo_info *out) {
    (void)g;
    memset(out, 0, sizeof *out);
    out->algo_id = out->tile_id = -1;
    return 0;
}
int k_attention_engine_of(int backward, int B, int Sq, int Skv, int H, int Dh, int64_t *engine_id, size_t *workspace) {
    if (engine_id) *engine_id = -1;
    if (workspace) *workspace = 0;
    return 0;
}
void k_attention_allow_nondeterministic(int allow) { (void)allow; }
