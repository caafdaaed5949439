/* media/video.c — mp4 writer (libx264 or MPEG-4 part 2 via libavcodec, mp4 via libavformat) and a video
 * reader to U8 RGB. The encode/decode loops follow libavcodec's send/receive API as documented in
 * libavcodec/avcodec.h (send frames, drain packets, send NULL to flush, drain until AVERROR_EOF).
 *
 * libav's own log output is routed through a callback that prints nothing and keeps the last error-level line
 * per thread, which is appended to our error message (library code never prints). */
#include "media/video.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>

#include "core/error.h"

/* ---- libav log capture ---- */

static _Thread_local char video_last_line[256];
static pthread_once_t video_log_once = PTHREAD_ONCE_INIT;

static void video_log_capture(void *avcl, int level, const char *fmt, va_list vl) {
    if (level > AV_LOG_ERROR) return;
    int print_prefix = 1;
    char line[256];
    va_list cp;
    va_copy(cp, vl);
    av_log_format_line2(avcl, level, fmt, cp, line, sizeof line, &print_prefix);
    va_end(cp);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    if (n > 0) snprintf(video_last_line, sizeof video_last_line, "%s", line);
}

static void video_log_setup(void) { av_log_set_callback(video_log_capture); }

static void video_av_begin(void) {
    pthread_once(&video_log_once, video_log_setup);
    video_last_line[0] = '\0';
}

/* Records "<path>: <fn> failed: <av_err2str>" (+ libav's last error line); returns -1. */
static int video_av_fail(const char *path, const char *fn, int err) {
    char msg[AV_ERROR_MAX_STRING_SIZE];
    av_strerror(err, msg, sizeof msg);
    if (video_last_line[0])
        return core_error("video %s: %s failed: %s (libav: %s)", path, fn, msg, video_last_line);
    return core_error("video %s: %s failed: %s", path, fn, msg);
}

int media_video_have_x264(void) { return avcodec_find_encoder_by_name("libx264") != NULL; }

/* ---- writer ---- */

/* Sends `frame` (NULL: flush) and writes every packet the encoder returns. */
static int encode_and_write(AVCodecContext *cc, AVFrame *frame, AVPacket *pkt, AVFormatContext *oc,
                            AVStream *st, const char *path) {
    int ret = avcodec_send_frame(cc, frame);
    if (ret < 0) return video_av_fail(path, "avcodec_send_frame", ret);
    for (;;) {
        ret = avcodec_receive_packet(cc, pkt);
        if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return 0;
        if (ret < 0) return video_av_fail(path, "avcodec_receive_packet", ret);
        av_packet_rescale_ts(pkt, cc->time_base, st->time_base);
        pkt->stream_index = st->index;
        ret = av_interleaved_write_frame(oc, pkt); /* takes the packet's reference */
        if (ret < 0) return video_av_fail(path, "av_interleaved_write_frame", ret);
    }
}

/* Copies one H x W RGB frame into an H2 x W2 buffer with row stride dst_stride bytes, replicating the last column
 * and row. */
static void pad_frame(uint8_t *dst, size_t dst_stride, const uint8_t *src, int h, int w, int h2, int w2) {
    for (int y = 0; y < h2; y++) {
        const uint8_t *s = src + (size_t)(y < h ? y : h - 1) * w * 3;
        uint8_t *d = dst + (size_t)y * dst_stride;
        memcpy(d, s, (size_t)w * 3);
        for (int x = w; x < w2; x++) memcpy(d + (size_t)x * 3, s + (size_t)(w - 1) * 3, 3);
    }
}

