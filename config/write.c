// The resolved-config writer: every key of a moe_train_config, defaults included, as a
// libconfig file that loads back to the same struct (moe_train_config_write).
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "config/config_internal.h"

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
    for (int i = 0; i < CFG_N_SPECS; i++) {
        const key_spec *k = &moe_cfg_specs[i];
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
    const moe_capacity_plan *cap = &cfg->capacity;
    if (cap->mode < MOE_CAPACITY_FIXED || cap->mode > MOE_CAPACITY_AUTO ||
        (cap->mode == MOE_CAPACITY_SCHEDULE &&
         (cap->n_points < 1 || cap->n_points > MOE_CAPACITY_MAX_POINTS)))
        return moe_error(MOE_EINVAL, "moe_train_config_write: model.capacity_factor: bad plan");
    if (cfg->model.moe.capacity_factor == 0.0 && cfg->model.moe.drop_policy != MOE_DROP_PROBS)
        return moe_error(MOE_EINVAL,
                         "moe_train_config_write: model.drop_policy = \"%s\" with "
                         "model.capacity_factor = 0 (dropless) would not load back",
                         moe_cfg_drop_names[cfg->model.moe.drop_policy]);
    return MOE_OK;
}

static void write_float(FILE *f, double x) {
    char v[40];
    moe_cfg_fmt_double(v, sizeof v, x);
    fprintf(f, "%s%s", v, strpbrk(v, ".e") ? "" : ".0"); // stays a float for libconfig
}

// model.capacity_factor as read_capacity reads it: a number, "auto" or the schedule.
static void write_capacity(FILE *f, const moe_train_config *cfg) {
    const moe_capacity_plan *p = &cfg->capacity;
    if (p->mode == MOE_CAPACITY_AUTO) {
        fputs("\"auto\"", f);
    } else if (p->mode == MOE_CAPACITY_SCHEDULE) {
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
    for (int i = 0; i < CFG_N_SPECS; i++) {
        const key_spec *k = &moe_cfg_specs[i];
        const char *field = (const char *)cfg + k->off;
        if (!open || strcmp(open, k->group) != 0) {
            if (open) fputs("};\n\n", f);
            fprintf(f, "%s = {\n", k->group);
            open = k->group;
        }
        if (k->kind != K_CAPACITY && k->off >= OFF(capacity, moe_capacity_plan) &&
            k->off < OFF(capacity, moe_capacity_plan) + sizeof(moe_capacity_plan) &&
            cfg->capacity.mode != MOE_CAPACITY_AUTO) {
            // auto's keys: in the file they would be rejected (they have no effect)
            if (k->off == OFF(capacity.max_drop, double))
                fputs("  # max_drop, capacity_window, capacity_min, capacity_max, "
                      "capacity_max_change: with capacity_factor = \"auto\" only\n",
                      f);
            continue;
        }
        if (k->kind == K_ENUM && k->names == moe_cfg_drop_names &&
            cfg->model.moe.capacity_factor == 0.0) {
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
