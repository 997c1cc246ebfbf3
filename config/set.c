// `--set group.key=value` overrides: the value is parsed as a libconfig snippet on its own
// (checked like one from a file) and put into the parsed tree, where it replaces the file's
// setting; the setting keeps its origin (for "--set group.key: ..." messages).
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

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

moe_status moe_cfg_apply_set(load_ctx *c, const char *arg, override_origin *o) {
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
        for (int i = 0; i < CFG_N_SPECS; i++)
            if (strcmp(moe_cfg_specs[i].key, full) == 0)
                return moe_error(MOE_EINVAL,
                                 "--set %s: expected group.key=value (%s is a key of %s: "
                                 "--set %s.%s=...)",
                                 full, full, moe_cfg_specs[i].group, moe_cfg_specs[i].group, full);
        return moe_error(MOE_EINVAL, "--set %s: expected group.key=value", full);
    }
    *dot = '\0';
    const char *group = full, *key = dot + 1;
    snprintf(o->name, sizeof o->name, "%s.%s", group, key);
    snprintf(o->label, sizeof o->label, "--set %s.%s", group, key);
    char hint[256];
    if (!moe_cfg_is_group(group)) {
        moe_cfg_suggest_group(hint, sizeof hint, group);
        return moe_error(MOE_EINVAL, "%s: unknown group %s%s", o->label, group, hint);
    }
    if (moe_cfg_spec_index(group, key) < 0) {
        moe_cfg_suggest_key(hint, sizeof hint, group, key);
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
    moe_status st = moe_cfg_scan_source(c, o->label, o->label, o->text); // no @include, no "\x00"
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
        st = moe_cfg_bad(c, g, group, "expected a group (%s = { ... };), got %s", group,
                         moe_cfg_type_name(config_setting_type(g)));
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