int media_video_write_mp4(const char *path, const uint8_t *rgb, int frames, int height, int width, double fps,
                            const char *encoder, const char **encoder_used) {
    if (!path || !path[0]) return core_error("video: output path is empty");
    if (!rgb) return core_error("video %s: no frame data", path);
    if (frames < 1 || height < 1 || width < 1 || height > 16384 || width > 16384)
        return core_error("video %s: bad video shape [%d, %d, %d, 3] (need F >= 1, 1 <= H, W <= 16384)", path,
                          frames, height, width);
    if (!(fps > 0 && fps <= 1000)) return core_error("video %s: fps %g out of range (0, 1000]", path, fps);

    video_av_begin();
    const AVCodec *codec = NULL;
    int is_x264 = 0;
    if (!encoder || !strcmp(encoder, "auto") || !strcmp(encoder, "libx264")) {
        codec = avcodec_find_encoder_by_name("libx264");
        is_x264 = codec != NULL;
        if (!codec && encoder && !strcmp(encoder, "libx264"))
            return core_error("video %s: encoder libx264 is not in this libavcodec", path);
    } else if (strcmp(encoder, "mpeg4") != 0) {
        return core_error("video %s: unknown encoder '%s' (auto, libx264, mpeg4)", path, encoder);
    }
    if (!codec) codec = avcodec_find_encoder(AV_CODEC_ID_MPEG4);
    if (!codec) return core_error("video %s: neither libx264 nor the mpeg4 encoder is in this libavcodec", path);

    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.partial", path) >= sizeof tmp)
        return core_error("video %s: path too long", path);

    int w2 = (width + 1) & ~1, h2 = (height + 1) & ~1;
    AVFormatContext *oc = NULL;
    AVCodecContext *cc = NULL;
    AVFrame *yuv = NULL;
    AVPacket *pkt = NULL;
    struct SwsContext *sws = NULL;
    uint8_t *padbuf = NULL;
    int io_open = 0, ret, rc = -1;

    ret = avformat_alloc_output_context2(&oc, NULL, "mp4", tmp);
    if (ret < 0 || !oc) {
        video_av_fail(path, "avformat_alloc_output_context2", ret < 0 ? ret : AVERROR(ENOMEM));
        goto done;
    }
    AVStream *st = avformat_new_stream(oc, NULL);
    cc = avcodec_alloc_context3(codec);
    pkt = av_packet_alloc();
    yuv = av_frame_alloc();
    if (!st || !cc || !pkt || !yuv) {
        core_error("video %s: out of memory setting up the encoder", path);
        goto done;
    }
    AVRational rate = av_d2q(fps, 65535); /* MPEG-4 part 2 needs a time base denominator < 2^16 */
    cc->codec_id = codec->id;
    cc->width = w2;
    cc->height = h2;
    cc->pix_fmt = AV_PIX_FMT_YUV420P;
    cc->framerate = rate;
    cc->time_base = av_inv_q(rate);
    cc->sample_aspect_ratio = (AVRational){1, 1};
    cc->color_range = AVCOL_RANGE_MPEG;
    cc->colorspace = AVCOL_SPC_SMPTE170M;
    if (is_x264) {
        av_opt_set(cc->priv_data, "preset", "fast", 0);
        av_opt_set(cc->priv_data, "crf", "18", 0);
    } else {
        cc->flags |= AV_CODEC_FLAG_QSCALE;
        cc->global_quality = FF_QP2LAMBDA * 2;
        cc->gop_size = 12;
    }
    if (oc->oformat->flags & AVFMT_GLOBALHEADER) cc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    ret = avcodec_open2(cc, codec, NULL);
    if (ret < 0) {
        video_av_fail(path, "avcodec_open2", ret);
        goto done;
    }
    ret = avcodec_parameters_from_context(st->codecpar, cc);
    if (ret < 0) {
        video_av_fail(path, "avcodec_parameters_from_context", ret);
        goto done;
    }
    st->time_base = cc->time_base;
    st->avg_frame_rate = rate;

    ret = avio_open(&oc->pb, tmp, AVIO_FLAG_WRITE);
    if (ret < 0) {
        char msg[AV_ERROR_MAX_STRING_SIZE];
        av_strerror(ret, msg, sizeof msg);
        core_error("video %s: avio_open failed: %s (creating the temporary file %s)", path, msg, tmp);
        goto done;
    }
    io_open = 1;
    ret = avformat_write_header(oc, NULL);
    if (ret < 0) {
        video_av_fail(path, "avformat_write_header", ret);
        goto done;
    }

    yuv->format = AV_PIX_FMT_YUV420P;
    yuv->width = w2;
    yuv->height = h2;
    ret = av_frame_get_buffer(yuv, 0);
    if (ret < 0) {
        video_av_fail(path, "av_frame_get_buffer", ret);
        goto done;
    }
    sws = sws_getContext(w2, h2, AV_PIX_FMT_RGB24, w2, h2, AV_PIX_FMT_YUV420P,
                         SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INP, NULL, NULL, NULL);
    if (!sws) {
        core_error("video %s: sws_getContext (RGB24 -> YUV420P, %dx%d) failed", path, w2, h2);
        goto done;
    }
    /* RGB is full range; YUV is BT.601 limited range, as tagged on the stream. */
    sws_setColorspaceDetails(sws, sws_getCoefficients(SWS_CS_ITU601), 1, sws_getCoefficients(SWS_CS_ITU601), 0, 0,
                             1 << 16, 1 << 16);
    /* Every frame goes through a staging buffer whose rows are 64-byte aligned with 64 spare bytes at the end:
     * swscale's SIMD paths read past the last pixel of a row and of the image (an ASan run crashed on a caller's
     * tightly packed buffer ending at a page boundary), so it must never read the caller's memory directly. */
    const size_t stage_stride = ((size_t)w2 * 3 + 63) & ~(size_t)63;
    if (!(padbuf = malloc(stage_stride * (size_t)h2 + 64))) {
        core_error("video %s: out of memory (staging buffer %dx%d)", path, w2, h2);
        goto done;
    }
    memset(padbuf, 0, stage_stride * (size_t)h2 + 64);

    size_t frame_bytes = (size_t)width * height * 3;
    for (int f = 0; f < frames; f++) {
        pad_frame(padbuf, stage_stride, rgb + (size_t)f * frame_bytes, height, width, h2, w2);
        const uint8_t *src = padbuf;
        ret = av_frame_make_writable(yuv);
        if (ret < 0) {
            video_av_fail(path, "av_frame_make_writable", ret);
            goto done;
        }
        const uint8_t *planes[1] = {src};
        int strides[1] = {(int)stage_stride};
        sws_scale(sws, planes, strides, 0, h2, yuv->data, yuv->linesize);
        yuv->pts = f;
        if (encode_and_write(cc, yuv, pkt, oc, st, path)) goto done;
    }
    if (encode_and_write(cc, NULL, pkt, oc, st, path)) goto done; /* flush: drain delayed frames */
    ret = av_write_trailer(oc);
    if (ret < 0) {
        video_av_fail(path, "av_write_trailer", ret);
        goto done;
    }
    ret = avio_closep(&oc->pb);
    io_open = 0;
    if (ret < 0) {
        video_av_fail(path, "avio_closep", ret);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        core_error("video %s: rename from %s failed: %s", path, tmp, strerror(errno));
        goto done;
    }
    if (encoder_used) *encoder_used = is_x264 ? "libx264" : "mpeg4";
    rc = 0;

done:
    if (io_open) avio_closep(&oc->pb);
    if (rc != 0) unlink(tmp);
    free(padbuf);
    sws_freeContext(sws);
    av_frame_free(&yuv);
    av_packet_free(&pkt);
    avcodec_free_context(&cc);
    avformat_free_context(oc);
    return rc;
}

