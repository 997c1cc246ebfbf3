// cli/options.h, the one command-line parser: each kind of option, ranges and their ends,
// defaults, --opt=value, unknown options, missing values and required arguments, positionals,
// the forms of a command of several synopsis lines, --help generated from the table, and what
// cli_args prints and returns.
#define _POSIX_C_SOURCE 200809L // open_memstream
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/options.h"
#include "test_util.h"

typedef struct {
    const char *config, *name;
    int verbose, mode;
    int64_t steps;
    double rate;
    cli_list sets, files;
} opts;

static const char *const modes[] = {"fast", "slow", "exact", NULL};

static const cli_option options[] = {
    {"CONFIG", CLI_POSITIONAL(opts, config), .flags = CLI_REQUIRED, .expect = "a CONFIG file"},
    {"--steps", CLI_INT(opts, steps), .value = "N", .lo = 1, .hi = 1000, .def = "10",
     .help = "steps to run"},
    {"--rate", CLI_NUMBER(opts, rate), .value = "R", .lo = 0, .hi = 1, .flags = CLI_LO_OPEN,
     .help = "a rate in (0, 1]"},
    {"--name", CLI_STRING(opts, name), .value = "TEXT", .flags = CLI_REQUIRED, .help = "a name"},
    {"--mode", CLI_CHOICE(opts, mode), .choices = modes, .def = "fast", .help = "how"},
    {"--set", CLI_LIST(opts, sets), .value = "K=V", .help = "an override, repeatable"},
    {"--files", CLI_LIST(opts, files), .value = "FILE...", .flags = CLI_MANY,
     .help = "one or more files"},
    {"-v", CLI_FLAG(opts, verbose), .help = "say more"},
    {0}};

static const cli_command cmd = {
    .name = "moe try", .about = "  Tries things.\n", .options = options, .value_error_exit = 1};

static char last_msg[1024]; // the message of the last parse ("": none)

static cli_outcome parse_v(opts *o, char **argv, int argc) {
    memset(o, 0, sizeof *o);
    cli_outcome how;
    last_msg[0] = 0;
    if (cli_parse(&cmd, argc, argv, o, &how))
        snprintf(last_msg, sizeof last_msg, "%s", moe_last_error());
    return how;
}

// Whether parsing the NULL-terminated arguments into *o ends with outcome want and, unless
// msg is NULL, the message msg ("": none); prints what it got when not.
static int parses(opts *o, cli_outcome want, const char *msg, const char *first, ...) {
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 32; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    const cli_outcome how = parse_v(o, argv, argc);
    const int ok = how == want && (!msg || !strcmp(last_msg, msg));
    if (!ok) printf("    got outcome %d, message '%s'\n", (int)how, last_msg);
    return ok;
}

static void case_kinds(void) {
    opts o;
    check_true("minimal: parsed", parses(&o, CLI_PARSED, "", "c.cfg", "--name", "x", NULL));
    check_true("positional", o.config && !strcmp(o.config, "c.cfg"));
    check_true("defaults: --steps 10, --mode fast (index 0)", o.steps == 10 && o.mode == 0);
    check_true("no default: the field as the caller left it", o.rate == 0 && !o.verbose);
    const int all = parses(&o, CLI_PARSED, "", "--name=a=b", "--steps", "1000", "--rate=1",
                           "--mode", "exact", "-v", "c.cfg", "--set", "a=1", "--set=b=2", "--files",
                           "f1", "-", "f3", "--steps=1", NULL);
    check_true("every kind: parsed", all);
    check_true("string --name=a=b: after the first '='", !strcmp(o.name, "a=b"));
    check_true("int: the last one wins", o.steps == 1);
    check_true("number --rate=1 (hi, closed)", o.rate == 1);
    check_true("choice: the index", o.mode == 2);
    check_true("flag", o.verbose == 1);
    check_true("list: repeated, both forms, in order",
               o.sets.n == 2 && !strcmp(o.sets.v[0], "a=1") && !strcmp(o.sets.v[1], "b=2"));
    check_true("CLI_MANY list: up to the next --option ('-' is a value)",
               o.files.n == 3 && !strcmp(o.files.v[1], "-") && !strcmp(o.files.v[2], "f3"));
    cli_free(&cmd, &o);
    check_true("cli_free empties the lists", !o.sets.v && !o.sets.n && !o.files.v);
    check_true("a value may start with '-', and --help after a value option is its value",
               parses(&o, CLI_PARSED, "", "c", "--name", "-5", "--set", "--help", NULL) &&
                   !strcmp(o.name, "-5") && !strcmp(o.sets.v[0], "--help"));
    cli_free(&cmd, &o);
}

