/* core/run_lock.h — one vgrpo run per run folder: an exclusive flock on DIR/.vgrpo.lock.
 *
 *   core_run_lock lk;  char note[256];
 *   if (core_run_lock_acquire(&lk, r->run_dir, "logging.run_dir", note, sizeof note)) return -1;
 *   if (note[0]) core_log_warn("%s", note);
 *   ...the run...
 *   core_run_lock_release(&lk);
 *
 * The lock file holds the owner's pid, start time and host, so a refused run can say who has the folder. The
 * kernel drops an flock when its holder dies, however it dies (kill -9, OOM), so a stale file never blocks: the next
 * run takes it over and says so in `note`. Release empties the file but leaves it in place (deleting it would let
 * two runs lock two different files of the same name).
 *
 * Who holds it: the one process that owns the folder (`vgrpo run`'s controller; rank 0 if a run is started under
 * mpirun by hand), never every rank: a second process that calls acquire on the same folder is refused, even inside
 * the same program. The descriptor is O_CLOEXEC, so workers started with fork+exec (cli/supervisor.c, mpirun) do
 * not inherit it. A child made by fork() without exec shares the lock (flock belongs to the open file, not the
 * process) and keeps the folder locked until it exits too. Local file systems only (flock on NFS is emulated with
 * POSIX locks and may not exclude across hosts). */
#ifndef CORE_RUN_LOCK_H
#define CORE_RUN_LOCK_H

#include <stddef.h>

typedef struct {
    int fd;          /* the locked file, or -1 when not held */
    char path[4200]; /* DIR/.vgrpo.lock */
} core_run_lock;

/* Creates dir (and its parents) if missing, refuses it when it is not this user's own (core_check_own_dir: owned by
 * another user, or writable by others and not sticky), then takes the lock on dir/.vgrpo.lock (opened with
 * O_NOFOLLOW: a symlink planted there is refused) without waiting and writes
 * this process's pid, start time and host into it. key names the setting that chose dir ("logging.run_dir"; NULL
 * says "the run folder"), for the message. note (note_n bytes; may be NULL when note_n is 0) gets "" or one
 * sentence for the log when the lock was taken over from a run that died ("took over the lock of pid N (started
 * ...), which is no longer running").
 * Returns 0, or -1 with core_error:
 *   "logging.run_dir: runs/x is in use by another vgrpo run (pid 1234, started 2026-12-01 19:55:36); wait for it
 *    or choose another logging.run_dir", or a folder or lock file that cannot be created (named, with the reason).
 * On failure lk->fd is -1 and nothing is left open. */
int core_run_lock_acquire(core_run_lock *lk, const char *dir, const char *key, char *note, size_t note_n);

/* Lets the processes this one starts from now on (fork + exec) share the lock: the descriptor stays open across exec,
 * so the folder stays locked until the last of them exits (a supervisor killed with SIGKILL leaves its trainer
 * finishing a step: a new run must not take the folder meanwhile). mpirun closes inherited descriptors, so trainer
 * ranks started through it do not hold it (mpirun does). 0, or -1 with an error. */
int core_run_lock_share(core_run_lock *lk);

/* Empties the lock file and releases the lock. Safe on a lock not held (lk->fd == -1) and to call twice. */
void core_run_lock_release(core_run_lock *lk);

/* Every folder a run writes: logging.run_dir, and checkpoint.dir when it is another folder (a second run whose
 * checkpoint.dir is a live run's folder must not remove that run's checkpoints). Initialise with
 * CORE_RUN_LOCKS_INIT. */
typedef struct {
    core_run_lock run, ckpt; /* ckpt.fd -1: no checkpoint.dir, or the same folder as run_dir */
} core_run_locks;
#define CORE_RUN_LOCKS_INIT {.run = {.fd = -1}, .ckpt = {.fd = -1}}

/* core_run_lock_acquire on run_dir ("logging.run_dir"), then on ckpt_dir ("checkpoint.dir"; NULL: none) unless it
 * resolves to the same folder. note as core_run_lock_acquire's (the two notes joined by "; "). 0, or -1 with the
 * error of the folder refused and nothing held. */
int core_run_locks_acquire(core_run_locks *L, const char *run_dir, const char *ckpt_dir, char *note, size_t note_n);
/* core_run_lock_share on each lock held. */
int core_run_locks_share(core_run_locks *L);
/* Releases both (safe when not held, and twice). */
void core_run_locks_release(core_run_locks *L);

#endif
