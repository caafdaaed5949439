/* cli/export_pipeline.c — the base pipeline's components for `vgrpo export --pipeline-out` (cli/export_pipeline.h). */
#include "cli/export_pipeline.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return core_error("%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        const int e = errno;
        fclose(in);
        return core_error("%s: cannot create: %s", dst, strerror(e));
    }
    static char buf[1 << 16];
    size_t n;
    int bad = 0;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
    bad |= ferror(in);
    const int e = errno;
    fclose(in);
    if (fclose(out) || bad) return core_error("copying %s to %s failed: %s", src, dst, strerror(e ? e : EIO));
    return 0;
}

/* src's entries into dst (made here); at the top (skip_experts) without transformer/ and transformer_2/. */
static int copy_tree(const char *src, const char *dst, int skip_experts) {
    if (mkdir(dst, 0777) && errno != EEXIST) return core_error("%s: cannot create folder: %s", dst, strerror(errno));
    DIR *d = opendir(src);
    if (!d) return core_error("%s: cannot read folder: %s", src, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        if (skip_experts && (!strcmp(n, "transformer") || !strcmp(n, "transformer_2"))) continue;
        char s[4200], t[4200];
        snprintf(s, sizeof s, "%s/%s", src, n);
        snprintf(t, sizeof t, "%s/%s", dst, n);
        struct stat st;
        if (stat(s, &st)) rc = core_error("%s: %s", s, strerror(errno));
        else if (S_ISDIR(st.st_mode)) rc = copy_tree(s, t, 0);
        else if (S_ISREG(st.st_mode)) rc = copy_file(s, t);
    }
    closedir(d);
    return rc;
}

int export_pipeline_copy(const char *base, const char *dst) {
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/model_index.json", base);
    if (access(idx, R_OK))
        return core_error("--pipeline-out needs a pipeline folder as --base: %s has no model_index.json", base);
    return copy_tree(base, dst, 1);
}

void export_pipeline_partial(const char *dir, char *out, size_t cap) { snprintf(out, cap, "%s.partial", dir); }

void export_pipeline_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char p[4200];
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            struct stat st;
            if (!lstat(p, &st) && S_ISDIR(st.st_mode)) export_pipeline_remove(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}
