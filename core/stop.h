/* core/stop.h — SIGINT/SIGTERM as a request to stop: install sets a flag instead of stopping the process (once: a
 * second signal takes the default action and stops at once), and the long loops read it: the GRPO loop between
 * steps (core_stop_pending), and the work inside a step that may be cut short, which polls core_stop_interrupt: the
 * rollout engine between denoising steps, the training step between micro-batches, the controller's waits for the
 * rollout workers. Once a step has changed the weights it must complete (weight sync, metrics row), so the loop
 * holds interruptions off from its optimizer step to the end of the step (core_stop_hold); the signal is then acted
 * on at the step boundary. Process-wide: one installation at a time. */
#ifndef CORE_STOP_H
#define CORE_STOP_H

/* Installs the handlers for SIGINT and SIGTERM, clears the flag and releases any hold. */
void core_stop_install(void);
/* The signal number received since core_stop_install (0: none), held or not. */
int core_stop_pending(void);
/* What work that may be cut short polls: the signal number received since core_stop_install, or 0 when none or
 * while interruptions are held off. Async-signal-safe; never blocks. */
int core_stop_interrupt(void);
/* on != 0: from now on core_stop_interrupt returns 0 (a signal still arrives: core_stop_pending reports it);
 * on == 0: interruptions reach core_stop_interrupt again. Not nested. */
void core_stop_hold(int on);
/* Puts the previous handlers back (the flag keeps its value). */
void core_stop_restore(void);

#endif
