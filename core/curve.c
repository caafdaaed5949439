/* core/curve.c — the run's CURVE keys, their text form, how they reach a process, and the ZAP handler (see
 * core/curve.h). The ZAP handler follows RFC 27 (ZeroMQ Authentication Protocol 1.0): a request is
 * [version "1.0", request id, domain, address, routing id, mechanism, credentials...], the reply is
 * [version, request id, status code, status text, user id, metadata]. */
#include "core/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

static const char *const role_names[CORE_CURVE_N_ROLES] = {"controller", "reward", "client"};

const char *core_curve_role_name(core_curve_role role) {
    return role >= 0 && role < CORE_CURVE_N_ROLES ? role_names[role] : "?";
}

int core_curve_available(void) { return zmq_has("curve") ? 1 : 0; }

int core_curve_generate(core_curve_keys *k) {
    memset(k, 0, sizeof *k);
    if (!core_curve_available()) return core_error("this libzmq has no CURVE support (zmq_has(\"curve\") is 0)");
    for (int r = 0; r < CORE_CURVE_N_ROLES; r++)
        if (zmq_curve_keypair(k->pub[r], k->sec[r])) {
            memset(k, 0, sizeof *k);
            return core_error("zmq_curve_keypair: %s", zmq_strerror(errno));
        }
    return 0;
}

int core_curve_has(const core_curve_keys *k, core_curve_role role, int need_secret) {
    if (!k || role < 0 || role >= CORE_CURVE_N_ROLES) return 0;
    return k->pub[role][0] && (!need_secret || k->sec[role][0]);
}

void core_curve_subset(const core_curve_keys *all, core_curve_role who, core_curve_keys *out) {
    core_curve_keys s;
    memset(&s, 0, sizeof s);
    memcpy(s.pub, all->pub, sizeof s.pub); /* public keys are not secret; every role may know them */
    if (who >= 0 && who < CORE_CURVE_N_ROLES) memcpy(s.sec[who], all->sec[who], sizeof s.sec[who]);
    *out = s;
}

int core_curve_format(const core_curve_keys *k, char *buf, size_t cap) {
    size_t n = 0;
    int w = snprintf(buf, cap, "vgrpo-keys 1\n");
    if (w < 0 || (size_t)w >= cap) return core_error("key text: buffer of %zu bytes is too small", cap);
    n = (size_t)w;
    for (int r = 0; r < CORE_CURVE_N_ROLES; r++)
        for (int s = 0; s < 2; s++) {
            const char *key = s ? k->sec[r] : k->pub[r];
            if (!key[0]) continue;
            w = snprintf(buf + n, cap - n, "%s-%s %s\n", role_names[r], s ? "secret" : "public", key);
            if (w < 0 || (size_t)w >= cap - n) return core_error("key text: buffer of %zu bytes is too small", cap);
            n += (size_t)w;
        }
    return 0;
}

static int z85_char(char c) {
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    return c && strchr(alphabet, c) != NULL;
}

