/* core/fs.h — small file-system helpers shared by the jobs (run directories, checkpoints, eval output). */
#ifndef CORE_FS_H
#define CORE_FS_H

/* Creates path and its missing parents (like mkdir -p, mode 0777 before the umask). Returns 0, or -1 with
 * core_error naming the folder that could not be created (or a path longer than 4095 bytes). */
int core_mkdir_p(const char *path);

/* 1 if path is a directory, else 0. */
int core_is_dir(const char *path);

#endif
