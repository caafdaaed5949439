/* cli/commands.h — every `vgrpo` subcommand: int cmd_<name>(argc, argv), argv[0] being the subcommand name.
 * Each returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

int cmd_bench(int argc, char **argv);
int cmd_init_model(int argc, char **argv);
int cmd_dit_forward(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_vae_decode(int argc, char **argv);
int cmd_encode_prompts(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_reward_server(int argc, char **argv);
int cmd_rollout_worker(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_trainer(int argc, char **argv);
int cmd_parity(int argc, char **argv);
/* `vgrpo bench dit` (cli/bench_dit.c), dispatched by cmd_bench; threads 0 = OpenMP default. */
int cmd_bench_dit(int threads, int quick);
/* `vgrpo bench vae` / `vgrpo bench umt5` (cli/bench_text_vae.c), dispatched by cmd_bench; threads 0 = default. */
int cmd_bench_vae(int threads, int quick);
int cmd_bench_umt5(int threads, int quick);

#endif
