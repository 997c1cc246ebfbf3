// The training config: a libconfig file (+ `--set group.key=value` overrides) -> a
// validated moe_train_config. See config.h for the keys; the schema below is the one
// place that lists them (reading, validation and writing are all driven by it).
//
// libconfig 1.5 pitfalls handled here (DESIGN.md §7):
// - an integer literal above 2^31-1 without an `L` suffix is silently wrapped to 32 bits
//   (`3000000000` reads as -1294967296), and one above 2^63-1 is wrapped or saturated. So
//   every integer setting is re-read from its literal text in the source (found by a
//   small lexer from the setting's source line) and that exact value is used; a literal
//   beyond 64 bits is rejected as an overflow.
// - a typo'd key is just another setting: the parsed tree is walked and every group and
//   key the schema does not know is rejected, with the closest known name suggested.
// - `lr = 1;` is an integer: integers are accepted wherever a number is expected.
// - it opens @include files itself with fopen, without limits (no include hook before
//   1.7), and drops a "\x00" escape without a word. So every text is scanned before
//   libconfig parses it (scan_text): each @include is resolved as libconfig will, read
//   within the limits of config.h and scanned in turn; a "\x00" in a string is refused.
#define _POSIX_C_SOURCE 200809L // O_CLOEXEC, fstat
#include "train/config/config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/files.h"
#include "layers/backend.h" // moe_drop_policy: drop_policy's ints are its values

_Static_assert(MOE_DROP_PROBS == 0 && MOE_DROP_POSITION == 1,
               "model.drop_policy maps \"probs\" -> 0 and \"position\" -> 1");

// ---- the schema ---------------------------------------------------------------------

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

static const char *const drop_names[] = {"probs", "position", NULL};
static const char *const optimizer_names[] = {"adamw", "sgd", NULL};
static const char *const schedule_names[] = {"cosine", "constant", NULL};
static const char *const scoring_names[] = {"softmax", "sigmoid", NULL};
static const char *const alert_action_names[] = {"warn", "stop", NULL};
static const char *const dtype_names[] = {"fp32", "bf16", NULL};     // moe_dtype's order
static const char *const exchange_names[] = {"dedup", "rows", NULL}; // moe_exchange's order
static const char *const transport_names[] = {"mpi", "nccl", NULL};  // moe_transport's order

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
// K_ENUM writes the value as an int: enum T must be int-sized (ENUM_FITS_INT below)
#define KENUM(g, k, f, T, n) \
    { .group = g, .key = k, .kind = K_ENUM, .off = OFF(f, T), .names = (n) }
#define ENUM_FITS_INT(T) _Static_assert(sizeof(T) == sizeof(int), #T " is written as an int")
ENUM_FITS_INT(moe_drop_policy);
ENUM_FITS_INT(moe_scoring);
ENUM_FITS_INT(optim_kind);
ENUM_FITS_INT(schedule_kind);
ENUM_FITS_INT(moe_alert_action);
ENUM_FITS_INT(moe_dtype);
_Static_assert(MOE_DTYPE_F32 == 0 && MOE_DTYPE_BF16 == 1, "train.dtype: fp32 -> 0, bf16 -> 1");
ENUM_FITS_INT(moe_exchange);
ENUM_FITS_INT(moe_transport);
_Static_assert(MOE_EXCHANGE_DEDUP == 0 && MOE_EXCHANGE_ROWS == 1,
               "parallel.exchange: dedup -> 0, rows -> 1");
#define OPEN 1
#define CLOSED 0

static const char *const group_names[] = {"model", "train",      "data",
                                          "log",   "checkpoint", "parallel"};
#define N_GROUPS ((int)(sizeof group_names / sizeof group_names[0]))

// In the order `moe_train_config_write` writes (config.h lists the fields in it).
static const key_spec specs[] = {
    KINT("model", "vocab_size", model.vocab_size, 2, 1 << 24),
    KINT("model", "d_model", model.d_model, 1, 65536),
    KINT("model", "n_layers", model.n_layers, 1, 1024),
    KINT("model", "n_heads", model.n_heads, 1, 4096),
    KINT("model", "n_kv_heads", model.n_kv_heads, 1, 4096), // and <= n_heads, divides it
    KINT("model", "d_ff", model.moe.d_ff, 1, 1 << 20),
    KINT("model", "n_experts", model.moe.n_experts, 1, 4096),
    KINT("model", "top_k", model.moe.top_k, 1, 4096), // and <= n_experts
    KINT("model", "max_seq_len", model.max_seq_len, 1, 1 << 20),
    KFLT("model", "rope_theta", model.rope_theta, 0, OPEN, 1e12, CLOSED), // config.json's bound
    KFLT("model", "rms_norm_eps", model.rms_norm_eps, 0, OPEN, 1, OPEN),
    KBOOL("model", "tie_embeddings", model.tie_embeddings),
    KBOOL("model", "norm_topk_prob", model.moe.norm_topk_prob),
    {.group = "model",
     .key = "capacity_factor",
     .kind = K_CAPACITY,
     .off = OFF(capacity, capacity_plan)},
    KFLT("model", "max_drop", capacity.max_drop, 0, OPEN, 1, OPEN),
    KI64("model", "capacity_window", capacity.window, 1, INT64_C(1000000000)),
    KFLT("model", "capacity_min", capacity.min, 0, OPEN, INFINITY, OPEN),
    KFLT("model", "capacity_max", capacity.max, 0, OPEN, INFINITY, OPEN),
    KFLT("model", "capacity_max_change", capacity.max_change, 1, CLOSED, INFINITY, OPEN),
    KENUM("model", "drop_policy", model.moe.drop_policy, moe_drop_policy, drop_names),
    KFLT("model", "aux_coef", model.moe.aux_coef, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "z_coef", model.moe.z_coef, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "init_std", init_std, 0, OPEN, INFINITY, OPEN),
    KENUM("model", "scoring", model.moe.scoring, moe_scoring, scoring_names),
    KFLT("model", "route_scale", model.moe.route_scale, 0, OPEN, 1e6, CLOSED), // config.json's
    KFLT("model", "bias_rate", bias_rate, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "seq_aux_coef", model.moe.seq_aux_coef, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "router_jitter", model.moe.jitter_eps, 0, CLOSED, 1, OPEN),
    KSTR("model", "device", device, 1),
    KBOOL("model", "tf32", tf32),

    KI64("train", "seed", seed, 0, INT64_MAX),
    KI64("train", "steps", steps, 1, INT64_C(1000000000000)),
    KINT("train", "batch_size", batch_size, 1, 1 << 20),
    KINT("train", "seq_len", seq_len, 1, 1 << 20), // and <= model.max_seq_len
    KINT("train", "grad_accum", grad_accum, 1, 1 << 20),
    KENUM("train", "optimizer", optimizer, optim_kind, optimizer_names),
    KFLT("train", "lr", lr, 0, CLOSED, INFINITY, OPEN),
    KFLT("train", "min_lr", min_lr, 0, CLOSED, INFINITY, OPEN),             // and <= lr
    KI64("train", "warmup_steps", warmup_steps, 0, INT64_C(1000000000000)), // and <= steps
    KENUM("train", "schedule", schedule, schedule_kind, schedule_names),
    KFLT("train", "beta1", beta1, 0, CLOSED, 1, OPEN),
    KFLT("train", "beta2", beta2, 0, CLOSED, 1, OPEN),
    KFLT("train", "eps", eps, 0, OPEN, INFINITY, OPEN),
    KFLT("train", "weight_decay", weight_decay, 0, CLOSED, INFINITY, OPEN),
    KBOOL("train", "decay_norms", decay_norms),
    KFLT("train", "grad_clip", grad_clip, 0, CLOSED, INFINITY, OPEN),
    KINT("train", "max_skipped", max_skipped, 1, INT_MAX),
    KINT("train", "threads", threads, 0, 1024),
    KENUM("train", "dtype", model.moe.dtype, moe_dtype, dtype_names),
    KI64("train", "eval_interval", eval_interval, 0, INT64_MAX),
    KINT("train", "eval_batches", eval_batches, 1, 1 << 20),
    KENUM("train", "load_alert_action", load_alert_action, moe_alert_action, alert_action_names),
    KSTR("train", "init_from", init_from, 0),

    KSTR("data", "train", train_path, 0),
    KSTR("data", "val", val_path, 0),
    KSTR("data", "dir", dir, 1),
    {.group = "data",
     .key = "text",
     .kind = K_STRLIST,
     .off = offsetof(moe_train_config, text),
     .count_off = OFF(n_text, int)},
    KFLT("data", "val_fraction", val_fraction, 0, OPEN, 0.5, CLOSED),
    KSTR("data", "tokenizer", tokenizer, 0),

    KSTR("log", "dir", run_dir, 1),
    KI64("log", "interval", interval, 1, INT64_MAX),
    KFLT("log", "load_alert", load_alert, 1, CLOSED, INFINITY, OPEN),
    KI64("log", "alert_after", alert_after, 0, INT64_C(1000000000000)),
    KI64("log", "alert_window", alert_window, 1, 10000),
    KBOOL("log", "timing", timing),
    KBOOL("log", "coactivation", coactivation),

    KI64("checkpoint", "interval", ckpt_interval, 0, INT64_MAX),
    KINT("checkpoint", "keep", ckpt_keep, 1, INT_MAX),

    KINT("parallel", "ep_size", ep_size, 0, 4096), // and divides the ranks and n_experts
    KENUM("parallel", "exchange", model.moe.exchange, moe_exchange, exchange_names),
    {.group = "parallel",
     .key = "expert_placement",
     .kind = K_INTLIST,
     .off = offsetof(moe_train_config, expert_placement),
     .count_off = OFF(n_placement, int)}, // a permutation of 0 .. n_experts-1, or empty
    KENUM("parallel", "transport", transport, moe_transport, transport_names),
};
#define N_SPECS ((int)(sizeof specs / sizeof specs[0]))

