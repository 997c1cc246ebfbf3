// Hugging Face tokenizer folders: running scripts/hf_tokenizer.py, the byte tokenizer's HF
// files, copying a tokenizer's files, its special token ids (see tokenizer.h).
#define _POSIX_C_SOURCE 200809L // fork, execvp, pipe, poll, sigaction, readlink, fsync

#include "data/tokenizer.h"

#include "data/files.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOK_PATH 4096

const char *const moe_tokenizer_hf_files[] = {"tokenizer.json",
                                              "tokenizer_config.json",
                                              "special_tokens_map.json",
                                              "added_tokens.json",
                                              "chat_template.jinja",
                                              "chat_template.json",
                                              NULL};

static int readable_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, R_OK) == 0;
}

// ---- a growing byte buffer ---------------------------------------------------------------

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t k) {
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + k + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return 0;
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = '\0';
    return 1;
}

// ---- finding and running the script ------------------------------------------------------

moe_status moe_hf_tokenizer_script(char *path, size_t n) {
    const char *env = getenv("MOE_TOKENIZER_SCRIPT");
    if (env && *env) {
        if (!readable_file(env))
            return moe_error(MOE_EIO, "MOE_TOKENIZER_SCRIPT=%s: not a readable file", env);
        snprintf(path, n, "%s", env);
        return MOE_OK;
    }
    char exe[TOK_PATH], installed[TOK_PATH + 64] = "(no /proc/self/exe)";
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(installed, sizeof installed, "%s/../share/moe/hf_tokenizer.py", exe);
        if (readable_file(installed)) {
            snprintf(path, n, "%s", installed);
            return MOE_OK;
        }
    }
    const char *source = "(no source tree)";
#ifdef MOE_SOURCE_DIR
    source = MOE_SOURCE_DIR "/scripts/hf_tokenizer.py";
    if (readable_file(source)) {
        snprintf(path, n, "%s", source);
        return MOE_OK;
    }
#endif
    return moe_error(MOE_EIO,
                     "hf_tokenizer.py not found: looked at %s and %s; set "
                     "MOE_TOKENIZER_SCRIPT to the script (scripts/hf_tokenizer.py)",
                     installed, source);
}

// The last non-empty line of text (into line, truncated).
static void last_line(char *line, size_t n, const char *text, size_t len) {
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    size_t start = len;
    while (start > 0 && text[start - 1] != '\n') start--;
    snprintf(line, n, "%.*s", (int)(len - start), text + start);
}

// The child: stdin/stdout/stderr onto the pipes, then exec. Never returns.
static _Noreturn void run_child(char **argv, const int in[2], const int out[2], const int err[2]) {
    signal(SIGPIPE,
           SIG_DFL); // the parent ignores it while it runs us; an ignored signal survives exec
    dup2(in[0], 0);
    if (out[1] >= 0) dup2(out[1], 1);
    dup2(err[1], 2);
    for (int i = 0; i < 2; i++) {
        close(in[i]), close(err[i]);
        if (out[i] >= 0) close(out[i]);
    }
    execvp(argv[0], argv);
    fprintf(stderr,
            "cannot run %s: %s (set MOE_PYTHON to a python 3 that has the tokenizers "
            "package)\n",
            argv[0], strerror(errno));
    _exit(127);
}

