/* tests/test_opts.c — the subcommands' option parser (cli/opts.h): values stored through the table, --name=value,
 * --help, repeatable options, positionals, and every error in its exact wording (stderr captured in memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/opts.h"
#include "tests/test.h"

/* The variables of a made-up subcommand "demo"; reset before each parse. */
static const char *recipe, *extra, *out_path, *set_v[16];
static int steps, workers, quick, seen_scale;
static double scale;
static uint64_t seed;
static opts_list sets;

static const opts_spec demo_opts[] = {
    {.name = "out", .type = OPTS_STRING, .str = &out_path, .required = 1, .meta = "DIR", .help = "output folder"},
    {.name = "steps", .type = OPTS_INT, .i = &steps, .meta = "N", .help = "steps (default 3)"},
    {.name = "workers", .type = OPTS_INT, .i = &workers, .min = 1, .max = 32, .meta = "N", .help = "workers"},
    {.name = "scale", .type = OPTS_DOUBLE, .d = &scale, .min = 0, .max = 2, .meta = "X", .seen = &seen_scale,
     .help = "a scale\nin 0..2"},
    {.name = "seed", .type = OPTS_U64, .u64 = &seed, .meta = "S", .help = "seed"},
    {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "K=V", .help = "override (repeatable)"},
    {.name = "quick", .type = OPTS_FLAG, .flag = &quick, .help = "a smoke run"},
    {0}};
static const opts_pos demo_pos[] = {{.name = "RECIPE", .dst = &recipe, .required = 1, .help = "the recipe"},
                                    {.name = "EXTRA", .dst = &extra, .help = "optional"},
                                    {0}};
static const opts_cmd demo = {.name = "demo", .opts = demo_opts, .pos = demo_pos};

/* Parses the NULL-terminated words (argv[0] "demo" added) into the variables above; stdout and stderr of the
 * parser land in outbuf / errbuf. Returns opts_parse's result. */
static int parse(char *outbuf, char *errbuf, size_t cap, const char *const *words) {
    recipe = extra = out_path = NULL;
    steps = 3, workers = 1, quick = 0, seen_scale = 0, scale = 1.0, seed = 0;
    sets = (opts_list){.v = set_v, .n = 0, .cap = 16};
    char *argv[64];
    int argc = 0;
    argv[argc++] = "demo";
    for (; *words; words++) argv[argc++] = (char *)*words;
    char *ob = NULL, *eb = NULL;
    size_t on = 0, en = 0;
    FILE *o = open_memstream(&ob, &on), *e = open_memstream(&eb, &en);
    int rc = opts_parse(&demo, argc, argv, o, e);
    fclose(o), fclose(e);
    snprintf(outbuf, cap, "%s", ob), snprintf(errbuf, cap, "%s", eb);
    free(ob), free(eb);
    return rc;
}

