/* reward/server_guard.c — connection and memory bounds of the reward server (see reward/server_guard.h).
 *
 * Why the fds from the monitor are safe to shut down: libzmq reports a connection's DISCONNECTED event before it
 * closes the fd, and events arrive in order, so an fd in the set is still that connection's unless its
 * DISCONNECTED event is in flight; then the number may have been reused by a newer connection (which is dropped
 * too and reconnects) or by a non-socket (shutdown fails with ENOTSOCK). The listening sockets are never closed
 * while the server runs, so their numbers are never reused. */
#include "reward/server_guard.h"

#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/curve.h"
#include "core/error.h"
#include "core/log.h"

#define ZAP_EP "inproc://zeromq.zap.01"
#define MON_EP "inproc://vgrpo-reward-monitor"

/* Unauthenticated connections: at most MAX_PENDING(max_peers) open at once besides the admitted peers (the oldest
 * is dropped for a newer one), and an admission not yet tied to its connection by a message counts against
 * max_peers for at most APPROVAL_TTL_S seconds. */
#define MAX_PENDING(p) (2 * (p) + 8)
#define APPROVAL_TTL_S 10.0

enum { PENDING, AUTHENTICATED, DROPPED };
typedef struct {
    int fd;
    int state;   /* PENDING: in its handshake or silent; AUTHENTICATED: an authenticated message came from it;
                    DROPPED: shut down here, its DISCONNECTED event not yet read */
    double t;    /* accepted at (monotonic seconds) */
} conn;

