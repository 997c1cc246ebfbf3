// moe serve's request parser (infer/serve_request.h) on a table of /v1/completions bodies:
// the refusals with their (status, param, code), the accepted requests (as the openai Python
// client sends them, and the edges of every range) with the parameters they give, and
// serve_error_json's body for every refusal (valid JSON, the four fields, param and code null
// when empty, UTF-8 even when a message is cut inside a character).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/serve_request.h"
#include "test_util.h"

// The limits of every case unless it says otherwise.
static const serve_limits LIM = {.max_tokens_limit = 100,
                                 .default_max_tokens = 16,
                                 .max_prompts = 3,
                                 .max_prompt_bytes = 16,
                                 .max_stop = 4};

typedef struct {
    const char *body;
    const char *param; // "" none
    const char *code;
    size_t len; // 0: strlen(body)
} bad_case;

#define P "{\"prompt\":\"x\","
static const bad_case bad[] = {
    // the body
    {"", "", "invalid_json", 0},
    {"  \n", "", "invalid_json", 0},
    {"{", "", "invalid_json", 0},
    {"{\"prompt\":\"x\",}", "", "invalid_json", 0},
    {"{\"prompt\":\"x\"} x", "", "invalid_json", 0},
    {"{\"prompt\":\"x\"}{}", "", "invalid_json", 0},
    {"[{\"prompt\":\"x\"}]", "", "invalid_json", 0},
    {"\"x\"", "", "invalid_json", 0},
    {"null", "", "invalid_json", 0},
    {"42", "", "invalid_json", 0},
    {"{\"prompt\":\"x\"}\0", "", "invalid_json", 15},
    {"{\"prompt\":\"a\0b\"}", "", "invalid_json", 16},
    {"{\"prompt\":\"\xff\"}", "", "invalid_json", 0},
    {"{\"prompt\":\"\xc0\xaf\"}", "", "invalid_json", 0},     // overlong '/'
    {"{\"prompt\":\"\xed\xa0\x80\"}", "", "invalid_json", 0}, // a surrogate in UTF-8
    {"{\"prompt\":\"caf\xc3\"}", "", "invalid_json", 0},      // cut sequence
    {"{\"prompt\":\"\\ud800\"}", "", "invalid_json", 0},      // lone surrogate escape
    {"{\"prompt\":\"h\\uqpt9ll\"}", "", "invalid_json", 0},   // cJSON alone would give "h"
    {"{\"prompt\":\"x\",\"user\":\"\\u00zz\"}", "", "invalid_json", 0},
    {"{\"prompt\":\"a\",\"prompt\":\"b\"}", "", "invalid_json", 0}, // duplicate key
    {P "\"stream\":true,\"stream_options\":{\"include_usage\":true,\"include_usage\":false}}", "",
     "invalid_json", 0},
    // prompt
    {"{}", "prompt", "missing_required_parameter", 0},
    {"{\"model\":\"m\",\"max_tokens\":5}", "prompt", "missing_required_parameter", 0},
    {"{\"prompt\":null}", "prompt", "missing_required_parameter", 0},
    {"{\"Prompt\":\"x\"}", "prompt", "missing_required_parameter", 0},
    {"{\"prompt\":\"\"}", "prompt", "invalid_value", 0},
    {"{\"prompt\":[]}", "prompt", "invalid_value", 0},
    {"{\"prompt\":[\"a\",\"\"]}", "prompt", "invalid_value", 0},
    {"{\"prompt\":[\"a\",\"b\",\"c\",\"d\"]}", "prompt", "invalid_value", 0}, // > max_prompts
    {"{\"prompt\":\"12345678901234567\"}", "prompt", "invalid_value", 0},     // > max_prompt_bytes
    {"{\"prompt\":[\"a\",\"12345678901234567\"]}", "prompt", "invalid_value", 0},
    {"{\"prompt\":\"a\\u0000b\"}", "prompt", "invalid_value", 0},
    {"{\"prompt\":[\"a\",\"\\u0000\"]}", "prompt", "invalid_value", 0},
    {"{\"prompt\":[1,2,3]}", "prompt", "unsupported_value", 0},
    {"{\"prompt\":[[1,2],[3]]}", "prompt", "unsupported_value", 0},
    {"{\"prompt\":5}", "prompt", "invalid_type", 0},
    {"{\"prompt\":true}", "prompt", "invalid_type", 0},
    {"{\"prompt\":{\"text\":\"x\"}}", "prompt", "invalid_type", 0},
    {"{\"prompt\":[\"a\",null]}", "prompt", "invalid_type", 0},
    {"{\"prompt\":[\"a\",{}]}", "prompt", "invalid_type", 0},
    // max_tokens
    {P "\"max_tokens\":0}", "max_tokens", "invalid_value", 0},
    {P "\"max_tokens\":-1}", "max_tokens", "invalid_value", 0},
    {P "\"max_tokens\":101}", "max_tokens", "invalid_value", 0},
    {P "\"max_tokens\":1e10}", "max_tokens", "invalid_value", 0},
    {P "\"max_tokens\":1e400}", "max_tokens", "invalid_value", 0},
    {P "\"max_tokens\":-1e400}", "max_tokens", "invalid_value", 0},
    {P "\"max_tokens\":1.5}", "max_tokens", "invalid_type", 0},
    {P "\"max_tokens\":\"5\"}", "max_tokens", "invalid_type", 0},
    {P "\"max_tokens\":true}", "max_tokens", "invalid_type", 0},
    {P "\"max_tokens\":[5]}", "max_tokens", "invalid_type", 0},
    // temperature, top_p, top_k
    {P "\"temperature\":-0.1}", "temperature", "invalid_value", 0},
    {P "\"temperature\":2.01}", "temperature", "invalid_value", 0},
    {P "\"temperature\":1e400}", "temperature", "invalid_value", 0},
    {P "\"temperature\":-1e400}", "temperature", "invalid_value", 0},
    {P "\"temperature\":\"1\"}", "temperature", "invalid_type", 0},
    {P "\"top_p\":0}", "top_p", "invalid_value", 0},
    {P "\"top_p\":1.5}", "top_p", "invalid_value", 0},
    {P "\"top_p\":-1}", "top_p", "invalid_value", 0},
    {P "\"top_p\":\"0.5\"}", "top_p", "invalid_type", 0},
    {P "\"top_k\":-1}", "top_k", "invalid_value", 0},
    {P "\"top_k\":1e10}", "top_k", "invalid_value", 0},
    {P "\"top_k\":2.5}", "top_k", "invalid_type", 0},
    {P "\"top_k\":\"3\"}", "top_k", "invalid_type", 0},
    // seed
    {P "\"seed\":-1}", "seed", "invalid_value", 0},
    {P "\"seed\":-1e400}", "seed", "invalid_value", 0},
    {P "\"seed\":18446744073709551616}", "seed", "invalid_value", 0}, // 2^64
    {P "\"seed\":99999999999999999999999}", "seed", "invalid_value", 0},
    {P "\"seed\":1e20}", "seed", "invalid_value", 0},
    {P "\"seed\":1e400}", "seed", "invalid_value", 0},
    {P "\"seed\":1e19}", "seed", "invalid_value", 0}, // above 2^53: plain digits only
    {P "\"seed\":1.5}", "seed", "invalid_type", 0},
    {P "\"seed\":\"1\"}", "seed", "invalid_type", 0},
    // stop
    {P "\"stop\":\"\"}", "stop", "invalid_value", 0},
    {P "\"stop\":[\"a\",\"\"]}", "stop", "invalid_value", 0},
    {P "\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "invalid_value", 0},
    {P "\"stop\":\"a\\u0000\"}", "stop", "invalid_value", 0},
    {P "\"stop\":5}", "stop", "invalid_type", 0},
    {P "\"stop\":[1]}", "stop", "invalid_type", 0},
    {P "\"stop\":[\"a\",null]}", "stop", "invalid_type", 0},
    {P "\"stop\":{\"a\":1}}", "stop", "invalid_type", 0},
    // stream, stream_options
    {P "\"stream\":\"true\"}", "stream", "invalid_type", 0},
    {P "\"stream\":1}", "stream", "invalid_type", 0},
    {P "\"stream\":false,\"stream_options\":{\"include_usage\":true}}", "stream_options",
     "invalid_value", 0},
    {P "\"stream_options\":{\"include_usage\":true}}", "stream_options", "invalid_value", 0},
    {P "\"stream_options\":{}}", "stream_options", "invalid_value", 0},
    {P "\"stream\":true,\"stream_options\":\"x\"}", "stream_options", "invalid_type", 0},
    {P "\"stream\":true,\"stream_options\":[]}", "stream_options", "invalid_type", 0},
    {P "\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}}",
     "stream_options.include_usage", "invalid_type", 0},
    // what moe serve does not implement
    {P "\"n\":2}", "n", "unsupported_value", 0},
    {P "\"n\":0}", "n", "unsupported_value", 0},
    {P "\"n\":1.5}", "n", "unsupported_value", 0},
    {P "\"n\":\"1\"}", "n", "invalid_type", 0},
    {P "\"best_of\":3}", "best_of", "unsupported_value", 0},
    {P "\"best_of\":[]}", "best_of", "invalid_type", 0},
    {P "\"echo\":true}", "echo", "unsupported_value", 0},
    {P "\"echo\":\"no\"}", "echo", "invalid_type", 0},
    {P "\"logprobs\":0}", "logprobs", "unsupported_value", 0},
    {P "\"logprobs\":5}", "logprobs", "unsupported_value", 0},
    {P "\"logprobs\":true}", "logprobs", "invalid_type", 0},
    {P "\"suffix\":\"s\"}", "suffix", "unsupported_value", 0},
    {P "\"suffix\":5}", "suffix", "invalid_type", 0},
    {P "\"presence_penalty\":0.5}", "presence_penalty", "unsupported_value", 0},
    {P "\"presence_penalty\":\"0\"}", "presence_penalty", "invalid_type", 0},
    {P "\"frequency_penalty\":-1}", "frequency_penalty", "unsupported_value", 0},
    {P "\"frequency_penalty\":1e400}", "frequency_penalty", "invalid_value", 0},
    {P "\"logit_bias\":{\"50256\":-100}}", "logit_bias", "unsupported_value", 0},
    {P "\"logit_bias\":[]}", "logit_bias", "invalid_type", 0},
    // model, user
    {P "\"model\":5}", "model", "invalid_type", 0},
    {P "\"model\":\"a\\u0000b\"}", "model", "invalid_value", 0},
    {P "\"user\":5}", "user", "invalid_type", 0},
};

typedef struct {
    const char *body;
    int n_prompts;
    const char *prompt0, *prompt_last;
    int max_tokens;
    double temperature, top_p;
    int top_k;
    int has_seed;
    unsigned long long seed;
    int n_stop;
    const char *stop0;
    int stream, include_usage;
    const char *model;
} good_case;

// defaults: one prompt "x", max_tokens 16, temperature 1, top_p 1, top_k 0, no seed, no stop
#define D(body) \
    { body, 1, "x", "x", 16, 1, 1, 0, 0, 0, 0, NULL, 0, 0, "" }
static const good_case good[] = {
    // as the openai Python client sends them
    {"{\"model\":\"m\",\"prompt\":\"Hi\",\"max_tokens\":5,\"temperature\":0,\"stream\":true,"
     "\"stream_options\":{\"include_usage\":true}}",
     1, "Hi", "Hi", 5, 0, 1, 0, 0, 0, 0, NULL, 1, 1, "m"},
    {"{\"model\":\"x\",\"prompt\":\"int main\",\"max_tokens\":32,\"temperature\":0}", 1, "int main",
     "int main", 32, 0, 1, 0, 0, 0, 0, NULL, 0, 0, "x"},
    {"{\"model\":\"x\",\"prompt\":\"int main\",\"max_tokens\":32,\"stream\":true}", 1, "int main",
     "int main", 32, 1, 1, 0, 0, 0, 0, NULL, 1, 0, "x"},
    {"{\"model\": \"gpt-3.5-turbo-instruct\", \"prompt\": [\"a\", \"bc\", \"def\"], "
     "\"max_tokens\": "
     "7, \"seed\": 42, \"stop\": [\"\\n\", \"###\"], \"temperature\": 0.7, \"top_p\": 0.9}",
     3, "a", "def", 7, 0.7, 0.9, 0, 1, 42, 2, "\n", 0, 0, "gpt-3.5-turbo-instruct"},
    // defaults, and null as absent everywhere
    D("{\"prompt\":\"x\"}"),
    D("{\"prompt\":\"x\",\"model\":null,\"max_tokens\":null,\"temperature\":null,\"top_p\":null,"
      "\"top_k\":null,\"seed\":null,\"stop\":null,\"stream\":null,\"stream_options\":null,"
      "\"n\":null,\"best_of\":null,\"echo\":null,\"logprobs\":null,\"suffix\":null,\"user\":null,"
      "\"presence_penalty\":null,\"frequency_penalty\":null,\"logit_bias\":null}"),
    // the no-op values of what is not implemented; unknown keys ignored
    D("{\"prompt\":\"x\",\"n\":1,\"best_of\":1,\"echo\":false,\"presence_penalty\":0,"
      "\"frequency_penalty\":0.0,\"logit_bias\":{},\"user\":\"u\",\"stream\":false}"),
    D("{\"prompt\":\"x\",\"foo\":{\"bar\":[1,2,{\"c\":null}]},\"extra_body\":1,"
      "\"metadata\":{\"seed\":\"s\",\"seed \":1},\"Seed\":\"y\"}"),
    // the edges of the ranges
    {P "\"max_tokens\":100,\"temperature\":2,\"top_p\":1e-9,\"top_k\":2147483647}", 1, "x", "x",
     100, 2, 1e-9, 2147483647, 0, 0, 0, NULL, 0, 0, ""},
    {P "\"max_tokens\":1,\"temperature\":0.0,\"top_p\":1.0,\"top_k\":0}", 1, "x", "x", 1, 0, 1, 0,
     0, 0, 0, NULL, 0, 0, ""},
    {P "\"max_tokens\":5.0,\"top_k\":5e1}", 1, "x", "x", 5, 1, 1, 50, 0, 0, 0, NULL, 0, 0, ""},
    {"{\"prompt\":[\"123456789abcdef0\",\"b\",\"c\"]}", 3, "123456789abcdef0", "c", 16, 1, 1, 0, 0,
     0, 0, NULL, 0, 0, ""},
    // seeds: any 64-bit value, exactly
    {P "\"seed\":0}", 1, "x", "x", 16, 1, 1, 0, 1, 0, 0, NULL, 0, 0, ""},
    {P "\"seed\":-0}", 1, "x", "x", 16, 1, 1, 0, 1, 0, 0, NULL, 0, 0, ""},
    {P "\"seed\":18446744073709551615}", 1, "x", "x", 16, 1, 1, 0, 1, 18446744073709551615ull, 0,
     NULL, 0, 0, ""},
    {P "\"seed\":9007199254740993}", 1, "x", "x", 16, 1, 1, 0, 1, 9007199254740993ull, 0, NULL, 0,
     0, ""},
    {P "\"seed\":1e3}", 1, "x", "x", 16, 1, 1, 0, 1, 1000, 0, NULL, 0, 0, ""},
    {P "\"seed\":7.0}", 1, "x", "x", 16, 1, 1, 0, 1, 7, 0, NULL, 0, 0, ""},
    {P "\"seed\":000000000000000000000000000000000000000000000018446744073709551615}", 1, "x", "x",
     16, 1, 1, 0, 1, 18446744073709551615ull, 0, NULL, 0, 0, ""},
    // an escaped backslash before "uqpt9" is text, not a \u escape
    {"{\"prompt\":\"\\u00E9\\\\uqpt9\"}", 1, "\xc3\xa9\\uqpt9", "\xc3\xa9\\uqpt9", 16, 1, 1, 0, 0,
     0, 0, NULL, 0, 0, ""},
    // the seed's text found behind strings that hold the body's punctuation, and a BOM
    {"{\"prompt\":\"a\\\"}{,\",\"stop\":[\"]\",\",\\\\\"],\"x\":{\"y\":\"}\",\"z\":[[{}]]},"
     "\"seed\":12345678901234567890}",
     1, "a\"}{,", "a\"}{,", 16, 1, 1, 0, 1, 12345678901234567890ull, 2, "]", 0, 0, ""},
    {"\xEF\xBB\xBF {\"prompt\" : \"x\" ,\n\t\"seed\" :\r\n 77 }\n", 1, "x", "x", 16, 1, 1, 0, 1, 77,
     0, NULL, 0, 0, ""},
    // stop: a string, a list, an empty list
    {P "\"stop\":\"\\n\"}", 1, "x", "x", 16, 1, 1, 0, 0, 0, 1, "\n", 0, 0, ""},
    {P "\"stop\":[\"a\",\"b\",\"c\",\"d\"]}", 1, "x", "x", 16, 1, 1, 0, 0, 0, 4, "a", 0, 0, ""},
    {P "\"stop\":[]}", 1, "x", "x", 16, 1, 1, 0, 0, 0, 0, NULL, 0, 0, ""},
    // stream_options without include_usage
    {P "\"stream\":true,\"stream_options\":{}}", 1, "x", "x", 16, 1, 1, 0, 0, 0, 0, NULL, 1, 0, ""},
    {P "\"stream\":true,\"stream_options\":{\"include_usage\":null,\"other\":1}}", 1, "x", "x", 16,
     1, 1, 0, 0, 0, 0, NULL, 1, 0, ""},
    {P "\"stream\":true,\"stream_options\":{\"include_usage\":false}}", 1, "x", "x", 16, 1, 1, 0, 0,
     0, 0, NULL, 1, 0, ""},
    // UTF-8 through escapes and raw bytes
    {"{\"prompt\":\"h\\u00e9llo \\ud83d\\ude00 \xc3\xbc\"}", 1,
     "h\xc3\xa9llo \xf0\x9f\x98\x80 \xc3\xbc", "h\xc3\xa9llo \xf0\x9f\x98\x80 \xc3\xbc", 16, 1, 1,
     0, 0, 0, 0, NULL, 0, 0, ""},
    {"{\"prompt\":\"\\\\u0000\"}", 1, "\\u0000", "\\u0000", 16, 1, 1, 0, 0, 0, 0, NULL, 0, 0, ""},
};

static int utf8_ok(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int k = *u < 0x80             ? 1
                : (*u & 0xE0) == 0xC0 ? 2
                : (*u & 0xF0) == 0xE0 ? 3
                : (*u & 0xF8) == 0xF0 ? 4
                                      : 0;
        if (!k || (k == 2 && *u < 0xC2)) return 0;
        for (int i = 1; i < k; i++)
            if ((u[i] & 0xC0) != 0x80) return 0;
        u += k;
    }
    return 1;
}