int core_curve_parse(const char *text, size_t len, core_curve_keys *k) {
    core_curve_keys t;
    memset(&t, 0, sizeof t);
    memset(k, 0, sizeof *k);
    int line_no = 0, have_header = 0;
    size_t i = 0;
    if (len > CORE_CURVE_TEXT_MAX) return core_error("key text: %zu bytes, at most %d", len, CORE_CURVE_TEXT_MAX);
    while (i < len) {
        size_t e = i;
        while (e < len && text[e] != '\n') e++;
        size_t L = e - i;
        const char *line = text + i;
        i = e + 1;
        line_no++;
        if (L && line[L - 1] == '\r') L--;
        if (L == 0 || line[0] == '#') continue;
        for (size_t j = 0; j < L; j++)
            if ((unsigned char)line[j] < 32 || (unsigned char)line[j] > 126)
                return core_error("key text line %d: a byte that is not printable ASCII", line_no);
        if (!have_header) {
            if (L != 12 || memcmp(line, "vgrpo-keys 1", 12))
                return core_error("key text line %d: expected \"vgrpo-keys 1\" first (core/curve.h)", line_no);
            have_header = 1;
            continue;
        }
        const char *sp = memchr(line, ' ', L);
        if (!sp) return core_error("key text line %d: expected \"ROLE-public KEY\" or \"ROLE-secret KEY\"", line_no);
        const size_t nl = (size_t)(sp - line);
        int role = -1, secret = -1;
        for (int r = 0; r < CORE_CURVE_N_ROLES; r++)
            for (int s = 0; s < 2; s++) {
                char name[32];
                snprintf(name, sizeof name, "%s-%s", role_names[r], s ? "secret" : "public");
                if (strlen(name) == nl && !memcmp(name, line, nl)) role = r, secret = s;
            }
        if (role < 0)
            return core_error("key text line %d: unknown item \"%.*s\" (expected controller|reward|client-public|secret)",
                              line_no, (int)(nl < 40 ? nl : 40), line);
        const char *key = sp + 1;
        const size_t kl = L - nl - 1;
        int ok = kl == CORE_CURVE_Z85_LEN;
        for (size_t j = 0; ok && j < kl; j++) ok = z85_char(key[j]);
        if (!ok) return core_error("key text line %d: %s-%s must be %d Z85 characters", line_no, role_names[role],
                                   secret ? "secret" : "public", CORE_CURVE_Z85_LEN);
        char *dst = secret ? t.sec[role] : t.pub[role];
        if (dst[0]) return core_error("key text line %d: %s-%s given twice", line_no, role_names[role], secret ? "secret" : "public");
        memcpy(dst, key, CORE_CURVE_Z85_LEN);
        dst[CORE_CURVE_Z85_LEN] = 0;
    }
    if (!have_header) return core_error("key text: empty (expected \"vgrpo-keys 1\" and keys; core/curve.h)");
    for (int r = 0; r < CORE_CURVE_N_ROLES; r++) {
        if (!t.sec[r][0]) continue;
        char derived[CORE_CURVE_Z85_LEN + 1];
        if (!t.pub[r][0]) return core_error("key text: %s-secret without %s-public", role_names[r], role_names[r]);
        if (zmq_curve_public(derived, t.sec[r]) || strcmp(derived, t.pub[r]))
            return core_error("key text: %s-secret does not belong to %s-public", role_names[r], role_names[r]);
    }
    *k = t;
    return 0;
}

int core_curve_memfd(const core_curve_keys *k) {
    char text[CORE_CURVE_TEXT_MAX];
    if (core_curve_format(k, text, sizeof text)) return -1;
    int fd = memfd_create("vgrpo-keys", MFD_CLOEXEC);
    if (fd < 0) return core_error("memfd_create for the run's keys: %s", strerror(errno));
    const size_t n = strlen(text);
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            memset(text, 0, sizeof text);
            return core_error("writing the run's keys to a memfd: %s", strerror(e));
        }
        done += (size_t)w;
    }
    memset(text, 0, sizeof text);
    return fd;
}

/* Reads up to cap bytes from fd: pread from 0 when seekable (several children share one memfd's offset), else
 * read to end of file. Returns the byte count, or -1 with errno. cap + 1 bytes read means too long. */
static ssize_t read_all(int fd, char *buf, size_t cap) {
    size_t n = 0;
    int seekable = 1;
    for (;;) {
        ssize_t r = seekable ? pread(fd, buf + n, cap + 1 - n, (off_t)n) : read(fd, buf + n, cap + 1 - n);
        if (r < 0 && seekable && errno == ESPIPE) {
            seekable = 0;
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return (ssize_t)n;
        n += (size_t)r;
        if (n > cap) return (ssize_t)n;
    }
}

int core_curve_read_fd(int fd, core_curve_keys *k) {
    memset(k, 0, sizeof *k);
    char text[CORE_CURVE_TEXT_MAX + 1];
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) return core_error("--keys-fd %d: not an open file descriptor", fd);
    ssize_t n = read_all(fd, text, CORE_CURVE_TEXT_MAX);
    int e = errno;
    close(fd);
    if (n < 0) return core_error("--keys-fd %d: %s", fd, strerror(e));
    if (n == 0) return core_error("--keys-fd %d: empty (expected the run's key text)", fd);
    if (n > CORE_CURVE_TEXT_MAX) return core_error("--keys-fd %d: more than %d bytes", fd, CORE_CURVE_TEXT_MAX);
    int rc = core_curve_parse(text, (size_t)n, k);
    memset(text, 0, sizeof text);
    return rc ? core_error_push("--keys-fd %d: ", fd) : 0;
}

