/* cli/cmd_bench.c — `vgrpo bench kernels`: placeholder until the kernel benchmark lands. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_bench(int argc, char **argv) {
    fprintf(stderr, "vgrpo bench: not built yet\n");
    return 1;
}