int media_video_write_mp4_tensor(const char *path, const core_tensor *video, double fps, const char *encoder,
                                   const char **encoder_used) {
    if (!video || video->dtype != CORE_U8 || video->ndim != 4 || video->shape[3] != 3 ||
        !core_tensor_is_contiguous(video) || video->device != CORE_CPU)
        return core_error("video %s: need a contiguous CPU U8 tensor [F, H, W, 3]", path ? path : "(null)");
    if (video->shape[0] > INT32_MAX || video->shape[1] > 16384 || video->shape[2] > 16384)
        return core_error("video %s: video too large", path);
    return media_video_write_mp4(path, video->data, (int)video->shape[0], (int)video->shape[1],
                                   (int)video->shape[2], fps, encoder, encoder_used);
}

/* ---- reader ---- */

typedef struct {
    uint8_t *buf;
    size_t cap, frames;
    int w, h;
    struct SwsContext *sws;
} read_state;

/* Converts one decoded frame to RGB24 and appends it. */
static int append_frame(read_state *rs, const AVFrame *fr, const char *path) {
    if (rs->frames == 0) {
        rs->w = fr->width;
        rs->h = fr->height;
        if (rs->w < 1 || rs->h < 1) return core_error("video %s: decoded frame has size %dx%d", path, rs->w, rs->h);
    } else if (fr->width != rs->w || fr->height != rs->h) {
        return core_error("video %s: frame %zu is %dx%d, the first frame %dx%d (size changes are not supported)", path,
                          rs->frames, fr->width, fr->height, rs->w, rs->h);
    }
    size_t fb = (size_t)rs->w * rs->h * 3;
    if ((rs->frames + 1) * fb + 64 > rs->cap) { /* 64 spare bytes: swscale may store past the last pixel */
        size_t cap = rs->cap ? rs->cap * 2 : fb * 8;
        while (cap < (rs->frames + 1) * fb + 64) cap *= 2;
        uint8_t *nb = realloc(rs->buf, cap);
        if (!nb) return core_error("video %s: out of memory at frame %zu", path, rs->frames);
        rs->buf = nb;
        rs->cap = cap;
    }
    rs->sws = sws_getCachedContext(rs->sws, fr->width, fr->height, fr->format, rs->w, rs->h, AV_PIX_FMT_RGB24,
                                   SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, NULL, NULL, NULL);
    if (!rs->sws)
        return core_error("video %s: sws_getCachedContext (%s -> RGB24) failed", path,
                          av_get_pix_fmt_name(fr->format) ? av_get_pix_fmt_name(fr->format) : "?");
    int full = fr->color_range == AVCOL_RANGE_JPEG || fr->format == AV_PIX_FMT_YUVJ420P ||
               fr->format == AV_PIX_FMT_YUVJ422P || fr->format == AV_PIX_FMT_YUVJ444P;
    int cs = fr->colorspace == AVCOL_SPC_UNSPECIFIED ? SWS_CS_DEFAULT : (int)fr->colorspace;
    /* Fails harmlessly (returns -1) for RGB sources, where no matrix applies. */
    sws_setColorspaceDetails(rs->sws, sws_getCoefficients(cs), full, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0,
                             1 << 16, 1 << 16);
    uint8_t *dst[1] = {rs->buf + rs->frames * fb};
    int dst_stride[1] = {rs->w * 3};
    sws_scale(rs->sws, (const uint8_t *const *)fr->data, fr->linesize, 0, fr->height, dst, dst_stride);
    rs->frames++;
    return 0;
}

