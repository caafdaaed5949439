/* core/wire_zmq.c — wire messages over ZeroMQ sockets (see core/wire_zmq.h). */
#include "core/wire_zmq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

int core_zmq_recv(void *sock, int flags, core_zmq_msg *out) {
    memset(out, 0, sizeof *out);
    int cap = 8;
    if (!(out->frames = malloc(sizeof(zmq_msg_t) * (size_t)cap))) return core_error("out of memory");
    int more = 1, over = 0;
    while (more) {
        zmq_msg_t tmp, *dst = &tmp;
        if (!over && out->n == cap && cap < CORE_ZMQ_MAX_FRAMES) {
            zmq_msg_t *nf = realloc(out->frames, sizeof(zmq_msg_t) * (size_t)(cap * 2));
            if (nf) out->frames = nf, cap *= 2;
        }
        if (out->n < cap) dst = &out->frames[out->n];
        else over = 1;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, sock, out->n == 0 && !over ? flags : 0) < 0) {
            int e = errno;
            zmq_msg_close(dst);
            if (out->n == 0 && (e == EAGAIN || e == EINTR)) {
                free(out->frames);
                memset(out, 0, sizeof *out);
                return 1;
            }
            core_zmq_msg_close(out);
            return core_error("zmq receive: %s", zmq_strerror(e));
        }
        more = zmq_msg_more(dst);
        if (dst == &tmp) zmq_msg_close(&tmp);
        else out->n++;
    }
    if (over) {
        core_zmq_msg_close(out);
        return core_error("zmq receive: message of more than %d frames dropped", CORE_ZMQ_MAX_FRAMES);
    }
    return 0;
}

void core_zmq_msg_close(core_zmq_msg *m) {
    for (int i = 0; i < m->n; i++) zmq_msg_close(&m->frames[i]);
    free(m->frames);
    memset(m, 0, sizeof *m);
}

int core_zmq_parse(const core_zmq_msg *m, int first, const core_wire_limits *lim, core_wire_msg *out) {
    memset(out, 0, sizeof *out);
    if (m->n - first < 1) return core_error("wire: empty message");
    core_wire_frame *wf = malloc(sizeof *wf * (size_t)(m->n - first));
    if (!wf) return core_error("out of memory");
    for (int i = first; i < m->n; i++)
        wf[i - first] = (core_wire_frame){zmq_msg_data(&m->frames[i]), zmq_msg_size(&m->frames[i])};
    int rc = core_wire_parse(wf, m->n - first, lim, out);
    free(wf);
    return rc;
}

static int send_flags(void *sock, const void *rid, size_t rid_len, const core_wire_built *b, int flags) {
    if (rid && zmq_send(sock, rid, rid_len, ZMQ_SNDMORE | flags) < 0) return core_error("zmq send: %s", zmq_strerror(errno));
    for (int i = 0; i < b->n_frames; i++)
        if (zmq_send(sock, b->frames[i].data, b->frames[i].len, (i + 1 < b->n_frames ? ZMQ_SNDMORE : 0) | flags) < 0)
            return core_error("zmq send: %s", zmq_strerror(errno));
    return 0;
}

int core_zmq_send(void *sock, const void *rid, size_t rid_len, const core_wire_built *b) {
    return send_flags(sock, rid, rid_len, b, 0);
}

int core_zmq_send_nowait(void *sock, const void *rid, size_t rid_len, const core_wire_built *b) {
    return send_flags(sock, rid, rid_len, b, ZMQ_DONTWAIT);
}

int core_zmq_bind(void *sock, const char *endpoint) {
    const int ipc = !strncmp(endpoint, "ipc://", 6);
    const mode_t old = ipc ? umask(077) : 0;
    int rc = zmq_bind(sock, endpoint), e = errno;
    if (ipc) umask(old);
    if (rc) return core_error("cannot bind %s: %s", endpoint, zmq_strerror(e));
    if (ipc && endpoint[6] != '@' && chmod(endpoint + 6, 0600)) /* '@': Linux abstract namespace, no file */
        return core_error("cannot make %s private (chmod 0600): %s", endpoint + 6, strerror(errno));
    return 0;
}

int core_zmq_send_fields(void *sock, const void *rid, size_t rid_len, core_wire_type type, const char *id,
                         const json_t *fields) {
    core_wire_built b;
    if (core_wire_build(type, id, fields, NULL, 0, &b)) return -1;
    int rc = core_zmq_send(sock, rid, rid_len, &b);
    core_wire_built_free(&b);
    return rc;
}

static int send_error(void *sock, const void *rid, size_t rid_len, const char *id, const char *code,
                      const char *reason, int flags) {
    char clean[1024];
    size_t k = 0;
    for (const char *p = reason ? reason : ""; *p && k + 1 < sizeof clean; p++)
        clean[k++] = (*p >= 32 && *p < 127) ? *p : '?';
    clean[k] = 0;
    json_t *f = json_pack("{s:s, s:s, s:b}", "code", code, "reason", clean, "retryable", 0);
    core_wire_built b;
    int rc = core_wire_build(CORE_WIRE_ERROR, id ? id : "", f, NULL, 0, &b);
    json_decref(f);
    if (rc) return -1;
    rc = send_flags(sock, rid, rid_len, &b, flags);
    core_wire_built_free(&b);
    return rc;
}

int core_zmq_send_error(void *sock, const void *rid, size_t rid_len, const char *id, const char *code,
                        const char *reason) {
    return send_error(sock, rid, rid_len, id, code, reason, 0);
}

int core_zmq_send_error_nowait(void *sock, const void *rid, size_t rid_len, const char *id, const char *code,
                               const char *reason) {
    return send_error(sock, rid, rid_len, id, code, reason, ZMQ_DONTWAIT);
}
