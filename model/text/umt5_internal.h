/* model/text/umt5_internal.h — the umT5 encoder's structure, shared by its loader (umt5.c) and its forward over the
 * device table (umt5_forward.c). Not for other modules: they use umt5.h. */
#ifndef MODEL_UMT5_INTERNAL_H
#define MODEL_UMT5_INTERNAL_H

#include "core/safetensors.h"
#include "kernels/dev_ops.h"
#include "model/text/umt5.h"

typedef struct {
    float *q, *k, *v, *o;  /* [H*Dk, D] x3, [D, H*Dk] (torch Linear: [out, in]) */
    float *rel_bias;       /* [num_buckets, H] */
    float *ln_attn;        /* [D] */
    float *wi0, *wi1, *wo; /* [F, D], [F, D], [D, F] */
    float *ln_ff;          /* [D] */
} t5_layer;

/* One layer as the forward reads it, on its backend: GEMM weights fp32 host (the CPU table) or bf16 device; norm
 * gains and the position bias fp32. */
typedef struct {
    kb_in q, k, v, o, wi0, wi1, wo;
    kb_in ln_attn, ln_ff;
    const float *rel_bias;
} t5_layer_view;

/* The encoder's copy on a device (t5_to_device): per-tensor allocations of K. */
typedef struct {
    const k_dev_ops *K;
    t5_layer_view *layers; /* [num_layers], pointers below */
    kb_in final_ln;
    void **allocs;         /* every mem_alloc, freed by t5_free */
    int n_allocs;
} t5_device;

struct t5_encoder {
    t5_config cfg;
    st_set *st;          /* kept open: the embedding is read from it row by row */
    core_tensor embed;   /* [vocab, D] view (F32/BF16/F16) */
    float *params;       /* every other weight, F32, one allocation */
    t5_layer *layers;    /* [num_layers] pointers into params */
    float *final_ln;     /* [D] */
    t5_device *dev;      /* NULL: the forward runs on the CPU */
};

/* Frees e->dev (umt5_forward.c). */
void t5_device_free(t5_encoder *e);

#endif
