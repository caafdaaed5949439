/* trainer/checkpoint/checkpoint_files.h — names and file helpers shared by trainer/checkpoint/checkpoint.c (one checkpoint) and
 * trainer/checkpoint/checkpoint_dir.c (the run's checkpoint folders). Not a public API. */
#ifndef TRAINER_CHECKPOINT_FILES_H
#define TRAINER_CHECKPOINT_FILES_H

#include <stdint.h>

#define STATE_FILE "trainer_state.json"
#define TRASH_PREFIX ".trash-checkpoint-"
#define BEST_LINK "best"
#define BEST_TMP ".best.tmp"

/* 1 if path is a regular file. */
int ckpt_is_file(const char *path);
/* rm -rf path (absent: fine); -1 with an error naming the path. */
int ckpt_rm_tree(const char *path);
/* fsync one file or folder; every file and folder under path (folders after their contents). -1 naming the path. */
int ckpt_fsync_path(const char *p);
int ckpt_sync_tree(const char *path);
/* 1 if name is "checkpoint-<1..18 digits>", with the step in *step; else 0. */
int ckpt_name_step(const char *name, int64_t *step);

#endif
