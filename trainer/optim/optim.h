/* trainer/optim/optim.h — AdamW with decoupled weight decay, learning-rate schedules, global-norm gradient clipping and
 * gradient accumulation over flat fp32 buffers (the llm.c pattern: all parameters, gradients and moments of a model
 * are one array each, so every operation here is one loop).
 *
 *   optim_adamw opt; optim_adamw_init(&opt, n);             // m, v zeroed, step 0
 *   per optimizer step:  optim_zero(grads, n);
 *                        per micro-batch: backward accumulates (+=) into grads (or optim_accumulate(grads, mb, n));
 *                        (ranks: all-reduce SUM of grads)
 *                        optim_adamw_step(&opt, &cfg, params, grads, NULL, &info);   // clip, lr(step), update
 * The GRPO loss is already divided by the global transition count (trainer/step/grpo.h), so accumulated gradients are
 * summed, never averaged over micro-batches.
 *
 * Sources: torch.optim.AdamW (single-tensor path, amsgrad off, maximize off), torch.nn.utils.clip_grad_norm_,
 * transformers get_constant_schedule_with_warmup / get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup.
 * Flow-GRPO applies weight decay to every trained parameter (one param group); wd_mask exists for other choices. */
#ifndef TRAINER_OPTIM_H
#define TRAINER_OPTIM_H

#include <stdint.h>

typedef enum { OPTIM_SCHED_CONSTANT = 0, OPTIM_SCHED_LINEAR, OPTIM_SCHED_COSINE } optim_schedule;

/* Hyperparameters; doubles as torch keeps them (Python floats). Keys in messages: optim.<field>. */
typedef struct {
    double lr;             /* peak learning rate, > 0 */
    double beta1, beta2;   /* in [0, 1) */
    double eps;            /* > 0, added after sqrt(v_hat) */
    double weight_decay;   /* >= 0, decoupled: p -= lr * weight_decay * p */
    double max_grad_norm;  /* > 0: clip the global L2 norm to this; <= 0: no clipping (norm still computed) */
    optim_schedule schedule;
    int64_t warmup_steps;  /* >= 0 */
    int64_t total_steps;   /* linear / cosine: > warmup_steps (the step where lr reaches 0); constant: ignored */
} optim_config;

/* Checks the ranges above. Returns 0, or -1 with an error naming the key ("optim.beta2: must be in [0, 1), got 1"). */
int optim_config_validate(const optim_config *c);

/* Learning rate of the update that follows `step` completed optimizer steps (step 0: the first update), as
 * transformers' LambdaLR schedules give it when scheduler.step() follows every optimizer.step():
 *   warm-up (step < warmup_steps): lr * step / max(1, warmup_steps)     (so the very first update has lr 0)
 *   constant:  lr
 *   linear:    lr * max(0, (total - step) / max(1, total - warmup))
 *   cosine:    lr * max(0, 0.5 * (1 + cos(pi * p))),  p = (step - warmup) / max(1, total - warmup)  (num_cycles 0.5)
 * All in double. One deviation: for step > total_steps the cosine progress is held at 1 (lr 0); transformers' formula
 * would rise again. Negative step is treated as 0. */
double optim_lr_at(const optim_config *c, int64_t step);

/* Sum of squares of x[0..n) in double, in a fixed order independent of thread count: fixed chunks of
 * OPTIM_CHUNK elements, each summed sequentially in double (chunks in parallel under OpenMP), then the chunk sums
 * added sequentially in chunk order. Non-finite values propagate. */
#define OPTIM_CHUNK 8192
double optim_sumsq(const float *x, int64_t n);

/* optim_sumsq in two halves, so that a sum over a sharded buffer (ZeRO: trainer/dp/zero.h) can be formed piece by piece
 * and still equal it bit for bit: optim_sumsq_chunks writes the chunk sums of chunks [c_lo, c_hi) of x[0..n) into
 * part[0 .. c_hi - c_lo) (each exactly as optim_sumsq forms it: its elements in order, in double; OpenMP over
 * chunks), and optim_sumsq_combine adds m chunk sums sequentially in chunk order from 0.0, as optim_sumsq does:
 *   optim_sumsq_combine(part of chunks [0, ceil(n / OPTIM_CHUNK)), ...) == optim_sumsq(x, n), bit for bit. */
void optim_sumsq_chunks(const float *x, int64_t n, int64_t c_lo, int64_t c_hi, double *part);
double optim_sumsq_combine(const double *part, int64_t m);

/* sqrt(optim_sumsq(g, n)): the global L2 norm of a flat gradient (torch's clip_grad_norm_ total_norm with
 * norm_type 2; torch computes it as the norm of per-tensor norms in the gradients' dtype, so the values agree to
 * rounding, not bit for bit). */
double optim_grad_norm(const float *g, int64_t n);

/* The global L2 norm of k >= 1 flat gradients taken together, as torch.nn.utils.clip_grad_norm_ over the parameters
 * of several models (two-expert training: both experts' gradients, trainer/step/train_step.h):
 *   sqrt(optim_sumsq(g[0], n[0]) + optim_sumsq(g[1], n[1]) + ...), the sums of squares added in buffer order.
 *   g[j] [n[j]] f32 (n[j] >= 0). Thread-invariant (optim_sumsq's fixed order); k == 1 gives optim_grad_norm exactly.
 * Non-finite values propagate. */
