/* trainer/net/source_remote.h — the remote rollout source (core/rollout_source.h) over the controller and its rollout
 * workers (trainer/net/controller.h): colocated mode and `vgrpo parity`. */
#ifndef TRAINER_SOURCE_REMOTE_H
#define TRAINER_SOURCE_REMOTE_H

#include "core/rollout_source.h"

/* The remote source over a connected controller whose workers said hello (trainer/net/controller.h: ctl_wait_workers
 * done). chunk: samples per request (rollout.batch_size); timeout_s: seconds one chunk or weight sync may take.
 * model_path names the folder both sides load, for the start-up hash error. The returned source borrows ctl; free it
 * with trainer_source_remote_free. NULL on out of memory. */
struct ctl_server;
core_rollout_source *trainer_source_remote(struct ctl_server *ctl, int chunk, double timeout_s, const char *model_path);
void trainer_source_remote_free(core_rollout_source *s);

#endif
