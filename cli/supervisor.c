/* cli/supervisor.c — child processes of a job (see cli/supervisor.h). */
#include "cli/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

const char *sup_self_exe(void) {
    static char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return core_error("cannot read /proc/self/exe: %s", strerror(errno)), NULL;
    path[n] = 0;
    return path;
}

int sup_spawn(sup_procs *s, const char *name, char *const *argv, int threads, const char *log_path) {
    return sup_spawn_fd(s, name, argv, threads, log_path, -1, 0);
}

int sup_log_header(char *buf, size_t cap) {
    const time_t now = time(NULL);
    struct tm tm;
    char t[32] = "?";
    if (localtime_r(&now, &tm)) strftime(t, sizeof t, "%Y-%m-%d %H:%M:%S", &tm);
    const int k = snprintf(buf, cap, "--- started %s by pid %d ---\n", t, (int)getpid());
    return k < 0 ? 0 : (size_t)k >= cap ? (int)cap - 1 : k;
}

/* Forks and execs process i of s (its argv, threads, descriptor, log: appended to, after a line saying it started
 * or was restarted). */
static int start(sup_procs *s, int i, int restart) {
    const char *name = s->p[i].name, *log_path = s->p[i].log[0] ? s->p[i].log : NULL;
    char *const *argv = s->p[i].argv;
    const int threads = s->p[i].threads, pass_fd = s->p[i].pass_fd, as_stdin = s->p[i].as_stdin;
    const pid_t parent = getpid();
    /* the log's first line, made before the fork (the child only writes it) */
    char note[120];
    int note_len = restart ? snprintf(note, sizeof note, "--- restarted by the supervisor (restart %d) ---\n", restart)
                           : sup_log_header(note, sizeof note);
    if (note_len < 0 || (size_t)note_len >= sizeof note) note_len = 0;
    fflush(stdout);
    fflush(stderr);
    /* SIGINT and SIGTERM are held across the fork: until execv the child runs the supervisor's handlers, and a stop
     * the supervisor forwards at once (a Ctrl-C while the job starts) was eaten by the child's copy of them, so the
     * trainer never saw it. The child gives them the dispositions execv would before it lets them through. */
    sigset_t stops, old_mask;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigprocmask(SIG_BLOCK, &stops, &old_mask);
    pid_t pid = fork();
    if (pid != 0) sigprocmask(SIG_SETMASK, &old_mask, NULL);
    if (pid < 0) return core_error("%s: fork failed: %s", name, strerror(errno));
    if (pid == 0) {
        const int held[2] = {SIGINT, SIGTERM};
        for (int k = 0; k < 2; k++) { /* what execv will do anyway: a caught signal to its default, an ignored one kept */
            struct sigaction cur;
            if (sigaction(held[k], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN) signal(held[k], SIG_DFL);
        }
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127); /* the parent died before prctl */
        /* Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group) reaches only the supervisor,
         * which stops the job in order (the trainer saves a checkpoint first); else the workers would die at once
         * and mpirun would kill the trainer ranks */
        setpgid(0, 0);
        char t[16];
        snprintf(t, sizeof t, "%d", threads > 0 ? threads : 1);
        setenv("OMP_NUM_THREADS", t, 1);
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        if (log_path) { /* appended to: a job refused after its start (a resume's checks) keeps the last one's log */
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0666); /* the umask: logging.file_mode */
            if (fd >= 0) dup2(fd, 1), dup2(fd, 2), close(fd);
            if (fd >= 0 && write(2, note, (size_t)note_len) < 0) { /* the log line is a courtesy */ }
        }
        /* the one descriptor this child inherits (the others stay close-on-exec). As stdin it is opened afresh
         * (/proc/self/fd/N: an offset of its own at 0, not the one the parent's memfd shares with other children) */
        if (pass_fd >= 0 && as_stdin) {
            char p[64];
            snprintf(p, sizeof p, "/proc/self/fd/%d", pass_fd);
            int in = open(p, O_RDONLY);
            if (in < 0 || dup2(in, 0) < 0) _exit(127);
            close(in);
        } else if (pass_fd >= 0 && fcntl(pass_fd, F_SETFD, 0) < 0) {
            _exit(127);
        }
        execv(argv[0], argv);
        fprintf(stderr, "%s: cannot run %s: %s\n", name, argv[0], strerror(errno));
        _exit(127);
    }
    s->p[i].pid = pid;
    s->p[i].status = 0;
    s->p[i].reported = 0;
    return 0;
}

