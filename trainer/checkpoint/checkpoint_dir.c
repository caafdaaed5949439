/* trainer/checkpoint/checkpoint_dir.c — the checkpoint folders of a run (see trainer/checkpoint/checkpoint.h): listing, cleaning leftovers,
 * the rolling limit, the `best` link, and the file helpers checkpoint.c shares (trainer/checkpoint/checkpoint_files.h). Split
 * from checkpoint.c, which writes, reads and resolves one checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_files.h"

/* ------------------------------------------------------------------------------------------------------------
 * Files and folders */

int ckpt_is_file(const char *path) {
    struct stat sb;
    return !stat(path, &sb) && S_ISREG(sb.st_mode);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p) ? -1 : 0;
}

/* rm -rf path (absent: fine). */
int ckpt_rm_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb)) return errno == ENOENT ? 0 : core_error("%s: %s", path, strerror(errno));
    if (nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS)) return core_error("%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

int ckpt_fsync_path(const char *p) {
    int fd = open(p, O_RDONLY);
    if (fd < 0) return core_error("%s: cannot open to fsync: %s", p, strerror(errno));
    int rc = fsync(fd) ? core_error("%s: fsync failed: %s", p, strerror(errno)) : 0;
    close(fd);
    return rc;
}

static int sync_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)ftw;
    if (flag == FTW_F || flag == FTW_DP || flag == FTW_D) return (S_ISREG(sb->st_mode) || S_ISDIR(sb->st_mode)) && ckpt_fsync_path(p) ? -1 : 0;
    return 0;
}

/* fsync every file and folder under path (folders after their contents). */
int ckpt_sync_tree(const char *path) {
    core_error_clear();
    int rc = nftw(path, sync_cb, 16, FTW_DEPTH | FTW_PHYS);
    return rc ? (*core_last_error() ? -1 : core_error("%s: fsync walk failed: %s", path, strerror(errno))) : 0;
}

/* 1 if name is "checkpoint-<1..18 digits>", with the step in *step. */
int ckpt_name_step(const char *name, int64_t *step) {
    if (strncmp(name, "checkpoint-", 11)) return 0;
    const char *d = name + 11;
    size_t l = strlen(d);
    if (l < 1 || l > 18) return 0;
    for (size_t i = 0; i < l; i++)
        if (d[i] < '0' || d[i] > '9') return 0;
    *step = strtoll(d, NULL, 10);
    return 1;
}

/* 1 if name is a leftover: ".checkpoint-*.tmp" (a save or a replacement cut short) or ".trash-checkpoint-*" (a
 * removal cut short). */
