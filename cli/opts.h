/* cli/opts.h — the one command-line parser of every `vgrpo` subcommand.
 *
 * A subcommand declares a table of options (opts_spec, ended by an entry whose name is NULL) and of positional
 * arguments (opts_pos, same), in an opts_cmd, and calls opts_parse. Values land in the caller's variables
 * through the pointers in the table; nothing is allocated (a repeatable option fills a caller-provided array).
 *
 *   static const char *pipeline, *out; static int steps = 20, quick;
 *   const opts_spec o[] = {
 *       {.name = "pipeline", .type = OPTS_STRING, .str = &pipeline, .required = 1, .meta = "DIR", .help = "..."},
 *       {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 1000, .meta = "N", .help = "..."},
 *       {.name = "quick", .type = OPTS_FLAG, .flag = &quick, .help = "..."},
 *       {0}};
 *   const opts_cmd cmd = {.name = "generate", .opts = o};
 *   int rc = opts_parse(&cmd, argc, argv, stdout, stderr);
 *   if (rc != OPTS_OK) return opts_exit_status(rc);  // 0 after --help, 2 after a usage error
 *
 * Accepted: `--name value`, `--name=value`, `-h` / `--help` anywhere before `--` (the usage, generated from the
 * table, goes to `out` and nothing is parsed, even if `-h` was meant as a value), `--` (every later argument is
 * positional). A value may begin with "-" (a negative number)
 * but not with "--": `--out --steps 3` reports `--out: missing value` (write `--out=--x` for such a value).
 * An option given twice keeps its last value, except OPTS_LIST, which collects every occurrence in order.
 * Every error is one line on `err`, then a blank line and the usage:
 *
 *   vgrpo generate: --steps: expected an integer, got "x"
 *   vgrpo generate: --steps: expected an integer in 1..1000, got "0"
 *   vgrpo generate: --guidance: expected a number, got "x"            (OPTS_DOUBLE; "a number in LO..HI" with bounds)
 *   vgrpo generate: --seed: expected a non-negative integer, got "-1" (OPTS_U64)
 *   vgrpo generate: unknown option "--foo"
 *   vgrpo generate: --out: missing value
 *   vgrpo bench kernels: --quick: takes no value                      (`--quick=1`)
 *   vgrpo generate: --out is required
 *   vgrpo eval: RECIPE is required
 *   vgrpo generate: unexpected argument "x"
 *
 * The caller exits 2 after a usage error (opts_exit_status). Checks that need more than one option, or a file,
 * stay with the caller; opts_fail prints them in the same format. */
#ifndef CLI_OPTS_H
#define CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

typedef enum {
    OPTS_FLAG,   /* no value; *flag = 1 */
    OPTS_STRING, /* *str = the argument (borrowed from argv) */
    OPTS_INT,    /* *i = a decimal integer in min..max (both 0: any int) */
    OPTS_DOUBLE, /* *d = a finite number in min..max (both 0: any finite number) */
    OPTS_U64,    /* *u64 = a non-negative integer (decimal, 0x hex or 0 octal, as strtoull base 0); seeds */
    OPTS_LIST,   /* list->v[list->n++] = the argument; may be given many times (`--set k=v`) */
} opts_type;

/* A repeatable option's values, in command-line order. v: caller-provided array of cap entries (cap >= argc is
 * always enough); n: entries filled (set n = 0 before parsing). */
typedef struct {
    const char **v;
    int n, cap;
} opts_list;

/* One option. name: long name without the dashes ("steps"). meta: the value's name in the usage ("N"; ignored
 * for OPTS_FLAG). help: its usage text (defaults written out by the caller, e.g. "steps (default 20)"; a '\n'
 * starts a continuation line, indented). required: an error when absent. Exactly the pointer of its type is set
 * (flag, str, i, d, u64 or list); seen, when set, becomes 1 when the option is given. */
typedef struct {
    const char *name;
    opts_type type;
    const char *meta;
    const char *help;
    int required;
    int *flag;
    const char **str;
    int *i;
    double *d;
    uint64_t *u64;
    opts_list *list;
    double min, max; /* OPTS_INT, OPTS_DOUBLE: inclusive bounds; min == max == 0: unbounded */
    int *seen;
} opts_spec;

/* One positional argument, in the order given on the command line. name: as shown in the usage and errors
 * ("RECIPE"); *dst = the argument (borrowed from argv). */
typedef struct {
    const char *name;
    const char **dst;
    int required;
    const char *help;
} opts_pos;

/* A subcommand. name: as typed after `vgrpo` ("generate", "bench kernels"): it prefixes every error. opts and
 * pos: tables ended by an entry with name NULL (either may be NULL: none). about: optional text printed after
 * the usage line; epilog: optional text printed after the option list. Both end without a newline. */
typedef struct {
    const char *name;
    const char *about;
    const opts_spec *opts;
    const opts_pos *pos;
    const char *epilog;
} opts_cmd;

enum {
    OPTS_OK = 0,    /* parsed; every required option and argument present */
    OPTS_HELP = 1,  /* -h / --help: the usage was printed to `out`; exit 0 */
    OPTS_USAGE = 2, /* a usage error was printed to `err`; exit 2 */
};

/* Parses argv[1..argc-1] (argv[0] is the subcommand's name and is skipped) against cmd, storing values through
 * the table's pointers as they are read (so a failed parse may have stored some). Writes the usage to `out` on
 * -h / --help and errors (formats above) plus the usage to `err` (stdout and stderr in production; tests pass
 * memory streams). Returns OPTS_OK, OPTS_HELP or OPTS_USAGE. A table mistake (an option without its pointer, an
 * OPTS_LIST whose array is full) is reported as a usage error naming the option, never a crash. */
int opts_parse(const opts_cmd *cmd, int argc, char **argv, FILE *out, FILE *err);

/* Writes cmd's usage to f: the usage line (positionals, required options, "[options]"), cmd->about, the
 * arguments and options with their help, -h/--help, cmd->epilog. */
void opts_usage(const opts_cmd *cmd, FILE *f);

/* For a usage error found after parsing (a bad combination of options, an unknown preset): writes
 * "vgrpo NAME: <message>", a blank line and the usage to err. Returns OPTS_USAGE. */
int opts_fail(const opts_cmd *cmd, FILE *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The process exit status for an opts_parse result: OPTS_HELP -> 0, OPTS_USAGE -> 2 (OPTS_OK -> 0). */
int opts_exit_status(int rc);

#endif