int core_curve_load_file(const char *path, core_curve_keys *k) {
    memset(k, 0, sizeof *k);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ELOOP) return core_error("key file %s: a symlink; give the file itself", path);
        return core_error("key file %s: %s", path, strerror(errno));
    }
    struct stat st;
    int bad = fstat(fd, &st) ? core_error("key file %s: %s", path, strerror(errno))
              : !S_ISREG(st.st_mode) ? core_error("key file %s: not a regular file", path)
              : st.st_uid != geteuid() ? core_error("key file %s: owned by uid %u, not by this user (uid %u)", path,
                                                    (unsigned)st.st_uid, (unsigned)geteuid())
              : (st.st_mode & 077) ? core_error("key file %s: mode %04o lets other users read or change the run's keys: "
                                                "chmod 600 %s", path, (unsigned)(st.st_mode & 07777), path)
                                   : 0;
    if (bad) {
        close(fd);
        return -1;
    }
    char text[CORE_CURVE_TEXT_MAX + 1];
    ssize_t n = read_all(fd, text, CORE_CURVE_TEXT_MAX);
    int e = errno;
    close(fd);
    if (n < 0) return core_error("key file %s: %s", path, strerror(e));
    if (n > CORE_CURVE_TEXT_MAX) return core_error("key file %s: more than %d bytes", path, CORE_CURVE_TEXT_MAX);
    int rc = core_curve_parse(text, (size_t)n, k);
    memset(text, 0, sizeof text);
    return rc ? core_error_push("key file %s: ", path) : 0;
}

int core_curve_write_file(const char *path, const core_curve_keys *k) {
    char text[CORE_CURVE_TEXT_MAX];
    if (core_curve_format(k, text, sizeof text)) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return core_error("key file %s: %s", path, strerror(errno));
    int rc = fchmod(fd, 0600) ? core_error("key file %s: chmod: %s", path, strerror(errno)) : 0;
    const size_t n = strlen(text);
    size_t done = 0;
    while (!rc && done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) rc = core_error("key file %s: %s", path, strerror(errno));
        else done += (size_t)w;
    }
    memset(text, 0, sizeof text);
    if (close(fd) && !rc) rc = core_error("key file %s: %s", path, strerror(errno));
    if (rc) unlink(path);
    return rc;
}

int core_curve_options(int keys_fd, const char *keys_file, core_curve_keys *k, int *have) {
    memset(k, 0, sizeof *k);
    *have = 0;
    if (keys_fd >= 0 && keys_file) return core_error("--keys-fd and --keys-file: give one of them");
    if (keys_fd >= 0 ? core_curve_read_fd(keys_fd, k) : keys_file ? core_curve_load_file(keys_file, k) : 0) return -1;
    *have = keys_fd >= 0 || keys_file;
    return 0;
}

int core_curve_server(void *sock, const core_curve_keys *k, core_curve_role role) {
    if (!core_curve_has(k, role, 1)) return core_error("CURVE server: the keys hold no %s key pair", core_curve_role_name(role));
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->sec[role], CORE_CURVE_Z85_LEN + 1) ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, CORE_CURVE_ZAP_DOMAIN, strlen(CORE_CURVE_ZAP_DOMAIN)))
        return core_error("CURVE server: %s", zmq_strerror(errno));
    return 0;
}

int core_curve_client(void *sock, const core_curve_keys *k, core_curve_role server) {
    if (!core_curve_has(k, server, 0)) return core_error("CURVE client: the keys hold no %s public key", core_curve_role_name(server));
    if (!core_curve_has(k, CORE_CURVE_CLIENT, 1)) return core_error("CURVE client: the keys hold no client key pair");
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, k->pub[server], CORE_CURVE_Z85_LEN + 1) ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k->pub[CORE_CURVE_CLIENT], CORE_CURVE_Z85_LEN + 1) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->sec[CORE_CURVE_CLIENT], CORE_CURVE_Z85_LEN + 1))
        return core_error("CURVE client: %s", zmq_strerror(errno));
    return 0;
}

