// Reading the parsed tree: every group and key checked against the schema (unknown names
// rejected with a suggestion), and each key's value read into its field by its kind (type
// and range checked; model.capacity_factor's number, "auto" or schedule; the placement list).
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "config/config_internal.h"

static void spec_name(char *buf, size_t n, const key_spec *k) {
    snprintf(buf, n, "%s.%s", k->group, k->key);
}

static moe_status read_string(load_ctx *c, const config_setting_t *s, const char *name,
                              int nonempty, char *dst) {
    const char *v = config_setting_get_string(s);
    size_t len = strlen(v);
    if (len >= MOE_PATH_MAX)
        return moe_cfg_bad(c, s, name, "is too long (%zu bytes, at most %d)", len,
                           MOE_PATH_MAX - 1);
    if (nonempty && len == 0) return moe_cfg_bad(c, s, name, "must not be empty");
    memset(dst, 0, MOE_PATH_MAX);
    memcpy(dst, v, len);
    return MOE_OK;
}

static moe_status read_key(load_ctx *c, const key_spec *k, const config_setting_t *s,
                           moe_train_config *cfg);

// A number of a setting (int or float) into *v; MOE_EINVAL naming it otherwise. An integer
// of a named setting is read from its literal (moe_cfg_int_value); of a list element, as libconfig
// gives it.
static moe_status number_value(load_ctx *c, const config_setting_t *s, const char *name,
                               double *v) {
    int type = config_setting_type(s);
    if (type == CONFIG_TYPE_FLOAT) {
        *v = config_setting_get_float(s);
        return MOE_OK;
    }
    if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
        return moe_cfg_bad(c, s, name, "expected a number, got %s", moe_cfg_type_name(type));
    if (!s->name) {
        *v = (double)config_setting_get_int64(s);
        return MOE_OK;
    }
    int64_t i;
    moe_status st = moe_cfg_int_value(c, s, name, &i);
    *v = (double)i;
    return st;
}

// model.capacity_factor: a number >= 0 (0: dropless), "auto", or a schedule
// ((step, factor), ...) with steps >= 0 strictly increasing and factors > 0.
static moe_status read_capacity(load_ctx *c, const config_setting_t *s, const char *name,
                                moe_train_config *cfg) {
    moe_capacity_plan *p = &cfg->capacity;
    const int type = config_setting_type(s);
    moe_status st;
    if (type == CONFIG_TYPE_STRING) {
        if (strcmp(config_setting_get_string(s), "auto"))
            return moe_cfg_bad(c, s, name,
                               "\"%.64s\" is not \"auto\" (or give a number, or a schedule "
                               "((step, factor), ...))",
                               config_setting_get_string(s));
        p->mode = MOE_CAPACITY_AUTO;
        return MOE_OK;
    }
    if (type != CONFIG_TYPE_LIST && type != CONFIG_TYPE_ARRAY) { // one number, read as such
        static const key_spec one =
            KFLT("model", "capacity_factor", model.moe.capacity_factor, 0, CLOSED, INFINITY, OPEN);
        p->mode = MOE_CAPACITY_FIXED, p->n_points = 0;
        return read_key(c, &one, s, cfg);
    }
    const int n = config_setting_length(s);
    if (n < 1 || n > MOE_CAPACITY_MAX_POINTS)
        return moe_cfg_bad(c, s, name, "a schedule needs 1 to %d (step, factor) points, got %d",
                           MOE_CAPACITY_MAX_POINTS, n);
    for (int i = 0; i < n; i++) {
        const config_setting_t *pt = config_setting_get_elem(s, (unsigned)i);
        char ename[128];
        snprintf(ename, sizeof ename, "%s[%d]", name, i);
        const int pt_type = config_setting_type(pt);
        if ((pt_type != CONFIG_TYPE_LIST && pt_type != CONFIG_TYPE_ARRAY) ||
            config_setting_length(pt) != 2)
            return moe_cfg_bad(c, pt, ename, "expected a (step, factor) pair");
        const config_setting_t *ss = config_setting_get_elem(pt, 0),
                               *fs = config_setting_get_elem(pt, 1);
        int64_t step;
        double f;
        if (config_setting_type(ss) != CONFIG_TYPE_INT &&
            config_setting_type(ss) != CONFIG_TYPE_INT64)
            return moe_cfg_bad(c, ss, ename, "the step must be an integer");
        // (a list element has no name for moe_cfg_int_value's literal check: libconfig wraps a step
        // above 2147483647 unless written with an L suffix, which the docs say)
        step = config_setting_get_int64(ss);
        if ((st = number_value(c, fs, ename, &f))) return st;
        if (step < 0 || (i > 0 && step <= p->step[i - 1]))
            return moe_cfg_bad(c, ss, ename,
                               "steps must be >= 0 and increase (%" PRId64 " after %" PRId64 ")",
                               step, i ? p->step[i - 1] : 0);
        if (!(f > 0) || !isfinite(f))
            return moe_cfg_bad(c, fs, ename,
                               "a scheduled factor must be > 0 and finite (dropless is 0 "
                               "alone)");
        p->step[i] = step, p->factor[i] = f;
    }
    p->mode = MOE_CAPACITY_SCHEDULE, p->n_points = n;
    cfg->model.moe.capacity_factor = p->factor[0]; // held before the first point
    return MOE_OK;
}

