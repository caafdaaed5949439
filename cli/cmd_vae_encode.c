/* cli/cmd_vae_encode.c — `vgrpo vae-encode --vae DIR --video IN.safetensors --out OUT.safetensors [--normalize]`:
 * encodes tensor `video` exactly as diffusers' AutoencoderKLWan.encode(video).latent_dist.mode() and writes
 * `latents` F32 [B, z_dim, 1 + (F - 1) / 4, H / factor, W / factor] (model/vae/wan_vae_encode.h); with --normalize,
 * the latents WanImageToVideoPipeline gives the transformer: (mode - latents_mean) * (1 / latents_std). The output's
 * metadata says which ("normalized": "true" / "false").
 * `video` is either F32 (or BF16/F16) [B, 3, F, H, W] in [-1, 1], as diffusers takes it, or U8 [B, F, H, W, 3]
 * (RGB frames, channel-last), mapped to 2 (u8 / 255) - 1 as diffusers' VideoProcessor.preprocess_video does for PIL
 * frames (no resizing: H and W must already be multiples of the spatial factor). F = 1 + 4 k. DIR is a vae folder or a
 * pipeline folder (its vae/ is used) with encoder weights. For debugging and parity checks. Exit 0, 1 on failure,
 * 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "model/vae/wan_vae_encode.h"

static int run(const char *vae_dir, const char *in_path, const char *out_path, int normalize) {
    int rc = -1;
    vae_encoder *e = NULL;
    st_file *in = NULL;
    float *vid = NULL, *lat = NULL;
    st_writer *w = NULL;
    core_tensor u8 = {0};
    if (core_is_dir(out_path)) /* before the work, not at the rename after it */
        return core_error("--out %s is a folder: give the .safetensors file to write", out_path);
    if (!(e = vae_encoder_load(vae_dir))) goto done;
    if (!(in = st_open(in_path))) goto done;
    int i = st_find(in, "video");
    if (i < 0) {
        core_error("%s: no tensor \"video\"", in_path);
        goto done;
    }
    const st_info *t = st_info_at(in, i);
    const int is_u8 = t->dtype == CORE_U8;
    if (t->ndim != 5) {
        core_error("%s: video has %d dimensions, expected 5 (%s)", in_path, t->ndim,
                   is_u8 ? "U8 [B, F, H, W, 3]" : "[B, 3, F, H, W]");
        goto done;
    }
    for (int d = 0; d < 5; d++)
        if (t->shape[d] < 1 || t->shape[d] > (1 << 20)) {
            core_error("%s: video dimension %d is %lld", in_path, d, (long long)t->shape[d]);
            goto done;
        }
    int B, C, F, H, W;
    if (is_u8) {
        B = (int)t->shape[0], F = (int)t->shape[1], H = (int)t->shape[2], W = (int)t->shape[3], C = (int)t->shape[4];
        if (C != 3) {
            core_error("%s: U8 video has %d channels in its last dimension, expected RGB [B, F, H, W, 3]", in_path, C);
            goto done;
        }
    } else {
        B = (int)t->shape[0], C = (int)t->shape[1], F = (int)t->shape[2], H = (int)t->shape[3], W = (int)t->shape[4];
    }
    const int T = vae_encoder_frames_out(e, F), s = vae_encoder_spatial_factor(e), z = vae_encoder_get_config(e)->z_dim;
    const size_t nv = (size_t)B * C * F * H * W;
    int64_t ls[5] = {B, z, T, H / s, W / s};
    const size_t nl = (size_t)B * z * T * (size_t)(H / s) * (size_t)(W / s); /* 0 for a shape vae_encode refuses */
    vid = malloc(nv * sizeof(float));
    lat = malloc((nl ? nl : 1) * sizeof(float));
    if (!vid || !lat) {
        core_error("out of memory");
        goto done;
    }
    if (is_u8) {
        if (st_get(in, "video", &u8)) goto done;
        vae_video_from_u8(u8.data, B, F, H, W, vid);
    } else if (st_read_f32(in, "video", vid, (int64_t)nv)) { /* a non-finite value is refused there, named */
        goto done;
    }
    int64_t bad;
    float lo = vid[0], hi = vid[0];
    for (size_t k = 1; k < nv; k++) lo = vid[k] < lo ? vid[k] : lo, hi = vid[k] > hi ? vid[k] : hi;
    if (lo < -1.001f || hi > 1.001f)
        core_log_warn("vae-encode: %s: the video's values span [%g, %g]; the VAE expects [-1, 1] (pixel / 127.5 - 1; a "
                      "U8 video [B, F, H, W, 3] is converted so)", in_path, (double)lo, (double)hi);
    if (vae_encode(e, vid, B, C, F, H, W, lat, normalize)) goto done;
    if ((bad = core_f32_first_nonfinite(lat, nl)) >= 0) { /* finite input: the weights (or latents_std 0) */
        core_error("%s: the encoder made a non-finite latent (element %lld is %g) from a finite video (values in [%g, "
                   "%g]): check the input's range, the VAE's weights and latents_std", vae_dir, (long long)bad,
                   (double)lat[bad], (double)lo, (double)hi);
        goto done;
    }
    if (!(w = st_writer_new()) || st_writer_add(w, "latents", CORE_F32, 5, ls, lat) ||
        st_writer_set_metadata(w, "normalized", normalize ? "true" : "false") || st_writer_write(w, out_path))
        goto done;
    rc = 0;
done:
    core_tensor_free(&u8);
    st_writer_free(w);
    free(vid), free(lat);
    st_close(in);
    vae_encoder_free(e);
    return rc;
}

int cmd_vae_encode(int argc, char **argv) {
    const char *vae = NULL, *video = NULL, *out = NULL;
    int normalize = 0;
    const opts_spec opts[] = {
        {.name = "vae", .type = OPTS_STRING, .str = &vae, .required = 1, .meta = "DIR",
         .help = "AutoencoderKLWan folder (config.json + weights with the encoder), or a pipeline folder (its vae/)"},
        {.name = "video", .type = OPTS_STRING, .str = &video, .required = 1, .meta = "IN.safetensors",
         .help = "tensor `video`: F32/BF16/F16 [B, 3, F, H, W] in [-1, 1], or U8 RGB [B, F, H, W, 3]; F = 1 + 4k"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .required = 1, .meta = "OUT.safetensors",
         .help = "tensor `latents` F32 [B, z_dim, 1 + (F - 1) / 4, H / factor, W / factor]: the posterior mode"},
        {.name = "normalize", .type = OPTS_FLAG, .flag = &normalize,
         .help = "write (mode - latents_mean) / latents_std, as WanImageToVideoPipeline conditions on"},
        {0}};
    const opts_cmd cmd = {.name = "vae-encode", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (run(vae, video, out, normalize)) {
        fprintf(stderr, "vgrpo vae-encode: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