// serve_error_json(err): valid UTF-8 JSON {"error": {message, type, param, code}}.
static int error_json_ok(const serve_error *err) {
    char *s = serve_error_json(err);
    if (!s) return 0;
    int ok = utf8_ok(s);
    cJSON *j = cJSON_Parse(s);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message"),
                *t = cJSON_GetObjectItemCaseSensitive(e, "type"),
                *p = cJSON_GetObjectItemCaseSensitive(e, "param"),
                *c = cJSON_GetObjectItemCaseSensitive(e, "code");
    ok = ok && cJSON_IsObject(j) && cJSON_GetArraySize(j) == 1 && cJSON_IsObject(e) &&
         cJSON_GetArraySize(e) == 4 && cJSON_IsString(m) && cJSON_IsString(t);
    ok = ok && (err->param[0] ? cJSON_IsString(p) && strcmp(p->valuestring, err->param) == 0
                              : cJSON_IsNull(p));
    ok = ok && (err->code[0] ? cJSON_IsString(c) && strcmp(c->valuestring, err->code) == 0
                             : cJSON_IsNull(c));
    if (!ok) printf("    error body: %s\n", s);
    cJSON_Delete(j);
    free(s);
    return ok;
}

static void test_bad(void) {
    printf("refused requests\n");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const bad_case *c = &bad[i];
        serve_params p;
        memset(&p, 0xAB, sizeof p); // whatever the caller had
        serve_error err = {0};
        const size_t len = c->len ? c->len : strlen(c->body);
        const int rc = serve_parse_completion(c->body, len, &LIM, &p, &err);
        const serve_params zero = {0};
        int ok = rc == -1 && err.status == 400 && strcmp(err.param, c->param) == 0 &&
                 strcmp(err.code, c->code) == 0 && strcmp(err.type, "invalid_request_error") == 0 &&
                 err.message[0] && memcmp(&p, &zero, sizeof p) == 0;
        // the message names the field
        if (c->param[0] && !strstr(err.message, c->param)) ok = 0;
        char what[96];
        snprintf(what, sizeof what, "bad %zu: %s %s", i, c->param[0] ? c->param : "(body)",
                 c->code);
        if (!ok)
            printf("    body %.*s\n    got rc %d status %d param '%s' code '%s': %s\n", (int)len,
                   c->body, rc, err.status, err.param, err.code, err.message);
        else
            printf("    %s\n", err.message);
        check_true(what, ok);
        check_true("  its error body", error_json_ok(&err));
    }
}

