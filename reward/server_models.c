/* reward/server_models.c — the reward server's learned-scorer models (reward/server.h reward_server_attach_models;
 * apart from server_requests.c so that the message handling links without the CLIP, as the fuzz targets do). */
#include <stdlib.h>

#include "core/error.h"
#include "reward/learned.h"
#include "reward/server.h"

int reward_server_attach_models(reward_server_config *cfg, const char *models, const char *frames, int64_t video_frames) {
    reward_frames fr;
    int n = 0;
    char **names = NULL, **dirs = NULL;
    if (reward_frames_parse(frames, &fr)) return core_error_push("--frames: ");
    if (reward_models_parse(models, &n, &names, &dirs)) return -1;
    int rc = reward_models_attach(cfg->scorers, cfg->n_scorers, n, (const char *const *)names,
                                  (const char *const *)dirs, &fr, video_frames, "--models");
    free(names);
    cfg->model_act_bytes = 0;
    for (int i = 0; !rc && i < cfg->n_scorers; i++)
        if (cfg->scorers[i].model) cfg->model_act_bytes += reward_model_act_bytes(cfg->scorers[i].model, video_frames, 1);
    return rc;
}

void reward_server_detach_models(reward_server_config *cfg) { reward_models_detach(cfg->scorers, cfg->n_scorers); }
