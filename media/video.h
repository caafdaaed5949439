/* media/video.h — mp4 writer and video reader (libavformat / libavcodec / libswscale).
 *
 * Writer: U8 RGB frames [F, H, W, 3] -> an mp4 file. H.264 through libx264 (yuv420p, CRF 18, preset "fast")
 * when the linked libavcodec has it, else the built-in MPEG-4 part 2 encoder (yuv420p, fixed quantiser 2);
 * the encoder used is returned. yuv420p needs even sizes, so an odd width or height is PADDED to the next even
 * number by replicating the last column / row (never scaled): a 33 x 17 video is stored, and reads back, as
 * 34 x 18 whose first 33 x 17 pixels are the video. RGB -> YUV uses swscale's BT.601 limited-range matrix and
 * the stream is tagged so (SMPTE 170M, MPEG range). The file is written to "<path>.partial" and renamed to
 * <path> only after the encoder is drained and the trailer written, so a failure never leaves a broken <path>.
 *
 * Reader: any container/codec libavformat can open -> U8 RGB [F, H, W, 3] (first video stream; YUV -> RGB with
 * the stream's own matrix and range). For round-trip tests and for scoring external videos. */
#ifndef MEDIA_VIDEO_H
#define MEDIA_VIDEO_H

#include <stdint.h>
#include "core/tensor.h"

/* Writes frames `rgb` (U8, [frames, height, width, 3], row-major, contiguous) to `path` as mp4 at `fps` frames
 * per second (> 0, may be fractional, e.g. 16 or 29.97). `encoder`: NULL or "auto" (libx264 if available, else
 * "mpeg4"), "libx264" (fail if missing) or "mpeg4" (force the fallback). If `encoder_used` is not NULL it is
 * set to the encoder's name ("libx264" or "mpeg4", static storage). Sizes: 1 <= frames, 1 <= height, width
 * <= 16384; odd sizes are padded as described above. Returns 0, or -1 with an error naming `path` and, for a
 * libav failure, the libav function and av_err2str's message; on failure no file is left at `path` (a file
 * already there is not touched) and the temporary file is removed. */
int media_video_write_mp4(const char *path, const uint8_t *rgb, int frames, int height, int width, double fps,
                            const char *encoder, const char **encoder_used);

/* Same, for a tensor U8 [F, H, W, 3] (contiguous CPU). */
int media_video_write_mp4_tensor(const char *path, const core_tensor *video, double fps, const char *encoder,
                                   const char **encoder_used);

/* Decodes the first video stream of `path` into `out`: a new owned tensor U8 [F, H, W, 3] (H, W: the coded
 * display size, e.g. 34 x 18 for a 33 x 17 video written above). `max_frames` > 0 stops after that many frames
 * (0: all). If `fps` is not NULL it receives the stream's average frame rate (0 if unknown). Frames whose size
 * differs from the first frame's are an error. Returns 0, or -1 with an error naming `path` and the libav
 * function (out is left zeroed). */
int media_video_read(const char *path, int max_frames, core_tensor *out, double *fps);

/* 1 if the linked libavcodec has the libx264 encoder, else 0. */
int media_video_have_x264(void);

#endif
