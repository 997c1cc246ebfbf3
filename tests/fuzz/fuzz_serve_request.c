// serve_parse_completion (infer/serve_request.h) on an arbitrary /v1/completions body, under
// two sets of limits (moe serve's defaults, and tight ones). An accepted request must keep every
// promise of serve_params (ranges, non-empty UTF-8 strings within the limits, include_usage only
// with stream), and written back as a canonical body it must parse to the same parameters. A
// refused one must leave the parameters zeroed, say why (status 400 or 500, type, code,
// message), and serve_error_json must give valid UTF-8 JSON with the four fields.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "infer/serve_request.h"

static const serve_limits tight = {.max_tokens_limit = 3,
                                   .default_max_tokens = 16,
                                   .max_prompts = 2,
                                   .max_prompt_bytes = 8,
                                   .max_stop = 1};

// Strict UTF-8 (RFC 3629), written independently of serve_request.c's.
static int utf8_valid(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        unsigned c = *u, k, cp;
        if (c < 0x80)
            k = 1, cp = c;
        else if ((c & 0xE0) == 0xC0)
            k = 2, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            k = 3, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            k = 4, cp = c & 0x07;
        else
            return 0;
        for (unsigned i = 1; i < k; i++) {
            if ((u[i] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (u[i] & 0x3F);
        }
        static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        u += k;
    }
    return 1;
}

static void check_accepted(const serve_params *p, const serve_limits *lim, const char *which) {
    if (p->n_prompts < 1 || p->n_prompts > lim->max_prompts || !p->prompts)
        fuzz_fail("%s: accepted with %d prompts", which, p->n_prompts);
    for (int i = 0; i < p->n_prompts; i++) {
        const char *s = p->prompts[i];
        if (!s || !s[0] || strlen(s) > lim->max_prompt_bytes || !utf8_valid(s))
            fuzz_fail("%s: prompt %d is NULL, empty, too long or not UTF-8", which, i);
    }
    if (p->max_tokens < 1 || p->max_tokens > lim->max_tokens_limit) // (limits >= 1 here)
        fuzz_fail("%s: max_tokens %d", which, p->max_tokens);
    if (!(p->temperature >= 0 && p->temperature <= 2))
        fuzz_fail("%s: temperature %g", which, p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1)) fuzz_fail("%s: top_p %g", which, p->top_p);
    if (p->top_k < 0) fuzz_fail("%s: top_k %d", which, p->top_k);
    if ((p->has_seed != 0 && p->has_seed != 1) || (!p->has_seed && p->seed))
        fuzz_fail("%s: has_seed %d seed %llu", which, p->has_seed, p->seed);
    if (p->n_stop < 0 || p->n_stop > lim->max_stop || (p->n_stop && !p->stop))
        fuzz_fail("%s: %d stop strings", which, p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0] || !utf8_valid(p->stop[i]))
            fuzz_fail("%s: stop string %d is NULL, empty or not UTF-8", which, i);
    if ((p->stream != 0 && p->stream != 1) || (p->include_usage != 0 && p->include_usage != 1) ||
        (p->include_usage && !p->stream))
        fuzz_fail("%s: stream %d include_usage %d", which, p->stream, p->include_usage);
    if (!memchr(p->model, 0, sizeof p->model) || !utf8_valid(p->model))
        fuzz_fail("%s: model not terminated or not UTF-8", which);
}

static cJSON *string_list(char **s, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(s[i]));
    return a;
}

// p as the body a client would send for it (malloc'd). The doubles are written with 17
// significant digits: cJSON's printer keeps 15 when they read back within an epsilon, which
// is not the same double (0.30000000000000004 would come back as 0.3).
static char *canonical_body(const serve_params *p) {
    cJSON *j = cJSON_CreateObject();
    char seed[32], temperature[32], top_p[32];
    snprintf(seed, sizeof seed, "%llu", p->seed);
    snprintf(temperature, sizeof temperature, "%.17g", p->temperature);
    snprintf(top_p, sizeof top_p, "%.17g", p->top_p);
    cJSON_AddItemToObject(j, "prompt", string_list(p->prompts, p->n_prompts));
    cJSON_AddNumberToObject(j, "max_tokens", p->max_tokens);
    cJSON_AddRawToObject(j, "temperature", temperature);
    cJSON_AddRawToObject(j, "top_p", top_p);
    cJSON_AddNumberToObject(j, "top_k", p->top_k);
    if (p->has_seed) cJSON_AddRawToObject(j, "seed", seed);
    if (p->n_stop) cJSON_AddItemToObject(j, "stop", string_list(p->stop, p->n_stop));
    cJSON_AddBoolToObject(j, "stream", p->stream);
    if (p->stream)
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(j, "stream_options"), "include_usage",
                              p->include_usage);
    cJSON_AddStringToObject(j, "model", p->model);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) fuzz_fail("out of memory writing the canonical body");
    return s;
}

