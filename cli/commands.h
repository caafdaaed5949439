/* cli/commands.h — every `vgrpo` subcommand: int cmd_<name>(argc, argv), argv[0] being the subcommand name.
 * Each returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

int cmd_bench(int argc, char **argv);

#endif
