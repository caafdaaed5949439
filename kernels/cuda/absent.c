/* kernels/cuda/absent.c — k_cuda_available for builds without the CUDA backend (plain `make`): the only file of
 * kernels/cuda/ such a build compiles, so callers can ask without #ifdefs. `make cuda` leaves it out and links
 * kernels/cuda/device.c's version instead. */
#include <stdio.h>

#include "kernels/kernels.h"

int k_cuda_available(char *why) {
    if (why) snprintf(why, K_WHY_MAX, "built without the CUDA backend (make cuda)");
    return 0;
}