static int starts(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

TEST(opts_values_land_in_variables) {
    char o[8192], e[8192];
    int rc = parse(o, e, sizeof o,
                   ARGS("r.yaml", "--out", "d", "--steps=-7", "--workers", "32", "--scale", "0.25", "--seed", "0x10",
                        "--set", "a=1", "--quick", "--set=b=2", "more"));
    CHECK_MSG(rc == OPTS_OK, "rc %d, stderr: %s", rc, e);
    CHECK(!strcmp(recipe, "r.yaml") && !strcmp(extra, "more") && !strcmp(out_path, "d"));
    CHECK(steps == -7 && workers == 32 && scale == 0.25 && seen_scale == 1 && seed == 16 && quick == 1);
    CHECK(sets.n == 2 && !strcmp(sets.v[0], "a=1") && !strcmp(sets.v[1], "b=2"));
    CHECK(o[0] == 0 && e[0] == 0);
    /* defaults stay; the last of a repeated option wins; "--" makes the rest positional; a negative value */
    rc = parse(o, e, sizeof o, ARGS("--out", "x", "--out", "y", "--steps", "-2", "--", "--r.yaml"));
    CHECK_MSG(rc == OPTS_OK, "rc %d, stderr: %s", rc, e);
    CHECK(!strcmp(out_path, "y") && steps == -2 && workers == 1 && scale == 1.0 && !seen_scale && quick == 0);
    CHECK(!strcmp(recipe, "--r.yaml") && extra == NULL && sets.n == 0);
    rc = parse(o, e, sizeof o, ARGS("r", "--out=", "--seed", "18446744073709551615"));
    CHECK(rc == OPTS_OK && !strcmp(out_path, "") && seed == UINT64_MAX);
}

TEST(opts_help_goes_to_stdout) {
    char o[8192], e[8192];
    int rc = parse(o, e, sizeof o, ARGS("--steps", "x", "-h"));
    CHECK(rc == OPTS_HELP && opts_exit_status(rc) == 0 && e[0] == 0);
    CHECK_MSG(starts(o, "usage: vgrpo demo RECIPE [EXTRA] --out DIR [options]\n"), "%s", o);
    const char *want = "\narguments:\n"
                       "  RECIPE            the recipe\n"
                       "  EXTRA             optional\n"
                       "\noptions:\n"
                       "  --out DIR         output folder\n"
                       "  --steps N         steps (default 3)\n"
                       "  --workers N       workers\n"
                       "  --scale X         a scale\n"
                       "                    in 0..2\n"
                       "  --seed S          seed\n"
                       "  --set K=V         override (repeatable)\n"
                       "  --quick           a smoke run\n"
                       "  -h, --help        this help\n";
    CHECK_MSG(strstr(o, want) != NULL, "usage:\n%s", o);
    rc = parse(o, e, sizeof o, ARGS("--help"));
    CHECK(rc == OPTS_HELP && starts(o, "usage: vgrpo demo"));
}

/* Each error: exactly one message line, a blank line, then the usage; exit status 2. */
TEST(opts_errors_exact_wording) {
    const struct {
        const char *const *args;
        const char *msg;
    } cases[] = {
        {ARGS("r", "--out", "d", "--steps", "x"), "vgrpo demo: --steps: expected an integer, got \"x\""},
        {ARGS("r", "--out", "d", "--steps", "1.5"), "vgrpo demo: --steps: expected an integer, got \"1.5\""},
        {ARGS("r", "--out", "d", "--steps", "99999999999"),
         "vgrpo demo: --steps: expected an integer in -2147483648..2147483647, got \"99999999999\""},
        {ARGS("r", "--out", "d", "--workers", "40"), "vgrpo demo: --workers: expected an integer in 1..32, got \"40\""},
        {ARGS("r", "--out", "d", "--workers=0"), "vgrpo demo: --workers: expected an integer in 1..32, got \"0\""},
        {ARGS("r", "--out", "d", "--scale", "abc"), "vgrpo demo: --scale: expected a number, got \"abc\""},
        {ARGS("r", "--out", "d", "--scale", "nan"), "vgrpo demo: --scale: expected a number, got \"nan\""},
        {ARGS("r", "--out", "d", "--scale", "2.5"), "vgrpo demo: --scale: expected a number in 0..2, got \"2.5\""},
        {ARGS("r", "--out", "d", "--seed", "-1"), "vgrpo demo: --seed: expected a non-negative integer, got \"-1\""},
        {ARGS("r", "--out", "d", "--foo"), "vgrpo demo: unknown option \"--foo\""},
        {ARGS("r", "--out", "d", "--foo=3"), "vgrpo demo: unknown option \"--foo\""},
        {ARGS("r", "--out", "d", "-x"), "vgrpo demo: unknown option \"-x\""},
        {ARGS("r", "--out"), "vgrpo demo: --out: missing value"},
        {ARGS("r", "--out", "--quick"), "vgrpo demo: --out: missing value"},
        {ARGS("r", "--out", "d", "--quick=1"), "vgrpo demo: --quick: takes no value"},
        {ARGS("r", "--steps", "2"), "vgrpo demo: --out is required"},
        {ARGS("--out", "d"), "vgrpo demo: RECIPE is required"},
        {ARGS("r", "e", "x", "--out", "d"), "vgrpo demo: unexpected argument \"x\""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char o[8192], e[8192], want[512];
        int rc = parse(o, e, sizeof o, cases[k].args);
        snprintf(want, sizeof want, "%s\n\nusage: vgrpo demo RECIPE [EXTRA] --out DIR [options]\n", cases[k].msg);
        CHECK_MSG(rc == OPTS_USAGE && opts_exit_status(rc) == 2, "case %zu: rc %d", k, rc);
        CHECK_MSG(starts(e, want), "case %zu: stderr\n%s\nwant it to start with\n%s", k, e, want);
        CHECK_MSG(strstr(e, "  -h, --help") != NULL, "case %zu: no usage after the message", k);
        CHECK_MSG(o[0] == 0, "case %zu: wrote to stdout: %s", k, o);
    }
}

TEST(opts_list_full_and_fail) {
    char o[8192], e[8192];
    const char *words[48];
    int n = 0;
    words[n++] = "r", words[n++] = "--out", words[n++] = "d";
    for (int k = 0; k < 17; k++) words[n++] = "--set", words[n++] = "a=1";
    words[n] = NULL;
    int rc = parse(o, e, sizeof o, words);
    CHECK_MSG(rc == OPTS_USAGE && starts(e, "vgrpo demo: --set: given more than 16 times\n\nusage: vgrpo demo"), "rc %d: %s", rc, e);
    /* opts_fail: the same format for checks made after parsing */
    char *eb = NULL;
    size_t en = 0;
    FILE *f = open_memstream(&eb, &en);
    rc = opts_fail(&demo, f, "--preset %s: unknown", "wan3");
    fclose(f);
    CHECK(rc == OPTS_USAGE && starts(eb, "vgrpo demo: --preset wan3: unknown\n\nusage: vgrpo demo"));
    free(eb);
}

/* A table without options or positionals: any argument is an error; the usage has only -h. */
TEST(opts_empty_table) {
    const opts_cmd c = {.name = "bench dit", .about = "times one block"};
    char *ob = NULL, *eb = NULL;
    size_t on = 0, en = 0;
    FILE *o = open_memstream(&ob, &on), *e = open_memstream(&eb, &en);
    char *argv1[] = {"dit", NULL};
    CHECK(opts_parse(&c, 1, argv1, o, e) == OPTS_OK);
    char *argv2[] = {"dit", "x", NULL};
    CHECK(opts_parse(&c, 2, argv2, o, e) == OPTS_USAGE);
    fclose(o), fclose(e);
    CHECK_MSG(!strcmp(eb, "vgrpo bench dit: unexpected argument \"x\"\n\nusage: vgrpo bench dit\n\ntimes one block\n\n"
                          "options:\n  -h, --help        this help\n"),
              "%s", eb);
    free(ob), free(eb);
}
