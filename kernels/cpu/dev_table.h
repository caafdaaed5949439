/* kernels/cpu/dev_table.h — the fp32 CPU backend as a device op table: k_cpu_dev_ops ("cpu-f32") fills
 * kernels/dev_ops.h's k_dev_ops with the CPU's own functions, so that the Wan DiT (model/dit/) is written once
 * over k_dev_ops and runs on the CPU, the emulated device and the GPU alike.
 *
 * Every view must be fp32 and every pointer host memory (the "device" is the host): a bf16 view is refused with an
 * error naming the entry and the argument ("cpu-f32 gemm: A is bf16: the CPU table takes fp32 views"). Each entry
 * calls the k_cpu_ops function (kernels/cpu/cpu.h) with the same arguments the fp32 CPU model passed it, so a model
 * run through this table performs the same operations in the same order as one through k_cpu_ops: the same bits.
 *   gemm              k_cpu_gemm; K_EPI_BIAS passes the bias to k_cpu_gemm; K_EPI_BGRAD_A (transA only: dW = dY^T X)
 *                     runs the GEMM, then k_cpu_colsum_acc of dY's rows into dbias (wan_linear_bwd's order); the GELU
 *                     epilogues are refused (the CPU model calls gelu_* itself).
 *   add, add_table_*  k_cpu_axpy1, k_cpu_add_table, k_cpu_add_table_bwd (kernels/cpu/glue.c).
 *   mem_*             host memory: 64-byte aligned zeroed blocks, memcpy, memset; no bf16 transfers (refused);
 *                     mem_info answers -1 (host memory, no device bound).
 *   flow, optimizer   refused (model/flow and trainer/optim call their CPU functions directly).
 * Entries return 0, or -1 with core_error. */
#ifndef KERNELS_CPU_DEV_TABLE_H
#define KERNELS_CPU_DEV_TABLE_H

#include "kernels/dev_ops.h"

extern const k_dev_ops k_cpu_dev_ops;

#endif
