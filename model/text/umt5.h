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
 * in the mapped file and is converted row by row (the real umT5's is 256384 x 4096). */
#ifndef MODEL_UMT5_H
#define MODEL_UMT5_H

#include <stddef.h>
#include <stdint.h>

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

/* The self-attention core of one layer: q, k, v [B, S, H*Dk] F32 (head h's columns h*Dk ..) -> o [B, S, H*Dk];
 * score(i, j) = q_i . k_j (no 1/sqrt(Dk): T5) + rel_bias[bucket_of[j - i + S - 1] * H + h] (rel_bias [buckets, H]);
 * keys with mask[b][j] == 0 left out (mask NULL: none); o_i = sum_j p_j v_j / sum_j p_j with p_j = exp(score - max)
 * in double; a row without kept keys gets zeros. Exact arithmetic (the values are these chains, whatever the
 * vector width or thread count): each score is the fp32 sum over d in order of the rounded products q[d]*k[d] (no
 * fma), then + bias; p_j = exp((double)score_j - (double)max) (libm); sum and every output column the double sums
 * over kept keys in key order of p_j and of the rounded products p_j * (double)v_j[d]; o = (float)(col / sum).
 * Returns 0, or -1 (out of memory). Reference: transformers UMT5Attention (encoder, no dropout). */
int t5_attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias, const int *bucket_of,
                 const int32_t *mask, int B, int S, int H, int Dk);

/* Forward: ids [B, S] (int32 token ids, each < vocab_size), mask [B, S] (1 real token, 0 padding; NULL = all
 * real) -> out [B, S, d_model] F32 = last_hidden_state. Padded positions are computed too (as the reference does;
 * callers trim them). A query whose row has no real key gets zeros from attention. Parallel over batch x heads.
 * Returns 0, or -1 (id out of range naming it, out of memory). */
int t5_forward(const t5_encoder *e, const int32_t *ids, const int32_t *mask, int B, int S, float *out);

#endif
