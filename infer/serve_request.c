// A /v1/completions body -> serve_params (serve_request.h).
#include "infer/serve_request.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/json_check.h"

// ---- errors ------------------------------------------------------------------------------

__attribute__((format(printf, 5, 6))) static int
fail(serve_error *err, int status, const char *param, const char *code, const char *fmt, ...) {
    memset(err, 0, sizeof *err);
    err->status = status;
    snprintf(err->type, sizeof err->type, "%s",
             status >= 500 ? "server_error" : "invalid_request_error");
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    snprintf(err->code, sizeof err->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int oom(serve_error *err) { return fail(err, 500, NULL, NULL, "out of memory"); }

// The JSON type of v as a message says it ("a decimal number" for a number with a fraction).
static const char *json_type(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsNumber(v))
        return isfinite(v->valuedouble) && v->valuedouble != floor(v->valuedouble)
                   ? "a decimal number"
                   : "a number";
    return "an unknown value";
}

static int bad_type(serve_error *err, const char *param, const char *expected, const cJSON *v) {
    return fail(err, 400, param, "invalid_type",
                "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                json_type(v));
}

// ---- UTF-8 -------------------------------------------------------------------------------

// The length of the well-formed UTF-8 sequence at s[0..n) (RFC 3629: no overlongs, no
// surrogates, at most U+10FFFF), or 0 when it is not one.
static size_t utf8_seq(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < k || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return k;
}

// The offset of the first byte that is not UTF-8 in s[0..n), or n.
static size_t utf8_invalid_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        const size_t k = utf8_seq(u + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

// ---- the raw text of the top-level members -------------------------------------------------
// cJSON keeps numbers as doubles, which cannot hold every 64-bit seed, and turns "\u0000" into
// a NUL that silently ends a C string. Both need the member's text: these walk a body cJSON has
// already accepted (so they only skip, never judge), in the order cJSON lists the members.

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (unsigned char)s[i] <= 32) i++; // cJSON's whitespace
    return i;
}

static size_t skip_string(const char *s, size_t i, size_t n) { // s[i] == '"'
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

static size_t skip_value(const char *s, size_t i, size_t n) {
    if (i >= n) return n;
    if (s[i] == '"') return skip_string(s, i, n);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = skip_string(s, i, n);
                continue;
            }
            if (s[i] == '{' || s[i] == '[')
                depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && (unsigned char)s[i] > 32) i++;
    return i;
}

// [*b, *e) = the text of the value of the index-th member of the top-level object; 0 or -1.
static int member_span(const char *s, size_t n, int index, size_t *b, size_t *e) {
    size_t i = 0;
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) i = 3; // cJSON skips a BOM
    i = skip_ws(s, i, n);
    if (i >= n || s[i] != '{') return -1;
    for (int k = 0;; k++) {
        i = skip_ws(s, i + 1, n); // past '{' or ','
        if (i >= n || s[i] != '"') return -1;
        i = skip_ws(s, skip_string(s, i, n), n);
        if (i >= n || s[i] != ':') return -1;
        i = skip_ws(s, i + 1, n);
        const size_t vb = i;
        i = skip_value(s, i, n);
        if (k == index) {
            *b = vb, *e = i;
            return 0;
        }
        i = skip_ws(s, i, n);
        if (i >= n || s[i] != ',') return -1;
    }
}

// The offset of the first "\u" escape of s[0..n) that is not followed by 4 hex digits, or n.
// cJSON decodes one (such as "\uqpt9") as U+0000, which would cut the string short; JSON does
// not allow it. s is JSON that cJSON accepted, so '"' outside an escape starts or ends a string.
static size_t bad_u_escape_at(const char *s, size_t n) {
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"')
            in_string = !in_string;
        else if (in_string && s[i] == '\\') {
            if (i + 1 < n && s[i + 1] == 'u') {
                for (size_t j = i + 2; j < i + 6; j++)
                    if (j >= n || !isxdigit((unsigned char)s[j])) return i;
            }
            i++;
        }
    }
    return n;
}

// Whether the string text s[b..e) (quotes included) has the escape "\u0000".
static int has_nul_escape(const char *s, size_t b, size_t e) {
    for (size_t i = b; i < e; i++)
        if (s[i] == '\\') {
            if (i + 5 < e && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0) return 1;
            i++;
        }
    return 0;
}

// ---- the fields --------------------------------------------------------------------------

typedef struct {
    const char *text; // the body, NUL-terminated
    size_t len;
    const cJSON *root;
} request;

