/* core/stop.h — SIGINT/SIGTERM as a request to stop: install sets a flag instead of stopping the process (once: a
 * second signal takes the default action and stops at once), and the long loops (the GRPO loop between steps) read
 * it. Process-wide: one installation at a time. */
#ifndef CORE_STOP_H
#define CORE_STOP_H

/* Installs the handlers for SIGINT and SIGTERM and clears the flag. */
void core_stop_install(void);
/* The signal number received since core_stop_install (0: none). */
int core_stop_pending(void);
/* Puts the previous handlers back. */
void core_stop_restore(void);

#endif