// Feeds `in` to fd_in while draining fd_out / fd_err (poll: a child that writes before it has
// read all of its input cannot deadlock us). Closes the three descriptors.
static moe_status pump(int fd_in, const char *in, size_t n_in, int fd_out, buf *out, int fd_err,
                       buf *err) {
    size_t sent = 0;
    if (n_in == 0)
        close(fd_in), fd_in = -1;
    else
        fcntl(fd_in, F_SETFL, fcntl(fd_in, F_GETFL) | O_NONBLOCK);
    int ok = 1;
    char chunk[65536];
    while (fd_in >= 0 || fd_out >= 0 || fd_err >= 0) {
        struct pollfd p[3] = {{fd_in, POLLOUT, 0}, {fd_out, POLLIN, 0}, {fd_err, POLLIN, 0}};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR) continue;
            ok = 0;
            break;
        }
        if (fd_in >= 0 && p[0].revents) {
            ssize_t w = write(fd_in, in + sent, n_in - sent);
            if (w > 0) sent += (size_t)w;
            // EPIPE: the child stopped reading (it failed; its status says why)
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == n_in)
                close(fd_in), fd_in = -1;
        }
        for (int i = 1; i < 3; i++) {
            int *fd = i == 1 ? &fd_out : &fd_err;
            if (*fd < 0 || !p[i].revents) continue;
            ssize_t r = read(*fd, chunk, sizeof chunk);
            if (r > 0) {
                ok &= buf_add(i == 1 ? out : err, chunk, (size_t)r);
                // stderr: only its end is reported, keep the last 64 KiB
                if (i == 2 && err->n > (128u << 10)) {
                    memmove(err->p, err->p + err->n - (64u << 10), (64u << 10) + 1);
                    err->n = 64u << 10;
                }
            } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(*fd), *fd = -1;
            }
        }
    }
    if (fd_in >= 0) close(fd_in);
    if (fd_out >= 0) close(fd_out);
    if (fd_err >= 0) close(fd_err);
    return ok ? MOE_OK
              : moe_error(MOE_ENOMEM, "hf_tokenizer: out of memory reading the script's output");
}

moe_status moe_hf_tokenizer_run(const char *const *args, int n_args, const char *in, size_t n_in,
                                char **out, size_t *n_out) {
    if (out) *out = NULL;
    if (n_out) *n_out = 0;
    char script[TOK_PATH];
    moe_status st = moe_hf_tokenizer_script(script, sizeof script);
    if (st) return st;
    const char *python = getenv("MOE_PYTHON");
    if (!python || !*python) python = "python3";
    char **argv = calloc((size_t)n_args + 3, sizeof *argv);
    if (!argv) return moe_error(MOE_ENOMEM, "hf_tokenizer: out of memory");
    argv[0] = (char *)python, argv[1] = script;
    for (int i = 0; i < n_args; i++) argv[i + 2] = (char *)args[i];
    // the command, for messages
    char cmd[768] = "";
    for (int i = 0; argv[i] && strlen(cmd) < sizeof cmd - 8; i++)
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "%s%s", i ? " " : "", argv[i]);

    int p_in[2] = {-1, -1}, p_out[2] = {-1, -1}, p_err[2] = {-1, -1};
    if (pipe(p_in) || (out && pipe(p_out)) || pipe(p_err)) {
        st = moe_error(MOE_EIO, "%s: cannot create pipes: %s", cmd, strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (p_in[i] >= 0) close(p_in[i]);
            if (p_out[i] >= 0) close(p_out[i]);
            if (p_err[i] >= 0) close(p_err[i]);
        }
        free(argv);
        return st;
    }
    fflush(stdout); // what we printed before comes before the child's output
    fflush(stderr);
    // a child that exits before reading its input must not kill us with SIGPIPE
    struct sigaction ignore = {0}, old;
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &old);
    pid_t pid = fork();
    if (pid == 0) run_child(argv, p_in, p_out, p_err);
    close(p_in[0]), close(p_err[1]);
    if (p_out[1] >= 0) close(p_out[1]);
    buf o = {0}, e = {0};
    if (pid < 0) {
        st = moe_error(MOE_EIO, "%s: cannot fork: %s", cmd, strerror(errno));
        close(p_in[1]), close(p_err[0]);
        if (p_out[0] >= 0) close(p_out[0]);
    } else {
        st = pump(p_in[1], in, n_in, p_out[0], &o, p_err[0], &e);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        char line[512];
        last_line(line, sizeof line, e.p ? e.p : "", e.n);
        if (!st && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            char how[64];
            if (WIFEXITED(status))
                snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(status));
            else
                snprintf(how, sizeof how, "killed by signal %d",
                         WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            st = moe_error(MOE_EIO, "`%s` failed (%s): %s", cmd, how,
                           line[0] ? line : "(no message)");
        } else if (!st && e.n) {
            fwrite(e.p, 1, e.n, stderr); // warnings of a successful run
        }
    }
    sigaction(SIGPIPE, &old, NULL);
    free(e.p);
    free(argv);
    if (st || !out) {
        free(o.p);
        return st;
    }
    if (!o.p && !buf_add(&o, "", 0)) return moe_error(MOE_ENOMEM, "hf_tokenizer: out of memory");
    *out = o.p;
    if (n_out) *n_out = o.n;
    return MOE_OK;
}