static void case_ranges(void) {
    opts o;
    const cli_outcome V = CLI_BAD_VALUE;
    check_true("int lo", parses(&o, CLI_PARSED, "", "c", "--name", "x", "--steps", "1", NULL));
    check_true("int hi", parses(&o, CLI_PARSED, "", "c", "--name", "x", "--steps", "1000", NULL));
    check_true("int below lo", parses(&o, V, "--steps '0': expected an integer in [1, 1000]", "c",
                                      "--steps", "0", NULL));
    check_true("int above hi", parses(&o, V, "--steps '1001': expected an integer in [1, 1000]",
                                      "c", "--steps", "1001", NULL));
    check_true("int: not a number, a fraction, trailing text, overflow, empty",
               parses(&o, V, NULL, "--steps", "x", NULL) &&
                   parses(&o, V, NULL, "--steps", "2.5", NULL) &&
                   parses(&o, V, NULL, "--steps", "5k", NULL) &&
                   parses(&o, V, NULL, "--steps", "99999999999999999999", NULL) &&
                   parses(&o, V, NULL, "--steps=", NULL));
    check_true("number: the open lo",
               parses(&o, V, "--rate '0': expected a number in (0, 1]", "--rate", "0", NULL));
    check_true("number: above hi, nan, inf, text", parses(&o, V, NULL, "--rate", "1.0001", NULL) &&
                                                       parses(&o, V, NULL, "--rate", "nan", NULL) &&
                                                       parses(&o, V, NULL, "--rate", "inf", NULL) &&
                                                       parses(&o, V, NULL, "--rate", "0.5x", NULL));
    check_true("number: just above lo",
               parses(&o, CLI_PARSED, "", "c", "--name", "x", "--rate", "1e-300", NULL));
    check_true(
        "choice: not one of them",
        parses(&o, V, "--mode 'quick': expected fast, slow or exact", "--mode", "quick", NULL));
}

static void case_usage(void) {
    opts o;
    const cli_outcome U = CLI_BAD_USAGE;
    check_true("unknown option (the whole argument)",
               parses(&o, U, "unknown option '--bogus=1'", "c", "--bogus=1", NULL));
    check_true("missing value", parses(&o, U, "'--steps' needs a value", "c", "--steps", NULL));
    check_true("missing value of a list",
               parses(&o, U, "'--files' needs a value", "c", "--files", NULL));
    check_true("a flag with a value", parses(&o, U, "'-v' takes no value", "c", "-v=1", NULL));
    check_true("a required option missing", parses(&o, U, "--name is required", "c", NULL));
    check_true("a required positional missing",
               parses(&o, U, "a CONFIG file is required", "--name", "x", NULL));
    check_true("two positionals",
               parses(&o, U, "more than one CONFIG: 'a' and 'b'", "a", "b", NULL));
    check_true("the first error in argv order wins",
               parses(&o, U, "unknown option '--x'", "--x", "--steps", "0", NULL));
    check_true("--help", parses(&o, CLI_HELP, "", "c", "--help", "--bogus", NULL));
    check_true("-h without the required arguments", parses(&o, CLI_HELP, "", "-h", NULL));
    check_true("an error before --help wins",
               parses(&o, U, "unknown option '--bogus'", "--bogus", "--help", NULL));
    static const cli_option none[] = {{"--a", CLI_FLAG(opts, verbose)}, {0}};
    static const cli_command no_positional = {.name = "moe none", .options = none};
    char a[] = "stray", *argv[] = {a};
    cli_outcome how;
    check_true("no positional: an operand is an unknown argument",
               cli_parse(&no_positional, 1, argv, &o, &how) && how == U &&
                   !strcmp(moe_last_error(), "unknown argument 'stray'"));
}