static int str_eq(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

static void test_good(void) {
    printf("accepted requests\n");
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        const good_case *c = &good[i];
        serve_params p;
        serve_error err = {0};
        const int rc = serve_parse_completion(c->body, strlen(c->body), &LIM, &p, &err);
        int ok = rc == 0;
        if (ok) {
            ok = p.n_prompts == c->n_prompts && str_eq(p.prompts[0], c->prompt0) &&
                 str_eq(p.prompts[p.n_prompts - 1], c->prompt_last) &&
                 p.max_tokens == c->max_tokens && p.temperature == c->temperature &&
                 p.top_p == c->top_p && p.top_k == c->top_k && p.has_seed == c->has_seed &&
                 p.seed == c->seed && p.n_stop == c->n_stop &&
                 (c->n_stop ? str_eq(p.stop[0], c->stop0) : 1) && p.stream == c->stream &&
                 p.include_usage == c->include_usage && strcmp(p.model, c->model) == 0;
            if (!ok)
                printf("    got n_prompts %d max_tokens %d T %g top_p %g top_k %d seed %d/%llu "
                       "n_stop %d stream %d usage %d model '%s'\n",
                       p.n_prompts, p.max_tokens, p.temperature, p.top_p, p.top_k, p.has_seed,
                       p.seed, p.n_stop, p.stream, p.include_usage, p.model);
        } else {
            printf("    refused (%d %s %s): %s\n", err.status, err.param, err.code, err.message);
        }
        printf("    %s\n", c->body);
        char what[64];
        snprintf(what, sizeof what, "good %zu", i);
        check_true(what, ok);
        serve_params_free(&p);
        const serve_params zero = {0};
        check_true("  freed and zeroed", memcmp(&p, &zero, sizeof p) == 0);
        serve_params_free(&p); // twice: nothing
    }
}

