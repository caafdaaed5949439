/* kernels/cuda/absent.c — k_cuda_available and k_cuda_device for builds without the CUDA backend (plain `make`):
 * the only file of kernels/cuda/ such a build compiles, so callers can ask without #ifdefs. `make cuda` leaves it out
 * and links kernels/cuda/init.c's and ops.c's versions instead. */
#include <stdio.h>

#include "core/error.h"
#include "kernels/cuda/k_cuda.h"
#include "kernels/kernels.h"

int k_cuda_available(char *why) {
    if (why) snprintf(why, K_WHY_MAX, "built without the CUDA backend (make cuda)");
    return 0;
}

const struct k_dev_ops *k_cuda_device(char *why) {
    k_cuda_available(why);
    return NULL;
}

int k_gemm_plan_selftest(FILE *out) {
    (void)out;
    return core_error("built without the CUDA backend (make cuda)");
}

int k_gemm_bgrad_compare(FILE *out, int reps) {
    (void)out, (void)reps;
    return core_error("built without the CUDA backend (make cuda)");
}

/* No stream without the backend: callers that pass the kernels' stream on (sp/comm_nccl.h's sp_nccl_opts) get NULL,
 * which is what the emulated device takes. */
void *k_cuda_stream(void) { return NULL; }