void moe_train_config_default(moe_train_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg); // also the padding and the string tails: memcmp-able
    model_config *m = &cfg->model;
    m->vocab_size = 256;
    m->d_model = 128;
    m->n_layers = 4;
    m->n_heads = 4;
    m->n_kv_heads = 4; // = n_heads
    m->max_seq_len = 256;
    m->rope_theta = 1e6;
    m->rms_norm_eps = 1e-5;
    m->tie_embeddings = 0;
    // the MoE layer's own defaults (layers/moe.h: Mixtral routing, dropless, aux 0.01, z 0.001),
    // field by field: a struct copy may bring indeterminate padding bytes into the memset one
    const moe_config d = moe_config_default(m->d_model, 256, 8, 2);
    moe_config *e = &m->moe;
    e->d_model = d.d_model, e->d_ff = d.d_ff, e->n_experts = d.n_experts, e->top_k = d.top_k;
    e->norm_topk_prob = d.norm_topk_prob, e->capacity_factor = d.capacity_factor;
    e->drop_policy = d.drop_policy, e->aux_coef = d.aux_coef, e->z_coef = d.z_coef;
    e->scoring = d.scoring, e->route_scale = d.route_scale, e->seq_aux_coef = d.seq_aux_coef;
    e->jitter_eps = d.jitter_eps;
    e->dtype = d.dtype;       // fp32
    e->exchange = d.exchange; // dedup
    cfg->capacity = (capacity_plan){.mode = CAPACITY_FIXED,
                                    .max_drop = 0.01,
                                    .window = 100,
                                    .min = 1.0,
                                    .max = 2.0,
                                    .max_change = 1.25};
    cfg->bias_rate = 0.0;
    cfg->init_std = 0.02;
    snprintf(cfg->device, sizeof cfg->device, "cpu");
    cfg->tf32 = 0;

    cfg->seed = 1;
    cfg->steps = 1000;
    cfg->batch_size = 8;
    cfg->seq_len = 128;
    cfg->grad_accum = 1;
    cfg->optimizer = OPTIM_ADAMW;
    cfg->lr = 3e-4;
    cfg->min_lr = 3e-5;
    cfg->warmup_steps = 100;
    cfg->schedule = SCHEDULE_COSINE;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.95;
    cfg->eps = 1e-8;
    cfg->weight_decay = 0.1;
    cfg->decay_norms = 0;
    cfg->grad_clip = 1.0;
    cfg->max_skipped = 10;
    cfg->threads = 0;
    cfg->eval_interval = 100;
    cfg->eval_batches = 8;
    cfg->load_alert_action = MOE_ALERT_WARN;

    strcpy(cfg->dir, "data/cache/default");
    cfg->n_text = 0;
    cfg->val_fraction = 0.1;

    strcpy(cfg->run_dir, "runs/default");
    cfg->interval = 10;
    cfg->load_alert = 2.0; // the load alert's defaults, measured: config.h
    cfg->alert_after = 150;
    cfg->alert_window = 50;
    cfg->timing = 1;
    cfg->coactivation = 1;

    cfg->ckpt_interval = 0;
    cfg->ckpt_keep = 2;
    cfg->ep_size = 0;     // all the ranks of the run
    cfg->n_placement = 0; // the default placement
}

static int spec_index(const char *group, const char *key) {
    for (int i = 0; i < N_SPECS; i++)
        if (strcmp(specs[i].group, group) == 0 && strcmp(specs[i].key, key) == 0) return i;
    return -1;
}

static int is_group(const char *name) {
    for (int g = 0; g < N_GROUPS; g++)
        if (strcmp(group_names[g], name) == 0) return 1;
    return 0;
}

// ---- small helpers -------------------------------------------------------------------