// A command of three forms: plain, --deep (with --depth), --deep --wide (with --width too).
typedef struct {
    const char *dir;
    int deep, wide, json;
    int64_t depth, width;
} fopts;

enum { PLAIN, DEEP, DEEP_WIDE };
static const cli_option form_options[] = {
    {"DIR", CLI_POSITIONAL(fopts, dir), .flags = CLI_REQUIRED},
    {"--deep", CLI_FLAG(fopts, deep), .flags = CLI_SELECTOR, .forms = 1 << DEEP | 1 << DEEP_WIDE,
     .help = "deep"},
    {"--wide", CLI_FLAG(fopts, wide), .flags = CLI_SELECTOR, .forms = 1 << DEEP_WIDE,
     .help = "wide"},
    {"--depth", CLI_INT(fopts, depth), .value = "D", .lo = 0, .hi = 9,
     .forms = 1 << DEEP | 1 << DEEP_WIDE, .help = "how deep"},
    {"--width", CLI_INT(fopts, width), .value = "W", .lo = 0, .hi = 9, .forms = 1 << DEEP_WIDE,
     .help = "how wide"},
    {"--json", CLI_FLAG(fopts, json), .forms = 1 << PLAIN, .help = "JSON"},
    {0}};
static const cli_command form_cmd = {.name = "moe f", .options = form_options, .n_forms = 3};

static cli_outcome fparse(const char *msg_want, int argc, char **argv) {
    fopts o = {0};
    cli_outcome how;
    const moe_status st = cli_parse(&form_cmd, argc, argv, &o, &how);
    char what[300];
    snprintf(what, sizeof what, "forms: '%s' (got '%s')", msg_want, st ? moe_last_error() : "");
    check_true(what, !strcmp(st ? moe_last_error() : "", msg_want));
    return how;
}

static void case_forms(void) {
    char d[] = "d", deep[] = "--deep", wide[] = "--wide", depth[] = "--depth=1",
         width[] = "--width=2", json[] = "--json";
    char *plain_json[] = {d, json}, *deep_depth[] = {d, deep, depth},
         *all[] = {d, wide, deep, depth, width}, *needs[] = {d, depth},
         *needs_wide[] = {d, deep, width}, *not_of[] = {d, deep, json}, *only_wide[] = {d, wide};
    check_true("plain form", fparse("", 2, plain_json) == CLI_PARSED);
    check_true("--deep form", fparse("", 3, deep_depth) == CLI_PARSED);
    check_true("--deep --wide form, selectors in any order", fparse("", 5, all) == CLI_PARSED);
    check_true("an option of another form: what it needs",
               fparse("--depth needs --deep", 2, needs) == CLI_BAD_USAGE);
    check_true("... from a form with fewer selectors",
               fparse("--width needs --wide", 3, needs_wide) == CLI_BAD_USAGE);
    check_true("an option the form picked does not have",
               fparse("--json is not an option of moe f --deep", 3, not_of) == CLI_BAD_USAGE);
    check_true("selectors of no form",
               fparse("these options do not go together", 2, only_wide) == CLI_BAD_USAGE);
}

// The help as a string (malloc'd).
static char *help_of(const cli_command *c) {
    char *text;
    size_t n;
    FILE *f = open_memstream(&text, &n);
    cli_help(c, f);
    fclose(f);
    return text;
}

