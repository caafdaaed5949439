/* cli/main.c — the `vgrpo` executable: dispatches to one subcommand. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/omp_env.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"bench", cmd_bench, "benchmarks: kernels, dit, vae, umt5, reward (`vgrpo bench --help`)"},
    {"init-model", cmd_init_model, "write a Wan pipeline folder for a preset (tiny: random weights)"},
    {"init-clip", cmd_init_clip, "write a tiny random CLIP folder (transformers layout) for the learned scorers"},
    {"run", cmd_run, "run a GRPO recipe (mode local: one process; colocated: reward server + workers + trainer ranks)"},
    {"export", cmd_export, "a LoRA adapter for diffusers/peft: merged into the transformer, or as adapter files"},
    {"dit-forward", cmd_dit_forward, "one Wan transformer forward (+ backward) on a safetensors file of inputs"},
    {"vae-decode", cmd_vae_decode, "decode latents with a Wan VAE (AutoencoderKLWan.decode) to a video tensor"},
    {"vae-encode", cmd_vae_encode, "encode a video tensor with a Wan VAE (AutoencoderKLWan.encode: posterior mode)"},
    {"generate", cmd_generate, "text to video with a pipeline folder: umT5, DiT sampling (CFG), VAE -> mp4 + PNG"},
    {"encode-prompts", cmd_encode_prompts, "encode a prompt file with umT5 into a safetensors cache (embeds, lengths)"},
    {"eval", cmd_eval, "rollout-only eval: reward server + rollout workers on a prompt set -> eval.json, mp4s, sheets"},
    {"parity", cmd_parity, "train/rollout parity: one rollout batch, every trainable transition recomputed by the trainer"},
    {"trainer", cmd_trainer, "the trainer rank(s) of a colocated run (started by run; rank 0 is the controller)"},
    {"mpi-rank", cmd_mpi_rank, "one rank of a run launched as one MPI job (run --launcher mpirun, or srun)"},
    {"rollout-worker", cmd_rollout_worker, "a rollout worker process (started by eval/run; serves a controller)"},
    {"gpu-plans", cmd_gpu_plans, "cuDNN attention plans of the Wan DiT for a described H100/H200 (CUDA build, no GPU)"},
    {"reward-server", cmd_reward_server, "serve reward scorers over ZeroMQ (protocol: reward/PROTOCOL.md)"},
    {"gemm-plan", cmd_gemm_plan, "cuBLASLt's GEMM descriptors for the DiT read back (and, on a GPU, their algorithms)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`vgrpo <command> --help` describes a command's options; `vgrpo --version` the build.\n");
}

int main(int argc, char **argv) {
    core_omp_env_defaults(argv);
    /* Past a file-size limit (ulimit -f) a write fails with EFBIG, which every writer reports naming its file, rather
     * than killing the process with no word (SIGXFSZ's default); inherited by the processes it starts */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "vgrpo: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
