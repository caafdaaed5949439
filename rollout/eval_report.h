/* rollout/eval_report.h — what `vgrpo eval` writes (cli/cmd_eval.c runs the job): the results of the fixed eval set
 * as the rollout workers return them, in any order and chunking, kept by uid (prompt i, sample k has uid i * K + k).
 * Into the output folder:
 *   videos/pNNNN_sK.mp4   every sample's video, written as it arrives;
 *   sheets/pNNNN.png      one contact sheet per prompt (the prompt as its title; rows = samples, labelled with the
 *                         reward; image to video: each row starts with the input image), written when the prompt's
 *                         K samples are in;
 *   eval.json             per prompt and sample: uid, rewards per scorer, total, video file, xxh64 of the raw video;
 *                         per scorer (and the total): n, mean, std (population), min, max, standard error of the mean
 *                         (sample std / sqrt(n)); timing in "throughput" (samples/s, denoising steps/s); written
 *                         atomically (tmp + rename) once every sample is in.
 * An earlier eval's videos and sheets in the folder are removed first, so the folder holds this eval's files only. */
#ifndef ROLLOUT_EVAL_REPORT_H
#define ROLLOUT_EVAL_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "core/prompts.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"

typedef struct eval_report eval_report;

/* Creates out/videos and out/sheets (cleared of an earlier eval's files) for prompts p (borrowed; kept until free) x
 * K samples. NULL with an error naming the folder, or a set of more than 2^31 samples. */
eval_report *eval_report_open(const char *out, const core_prompts *p, int K);

/* Takes a chunk of results (sample order; videos [n, vshape] U8): writes each sample's mp4, and the contact sheet of
 * every prompt it completes. -1 with an error (a uid answered twice or out of range, scorers or video shape unlike
 * the earlier samples', a file that cannot be written). */
int eval_report_add(eval_report *E, const core_rollout_result *res, int n, const uint8_t *videos, const int64_t vshape[4]);

/* Samples received so far. */
int eval_report_done(const eval_report *E);

/* Writes eval.json (recipe_path, checkpoint (may be NULL) and the recipe's seed, eta and steps recorded) and prints
 * the table of per-scorer statistics and the throughput to table. -1 when a sample is missing or the file cannot be
 * written. */
int eval_report_write(eval_report *E, const core_recipe *r, const char *recipe_path, const char *checkpoint,
                      int workers, double seconds, FILE *table);

void eval_report_free(eval_report *E);

#endif