static void case_help(void) {
    char *h = help_of(&cmd);
    const char *want = "usage: moe try CONFIG [--steps N] [--rate R] --name TEXT [--mode "
                       "fast|slow|exact] [--set K=V]...\n"
                       "               [--files FILE...] [-v]\n"
                       "\n"
                       "  Tries things.\n"
                       "  --steps N               steps to run (default 10)\n"
                       "  --rate R                a rate in (0, 1]\n"
                       "  --name TEXT             a name\n"
                       "  --mode fast|slow|exact  how (default fast)\n"
                       "  --set K=V               an override, repeatable\n"
                       "  --files FILE...         one or more files\n"
                       "  -v                      say more\n";
    check_true("help: synopsis (wrapped at 96), about, options with defaults", !strcmp(h, want));
    if (strcmp(h, want)) printf("--- got:\n%s--- want:\n%s", h, want);
    free(h);
    h = help_of(&form_cmd);
    const char *fwant = "usage: moe f DIR [--json]\n"
                        "       moe f DIR --deep [--depth D]\n"
                        "       moe f DIR --deep --wide [--depth D] [--width W]\n";
    check_true("help: a synopsis line per form, selectors first and bare",
               !strncmp(h, fwant, strlen(fwant)));
    if (strncmp(h, fwant, strlen(fwant))) printf("--- got:\n%s--- want:\n%s", h, fwant);
    free(h);
    // a long help text wraps under its column; no line passes 96 characters
    static const cli_option long_options[] = {
        {"--a-very-long-option-name", CLI_STRING(opts, name), .value = "VALUE",
         .help = "a help text long enough to wrap: it goes on and on past the ninety-six columns "
                 "of a line and then some more words"},
        {"-x", CLI_FLAG(opts, verbose), .help = "x"},
        {0}};
    static const cli_command long_cmd = {.name = "moe long", .options = long_options};
    h = help_of(&long_cmd);
    int longest = 0, len = 0;
    for (const char *p = h; *p; p++)
        len = *p == '\n' ? 0 : len + 1, longest = len > longest ? len : longest;
    check_true("help: lines of at most 96 characters", longest <= 96);
    check_true("help: a label over 22 characters puts its help on the next line",
               strstr(h, "  --a-very-long-option-name VALUE\n"
                         "                          a help") != NULL);
    free(h);
}

// cli_args: what it prints where, and the exit status.
static int run_args(int argc, char **argv, char **out, char **err) {
    size_t no, ne;
    FILE *fo = open_memstream(out, &no), *fe = open_memstream(err, &ne);
    opts o = {0};
    const int rc = cli_args(&cmd, argc, argv, &o, fo, fe);
    fclose(fo), fclose(fe);
    cli_free(&cmd, &o);
    return rc;
}

static void case_args(void) {
    char c[] = "c", name[] = "--name", x[] = "x", help[] = "--help", bogus[] = "--bogus",
         steps[] = "--steps", zero[] = "0";
    char *ok[] = {c, name, x}, *h[] = {c, help}, *u[] = {c, bogus},
         *v[] = {c, name, x, steps, zero};
    char *out, *err;
    check_true("cli_args: CLI_RUN", run_args(3, ok, &out, &err) == CLI_RUN && !*out && !*err);
    free(out), free(err);
    check_true("cli_args --help: 0, the usage on out",
               run_args(2, h, &out, &err) == 0 && !strncmp(out, "usage: moe try ", 15) && !*err);
    free(out), free(err);
    check_true(
        "cli_args usage error: 2, message, blank line, usage on err",
        run_args(2, u, &out, &err) == 2 && !*out &&
            !strncmp(err, "moe try: error: unknown option '--bogus'\n\nusage: moe try ", 56));
    free(out), free(err);
    check_true("cli_args bad value, value_error_exit 1: 1, the message only",
               run_args(5, v, &out, &err) == 1 &&
                   !strcmp(err, "moe try: error: --steps '0': expected an integer in [1, 1000]\n"));
    free(out), free(err);
}

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {{"kinds", case_kinds}, {"ranges", case_ranges}, {"usage", case_usage},
                 {"forms", case_forms}, {"help", case_help},     {"args", case_args}};
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (!strcmp(which, "all") || !strcmp(which, cases[i].name)) cases[i].run(), ran++;
    if (!ran) {
        fprintf(stderr, "usage: test_options [kinds|ranges|usage|forms|help|args|all]\n");
        return 2;
    }
    printf("%s\n", test_failures() ? "FAILED" : "ok");
    return test_failures() != 0;
}
