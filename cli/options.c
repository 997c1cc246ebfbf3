// cli/options.c: the table-driven parser and --help printer of cli/options.h.
#include "cli/options.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define CLI_WIDTH 96     // --help lines are at most this long (as the usage texts were)
#define CLI_MAX_LABEL 22 // a longer option label puts its help on the next line
#define CLI_MSG 1024

// ---- the table ------------------------------------------------------------------------

static int table_size(const cli_command *c) {
    int n = 0;
    while (c->options[n].kind != CLI_KIND_END) n++;
    return n;
}

static int n_forms(const cli_command *c) { return c->n_forms > 1 ? c->n_forms : 1; }

static int in_form(const cli_option *o, int f) { return !o->forms || (o->forms >> f & 1); }

static int takes_value(const cli_option *o) {
    return o->kind != CLI_KIND_FLAG && o->kind != CLI_KIND_POSITIONAL;
}

// The option named by argument a ("--seq-len" or "--seq-len=128"), or -1.
static int find_option(const cli_command *c, int n, const char *a) {
    const size_t len = strcspn(a, "=");
    for (int k = 0; k < n; k++) {
        const cli_option *o = &c->options[k];
        if (o->kind != CLI_KIND_POSITIONAL && strlen(o->name) == len && !strncmp(o->name, a, len))
            return k;
    }
    return -1;
}

// ---- values ---------------------------------------------------------------------------

// What a bad value of o should have been: o->expect, or said from its kind and range.
static const char *expected(const cli_option *o, char *buf, size_t size) {
    if (o->expect) return o->expect;
    if (o->kind == CLI_KIND_INT)
        snprintf(buf, size, "an integer in [%lld, %lld]", (long long)o->lo, (long long)o->hi);
    else if (o->kind == CLI_KIND_NUMBER)
        snprintf(buf, size, "a number in %c%g, %g%c", o->flags & CLI_LO_OPEN ? '(' : '[', o->lo,
                 o->hi, o->flags & CLI_HI_OPEN ? ')' : ']');
    else if (o->kind == CLI_KIND_CHOICE) {
        size_t used = 0;
        buf[0] = 0;
        for (int i = 0; o->choices[i] && used < size; i++)
            used += (size_t)snprintf(buf + used, size - used, "%s%s",
                                     !i                  ? ""
                                     : o->choices[i + 1] ? ", "
                                                         : " or ",
                                     o->choices[i]);
    } else
        snprintf(buf, size, "a value");
    return buf;
}

static int parse_int(const cli_option *o, const char *v, int64_t *x) {
    char *end;
    errno = 0;
    const long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || (double)n < o->lo || (double)n > o->hi) return 0;
    *x = n;
    return 1;
}

static int parse_number(const cli_option *o, const char *v, double *x) {
    char *end;
    errno = 0;
    const double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || d < o->lo || d > o->hi) return 0;
    if ((o->flags & CLI_LO_OPEN && d == o->lo) || (o->flags & CLI_HI_OPEN && d == o->hi)) return 0;
    *x = d;
    return 1;
}

static int parse_choice(const cli_option *o, const char *v, int *x) {
    for (int i = 0; o->choices[i]; i++)
        if (!strcmp(o->choices[i], v)) return *x = i, 1;
    return 0;
}

// Appends v to the list at l; the array has room for every argument (room) on first use.
static moe_status list_add(cli_list *l, const char *v, int room) {
    if (!l->v && !(l->v = calloc((size_t)room + 1, sizeof *l->v)))
        return moe_error(MOE_ENOMEM, "out of memory");
    l->v[l->n++] = v;
    return MOE_OK;
}

// Stores value v of option o in opts; MOE_EINVAL with "--x 'v': expected ..." when v is not
// of o's kind or range. room: the most values a list can get.
static moe_status set_value(const cli_option *o, const char *v, void *opts, int room) {
    char *at = (char *)opts + o->at, buf[256];
    int ok = 1;
    switch (o->kind) {
    case CLI_KIND_FLAG: *(int *)at = 1; break;
    case CLI_KIND_INT: ok = parse_int(o, v, (int64_t *)at); break;
    case CLI_KIND_NUMBER: ok = parse_number(o, v, (double *)at); break;
    case CLI_KIND_CHOICE: ok = parse_choice(o, v, (int *)at); break;
    case CLI_KIND_LIST: return list_add((cli_list *)at, v, room);
    default: *(const char **)at = v; break; // a string, a positional
    }
    if (!ok)
        return moe_error(MOE_EINVAL, "%s '%s': expected %s", o->name, v,
                         expected(o, buf, sizeof buf));
    return MOE_OK;
}

