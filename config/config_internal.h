// Private to config/ (never included from outside it): what the files of the config
// library share. The schema (schema.c) drives the reading (read.c), the checks (check.c) and
// the writer (write.c); a load (config.c) keeps its state in a load_ctx, which the source scan
// (scan.c), the integer re-reading (literal.c), the --set overrides (set.c) and the messages
// (message.c) use. Names near a typo: suggest.c.
#ifndef MOE_CONFIG_INTERNAL_H
#define MOE_CONFIG_INTERNAL_H

#include <ctype.h>
#include <libconfig.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// ---- the schema (schema.c) ---------------------------------------------------------------

typedef enum {
    K_INT,      // int field, integer setting
    K_INT64,    // int64_t field, integer setting
    K_FLOAT,    // double field, float or integer setting
    K_BOOL,     // int field (0/1), true/false
    K_STRING,   // char[MOE_PATH_MAX] field
    K_ENUM,     // enum field (int-sized), a string from `names` (the value is its index)
    K_STRLIST,  // data.text: char[MOE_MAX_TEXT_SOURCES][MOE_PATH_MAX] + int count
    K_CAPACITY, // model.capacity_factor: capacity_plan + model.moe.capacity_factor
    K_INTLIST,  // parallel.expert_placement: int[MOE_MAX_EXPERTS] + int count
} key_kind;

typedef struct {
    const char *group, *key;
    key_kind kind;
    size_t off;               // the field
    size_t count_off;         // K_STRLIST: the count field
    int64_t lo, hi;           // K_INT, K_INT64: [lo, hi]
    double flo, fhi;          // K_FLOAT
    int lo_open, hi_open;     // K_FLOAT: the bound is excluded
    const char *const *names; // K_ENUM, NULL-terminated
    int nonempty;             // K_STRING: "" rejected
} key_spec;

// The offset of field f, which must be of type T (a compile error otherwise): what a key
// kind writes through the offset is the field's type.
#define OFF(f, T) _Generic(((moe_train_config *)0)->f, T : offsetof(moe_train_config, f))
#define KINT(g, k, f, a, b) \
    { .group = g, .key = k, .kind = K_INT, .off = OFF(f, int), .lo = (a), .hi = (b) }
#define KI64(g, k, f, a, b) \
    { .group = g, .key = k, .kind = K_INT64, .off = OFF(f, int64_t), .lo = (a), .hi = (b) }
#define KFLT(g, k, f, a, ao, b, bo)                                                                \
    {                                                                                              \
        .group = g, .key = k, .kind = K_FLOAT, .off = OFF(f, double), .flo = (a), .lo_open = (ao), \
        .fhi = (b), .hi_open = (bo)                                                                \
    }
#define KBOOL(g, k, f) \
    { .group = g, .key = k, .kind = K_BOOL, .off = OFF(f, int) }
#define KSTR(g, k, f, ne) \
    { .group = g, .key = k, .kind = K_STRING, .off = OFF(f, char *), .nonempty = (ne) }
// K_ENUM writes the value as an int: enum T must be int-sized (ENUM_FITS_INT, schema.c)
#define KENUM(g, k, f, T, n) \
    { .group = g, .key = k, .kind = K_ENUM, .off = OFF(f, T), .names = (n) }
#define OPEN 1
#define CLOSED 0

enum { CFG_N_SPECS = 89, CFG_N_GROUPS = 6 };

// Every key, in the order `moe_train_config_write` writes (config.h lists the fields in it).
extern const key_spec moe_cfg_specs[CFG_N_SPECS];
extern const char *const moe_cfg_group_names[CFG_N_GROUPS]; // "model", "train", ...
extern const char *const moe_cfg_drop_names[];              // model.drop_policy's values

// The index of group.key in moe_cfg_specs, or -1.
int moe_cfg_spec_index(const char *group, const char *key);
// 1 if name is one of moe_cfg_group_names.
int moe_cfg_is_group(const char *name);

// ---- names near a typo (suggest.c) -------------------------------------------------------

// The closest candidate to `name` when it is close enough to be a typo, else NULL.
const char *moe_cfg_closest(const char *name, const char *const *cands, int n);
// " (did you mean KEY?)" for a key of `group` close to `key`, or " (KEY is a key of
// OTHER)" when another group has exactly that key, or "".
void moe_cfg_suggest_key(char *buf, size_t n, const char *group, const char *key);
// The same for an unknown top-level name.
void moe_cfg_suggest_group(char *buf, size_t n, const char *name);
// "\"a\", \"b\" or \"c\"" of a NULL-terminated list.
void moe_cfg_list_names(char *buf, size_t n, const char *const *names);

