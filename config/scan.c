// The source text before libconfig parses it: libconfig 1.5 opens @include files itself
// with fopen, without limits (no include hook before 1.7), and drops a "\x00" escape without a
// word. So every text is scanned first (scan_text): each @include is resolved as libconfig
// will, read within the limits of config.h and scanned in turn; a "\x00" in a string is
// refused. The files read are kept (moe_cfg_cached_text) for the integer re-reading.
#include <stdlib.h>
#include <string.h>

#include "data/files.h"
#include "config/config_internal.h"

// A config file (the main one or an @included one): a regular file of at most
// MOE_CONFIG_MAX_BYTES without NUL bytes (data/files.h: /dev/zero would never end, a FIFO would
// block, and libconfig would stop reading at a NUL).
moe_status moe_cfg_read_file(const char *path, char **out) {
    return moe_file_read_input(path, "a config", MOE_CONFIG_MAX_BYTES, 1, out, NULL);
}

// The text of an @included file read before, by the name libconfig records (NULL: none).
const char *moe_cfg_cached_text(const load_ctx *c, const char *file) {
    for (int i = 0; i < c->n_files; i++)
        if (strcmp(c->files[i].path, file) == 0) return c->files[i].text;
    return NULL;
}

// Keeps text (taken over: freed here on failure) as that of `file`.
moe_status moe_cfg_cache_text(load_ctx *c, const char *file, char *text) {
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

// ---- the source text before libconfig parses it -------------------------------------------
//
// Read the way libconfig 1.5's lexer reads it: strings ("..." with \ escapes), comments (#,
// //, /* */), and `@include "name"` at the start of a line after blanks (its name with only
// \\ and \" as escapes; a lone backslash is dropped). Each @include is resolved as libconfig
// will open it, read (moe_cfg_read_file: a regular file within the size limit) and scanned
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
    if (!moe_cfg_resolve_file(s->c, name, path, sizeof path))
        return moe_error(MOE_EINVAL, "%s:%u: @include \"%s\": the path is too long", label, at,
                         name);
    const char *text = moe_cfg_cached_text(s->c, name);
    moe_status st = MOE_OK;
    if (!text) {
        char *fresh = NULL;
        if ((st = moe_cfg_read_file(path, &fresh)) || (st = moe_cfg_cache_text(s->c, name, fresh)))
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
    const char *q = moe_cfg_skip_blank(p, &ignored);
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
moe_status moe_cfg_scan_source(load_ctx *c, const char *label, const char *set_label,
                               const char *text) {
    scan_state s = {.c = c, .set_label = set_label, .total = strlen(text)};
    return scan_text(&s, label, text, 0);
}