// The member's value, NULL when absent or null.
static const cJSON *member(const request *r, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
    return cJSON_IsNull(v) ? NULL : v;
}

// 1 when the string value of top-level member key carries "\u0000" (the cJSON string is cut).
static int member_has_nul(const request *r, const char *key) {
    int index = 0;
    for (const cJSON *c = r->root->child; c; c = c->next, index++)
        if (c->string && strcmp(c->string, key) == 0) {
            size_t b, e;
            return member_span(r->text, r->len, index, &b, &e) == 0 &&
                   has_nul_escape(r->text, b, e);
        }
    return 0;
}

// An integer in [lo, hi]: 1 read into *out, 0 absent/null, -1 refused.
static int get_int(const request *r, const char *key, long long lo, long long hi, long long *out,
                   serve_error *err) {
    const cJSON *v = member(r, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || (isfinite(v->valuedouble) && v->valuedouble != floor(v->valuedouble)))
        return bad_type(err, key, "an integer", v);
    const double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi)) // (+-inf too); lo and hi are int-sized
        return fail(err, 400, key, "invalid_value",
                    "Invalid '%s': %.15g. Expected an integer in [%lld, %lld].", key, d, lo, hi);
    *out = (long long)d;
    return 1;
}

// A number: 1 read into *out, 0 absent/null, -1 refused (wrong type, or not finite: "Expected
// <allowed>.").
static int get_number(const request *r, const char *key, double *out, const char *allowed,
                      serve_error *err) {
    const cJSON *v = member(r, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_type(err, key, "a number", v);
    if (!isfinite(v->valuedouble))
        return fail(err, 400, key, "invalid_value",
                    "Invalid '%s': the number is out of range. Expected %s.", key, allowed);
    *out = v->valuedouble;
    return 1;
}

static char *dup_string(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int parse_prompt(const request *r, const serve_limits *lim, serve_params *p,
                        serve_error *err) {
    const cJSON *v = member(r, "prompt");
    if (!v)
        return fail(err, 400, "prompt", "missing_required_parameter",
                    "You must provide a 'prompt' parameter: a string or a list of strings.");
    if (member_has_nul(r, "prompt"))
        return fail(err, 400, "prompt", "invalid_value",
                    "Invalid 'prompt': NUL characters (\\u0000) are not supported.");
    const int is_list = cJSON_IsArray(v);
    if (!is_list && !cJSON_IsString(v))
        return bad_type(err, "prompt", "a string or a list of strings", v);
    const int n = is_list ? cJSON_GetArraySize(v) : 1;
    if (n < 1)
        return fail(err, 400, "prompt", "invalid_value",
                    "Invalid 'prompt': an empty list. Expected a string or a non-empty list of "
                    "strings.");
    if (n > lim->max_prompts)
        return fail(err, 400, "prompt", "invalid_value",
                    "Invalid 'prompt': a list of %d prompts. Expected at most %d.", n,
                    lim->max_prompts);
    if (!(p->prompts = calloc((size_t)n, sizeof *p->prompts))) return oom(err);
    const cJSON *e = is_list ? v->child : v;
    for (int i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsString(e)) {
            if (cJSON_IsNumber(e) || cJSON_IsArray(e))
                return fail(err, 400, "prompt", "unsupported_value",
                            "Invalid 'prompt': token-id prompts are not supported: send text.");
            return fail(err, 400, "prompt", "invalid_type",
                        "Invalid type for 'prompt[%d]': expected a string, but got %s instead.", i,
                        json_type(e));
        }
        char name[32] = "prompt";
        if (is_list) snprintf(name, sizeof name, "prompt[%d]", i);
        const size_t bytes = strlen(e->valuestring);
        if (bytes == 0)
            return fail(err, 400, "prompt", "invalid_value",
                        "Invalid '%s': an empty string. Expected a non-empty string.", name);
        if (bytes > lim->max_prompt_bytes)
            return fail(err, 400, "prompt", "invalid_value",
                        "Invalid '%s': %zu bytes. Expected at most %zu bytes.", name, bytes,
                        lim->max_prompt_bytes);
        if (!(p->prompts[i] = dup_string(e->valuestring))) return oom(err);
        p->n_prompts = i + 1;
    }
    return 0;
}

static int parse_stop(const request *r, const serve_limits *lim, serve_params *p,
                      serve_error *err) {
    const cJSON *v = member(r, "stop");
    if (!v) return 0;
    if (member_has_nul(r, "stop"))
        return fail(err, 400, "stop", "invalid_value",
                    "Invalid 'stop': NUL characters (\\u0000) are not supported.");
    const int is_list = cJSON_IsArray(v);
    if (!is_list && !cJSON_IsString(v))
        return bad_type(err, "stop", "a string or a list of strings", v);
    const int n = is_list ? cJSON_GetArraySize(v) : 1;
    if (n > lim->max_stop)
        return fail(err, 400, "stop", "invalid_value",
                    "Invalid 'stop': %d stop strings. Expected at most %d.", n, lim->max_stop);
    if (n == 0) return 0;
    if (!(p->stop = calloc((size_t)n, sizeof *p->stop))) return oom(err);
    const cJSON *e = is_list ? v->child : v;
    for (int i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsString(e))
            return fail(err, 400, "stop", "invalid_type",
                        "Invalid type for 'stop[%d]': expected a string, but got %s instead.", i,
                        json_type(e));
        if (!e->valuestring[0])
            return fail(err, 400, "stop", "invalid_value",
                        "Invalid 'stop': an empty string. Expected non-empty stop strings.");
        if (!(p->stop[i] = dup_string(e->valuestring))) return oom(err);
        p->n_stop = i + 1;
    }
    return 0;
}