int sup_spawn_fd(sup_procs *s, const char *name, char *const *argv, int threads, const char *log_path, int pass_fd,
                 int as_stdin) {
    if (s->n >= SUP_MAX_PROCS) return core_error("supervisor: more than %d processes", SUP_MAX_PROCS);
    const int i = s->n;
    int argc = 0;
    while (argv[argc]) argc++;
    char **copy = calloc((size_t)argc + 1, sizeof(char *));
    for (int a = 0; copy && a < argc; a++)
        if (!(copy[a] = strdup(argv[a]))) {
            for (int b = 0; b < a; b++) free(copy[b]);
            free(copy), copy = NULL;
        }
    if (!copy) return core_error("%s: out of memory", name);
    memset(&s->p[i], 0, sizeof s->p[i]);
    snprintf(s->p[i].name, sizeof s->p[i].name, "%s", name);
    snprintf(s->p[i].log, sizeof s->p[i].log, "%s", log_path ? log_path : "");
    s->p[i].argv = copy;
    s->p[i].threads = threads, s->p[i].pass_fd = pass_fd, s->p[i].as_stdin = as_stdin;
    if (start(s, i, 0)) {
        for (int a = 0; a < argc; a++) free(copy[a]);
        free(copy);
        s->p[i].argv = NULL;
        return -1;
    }
    s->n++;
    return i;
}

int sup_restart(sup_procs *s, int i) {
    if (i < 0 || i >= s->n || !s->p[i].argv) return core_error("supervisor: no process %d to restart", i);
    if (s->p[i].pid) return core_error("supervisor: %s is still running", s->p[i].name);
    s->p[i].restarts++;
    return start(s, i, s->p[i].restarts);
}

void sup_free(sup_procs *s) {
    for (int i = 0; i < s->n; i++) {
        for (int a = 0; s->p[i].argv && s->p[i].argv[a]; a++) free(s->p[i].argv[a]);
        free(s->p[i].argv);
        s->p[i].argv = NULL;
    }
}

int sup_poll(sup_procs *s) {
    for (int i = 0; i < s->n; i++) {
        if (!s->p[i].pid) continue;
        int st;
        pid_t r = waitpid(s->p[i].pid, &st, WNOHANG);
        if (r == s->p[i].pid) {
            s->p[i].pid = 0;
            s->p[i].status = st;
        }
    }
    for (int i = 0; i < s->n; i++)
        if (!s->p[i].pid && !s->p[i].reported) {
            s->p[i].reported = 1;
            return i;
        }
    return -1;
}

void sup_describe(const sup_procs *s, int i, char *buf, size_t n) {
    const int st = s->p[i].status;
    if (WIFEXITED(st)) snprintf(buf, n, "%s exited with status %d", s->p[i].name, WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(buf, n, "%s was killed by signal %d (%s)", s->p[i].name, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else snprintf(buf, n, "%s stopped (status %d)", s->p[i].name, st);
    if (s->p[i].log[0]) {
        /* the log's last non-empty line is usually the reason: quote it (printable ASCII, at most 300 bytes) */
        char last[320] = "", line[4096];
        FILE *f = fopen(s->p[i].log, "r");
        while (f && fgets(line, sizeof line, f)) {
            size_t L = strlen(line);
            while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
            if (!L) continue;
            size_t k = 0;
            for (size_t j = 0; j < L && k + 1 < sizeof last && k < 300; j++)
                last[k++] = line[j] >= 32 && line[j] < 127 ? line[j] : '?';
            last[k] = 0;
        }
        if (f) fclose(f);
        size_t k = strlen(buf);
        if (last[0]) snprintf(buf + k, n - k, ": \"%s\" (log: %s)", last, s->p[i].log);
        else snprintf(buf + k, n - k, "; its log: %s", s->p[i].log);
    }
}

static int any_running(sup_procs *s) {
    sup_poll(s);
    for (int i = 0; i < s->n; i++)
        if (s->p[i].pid) return 1;
    return 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void sup_stop_all(sup_procs *s, double timeout_s) {
    for (int k = 0; k < (int)(timeout_s * 50) && any_running(s); k++) sleep_ms(20);
    for (int i = 0; i < s->n; i++)
        if (s->p[i].pid) kill(s->p[i].pid, SIGTERM);
    for (int k = 0; k < 100 && any_running(s); k++) sleep_ms(20);
    for (int i = 0; i < s->n; i++)
        if (s->p[i].pid) kill(s->p[i].pid, SIGKILL);
    while (any_running(s)) sleep_ms(10);
}