// "--name=value" (values that start with '-' stay values), in a buffer of the caller.
static const char *opt(char *b, size_t n, const char *name, const char *value) {
    snprintf(b, n, "--%s=%s", name, value);
    return b;
}

moe_status moe_hf_tokenizer_encode(const char *tok_dir, const char *text, size_t n, int **ids,
                                   int *n_ids) {
    *ids = NULL, *n_ids = 0;
    char t[TOK_PATH + 16];
    const char *args[] = {"encode", opt(t, sizeof t, "tokenizer", tok_dir)};
    char *out;
    size_t len;
    moe_status st = moe_hf_tokenizer_run(args, 2, text, n, &out, &len);
    if (st) return st;
    size_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += out[i] == ' ';
    int *v = malloc(cap * sizeof *v), k = 0;
    if (!v) {
        free(out);
        return moe_error(MOE_ENOMEM, "hf_tokenizer encode: out of memory");
    }
    for (char *p = out, *end;; p = end) {
        while (*p == ' ' || *p == '\n') p++;
        if (!*p) break;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id > INT_MAX || (size_t)k == cap) {
            st = moe_error(MOE_EIO, "hf_tokenizer encode --tokenizer %s: unexpected output '%.40s'",
                           tok_dir, p);
            break;
        }
        v[k++] = (int)id;
    }
    free(out);
    if (st) {
        free(v);
        return st;
    }
    *ids = v, *n_ids = k;
    return MOE_OK;
}

moe_status moe_hf_tokenizer_decode(const char *tok_dir, const int *ids, int n_ids, char **text,
                                   size_t *len) {
    buf in = {0};
    char num[16];
    int ok = buf_add(&in, "", 0);
    for (int i = 0; i < n_ids && ok; i++)
        ok = buf_add(&in, num, (size_t)snprintf(num, sizeof num, "%d ", ids[i]));
    if (!ok) {
        free(in.p);
        return moe_error(MOE_ENOMEM, "hf_tokenizer decode: out of memory");
    }
    char t[TOK_PATH + 16];
    const char *args[] = {"decode", opt(t, sizeof t, "tokenizer", tok_dir)};
    moe_status st = moe_hf_tokenizer_run(args, 2, in.p, in.n, text, len);
    free(in.p);
    return st;
}

moe_status moe_hf_tokenizer_prepare(const char *tok_dir, const char *const *sources, int n_sources,
                                    const char *out_dir, double val_fraction) {
    if (n_sources < 1) return moe_error(MOE_EINVAL, "prepare: no text sources given");
    const int n_args = n_sources + 4;
    const char **args = calloc((size_t)n_args, sizeof *args);
    char **owned = calloc((size_t)n_args, sizeof *owned);
    moe_status st = MOE_OK;
    if (!args || !owned) st = moe_error(MOE_ENOMEM, "prepare: out of memory");
    char vf[40];
    for (int p = 1; p <= 17; p++) // the shortest form that reads back exactly ("0.1")
        if (snprintf(vf, sizeof vf, "%.*g", p, val_fraction) > 0 &&
            strtod(vf, NULL) == val_fraction)
            break;
    const char *names[] = {"tokenizer", "out", "val-fraction"}, *values[] = {tok_dir, out_dir, vf};
    for (int i = 0; i < n_args - 1 && !st; i++) {
        const char *name = i < 3 ? names[i] : "text", *value = i < 3 ? values[i] : sources[i - 3];
        size_t n = strlen(name) + strlen(value) + 4;
        if (!(owned[i] = malloc(n)))
            st = moe_error(MOE_ENOMEM, "prepare: out of memory");
        else
            args[i + 1] = opt(owned[i], n, name, value);
    }
    if (!st) {
        args[0] = "prepare";
        st = moe_hf_tokenizer_run(args, n_args, NULL, 0, NULL, NULL);
    }
    for (int i = 0; owned && i < n_args; i++) free(owned[i]);
    free(owned);
    free(args);
    return st;
}

