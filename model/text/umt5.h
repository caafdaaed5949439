/* model/text/umt5.h — the umT5 text encoder (forward only), as transformers' UMT5EncoderModel computes it.
 *
 * Reference: transformers models/umt5/modeling_umt5.py (UMT5Stack with is_decoder False). Per block:
 *   h = x + SelfAttention(RMSNorm(x)),  x = h + FF(RMSNorm(h)),  and RMSNorm(x) after the last block;
 * RMSNorm is T5's (weight * x / sqrt(mean(x^2) + eps): no mean subtraction, no bias); attention scores are q.k with
 * no 1/sqrt(d_kv) scaling plus a per-layer learned relative position bias (bidirectional buckets: num_buckets,
 * max_distance) and padded keys (attention_mask 0) are excluded; FF is gated GELU (tanh):
 * wo(gelu_tanh(wi_0 h) * wi_1 h). Dropout is off (inference).
 * Checkpoint: a transformers folder (`text_encoder/`): config.json and model.safetensors (or shards + index) with
 * F32, BF16 or F16 tensors; every weight is converted to F32 once at load, except the token embedding, which stays
 * in the mapped file and is converted row by row (the real umT5's is 256384 x 4096).
 *
 * One forward (umt5_forward.c) over the device table (kernels/dev_ops.h): on the CPU through k_cpu_dev_ops (fp32,
 * the bits of the CPU encoder), on a device after t5_to_device. The table's umT5 entries are t5_attention and
 * t5_gated_gelu (kernels/body/kb_t5.h); the norms are rmsnorm_forward, the linears gemm.
 * What the device keeps in fp32. transformers keeps wo in fp32 (UMT5PreTrainedModel._keep_in_fp32_modules = ["wo"]):
 * in a bf16 model the gated product is cast to fp32 before wo, wo's output is fp32, and the residual stream becomes
 * fp32 from the first feed-forward on. The device path does the same where its GEMM allows: the residual stream
 * (the embedding rows, o's and wo's outputs accumulated into it with beta 1) and the final norm's output are fp32,
 * as are the norm statistics, norm gains and the position bias; attention's softmax is fp32 (kb_t5.h; the reference:
 * softmax(scores.float())). bf16: every GEMM weight (wo too: cuBLASLt takes bf16 operands, so wo's INPUT is bf16
 * where the reference's is fp32; its accumulation and output stay fp32) and the activations between (norm outputs,
 * q, k, v, the attention output, wi_0 / wi_1 outputs and their gated product). */
#ifndef MODEL_UMT5_H
#define MODEL_UMT5_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dev_ops.h"

typedef struct {
    int vocab_size, d_model, d_kv, d_ff, num_layers, num_heads;
    int num_buckets, max_distance; /* relative_attention_num_buckets, relative_attention_max_distance */
    float eps;                     /* layer_norm_epsilon */
} t5_config;

typedef struct t5_encoder t5_encoder;

/* Reads `dir`/config.json. Returns 0, or -1 naming the file and key (missing, not a positive integer, or
 * feed_forward_proj other than "gated-gelu"). */
int t5_config_load(const char *dir, t5_config *cfg);

/* Loads the encoder from a transformers folder. NULL with core_error naming the folder, tensor and fault. */
t5_encoder *t5_load(const char *dir);
void t5_free(t5_encoder *e);
/* Floats of the weights t5_load copies into its own buffer: per block q, k, v, o [heads * d_kv, d_model], the
 * relative attention bias [num_buckets, heads], two layer norms, wi_0, wi_1, wo (d_ff x d_model each); plus the final
 * norm. The token embedding is not among them (it stays in the mapped safetensors). */
size_t t5_param_floats(const t5_config *c);
const t5_config *t5_get_config(const t5_encoder *e);

/* The bucket of relative position rel = key position - query position (bidirectional: the encoder's rule),
 * in [0, num_buckets). Reference: UMT5Attention._relative_position_bucket (float32 log, truncation). */
int t5_relative_bucket(int rel, int num_buckets, int max_distance);

/* The self-attention core of one layer on the CPU, fp32: k_cpu_t5_attention (kernels/cpu/cpu.h gives its exact
 * contract: the chains every value is). Kept under this name for the tests and benches that call it. */
int t5_attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias, const int *bucket_of,
                 const int32_t *mask, int B, int S, int H, int Dk);

/* Copies the weights to the device of table K (bf16 GEMM weights, fp32 norm gains and position bias; the
 * embedding stays on the host, whose rows are looked up there and uploaded as fp32); from then on t5_forward runs
 * there, until t5_free, and the host's fp32 copy is freed (t5_host_bytes 0 after). -1 (nothing kept) when d_model, num_heads x d_kv or d_ff is not a multiple of 8 (the GEMM's
 * bf16 rows), when the encoder is already on a device, or when the device runs out of memory. */
int t5_to_device(t5_encoder *e, const k_dev_ops *K);
/* Bytes of host memory the encoder holds for its weights: the fp32 copy t5_load makes (t5_param_floats floats and
 * the layer table) until t5_to_device frees it, then 0. The token embedding is not counted: it stays in the mapped
 * safetensors (file pages). */
size_t t5_host_bytes(const t5_encoder *e);
/* The table name of the device the encoder runs on ("emulated", "cuda-bf16"), or NULL: the CPU. */
const char *t5_device_name(const t5_encoder *e);
/* Device bytes of an encoder of config c after t5_to_device plus one forward of B x S tokens: the weights (bf16 GEMM
 * weights, fp32 gains and bias) and the forward's buffers (with a mask), as t5_to_device and t5_forward allocate
 * them; B or S 0: the weights alone. */
size_t t5_device_bytes(const t5_config *c, int B, int S);

/* Forward: ids [B, S] (int32 token ids, each < vocab_size), mask [B, S] (1 real token, 0 padding; NULL = all
 * real) -> out [B, S, d_model] F32 = last_hidden_state (host memory in and out, on the CPU or the encoder's device).
 * Padded positions are computed too (as the reference does; callers trim them). A query whose row has no real key
 * gets zeros from attention. On the CPU parallel over batch x heads. Returns 0, or -1 (B or S < 1, id out of range
 * naming it, out of memory, a device error naming the layer). */
int t5_forward(const t5_encoder *e, const int32_t *ids, const int32_t *mask, int B, int S, float *out);

#endif
