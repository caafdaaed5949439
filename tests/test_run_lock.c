/* tests/test_run_lock.c — core/run_lock.h: a live holder refuses a second run and is named; a dead holder's lock
 * is taken over and said so; release and reacquire; a folder that cannot be created is named. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/run_lock.h"
#include "tests/test.h"


TEST(run_lock_live_holder_refuses_dead_one_is_taken_over) {
    char dir[600], lockpath[700], want[900], note[512], buf[1024];
    snprintf(dir, sizeof dir, "%s/runs/x", test_tmpdir());
    snprintf(lockpath, sizeof lockpath, "%s/.vgrpo.lock", dir);
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) { /* holds the lock until killed */
        core_run_lock lk;
        char ok = core_run_lock_acquire(&lk, dir, "logging.run_dir", NULL, 0) == 0 ? 'y' : 'n';
        if (write(p[1], &ok, 1) != 1) _exit(1);
        for (;;) pause();
    }
    close(p[1]);
    char ok = 0;
    CHECK(read(p[0], &ok, 1) == 1 && ok == 'y');
    close(p[0]);

    core_run_lock lk;
    CHECK(core_run_lock_acquire(&lk, dir, "logging.run_dir", note, sizeof note) == -1);
    CHECK(lk.fd == -1);
    snprintf(want, sizeof want, "logging.run_dir: %s is in use by another vgrpo run (pid %d, started 20", dir, (int)child);
    CHECK_MSG(strstr(core_last_error(), want) != NULL, "got: %s", core_last_error());
    CHECK(strstr(core_last_error(), "); wait for it or choose another logging.run_dir") != NULL);

    kill(child, SIGKILL);
    REQUIRE(waitpid(child, NULL, 0) == child);
    REQUIRE_OK(core_run_lock_acquire(&lk, dir, "logging.run_dir", note, sizeof note));
    snprintf(want, sizeof want, "took over the lock of pid %d (started 20", (int)child);
    CHECK_MSG(strstr(note, want) != NULL, "note: %s", note);
    CHECK_MSG(strstr(note, "), which is no longer running") != NULL, "note: %s", note);
    CHECK(strstr(note, lockpath) == note);
    REQUIRE(test_slurp(lockpath, buf, sizeof buf) > 0);
    snprintf(want, sizeof want, "pid: %d\nstarted: 20", (int)getpid());
    CHECK_MSG(strstr(buf, want) == buf, "lock file: %s", buf);
    /* Not inherited across exec by spawned workers. */
    CHECK(fcntl(lk.fd, F_GETFD) & FD_CLOEXEC);

    /* A second lock in the same process is refused too, and says whose it is. */
    core_run_lock again;
    CHECK(core_run_lock_acquire(&again, dir, NULL, NULL, 0) == -1);
    snprintf(want, sizeof want, "%s is in use by another vgrpo run (pid %d (this process), started ", dir, (int)getpid());
    CHECK_MSG(strstr(core_last_error(), want) == core_last_error(), "got: %s", core_last_error());
    CHECK(strstr(core_last_error(), "choose another run folder") != NULL);

    /* Release empties the file; reacquire is clean (no takeover note); release twice is harmless. */
    core_run_lock_release(&lk);
    CHECK(lk.fd == -1);
    CHECK(test_slurp(lockpath, buf, sizeof buf) == 0);
    REQUIRE_OK(core_run_lock_acquire(&lk, dir, "logging.run_dir", note, sizeof note));
    CHECK_MSG(note[0] == '\0', "note: %s", note);
    core_run_lock_release(&lk);
    core_run_lock_release(&lk);
}

/* A lock file naming a pid that is alive but no longer holds the lock (pid reuse): taken over, said differently. */
TEST(run_lock_stale_file_of_a_reused_pid) {
    char dir[600], path[700], note[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir());
    snprintf(path, sizeof path, "%s/.vgrpo.lock", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "pid: 1\nstarted: 2026-01-02 03:04:05\n");
    fclose(f);
    core_run_lock lk;
    REQUIRE_OK(core_run_lock_acquire(&lk, dir, NULL, note, sizeof note));
    CHECK_MSG(strstr(note, "took over the lock of pid 1 (started 2026-01-02 03:04:05), which no longer holds it (that "
                           "pid now belongs to another process)") != NULL, "note: %s", note);
    core_run_lock_release(&lk);
}

TEST(run_lock_folder_cannot_be_created) {
    char file[600], dir[700];
    snprintf(file, sizeof file, "%s/plain-file", test_tmpdir());
    FILE *f = fopen(file, "w");
    REQUIRE(f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/run", file);
    core_run_lock lk;
    CHECK(core_run_lock_acquire(&lk, dir, "logging.run_dir", NULL, 0) == -1);
    CHECK(lk.fd == -1);
    CHECK_MSG(strstr(core_last_error(), "logging.run_dir: ") == core_last_error(), "got: %s", core_last_error());
    CHECK_MSG(strstr(core_last_error(), dir) != NULL, "got: %s", core_last_error());
    CHECK(strstr(core_last_error(), "Not a directory") != NULL);
    core_run_lock_release(&lk); /* never held: harmless */
}