// ---- a load, and where a setting came from (message.c) ------------------------------------

typedef struct {
    char label[160]; // "--set group.key"
    char name[128];  // "group.key"
    char *text;      // the libconfig snippet "key = value\n;" that was parsed
} override_origin;

typedef struct {
    char *path; // as libconfig names it (relative to the include dir)
    char *text;
} source_text;

typedef struct {
    const char *path; // the config file as given (NULL: none)
    char *main_text;  // its contents (what libconfig parsed)
    char include_dir[MOE_PATH_MAX];
    source_text *files; // @included files read back for literal checks
    int n_files;
    override_origin *overrides;
    config_t lc;
    const config_setting_t *at[CFG_N_SPECS]; // the setting each key was read from (NULL: default)
    unsigned char adopted[CFG_N_SPECS];      // taken from train.init_from's folder (init_from.c)
} load_ctx;

// The override a setting (or its group) comes from, or NULL (a file).
const override_origin *moe_cfg_origin_of(const config_setting_t *s);
// A file name as libconfig records it (NULL: the main file) -> the path to show and open:
// libconfig 1.5 opens "<include_dir>/<name>", an absolute name too, or the name without
// an include dir. Returns 0 if the path does not fit in buf.
int moe_cfg_resolve_file(const load_ctx *c, const char *file, char *buf, size_t n);
// "FILE:LINE" or "--set group.key".
void moe_cfg_where(const load_ctx *c, const config_setting_t *s, char *buf, size_t n);
// MOE_EINVAL "WHERE: NAME: WHAT" (for an override of NAME itself, "--set NAME: WHAT").
moe_status moe_cfg_bad(const load_ctx *c, const config_setting_t *s, const char *name,
                       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
// "a group", "an integer", ... for a CONFIG_TYPE_*.
const char *moe_cfg_type_name(int type);
// The shortest "%.Ng" that reads back as exactly v (so 0.1 prints as 0.1, not
// 0.10000000000000001, and still round-trips bit for bit).
void moe_cfg_fmt_double(char *buf, size_t n, double v);

// ---- the source text (scan.c, literal.c) --------------------------------------------------

// libconfig's lexical classes: a name's first and later characters, a number's characters.
static inline int is_name_start(int ch) { return isalpha(ch) || ch == '*'; }
static inline int is_name_char(int ch) {
    return isalnum(ch) || ch == '_' || ch == '-' || ch == '*';
}
static inline int is_literal_char(int ch) {
    return isalnum(ch) || ch == '.' || ch == '+' || ch == '-';
}

// Skips blanks and comments (#, //, /* */), counting lines.
const char *moe_cfg_skip_blank(const char *p, unsigned *line);
// A config file (the main one or an @included one): a regular file of at most
// MOE_CONFIG_MAX_BYTES without NUL bytes, into *out (malloc'd).
moe_status moe_cfg_read_file(const char *path, char **out);
// The text of an @included file read before, by the name libconfig records (NULL: none).
const char *moe_cfg_cached_text(const load_ctx *c, const char *file);
// Keeps text (taken over: freed here on failure) as that of `file`.
moe_status moe_cfg_cache_text(load_ctx *c, const char *file, char *text);
// Scans the main file's text (label: its name) or, with set_label, a --set snippet, before
// libconfig parses it: every @include checked and read within the limits, no "\x00".
moe_status moe_cfg_scan_source(load_ctx *c, const char *label, const char *set_label,
                               const char *text);
// The value of an integer setting as written in the source (not libconfig's, which may
// have wrapped).
moe_status moe_cfg_int_value(load_ctx *c, const config_setting_t *s, const char *name, int64_t *v);

// ---- reading, checking, overriding (read.c, check.c, set.c) ---------------------------------

// Every group and key of the parsed tree into cfg (unknown names rejected); c->at records
// the setting of each key.
moe_status moe_cfg_read_tree(load_ctx *c, moe_train_config *cfg);
// The checks across keys (and the sizes their products give), after moe_cfg_read_tree.
moe_status moe_cfg_check_combinations(load_ctx *c, moe_train_config *cfg);
// train.init_from's model keys (init_from.c): the defaults taken from the folder, the set ones
// compared with it (config.h: moe_train_config_set_model_reader).
moe_status moe_cfg_merge_init_from(load_ctx *c, moe_train_config *cfg);
// parallel.expert_placement against model.n_experts.
moe_status moe_cfg_check_placement(const load_ctx *c, const moe_train_config *cfg);
// One `--set group.key=value` into the parsed tree (o: its origin, filled here).
moe_status moe_cfg_apply_set(load_ctx *c, const char *arg, override_origin *o);

#pragma GCC visibility pop

#endif
