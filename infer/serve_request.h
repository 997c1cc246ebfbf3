// `moe serve`'s request side: a POST /v1/completions body (OpenAI's completion schema, as the
// official `openai` Python client sends it) checked and turned into the parameters of a
// completion, and OpenAI's error body for what is refused.
//
// What is accepted (docs/serve.md): "prompt" (required: a string or a non-empty list of
// strings), "max_tokens", "temperature", "top_p", "top_k" (an extension), "seed", "stop",
// "stream", "stream_options.include_usage", "model", "user"; and, at their no-op values only,
// "n", "best_of" (1), "echo" (false), "logprobs", "suffix" (null), "presence_penalty",
// "frequency_penalty" (0) and "logit_bias" ({}). null is the same as absent everywhere. Keys
// outside the schema are ignored (clients send extra ones). Refused with 400:
//   - a body that is not a JSON object, not UTF-8, or repeats a key in any object (which of
//     the two values counts differs between parsers): code "invalid_json";
//   - a known key of the wrong JSON type: "invalid_type", the message naming the field, the
//     type expected and the type received ("a decimal number" for a number with a fraction
//     where an integer is expected; an integral value such as 5.0 is an integer);
//   - a value out of its range or beyond a limit: "invalid_value", the message saying what
//     is allowed; a missing or null prompt: "missing_required_parameter";
//   - what moe serve does not implement (token-id prompts, n or best_of other than 1, echo,
//     logprobs, suffix, non-zero penalties, a non-empty logit_bias): "unsupported_value".
// Strings are NUL-terminated C strings: a NUL character ("\u0000") in the prompt, a stop
// string or the model is refused (invalid_value) rather than cut short.
#ifndef MOE_INFER_SERVE_REQUEST_H
#define MOE_INFER_SERVE_REQUEST_H

#include <stddef.h>

// Limits the server applies to a request (moe serve's options).
typedef struct {
    int max_tokens_limit;    // max_tokens above this: 400 (param "max_tokens")
    int default_max_tokens;  // when the request has none (OpenAI's default is 16)
    int max_prompts;         // a prompt list longer than this: 400
    size_t max_prompt_bytes; // one prompt longer than this: 400
    int max_stop;            // at most this many stop strings (OpenAI: 4)
} serve_limits;

// What serve_parse_completion applies when given no limits (lim == NULL).
#define SERVE_LIMITS_DEFAULT                             \
    ((serve_limits){.max_tokens_limit = 4096,            \
                    .default_max_tokens = 16,            \
                    .max_prompts = 64,                   \
                    .max_prompt_bytes = (size_t)1 << 20, \
                    .max_stop = 4})

typedef struct {
    char **prompts;     // n_prompts UTF-8 strings (malloc'd; a string prompt is a list of one)
    int n_prompts;      // in [1, max_prompts]; each prompt non-empty, at most max_prompt_bytes
    int max_tokens;     // >= 1: in [1, max_tokens_limit], or the default (at most the limit)
    double temperature; // [0, 2], default 1 (OpenAI's); 0 = greedy
    double top_p;       // (0, 1], default 1
    int top_k;          // >= 0 (an extension; 0 = off), default 0
    int has_seed;
    unsigned long long seed; // any 64-bit value, read exactly from the request's digits
    char **stop;             // stop strings (a string or a list), each non-empty
    int n_stop;              // in [0, max_stop]
    int stream;              // bool
    int include_usage;       // stream_options.include_usage (only with stream)
    char model[256];         // the request's "model" ("" when absent; at most 255 bytes)
} serve_params;

typedef struct {
    int status;        // HTTP status: 400 for every refusal of a request, 500 out of memory
    char message[512]; // human-readable, names the field and what was wrong and what is allowed
    char type[64];     // OpenAI's error type: "invalid_request_error" ("server_error" for 500)
    char param[64];    // the offending field ("" when none)
    char code[64];     // e.g. "invalid_type", "invalid_value", "missing_required_parameter",
                       // "unsupported_value", "invalid_json"
} serve_error;

// Parses a /v1/completions body (len bytes, not NUL-terminated) into p. Returns 0, or -1 with
// err filled (p freed/zeroed). lim NULL: SERVE_LIMITS_DEFAULT. Thread-safe.
int serve_parse_completion(const char *body, size_t len, const serve_limits *lim, serve_params *p,
                           serve_error *err);
// Frees what p holds and zeroes it (p NULL or already freed: nothing).
void serve_params_free(serve_params *p);
// The OpenAI-style error body {"error": {"message", "type", "param", "code"}} (malloc'd
// string, NULL out of memory; param and code null when ""). Always valid UTF-8 JSON: bytes of
// the message that are not UTF-8 (such as a sequence cut by its buffer) become '?'.
char *serve_error_json(const serve_error *err);

#endif