// ---- files ---------------------------------------------------------------------------------

// dir/name; a path that does not fit becomes "" (which no open finds) rather than another file
static void join(char *b, size_t n, const char *dir, const char *name) {
    if (snprintf(b, n, "%s/%s", dir, name) >= (int)n) b[0] = '\0';
}

int moe_tokenizer_has_hf(const char *dir) {
    char p[TOK_PATH];
    join(p, sizeof p, dir, "tokenizer.json");
    return readable_file(p);
}

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100.. in byte order, so that every byte has a visible, non-space symbol.
static unsigned byte_symbol(int b) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (unsigned)b;
    unsigned k = 0;
    for (int c = 0; c < b; c++)
        k += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
    return 256 + k;
}

// The symbol as a JSON string body (UTF-8; '"' and '\\' escaped).
static void symbol_json(char *out, unsigned u) {
    if (u == '"' || u == '\\')
        out[0] = '\\', out[1] = (char)u, out[2] = 0;
    else if (u < 0x80)
        out[0] = (char)u, out[1] = 0;
    else
        out[0] = (char)(0xC0 | (u >> 6)), out[1] = (char)(0x80 | (u & 0x3F)), out[2] = 0;
}

const char *moe_tokenizer_byte_json(void) {
    static char *json;
    if (json) return json;
    // the `tokenizers` serialisation of a byte-level BPE without merges, written by hand so
    // that its text (which identifies it) does not depend on a JSON library's formatting
    buf b = {0};
    int ok = buf_add(&b, "", 0);
#define ADD(s) (ok = ok && buf_add(&b, s, strlen(s)))
    ADD("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
        "  \"added_tokens\": [],\n  \"normalizer\": null,\n"
        "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
        "\"trim_offsets\": true, \"use_regex\": false},\n"
        "  \"post_processor\": null,\n"
        "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
        "\"trim_offsets\": true, \"use_regex\": true},\n"
        "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
        "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
        "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"vocab\": {");
    for (int i = 0; i < 256; i++) {
        char sym[4], entry[32];
        symbol_json(sym, byte_symbol(i));
        snprintf(entry, sizeof entry, "%s\n      \"%s\": %d", i ? "," : "", sym, i);
        ADD(entry);
    }
    ADD("\n    },\n    \"merges\": []\n  }\n}\n");
#undef ADD
    if (!ok) {
        free(b.p);
        return NULL;
    }
    return json = b.p; // kept for the process's lifetime
}

int moe_tokenizer_is_byte_hf(const char *dir) {
    char p[TOK_PATH], *text;
    const char *want = moe_tokenizer_byte_json();
    join(p, sizeof p, dir, "tokenizer.json");
    if (!want || !readable_file(p) || moe_file_read_all(p, 1u << 20, &text, NULL)) return 0;
    int same = strcmp(text, want) == 0;
    free(text);
    return same;
}

