/* tests/test_ctl_msg.c — the controller's hello rules (trainer/net/ctl_msg.h), without sockets: in the hello phase a
 * registered worker's hello from a new routing id with its first hashes moves it there (rollout/worker.c connects
 * afresh when it did not see its handshake succeed, and the first connection may have delivered the hello), with
 * other hashes it is refused as a second worker of that name and keeps its routing id; outside the hello phase it is
 * refused; a second hello from the same routing id is refused. */
#include <jansson.h>
#include <string.h>

#include "core/log.h"
#include "core/wire.h"
#include "tests/test.h"
#include "trainer/net/ctl_msg.h"

/* ctl_msg_handle of a hello {client, policy_version 0, model_xxh64 hash} from routing id rid. */
static int hello(ctl_state *s, const char *rid, const char *client, const char *hash, ctl_event *ev, ctl_reply *r) {
    json_t *f = json_pack("{s:s, s:i, s:s, s:[s]}", "client", client, "policy_version", 0, "model_xxh64", hash,
                          "experts", "transformer");
    core_wire_built b;
    core_wire_msg m;
    REQUIRE(f && core_wire_build(CORE_WIRE_HELLO, "hello", f, NULL, 0, &b) == 0);
    json_decref(f);
    REQUIRE(core_wire_parse(b.frames, b.n_frames, NULL, &m) == 0);
    memset(ev, 0, sizeof *ev), memset(r, 0, sizeof *r);
    const int rc = ctl_msg_handle(s, rid, strlen(rid), &m, ev, r);
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    return rc;
}

TEST(ctl_hello_from_a_new_connection) {
    const core_log_level level = core_log_get_level();
    core_log_set_level(CORE_LOG_OFF);
    static ctl_state s;
    memset(&s, 0, sizeof s);
    s.phase = CTL_HELLO, s.want = 2;
    ctl_event ev;
    ctl_reply r;
    const char *hx = "00000000000000aa", *other = "00000000000000bb";
    REQUIRE_OK(hello(&s, "A", "worker-0", hx, &ev, &r));
    CHECK(s.n == 1 && ev.registered && ev.progress && !r.send);
    /* the same worker from routing id B, the same hash: moved to B, no reply, not a new worker */
    REQUIRE_OK(hello(&s, "B", "worker-0", hx, &ev, &r));
    CHECK_MSG(!r.send && s.n == 1 && ev.worker == 0 && ev.registered && !ev.progress, "reply %d (%s), %d workers",
              r.send, r.reason, s.n);
    CHECK(s.w[0].rid_len == 1 && s.w[0].rid[0] == 'B' && ctl_msg_find(&s, "A", 1) == -1 && ctl_msg_find(&s, "B", 1) == 0);
    /* from C with another model hash: refused, still at B */
    REQUIRE_OK(hello(&s, "C", "worker-0", other, &ev, &r));
    CHECK_MSG(r.send && strstr(r.reason, "already connected") && s.w[0].rid[0] == 'B' && s.n == 1, "%s", r.reason);
    /* a second hello from B itself: refused */
    REQUIRE_OK(hello(&s, "B", "worker-0", hx, &ev, &r));
    CHECK(r.send && strstr(r.reason, "a second time"));
    /* another worker still registers; once the rollout runs, a new connection's hello is refused */
    REQUIRE_OK(hello(&s, "D", "worker-1", hx, &ev, &r));
    CHECK(s.n == 2 && !r.send);
    s.phase = CTL_ROLLOUT;
    REQUIRE_OK(hello(&s, "E", "worker-0", hx, &ev, &r));
    CHECK_MSG(r.send && strstr(r.reason, "not waiting for workers") && s.w[0].rid[0] == 'B', "%s", r.reason);
    core_log_set_level(level);
}