struct reward_guard {
    void *router, *zap, *mon;
    int max_peers;
    conn *conns;              /* open connections, from the monitor */
    int n_fds, cap_fds;
    double *approved;         /* admissions of the ZAP handler not yet tied to a connection: their times, oldest first */
    int n_approved;           /* <= max_peers */
    int keys;                 /* CURVE: only `allow` gets in */
    uint8_t allow[32];
    int statm;                /* /proc/self/statm, or -1 */
    size_t page, bound;       /* bound: resident bytes past which connections are dropped */
    double t_check, t_drop;
    int trimmed;
    long long refused, dropped, evicted;
};

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Resident bytes, or 0 when unknown. */
static size_t resident(reward_guard *g) {
    char buf[128];
    if (g->statm < 0) return 0;
    ssize_t n = pread(g->statm, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    unsigned long long size = 0, res = 0;
    if (sscanf(buf, "%llu %llu", &size, &res) != 2) return 0;
    return (size_t)res * g->page;
}

reward_guard *reward_guard_open(void *ctx, void *router, int max_peers, size_t budget_bytes, const char *allow_z85) {
    reward_guard *g = calloc(1, sizeof *g);
    if (!g) {
        core_error("reward server: out of memory");
        return NULL;
    }
    if (allow_z85 && (strlen(allow_z85) != CORE_CURVE_Z85_LEN || !zmq_z85_decode(g->allow, allow_z85))) {
        core_error("reward server: the allowed client key is not %d Z85 characters", CORE_CURVE_Z85_LEN);
        free(g);
        return NULL;
    }
    g->keys = allow_z85 != NULL;
    g->router = router;
    g->max_peers = max_peers < 1 ? 1 : max_peers;
    if (!(g->approved = calloc((size_t)g->max_peers, sizeof *g->approved))) {
        core_error("reward server: out of memory");
        free(g);
        return NULL;
    }
    g->statm = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    long pg = sysconf(_SC_PAGESIZE);
    g->page = pg > 0 ? (size_t)pg : 4096;
    g->bound = resident(g) + budget_bytes;
    g->zap = zmq_socket(ctx, ZMQ_REP);
    g->mon = zmq_socket(ctx, ZMQ_PAIR);
    int zero = 0;
    const char *dom = CORE_CURVE_ZAP_DOMAIN;
    if (!g->zap || !g->mon || zmq_setsockopt(g->zap, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(g->mon, ZMQ_LINGER, &zero, sizeof zero) || zmq_bind(g->zap, ZAP_EP) ||
        zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, dom, strlen(dom)) ||
        zmq_socket_monitor(router, MON_EP, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) || zmq_connect(g->mon, MON_EP)) {
        core_error("reward server: connection guard (ZAP handler, socket monitor) failed: %s", zmq_strerror(zmq_errno()));
        reward_guard_close(g);
        return NULL;
    }
    return g;
}

void reward_guard_pollitems(reward_guard *g, zmq_pollitem_t items[2]) {
    items[0] = (zmq_pollitem_t){g->zap, 0, ZMQ_POLLIN, 0};
    items[1] = (zmq_pollitem_t){g->mon, 0, ZMQ_POLLIN, 0};
}

static int find_fd(const reward_guard *g, int fd) {
    for (int i = 0; i < g->n_fds; i++)
        if (g->conns[i].fd == fd) return i;
    return -1;
}

static int count_state(const reward_guard *g, int state) {
    int n = 0;
    for (int i = 0; i < g->n_fds; i++) n += g->conns[i].state == state;
    return n;
}

/* Admissions of the ZAP handler whose connection sent nothing for APPROVAL_TTL_S no longer count, and there are
 * never more of them than unauthenticated connections open (each belongs to one of those). */
static void expire_approvals(reward_guard *g, double now) {
    int k = 0;
    while (k < g->n_approved && now - g->approved[k] > APPROVAL_TTL_S) k++;
    const int pending = count_state(g, PENDING);
    if (g->n_approved - k > pending) k = g->n_approved - pending;
    if (k > 0) memmove(g->approved, g->approved + k, sizeof *g->approved * (size_t)(g->n_approved -= k));
}

/* A new connection (still in its handshake). Unauthenticated connections are bounded apart from the admitted ones:
 * past MAX_PENDING of them the oldest is dropped (shutdown(2); libzmq then closes it and frees what it was sending),
 * so connections that never authenticate can neither lock key holders out nor pile up. libzmq itself closes one
 * that has not finished its handshake after ZMQ_HANDSHAKE_IVL (5 s). */
static void fd_add(reward_guard *g, int fd) {
    const int old = find_fd(g, fd); /* a reused number whose DISCONNECTED was not read: that connection is gone */
    if (old >= 0) g->conns[old] = g->conns[--g->n_fds];
    if (g->n_fds == g->cap_fds) {
        int cap = g->cap_fds ? 2 * g->cap_fds : 64;
        conn *p = realloc(g->conns, sizeof *p * (size_t)cap);
        if (!p) return; /* not tracked: not counted, not dropped on a memory alarm */
        g->conns = p, g->cap_fds = cap;
    }
    g->conns[g->n_fds++] = (conn){fd, PENDING, mono()};
    const int pending = count_state(g, PENDING);
    if (pending <= MAX_PENDING(g->max_peers)) return;
    int oldest = -1;
    for (int i = 0; i < g->n_fds; i++)
        if (g->conns[i].state == PENDING && (oldest < 0 || g->conns[i].t < g->conns[oldest].t)) oldest = i;
    g->conns[oldest].state = DROPPED;
    if (shutdown(g->conns[oldest].fd, SHUT_RDWR) == 0) {
        long long k = ++g->evicted;
        if (k <= 10 || k % 1000 == 0)
            core_log_warn("reward-server: dropped the oldest unauthenticated connection (%d open, at most %d besides "
                          "the admitted peers; drop %lld)", pending, MAX_PENDING(g->max_peers), k);
    }
}

static void fd_remove(reward_guard *g, int fd) {
    const int i = find_fd(g, fd);
    if (i < 0) return;
    g->conns[i] = g->conns[--g->n_fds];
    expire_approvals(g, mono());
}

/* One monitor event: frame 1 is u16 event + u32 value (the fd for ACCEPTED / DISCONNECTED), frame 2 the endpoint. */
static int read_event(reward_guard *g) {
    zmq_msg_t a, b;
    zmq_msg_init(&a);
    if (zmq_msg_recv(&a, g->mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&a);
        return 0;
    }
    uint16_t ev = 0;
    uint32_t val = 0;
    if (zmq_msg_size(&a) >= 6) {
        memcpy(&ev, zmq_msg_data(&a), 2);
        memcpy(&val, (const char *)zmq_msg_data(&a) + 2, 4);
    }
    int more = zmq_msg_more(&a);
    zmq_msg_close(&a);
    while (more) {
        zmq_msg_init(&b);
        if (zmq_msg_recv(&b, g->mon, 0) < 0) more = 0;
        else more = zmq_msg_more(&b);
        zmq_msg_close(&b);
    }
    if (ev == ZMQ_EVENT_ACCEPTED) fd_add(g, (int)val);
    else if (ev == ZMQ_EVENT_DISCONNECTED) fd_remove(g, (int)val);
    return 1;
}

/* The peers admitted now: connections that sent an authenticated message, and admissions whose connection has
 * not yet sent one (at most APPROVAL_TTL_S old). Unauthenticated connections do not count. */
static int admitted(reward_guard *g) {
    expire_approvals(g, mono());
    return count_state(g, AUTHENTICATED) + g->n_approved;
}

void reward_guard_authenticated(reward_guard *g, int fd) {
    while (read_event(g)) { /* its ACCEPTED event first */
    }
    const int i = fd >= 0 ? find_fd(g, fd) : -1;
    if (i < 0 || g->conns[i].state != PENDING) return;
    g->conns[i].state = AUTHENTICATED;
    if (g->n_approved > 0) /* the admission that let it in (the oldest: admissions complete in order) */
        memmove(g->approved, g->approved + 1, sizeof *g->approved * (size_t)--g->n_approved);
}

/* One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism, credentials...; the reply
 * is version, request id, status code, status text, user id, metadata. */
static void answer_zap(reward_guard *g) {
    zmq_msg_t fr[8];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t tmp, *dst = n < 8 ? &fr[n] : &tmp;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, g->zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(dst);
            if (n == 0) return;
            break;
        }
        more = zmq_msg_more(dst);
        if (dst == &tmp) zmq_msg_close(&tmp);
        else n++;
    }
    while (read_event(g)) { /* the connection asking was accepted before its handshake: count it first */
    }
    /* version, request id, domain, address, routing id, mechanism, credentials (CURVE: the client's 32-byte key);
     * the same checks as core/curve.c's handler, which cannot be used here: one handler per context. */
    const char *why = NULL;
    char addr[64] = "";
    if (n >= 4) snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&fr[3]), (const char *)zmq_msg_data(&fr[3]));
    if (n < 6 || zmq_msg_size(&fr[0]) != 3 || memcmp(zmq_msg_data(&fr[0]), "1.0", 3)) why = "malformed ZAP request";
    else if (zmq_msg_size(&fr[2]) != strlen(CORE_CURVE_ZAP_DOMAIN) ||
             memcmp(zmq_msg_data(&fr[2]), CORE_CURVE_ZAP_DOMAIN, strlen(CORE_CURVE_ZAP_DOMAIN)))
        why = "unknown ZAP domain";
    else if (g->keys && (zmq_msg_size(&fr[5]) != 5 || memcmp(zmq_msg_data(&fr[5]), "CURVE", 5) || n != 7 ||
                         zmq_msg_size(&fr[6]) != 32 || memcmp(zmq_msg_data(&fr[6]), g->allow, 32)))
        why = "not the run's client key";
    else if (admitted(g) >= g->max_peers)
        why = "too many connections";
    if (why) {
        long long k = ++g->refused;
        if (k <= 10 || k % 1000 == 0)
            core_log_warn("reward-server: refused a connection from %s: %s (refusal %lld)", addr[0] ? addr : "?", why, k);
    } else {
        g->approved[g->n_approved++] = mono(); /* < max_peers here: admitted() counts them */
    }
    const char *user = why ? "" : g->keys ? CORE_CURVE_USER_ID : "";
    zmq_send(g->zap, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2) zmq_send(g->zap, zmq_msg_data(&fr[1]), zmq_msg_size(&fr[1]), ZMQ_SNDMORE);
    else zmq_send(g->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(g->zap, why ? "400" : "200", 3, ZMQ_SNDMORE);
    zmq_send(g->zap, why ? why : "OK", strlen(why ? why : "OK"), ZMQ_SNDMORE);
    zmq_send(g->zap, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(g->zap, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
}

void reward_guard_serve(reward_guard *g) {
    while (read_event(g)) {
    }
    zmq_pollitem_t it = {g->zap, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, 0) == 1 && (it.revents & ZMQ_POLLIN)) answer_zap(g);
}

int reward_guard_check_memory(reward_guard *g) {
    double now = mono();
    if (now - g->t_check < 0.01) return 0;
    g->t_check = now;
    size_t rss = resident(g);
    if (rss <= g->bound) return 0;
    if (now - g->t_drop < 0.2) { /* dropped just now: libzmq is freeing; hand the freed heap back once */
        if (!g->trimmed) malloc_trim(0), g->trimmed = 1;
        return 0;
    }
    while (read_event(g)) {
    }
    int n = 0;
    for (int i = 0; i < g->n_fds; i++) n += shutdown(g->conns[i].fd, SHUT_RDWR) == 0;
    g->dropped += n;
    g->t_drop = now;
    g->trimmed = 0;
    fprintf(stderr,
            "reward-server: resident memory %zu MiB is over the bound of %zu MiB: dropped all %d connections (a peer "
            "sent more than the limits allow; clients reconnect and re-send)\n",
            rss >> 20, g->bound >> 20, n);
    return n;
}

long long reward_guard_refused(const reward_guard *g) { return g->refused + g->evicted; }
long long reward_guard_dropped(const reward_guard *g) { return g->dropped; }
size_t reward_guard_bound(const reward_guard *g) { return g->bound; }

void reward_guard_close(reward_guard *g) {
    if (!g) return;
    if (g->router) zmq_socket_monitor(g->router, NULL, 0);
    if (g->zap) zmq_close(g->zap);
    if (g->mon) zmq_close(g->mon);
    if (g->statm >= 0) close(g->statm);
    free(g->conns);
    free(g->approved);
    free(g);
}