// The seed: any 64-bit value. Plain digits are read from the text (a double cannot hold them
// all); other spellings of an integer (1e3, 7.0) through cJSON's double, exact up to 2^53.
static int parse_seed(const request *r, serve_params *p, serve_error *err) {
    const cJSON *v = member(r, "seed");
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || (isfinite(v->valuedouble) && v->valuedouble != floor(v->valuedouble)))
        return bad_type(err, "seed", "an integer", v);
    const double d = v->valuedouble;
    if (d < 0 || isnan(d))
        return fail(err, 400, "seed", "invalid_value",
                    "Invalid 'seed': %.15g. Expected an integer in [0, 18446744073709551615].", d);
    int index = 0;
    for (const cJSON *c = r->root->child; c != v; c = c->next) index++;
    size_t b, e;
    if (member_span(r->text, r->len, index, &b, &e) != 0) // (cannot happen on cJSON's JSON)
        return fail(err, 400, "seed", "invalid_value", "Invalid 'seed': unreadable number.");
    size_t i = b;
    if (i < e && r->text[i] == '-') i++; // -0
    int digits = i < e;
    for (size_t j = i; j < e; j++) digits &= r->text[j] >= '0' && r->text[j] <= '9';
    if (digits && r->text[b] != '-') {
        while (b + 1 < e && r->text[b] == '0') b++; // (cJSON allows leading zeros)
        char buf[32];
        const size_t k = e - b < sizeof buf - 1 ? e - b : sizeof buf - 1;
        memcpy(buf, r->text + b, k);
        buf[k] = 0;
        errno = 0;
        const unsigned long long s = strtoull(buf, NULL, 10);
        if (k < e - b)
            return fail(err, 400, "seed", "invalid_value",
                        "Invalid 'seed': a number of %zu digits. Expected an integer in [0, "
                        "18446744073709551615].",
                        e - b);
        if (errno == ERANGE)
            return fail(err, 400, "seed", "invalid_value",
                        "Invalid 'seed': %s. Expected an integer in [0, 18446744073709551615].",
                        buf);
        p->seed = s;
    } else if (d == 0) {
        p->seed = 0;
    } else if (d <= 9007199254740992.0) { // 2^53
        p->seed = (unsigned long long)d;
    } else if (d >= 18446744073709551616.0) { // 2^64 (and inf)
        return fail(err, 400, "seed", "invalid_value",
                    "Invalid 'seed': %.15g. Expected an integer in [0, 18446744073709551615].", d);
    } else {
        return fail(err, 400, "seed", "invalid_value",
                    "Invalid 'seed': %.15g. Expected an integer in [0, 18446744073709551615], "
                    "written as plain digits above 2^53.",
                    d);
    }
    p->has_seed = 1;
    return 0;
}

static int parse_stream(const request *r, serve_params *p, serve_error *err) {
    const cJSON *v = member(r, "stream");
    if (v) {
        if (!cJSON_IsBool(v)) return bad_type(err, "stream", "a boolean", v);
        p->stream = cJSON_IsTrue(v);
    }
    const cJSON *o = member(r, "stream_options");
    if (!o) return 0;
    if (!cJSON_IsObject(o)) return bad_type(err, "stream_options", "an object", o);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "include_usage");
    if (u && !cJSON_IsNull(u) && !cJSON_IsBool(u))
        return bad_type(err, "stream_options.include_usage", "a boolean", u);
    if (!p->stream)
        return fail(err, 400, "stream_options", "invalid_value",
                    "Invalid 'stream_options': only allowed when 'stream' is true.");
    p->include_usage = cJSON_IsTrue(u);
    return 0;
}