// The shortest "%.Ng" that reads back as exactly v (so 0.1 prints as 0.1, not
// 0.10000000000000001, and still round-trips bit for bit).
static void fmt_double(char *buf, size_t n, double v) {
    if (!isfinite(v)) {
        snprintf(buf, n, "%g", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static const char *type_name(int type) {
    switch (type) {
    case CONFIG_TYPE_GROUP: return "a group";
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a float";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_BOOL: return "a boolean";
    case CONFIG_TYPE_ARRAY: return "an array";
    case CONFIG_TYPE_LIST: return "a list";
    }
    return "nothing";
}

// Edit distance (optimal string alignment: insert, delete, substitute, swap two adjacent
// letters), case-insensitive.
static int edit_distance(const char *a, const char *b) {
    enum { MAXLEN = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXLEN || m >= MAXLEN) return INT_MAX;
    int d[MAXLEN + 1][MAXLEN + 1];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

// The closest candidate to `name` when it is close enough to be a typo, else NULL.
static const char *closest(const char *name, const char *const *cands, int n) {
    int limit = (int)strlen(name) / 3;
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    const char *best = NULL;
    int best_d = limit + 1;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(name, cands[i]);
        if (d < best_d) best_d = d, best = cands[i];
    }
    return best;
}

// " (did you mean KEY?)" for a key of `group` close to `key`, or " (KEY is a key of
// OTHER)" when another group has exactly that key, or "".
static void suggest_key(char *buf, size_t n, const char *group, const char *key) {
    const char *cands[N_SPECS];
    int nc = 0;
    for (int i = 0; i < N_SPECS; i++)
        if (strcmp(specs[i].group, group) == 0) cands[nc++] = specs[i].key;
    const char *best = closest(key, cands, nc);
    buf[0] = '\0';
    if (best) {
        snprintf(buf, n, " (did you mean %s?)", best);
        return;
    }
    for (int i = 0; i < N_SPECS; i++)
        if (strcmp(specs[i].key, key) == 0) {
            snprintf(buf, n, " (%s is a key of %s)", key, specs[i].group);
            return;
        }
}

// For an unknown top-level name.
static void suggest_group(char *buf, size_t n, const char *name) {
    const char *best = closest(name, group_names, N_GROUPS);
    if (best) {
        snprintf(buf, n, " (did you mean %s?)", best);
        return;
    }
    for (int i = 0; i < N_SPECS; i++)
        if (strcmp(specs[i].key, name) == 0) {
            snprintf(buf, n,
                     " (%s is a key of %s: write it inside %s = { ... }; the groups are model, "
                     "train, data, log, checkpoint)",
                     name, specs[i].group, specs[i].group);
            return;
        }
    snprintf(buf, n, " (the groups are model, train, data, log, checkpoint)");
}

// "\"a\", \"b\" or \"c\""
static void list_names(char *buf, size_t n, const char *const *names) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; names[i]; i++) {
        const char *sep = i == 0 ? "" : names[i + 1] ? ", " : " or ";
        int w = snprintf(buf + len, n - len, "%s\"%s\"", sep, names[i]);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}

// ---- where a setting came from ------------------------------------------------------------

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
    const config_setting_t *at[N_SPECS]; // the setting each key was read from (NULL: default)
} load_ctx;

static const override_origin *origin_of(const config_setting_t *s) {
    for (; s; s = config_setting_parent(s))
        if (config_setting_get_hook(s)) return config_setting_get_hook(s);
    return NULL;
}

// A file name as libconfig records it (NULL: the main file) -> the path to show and open:
// libconfig 1.5 opens "<include_dir>/<name>", an absolute name too, or the name without
// an include dir. Returns 0 if the path does not fit in buf.
static int resolve_file(const load_ctx *c, const char *file, char *buf, size_t n) {
    int w;
    if (!file)
        w = snprintf(buf, n, "%s", c->path ? c->path : "(no file)");
    else if (c->include_dir[0])
        w = snprintf(buf, n, "%s/%s", c->include_dir, file);
    else
        w = snprintf(buf, n, "%s", file);
    return w >= 0 && (size_t)w < n;
}

// "FILE:LINE" or "--set group.key".
static void where(const load_ctx *c, const config_setting_t *s, char *buf, size_t n) {
    const override_origin *o = origin_of(s);
    if (o) {
        snprintf(buf, n, "%s", o->label);
        return;
    }
    char file[MOE_PATH_MAX + 64];
    resolve_file(c, config_setting_source_file(s), file, sizeof file);
    snprintf(buf, n, "%s:%u", file, config_setting_source_line(s));
}

// "WHERE: NAME: WHAT" (for an override of NAME itself, "--set NAME: WHAT").
static moe_status bad(const load_ctx *c, const config_setting_t *s, const char *name,
                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static moe_status bad(const load_ctx *c, const config_setting_t *s, const char *name,
                      const char *fmt, ...) {
    char what[768], loc[MOE_PATH_MAX + 96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    where(c, s, loc, sizeof loc);
    const override_origin *o = origin_of(s);
    if (o && strcmp(o->name, name) == 0) return moe_error(MOE_EINVAL, "%s: %s", loc, what);
    return moe_error(MOE_EINVAL, "%s: %s: %s", loc, name, what);
}

// ---- integer literals: libconfig 1.5 wraps them, so read them again from the text -------

// Skips blanks and comments (#, //, /* */), counting lines.
static const char *skip_blank(const char *p, unsigned *line) {
    for (;;) {
        if (*p == '\n') {
            ++*line;
            p++;
        } else if (isspace((unsigned char)*p)) {
            p++;
        } else if (*p == '#' || (p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n') p++;
        } else if (p[0] == '/' && p[1] == '*') {
            p += 2;
            while (*p && !(p[0] == '*' && p[1] == '/')) {
                if (*p == '\n') ++*line;
                p++;
            }
            if (*p) p += 2;
        } else {
            return p;
        }
    }
}

static int is_name_start(int ch) { return isalpha(ch) || ch == '*'; }
static int is_name_char(int ch) { return isalnum(ch) || ch == '_' || ch == '-' || ch == '*'; }
static int is_literal_char(int ch) { return isalnum(ch) || ch == '.' || ch == '+' || ch == '-'; }

// The value text after the k-th (from 0) "NAME =" or "NAME :" whose name is on `line` of
// `text`, in the lexical sense of libconfig (strings and comments skipped).
// Returns 1 and the literal in lit (truncated: *truncated = 1), or 0 if not found.
static int find_literal(const char *text, unsigned target, const char *name, int k, char *lit,
                        size_t litn, int *truncated) {
    unsigned line = 1;
    size_t name_len = strlen(name);
    const char *p = text;
    *truncated = 0;
    for (;;) {
        p = skip_blank(p, &line);
        if (!*p || line > target) return 0;
        unsigned char ch = (unsigned char)*p;
        if (ch == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) p++;
                if (*p == '\n') line++;
            }
            if (*p) p++;
        } else if (is_name_start(ch)) {
            const char *start = p;
            unsigned name_line = line;
            while (is_name_char((unsigned char)*p)) p++;
            size_t len = (size_t)(p - start);
            p = skip_blank(p, &line);
            if ((*p == '=' || *p == ':') && name_line == target && len == name_len &&
                memcmp(start, name, len) == 0 && k-- == 0) {
                p = skip_blank(p + 1, &line);
                size_t n = 0;
                for (; is_literal_char((unsigned char)*p); p++) {
                    if (n + 1 < litn)
                        lit[n++] = *p;
                    else
                        *truncated = 1;
                }
                lit[n] = '\0';
                return 1;
            }
        } else if (isdigit(ch) || ch == '+' || ch == '-' || ch == '.') {
            while (is_literal_char((unsigned char)*p)) p++;
        } else {
            p++;
        }
    }
}

// Parses a libconfig integer literal ([+-]digits or 0xHEX, optional L/LL suffix).
// Returns 0 (value in *v), -1 if it overflows int64, -2 if it is not an integer literal.
static int parse_int_literal(const char *lit, int64_t *v) {
    char buf[128];
    size_t n = strlen(lit);
    if (n == 0 || n >= sizeof buf) return -2;
    memcpy(buf, lit, n + 1);
    for (int i = 0; i < 2 && n > 1 && buf[n - 1] == 'L'; i++) buf[--n] = '\0';
    const char *s = buf;
    char *end;
    errno = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        if (!isxdigit((unsigned char)s[2])) return -2;
        unsigned long long u = strtoull(s + 2, &end, 16);
        if (*end) return -2;
        if (errno == ERANGE || u > (unsigned long long)INT64_MAX) return -1;
        *v = (int64_t)u;
        return 0;
    }
    const char *d = s + (s[0] == '+' || s[0] == '-');
    if (!isdigit((unsigned char)*d)) return -2;
    for (const char *q = d; *q; q++)
        if (!isdigit((unsigned char)*q)) return -2;
    long long x = strtoll(s, &end, 10);
    if (*end) return -2;
    if (errno == ERANGE) return -1;
    *v = (int64_t)x;
    return 0;
}

static moe_status read_whole_file(const char *path, char **out);

// The text of an @included file read before, by the name libconfig records (NULL: none).
static const char *cached_text(const load_ctx *c, const char *file) {
    for (int i = 0; i < c->n_files; i++)
        if (strcmp(c->files[i].path, file) == 0) return c->files[i].text;
    return NULL;
}

// Keeps text (taken over: freed here on failure) as that of `file`.
static moe_status cache_text(load_ctx *c, const char *file, char *text) {
    source_text *files = realloc(c->files, (size_t)(c->n_files + 1) * sizeof *files);
    char *name = malloc(strlen(file) + 1);
    if (name) memcpy(name, file, strlen(file) + 1);
    if (files) c->files = files;
    if (!files || !name) {
        free(name);
        free(text);
        return moe_error(MOE_ENOMEM, "%s: out of memory", file);
    }
    c->files[c->n_files].path = name;
    c->files[c->n_files].text = text;
    c->n_files++;
    return MOE_OK;
}

// Text of an @included file (scan_text has read it; NULL if it cannot be read).
static const char *included_text(load_ctx *c, const char *file) {
    const char *known = cached_text(c, file);
    if (known) return known;
    char path[2 * MOE_PATH_MAX + 2], *text = NULL;
    if (!resolve_file(c, file, path, sizeof path) || read_whole_file(path, &text)) return NULL;
    return cache_text(c, file, text) ? NULL : text;
}

// ---- the source text before libconfig parses it -------------------------------------------
//
// Read the way libconfig 1.5's lexer reads it: strings ("..." with \ escapes), comments (#,
// //, /* */), and `@include "name"` at the start of a line after blanks (its name with only
// \\ and \" as escapes; a lone backslash is dropped). Each @include is resolved as libconfig
// will open it, read (read_whole_file: a regular file within the size limit) and scanned
// in turn, so libconfig only ever opens files checked here. (A file swapped in between
// the check and libconfig's open is not caught: the config's folder is trusted that far.)

enum { SCAN_NEST = 8, SCAN_NAME = 64 };

typedef struct {
    load_ctx *c;
    const char *set_label;            // a --set snippet: errors name it; no @include
    size_t total;                     // bytes scanned, an included file each time
    int depth;                        // { } nesting, for the key names in messages
    char names[SCAN_NEST][SCAN_NAME]; // the last "name =" at each depth
} scan_state;

// "group.key" of the setting being scanned ("" when none).
static void scan_key(const scan_state *s, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i <= s->depth && i < SCAN_NEST; i++) {
        if (!s->names[i][0]) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? "." : "", s->names[i]);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}

static moe_status nul_escape(const scan_state *s, const char *label, unsigned line) {
    static const char what[] = "\"\\x00\" in a string: a string cannot hold a NUL character "
                               "(libconfig would silently drop it)";
    if (s->set_label) return moe_error(MOE_EINVAL, "%s: %s", s->set_label, what);
    char key[SCAN_NEST * SCAN_NAME];
    scan_key(s, key, sizeof key);
    return moe_error(MOE_EINVAL, "%s:%u: %s%s%s", label, line, key, key[0] ? ": " : "", what);
}

// *pp at the opening quote -> after the closing one.
static moe_status scan_string(const scan_state *s, const char *label, unsigned *line,
                              const char **pp) {
    const char *p = *pp + 1;
    for (; *p && *p != '"'; p++) {
        if (*p == '\n') ++*line;
        if (*p != '\\' || !p[1]) continue;
        if ((p[1] == 'x' || p[1] == 'X') && p[2] == '0' && p[3] == '0')
            return nul_escape(s, label, *line);
        if (*++p == '\n') ++*line; // the escaped character
    }
    *pp = *p ? p + 1 : p;
    return MOE_OK;
}

// After `^[ \t]*@include[ \t]+"` (libconfig's include_open) at p: the name's first byte.
static const char *include_open(const char *p) {
    p += strspn(p, " \t");
    if (strncmp(p, "@include", 8) != 0 || (p[8] != ' ' && p[8] != '\t')) return NULL;
    p += 8 + strspn(p + 8, " \t");
    return *p == '"' ? p + 1 : NULL;
}

static moe_status scan_text(scan_state *s, const char *label, const char *text, int depth);

// The @include whose name starts at *pp (moved past its closing quote).
static moe_status scan_include(scan_state *s, const char *label, unsigned *line, const char **pp,
                               int depth) {
    const unsigned at = *line;
    char name[MOE_PATH_MAX];
    size_t n = 0;
    const char *p = *pp;
    for (; *p && *p != '"'; p++) {
        if (*p == '\\' && (p[1] == '\\' || p[1] == '"'))
            p++;
        else if (*p == '\\')
            continue;
        if (*p == '\n') ++*line;
        if (n + 1 >= sizeof name)
            return moe_error(MOE_EINVAL, "%s:%u: @include: the name is too long (at most %d bytes)",
                             label, at, MOE_PATH_MAX - 1);
        name[n++] = *p;
    }
    name[n] = '\0';
    *pp = *p ? p + 1 : p;
    if (!*p) return MOE_OK; // unterminated: libconfig reports it
    if (s->set_label)
        return moe_error(MOE_EINVAL, "%s: @include is not allowed in a --set value", s->set_label);
    if (depth >= MOE_CONFIG_MAX_INCLUDE_DEPTH)
        return moe_error(MOE_EINVAL,
                         "%s:%u: @include \"%s\": more than %d nested @includes (does a file "
                         "include itself?)",
                         label, at, name, MOE_CONFIG_MAX_INCLUDE_DEPTH);
    char path[2 * MOE_PATH_MAX + 2];
    if (!resolve_file(s->c, name, path, sizeof path))
        return moe_error(MOE_EINVAL, "%s:%u: @include \"%s\": the path is too long", label, at,
                         name);
    const char *text = cached_text(s->c, name);
    moe_status st = MOE_OK;
    if (!text) {
        char *fresh = NULL;
        if ((st = read_whole_file(path, &fresh)) || (st = cache_text(s->c, name, fresh)))
            return moe_error_context(st, "%s:%u: @include \"%s\"", label, at, name);
        text = fresh;
    }
    s->total += strlen(text);
    if (s->total > MOE_CONFIG_MAX_BYTES)
        return moe_error(MOE_EIO,
                         "%s:%u: @include \"%s\": the config and its @includes come to more than "
                         "%d bytes (%d MiB; a file counts each time it is included)",
                         label, at, name, MOE_CONFIG_MAX_BYTES, MOE_CONFIG_MAX_BYTES >> 20);
    return scan_text(s, path, text, depth + 1);
}