moe_status moe_tokenizer_write_byte_hf(const char *dir) {
    const char *json = moe_tokenizer_byte_json();
    if (!json) return moe_error(MOE_ENOMEM, "byte tokenizer: out of memory");
    char p[TOK_PATH];
    join(p, sizeof p, dir, "tokenizer.json");
    moe_status st = moe_file_write_synced(p, json, strlen(json));
    if (st) return st;
    // model_max_length: transformers' "no limit" value, which it writes itself
    static const char config[] = "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n"
                                 "  \"model_max_length\": 1000000000000000019884624838656,\n"
                                 "  \"clean_up_tokenization_spaces\": false\n}\n";
    join(p, sizeof p, dir, "tokenizer_config.json");
    return moe_file_write_synced(p, config, sizeof config - 1);
}

static moe_status copy_file(const char *src, const char *dst) {
    FILE *in; // a regular file (a FIFO would block: data/files.h)
    if (moe_file_open_input(src, "a tokenizer", UINT64_MAX, &in, NULL)) return MOE_EIO;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return moe_error(MOE_EIO, "%s: cannot write: %s", dst, strerror(errno));
    }
    char chunk[65536];
    size_t r;
    int ok = 1;
    while (ok && (r = fread(chunk, 1, sizeof chunk, in)) > 0) ok = fwrite(chunk, 1, r, out) == r;
    int bad_read = ferror(in);
    fclose(in);
    ok = ok && fflush(out) == 0 && fsync(fileno(out)) == 0;
    if (fclose(out) != 0) ok = 0;
    if (bad_read) return moe_error(MOE_EIO, "%s: read error", src);
    return ok ? MOE_OK : moe_error(MOE_EIO, "%s: write failed: %s", dst, strerror(errno));
}

moe_status moe_tokenizer_copy_hf(const char *src_dir, const char *dst_dir, int *copied) {
    if (copied) *copied = 0;
    char s[TOK_PATH], d[TOK_PATH];
    for (const char *const *name = moe_tokenizer_hf_files; *name; name++) {
        join(s, sizeof s, src_dir, *name);
        if (!readable_file(s)) continue;
        join(d, sizeof d, dst_dir, *name);
        moe_status st = copy_file(s, d);
        if (st) return st;
        if (copied) (*copied)++;
    }
    return MOE_OK;
}

moe_status moe_tokenizer_same_hf(const char *a, const char *b, int *same) {
    *same = 0;
    if (!moe_tokenizer_has_hf(a) || !moe_tokenizer_has_hf(b)) return MOE_OK;
    char pa[TOK_PATH], pb[TOK_PATH], *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    join(pa, sizeof pa, a, "tokenizer.json");
    join(pb, sizeof pb, b, "tokenizer.json");
    moe_status st = moe_file_read_all(pa, (size_t)1 << 30, &ta, &na);
    if (!st) st = moe_file_read_all(pb, (size_t)1 << 30, &tb, &nb);
    if (!st) *same = na == nb && memcmp(ta, tb, na) == 0;
    free(ta), free(tb);
    return st;
}

// ---- special tokens ------------------------------------------------------------------------

// A special token as tokenizer_config.json writes it: "text" or {"content": "text", ...}.
static const char *token_text(const cJSON *cfg, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(t)) t = cJSON_GetObjectItemCaseSensitive(t, "content");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

// A token id of tokenizer.json (path) is an integer in [0, limit); else MOE_EIO naming the
// token (`what`: "added token", "bos_token", ...), its text and the id.
static moe_status check_id(const cJSON *id, const char *path, const char *what, const char *text,
                           int64_t limit) {
    const double x = cJSON_IsNumber(id) ? id->valuedouble : -1;
    if (cJSON_IsNumber(id) && x >= 0 && x < (double)limit && x == floor(x)) return MOE_OK;
    char range[64] = "[0, 2147483647]";
    if (limit <= INT_MAX)
        snprintf(range, sizeof range, "[0, %lld) (the model's vocabulary)", (long long)limit);
    if (!cJSON_IsNumber(id))
        return moe_error(MOE_EIO,
                         "%s: %s \"%.100s\" has no numeric id (it must be an integer in %s)", path,
                         what, text, range);
    return moe_error(MOE_EIO, "%s: %s \"%.100s\" has id %.15g, not an integer in %s", path, what,
                     text, x, range);
}

