/* core/fs.c — file-system helpers (see core/fs.h). */
#include "core/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

int core_mkdir_p(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return core_error("%.200s...: path too long", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0777) && errno != EEXIST) return core_error("%s: cannot create folder: %s", buf, strerror(errno));
            *p = '/';
        }
    if (mkdir(buf, 0777) && errno != EEXIST) return core_error("%s: cannot create folder: %s", buf, strerror(errno));
    return 0;
}

int core_is_dir(const char *path) {
    struct stat sb;
    return !stat(path, &sb) && S_ISDIR(sb.st_mode);
}

int core_open_nofollow(const char *path, int flags) {
    const int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    const int e = errno;
    struct stat sb;
    if (e == ELOOP && !lstat(path, &sb) && S_ISLNK(sb.st_mode))
        return core_error("%s: is a symbolic link (refused: a run never writes through one)", path);
    return core_error("%s: cannot %s: %s", path, flags & O_CREAT ? "create" : "open", strerror(e));
}

FILE *core_fopen_nofollow(const char *path, const char *mode) {
    int flags = O_WRONLY | O_CREAT;
    if (!strcmp(mode, "w")) flags |= O_TRUNC;
    else if (!strcmp(mode, "wx")) flags |= O_EXCL;
    else if (!strcmp(mode, "a")) flags |= O_APPEND;
    else return core_error("%s: bad mode \"%s\"", path, mode), NULL;
    const int fd = core_open_nofollow(path, flags);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode[0] == 'a' ? "a" : "w");
    if (!f) return close(fd), core_error("%s: %s", path, strerror(errno)), NULL;
    return f;
}

int core_file_mode_apply(const char *file_mode) {
    const char *m = file_mode ? file_mode : "0600";
    if (strcmp(m, "0600") && strcmp(m, "0640") && strcmp(m, "0644"))
        return core_error("logging.file_mode: expected 0600, 0640 or 0644, got \"%s\"", m);
    const mode_t f = (mode_t)strtol(m, NULL, 8), d = f | ((f & 0444) >> 2);
    umask(~d & 0777);
    return 0;
}

int core_check_own_dir(const char *dir, const char *key) {
    struct stat sb;
    const char *k = key ? key : "run folder";
    if (stat(dir, &sb)) return core_error("%s: %s: %s", k, dir, strerror(errno));
    if (sb.st_uid != geteuid())
        return core_error("%s: %s belongs to uid %ld, not to this user (uid %ld): a run writes only into its own "
                          "folders; choose another %s", k, dir, (long)sb.st_uid, (long)geteuid(), k);
    if ((sb.st_mode & (S_IWGRP | S_IWOTH)) && !(sb.st_mode & S_ISVTX))
        return core_error("%s: %s is writable by other users (mode %04o): a link planted there could make this run "
                          "overwrite another file; `chmod go-w %s`, or choose another %s", k, dir,
                          (unsigned)(sb.st_mode & 07777), dir, k);
    return 0;
}

/* 1 if name is "vgrpo-" and 6 characters (mkdtemp's). */
static int sockdir_name(const char *name) { return !strncmp(name, "vgrpo-", 6) && strlen(name) == 12; }

int core_sockdir_clean_stale(const char *base) {
    DIR *d = opendir(base);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    char p[4096], f[4200], buf[32];
    while ((e = readdir(d))) {
        struct stat sb;
        if (!sockdir_name(e->d_name) || snprintf(p, sizeof p, "%s/%s", base, e->d_name) >= (int)sizeof p) continue;
        if (lstat(p, &sb) || !S_ISDIR(sb.st_mode) || sb.st_uid != geteuid()) continue; /* ours only */
        snprintf(f, sizeof f, "%s/pid", p);
        const int fd = open(f, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue; /* no marker: not one of ours, or one being made */
        const ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        char *end;
        const long pid = strtol(buf, &end, 10);
        if (pid <= 0 || (*end && *end != '\n') || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        /* its creator is gone: remove the sockets and the marker (nothing else is ever in it), then the folder */
        DIR *s = opendir(p);
        if (!s) continue;
        struct dirent *x;
        int other = 0;
        while ((x = readdir(s))) {
            if (!strcmp(x->d_name, ".") || !strcmp(x->d_name, "..")) continue;
            snprintf(f, sizeof f, "%s/%s", p, x->d_name);
            if (lstat(f, &sb) || !(S_ISSOCK(sb.st_mode) || (S_ISREG(sb.st_mode) && !strcmp(x->d_name, "pid"))) ||
                unlink(f))
                other = 1;
        }
        closedir(s);
        if (!other && !rmdir(p)) removed++;
    }
    closedir(d);
    return removed;
}

int core_sockdir_make(const char *base, char *out, size_t cap) {
    core_sockdir_clean_stale(base);
    if (snprintf(out, cap, "%s/vgrpo-XXXXXX", base) >= (int)cap) return out[0] = 0, core_error("%s: path too long", base);
    if (!mkdtemp(out)) { /* mode 0700: no other user can reach a socket inside */
        out[0] = 0;
        return core_error("cannot create a folder for the job's sockets under %s: %s", base, strerror(errno));
    }
    char f[4200], pid[32];
    snprintf(f, sizeof f, "%s/pid", out);
    const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    const int fd = open(f, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, pid, (size_t)n) != n) {
        const int e = errno;
        if (fd >= 0) close(fd);
        unlink(f), rmdir(out);
        out[0] = 0;
        return core_error("%s: cannot write: %s", f, strerror(e));
    }
    close(fd);
    return 0;
}