// A name at p: remembered (for messages) when "=" or ":" follows. Returns its end.
static const char *scan_name(scan_state *s, const char *p) {
    const char *start = p;
    while (is_name_char((unsigned char)*p)) p++;
    unsigned ignored = 0;
    const char *q = skip_blank(p, &ignored);
    if ((*q == '=' || *q == ':') && s->depth < SCAN_NEST)
        snprintf(s->names[s->depth], SCAN_NAME, "%.*s", (int)(p - start), start);
    return p;
}

static const char *skip_block_comment(const char *p, unsigned *line) {
    for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
        if (*p == '\n') ++*line;
    return *p ? p + 2 : p;
}

// Checks text (of file `label`, included `depth` deep) and everything it includes.
static moe_status scan_text(scan_state *s, const char *label, const char *text, int depth) {
    unsigned line = 1;
    int at_line_start = 1;
    moe_status st;
    for (const char *p = text; *p;) {
        const char *inc = at_line_start ? include_open(p) : NULL;
        at_line_start = 0;
        unsigned char ch = (unsigned char)*p;
        if (inc) {
            p = inc;
            if ((st = scan_include(s, label, &line, &p, depth))) return st;
        } else if (ch == '\n') {
            line++, at_line_start = 1, p++;
        } else if (ch == '#' || (ch == '/' && p[1] == '/')) {
            p += strcspn(p, "\n");
        } else if (ch == '/' && p[1] == '*') {
            p = skip_block_comment(p, &line);
        } else if (ch == '"') {
            if ((st = scan_string(s, label, &line, &p))) return st;
        } else if (ch == '{') {
            if (++s->depth < SCAN_NEST) s->names[s->depth][0] = '\0';
            p++;
        } else if (ch == '}') {
            if (s->depth > 0) s->depth--;
            p++;
        } else if (is_name_start(ch)) {
            p = scan_name(s, p);
        } else if (isdigit(ch) || ch == '+' || ch == '-' || ch == '.') {
            while (is_literal_char((unsigned char)*p)) p++;
        } else {
            p++;
        }
    }
    return MOE_OK;
}

// The main file's text (label: its name) or, with set_label, a --set snippet.
static moe_status scan_source(load_ctx *c, const char *label, const char *set_label,
                              const char *text) {
    scan_state s = {.c = c, .set_label = set_label, .total = strlen(text)};
    return scan_text(&s, label, text, 0);
}

static int same_file(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

// How many settings before `target` (in source order) share its name, file and line:
// then the target is the k-th "name =" on that line.
static int count_before(const config_setting_t *s, const config_setting_t *target, int *k) {
    if (s == target) return 1;
    if (s->name && target->name && s->line == target->line && strcmp(s->name, target->name) == 0 &&
        same_file(s->file, target->file))
        ++*k;
    if (config_setting_is_aggregate(s))
        for (int i = 0; i < config_setting_length(s); i++)
            if (count_before(config_setting_get_elem(s, i), target, k)) return 1;
    return 0;
}

// The value of an integer setting as written in the source (not libconfig's, which may
// have wrapped).
static moe_status int_value(load_ctx *c, const config_setting_t *s, const char *name, int64_t *v) {
    const override_origin *o = origin_of(s);
    const char *text;
    unsigned line;
    int k = 0;
    if (o) {
        text = o->text, line = 1; // the snippet "key = value\n;"
    } else {
        text = config_setting_source_file(s) ? included_text(c, config_setting_source_file(s))
                                             : c->main_text;
        line = config_setting_source_line(s);
        count_before(config_root_setting(&c->lc), s, &k);
    }
    char lit[96];
    int truncated = 0;
    if (!text || !s->name || !find_literal(text, line, s->name, k, lit, sizeof lit, &truncated))
        return bad(c, s, name,
                   "cannot find this integer in the source text to check it for overflow "
                   "(libconfig 1.5 wraps integers above 2147483647 without an L suffix)");
    int64_t x = 0;
    int r = truncated ? -1 : parse_int_literal(lit, &x);
    if (r == -1)
        return bad(c, s, name, "%s%s overflows a 64-bit integer (at most 9223372036854775807)", lit,
                   truncated ? "..." : "");
    if (r == -2) return bad(c, s, name, "cannot read the integer literal \"%s\"", lit);
    *v = x;
    return MOE_OK;
}

// ---- reading one key ---------------------------------------------------------------------

static void spec_name(char *buf, size_t n, const key_spec *k) {
    snprintf(buf, n, "%s.%s", k->group, k->key);
}

static moe_status read_string(load_ctx *c, const config_setting_t *s, const char *name,
                              int nonempty, char *dst) {
    const char *v = config_setting_get_string(s);
    size_t len = strlen(v);
    if (len >= MOE_PATH_MAX)
        return bad(c, s, name, "is too long (%zu bytes, at most %d)", len, MOE_PATH_MAX - 1);
    if (nonempty && len == 0) return bad(c, s, name, "must not be empty");
    memset(dst, 0, MOE_PATH_MAX);
    memcpy(dst, v, len);
    return MOE_OK;
}

static moe_status read_key(load_ctx *c, const key_spec *k, const config_setting_t *s,
                           moe_train_config *cfg);

// A number of a setting (int or float) into *v; MOE_EINVAL naming it otherwise. An integer
// of a named setting is read from its literal (int_value); of a list element, as libconfig
// gives it.
static moe_status number_value(load_ctx *c, const config_setting_t *s, const char *name,
                               double *v) {
    int type = config_setting_type(s);
    if (type == CONFIG_TYPE_FLOAT) {
        *v = config_setting_get_float(s);
        return MOE_OK;
    }
    if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
        return bad(c, s, name, "expected a number, got %s", type_name(type));
    if (!s->name) {
        *v = (double)config_setting_get_int64(s);
        return MOE_OK;
    }
    int64_t i;
    moe_status st = int_value(c, s, name, &i);
    *v = (double)i;
    return st;
}

// model.capacity_factor: a number >= 0 (0: dropless), "auto", or a schedule
// ((step, factor), ...) with steps >= 0 strictly increasing and factors > 0.
static moe_status read_capacity(load_ctx *c, const config_setting_t *s, const char *name,
                                moe_train_config *cfg) {
    capacity_plan *p = &cfg->capacity;
    const int type = config_setting_type(s);
    moe_status st;
    if (type == CONFIG_TYPE_STRING) {
        if (strcmp(config_setting_get_string(s), "auto"))
            return bad(c, s, name,
                       "\"%.64s\" is not \"auto\" (or give a number, or a schedule "
                       "((step, factor), ...))",
                       config_setting_get_string(s));
        p->mode = CAPACITY_AUTO;
        return MOE_OK;
    }
    if (type != CONFIG_TYPE_LIST && type != CONFIG_TYPE_ARRAY) { // one number, read as such
        static const key_spec one =
            KFLT("model", "capacity_factor", model.moe.capacity_factor, 0, CLOSED, INFINITY, OPEN);
        p->mode = CAPACITY_FIXED, p->n_points = 0;
        return read_key(c, &one, s, cfg);
    }
    const int n = config_setting_length(s);
    if (n < 1 || n > MOE_CAPACITY_MAX_POINTS)
        return bad(c, s, name, "a schedule needs 1 to %d (step, factor) points, got %d",
                   MOE_CAPACITY_MAX_POINTS, n);
    for (int i = 0; i < n; i++) {
        const config_setting_t *pt = config_setting_get_elem(s, (unsigned)i);
        char ename[128];
        snprintf(ename, sizeof ename, "%s[%d]", name, i);
        const int pt_type = config_setting_type(pt);
        if ((pt_type != CONFIG_TYPE_LIST && pt_type != CONFIG_TYPE_ARRAY) ||
            config_setting_length(pt) != 2)
            return bad(c, pt, ename, "expected a (step, factor) pair");
        const config_setting_t *ss = config_setting_get_elem(pt, 0),
                               *fs = config_setting_get_elem(pt, 1);
        int64_t step;
        double f;
        if (config_setting_type(ss) != CONFIG_TYPE_INT &&
            config_setting_type(ss) != CONFIG_TYPE_INT64)
            return bad(c, ss, ename, "the step must be an integer");
        // (a list element has no name for int_value's literal check: libconfig wraps a step
        // above 2147483647 unless written with an L suffix, which the docs say)
        step = config_setting_get_int64(ss);
        if ((st = number_value(c, fs, ename, &f))) return st;
        if (step < 0 || (i > 0 && step <= p->step[i - 1]))
            return bad(c, ss, ename,
                       "steps must be >= 0 and increase (%" PRId64 " after %" PRId64 ")", step,
                       i ? p->step[i - 1] : 0);
        if (!(f > 0) || !isfinite(f))
            return bad(c, fs, ename,
                       "a scheduled factor must be > 0 and finite (dropless is 0 "
                       "alone)");
        p->step[i] = step, p->factor[i] = f;
    }
    p->mode = CAPACITY_SCHEDULE, p->n_points = n;
    cfg->model.moe.capacity_factor = p->factor[0]; // held before the first point
    return MOE_OK;
}

// parallel.expert_placement: a list of integers in [0, MOE_MAX_EXPERTS) ([] is the default
// identity); that it is a permutation of 0 .. n_experts-1 is checked with the other keys
// (check_placement).
static moe_status read_placement(load_ctx *c, const config_setting_t *s, const char *name,
                                 moe_train_config *cfg) {
    const int type = config_setting_type(s);
    if (type != CONFIG_TYPE_LIST && type != CONFIG_TYPE_ARRAY)
        return bad(c, s, name, "expected a list of expert indices [p0, p1, ...], got %s",
                   type_name(type));
    const int n = config_setting_length(s);
    if (n > MOE_MAX_EXPERTS)
        return bad(c, s, name, "has %d entries, at most %d", n, MOE_MAX_EXPERTS);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        char ename[112];
        snprintf(ename, sizeof ename, "%s[%d]", name, i);
        const int et = config_setting_type(e);
        if (et != CONFIG_TYPE_INT && et != CONFIG_TYPE_INT64)
            return bad(c, e, ename, "expected an expert index, got %s", type_name(et));
        const int64_t v = config_setting_get_int64(e);
        if (v < 0 || v >= MOE_MAX_EXPERTS)
            return bad(c, e, ename, "%" PRId64 " is not an expert index", v);
        cfg->expert_placement[i] = (int)v;
    }
    cfg->n_placement = n;
    return MOE_OK;
}