static void test_limits(void) {
    printf("limits\n");
    serve_params p;
    serve_error err;
    // no limits: SERVE_LIMITS_DEFAULT (4096, 16, 64 prompts, 1 MiB, 4 stops)
    const char *ok4096 = "{\"prompt\":\"x\",\"max_tokens\":4096}";
    check_true("NULL limits: max_tokens 4096",
               serve_parse_completion(ok4096, strlen(ok4096), NULL, &p, &err) == 0 &&
                   p.max_tokens == 4096);
    serve_params_free(&p);
    const char *no = "{\"prompt\":\"x\",\"max_tokens\":4097}";
    check_true("NULL limits: max_tokens 4097 refused",
               serve_parse_completion(no, strlen(no), NULL, &p, &err) == -1 &&
                   strcmp(err.param, "max_tokens") == 0 && strstr(err.message, "[1, 4096]"));
    const char *dflt = "{\"prompt\":\"x\"}";
    check_true("NULL limits: default 16",
               serve_parse_completion(dflt, strlen(dflt), NULL, &p, &err) == 0 &&
                   p.max_tokens == 16);
    serve_params_free(&p);
    // a default above the limit gives the limit
    serve_limits small = LIM;
    small.max_tokens_limit = 8;
    check_true("default above the limit: the limit",
               serve_parse_completion(dflt, strlen(dflt), &small, &p, &err) == 0 &&
                   p.max_tokens == 8);
    serve_params_free(&p);
    // no stop strings allowed
    small.max_stop = 0;
    const char *stop = "{\"prompt\":\"x\",\"stop\":\"a\"}";
    check_true("max_stop 0: a stop string refused",
               serve_parse_completion(stop, strlen(stop), &small, &p, &err) == -1 &&
                   strcmp(err.param, "stop") == 0);
    // a model name of 255 bytes, and one of 256
    char body[600];
    char name[257];
    memset(name, 'm', 256);
    name[256] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"model\":\"%.255s\"}", name);
    check_true("model of 255 bytes",
               serve_parse_completion(body, strlen(body), &LIM, &p, &err) == 0 &&
                   strlen(p.model) == 255);
    serve_params_free(&p);
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"model\":\"%s\"}", name);
    check_true("model of 256 bytes refused",
               serve_parse_completion(body, strlen(body), &LIM, &p, &err) == -1 &&
                   strcmp(err.param, "model") == 0 && strcmp(err.code, "invalid_value") == 0);
    // the body is read within len: no NUL needed, bytes after len unread
    const char *longer = "{\"prompt\":\"x\"}garbage";
    check_true("len bounds the body",
               serve_parse_completion(longer, 14, &LIM, &p, &err) == 0 && p.n_prompts == 1);
    serve_params_free(&p);
    check_true("a NULL body is an empty one",
               serve_parse_completion(NULL, 0, &LIM, &p, &err) == -1 &&
                   strcmp(err.code, "invalid_json") == 0);
    // the invalid JSON message gives the position
    const char *broken = "{\"prompt\":\n  x}";
    check_true("invalid JSON: its line and column",
               serve_parse_completion(broken, strlen(broken), &LIM, &p, &err) == -1 &&
                   strstr(err.message, "line 2, column 3"));
    printf("    %s\n", err.message);
}