// "n" and "best_of": absent, null or 1.
static int parse_one(const request *r, const char *key, serve_error *err) {
    const cJSON *v = member(r, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_type(err, key, "an integer", v);
    if (v->valuedouble != 1)
        return fail(err, 400, key, "unsupported_value",
                    "Unsupported value for '%s': %.15g. %s must be 1 (one completion per prompt).",
                    key, v->valuedouble, key);
    return 0;
}

// What moe serve does not implement, accepted at its no-op value only.
static int parse_unsupported(const request *r, serve_error *err) {
    const cJSON *v;
    if ((v = member(r, "echo"))) {
        if (!cJSON_IsBool(v)) return bad_type(err, "echo", "a boolean", v);
        if (cJSON_IsTrue(v))
            return fail(err, 400, "echo", "unsupported_value",
                        "Unsupported value for 'echo': true. Only false is supported.");
    }
    if ((v = member(r, "logprobs"))) {
        if (!cJSON_IsNumber(v)) return bad_type(err, "logprobs", "an integer", v);
        return fail(err, 400, "logprobs", "unsupported_value",
                    "Unsupported parameter 'logprobs': only null is supported.");
    }
    if ((v = member(r, "suffix"))) {
        if (!cJSON_IsString(v)) return bad_type(err, "suffix", "a string", v);
        return fail(err, 400, "suffix", "unsupported_value",
                    "Unsupported parameter 'suffix': only null is supported.");
    }
    static const char *const penalties[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        double x = 0;
        if (get_number(r, penalties[i], &x, "0", err) < 0) return -1;
        if (x != 0)
            return fail(err, 400, penalties[i], "unsupported_value",
                        "Unsupported value for '%s': %.15g. Only 0 is supported.", penalties[i], x);
    }
    if ((v = member(r, "logit_bias"))) {
        if (!cJSON_IsObject(v)) return bad_type(err, "logit_bias", "an object", v);
        if (v->child)
            return fail(err, 400, "logit_bias", "unsupported_value",
                        "Unsupported parameter 'logit_bias': only null or {} is supported.");
    }
    if ((v = member(r, "user")) && !cJSON_IsString(v)) return bad_type(err, "user", "a string", v);
    return 0;
}

static int parse_fields(const request *r, const serve_limits *lim, serve_params *p,
                        serve_error *err) {
    const cJSON *v = member(r, "model");
    if (v) {
        if (!cJSON_IsString(v)) return bad_type(err, "model", "a string", v);
        if (member_has_nul(r, "model"))
            return fail(err, 400, "model", "invalid_value",
                        "Invalid 'model': NUL characters (\\u0000) are not supported.");
        const size_t n = strlen(v->valuestring);
        if (n >= sizeof p->model)
            return fail(err, 400, "model", "invalid_value",
                        "Invalid 'model': %zu bytes. Expected at most %zu.", n,
                        sizeof p->model - 1);
        memcpy(p->model, v->valuestring, n + 1);
    }
    if (parse_prompt(r, lim, p, err)) return -1;

    long long x = 0;
    int def = lim->default_max_tokens;
    if (def > lim->max_tokens_limit) def = lim->max_tokens_limit;
    p->max_tokens = def >= 1 ? def : 1;
    const int rc = get_int(r, "max_tokens", 1, lim->max_tokens_limit, &x, err);
    if (rc < 0) return -1;
    if (rc) p->max_tokens = (int)x;

    p->temperature = 1, p->top_p = 1;
    if (get_number(r, "temperature", &p->temperature, "a number in [0, 2]", err) < 0) return -1;
    if (!(p->temperature >= 0 && p->temperature <= 2))
        return fail(err, 400, "temperature", "invalid_value",
                    "Invalid 'temperature': %.15g. Expected a number in [0, 2].", p->temperature);
    if (get_number(r, "top_p", &p->top_p, "a number in (0, 1]", err) < 0) return -1;
    if (!(p->top_p > 0 && p->top_p <= 1))
        return fail(err, 400, "top_p", "invalid_value",
                    "Invalid 'top_p': %.15g. Expected a number in (0, 1].", p->top_p);
    const int has_k = get_int(r, "top_k", 0, INT_MAX, &x, err);
    if (has_k < 0) return -1;
    p->top_k = has_k ? (int)x : 0;

    if (parse_seed(r, p, err)) return -1;
    if (parse_stop(r, lim, p, err)) return -1;
    if (parse_stream(r, p, err)) return -1;
    if (parse_one(r, "n", err) || parse_one(r, "best_of", err)) return -1;
    return parse_unsupported(r, err);
}

int serve_parse_completion(const char *body, size_t len, const serve_limits *lim, serve_params *p,
                           serve_error *err) {
    const serve_limits def = SERVE_LIMITS_DEFAULT;
    if (!lim) lim = &def;
    memset(p, 0, sizeof *p);
    if (!body) len = 0;
    const char *nul = len ? memchr(body, 0, len) : NULL;
    if (nul)
        return fail(err, 400, NULL, "invalid_json",
                    "We could not parse the JSON body of your request: a NUL byte at byte %zu.",
                    (size_t)(nul - body));
    const size_t bad = utf8_invalid_at(body, len);
    if (bad < len)
        return fail(err, 400, NULL, "invalid_json",
                    "We could not parse the JSON body of your request: it is not UTF-8 at byte "
                    "%zu.",
                    bad);
    char *text = malloc(len + 1); // cJSON reads a NUL-terminated copy
    if (!text) return oom(err);
    if (len) memcpy(text, body, len);
    text[len] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        const size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at; i++) {
            if (text[i] == '\n')
                line++, col = 1;
            else
                col++;
        }
        free(text);
        if (len == 0 || skip_ws(body, 0, len) == len)
            return fail(err, 400, NULL, "invalid_json",
                        "We could not parse the JSON body of your request: the body is empty. "
                        "Expected a JSON object.");
        return fail(err, 400, NULL, "invalid_json",
                    "We could not parse the JSON body of your request: invalid JSON at byte %zu "
                    "(line %zu, column %zu).",
                    at, line, col);
    }
    int rc = 0;
    const size_t bad_u = bad_u_escape_at(text, len);
    if (bad_u < len) {
        rc = fail(err, 400, NULL, "invalid_json",
                  "We could not parse the JSON body of your request: an invalid \\u escape at "
                  "byte %zu (expected 4 hex digits).",
                  bad_u);
    } else if (!cJSON_IsObject(root)) {
        rc = fail(err, 400, NULL, "invalid_json",
                  "The body of the request must be a JSON object, but got %s.", json_type(root));
    } else {
        const moe_status st = moe_json_refuse_duplicates(root, "request");
        if (st == MOE_ENOMEM)
            rc = oom(err);
        else if (st != MOE_OK)
            rc = fail(err, 400, NULL, "invalid_json",
                      "We could not parse the JSON body of your request: %s.", moe_last_error());
        else {
            const request r = {.text = text, .len = len, .root = root};
            rc = parse_fields(&r, lim, p, err);
        }
    }
    cJSON_Delete(root);
    free(text);
    if (rc) serve_params_free(p);
    return rc;
}

