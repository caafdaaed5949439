/* cli/cmd_dit_forward.c — `vgrpo dit-forward --model DIR --inputs IN.safetensors --out OUT.safetensors`: one
 * forward (and, given grad_output, one backward) of the Wan transformer, for debugging and parity checks.
 *
 * DIR is a transformer folder (config.json + weights) or a pipeline folder with model_index.json, whose
 * transformer/ is used (--subfolder transformer_2 picks the low-noise expert). IN holds
 *   hidden_states [B, C, F, H, W], timestep [B] or [B, S] (F32, I64, BF16 or F16; per-token when 2-D),
 *   encoder_hidden_states [B, L, text_dim], and optionally grad_output [B, C_out, F, H, W]
 * (float tensors may be F32, BF16 or F16; other tensors in the file are ignored). OUT gets `output`, and with
 * grad_output also grad_hidden_states, grad_encoder_hidden_states and grad.<parameter name> for every parameter
 * (the gradients of sum(output * grad_output)), all F32. --recompute recomputes elementwise activations in the
 * backward instead of storing them (same results, less memory). --device cuda runs the bf16 device model
 * (model/dit/wan_dev.h: bf16 weights and activations, fp32 statistics, output and gradients) on the CUDA backend
 * instead of the fp32 CPU model; a build or machine without a GPU refuses it with one line (k_cuda_device). Exit
 * status 0, 1 on failure, 2 on a usage error. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "kernels/kernels.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_dit.h"

/* Reads float tensor `name` (F32/BF16/F16; I64 too when allow_int) of the expected rank into a malloc'd buffer. */
static float *read_input(const st_file *f, const char *name, int rank, int64_t *shape, int allow_int, int required) {
    int i = st_find(f, name);
    if (i < 0) {
        if (required) core_error("%s: no tensor \"%s\"", st_label(f), name);
        return NULL;
    }
    const st_info *t = st_info_at(f, i);
    if (rank > 0 && t->ndim != rank) {
        core_error("%s: tensor \"%s\" has %d dimensions, expected %d", st_label(f), name, t->ndim, rank);
        return NULL;
    }
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d], shape[d] = t->shape[d];
    float *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!buf) {
        core_error("%s: out of memory for \"%s\"", st_label(f), name);
        return NULL;
    }
    if (t->dtype == CORE_I64 && allow_int) {
        core_tensor v;
        if (st_get(f, name, &v)) {
            free(buf);
            return NULL;
        }
        for (int64_t k = 0; k < n; k++) buf[k] = (float)((const int64_t *)v.data)[k];
        core_tensor_free(&v);
    } else if (st_read_f32(f, name, buf, n)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* dev: NULL for the fp32 CPU model, else the device the bf16 model runs on. */
static int run(const char *model_dir, const char *in_path, const char *out_path, int recompute, const k_dev_ops *dev) {
    int rc = -1;
    wan_model m;
    memset(&m, 0, sizeof m);
    wan_dev_model d;
    memset(&d, 0, sizeof d);
    st_file *in = NULL;
    wan_acts *A = NULL;
    wan_dev_acts *DA = NULL;
    float *x = NULL, *t = NULL, *e = NULL, *go = NULL, *out = NULL, *dx = NULL, *de = NULL;
    st_writer *w = NULL;
    int64_t sx[8], stt[8], se[8], sg[8];

    if (wan_model_load(&m, model_dir)) goto done;
    const wan_config *c = &m.cfg;
    if (!(in = st_open(in_path))) goto done;
    if (!(x = read_input(in, "hidden_states", 5, sx, 0, 1))) goto done;
    if (!(e = read_input(in, "encoder_hidden_states", 3, se, 0, 1))) goto done;
    int ti = st_find(in, "timestep");
    if (ti < 0) {
        core_error("%s: no tensor \"timestep\"", in_path);
        goto done;
    }
    const int t_rank = st_info_at(in, ti)->ndim;
    if (t_rank != 1 && t_rank != 2) {
        core_error("%s: timestep must be [B] or [B, S], got %d dimensions", in_path, t_rank);
        goto done;
    }
    if (!(t = read_input(in, "timestep", t_rank, stt, 1, 1))) goto done;
    go = read_input(in, "grad_output", 5, sg, 0, 0);
    if (!go && st_find(in, "grad_output") >= 0) goto done;

    wan_shape sh = {(int)sx[0], (int)sx[2], (int)sx[3], (int)sx[4], (int)se[1], t_rank == 2};
    if (sx[1] != c->in_channels) {
        core_error("%s: hidden_states has %lld channels, the model takes %d", in_path, (long long)sx[1],
                   c->in_channels);
        goto done;
    }
    if (se[0] != sx[0] || se[2] != c->text_dim) {
        core_error("%s: encoder_hidden_states is [%lld, %lld, %lld], expected [%lld, L, %d]", in_path, (long long)se[0],
                   (long long)se[1], (long long)se[2], (long long)sx[0], c->text_dim);
        goto done;
    }
    const wan_acts_mode mode = go ? (recompute ? WAN_ACTS_RECOMPUTE : WAN_ACTS_STORE) : WAN_ACTS_INFER;
    if (dev ? (wan_dev_model_init(&d, dev, &m) || !(DA = wan_dev_acts_new(dev, c, &sh, mode)))
            : !(A = wan_acts_new(c, &sh, mode)))
        goto done;
    const int64_t S = wan_tokens(c, &sh);
    if (stt[0] != sh.B || (t_rank == 2 && stt[1] != S)) {
        core_error("%s: timestep has shape [%lld%s], expected [%d] or [%d, %lld] (S = video tokens)", in_path,
                   (long long)stt[0], t_rank == 2 ? ", ..." : "", sh.B, sh.B, (long long)S);
        goto done;
    }
    const int64_t nx = sx[0] * sx[1] * sx[2] * sx[3] * sx[4], ne = se[0] * se[1] * se[2];
    const int64_t no = (int64_t)sh.B * c->out_channels * sh.F * sh.H * sh.W;
    if (go && (sg[0] != sh.B || sg[1] != c->out_channels || sg[2] != sh.F || sg[3] != sh.H || sg[4] != sh.W)) {
        core_error("%s: grad_output must have the output's shape [%d, %d, %d, %d, %d]", in_path, sh.B, c->out_channels,
                   sh.F, sh.H, sh.W);
        goto done;
    }
    out = malloc((size_t)no * sizeof(float));
    if (!out) {
        core_error("out of memory");
        goto done;
    }
    if (dev) { /* forward and backward at once (wan_dev_run_host), gradients downloaded into the host model's */
        dx = go ? calloc((size_t)nx, sizeof(float)) : NULL;
        de = go ? calloc((size_t)ne, sizeof(float)) : NULL;
        if (go && (!dx || !de || wan_model_alloc_grads(&m))) {
            core_error("out of memory for gradients");
            goto done;
        }
        if (wan_dev_run_host(&d, DA, out, x, t, e, go, dx, de) || (go && wan_dev_grads_download(&d, m.grads)))
            goto done;
    } else if (wan_forward(&m, A, NULL, out, x, t, e)) {
        goto done;
    }
    if (!(w = st_writer_new())) goto done;
    int64_t so[5] = {sh.B, c->out_channels, sh.F, sh.H, sh.W};
    if (st_writer_add(w, "output", CORE_F32, 5, so, out)) goto done;
    if (go) {
        if (!dev) {
            dx = calloc((size_t)nx, sizeof(float));
            de = calloc((size_t)ne, sizeof(float));
            if (!dx || !de || wan_model_alloc_grads(&m)) {
                core_error("out of memory for gradients");
                goto done;
            }
            if (wan_backward(&m, A, NULL, dx, de, go)) goto done;
        }
        if (st_writer_add(w, "grad_hidden_states", CORE_F32, 5, sx, dx)) goto done;
        if (st_writer_add(w, "grad_encoder_hidden_states", CORE_F32, 3, se, de)) goto done;
        for (int i = 0; i < m.layout.count; i++) {
            const wan_tensor *p = &m.layout.tensors[i];
            char name[WAN_NAME_MAX + 8];
            snprintf(name, sizeof name, "grad.%s", p->name);
            if (st_writer_add(w, name, CORE_F32, p->ndim, p->shape, m.grads + p->offset)) goto done;
        }
    }
    if (st_writer_write(w, out_path)) goto done;
    rc = 0;
done:
    st_writer_free(w);
    free(x), free(t), free(e), free(go), free(out), free(dx), free(de);
    wan_acts_free(A);
    wan_dev_acts_free(DA);
    wan_dev_model_free(&d);
    st_close(in);
    wan_model_free(&m);
    return rc;
}

int cmd_dit_forward(int argc, char **argv) {
    const char *model = NULL, *inputs = NULL, *out = NULL, *sub = "transformer", *device = "cpu";
    int recompute = 0;
    const opts_spec opts[] = {
        {.name = "model", .type = OPTS_STRING, .str = &model, .required = 1, .meta = "DIR",
         .help = "transformer folder, or pipeline folder (uses DIR/transformer)"},
        {.name = "inputs", .type = OPTS_STRING, .str = &inputs, .required = 1, .meta = "IN.safetensors",
         .help = "hidden_states, timestep, encoder_hidden_states [, grad_output]"},
        {.name = "out", .type = OPTS_STRING, .str = &out, .required = 1, .meta = "OUT.safetensors",
         .help = "output [, grad_hidden_states, grad_encoder_hidden_states, grad.<param>]"},
        {.name = "subfolder", .type = OPTS_STRING, .str = &sub, .meta = "NAME",
         .help = "the pipeline component to use (default transformer; transformer_2: the\n"
                 "low-noise expert of a two-expert pipeline)"},
        {.name = "recompute", .type = OPTS_FLAG, .flag = &recompute,
         .help = "recompute elementwise activations in the backward"},
        {.name = "device", .type = OPTS_STRING, .str = &device, .meta = "cpu|cuda",
         .help = "cpu: the fp32 model (default); cuda: the bf16 model on the GPU (a `make cuda`\n"
                 "build on a machine with an NVIDIA Hopper GPU)"},
        {0}};
    const opts_cmd cmd = {.name = "dit-forward", .opts = opts};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        return opts_exit_status(opts_fail(&cmd, stderr, "--device: expected cpu or cuda, got \"%s\"", device));
    const k_dev_ops *dev = NULL;
    char why[K_WHY_MAX];
    if (!strcmp(device, "cuda") && !(dev = k_cuda_device(why))) {
        fprintf(stderr, "vgrpo dit-forward: --device cuda: %s\n", why);
        return 1;
    }
    /* a pipeline folder: use its transformer component */
    char dir[4096], probe[4200];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/model_index.json", model);
    if (stat(probe, &st) == 0) snprintf(dir, sizeof dir, "%s/%s", model, sub);
    else snprintf(dir, sizeof dir, "%s", model);
    if (run(dir, inputs, out, recompute, dev)) {
        fprintf(stderr, "vgrpo dit-forward: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