// ---- parsing --------------------------------------------------------------------------

typedef struct {
    const cli_command *c;
    int n, argc;
    char **argv;
    void *opts;
    cli_outcome *how;
    unsigned char seen[CLI_MAX_OPTIONS];
} parser;

// A usage error (MOE_EINVAL, *how = CLI_BAD_USAGE) with the message fmt.
__attribute__((format(printf, 2, 3))) static moe_status bad_usage(parser *p, const char *fmt, ...) {
    char msg[CLI_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *p->how = CLI_BAD_USAGE;
    return moe_error(MOE_EINVAL, "%s", msg);
}

// set_value, telling a bad value from running out of memory.
static moe_status take_value(parser *p, int k, const char *v) {
    const moe_status st = set_value(&p->c->options[k], v, p->opts, p->argc);
    if (st == MOE_EINVAL) *p->how = CLI_BAD_VALUE;
    return st;
}

// The option at argv[*i] (with its value or values, moving *i past them).
static moe_status take_option(parser *p, int *i) {
    const char *a = p->argv[*i];
    const int k = find_option(p->c, p->n, a);
    if (k < 0) return bad_usage(p, "unknown option '%s'", a);
    const cli_option *o = &p->c->options[k];
    const char *eq = strchr(a, '=');
    p->seen[k] = 1;
    if (!takes_value(o)) {
        if (eq) return bad_usage(p, "'%.*s' takes no value", (int)(eq - a), a);
        return take_value(p, k, NULL);
    }
    if (!eq && *i + 1 >= p->argc) return bad_usage(p, "'%s' needs a value", a);
    moe_status st = take_value(p, k, eq ? eq + 1 : p->argv[++*i]);
    while (!st && o->flags & CLI_MANY && *i + 1 < p->argc && strncmp(p->argv[*i + 1], "--", 2))
        st = take_value(p, k, p->argv[++*i]);
    return st;
}

// The argument a that is not an option: the first positional not yet given.
static moe_status take_positional(parser *p, const char *a) {
    int last = -1;
    for (int k = 0; k < p->n; k++) {
        if (p->c->options[k].kind != CLI_KIND_POSITIONAL) continue;
        if (!p->seen[k]) {
            p->seen[k] = 1;
            return take_value(p, k, a);
        }
        last = k;
    }
    if (last < 0) return bad_usage(p, "unknown argument '%s'", a);
    const cli_option *o = &p->c->options[last];
    return bad_usage(p, "more than one %s: '%s' and '%s'", o->name,
                     *(const char **)((char *)p->opts + o->at), a);
}

// The selectors of form f, joined by spaces (used + size bound the buffer).
static void form_selectors(const parser *p, int f, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int k = 0; k < p->n && used < size; k++) {
        const cli_option *o = &p->c->options[k];
        if (o->flags & CLI_SELECTOR && in_form(o, f))
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? " " : "", o->name);
    }
}

// The form whose selectors are exactly the selectors given.
static moe_status pick_form(parser *p, int *form) {
    int given[2] = {-1, -1}, n_given = 0;
    for (int f = 0; f < n_forms(p->c); f++) {
        int match = 1;
        for (int k = 0; k < p->n; k++)
            if (p->c->options[k].flags & CLI_SELECTOR &&
                p->seen[k] != in_form(&p->c->options[k], f))
                match = 0;
        if (match) return *form = f, MOE_OK;
    }
    for (int k = 0; k < p->n && n_given < 2; k++)
        if (p->c->options[k].flags & CLI_SELECTOR && p->seen[k]) given[n_given++] = k;
    if (n_given < 2) return bad_usage(p, "these options do not go together");
    return bad_usage(p, "%s and %s do not go together", p->c->options[given[0]].name,
                     p->c->options[given[1]].name);
}

// The required options and positionals of form f are there.
static moe_status check_required(parser *p, int f) {
    for (int k = 0; k < p->n; k++) {
        const cli_option *o = &p->c->options[k];
        if (!(o->flags & CLI_REQUIRED) || p->seen[k] || !in_form(o, f)) continue;
        if (o->kind != CLI_KIND_POSITIONAL) return bad_usage(p, "%s is required", o->name);
        if (o->expect) return bad_usage(p, "%s is required", o->expect);
        return bad_usage(p, "a %s is required", o->name);
    }
    return MOE_OK;
}