// Every entry of tokenizer.json's added_tokens has an integer id in [0, limit).
static moe_status check_added_ids(const cJSON *tok, const char *path, int64_t limit) {
    const cJSON *e, *added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
    cJSON_ArrayForEach(e, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        moe_status st = check_id(cJSON_GetObjectItemCaseSensitive(e, "id"), path, "added token",
                                 cJSON_IsString(c) ? c->valuestring : "?", limit);
        if (st) return st;
    }
    return MOE_OK;
}

// *id = the id of token `text` (the special token `key`): its added_tokens entry (checked by
// check_added_ids), else model.vocab's, checked here; -1 when neither has it.
static moe_status token_id(const cJSON *tok, const char *path, const char *key, const char *text,
                           int64_t limit, int *id) {
    const cJSON *e, *added = cJSON_GetObjectItemCaseSensitive(tok, "added_tokens");
    cJSON_ArrayForEach(e, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (cJSON_IsString(c) && !strcmp(c->valuestring, text)) {
            *id = (int)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
            return MOE_OK;
        }
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "vocab"), text);
    *id = -1;
    if (!v) return MOE_OK;
    moe_status st = check_id(v, path, key, text, limit);
    if (!st) *id = (int)v->valuedouble;
    return st;
}

moe_status moe_tokenizer_special_ids(const char *dir, int vocab_size, int *bos, int *eos,
                                     int *pad) {
    int *ids[3] = {bos, eos, pad};
    static const char *const keys[3] = {"bos_token", "eos_token", "pad_token"};
    for (int i = 0; i < 3; i++) *ids[i] = -1;
    if (!moe_tokenizer_has_hf(dir)) return MOE_OK;
    char p[TOK_PATH];
    cJSON *tok = NULL, *cfg[2] = {NULL, NULL};
    static const char *const cfg_files[2] = {"tokenizer_config.json", "special_tokens_map.json"};
    join(p, sizeof p, dir, "tokenizer.json");
    moe_status st = moe_file_read_json_object(p, (size_t)1 << 30, &tok);
    for (int f = 0; f < 2 && !st; f++) {
        join(p, sizeof p, dir, cfg_files[f]);
        if (readable_file(p)) st = moe_file_read_json_object(p, (size_t)1 << 30, &cfg[f]);
    }
    join(p, sizeof p, dir, "tokenizer.json");
    const int64_t limit = vocab_size > 0 ? vocab_size : (int64_t)INT_MAX + 1;
    if (!st) st = check_added_ids(tok, p, limit);
    for (int i = 0; i < 3 && !st; i++) {
        const char *text = token_text(cfg[0], keys[i]);
        if (!text) text = token_text(cfg[1], keys[i]);
        if (text) st = token_id(tok, p, keys[i], text, limit, ids[i]);
    }
    cJSON_Delete(tok), cJSON_Delete(cfg[0]), cJSON_Delete(cfg[1]);
    return st;
}

