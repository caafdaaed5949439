/* kernels/cpu/pool.c — the task pool of kernels/cpu/pool.h.
 *
 * One job at a time. A job is published as one 64-bit claim word (generation 22 bits | task count 21 bits | next task
 * 21 bits) plus fn and ctx written before it; a thread claims task `next` by compare-and-swap on that word, so a
 * helper still holding an old generation can never claim a task of a newer job, and fn and ctx cannot change while a
 * claimed task runs (the caller publishes the next job only after every task of this one is done). Helpers sleep on
 * a futex on the 32-bit generation counter. */
#include "kernels/cpu/pool.h"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

enum { MAX_HELPERS = 63, GEN_BITS = 22, N_BITS = 21, MAX_TASKS = (1 << 21) - 1 };

static struct {
    _Atomic uint32_t gen;      /* futex word: bumped once per job */
    _Atomic uint64_t claim;    /* gen | n | next, see the top */
    _Atomic int done;          /* tasks of the current job finished */
    _Atomic int busy;          /* a caller owns the pool */
    _Atomic int sleepers;      /* helpers inside futex_wait (or about to be) */
    void (*fn)(void *, int);
    void *ctx;
    _Atomic int allowed;       /* helpers 0 .. allowed-1 may take part in the current job */
    int nhelpers;
} P;

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static uint64_t word(uint32_t gen, uint32_t n, uint32_t next) {
    return ((uint64_t)(gen & ((1u << GEN_BITS) - 1)) << (2 * N_BITS)) | ((uint64_t)n << N_BITS) | next;
}

/* Claims a task of generation gen: its index, or -1 when none is left (or a newer job is out). */
static int claim(uint32_t gen) {
    uint64_t w = atomic_load_explicit(&P.claim, memory_order_acquire);
    for (;;) {
        const uint32_t g = (uint32_t)(w >> (2 * N_BITS)), n = (uint32_t)(w >> N_BITS) & MAX_TASKS,
                       next = (uint32_t)w & MAX_TASKS;
        if (g != (gen & ((1u << GEN_BITS) - 1)) || next >= n) return -1;
        if (atomic_compare_exchange_weak_explicit(&P.claim, &w, w + 1, memory_order_acq_rel, memory_order_acquire))
            return (int)next;
    }
}

static void run_claimed(uint32_t gen) {
    int t;
    while ((t = claim(gen)) >= 0) {
        P.fn(P.ctx, t);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    }
}

static void *helper(void *arg) {
    const int id = (int)(intptr_t)arg;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = atomic_load(&P.gen);
        if (g != seen) {
            seen = g;
            if (id < atomic_load(&P.allowed)) run_claimed(g);
            continue;
        }
        atomic_fetch_add(&P.sleepers, 1);
        if (atomic_load(&P.gen) == seen) syscall(SYS_futex, &P.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        atomic_fetch_sub(&P.sleepers, 1);
    }
    return NULL;
}

static void pool_start(void) {
    int n = omp_get_max_threads() - 1;
    if (n > MAX_HELPERS) n = MAX_HELPERS;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    for (int i = 0; i < n; i++) {
        pthread_t th;
        if (pthread_create(&th, &at, helper, (void *)(intptr_t)i)) break;
        P.nhelpers++;
    }
    pthread_attr_destroy(&at);
}

int k_pool_threads(void) {
    int nt = omp_get_max_threads();
    if (nt <= 1 || omp_in_parallel()) return 1;
    pthread_once(&pool_once, pool_start);
    return 1 + (nt - 1 < P.nhelpers ? nt - 1 : P.nhelpers);
}

void k_pool_run(int n, void (*fn)(void *ctx, int t), void *ctx) {
    if (n <= 0) return;
    const int threads = n > 1 && n <= MAX_TASKS ? k_pool_threads() : 1;
    if (threads <= 1 || atomic_exchange(&P.busy, 1)) { /* alone (or the pool is another caller's) */
        for (int t = 0; t < n; t++) fn(ctx, t);
        return;
    }
    const uint32_t gen = atomic_load(&P.gen) + 1;
    P.fn = fn, P.ctx = ctx;
    atomic_store(&P.done, 0);
    atomic_store(&P.allowed, threads - 1);
    atomic_store_explicit(&P.claim, word(gen, (uint32_t)n, 0), memory_order_release);
    atomic_store(&P.gen, gen);
    if (atomic_load(&P.sleepers) > 0) syscall(SYS_futex, &P.gen, FUTEX_WAKE_PRIVATE, threads - 1, NULL, NULL, 0);
    run_claimed(gen);
    /* every task is claimed; wait for those a helper is still running */
    for (int spin = 0; atomic_load_explicit(&P.done, memory_order_acquire) < n; spin++) {
        if (spin < 4096) POOL_PAUSE();
        else sched_yield();
    }
    atomic_store(&P.busy, 0);
}