const char *core_curve_peer(zmq_msg_t *frame) {
    const char *u = zmq_msg_gets(frame, "User-Id");
    return u && u[0] ? u : NULL;
}

/* ---- the ZAP handler ---- */

#define ZAP_MAX_ALLOW 16

struct core_curve_zap {
    void *ctx, *rep, *ctl_in, *ctl_out;
    pthread_t thread;
    int started;
    int n_allow;
    uint8_t allow[ZAP_MAX_ALLOW][32];
    char who[64], ctl_ep[64];
    atomic_long accepted, refused;
};

long core_curve_zap_accepted(const core_curve_zap *z) { return z ? atomic_load(&((core_curve_zap *)z)->accepted) : 0; }
long core_curve_zap_refused(const core_curve_zap *z) { return z ? atomic_load(&((core_curve_zap *)z)->refused) : 0; }

static int zap_decide(zmq_msg_t *f, int nf, const uint8_t (*allow)[32], int n_allow, const char **why) {
    const char *text = "not the run's client key";
    int ok = 0;
    /* version, request id, domain, address, routing id, mechanism, credentials (CURVE: the client's 32-byte key) */
    if (nf < 6 || zmq_msg_size(&f[0]) != 3 || memcmp(zmq_msg_data(&f[0]), "1.0", 3)) text = "malformed ZAP request";
    else if (zmq_msg_size(&f[2]) != strlen(CORE_CURVE_ZAP_DOMAIN) ||
             memcmp(zmq_msg_data(&f[2]), CORE_CURVE_ZAP_DOMAIN, strlen(CORE_CURVE_ZAP_DOMAIN)))
        text = "unknown ZAP domain";
    else if (zmq_msg_size(&f[5]) != 5 || memcmp(zmq_msg_data(&f[5]), "CURVE", 5) || nf != 7 || zmq_msg_size(&f[6]) != 32)
        text = "not a CURVE handshake";
    else
        for (int a = 0; a < n_allow && !ok; a++) ok = !memcmp(zmq_msg_data(&f[6]), allow[a], 32);
    if (why) *why = ok ? "OK" : text;
    return ok;
}

int core_curve_zap_check(zmq_msg_t *f, int n, const char *const *allow, int n_allow, const char **why) {
    uint8_t keys[ZAP_MAX_ALLOW][32];
    int k = 0;
    for (int a = 0; a < n_allow && k < ZAP_MAX_ALLOW; a++)
        if (allow[a] && strlen(allow[a]) == CORE_CURVE_Z85_LEN && zmq_z85_decode(keys[k], allow[a])) k++;
    return zap_decide(f, n, (const uint8_t(*)[32])keys, k, why);
}