void serve_params_free(serve_params *p) {
    if (!p) return;
    if (p->prompts)
        for (int i = 0; i < p->n_prompts; i++) free(p->prompts[i]);
    free(p->prompts);
    if (p->stop)
        for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    memset(p, 0, sizeof *p);
}

// s (at most n bytes, up to its NUL) with every byte that is not UTF-8 replaced by '?'.
static void utf8_clean(char *out, const char *s, size_t n) {
    size_t len = 0;
    while (len < n && s[len]) len++;
    size_t i = 0;
    while (i < len) {
        const size_t k = utf8_seq((const unsigned char *)s + i, len - i);
        if (k) {
            memcpy(out + i, s + i, k);
            i += k;
        } else
            out[i++] = '?';
    }
    out[len] = 0;
}

char *serve_error_json(const serve_error *err) {
    char message[sizeof err->message + 1], type[sizeof err->type + 1], param[sizeof err->param + 1],
        code[sizeof err->code + 1];
    utf8_clean(message, err->message, sizeof err->message);
    utf8_clean(type, err->type, sizeof err->type);
    utf8_clean(param, err->param, sizeof err->param);
    utf8_clean(code, err->code, sizeof err->code);
    cJSON *root = cJSON_CreateObject();
    cJSON *e = root ? cJSON_AddObjectToObject(root, "error") : NULL;
    char *s = NULL;
    if (e && cJSON_AddStringToObject(e, "message", message) &&
        cJSON_AddStringToObject(e, "type", type[0] ? type : "invalid_request_error") &&
        (param[0] ? cJSON_AddStringToObject(e, "param", param)
                  : cJSON_AddNullToObject(e, "param")) &&
        (code[0] ? cJSON_AddStringToObject(e, "code", code) : cJSON_AddNullToObject(e, "code")))
        s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