// Whether every selector of form f is one of form g's.
static int selectors_within(const parser *p, int f, int g) {
    for (int k = 0; k < p->n; k++) {
        const cli_option *o = &p->c->options[k];
        if (o->flags & CLI_SELECTOR && in_form(o, f) && !in_form(o, g)) return 0;
    }
    return 1;
}

// The selectors of form g that form f lacks, joined by " and ".
static void missing_selectors(const parser *p, int f, int g, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int k = 0; k < p->n && used < size; k++) {
        const cli_option *o = &p->c->options[k];
        if (o->flags & CLI_SELECTOR && in_form(o, g) && !in_form(o, f))
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used ? " and " : "", o->name);
    }
}

// Every option given belongs to form f. One that does not either needs more selectors (a
// form with f's selectors and others has it: "--max-drop needs --capacity") or is not an
// option of f at all ("--window is not an option of moe stats --capacity").
static moe_status check_form(parser *p, int f) {
    char sel[256];
    for (int k = 0; k < p->n; k++) {
        const cli_option *o = &p->c->options[k];
        if (!p->seen[k] || in_form(o, f)) continue;
        for (int g = 0; g < n_forms(p->c); g++)
            if (in_form(o, g) && selectors_within(p, f, g)) {
                missing_selectors(p, f, g, sel, sizeof sel);
                return bad_usage(p, "%s needs %s", o->name, sel);
            }
        form_selectors(p, f, sel, sizeof sel);
        return bad_usage(p, "%s is not an option of %s %s", o->name, p->c->name, sel);
    }
    return MOE_OK;
}

// The defaults (.def), as if given first.
static moe_status apply_defaults(parser *p) {
    for (int k = 0; k < p->n; k++) {
        const cli_option *o = &p->c->options[k];
        if (o->def && take_value(p, k, o->def))
            return moe_error(MOE_EINVAL, "%s: the default of %s: %s", p->c->name, o->name,
                             moe_last_error());
    }
    return MOE_OK;
}

moe_status cli_parse(const cli_command *c, int argc, char **argv, void *opts, cli_outcome *how) {
    parser p = {.c = c, .n = table_size(c), .argc = argc, .argv = argv, .opts = opts, .how = how};
    *how = CLI_BAD_USAGE;
    if (p.n > CLI_MAX_OPTIONS || n_forms(c) > CLI_MAX_FORMS)
        return moe_error(MOE_EINVAL, "%s: more than %d options or %d forms", c->name,
                         CLI_MAX_OPTIONS, CLI_MAX_FORMS);
    moe_status st = apply_defaults(&p);
    for (int i = 0; !st && i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *how = CLI_HELP;
            return MOE_OK;
        }
        st = a[0] == '-' && a[1] ? take_option(&p, &i) : take_positional(&p, a);
    }
    int form = 0;
    if (!st) st = pick_form(&p, &form);
    if (!st) st = check_required(&p, form);
    if (!st) st = check_form(&p, form);
    if (!st) *how = CLI_PARSED;
    return st;
}

void cli_free(const cli_command *c, void *opts) {
    for (const cli_option *o = c->options; o->kind != CLI_KIND_END; o++)
        if (o->kind == CLI_KIND_LIST) {
            cli_list *l = (cli_list *)((char *)opts + o->at);
            free(l->v);
            l->v = NULL, l->n = 0;
        }
}

// ---- help -----------------------------------------------------------------------------

// How the option's value is written: .value, or a choice's values joined by '|'.
static const char *value_name(const cli_option *o, char *buf, size_t size) {
    if (o->value || o->kind != CLI_KIND_CHOICE) return o->value ? o->value : "VALUE";
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; o->choices[i] && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? "|" : "", o->choices[i]);
    return buf;
}

// The option as its synopsis writes it in form f: "--ckpt DIR", "[--seq-len S]",
// "[--set group.key=value]...".
static void synopsis_item(const cli_option *o, int f, char *buf, size_t size) {
    char v[128];
    const int bare = o->flags & (CLI_REQUIRED | CLI_SELECTOR) && in_form(o, f);
    const char *repeat = o->kind == CLI_KIND_LIST && !(o->flags & CLI_MANY) ? "..." : "";
    if (!takes_value(o))
        snprintf(buf, size, "%s%s%s", bare ? "" : "[", o->name, bare ? "" : "]");
    else
        snprintf(buf, size, "%s%s %s%s%s", bare ? "" : "[", o->name, value_name(o, v, sizeof v),
                 bare ? "" : "]", repeat);
}