/* Answers one ZAP request of nf frames. */
static void zap_answer(core_curve_zap *z, zmq_msg_t *f, int nf) {
    const char *text;
    const int ok = zap_decide(f, nf, (const uint8_t(*)[32])z->allow, z->n_allow, &text);
    const char *status = ok ? "200" : "400", *user = ok ? CORE_CURVE_USER_ID : "";
    char address[64] = "";
    if (nf >= 4) {
        size_t L = zmq_msg_size(&f[3]) < sizeof address - 1 ? zmq_msg_size(&f[3]) : sizeof address - 1;
        for (size_t i = 0; i < L; i++) {
            const char ch = ((const char *)zmq_msg_data(&f[3]))[i];
            address[i] = ch >= 32 && ch < 127 ? ch : '?';
        }
        address[L] = 0;
    }
    if (ok) {
        atomic_fetch_add(&z->accepted, 1);
    } else {
        long n = atomic_fetch_add(&z->refused, 1) + 1;
        if (n <= 10 || n % 1000 == 0)
            core_log_warn("%s: refused a connection from %s: %s (refusal %ld)", z->who, address[0] ? address : "?", text, n);
    }
    /* reply: version, request id (echoed as received), status code, status text, user id, metadata */
    zmq_send(z->rep, "1.0", 3, ZMQ_SNDMORE);
    if (nf >= 2) zmq_send(z->rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else zmq_send(z->rep, "", 0, ZMQ_SNDMORE);
    zmq_send(z->rep, status, 3, ZMQ_SNDMORE);
    zmq_send(z->rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->rep, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(z->rep, "", 0, 0);
}

static void *zap_main(void *arg) {
    core_curve_zap *z = arg;
    for (;;) {
        zmq_pollitem_t it[2] = {{z->rep, 0, ZMQ_POLLIN, 0}, {z->ctl_in, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (it[1].revents & ZMQ_POLLIN) break;
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t f[8];
        int nf = 0, more = 1, failed = 0;
        while (more) {
            zmq_msg_t tmp;
            zmq_msg_t *dst = nf < 8 ? &f[nf] : &tmp;
            zmq_msg_init(dst);
            if (zmq_msg_recv(dst, z->rep, 0) < 0) {
                zmq_msg_close(dst);
                failed = 1;
                break;
            }
            more = zmq_msg_more(dst);
            if (dst == &tmp) zmq_msg_close(&tmp), nf = 9; /* too many frames: malformed */
            else nf++;
        }
        if (!failed) zap_answer(z, f, nf > 8 ? 0 : nf);
        for (int i = 0; i < (nf > 8 ? 8 : nf); i++) zmq_msg_close(&f[i]);
        if (failed && errno == ETERM) break;
    }
    return NULL;
}

core_curve_zap *core_curve_zap_start(void *zmq_ctx, const char *const *allow, int n_allow, const char *who) {
    if (n_allow < 1 || n_allow > ZAP_MAX_ALLOW) return core_error("ZAP handler: 1..%d allowed keys, got %d", ZAP_MAX_ALLOW, n_allow), NULL;
    core_curve_zap *z = calloc(1, sizeof *z);
    if (!z) return core_error("out of memory"), NULL;
    z->ctx = zmq_ctx;
    snprintf(z->who, sizeof z->who, "%s", who ? who : "vgrpo");
    for (int a = 0; a < n_allow; a++)
        if (!allow[a] || strlen(allow[a]) != CORE_CURVE_Z85_LEN || !zmq_z85_decode(z->allow[a], allow[a])) {
            free(z);
            return core_error("ZAP handler: allowed key %d is not %d Z85 characters", a, CORE_CURVE_Z85_LEN), NULL;
        }
    z->n_allow = n_allow;
    snprintf(z->ctl_ep, sizeof z->ctl_ep, "inproc://vgrpo-zap-stop-%p", (void *)z);
    int linger = 0;
    z->rep = zmq_socket(zmq_ctx, ZMQ_REP);
    z->ctl_in = zmq_socket(zmq_ctx, ZMQ_PAIR);
    z->ctl_out = zmq_socket(zmq_ctx, ZMQ_PAIR);
    if (!z->rep || !z->ctl_in || !z->ctl_out) {
        core_error("ZAP handler: cannot create its sockets: %s", zmq_strerror(errno));
        goto fail;
    }
    zmq_setsockopt(z->rep, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(z->ctl_in, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(z->ctl_out, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(z->rep, "inproc://zeromq.zap.01")) {
        core_error("ZAP handler: cannot bind inproc://zeromq.zap.01 (one handler per context): %s", zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(z->ctl_in, z->ctl_ep) || zmq_connect(z->ctl_out, z->ctl_ep)) {
        core_error("ZAP handler: its stop channel: %s", zmq_strerror(errno));
        goto fail;
    }
    if (pthread_create(&z->thread, NULL, zap_main, z)) {
        core_error("ZAP handler: cannot start its thread");
        goto fail;
    }
    z->started = 1;
    return z;
fail:
    if (z->rep) zmq_close(z->rep);
    if (z->ctl_in) zmq_close(z->ctl_in);
    if (z->ctl_out) zmq_close(z->ctl_out);
    free(z);
    return NULL;
}

void core_curve_zap_stop(core_curve_zap *z) {
    if (!z) return;
    if (z->started) {
        zmq_send(z->ctl_out, "", 0, 0);
        pthread_join(z->thread, NULL);
    }
    zmq_close(z->rep);
    zmq_close(z->ctl_in);
    zmq_close(z->ctl_out);
    free(z);
}
