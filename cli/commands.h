/* cli/commands.h — every `vgrpo` subcommand: int cmd_<name>(argc, argv), argv[0] being the subcommand name.
 * Each returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_init_model(int argc, char **argv);
int cmd_init_clip(int argc, char **argv);
int cmd_dit_forward(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_vae_decode(int argc, char **argv);
int cmd_vae_encode(int argc, char **argv);
int cmd_encode_prompts(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_reward_server(int argc, char **argv);
int cmd_rollout_worker(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_trainer(int argc, char **argv);
int cmd_mpi_rank(int argc, char **argv);
int cmd_parity(int argc, char **argv);
int cmd_export(int argc, char **argv);
/* `vgrpo gemm-plan` (cli/cmd_gemm_plan.c): the real cuBLASLt's descriptors for the DiT's GEMMs, and with a GPU their
 * batch-invariant algorithms (kernels/cuda/k_cuda.h k_gemm_plan_selftest). */
int cmd_gemm_plan(int argc, char **argv);
int cmd_gpu_plans(int argc, char **argv);
/* `vgrpo --version` (cli/cmd_version.c): prints the version, the git commit and the build flags; returns 0. */
int cmd_version(int argc, char **argv);

#endif
