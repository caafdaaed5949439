/* kernels/cpu/ops.c — the fp32 CPU op table. */
#include "kernels/cpu/cpu.h"

const k_ops k_cpu_ops = {
    .name = "cpu-fp32",
    .gemm = k_cpu_gemm,
    .layernorm_forward = k_cpu_layernorm_forward,
    .layernorm_backward = k_cpu_layernorm_backward,
    .rmsnorm_forward = k_cpu_rmsnorm_forward,
    .rmsnorm_backward = k_cpu_rmsnorm_backward,
    .rope_forward = k_cpu_rope_forward,
    .rope_backward = k_cpu_rope_backward,
    .gelu_forward = k_cpu_gelu_forward,
    .gelu_backward = k_cpu_gelu_backward,
    .silu_forward = k_cpu_silu_forward,
    .silu_backward = k_cpu_silu_backward,
    .modulate_forward = k_cpu_modulate_forward,
    .modulate_backward = k_cpu_modulate_backward,
    .gate_residual_forward = k_cpu_gate_residual_forward,
    .gate_residual_backward = k_cpu_gate_residual_backward,
    .patchify_forward = k_cpu_patchify_forward,
    .patchify_backward = k_cpu_patchify_backward,
    .unpatchify_forward = k_cpu_unpatchify_forward,
    .unpatchify_backward = k_cpu_unpatchify_backward,
    .attention_forward = k_cpu_attention_forward,
    .attention_backward = k_cpu_attention_backward,
    .lse_merge_forward = k_cpu_lse_merge_forward,
    .lse_merge_backward = k_cpu_lse_merge_backward,
};
