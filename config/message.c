// The wording of errors: where a setting came from ("FILE:LINE" of the main file or an
// @included one, or "--set group.key"), the error naming it, a setting type's name and a
// double's shortest text.
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

const override_origin *moe_cfg_origin_of(const config_setting_t *s) {
    for (; s; s = config_setting_parent(s))
        if (config_setting_get_hook(s)) return config_setting_get_hook(s);
    return NULL;
}

// A file name as libconfig records it (NULL: the main file) -> the path to show and open:
// libconfig 1.5 opens "<include_dir>/<name>", an absolute name too, or the name without
// an include dir. Returns 0 if the path does not fit in buf.
int moe_cfg_resolve_file(const load_ctx *c, const char *file, char *buf, size_t n) {
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
void moe_cfg_where(const load_ctx *c, const config_setting_t *s, char *buf, size_t n) {
    const override_origin *o = moe_cfg_origin_of(s);
    if (o) {
        snprintf(buf, n, "%s", o->label);
        return;
    }
    char file[MOE_PATH_MAX + 64];
    moe_cfg_resolve_file(c, config_setting_source_file(s), file, sizeof file);
    snprintf(buf, n, "%s:%u", file, config_setting_source_line(s));
}

// "WHERE: NAME: WHAT" (for an override of NAME itself, "--set NAME: WHAT").
moe_status moe_cfg_bad(const load_ctx *c, const config_setting_t *s, const char *name,
                       const char *fmt, ...) {
    char what[768], loc[MOE_PATH_MAX + 96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    moe_cfg_where(c, s, loc, sizeof loc);
    const override_origin *o = moe_cfg_origin_of(s);
    if (o && strcmp(o->name, name) == 0) return moe_error(MOE_EINVAL, "%s: %s", loc, what);
    return moe_error(MOE_EINVAL, "%s: %s: %s", loc, name, what);
}

// The shortest "%.Ng" that reads back as exactly v (so 0.1 prints as 0.1, not
// 0.10000000000000001, and still round-trips bit for bit).
void moe_cfg_fmt_double(char *buf, size_t n, double v) {
    if (!buf || n == 0) return; // (and gcc's -Wformat-truncation sees buf is not NULL)
    if (!isfinite(v)) {
        snprintf(buf, n, "%g", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

const char *moe_cfg_type_name(int type) {
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
