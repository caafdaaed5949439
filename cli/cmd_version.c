/* cli/cmd_version.c — `vgrpo --version`: the version, the git commit the binary was built from and how it was built.
 *
 *   vgrpo 0.1.0
 *   commit 86541d523df3 (with uncommitted changes)
 *   build: CUDA backend off (plain `make`; `make cuda` builds it), gcc 12.2.0, OPT -O3 -march=native
 *
 * The Makefile passes VGRPO_GIT_COMMIT (`git rev-parse --short=12 HEAD`, "-dirty" appended when tracked files differ
 * from it; empty outside a git checkout) and VGRPO_BUILD_OPT (its OPT) to this file alone, and rebuilds it when
 * either changes ($(BUILD)/.version-stamp), so a new commit recompiles one file. VGRPO_CUDA is set by `make cuda`. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

/* The release of this source tree; the commit line says which state of it. */
#define VGRPO_VERSION "0.1.0"

#ifndef VGRPO_GIT_COMMIT
#define VGRPO_GIT_COMMIT ""
#endif
#ifndef VGRPO_BUILD_OPT
#define VGRPO_BUILD_OPT "?"
#endif

int cmd_version(int argc, char **argv) {
    (void)argc, (void)argv;
    const char *c = VGRPO_GIT_COMMIT;
    const size_t n = strlen(c);
    const int dirty = n > 6 && !strcmp(c + n - 6, "-dirty");
    printf("vgrpo %s\n", VGRPO_VERSION);
    if (n) printf("commit %.*s%s\n", (int)(dirty ? n - 6 : n), c, dirty ? " (with uncommitted changes)" : "");
    else printf("commit unknown (built outside a git checkout)\n");
#if defined(VGRPO_CUDA) && VGRPO_CUDA
    const char *cuda = "CUDA backend on (`make cuda`; model.device: cuda needs a GPU at run time)";
#else
    const char *cuda = "CUDA backend off (plain `make`; `make cuda` builds it)";
#endif
#if defined(__clang__)
    const char *cc = "clang ";
#elif defined(__GNUC__)
    const char *cc = "gcc ";
#else
    const char *cc = "";
#endif
    printf("build: %s, %s%s, OPT %s\n", cuda, cc, __VERSION__, VGRPO_BUILD_OPT);
    return 0;
}
