/* tests/test_version.c — `vgrpo --version`: the version line, the git commit the binary was built from (one this
 * repository holds, when the tests run in a git checkout) and the build line, whose CUDA flag is the one its build
 * folder's stamp records (`make cuda`: on; plain `make`: off). */
#include <libgen.h>
#include <string.h>

#include "tests/test.h"

TEST(version_names_commit_and_build) {
    char out[4096], line2[256] = "", bin[1024], stamp[1400], sbuf[512];
    int rc = test_run(out, sizeof out, "%s --version", test_vgrpo_bin());
    CHECK_MSG(rc == 0, "status %d: %s", rc, out);
    REQUIRE(rc == 0);
    CHECK_MSG(!strncmp(out, "vgrpo 0.1.0\ncommit ", 19), "got: %s", out);
    const char *l2 = strchr(out, '\n');
    REQUIRE(l2);
    sscanf(l2 + 1, "commit %255s", line2);
    if (!strcmp(line2, "unknown")) {
        CHECK_MSG(strstr(out, "commit unknown (built outside a git checkout)\n"), "got: %s", out);
    } else {
        CHECK_MSG(strlen(line2) == 12 && strspn(line2, "0123456789abcdef") == 12, "commit \"%s\": %s", line2, out);
        if (test_run(NULL, 0, "git rev-parse --git-dir >/dev/null 2>&1") == 0)
            CHECK_MSG(test_run(NULL, 0, "git cat-file -e '%s^{commit}'", line2) == 0,
                      "commit %s is not in this repository", line2);
    }
    /* the build line's CUDA flag, against what the build folder's stamp (Makefile: VERSION_STAMP) records */
    snprintf(bin, sizeof bin, "%s", test_vgrpo_bin());
    snprintf(stamp, sizeof stamp, "%s/.version-stamp", dirname(bin));
    if (test_slurp(stamp, sbuf, sizeof sbuf) > 0) {
        const int cuda = strstr(sbuf, "cuda=1") != NULL;
        CHECK_MSG(strstr(out, cuda ? "\nbuild: CUDA backend on" : "\nbuild: CUDA backend off"), "stamp %s, got: %s",
                  sbuf, out);
        CHECK_MSG(strstr(out, ", OPT -") != NULL, "got: %s", out);
    } else {
        CHECK_MSG(strstr(out, "\nbuild: CUDA backend o"), "got: %s", out);
    }
    /* the command list points at it */
    rc = test_run(out, sizeof out, "%s --help", test_vgrpo_bin());
    CHECK_MSG(rc == 0 && strstr(out, "`vgrpo --version`"), "status %d: %s", rc, out);
}
