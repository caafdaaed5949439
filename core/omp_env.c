/* core/omp_env.c — see omp_env.h. */
#include "core/omp_env.h"

#include <stdlib.h>
#include <unistd.h>

void core_omp_env_defaults(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* execv failed (no /proc): continue with the runtime's default policy. */
}