double optim_grad_norm_multi(const float *const *g, const int64_t *n, int k);

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)), in double (1 when max_norm <= 0). */
double optim_clip_coef(double norm, double max_norm);

/* Elementwise helpers (OpenMP, thread-invariant): x = 0; dst += src; x *= s (s is rounded to float first). */
void optim_zero(float *x, int64_t n);
void optim_accumulate(float *dst, const float *src, int64_t n);
void optim_scale(float *x, int64_t n, double s);

/* One AdamW update of torch.optim.AdamW at step t (>= 1, counted after increment) with learning rate lr, elementwise
 * over params/grads/m/v [n] f32 (m, v: first and second moments, zero before the first step). In fp32, per element,
 * in torch's order (scalars computed in double, rounded to float once where torch passes them to a kernel):
 *   p = p * (float)(1 - lr*wd)                        (skipped where wd_mask[i] == 0; wd_mask NULL = all)
 *   m = m + (float)(1-beta1) * (g - m)                (torch lerp_, weight < 0.5)
 *   v = v * (float)beta2 + (float)(1-beta2) * g * g   (mul_ then addcmul_)
 *   d = sqrt(v) / (float)sqrt(1 - beta2^t) + (float)eps
 *   p = p + (float)(-lr / (1 - beta1^t)) * m / d       (addcdiv_, left to right)
 * No error cases (the caller validated the config); thread-invariant (each element on its own). */
void optim_adamw_update(float *params, const float *grads, float *m, float *v, int64_t n, const uint8_t *wd_mask,
                        double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t);

/* Optimizer state over one flat parameter buffer; saved and restored by checkpoints (m, v, step). It covers the
 * whole buffer, or (ZeRO stages 1 and 2, trainer/dp/zero.h) one contiguous shard of it: m and v then hold the moments
 * of parameters [lo, lo + len) only, and a step updates only those. */
typedef struct {
    int64_t n;        /* parameter count of the whole buffer */
    int64_t lo, len;  /* the parameters this state covers: [lo, lo + len) (whole: 0, n) */
    float *m, *v;     /* [len] f32, owned (at least one element is allocated, so a state is never NULL) */
    int64_t step;     /* optimizer steps completed */
} optim_adamw;

/* What one step did (for metrics.jsonl). */
typedef struct {
    double grad_norm; /* global L2 norm before clipping */
    double clip_coef; /* factor applied to the gradients (1: none) */
    double lr;        /* learning rate used */
} optim_step_info;

/* Allocates m, v (zeroed) for n >= 1 parameters; step 0. Returns 0, or -1 (n < 1, out of memory). */
int optim_adamw_init(optim_adamw *o, int64_t n);
/* The state of the shard [lo, lo + len) of n parameters (0 <= lo, len >= 0, lo + len <= n; len 0: a rank without
 * parameters of this buffer). Returns 0, or -1 (bad range, out of memory). */
int optim_adamw_init_shard(optim_adamw *o, int64_t n, int64_t lo, int64_t len);
/* Frees m, v (safe on a zeroed or freed state). */
void optim_adamw_free(optim_adamw *o);

/* One optimizer step: grad_norm = optim_grad_norm(grads); error if it is not finite (nothing changed; the caller may
 * skip the batch); if max_grad_norm > 0 and the clip factor is < 1, grads *= factor (in place, as torch does);
 * lr = optim_lr_at(cfg, o->step); optim_adamw_update(..., t = o->step + 1); o->step++.
 *   params, grads [o->n] f32; wd_mask [o->n] u8 or NULL; info may be NULL.
 * Errors (-1): invalid cfg (optim_config_validate), non-finite gradient norm ("gradient norm is nan/inf at optimizer
 * step N"), a sharded state (its norm needs every shard: trainer/dp/zero.h). */
int optim_adamw_step(optim_adamw *o, const optim_config *cfg, float *params, float *grads, const uint8_t *wd_mask,
                     optim_step_info *info);

/* optim_adamw_step with the gradient norm and clip factor given, for one optimizer step over several parameter
 * buffers clipped by their joint norm (optim_grad_norm_multi, optim_clip_coef): if clip_coef < 1, grads *= clip_coef
 * (in place); lr = optim_lr_at(cfg, o->step); optim_adamw_update(..., t = o->step + 1); o->step++. info (may be
 * NULL) records grad_norm, clip_coef and lr. Call it once per buffer with the same grad_norm and clip_coef.
 * A sharded state reads and writes params, grads (and wd_mask) only in [o->lo, o->lo + o->len): each element is
 * updated on its own, so a shard's parameters equal the whole state's bit for bit (params, grads are still the
 * whole [o->n] buffers).
 * Errors (-1, nothing changed): invalid cfg, grad_norm not finite ("gradient norm is nan/inf at optimizer step N"),
 * clip_coef not in (0, 1]. */
int optim_adamw_step_coef(optim_adamw *o, const optim_config *cfg, float *params, float *grads, const uint8_t *wd_mask,
                          double grad_norm, double clip_coef, optim_step_info *info);

#endif