// parallel.expert_placement: a list of integers in [0, MOE_MAX_EXPERTS) ([] is the default
// identity); that it is a permutation of 0 .. n_experts-1 is checked with the other keys
// (moe_cfg_check_placement).
static moe_status read_placement(load_ctx *c, const config_setting_t *s, const char *name,
                                 moe_train_config *cfg) {
    const int type = config_setting_type(s);
    if (type != CONFIG_TYPE_LIST && type != CONFIG_TYPE_ARRAY)
        return moe_cfg_bad(c, s, name, "expected a list of expert indices [p0, p1, ...], got %s",
                           moe_cfg_type_name(type));
    const int n = config_setting_length(s);
    if (n > MOE_MAX_EXPERTS)
        return moe_cfg_bad(c, s, name, "has %d entries, at most %d", n, MOE_MAX_EXPERTS);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
        char ename[112];
        snprintf(ename, sizeof ename, "%s[%d]", name, i);
        const int et = config_setting_type(e);
        if (et != CONFIG_TYPE_INT && et != CONFIG_TYPE_INT64)
            return moe_cfg_bad(c, e, ename, "expected an expert index, got %s",
                               moe_cfg_type_name(et));
        const int64_t v = config_setting_get_int64(e);
        if (v < 0 || v >= MOE_MAX_EXPERTS)
            return moe_cfg_bad(c, e, ename, "%" PRId64 " is not an expert index", v);
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
        if (!is_int)
            return moe_cfg_bad(c, s, name, "expected an integer, got %s", moe_cfg_type_name(type));
        int64_t v;
        if ((st = moe_cfg_int_value(c, s, name, &v))) return st;
        if (v < k->lo || v > k->hi)
            return moe_cfg_bad(c, s, name, "%" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                               v, k->lo, k->hi);
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
            if ((st = moe_cfg_int_value(c, s, name, &i))) return st;
            v = (double)i;
        } else {
            return moe_cfg_bad(c, s, name, "expected a number, got %s", moe_cfg_type_name(type));
        }
        int ok = !isnan(v) && (k->lo_open ? v > k->flo : v >= k->flo) &&
                 (k->hi_open ? v < k->fhi : v <= k->fhi);
        if (!ok) {
            char vs[40], lo[40], hi[40];
            if (is_int)
                snprintf(vs, sizeof vs, "%" PRId64, i);
            else
                moe_cfg_fmt_double(vs, sizeof vs, v);
            moe_cfg_fmt_double(lo, sizeof lo, k->flo);
            moe_cfg_fmt_double(hi, sizeof hi, k->fhi);
            return moe_cfg_bad(c, s, name, "%s is out of range %c%s, %s%c", vs,
                               k->lo_open ? '(' : '[', lo, hi, k->hi_open ? ')' : ']');
        }
        *(double *)field = v;
        return MOE_OK;
    }
    case K_BOOL:
        if (type != CONFIG_TYPE_BOOL)
            return moe_cfg_bad(c, s, name, "expected a boolean (true or false), got %s",
                               moe_cfg_type_name(type));
        *(int *)field = config_setting_get_bool(s) ? 1 : 0;
        return MOE_OK;
    case K_STRING:
        if (type != CONFIG_TYPE_STRING)
            return moe_cfg_bad(c, s, name, "expected a string, got %s", moe_cfg_type_name(type));
        return read_string(c, s, name, k->nonempty, field);
    case K_ENUM: {
        char allowed[160];
        moe_cfg_list_names(allowed, sizeof allowed, k->names);
        if (type != CONFIG_TYPE_STRING)
            return moe_cfg_bad(c, s, name, "expected a string (%s), got %s", allowed,
                               moe_cfg_type_name(type));
        const char *v = config_setting_get_string(s);
        for (int i = 0; k->names[i]; i++)
            if (strcmp(v, k->names[i]) == 0) {
                *(int *)field = i;
                return MOE_OK;
            }
        int n = 0;
        while (k->names[n]) n++;
        const char *near = moe_cfg_closest(v, k->names, n);
        char hint[80] = "";
        if (near) snprintf(hint, sizeof hint, " (did you mean \"%s\"?)", near);
        return moe_cfg_bad(c, s, name, "\"%.64s\" is not one of %s%s", v, allowed, hint);
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
            return moe_cfg_bad(c, s, name, "expected a list of strings, got %s",
                               moe_cfg_type_name(type));
        }
        if (n > MOE_MAX_TEXT_SOURCES)
            return moe_cfg_bad(c, s, name, "has %d entries, at most %d", n, MOE_MAX_TEXT_SOURCES);
        memset(dst, 0, sizeof(char[MOE_MAX_TEXT_SOURCES][MOE_PATH_MAX]));
        for (int i = 0; i < n; i++) {
            const config_setting_t *e =
                type == CONFIG_TYPE_STRING ? s : config_setting_get_elem(s, (unsigned)i);
            char ename[112];
            snprintf(ename, sizeof ename, "%s[%d]", name, i);
            if (config_setting_type(e) != CONFIG_TYPE_STRING)
                return moe_cfg_bad(c, e, ename, "expected a string, got %s",
                                   moe_cfg_type_name(config_setting_type(e)));
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

moe_status moe_cfg_read_tree(load_ctx *c, moe_train_config *cfg) {
    const config_setting_t *root = config_root_setting(&c->lc);
    for (int i = 0; i < config_setting_length(root); i++) {
        const config_setting_t *g = config_setting_get_elem(root, (unsigned)i);
        const char *gname = config_setting_name(g);
        char hint[256];
        if (!moe_cfg_is_group(gname)) {
            moe_cfg_suggest_group(hint, sizeof hint, gname);
            return moe_cfg_bad(c, g, gname, "unknown group%s", hint);
        }
        if (config_setting_type(g) != CONFIG_TYPE_GROUP)
            return moe_cfg_bad(c, g, gname, "expected a group (%s = { ... };), got %s", gname,
                               moe_cfg_type_name(config_setting_type(g)));
        for (int j = 0; j < config_setting_length(g); j++) {
            const config_setting_t *s = config_setting_get_elem(g, (unsigned)j);
            const char *key = config_setting_name(s);
            char name[160];
            snprintf(name, sizeof name, "%s.%s", gname, key);
            int idx = moe_cfg_spec_index(gname, key);
            if (idx < 0) {
                moe_cfg_suggest_key(hint, sizeof hint, gname, key);
                if (!hint[0] && config_setting_type(s) == CONFIG_TYPE_GROUP)
                    snprintf(hint, sizeof hint, " (groups do not nest)");
                return moe_cfg_bad(c, s, name, "unknown key%s", hint);
            }
            moe_status st = read_key(c, &moe_cfg_specs[idx], s, cfg);
            if (st) return st;
            c->at[idx] = s;
        }
    }
    return MOE_OK;
}