static void check_round_trip(const serve_params *p, const serve_limits *lim, const char *which) {
    char *body = canonical_body(p);
    serve_params q;
    serve_error err;
    if (serve_parse_completion(body, strlen(body), lim, &q, &err))
        fuzz_fail("%s: accepted, but its canonical body is refused (%s): %s\n%s", which, err.code,
                  err.message, body);
    int same = q.n_prompts == p->n_prompts && q.max_tokens == p->max_tokens &&
               q.temperature == p->temperature && q.top_p == p->top_p && q.top_k == p->top_k &&
               q.has_seed == p->has_seed && q.seed == p->seed && q.n_stop == p->n_stop &&
               q.stream == p->stream && q.include_usage == p->include_usage &&
               strcmp(q.model, p->model) == 0;
    for (int i = 0; same && i < p->n_prompts; i++) same = !strcmp(q.prompts[i], p->prompts[i]);
    for (int i = 0; same && i < p->n_stop; i++) same = !strcmp(q.stop[i], p->stop[i]);
    if (!same) fuzz_fail("%s: the canonical body parses to other parameters:\n%s", which, body);
    serve_params_free(&q);
    free(body);
}

static void check_refused(const serve_params *p, const serve_error *err, const char *which) {
    const serve_params zero = {0};
    if (memcmp(p, &zero, sizeof *p))
        fuzz_fail("%s: refused, but the parameters are not zeroed", which);
    if (err->status != 400 && err->status != 500) fuzz_fail("%s: status %d", which, err->status);
    if (!memchr(err->message, 0, sizeof err->message) || !err->message[0] ||
        !memchr(err->type, 0, sizeof err->type) || !err->type[0] ||
        !memchr(err->param, 0, sizeof err->param) || !memchr(err->code, 0, sizeof err->code) ||
        (err->status == 400 && !err->code[0]))
        fuzz_fail("%s: an error field empty or unterminated", which);
    char *s = serve_error_json(err);
    if (!s) fuzz_fail("%s: serve_error_json gave NULL", which);
    cJSON *j = cJSON_Parse(s);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message"),
                *t = cJSON_GetObjectItemCaseSensitive(e, "type"),
                *pa = cJSON_GetObjectItemCaseSensitive(e, "param"),
                *c = cJSON_GetObjectItemCaseSensitive(e, "code");
    const int ok =
        utf8_valid(s) && cJSON_IsString(m) && cJSON_IsString(t) &&
        (err->param[0] ? cJSON_IsString(pa) && !strcmp(pa->valuestring, err->param)
                       : cJSON_IsNull(pa)) &&
        (err->code[0] ? cJSON_IsString(c) && !strcmp(c->valuestring, err->code) : cJSON_IsNull(c));
    if (!ok) fuzz_fail("%s: bad error body: %s", which, s);
    cJSON_Delete(j);
    free(s);
}

static void run(const uint8_t *data, size_t size, const serve_limits *lim, const char *which) {
    serve_params p;
    serve_error err;
    memset(&p, 0x5A, sizeof p); // the parser must not read what the caller had
    const int rc = serve_parse_completion((const char *)data, size, lim, &p, &err);
    if (rc == 0) {
        check_accepted(&p, lim, which);
        check_round_trip(&p, lim, which);
        serve_params_free(&p);
    } else if (rc == -1) {
        check_refused(&p, &err, which);
    } else {
        fuzz_fail("%s: serve_parse_completion returned %d", which, rc);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const serve_limits def = SERVE_LIMITS_DEFAULT;
    run(data, size, &def, "default limits");
    run(data, size, &tight, "tight limits");
    return 0;
}