/* Drains every frame the decoder has ready. Returns 1 when max_frames is reached, 0 to go on, -1 on error. */
static int drain(AVCodecContext *dc, AVFrame *fr, read_state *rs, int max_frames, const char *path) {
    for (;;) {
        int ret = avcodec_receive_frame(dc, fr);
        if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return 0;
        if (ret < 0) return video_av_fail(path, "avcodec_receive_frame", ret);
        int r = append_frame(rs, fr, path);
        av_frame_unref(fr);
        if (r) return -1;
        if (max_frames > 0 && rs->frames >= (size_t)max_frames) return 1;
    }
}

int media_video_read(const char *path, int max_frames, core_tensor *out, double *fps) {
    memset(out, 0, sizeof *out);
    if (fps) *fps = 0;
    if (!path || !path[0]) return core_error("video: input path is empty");
    video_av_begin();
    AVFormatContext *ic = NULL;
    AVCodecContext *dc = NULL;
    AVPacket *pkt = NULL;
    AVFrame *fr = NULL;
    read_state rs = {0};
    int rc = -1, ret;

    ret = avformat_open_input(&ic, path, NULL, NULL);
    if (ret < 0) {
        video_av_fail(path, "avformat_open_input", ret);
        goto done;
    }
    ret = avformat_find_stream_info(ic, NULL);
    if (ret < 0) {
        video_av_fail(path, "avformat_find_stream_info", ret);
        goto done;
    }
    const AVCodec *dec = NULL;
    int si = av_find_best_stream(ic, AVMEDIA_TYPE_VIDEO, -1, -1, &dec, 0);
    if (si < 0) {
        video_av_fail(path, "av_find_best_stream (video)", si);
        goto done;
    }
    AVStream *st = ic->streams[si];
    dc = avcodec_alloc_context3(dec);
    pkt = av_packet_alloc();
    fr = av_frame_alloc();
    if (!dc || !pkt || !fr) {
        core_error("video %s: out of memory setting up the decoder", path);
        goto done;
    }
    ret = avcodec_parameters_to_context(dc, st->codecpar);
    if (ret < 0) {
        video_av_fail(path, "avcodec_parameters_to_context", ret);
        goto done;
    }
    ret = avcodec_open2(dc, dec, NULL);
    if (ret < 0) {
        video_av_fail(path, "avcodec_open2", ret);
        goto done;
    }
    if (fps) {
        AVRational r = st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0 ? st->avg_frame_rate : st->r_frame_rate;
        *fps = r.num > 0 && r.den > 0 ? av_q2d(r) : 0;
    }

    int full = 0;
    while (!full) {
        ret = av_read_frame(ic, pkt);
        if (ret == AVERROR_EOF) break;
        if (ret < 0) {
            video_av_fail(path, "av_read_frame", ret);
            goto done;
        }
        if (pkt->stream_index == si) {
            ret = avcodec_send_packet(dc, pkt);
            if (ret < 0 && ret != AVERROR(EAGAIN)) {
                av_packet_unref(pkt);
                video_av_fail(path, "avcodec_send_packet", ret);
                goto done;
            }
            int d = drain(dc, fr, &rs, max_frames, path);
            if (d < 0) {
                av_packet_unref(pkt);
                goto done;
            }
            full = d;
        }
        av_packet_unref(pkt);
    }
    if (!full) { /* flush delayed frames */
        ret = avcodec_send_packet(dc, NULL);
        if (ret < 0 && ret != AVERROR_EOF) {
            video_av_fail(path, "avcodec_send_packet (flush)", ret);
            goto done;
        }
        if (drain(dc, fr, &rs, max_frames, path) < 0) goto done;
    }
    if (rs.frames == 0) {
        core_error("video %s: no video frames decoded", path);
        goto done;
    }
    int64_t shape[4] = {(int64_t)rs.frames, rs.h, rs.w, 3};
    uint8_t *exact = realloc(rs.buf, rs.frames * (size_t)rs.w * rs.h * 3);
    if (exact) rs.buf = exact;
    core_tensor_wrap(out, rs.buf, CORE_U8, 4, shape);
    out->owned = 1;
    rs.buf = NULL;
    rc = 0;

done:
    free(rs.buf);
    sws_freeContext(rs.sws);
    av_frame_free(&fr);
    av_packet_free(&pkt);
    avcodec_free_context(&dc);
    avformat_close_input(&ic);
    return rc;
}
