/* core/fs.h — small file-system helpers shared by the jobs (run directories, checkpoints, eval output). */
#ifndef CORE_FS_H
#define CORE_FS_H

#include <stddef.h>
#include <stdio.h>

/* Creates path and its missing parents (like mkdir -p, mode 0777 before the umask). Returns 0, or -1 with
 * core_error naming the folder that could not be created (or a path longer than 4095 bytes). */
int core_mkdir_p(const char *path);

/* 1 if path is a directory, else 0. */
int core_is_dir(const char *path);

/* Opens a file a run creates or appends to, never through a symlink: open(2) with flags | O_NOFOLLOW | O_CLOEXEC
 * and mode 0666 (the process umask narrows it: core_file_mode_apply). flags as open's (O_WRONLY | O_CREAT | O_TRUNC,
 * | O_EXCL for a new temporary, | O_APPEND for a log). A symlink at path fails with ELOOP: "PATH: is a symbolic
 * link (refused: a run never writes through one)". Returns the descriptor, or -1 with core_error naming path. */
int core_open_nofollow(const char *path, int flags);

/* core_open_nofollow as a stdio stream: mode "w" (create or truncate), "wx" (create; must not exist: O_EXCL) or "a"
 * (append). NULL with core_error naming path. */
FILE *core_fopen_nofollow(const char *path, const char *mode);

/* Parses a recipe's logging.file_mode ("0600", "0640", "0644": the mode of the files a run creates; its folders get
 * the same bits plus x where r) and sets the process umask to match (files are created 0666 & ~umask, folders 0777
 * & ~umask), for this process and the ones it starts. -1 with an error naming the key for any other text. */
int core_file_mode_apply(const char *file_mode);

/* A run's folder must be its own: refuses (-1, core_error naming dir and `key`) a folder owned by another user, or
 * one that another user can write (group or other write permission) unless it is sticky (as /tmp), since a link
 * planted there could make this run overwrite another file. 0 when dir is fine. */
int core_check_own_dir(const char *dir, const char *key);

/* The folders vgrpo keeps its sockets in (base/vgrpo-XXXXXX, mode 0700, with a file "pid" holding the creator's
 * pid): core_sockdir_make creates one into out (cap bytes; out "" on failure) after removing the stale ones
 * (core_sockdir_clean_stale). Returns 0, or -1 with an error naming base. */
int core_sockdir_make(const char *base, char *out, size_t cap);
/* Removes base's vgrpo-?????? folders that this user owns and whose "pid" file names a process that no longer runs
 * (a supervisor killed with SIGKILL leaves its folder): only such folders, holding only sockets and the pid file.
 * Returns the number removed (errors are skipped: a folder that cannot be removed stays). */
int core_sockdir_clean_stale(const char *base);

#endif
