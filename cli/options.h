// cli/options.h: the one command-line parser. A command describes its options in one table
// (cli_option[], each entry: the option's name, its kind, where its value goes in the
// command's options struct, its range, default and help); cli_parse reads argv into that
// struct from the table, and cli_help prints the command's --help from the same table, so
// that the usage text and the parser cannot disagree.
//
// What every command then accepts: options and positionals in any order; `--opt VALUE` and
// `--opt=VALUE`; `--help` or `-h` where an option may stand (not as an option's value:
// `moe generate --prompt --help` is a prompt); the last of a repeated scalar option wins.
// Messages (the same words everywhere): "unknown option '--x'", "'--x' needs a value",
// "'--x' takes no value", "--x 'v': expected an integer in [1, 10]", "--x is required",
// "a CONFIG file is required", "more than one CONFIG: 'a' and 'b'", "unknown argument 'a'".
#ifndef MOE_CLI_OPTIONS_H
#define MOE_CLI_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "layers/status.h"

typedef enum {
    CLI_KIND_END = 0,   // ends a table ({0})
    CLI_KIND_FLAG,      // --wide: an int set to 1
    CLI_KIND_INT,       // --seq-len S: an int64_t, decimal, in [lo, hi]
    CLI_KIND_NUMBER,    // --top-p P: a finite double in [lo, hi] (CLI_LO_OPEN, CLI_HI_OPEN)
    CLI_KIND_STRING,    // --ckpt DIR: a const char * (the argv string itself)
    CLI_KIND_CHOICE,    // --dtype fp32|bf16: an int, the index of the value in .choices
    CLI_KIND_LIST,      // --set K=V, repeatable: a cli_list; with CLI_MANY --text A B...
    CLI_KIND_POSITIONAL // CONFIG: a const char *, an argument that is not an option
} cli_kind;

// The values of a CLI_KIND_LIST option, in argv order (the argv strings; v is allocated by
// cli_parse and freed by cli_free).
typedef struct {
    const char **v;
    int n;
} cli_list;

enum {
    CLI_REQUIRED = 1 << 0, // an error when absent (in the forms it belongs to)
    CLI_LO_OPEN = 1 << 1,  // CLI_KIND_NUMBER: lo itself is out of range, (lo, hi]
    CLI_HI_OPEN = 1 << 2,  // CLI_KIND_NUMBER: hi itself is out of range, [lo, hi)
    CLI_MANY = 1 << 3,     // CLI_KIND_LIST: one option takes every following argument up to
                           // the next one that starts with "--" (--text A B C)
    CLI_SELECTOR = 1 << 4, // names the forms it belongs to (stats --capacity): see .forms
};

typedef struct {
    const char *name;   // "--seq-len", "-n"; a positional: its name in the usage ("CONFIG")
    cli_kind kind;      // set with the field by CLI_FLAG(T, f) ... CLI_POSITIONAL(T, f)
    size_t at;          // where the value goes: its offset in the command's options struct
    const char *value;  // the value's name in the usage ("S", "FILE.bin"); a choice: the
                        // choices joined by '|' when NULL
    const char *help;   // one paragraph for --help (wrapped there); NULL: not listed
    const char *def;    // the default, read as if given before argv and printed in --help;
                        // NULL: the field keeps what the caller put there
    double lo, hi;      // CLI_KIND_INT, CLI_KIND_NUMBER: the range
    const char *expect; // what a bad value should have been ("a step >= 1"); NULL: said from
                        // the kind and the range. A positional: what its absence lacks
                        // ("a CONFIG file"; NULL: "a NAME")
    const char *const *choices; // CLI_KIND_CHOICE: the values, NULL-terminated
    unsigned flags;             // CLI_REQUIRED, ...
    // The forms of a command with several synopsis lines (moe stats: the report, --capacity,
    // --watch, --placement): bit f set when the option belongs to form f (0: every form). A
    // CLI_SELECTOR option is required in its forms, and the selectors given pick the form:
    // the one whose selectors are exactly those. An option outside the form picked is a
    // usage error ("--max-drop needs --capacity").
    unsigned forms;
} cli_option;

// The field of an options struct T that an entry's value goes to, and its kind: the field's
// type is checked at compile time (a CLI_KIND_INT field is an int64_t, ...).
#define CLI_FIELD_(T, f, type, k) \
    .kind = k, .at = offsetof(T, f) + _Generic(((T *)0)->f, type : (size_t)0)
#define CLI_FLAG(T, f) CLI_FIELD_(T, f, int, CLI_KIND_FLAG)
#define CLI_INT(T, f) CLI_FIELD_(T, f, int64_t, CLI_KIND_INT)
#define CLI_NUMBER(T, f) CLI_FIELD_(T, f, double, CLI_KIND_NUMBER)
#define CLI_STRING(T, f) CLI_FIELD_(T, f, const char *, CLI_KIND_STRING)
#define CLI_CHOICE(T, f) CLI_FIELD_(T, f, int, CLI_KIND_CHOICE)
#define CLI_LIST(T, f) CLI_FIELD_(T, f, cli_list, CLI_KIND_LIST)
#define CLI_POSITIONAL(T, f) CLI_FIELD_(T, f, const char *, CLI_KIND_POSITIONAL)

typedef struct {
    const char *name;          // the command as typed: "moe eval", "bench_moe_layer"
    const char *about;         // printed verbatim between the synopsis and the options
    const cli_option *options; // the table, ended by {0}; at most CLI_MAX_OPTIONS entries
    int n_forms;               // synopsis lines (0 or 1: one form)
    int value_error_exit;      // the exit status of a bad value: 0 or 2, a usage error
                               // (message and usage); 1, an error (the message only)
} cli_command;

#define CLI_MAX_OPTIONS 64
#define CLI_MAX_FORMS 8

// How cli_parse ended.
typedef enum {
    CLI_PARSED,    // opts holds the arguments
    CLI_HELP,      // --help or -h: the caller prints cli_help
    CLI_BAD_USAGE, // an unknown option, a missing value or required argument, ...
    CLI_BAD_VALUE, // a value of the wrong kind or out of its range
} cli_outcome;

// Reads argv[0..argc) (the command's arguments, without the program and command names) into
// opts, the struct the table's fields are in: first the defaults (.def), then argv. Returns
// MOE_OK (*how: CLI_PARSED or CLI_HELP), MOE_EINVAL (*how: CLI_BAD_USAGE or CLI_BAD_VALUE,
// the message in moe_last_error) or MOE_ENOMEM. The lists' arrays are allocated also on
// error: cli_free frees them either way.
moe_status cli_parse(const cli_command *c, int argc, char **argv, void *opts, cli_outcome *how);

// cli_parse as a command runs it: returns CLI_RUN when opts holds the arguments, else the exit
// status after printing: 0 after the help on out; 2 after a usage error on err ("NAME: error:
// MESSAGE", a blank line, the usage); value_error_exit for a bad value; 1 out of memory.
#define CLI_RUN (-1)
int cli_args(const cli_command *c, int argc, char **argv, void *opts, FILE *out, FILE *err);

// The command's --help: the synopsis (a line per form, wrapped), the about text, then each
// option with a help text, its value and its default.
void cli_help(const cli_command *c, FILE *out);

// A usage error that the command finds after parsing (two options that contradict each
// other): "NAME: error: MESSAGE", a blank line and the usage on err. Returns 2.
int cli_usage_error(const cli_command *c, FILE *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Frees what cli_parse allocated in opts (the lists' arrays) and empties the lists.
void cli_free(const cli_command *c, void *opts);

#endif