static moe_status read_key(load_ctx *c, const key_spec *k, const config_setting_t *s,
                           moe_train_config *cfg) {
    char name[96];
    spec_name(name, sizeof name, k);
    char *field = (char *)cfg + k->off;
    int type = config_setting_type(s);
    int is_int = type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64;
    moe_status st;
    switch (k->kind) {
    case K_INT:
    case K_INT64: {
        if (!is_int) return bad(c, s, name, "expected an integer, got %s", type_name(type));
        int64_t v;
        if ((st = int_value(c, s, name, &v))) return st;
        if (v < k->lo || v > k->hi)
            return bad(c, s, name, "%" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]", v,
                       k->lo, k->hi);
        if (k->kind == K_INT)
            *(int *)field = (int)v;
        else
            *(int64_t *)field = v;
        return MOE_OK;
    }
    case K_FLOAT: {
        double v;
        int64_t i = 0;
        if (type == CONFIG_TYPE_FLOAT) {
            v = config_setting_get_float(s);
        } else if (is_int) {
            if ((st = int_value(c, s, name, &i))) return st;
            v = (double)i;
        } else {
            return bad(c, s, name, "expected a number, got %s", type_name(type));
        }
        int ok = !isnan(v) && (k->lo_open ? v > k->flo : v >= k->flo) &&
                 (k->hi_open ? v < k->fhi : v <= k->fhi);
        if (!ok) {
            char vs[40], lo[40], hi[40];
            if (is_int)
                snprintf(vs, sizeof vs, "%" PRId64, i);
            else
                fmt_double(vs, sizeof vs, v);
            fmt_double(lo, sizeof lo, k->flo);
            fmt_double(hi, sizeof hi, k->fhi);
            return bad(c, s, name, "%s is out of range %c%s, %s%c", vs, k->lo_open ? '(' : '[', lo,
                       hi, k->hi_open ? ')' : ']');
        }
        *(double *)field = v;
        return MOE_OK;
    }
    case K_BOOL:
        if (type != CONFIG_TYPE_BOOL)
            return bad(c, s, name, "expected a boolean (true or false), got %s", type_name(type));
        *(int *)field = config_setting_get_bool(s) ? 1 : 0;
        return MOE_OK;
    case K_STRING:
        if (type != CONFIG_TYPE_STRING)
            return bad(c, s, name, "expected a string, got %s", type_name(type));
        return read_string(c, s, name, k->nonempty, field);
    case K_ENUM: {
        char allowed[160];
        list_names(allowed, sizeof allowed, k->names);
        if (type != CONFIG_TYPE_STRING)
            return bad(c, s, name, "expected a string (%s), got %s", allowed, type_name(type));
        const char *v = config_setting_get_string(s);
        for (int i = 0; k->names[i]; i++)
            if (strcmp(v, k->names[i]) == 0) {
                *(int *)field = i;
                return MOE_OK;
            }
        int n = 0;
        while (k->names[n]) n++;
        const char *near = closest(v, k->names, n);
        char hint[80] = "";
        if (near) snprintf(hint, sizeof hint, " (did you mean \"%s\"?)", near);
        return bad(c, s, name, "\"%.64s\" is not one of %s%s", v, allowed, hint);
    }
    case K_STRLIST: {
        char(*dst)[MOE_PATH_MAX] = (char(*)[MOE_PATH_MAX])field;
        int *count = (int *)((char *)cfg + k->count_off);
        int n;
        if (type == CONFIG_TYPE_STRING) { // one source: accepted as a list of one
            n = 1;
        } else if (type == CONFIG_TYPE_LIST || type == CONFIG_TYPE_ARRAY) {
            n = config_setting_length(s);
        } else {
            return bad(c, s, name, "expected a list of strings, got %s", type_name(type));
        }
        if (n > MOE_MAX_TEXT_SOURCES)
            return bad(c, s, name, "has %d entries, at most %d", n, MOE_MAX_TEXT_SOURCES);
        memset(dst, 0, sizeof(char[MOE_MAX_TEXT_SOURCES][MOE_PATH_MAX]));
        for (int i = 0; i < n; i++) {
            const config_setting_t *e =
                type == CONFIG_TYPE_STRING ? s : config_setting_get_elem(s, (unsigned)i);
            char ename[112];
            snprintf(ename, sizeof ename, "%s[%d]", name, i);
            if (config_setting_type(e) != CONFIG_TYPE_STRING)
                return bad(c, e, ename, "expected a string, got %s",
                           type_name(config_setting_type(e)));
            if ((st = read_string(c, e, ename, 1, dst[i]))) return st;
        }
        *count = n;
        return MOE_OK;
    }
    case K_CAPACITY: return read_capacity(c, s, name, cfg);
    case K_INTLIST: return read_placement(c, s, name, cfg);
    }
    return moe_error(MOE_EINVAL, "%s: internal error: unknown key kind", name);
}

// ---- the tree: unknown names, then every key ----------------------------------------------

static moe_status read_tree(load_ctx *c, moe_train_config *cfg) {
    const config_setting_t *root = config_root_setting(&c->lc);
    for (int i = 0; i < config_setting_length(root); i++) {
        const config_setting_t *g = config_setting_get_elem(root, (unsigned)i);
        const char *gname = config_setting_name(g);
        char hint[256];
        if (!is_group(gname)) {
            suggest_group(hint, sizeof hint, gname);
            return bad(c, g, gname, "unknown group%s", hint);
        }
        if (config_setting_type(g) != CONFIG_TYPE_GROUP)
            return bad(c, g, gname, "expected a group (%s = { ... };), got %s", gname,
                       type_name(config_setting_type(g)));
        for (int j = 0; j < config_setting_length(g); j++) {
            const config_setting_t *s = config_setting_get_elem(g, (unsigned)j);
            const char *key = config_setting_name(s);
            char name[160];
            snprintf(name, sizeof name, "%s.%s", gname, key);
            int idx = spec_index(gname, key);
            if (idx < 0) {
                suggest_key(hint, sizeof hint, gname, key);
                if (!hint[0] && config_setting_type(s) == CONFIG_TYPE_GROUP)
                    snprintf(hint, sizeof hint, " (groups do not nest)");
                return bad(c, s, name, "unknown key%s", hint);
            }
            moe_status st = read_key(c, &specs[idx], s, cfg);
            if (st) return st;
            c->at[idx] = s;
        }
    }
    return MOE_OK;
}

// ---- combinations ---------------------------------------------------------------------------

// "group.key = VALUE" plus " (default)" when the file does not set it, or " (at WHERE)" when
// it is set somewhere other than `here`.
static void describe(const load_ctx *c, const moe_train_config *cfg, int idx,
                     const config_setting_t *here, char *buf, size_t n) {
    const key_spec *k = &specs[idx];
    const char *field = (const char *)cfg + k->off;
    char v[48];
    switch (k->kind) {
    case K_INT: snprintf(v, sizeof v, "%d", *(const int *)field); break;
    case K_INT64: snprintf(v, sizeof v, "%" PRId64, *(const int64_t *)field); break;
    case K_FLOAT: fmt_double(v, sizeof v, *(const double *)field); break;
    default: snprintf(v, sizeof v, "?"); break;
    }
    char loc[MOE_PATH_MAX + 96] = "";
    if (!c->at[idx])
        snprintf(loc, sizeof loc, " (default)");
    else if (c->at[idx] != here) {
        char w[MOE_PATH_MAX + 80];
        where(c, c->at[idx], w, sizeof w);
        snprintf(loc, sizeof loc, " (at %s)", w);
    }
    snprintf(buf, n, "%s.%s = %s%s", k->group, k->key, v, loc);
}