// Prints word (len bytes) at *col: after a space, or first breaking the line to indent when
// it would pass CLI_WIDTH; at indent itself (a line's start) without either.
static void put_word(FILE *out, const char *word, size_t len, int *col, int indent) {
    if (*col != indent && *col + 1 + (int)len > CLI_WIDTH) {
        fprintf(out, "\n%*s", indent, "");
        *col = indent;
    } else if (*col != indent) {
        fputc(' ', out);
        (*col)++;
    }
    fwrite(word, 1, len, out);
    *col += (int)len;
}

// Text wrapped at CLI_WIDTH from column *col, continuation lines at indent.
static void put_text(FILE *out, const char *text, int *col, int indent) {
    for (const char *s = text; *s;) {
        while (*s == ' ') s++;
        const size_t len = strcspn(s, " ");
        if (len) put_word(out, s, len, col, indent);
        s += len;
    }
}

// One synopsis line: form f's positionals, then its selectors, then its other options.
static void synopsis_line(const cli_command *c, int f, FILE *out) {
    const char *lead = f ? "       " : "usage: ";
    int col = fprintf(out, "%s%s", lead, c->name); // (the first item: after a space)
    const int indent = col + 1;
    char item[256];
    for (int pass = 0; pass < 3; pass++)
        for (const cli_option *o = c->options; o->kind != CLI_KIND_END; o++) {
            const int which = o->kind == CLI_KIND_POSITIONAL ? 0 : o->flags & CLI_SELECTOR ? 1 : 2;
            if (which != pass || !in_form(o, f)) continue;
            if (o->kind == CLI_KIND_POSITIONAL)
                snprintf(item, sizeof item, o->flags & CLI_REQUIRED ? "%s" : "[%s]", o->name);
            else
                synopsis_item(o, f, item, sizeof item);
            put_word(out, item, strlen(item), &col, indent);
        }
    fputc('\n', out);
}

// The option as its help line names it: "--seq-len S", "--stats", "CONFIG".
static void label_of(const cli_option *o, char *buf, size_t size) {
    char v[128];
    if (takes_value(o))
        snprintf(buf, size, "%s %s", o->name, value_name(o, v, sizeof v));
    else
        snprintf(buf, size, "%s", o->name);
}

// The help lines: each option's label, then its help and default in a column.
static void option_lines(const cli_command *c, FILE *out) {
    char label[256];
    int width = 0;
    for (const cli_option *o = c->options; o->kind != CLI_KIND_END; o++) {
        label_of(o, label, sizeof label);
        const int len = (int)strlen(label);
        if (o->help && len > width) width = len > CLI_MAX_LABEL ? CLI_MAX_LABEL : len;
    }
    const int indent = 2 + width + 2;
    for (const cli_option *o = c->options; o->kind != CLI_KIND_END; o++) {
        if (!o->help) continue;
        label_of(o, label, sizeof label);
        int col = fprintf(out, "  %s", label);
        if (col + 2 > indent) { // a long label: the help on the next line
            fputc('\n', out);
            col = 0;
        }
        col += fprintf(out, "%*s", indent - col, "");
        put_text(out, o->help, &col, indent);
        if (o->def) {
            char def[160];
            snprintf(def, sizeof def, "(default %s)", o->def);
            put_text(out, def, &col, indent);
        }
        fputc('\n', out);
    }
}

void cli_help(const cli_command *c, FILE *out) {
    for (int f = 0; f < n_forms(c); f++) synopsis_line(c, f, out);
    fputc('\n', out);
    if (c->about) fputs(c->about, out);
    option_lines(c, out);
}

// ---- a command's handling of the result -------------------------------------------------

int cli_usage_error(const cli_command *c, FILE *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(err, "%s: error: ", c->name);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fputs("\n\n", err);
    cli_help(c, err);
    return 2;
}

int cli_args(const cli_command *c, int argc, char **argv, void *opts, FILE *out, FILE *err) {
    cli_outcome how;
    const moe_status st = cli_parse(c, argc, argv, opts, &how);
    if (!st && how == CLI_PARSED) return CLI_RUN;
    cli_free(c, opts);
    if (!st) { // --help
        cli_help(c, out);
        return 0;
    }
    if (st == MOE_ENOMEM || (how == CLI_BAD_VALUE && c->value_error_exit == 1)) {
        fprintf(err, "%s: error: %s\n", c->name, moe_last_error());
        return 1;
    }
    return cli_usage_error(c, err, "%s", moe_last_error());
}
