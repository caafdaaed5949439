/* tests/fuzz/fuzz_ctl_msg.c — libFuzzer target for the controller's message handling (trainer/net/ctl_msg.c, `make
 * fuzz`), in process, no sockets.
 *
 * Input: byte 0 picks the phase (waiting for 3 hellos with 1 registered, a rollout of 2 chunks of 2 samples each
 * handed to worker-0 and worker-1, a weight sync of version 1, the shutdown, idle) and the rollout's return flags;
 * then records [sender: 1 byte, 0..3 = routing ids "A".."D" ("A" is worker-0, "B" worker-1 except in the hello
 * phase), length: u16 little-endian, message: length bytes cut into frames by tests/fuzz/fuzz_frames.h]. A message
 * that passes core_wire_parse goes through ctl_msg_handle, one that does not through ctl_msg_refuse.
 * Checks (abort = finding): a reply asked for has a code and an id; no event is both progress and a reply; the
 * worker count stays within the phase's bounds and ids stay unique; a finished chunk's results have the request's
 * uids in order; a chunk finishes at most once. Any crash, sanitizer report or leak is a finding. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/wire.h"
#include "trainer/net/ctl_msg.h"
#include "tests/fuzz/fuzz_frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet = 0;
    if (!quiet) core_log_set_level(CORE_LOG_OFF), quiet = 1;
    if (size < 1) return 0;
    const uint8_t sel = data[0];
    size_t pos = 1;
    ctl_state s;
    memset(&s, 0, sizeof s);
    const ctl_phase phases[5] = {CTL_HELLO, CTL_ROLLOUT, CTL_SYNC, CTL_SHUTDOWN, CTL_IDLE};
    s.phase = phases[sel % 5];
    const char *rids[4] = {"A", "B", "C", "D"};
    const int pre = s.phase == CTL_HELLO ? 1 : 2;
    for (int w = 0; w < pre; w++) {
        snprintf(s.w[w].id, sizeof s.w[w].id, "worker-%d", w);
        s.w[w].rid[0] = (uint8_t)rids[w][0];
        s.w[w].rid_len = 1;
    }
    s.n = pre;
    s.want = 3;
    core_rollout_sample smp[4] = {{.uid = 3, .prompt = "a"}, {.uid = 4, .prompt = "a"}, {.uid = 8, .prompt_index = 1, .prompt = "b"},
                                  {.uid = 9, .prompt_index = 1, .prompt = "b"}};
    core_rollout_request reqs[2];
    const char ids[2][40] = {"r0-0", "r0-1"};
    core_rollout_result res[4];
    uint8_t done[2] = {0, 0};
    memset(res, 0, sizeof res);
    for (int k = 0; k < 2; k++)
        reqs[k] = (core_rollout_request){.policy_version = 0, .return_trajectories = (sel >> 3) & 1,
                                         .return_videos = (sel >> 4) & 1, .n = 2, .samples = smp + 2 * k};
    if (s.phase == CTL_ROLLOUT) {
        s.reqs = reqs, s.ids = ids, s.n_chunks = 2, s.chunk = 2, s.res = res, s.chunk_done = done;
        s.w[0].busy = 1, s.w[1].busy = 2;
    }
    s.version = 1, s.model_hash = 0x00000000000000aaull;
    snprintf(s.end_id, sizeof s.end_id, "w1-end");
    while (pos + 3 <= size) {
        const char *rid = rids[data[pos] % 4];
        size_t len = (size_t)data[pos + 1] | ((size_t)data[pos + 2] << 8);
        pos += 3;
        if (len > size - pos) len = size - pos;
        core_wire_frame fr[9];
        const int k = fuzz_cut_frames(data + pos, len, 7, fr);
        pos += len;
        if (k < 0) continue;
        core_wire_limits lim = {.max_header_bytes = 8192, .max_frame_bytes = 8192, .max_total_bytes = 40000, .max_tensors = 40};
        core_wire_msg m;
        ctl_reply reply;
        ctl_event ev;
        if (core_wire_parse(fr, k + 1, &lim, &m)) {
            ctl_msg_refuse(&s, rid, 1, "bad_request", "unparsable", &reply);
            if (!reply.send || !reply.code[0]) abort();
            continue;
        }
        const int before = s.n;
        const int rc = ctl_msg_handle(&s, rid, 1, &m, &ev, &reply);
        if (reply.send && (!reply.code[0] || rc != 0 || ev.progress)) abort();
        if (rc != 0 && ev.progress) abort();
        if (s.n < before || s.n > (s.phase == CTL_HELLO ? s.want : pre) || s.n > CTL_MAX_WORKERS) abort();
        for (int a = 0; a < s.n; a++)
            for (int b = a + 1; b < s.n; b++)
                if (!strcmp(s.w[a].id, s.w[b].id)) abort();
        if (ev.chunk >= 0) {
            if (ev.chunk > 1 || !done[ev.chunk] || !ev.progress) abort();
            for (int j = 0; j < 2; j++)
                if (res[2 * ev.chunk + j].traj.uid != smp[2 * ev.chunk + j].uid) abort();
            if (reqs[ev.chunk].return_videos && !ev.videos) abort();
        }
        core_wire_msg_free(&m);
    }
    for (int k = 0; k < 2; k++)
        if (done[k])
            for (int j = 0; j < 2; j++) core_rollout_result_free(&res[2 * k + j]);
    return 0;
}
