/* kernels/cpu/pool.h — a small task pool for the CPU kernels whose caller never waits for a thread that has not
 * started.
 *
 * Why not an OpenMP parallel region. Its end is a barrier: the calling thread waits until every team member has
 * arrived, including one that is still asleep (OMP_WAIT_POLICY=passive, core/omp_env.c) or not yet scheduled because
 * its core runs another process. On the 2-core machine shared with other jobs that wait is often longer than a small
 * GEMM itself: measured on the demo recipe's GRPO step (vgrpo bench step) with other jobs running, 2 threads took
 * 2.2x the time of 1. Here the caller claims tasks too and returns as soon as every task is done: a helper that
 * wakes late finds no task left and goes back to sleep, so a call is never slower than running its tasks alone plus
 * one wake-up. Helpers sleep on a futex between calls (no spinning).
 *
 * Tasks must write disjoint outputs; which thread runs a task never changes a value. Calls from inside an OpenMP
 * parallel region, from a second thread while the pool is busy, or with one thread (omp_get_max_threads() == 1) run
 * every task on the caller. Helpers: omp_get_max_threads() - 1, made on first use. */
#ifndef KERNELS_CPU_POOL_H
#define KERNELS_CPU_POOL_H

/* Runs fn(ctx, t) for t in [0, n) on the caller and the idle helpers; returns when all n are done. */
void k_pool_run(int n, void (*fn)(void *ctx, int t), void *ctx);

/* The threads a k_pool_run call may use now (1 + helpers). */
int k_pool_threads(void);

#endif
