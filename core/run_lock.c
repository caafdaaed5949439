/* core/run_lock.c — one run per run folder, by flock(2) on DIR/.vgrpo.lock; see run_lock.h. */
#include "core/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"

/* What a lock file says about its owner. */
typedef struct {
    long pid; /* 0: unknown (empty or unreadable file) */
    char started[64];
    char host[256];
} holder;

/* Parses the "pid: / started: / host:" lines at the start of the file. */
static void read_holder(int fd, holder *h) {
    char buf[1024];
    memset(h, 0, sizeof *h);
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return;
    buf[n] = '\0';
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "pid: ", 5)) sscanf(line + 5, "%ld", &h->pid);
        else if (!strncmp(line, "started: ", 9)) snprintf(h->started, sizeof h->started, "%s", line + 9);
        else if (!strncmp(line, "host: ", 6)) snprintf(h->host, sizeof h->host, "%s", line + 6);
    }
}

static void this_host(char *host, size_t n) {
    if (gethostname(host, n) != 0) snprintf(host, n, "?");
    host[n - 1] = '\0';
}

/* " on host H" when the holder ran on another machine (a shared file system), else "". */
static const char *host_clause(const holder *h, char *buf, size_t n) {
    char mine[256];
    this_host(mine, sizeof mine);
    if (!h->host[0] || !strcmp(h->host, mine)) return "";
    snprintf(buf, n, " on host %s", h->host);
    return buf;
}

int core_run_lock_acquire(core_run_lock *lk, const char *dir, const char *key, char *note, size_t note_n) {
    lk->fd = -1;
    lk->path[0] = '\0';
    if (note && note_n) note[0] = '\0';
    const char *k = key ? key : "", *sep = key ? ": " : "", *choose = key ? key : "run folder";
    if (core_mkdir_p(dir)) return core_error_push("%s%s", k, sep);
    if (core_check_own_dir(dir, key ? key : "the run folder")) return -1;
    if (snprintf(lk->path, sizeof lk->path, "%s/.vgrpo.lock", dir) >= (int)sizeof lk->path)
        return core_error("%s%s%.200s...: path too long", k, sep, dir);
    int fd = core_open_nofollow(lk->path, O_RDWR | O_CREAT); /* a planted link is refused, never followed */
    if (fd < 0) return core_error_push("%s%s", k, sep);
    int rc;
    while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
        int e = errno;
        if (e != EWOULDBLOCK) {
            close(fd);
            return core_error("%s%s%s: cannot lock: %s", k, sep, lk->path, strerror(e));
        }
        /* The holder writes its pid just after it gets the lock: give it a moment before saying "unknown". */
        holder h;
        read_holder(fd, &h);
        for (int i = 0; i < 20 && !h.pid; i++) {
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
            read_holder(fd, &h);
        }
        close(fd);
        char hb[300], who[400];
        if (h.pid)
            snprintf(who, sizeof who, "pid %ld%s%s, started %s", h.pid, host_clause(&h, hb, sizeof hb),
                     h.pid == (long)getpid() ? " (this process)" : "", h.started[0] ? h.started : "at an unknown time");
        else
            snprintf(who, sizeof who, "pid unknown: %s does not say", lk->path);
        return core_error("%s%s%s is in use by another vgrpo run (%s); wait for it or choose another %s", k, sep, dir,
                          who, choose);
    }

    /* Ours. A pid still in the file belongs to a run that died holding the lock (a clean release empties it). */
    holder old;
    read_holder(fd, &old);
    if (old.pid && note && note_n) {
        char hb[300];
        const char *on = host_clause(&old, hb, sizeof hb);
        const int alive = !*on && (kill((pid_t)old.pid, 0) == 0 || errno == EPERM);
        snprintf(note, note_n, "%s: took over the lock of pid %ld%s (started %s), which %s", lk->path, old.pid, on,
                 old.started[0] ? old.started : "at an unknown time",
                 *on ? "no longer holds it"
                 : alive ? "no longer holds it (that pid now belongs to another process)"
                         : "is no longer running");
    }

    char host[256], started[64], text[512];
    this_host(host, sizeof host);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", &tm);
    int n = snprintf(text, sizeof text, "pid: %ld\nstarted: %s\nhost: %s\n", (long)getpid(), started, host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
        int e = errno;
        close(fd); /* releases the lock */
        return core_error("%s%s%s: cannot write: %s", k, sep, lk->path, strerror(e));
    }
    lk->fd = fd;
    return 0;
}

void core_run_lock_release(core_run_lock *lk) {
    if (!lk || lk->fd < 0) return;
    /* Emptied while still held, so no one reads a pid that has let go; LOCK_UN releases it even if a forked child
     * still shares the descriptor. */
    if (ftruncate(lk->fd, 0) != 0) {
        /* the next run would report a takeover of this pid: harmless */
    }
    flock(lk->fd, LOCK_UN);
    close(lk->fd);
    lk->fd = -1;
}

int core_run_lock_share(core_run_lock *lk) {
    if (lk->fd < 0) return 0;
    const int fl = fcntl(lk->fd, F_GETFD);
    if (fl < 0 || fcntl(lk->fd, F_SETFD, fl & ~FD_CLOEXEC))
        return core_error("%s: cannot share the lock with the run's processes: %s", lk->path, strerror(errno));
    return 0;
}

int core_run_locks_acquire(core_run_locks *L, const char *run_dir, const char *ckpt_dir, char *note, size_t note_n) {
    L->run.fd = L->ckpt.fd = -1;
    L->ckpt.path[0] = '\0';
    if (note && note_n) note[0] = '\0';
    if (core_run_lock_acquire(&L->run, run_dir, "logging.run_dir", note, note_n)) return -1;
    if (!ckpt_dir) return 0;
    char a[PATH_MAX], b[PATH_MAX];
    if (core_mkdir_p(ckpt_dir)) return core_run_lock_release(&L->run), core_error_push("checkpoint.dir: ");
    if (realpath(run_dir, a) && realpath(ckpt_dir, b) && !strcmp(a, b)) return 0; /* the same folder */
    char more[512] = "";
    if (core_run_lock_acquire(&L->ckpt, ckpt_dir, "checkpoint.dir", more, sizeof more))
        return core_run_lock_release(&L->run), -1;
    if (more[0] && note && note_n) {
        const size_t used = strlen(note);
        snprintf(note + used, note_n - used, "%s%s", used ? "; " : "", more);
    }
    return 0;
}

int core_run_locks_share(core_run_locks *L) { return core_run_lock_share(&L->run) || core_run_lock_share(&L->ckpt); }

void core_run_locks_release(core_run_locks *L) {
    core_run_lock_release(&L->ckpt);
    core_run_lock_release(&L->run);
}