// "WHERE: <a> <relation> <b>[: why]" located at key a when the file sets it, else at b.
static moe_status inconsistent(const load_ctx *c, const moe_train_config *cfg, int a, int b,
                               const char *relation, const char *why) {
    const config_setting_t *here = c->at[a] ? c->at[a] : c->at[b];
    char loc[MOE_PATH_MAX + 96], da[MOE_PATH_MAX + 200], db[MOE_PATH_MAX + 200];
    if (here)
        where(c, here, loc, sizeof loc);
    else
        snprintf(loc, sizeof loc, "%s", c->path ? c->path : "(defaults)");
    describe(c, cfg, a, here, da, sizeof da);
    describe(c, cfg, b, here, db, sizeof db);
    return moe_error(MOE_EINVAL, "%s: %s %s %s%s%s", loc, da, relation, db, why ? ": " : "",
                     why ? why : "");
}

// ---- sizes: products of values, bounded in 64 bits -------------------------------------------

// a * b for a, b >= 0, saturating at INT64_MAX (so no product below can wrap).
static int64_t mul(int64_t a, int64_t b) { return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b; }

// A product of config values that sizes a buffer (or a loop), and its bound.
typedef struct {
    const char *expr; // "train.batch_size * train.seq_len"
    int64_t value, limit;
    const char *limit_text, *why; // "2^24 tokens per micro-batch", why there is a bound
    int keys[4]; // spec indices of its keys (-1: unused), the first one set locates it
} size_bound;

// "WHERE: EXPR = VALUE exceeds LIMIT (KEY = V, KEY = V (at WHERE)): WHY", at the first key
// of the product that the file (or --set) sets.
static moe_status too_big(const load_ctx *c, const moe_train_config *cfg, const size_bound *b) {
    const config_setting_t *here = NULL;
    for (int i = 0; i < 4 && !here; i++)
        if (b->keys[i] >= 0) here = c->at[b->keys[i]];
    char loc[MOE_PATH_MAX + 96], keys[4 * (MOE_PATH_MAX + 200)] = "";
    if (here)
        where(c, here, loc, sizeof loc);
    else
        snprintf(loc, sizeof loc, "%s", c->path ? c->path : "(defaults)");
    size_t len = 0;
    for (int i = 0; i < 4 && b->keys[i] >= 0; i++) {
        char d[MOE_PATH_MAX + 200];
        describe(c, cfg, b->keys[i], here, d, sizeof d);
        int w = snprintf(keys + len, sizeof keys - len, "%s%s", i ? ", " : "", d);
        if (w < 0 || (size_t)w >= sizeof keys - len) break;
        len += (size_t)w;
    }
    return moe_error(MOE_EINVAL, "%s: %s = %" PRId64 " exceeds %s (%s): %s", loc, b->expr, b->value,
                     b->limit_text, keys, b->why);
}

// What the model (layers/model.c: params_layout, model_create, moe_layer_init) and the
// trainer allocate from the config: each key alone is in range, but their products could
// wrap an int (max_tokens = 0 later, with no key named) or a size_t. The bounds: config.h.
static moe_status check_sizes(const load_ctx *c, const moe_train_config *cfg) {
#define KEY(g, k) spec_index(g, k)
    const int B = KEY("train", "batch_size"), S = KEY("train", "seq_len"),
              k = KEY("model", "top_k"), d = KEY("model", "d_model"), ff = KEY("model", "d_ff"),
              V = KEY("model", "vocab_size"), L = KEY("model", "n_layers"),
              E = KEY("model", "n_experts"), G = KEY("train", "grad_accum"),
              ev = KEY("train", "eval_batches");
#undef KEY
    const model_config *mc = &cfg->model;
    const int64_t T = mul(cfg->batch_size, cfg->seq_len), wide = mc->moe.d_ff > mc->d_model;
    const size_bound bounds[] = {
        {"train.batch_size * train.seq_len",
         T,
         MOE_CONFIG_MAX_TOKENS,
         "2^24 tokens per micro-batch",
         "the model counts a micro-batch's tokens in an int",
         {B, S, -1, -1}},
        {wide ? "train.batch_size * train.seq_len * model.top_k * model.d_ff"
              : "train.batch_size * train.seq_len * model.top_k * model.d_model",
         mul(mul(T, mc->moe.top_k), wide ? mc->moe.d_ff : mc->d_model),
         MOE_CONFIG_MAX_DISPATCH,
         "2^31-1",
         "the MoE layer indexes its dispatch buffers with an int",
         {B, S, k, wide ? ff : d}},
        {"train.batch_size * train.seq_len * model.vocab_size",
         mul(T, mc->vocab_size),
         MOE_CONFIG_MAX_LOGITS,
         "2^36 logits per micro-batch",
         "the model keeps the logits and their gradient",
         {B, S, V, -1}},
        {"model.n_layers * train.batch_size * train.seq_len * model.d_model",
         mul(mul(mc->n_layers, T), mc->d_model),
         MOE_CONFIG_MAX_ACTIVATIONS,
         "2^36 activations",
         "the model keeps several per layer for the backward pass",
         {L, B, S, d}},
        {"train.grad_accum * model.n_layers * model.n_experts",
         mul(mul(cfg->grad_accum, mc->n_layers), mc->moe.n_experts),
         MOE_CONFIG_MAX_COUNTS,
         "2^26 routing counts",
         "the trainer keeps every micro-batch's counts of every layer "
         "and expert",
         {G, L, E, -1}},
        {"train.eval_batches * train.batch_size * train.seq_len",
         mul(cfg->eval_batches, T),
         MOE_CONFIG_MAX_EVAL_TOKENS,
         "2^36 tokens per validation pass",
         "at a million tokens a second one pass would take most of a day",
         {ev, B, S, -1}},
        {"model.vocab_size * model.d_model",
         mul(mc->vocab_size, mc->d_model),
         MOE_CONFIG_MAX_EMBED,
         "2^32 embedding weights",
         "the embedding (and the lm_head) "
         "is one vocab_size x d_model matrix",
         {V, d, -1, -1}},
        {"model.n_layers * model.d_model^2",
         mul(mul(mc->n_layers, mc->d_model), mc->d_model),
         MOE_CONFIG_MAX_ATTN_WEIGHTS,
         "2^34 reals",
         "the attention weights are up to 4 x n_layers x d_model^2 reals",
         {L, d, -1, -1}},
        {"model.n_layers * model.n_experts * 3 * model.d_ff * model.d_model",
         mul(mul(mul(mul(mc->n_layers, mc->moe.n_experts), 3), mc->moe.d_ff), mc->d_model),
         MOE_CONFIG_MAX_EXPERT_WEIGHTS,
         "2^34 expert weights",
         "w1, w2 and w3 of every expert of every layer",
         {L, E, ff, d}},
    };
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (bounds[i].value > bounds[i].limit) return too_big(c, cfg, &bounds[i]);
    return MOE_OK;
}

// parallel.expert_placement, when not empty: n_experts entries, each expert once. Whether the
// EP group divides n_experts is the trainer's check (it knows the ranks); with one rank the
// placement only reorders the experts inside the process (same results).
static moe_status check_placement(const load_ctx *c, const moe_train_config *cfg) {
    const int idx = spec_index("parallel", "expert_placement"), E = cfg->model.moe.n_experts,
              n = cfg->n_placement;
    if (n == 0) return MOE_OK;
    const config_setting_t *s = c->at[idx];
    const char *name = "parallel.expert_placement";
    if (n != E)
        return bad(c, s, name,
                   "has %d entries, model.n_experts = %d (a permutation of 0 .. %d, or [] for "
                   "the default placement)",
                   n, E, E - 1);
    unsigned char seen[MOE_MAX_EXPERTS] = {0};
    for (int i = 0; i < n; i++) {
        const int e = cfg->expert_placement[i];
        if (e >= E) return bad(c, s, name, "entry %d is expert %d, model.n_experts = %d", i, e, E);
        if (seen[e]++)
            return bad(c, s, name, "expert %d is listed twice (entry %d): not a permutation", e, i);
    }
    return MOE_OK;
}