moe_status moe_tokenizer_write_generation_config(const char *src_dir, const char *tok_dir,
                                                 int vocab_size, const char *out_dir) {
    char src[TOK_PATH], dst[TOK_PATH];
    join(dst, sizeof dst, out_dir, "generation_config.json");
    if (src_dir) {
        join(src, sizeof src, src_dir, "generation_config.json");
        if (readable_file(src)) return copy_file(src, dst);
    }
    int id[3] = {-1, -1, -1};
    moe_status st =
        tok_dir ? moe_tokenizer_special_ids(tok_dir, vocab_size, &id[0], &id[1], &id[2]) : MOE_OK;
    if (st) return st;
    // only what the tokenizer defines: a made-up eos would stop generation at a real token
    char text[512] = "{\n", line[64];
    static const char *const keys[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    for (int i = 0; i < 3; i++)
        if (id[i] >= 0) {
            snprintf(line, sizeof line, "  \"%s\": %d,\n", keys[i], id[i]);
            strcat(text, line);
        }
    strcat(text, "  \"transformers_version\": \"5.24.0\"\n}\n"); // the version it is tested with
    return moe_file_write_synced(dst, text, strlen(text));
}

// ---- the run's tokenizer -------------------------------------------------------------------

// init_from as a folder: itself, or the folder a `latest` file names (relative to it).
static void init_folder(char *dir, size_t n, const char *init_from) {
    struct stat st;
    dir[0] = '\0';
    if (stat(init_from, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, n, "%s", init_from);
        return;
    }
    char *text;
    if (!S_ISREG(st.st_mode) || moe_file_read_all(init_from, 4096, &text, NULL)) return;
    text[strcspn(text, "\r\n")] = '\0';
    const char *slash = strrchr(init_from, '/');
    if (text[0] && !strchr(text, '/'))
        snprintf(dir, n, "%.*s%s", slash ? (int)(slash - init_from + 1) : 0, init_from, text);
    free(text);
}

moe_status moe_tokenizer_for_run(char *dir, size_t n, const char *data_tokenizer,
                                 const char *init_from, int *from_init) {
    dir[0] = '\0';
    if (from_init) *from_init = 0;
    if (data_tokenizer && data_tokenizer[0]) {
        if (!moe_tokenizer_has_hf(data_tokenizer))
            return moe_error(MOE_EINVAL,
                             "data.tokenizer = \"%s\": no %s/tokenizer.json (a Hugging "
                             "Face tokenizer folder holds one)",
                             data_tokenizer, data_tokenizer);
        if (!moe_tokenizer_is_byte_hf(data_tokenizer)) snprintf(dir, n, "%s", data_tokenizer);
        return MOE_OK;
    }
    if (!init_from || !init_from[0]) return MOE_OK;
    char folder[TOK_PATH];
    init_folder(folder, sizeof folder, init_from);
    if (folder[0] && moe_tokenizer_has_hf(folder) && !moe_tokenizer_is_byte_hf(folder)) {
        snprintf(dir, n, "%s", folder);
        if (from_init) *from_init = 1;
    }
    return MOE_OK;
}

moe_status moe_tokenizer_check_data(const char *token_file, const char *tok, unsigned vocab_size) {
    char folder[TOK_PATH];
    const char *slash = strrchr(token_file, '/');
    snprintf(folder, sizeof folder, "%.*s", slash ? (int)(slash - token_file) : 1,
             slash ? token_file : ".");
    if (slash == token_file) snprintf(folder, sizeof folder, "/");
    const int has = moe_tokenizer_has_hf(folder) && !moe_tokenizer_is_byte_hf(folder);
    if (!tok[0]) {
        if (has)
            return moe_error(MOE_EINVAL,
                             "prepared with the tokenizer of %s/tokenizer.json, but the "
                             "run has the byte tokenizer: set data.tokenizer = \"%s\" (or prepare "
                             "the text again without --tokenizer)",
                             folder, folder);
        return MOE_OK;
    }
    if (has) {
        int same = 0;
        moe_status st = moe_tokenizer_same_hf(folder, tok, &same);
        if (st) return st;
        if (!same)
            return moe_error(MOE_EINVAL,
                             "prepared with another tokenizer: %s/tokenizer.json "
                             "differs from the run's %s/tokenizer.json (delete the token files to "
                             "prepare data.text again, or set data.tokenizer to that tokenizer)",
                             folder, tok);
    } else if (vocab_size == 256 && !moe_tokenizer_has_hf(folder)) {
        return moe_error(MOE_EINVAL,
                         "byte-tokenized token files (vocabulary 256, no tokenizer.json "
                         "beside them), but the run's tokenizer is %s: delete them to prepare "
                         "data.text again with it, or name other token files",
                         tok);
    }
    return MOE_OK;
}