static int leftover_name(const char *name) {
    size_t l = strlen(name);
    return (!strncmp(name, ".checkpoint-", 12) && l > 16 && !strcmp(name + l - 4, ".tmp")) ||
           !strncmp(name, TRASH_PREFIX, strlen(TRASH_PREFIX)) || !strcmp(name, BEST_TMP);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int trainer_ckpt_list(const char *dir, int64_t **steps) {
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : core_error("%s: cannot list: %s", dir, strerror(errno));
    int n = 0, cap = 0;
    struct dirent *e;
    char p[TRAINER_CKPT_PATH_MAX];
    while ((e = readdir(d))) {
        int64_t s;
        if (!ckpt_name_step(e->d_name, &s)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!core_is_dir(p)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *t = realloc(*steps, sizeof(int64_t) * (size_t)cap);
            if (!t) return closedir(d), free(*steps), *steps = NULL, core_error("out of memory");
            *steps = t;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n) qsort(*steps, (size_t)n, sizeof(int64_t), cmp_i64);
    return n;
}

int trainer_ckpt_clean(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : core_error("%s: cannot list: %s", dir, strerror(errno));
    int n = 0, rc = 0;
    struct dirent *e;
    char p[TRAINER_CKPT_PATH_MAX];
    while ((e = readdir(d)) && !rc)
        if (leftover_name(e->d_name)) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            rc = ckpt_rm_tree(p);
            n++;
        }
    closedir(d);
    return rc ? -1 : n;
}

/* Removes dir/name (a complete checkpoint) so that no folder named checkpoint-N is ever partial: renamed first to
 * a fresh .trash-checkpoint-N-XXXXXX (rename onto an empty folder is atomic), the parent fsync'd, then deleted. A
 * deletion cut short leaves only the trash folder, which the next save or resume removes (trainer_ckpt_clean). */
static int remove_checkpoint(const char *dir, const char *name) {
    char p[TRAINER_CKPT_PATH_MAX], trash[TRAINER_CKPT_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (snprintf(trash, sizeof trash, "%s/" TRASH_PREFIX "%s-XXXXXX", dir, name + 11) >= (int)sizeof trash)
        return core_error("%s: path too long", p);
    if (!mkdtemp(trash)) return core_error("%s: cannot create a folder to remove %s into: %s", trash, p, strerror(errno));
    if (rename(p, trash)) {
        int e = errno;
        rmdir(trash);
        return core_error("%s: cannot move it aside to remove it: %s", p, strerror(e));
    }
    if (ckpt_fsync_path(dir)) return -1;
    if (ckpt_rm_tree(trash)) /* out of sight already; the next save or resume retries */
        core_log_warn("%s (removing %s; the next save retries)", core_last_error(), name);
    return 0;
}

int trainer_ckpt_prune(const char *dir, int keep, int64_t spare) {
    if (keep < 1) return core_error("checkpoint.total_limit: must keep at least 1, got %d", keep);
    if (trainer_ckpt_clean(dir) < 0) return -1;
    int64_t best = -1;
    if (trainer_ckpt_get_best(dir, &best) < 0) return -1;
    int64_t *steps;
    int n = trainer_ckpt_list(dir, &steps), removed = 0;
    if (n < 0) return -1;
    for (int i = 0; i < n - keep; i++) /* best's target older than the keep newest: kept beside them */
        if (steps[i] == best) {
            memmove(steps + i, steps + i + 1, sizeof(int64_t) * (size_t)(n - i - 1));
            n--;
            break;
        }
    char name[64];
    for (int i = 0; i < n && n - removed > keep; i++) {
        if (steps[i] == spare || steps[i] == best) continue;
        snprintf(name, sizeof name, "checkpoint-%" PRId64, steps[i]);
        if (remove_checkpoint(dir, name)) return free(steps), -1;
        removed++;
    }
    free(steps);
    return removed;
}

int trainer_ckpt_remove_all(const char *dir, char *names, size_t cap) {
    if (names && cap) names[0] = 0;
    if (trainer_ckpt_clean(dir) < 0 || trainer_ckpt_clear_best(dir)) return -1;
    int64_t *steps;
    const int n = trainer_ckpt_list(dir, &steps);
    if (n < 0) return -1;
    char name[64];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "checkpoint-%" PRId64, steps[i]);
        if (remove_checkpoint(dir, name)) return free(steps), -1;
        if (names && cap > strlen(names) + 1)
            snprintf(names + strlen(names), cap - strlen(names), "%s%s", i ? ", " : "", name);
    }
    free(steps);
    return n;
}

int trainer_ckpt_get_best(const char *dir, int64_t *step) {
    char p[TRAINER_CKPT_PATH_MAX], t[256];
    snprintf(p, sizeof p, "%s/" BEST_LINK, dir);
    const ssize_t l = readlink(p, t, sizeof t - 1);
    if (l < 0) return errno == ENOENT || errno == EINVAL ? 0 : core_error("%s: cannot read the link: %s", p, strerror(errno));
    t[l] = 0;
    return ckpt_name_step(t, step) ? 1 : 0;
}

int trainer_ckpt_clear_best(const char *dir) {
    char p[TRAINER_CKPT_PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/" BEST_LINK, dir);
    if (lstat(p, &sb)) return errno == ENOENT ? 0 : core_error("%s: %s", p, strerror(errno));
    if (!S_ISLNK(sb.st_mode)) return core_error("%s: not a symlink (vgrpo keeps a link to the best checkpoint there)", p);
    if (unlink(p)) return core_error("%s: cannot remove: %s", p, strerror(errno));
    return 0;
}

int trainer_ckpt_set_best(const char *dir, int64_t step) {
    char p[TRAINER_CKPT_PATH_MAX], tmp[TRAINER_CKPT_PATH_MAX], target[64], ck[TRAINER_CKPT_PATH_MAX + 64];
    struct stat sb;
    snprintf(target, sizeof target, "checkpoint-%" PRId64, step);
    snprintf(p, sizeof p, "%s/" BEST_LINK, dir);
    snprintf(tmp, sizeof tmp, "%s/" BEST_TMP, dir);
    snprintf(ck, sizeof ck, "%s/%s", dir, target);
    if (!core_is_dir(ck)) return core_error("%s: no such checkpoint for %s", ck, p);
    if (!lstat(p, &sb) && !S_ISLNK(sb.st_mode))
        return core_error("%s: not a symlink (vgrpo keeps a link to the best checkpoint there): move it away", p);
    if (unlink(tmp) && errno != ENOENT) return core_error("%s: cannot remove: %s", tmp, strerror(errno));
    if (symlink(target, tmp)) return core_error("%s: cannot create a link: %s", tmp, strerror(errno));
    if (rename(tmp, p)) {
        const int e = errno;
        unlink(tmp);
        return core_error("%s: cannot replace the link: %s", p, strerror(e));
    }
    return ckpt_fsync_path(dir);
}