static moe_status check_combinations(load_ctx *c, moe_train_config *cfg) {
    const int n_heads = spec_index("model", "n_heads"), n_kv = spec_index("model", "n_kv_heads"),
              d_model = spec_index("model", "d_model"), top_k = spec_index("model", "top_k"),
              n_experts = spec_index("model", "n_experts"),
              max_seq = spec_index("model", "max_seq_len"),
              seq_len = spec_index("train", "seq_len"), lr = spec_index("train", "lr"),
              min_lr = spec_index("train", "min_lr"), steps = spec_index("train", "steps"),
              warmup = spec_index("train", "warmup_steps"),
              drop = spec_index("model", "drop_policy");
    model_config *m = &cfg->model;

    if (!c->at[n_kv]) m->n_kv_heads = m->n_heads; // default: no GQA

    if (m->moe.top_k > m->moe.n_experts)
        return inconsistent(c, cfg, top_k, n_experts, "exceeds",
                            "each token is routed to top_k different experts");
    if (m->n_kv_heads > m->n_heads)
        return inconsistent(c, cfg, n_kv, n_heads, "exceeds",
                            "each KV head serves one or more query heads");
    if (m->n_heads % m->n_kv_heads != 0)
        return inconsistent(c, cfg, n_kv, n_heads, "does not divide",
                            "GQA shares each KV head among n_heads / n_kv_heads query heads");
    if (m->d_model % m->n_heads != 0)
        return inconsistent(c, cfg, n_heads, d_model, "does not divide",
                            "head_dim = d_model / n_heads must be an integer");
    if ((m->d_model / m->n_heads) % 2 != 0) {
        char why[160];
        snprintf(why, sizeof why,
                 "head_dim = d_model / n_heads = %d is odd; RoPE rotates pairs "
                 "of dimensions, so head_dim must be even",
                 m->d_model / m->n_heads);
        return inconsistent(c, cfg, d_model, n_heads, "with", why);
    }
    const capacity_plan *cap = &cfg->capacity;
    static const char *const auto_keys[] = {"max_drop", "capacity_window", "capacity_min",
                                            "capacity_max", "capacity_max_change"};
    for (int i = 0; i < 5 && cap->mode != CAPACITY_AUTO; i++) {
        const int ki = spec_index("model", auto_keys[i]);
        if (!c->at[ki]) continue;
        char loc[MOE_PATH_MAX + 96];
        where(c, c->at[ki], loc, sizeof loc);
        return moe_error(MOE_EINVAL,
                         "%s: model.%s is set but model.capacity_factor is not \"auto\": it has "
                         "no effect (set capacity_factor = \"auto\", or remove it)",
                         loc, auto_keys[i]);
    }
    if (cap->mode == CAPACITY_AUTO && cap->min > cap->max)
        return inconsistent(c, cfg, spec_index("model", "capacity_min"),
                            spec_index("model", "capacity_max"), "exceeds",
                            "auto capacity keeps the factor within [capacity_min, capacity_max]");
    if (cap->mode == CAPACITY_AUTO) m->moe.capacity_factor = cap->max; // young router: wide
    if (c->at[drop] && m->moe.capacity_factor == 0.0) {
        char loc[MOE_PATH_MAX + 96];
        where(c, c->at[drop], loc, sizeof loc);
        return moe_error(MOE_EINVAL,
                         "%s: model.drop_policy is set but model.capacity_factor = 0 (dropless): "
                         "nothing is ever dropped (set capacity_factor > 0, or remove drop_policy)",
                         loc);
    }
    if (cfg->seq_len > m->max_seq_len)
        return inconsistent(c, cfg, seq_len, max_seq, "exceeds",
                            "RoPE and the KV cache are sized for max_seq_len positions");
    if (cfg->min_lr > cfg->lr)
        return inconsistent(c, cfg, min_lr, lr, "exceeds",
                            "the schedule decays from lr down to min_lr");
    if (cfg->warmup_steps > cfg->steps)
        return inconsistent(c, cfg, warmup, steps, "exceeds", "warmup would never finish");
    return check_sizes(c, cfg);
}

// ---- --set group.key=value ------------------------------------------------------------------

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

static config_setting_t *copy_setting(config_setting_t *parent, const char *name,
                                      const config_setting_t *src) {
    int type = config_setting_type(src);
    config_setting_t *d = config_setting_add(parent, name, type);
    if (!d) return NULL;
    switch (type) {
    case CONFIG_TYPE_INT: config_setting_set_int(d, config_setting_get_int(src)); break;
    case CONFIG_TYPE_INT64: config_setting_set_int64(d, config_setting_get_int64(src)); break;
    case CONFIG_TYPE_FLOAT: config_setting_set_float(d, config_setting_get_float(src)); break;
    case CONFIG_TYPE_BOOL: config_setting_set_bool(d, config_setting_get_bool(src)); break;
    case CONFIG_TYPE_STRING:
        if (!config_setting_set_string(d, config_setting_get_string(src))) return NULL;
        break;
    default: // group, array, list
        for (int i = 0; i < config_setting_length(src); i++) {
            const config_setting_t *e = config_setting_get_elem(src, (unsigned)i);
            if (!copy_setting(d, config_setting_name(e), e)) return NULL;
        }
    }
    return d;
}

static int looks_like_bare_word(const char *v) {
    if (!isalpha((unsigned char)v[0])) return 0;
    if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) return 0;
    for (; *v; v++)
        if (!is_name_char((unsigned char)*v) && *v != '.' && *v != '/') return 0;
    return 1;
}

static moe_status apply_set(load_ctx *c, const char *arg, override_origin *o) {
    char buf[MOE_PATH_MAX + 256];
    if (strlen(arg) >= sizeof buf)
        return moe_error(MOE_EINVAL, "--set %.40s...: too long (at most %zu bytes)", arg,
                         sizeof buf - 1);
    strcpy(buf, arg);
    char *eq = strchr(buf, '=');
    if (!eq) return moe_error(MOE_EINVAL, "--set %s: expected group.key=value", trim(buf));
    *eq = '\0';
    char *full = trim(buf), *value = trim(eq + 1);
    char *dot = strchr(full, '.');
    if (!dot) {
        for (int i = 0; i < N_SPECS; i++)
            if (strcmp(specs[i].key, full) == 0)
                return moe_error(MOE_EINVAL,
                                 "--set %s: expected group.key=value (%s is a key of %s: "
                                 "--set %s.%s=...)",
                                 full, full, specs[i].group, specs[i].group, full);
        return moe_error(MOE_EINVAL, "--set %s: expected group.key=value", full);
    }
    *dot = '\0';
    const char *group = full, *key = dot + 1;
    snprintf(o->name, sizeof o->name, "%s.%s", group, key);
    snprintf(o->label, sizeof o->label, "--set %s.%s", group, key);
    char hint[256];
    if (!is_group(group)) {
        suggest_group(hint, sizeof hint, group);
        return moe_error(MOE_EINVAL, "%s: unknown group %s%s", o->label, group, hint);
    }
    if (spec_index(group, key) < 0) {
        suggest_key(hint, sizeof hint, group, key);
        return moe_error(MOE_EINVAL, "%s: unknown key%s", o->label, hint);
    }
    size_t vn = strlen(value);
    while (vn > 0 && (value[vn - 1] == ';' || isspace((unsigned char)value[vn - 1])))
        value[--vn] = '\0';
    if (vn == 0)
        return moe_error(MOE_EINVAL, "%s: missing value (--set %s=VALUE)", o->label, o->name);

    // Parse "key = value" on its own: the value is checked like one from a file.
    size_t tn = strlen(key) + vn + 8;
    o->text = malloc(tn);
    if (!o->text) return moe_error(MOE_ENOMEM, "%s: out of memory", o->label);
    snprintf(o->text, tn, "%s = %s\n;", key, value);
    moe_status st = scan_source(c, o->label, o->label, o->text); // no @include, no "\x00"
    if (st) return st;
    config_t snip;
    config_init(&snip);
    if (!config_read_string(&snip, o->text)) {
        const char *why = config_error_text(&snip) ? config_error_text(&snip) : "?";
        char quote_hint[MOE_PATH_MAX + 256] = "";
        if (looks_like_bare_word(value))
            snprintf(quote_hint, sizeof quote_hint,
                     " (strings need double quotes: --set '%s=\"%s\"')", o->name, value);
        st = moe_error(MOE_EINVAL, "%s: syntax error: %s in \"%s\"%s", o->label, why, value,
                       quote_hint);
        goto out;
    }
    const config_setting_t *sroot = config_root_setting(&snip);
    if (config_setting_length(sroot) != 1) {
        st = moe_error(MOE_EINVAL, "%s: expected one value, got \"%s\"", o->label, value);
        goto out;
    }
    config_setting_t *root = config_root_setting(&c->lc);
    config_setting_t *g = config_setting_get_member(root, group);
    if (g && config_setting_type(g) != CONFIG_TYPE_GROUP) {
        st = bad(c, g, group, "expected a group (%s = { ... };), got %s", group,
                 type_name(config_setting_type(g)));
        goto out;
    }
    if (!g) { // the file lacks this group: the override creates it
        g = config_setting_add(root, group, CONFIG_TYPE_GROUP);
        if (!g) {
            st = moe_error(MOE_ENOMEM, "%s: cannot add group %s", o->label, group);
            goto out;
        }
        config_setting_set_hook(g, o);
    }
    if (config_setting_get_member(g, key)) config_setting_remove(g, key);
    config_setting_t *d = copy_setting(g, key, config_setting_get_elem(sroot, 0));
    if (!d) {
        st = moe_error(MOE_ENOMEM, "%s: cannot add the setting", o->label);
        goto out;
    }
    config_setting_set_hook(d, o);
out:
    config_destroy(&snip);
    return st;
}

// ---- load -----------------------------------------------------------------------------------

// A config file (the main one or an @included one): a regular file of at most
// MOE_CONFIG_MAX_BYTES without NUL bytes (data/files.h: /dev/zero would never end, a FIFO would
// block, and libconfig would stop reading at a NUL).
static moe_status read_whole_file(const char *path, char **out) {
    return file_read_input(path, "a config", MOE_CONFIG_MAX_BYTES, 1, out, NULL);
}