static void test_error_json(void) {
    printf("serve_error_json\n");
    serve_error e = {.status = 500};
    snprintf(e.message, sizeof e.message, "out of memory");
    snprintf(e.type, sizeof e.type, "server_error");
    check_true("param and code null when empty", error_json_ok(&e));
    // a message cut inside a character, and quotes, backslashes, control characters
    serve_error cut = {.status = 400};
    memset(cut.message, 'a', sizeof cut.message);
    cut.message[sizeof cut.message - 3] = (char)0xE2; // a 3-byte sequence with 1 byte left
    cut.message[sizeof cut.message - 2] = (char)0x82;
    cut.message[sizeof cut.message - 1] = 0;
    snprintf(cut.type, sizeof cut.type, "invalid_request_error");
    snprintf(cut.param, sizeof cut.param, "prompt");
    snprintf(cut.code, sizeof cut.code, "invalid_value");
    check_true("a message cut inside a character", error_json_ok(&cut));
    snprintf(cut.message, sizeof cut.message, "\"quoted\" \\ \n\t\x01 caf\xc3\xa9 \xff end");
    char *s = serve_error_json(&cut);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    const cJSON *m =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    check_true("escapes kept, a stray byte replaced",
               cJSON_IsString(m) &&
                   strcmp(m->valuestring, "\"quoted\" \\ \n\t\x01 caf\xc3\xa9 ? end") == 0);
    printf("    %s\n", s ? s : "(null)");
    cJSON_Delete(j);
    free(s);
}

int main(void) {
    test_bad();
    test_good();
    test_limits();
    test_error_json();
    printf("%s\n", test_failures() ? "FAILED" : "all passed");
    return test_failures() != 0;
}
