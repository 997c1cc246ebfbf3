// Integer literals: libconfig 1.5 wraps an integer above 2^31-1 without an L suffix to 32
// bits (and one above 2^63-1 is wrapped or saturated), so every integer setting is read again
// from its literal in the source text (found by a small lexer from the setting's source line)
// and that exact value is used; a literal beyond 64 bits is rejected as an overflow.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

// Skips blanks and comments (#, //, /* */), counting lines.
const char *moe_cfg_skip_blank(const char *p, unsigned *line) {
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
        p = moe_cfg_skip_blank(p, &line);
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
            p = moe_cfg_skip_blank(p, &line);
            if ((*p == '=' || *p == ':') && name_line == target && len == name_len &&
                memcmp(start, name, len) == 0 && k-- == 0) {
                p = moe_cfg_skip_blank(p + 1, &line);
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

// Text of an @included file (scan_text has read it; NULL if it cannot be read).
static const char *included_text(load_ctx *c, const char *file) {
    const char *known = moe_cfg_cached_text(c, file);
    if (known) return known;
    char path[2 * MOE_PATH_MAX + 2], *text = NULL;
    if (!moe_cfg_resolve_file(c, file, path, sizeof path) || moe_cfg_read_file(path, &text))
        return NULL;
    return moe_cfg_cache_text(c, file, text) ? NULL : text;
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
moe_status moe_cfg_int_value(load_ctx *c, const config_setting_t *s, const char *name, int64_t *v) {
    const override_origin *o = moe_cfg_origin_of(s);
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
        return moe_cfg_bad(c, s, name,
                           "cannot find this integer in the source text to check it for overflow "
                           "(libconfig 1.5 wraps integers above 2147483647 without an L suffix)");
    int64_t x = 0;
    int r = truncated ? -1 : parse_int_literal(lit, &x);
    if (r == -1)
        return moe_cfg_bad(c, s, name,
                           "%s%s overflows a 64-bit integer (at most 9223372036854775807)", lit,
                           truncated ? "..." : "");
    if (r == -2) return moe_cfg_bad(c, s, name, "cannot read the integer literal \"%s\"", lit);
    *v = x;
    return MOE_OK;
}