moe_status moe_train_config_load(moe_train_config *cfg, const char *path, int n_set,
                                 char *const *sets) {
    if (!cfg) return moe_error(MOE_EINVAL, "moe_train_config_load: cfg is NULL");
    if (n_set < 0 || (n_set > 0 && !sets))
        return moe_error(MOE_EINVAL, "moe_train_config_load: bad overrides (n_set = %d)", n_set);
    if (path && strlen(path) >= MOE_PATH_MAX)
        return moe_error(MOE_EINVAL, "%.64s...: path too long (at most %d bytes)", path,
                         MOE_PATH_MAX - 1);

    load_ctx *c = calloc(1, sizeof *c);
    moe_train_config *tmp = malloc(sizeof *tmp);
    override_origin *origins = n_set > 0 ? calloc((size_t)n_set, sizeof *origins) : NULL;
    if (!c || !tmp || (n_set > 0 && !origins)) {
        free(c);
        free(tmp);
        free(origins);
        return moe_error(MOE_ENOMEM, "moe_train_config_load: out of memory");
    }
    c->path = path;
    c->overrides = origins;
    config_init(&c->lc);
    moe_train_config_default(tmp);
    moe_status st = MOE_OK;

    if (path) {
        if ((st = read_whole_file(path, &c->main_text))) goto done;
        // @include "x" is relative to the config's folder.
        const char *slash = strrchr(path, '/');
        if (slash) {
            size_t n = slash == path ? 1 : (size_t)(slash - path);
            memcpy(c->include_dir, path, n);
            c->include_dir[n] = '\0';
            config_set_include_dir(&c->lc, c->include_dir);
        }
        // every @include checked and read before libconfig opens it; no "\x00" in strings
        if ((st = scan_source(c, path, NULL, c->main_text))) goto done;
        if (!config_read_string(&c->lc, c->main_text)) {
            char file[MOE_PATH_MAX + 64];
            resolve_file(c, config_error_file(&c->lc), file, sizeof file);
            st = moe_error(MOE_EINVAL, "%s:%d: syntax error: %s", file, config_error_line(&c->lc),
                           config_error_text(&c->lc) ? config_error_text(&c->lc) : "?");
            goto done;
        }
        memcpy(tmp->source, path, strlen(path) + 1);
    }
    for (int i = 0; i < n_set; i++) {
        if (!sets[i]) {
            st = moe_error(MOE_EINVAL, "--set #%d is NULL", i + 1);
            goto done;
        }
        if ((st = apply_set(c, sets[i], &origins[i]))) goto done;
    }
    if ((st = read_tree(c, tmp))) goto done;
    if ((st = check_combinations(c, tmp))) goto done;
    if ((st = check_placement(c, tmp))) goto done;
    memcpy(cfg, tmp, sizeof *cfg);

done:
    config_destroy(&c->lc);
    for (int i = 0; i < c->n_files; i++) {
        free(c->files[i].path);
        free(c->files[i].text);
    }
    free(c->files);
    for (int i = 0; i < n_set; i++) free(origins[i].text);
    free(origins);
    free(c->main_text);
    free(c);
    free(tmp);
    return st;
}

// ---- write ----------------------------------------------------------------------------------

static void write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        switch (ch) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (ch < 0x20 || ch == 0x7f)
                fprintf(f, "\\x%02x", ch);
            else
                fputc(ch, f);
        }
    }
    fputc('"', f);
}

static moe_status check_writable(const moe_train_config *cfg) {
    for (int i = 0; i < N_SPECS; i++) {
        const key_spec *k = &specs[i];
        const char *field = (const char *)cfg + k->off;
        switch (k->kind) {
        case K_FLOAT:
            if (!isfinite(*(const double *)field))
                return moe_error(MOE_EINVAL, "moe_train_config_write: %s.%s is not finite",
                                 k->group, k->key);
            break;
        case K_ENUM: {
            int v = *(const int *)field, n = 0;
            while (k->names[n]) n++;
            if (v < 0 || v >= n)
                return moe_error(MOE_EINVAL,
                                 "moe_train_config_write: %s.%s = %d is not a valid value",
                                 k->group, k->key, v);
            break;
        }
        case K_STRING:
            if (memchr(field, '\0', MOE_PATH_MAX) == NULL)
                return moe_error(MOE_EINVAL, "moe_train_config_write: %s.%s is not terminated",
                                 k->group, k->key);
            break;
        case K_STRLIST: {
            int n = *(const int *)((const char *)cfg + k->count_off);
            if (n < 0 || n > MOE_MAX_TEXT_SOURCES)
                return moe_error(MOE_EINVAL, "moe_train_config_write: %s.%s has %d entries",
                                 k->group, k->key, n);
            for (int j = 0; j < n; j++)
                if (memchr(field + (size_t)j * MOE_PATH_MAX, '\0', MOE_PATH_MAX) == NULL)
                    return moe_error(MOE_EINVAL,
                                     "moe_train_config_write: %s.%s[%d] is not terminated",
                                     k->group, k->key, j);
            break;
        }
        default: break;
        }
    }
    const capacity_plan *cap = &cfg->capacity;
    if (cap->mode < CAPACITY_FIXED || cap->mode > CAPACITY_AUTO ||
        (cap->mode == CAPACITY_SCHEDULE &&
         (cap->n_points < 1 || cap->n_points > MOE_CAPACITY_MAX_POINTS)))
        return moe_error(MOE_EINVAL, "moe_train_config_write: model.capacity_factor: bad plan");
    if (cfg->model.moe.capacity_factor == 0.0 && cfg->model.moe.drop_policy != MOE_DROP_PROBS)
        return moe_error(MOE_EINVAL,
                         "moe_train_config_write: model.drop_policy = \"%s\" with "
                         "model.capacity_factor = 0 (dropless) would not load back",
                         drop_names[cfg->model.moe.drop_policy]);
    return MOE_OK;
}

static void write_float(FILE *f, double x) {
    char v[40];
    fmt_double(v, sizeof v, x);
    fprintf(f, "%s%s", v, strpbrk(v, ".e") ? "" : ".0"); // stays a float for libconfig
}

// model.capacity_factor as read_capacity reads it: a number, "auto" or the schedule.
static void write_capacity(FILE *f, const moe_train_config *cfg) {
    const capacity_plan *p = &cfg->capacity;
    if (p->mode == CAPACITY_AUTO) {
        fputs("\"auto\"", f);
    } else if (p->mode == CAPACITY_SCHEDULE) {
        fputc('(', f);
        for (int i = 0; i < p->n_points; i++) {
            fprintf(f, "%s(%" PRId64 "%s, ", i ? ", " : "", p->step[i],
                    p->step[i] > INT_MAX ? "L" : "");
            write_float(f, p->factor[i]);
            fputc(')', f);
        }
        fputc(')', f);
    } else {
        write_float(f, cfg->model.moe.capacity_factor);
    }
}

moe_status moe_train_config_write(const moe_train_config *cfg, FILE *f) {
    if (!cfg || !f) return moe_error(MOE_EINVAL, "moe_train_config_write: NULL argument");
    moe_status st = check_writable(cfg);
    if (st) return st;
    fputs("# moe.c training config, resolved: every key, defaults included.\n", f);
    const char *open = NULL;
    for (int i = 0; i < N_SPECS; i++) {
        const key_spec *k = &specs[i];
        const char *field = (const char *)cfg + k->off;
        if (!open || strcmp(open, k->group) != 0) {
            if (open) fputs("};\n\n", f);
            fprintf(f, "%s = {\n", k->group);
            open = k->group;
        }
        if (k->kind != K_CAPACITY && k->off >= OFF(capacity, capacity_plan) &&
            k->off < OFF(capacity, capacity_plan) + sizeof(capacity_plan) &&
            cfg->capacity.mode != CAPACITY_AUTO) {
            // auto's keys: in the file they would be rejected (they have no effect)
            if (k->off == OFF(capacity.max_drop, double))
                fputs("  # max_drop, capacity_window, capacity_min, capacity_max, "
                      "capacity_max_change: with capacity_factor = \"auto\" only\n",
                      f);
            continue;
        }
        if (k->kind == K_ENUM && k->names == drop_names && cfg->model.moe.capacity_factor == 0.0) {
            // dropless: a drop_policy in the file would be rejected (it has no effect)
            fprintf(f, "  # %s = \"%s\"; (no effect: capacity_factor = 0 is dropless)\n", k->key,
                    k->names[cfg->model.moe.drop_policy]);
            continue;
        }
        fprintf(f, "  %s = ", k->key);
        switch (k->kind) {
        case K_INT: fprintf(f, "%d", *(const int *)field); break;
        case K_INT64: {
            int64_t v = *(const int64_t *)field;
            fprintf(f, "%" PRId64 "%s", v, v < INT_MIN || v > INT_MAX ? "L" : "");
            break;
        }
        case K_FLOAT: write_float(f, *(const double *)field); break;
        case K_BOOL: fputs(*(const int *)field ? "true" : "false", f); break;
        case K_STRING: write_string(f, field); break;
        case K_ENUM: write_string(f, k->names[*(const int *)field]); break;
        case K_STRLIST: {
            int n = *(const int *)((const char *)cfg + k->count_off);
            fputc('[', f);
            for (int j = 0; j < n; j++) {
                fputs(j ? ", " : " ", f);
                write_string(f, field + (size_t)j * MOE_PATH_MAX);
            }
            fputs(n ? " ]" : "]", f);
            break;
        }
        case K_CAPACITY: write_capacity(f, cfg); break;
        case K_INTLIST: {
            const int *v = (const int *)field;
            int n = *(const int *)((const char *)cfg + k->count_off);
            fputc('[', f);
            for (int j = 0; j < n; j++) fprintf(f, "%s%d", j ? ", " : "", v[j]);
            fputc(']', f);
            break;
        }
        }
        fputs(";\n", f);
    }
    fputs("};\n", f);
    if (ferror(f)) return moe_error(MOE_EIO, "moe_train_config_write: %s", strerror(errno));
    return MOE_OK;
}
