/* cli/cmd_vae_decode.c — `vgrpo vae-decode --vae DIR --latents IN.safetensors --out OUT.safetensors`: decodes tensor
 * `latents` F32 (or BF16/F16) [B, z_dim, T, h, w] exactly as diffusers' AutoencoderKLWan.decode(latents).sample
 * (no un-normalisation) and writes `video` F32 [B, 3, 1 + 4 (T - 1), H, W] (model/vae/wan_vae.h), for debugging and
 * parity checks. DIR is a vae folder or a pipeline folder (its vae/ is used). --name picks another tensor of IN;
 * --device cuda decodes on the GPU (bf16; the emulated device with VGRPO_EMULATE_DEVICE=1, as model.device cuda),
 * and --vs-cpu then decodes on the CPU too and prints the difference (scripts/gpu_check.sh's VAE row). Exit 0, 1 on
 * failure, 2 on usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/safetensors.h"
#include "kernels/kernels.h"
#include "model/dit/wan_dev_exec.h"
#include "model/vae/wan_vae.h"

/* The difference of the device's video a from the CPU's b (n values), printed as one line. */
static void print_diff(const char *device, const float *a, const float *b, size_t n) {
    double e = 0, mb = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        s += d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    if (mb == 0) mb = 1;
    printf("vae-decode: %s vs cpu: max |device - cpu| %.4g, relative %.4g, mean relative %.4g over %zu values\n",
           device, e, e / mb, s / mb / (double)(n ? n : 1), n);
}

static int run(const char *vae_dir, const char *in_path, const char *name, const char *out_path, int cuda,
               int vs_cpu) {
    int rc = -1;
    vae_model *m = NULL;
    st_file *in = NULL;
    float *lat = NULL, *vid = NULL, *ref = NULL;
    st_writer *w = NULL;
    wan_dev_exec *dx = NULL;
    if (core_is_dir(out_path)) /* before the work, not at the rename after it */
        return core_error("--out %s is a folder: give the .safetensors file to write", out_path);
    if (!(m = vae_load(vae_dir))) goto done;
    if (!(in = st_open(in_path))) goto done;
    int i = st_find(in, name);
    if (i < 0) {
        core_error("%s: no tensor \"%s\"", in_path, name);
        goto done;
    }
    const st_info *t = st_info_at(in, i);
    if (t->ndim != 5) {
        core_error("%s: %s has %d dimensions, expected 5 [B, z_dim, T, h, w]", in_path, name, t->ndim);
        goto done;
    }
    for (int d = 0; d < 5; d++)
        if (t->shape[d] < 1 || t->shape[d] > (1 << 20)) {
            core_error("%s: %s dimension %d is %lld", in_path, name, d, (long long)t->shape[d]);
            goto done;
        }
    const int B = (int)t->shape[0], z = (int)t->shape[1], T = (int)t->shape[2], h = (int)t->shape[3],
              wd = (int)t->shape[4];
    if (z != vae_get_config(m)->z_dim) {
        core_error("%s: latents have %d channels, the VAE's z_dim is %d", in_path, z, vae_get_config(m)->z_dim);
        goto done;
    }
    const size_t nl = (size_t)B * z * T * h * wd;
    const int C = vae_video_channels(m), F = vae_frames_out(m, T), s = vae_spatial_factor(m);
    int64_t vs[5] = {B, C, F, (int64_t)h * s, (int64_t)wd * s};
    lat = malloc(nl * sizeof(float));
    vid = malloc((size_t)B * C * F * vs[3] * vs[4] * sizeof(float));
    if (!lat || !vid) {
        core_error("out of memory");
        goto done;
    }
    if (st_read_f32(in, name, lat, (int64_t)nl)) goto done; /* a non-finite latent is refused there, named */
    const size_t nv = (size_t)B * C * F * vs[3] * vs[4];
    char why[K_WHY_MAX];
    if (cuda && !wan_dev_exec_emulating() && !k_cuda_device(why)) {
        core_error("--device cuda: %s", why);
        goto done;
    }
    if (cuda && (wan_dev_exec_open("cuda", &dx) || vae_set_device(m, wan_dev_exec_ops(dx)))) goto done;
    if (vae_decode(m, lat, B, z, T, h, wd, vid)) goto done;
    if (cuda && vs_cpu) {
        if (!(ref = malloc(nv * sizeof(float)))) {
            core_error("out of memory");
            goto done;
        }
        const char *dn = vae_device_name(m);
        if (vae_set_device(m, NULL) || vae_decode(m, lat, B, z, T, h, wd, ref)) goto done;
        printf("vae-decode: %s, latents [%d, %d, %d, %d, %d]\n", dn, B, z, T, h, wd);
        print_diff(dn, vid, ref, nv);
    }
    int64_t bad;
    if ((bad = core_f32_first_nonfinite(vid, nv)) >= 0) {
        core_error("%s: the decoder made a non-finite pixel (element %lld is %g) from finite latents: check the VAE's "
                   "weights", vae_dir, (long long)bad, (double)vid[bad]);
        goto done;
    }
    if (!(w = st_writer_new()) || st_writer_add(w, "video", CORE_F32, 5, vs, vid) || st_writer_write(w, out_path))
        goto done;
    rc = 0;
done:
    st_writer_free(w);
    free(lat), free(vid), free(ref);
    st_close(in);
    vae_free(m);
    wan_dev_exec_close(dx);
    return rc;
}

int cmd_vae_decode(int argc, char **argv) {
    const char *vae = NULL, *lat = NULL, *out = NULL, *name = "latents", *device = "cpu";
    int vs_cpu = 0;
    const opts_spec opts[] = {
        {.name = "vae", .type = OPTS_STRING, .str = &vae, .required = 1, .meta = "DIR",
         .help = "AutoencoderKLWan folder (config.json + weights), or a pipeline folder (uses DIR/vae)"},
        {.name = "latents", .type = OPTS_STRING, .str = &lat, .required = 1, .meta = "IN.safetensors",
         .help = "tensor `latents` [B, z_dim, T, h, w] (not un-normalised)"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .required = 1, .meta = "OUT.safetensors",
         .help = "tensor `video` F32 [B, 3, 1 + 4 (T - 1), H, W] in [-1, 1]"},
        {.name = "name", .type = OPTS_STRING, .str = &name, .meta = "TENSOR",
         .help = "the tensor of IN to decode (default latents)"},
        {.name = "device", .type = OPTS_STRING, .str = &device, .meta = "cpu|cuda",
         .help = "cpu: the fp32 decoder (default); cuda: the bf16 decoder on the GPU (the emulated\n"
                 "device with VGRPO_EMULATE_DEVICE=1)"},
        {.name = "vs-cpu", .type = OPTS_FLAG, .flag = &vs_cpu,
         .help = "with --device cuda: decode on the CPU too and print the difference"},
        {0}};
    const opts_cmd cmd = {.name = "vae-decode", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return opts_exit_status(opts_fail(&cmd, stderr, "--device: expected cpu or cuda, got \"%s\"", device));
    if (vs_cpu && strcmp(device, "cuda"))
        return opts_exit_status(opts_fail(&cmd, stderr, "--vs-cpu: compares --device cuda with the CPU"));
    if (run(vae, lat, name, out, !strcmp(device, "cuda"), vs_cpu)) {
        fprintf(stderr, "vgrpo vae-decode: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
