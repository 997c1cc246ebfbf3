// Names near a typo: the "did you mean ...?" of an unknown group, key or enum value (edit
// distance against the schema's names), and the list of a key's allowed values.
#include <limits.h>
#include <string.h>

#include "config/config_internal.h"

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
const char *moe_cfg_closest(const char *name, const char *const *cands, int n) {
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
void moe_cfg_suggest_key(char *buf, size_t n, const char *group, const char *key) {
    const char *cands[CFG_N_SPECS];
    int nc = 0;
    for (int i = 0; i < CFG_N_SPECS; i++)
        if (strcmp(moe_cfg_specs[i].group, group) == 0) cands[nc++] = moe_cfg_specs[i].key;
    const char *best = moe_cfg_closest(key, cands, nc);
    buf[0] = '\0';
    if (best) {
        snprintf(buf, n, " (did you mean %s?)", best);
        return;
    }
    for (int i = 0; i < CFG_N_SPECS; i++)
        if (strcmp(moe_cfg_specs[i].key, key) == 0) {
            snprintf(buf, n, " (%s is a key of %s)", key, moe_cfg_specs[i].group);
            return;
        }
}

// For an unknown top-level name.
void moe_cfg_suggest_group(char *buf, size_t n, const char *name) {
    const char *best = moe_cfg_closest(name, moe_cfg_group_names, CFG_N_GROUPS);
    if (best) {
        snprintf(buf, n, " (did you mean %s?)", best);
        return;
    }
    for (int i = 0; i < CFG_N_SPECS; i++)
        if (strcmp(moe_cfg_specs[i].key, name) == 0) {
            snprintf(buf, n,
                     " (%s is a key of %s: write it inside %s = { ... }; the groups are model, "
                     "train, data, log, checkpoint)",
                     name, moe_cfg_specs[i].group, moe_cfg_specs[i].group);
            return;
        }
    snprintf(buf, n, " (the groups are model, train, data, log, checkpoint)");
}

// "\"a\", \"b\" or \"c\""
void moe_cfg_list_names(char *buf, size_t n, const char *const *names) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; names[i]; i++) {
        const char *sep = i == 0 ? "" : names[i + 1] ? ", " : " or ";
        int w = snprintf(buf + len, n - len, "%s\"%s\"", sep, names[i]);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
    }
}
