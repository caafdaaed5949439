/* core/stop.c — SIGINT/SIGTERM turned into a stop flag; see core/stop.h. */
#include <signal.h>
#include <string.h>

#include "core/stop.h"

static volatile sig_atomic_t pending_signal, held;
static struct sigaction old_int, old_term;

static void on_signal(int sig) { pending_signal = sig; }

void core_stop_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND; /* a second signal takes the default action: stop at once */
    pending_signal = 0;
    held = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
}

int core_stop_pending(void) { return pending_signal; }

int core_stop_interrupt(void) { return held ? 0 : pending_signal; }

void core_stop_hold(int on) { held = on != 0; }

void core_stop_restore(void) {
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
}
