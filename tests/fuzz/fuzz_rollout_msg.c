/* tests/fuzz/fuzz_rollout_msg.c — libFuzzer target for the controller <-> worker messages (core/wire_rollout.c,
 * `make fuzz`): the input (its last byte aside) is cut into frames by tests/fuzz/fuzz_frames.h; a message that passes core_wire_parse goes through
 * core_rollout_request_parse and core_trajectory_reply_parse (against a request of two samples, uids 3 and 9, whose
 * return flags come from the input's last byte). Both must either fail cleanly (nothing left allocated: the leak
 * checker sees the rest) or return results whose uids match the request and whose trajectories pass
 * core_traj_validate (full ones, and stored ranges with the step means: seed reply_traj_range_means). Any crash,
 * sanitizer report or leak is a finding. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"
#include "core/wire_rollout.h"
#include "tests/fuzz/fuzz_frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const uint8_t flags = data[size - 1];
    size--;
    core_wire_frame fr[17];
    const int k = fuzz_cut_frames(data, size, 15, fr);
    if (k < 0) return 0;
    core_wire_limits lim = {.max_header_bytes = 8192, .max_frame_bytes = 4096, .max_total_bytes = 20000, .max_tensors = 16};
    core_wire_msg m;
    if (core_wire_parse(fr, k + 1, &lim, &m) != 0) return 0;
    core_rollout_request req;
    if (core_rollout_request_parse(&m, &req) == 0) {
        for (int j = 0; j < req.n; j++)
            if (req.samples[j].uid > 0xffffffffull || !req.samples[j].prompt) abort();
        core_rollout_request_free(&req);
    }
    core_rollout_sample s[2] = {{.uid = 3, .prompt_index = 0, .prompt = "a"}, {.uid = 9, .prompt_index = 1, .prompt = "b"}};
    core_rollout_request want = {.policy_version = flags >> 4, .return_trajectories = flags & 1, .return_videos = (flags >> 1) & 1,
                                 .return_velocities = (flags & 1) && ((flags >> 2) & 1), .n = 1 + ((flags >> 3) & 1),
                                 .samples = s};
    core_rollout_result res[2];
    const uint8_t *videos;
    int64_t vshape[4];
    if (core_trajectory_reply_parse(&m, &want, res, &videos, vshape) == 0) {
        for (int j = 0; j < want.n; j++) {
            if (res[j].traj.uid != s[j].uid) abort();
            if (want.return_trajectories && (!res[j].traj.latents || core_traj_validate(&res[j].traj, "fuzz"))) abort();
            core_rollout_result_free(&res[j]);
        }
        if (want.return_videos && !videos) abort();
    }
    core_wire_msg_free(&m);
    return 0;
}
