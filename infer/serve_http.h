// The HTTP side of `moe serve` (libmicrohttpd, one thread per connection): the routes, the
// API key, the OpenAI JSON and server-sent events, request limits.
//   POST /v1/completions   GET /v1/models   GET /health   GET /metrics
#ifndef MOE_SERVE_HTTP_H
#define MOE_SERVE_HTTP_H

#include <stddef.h>

#include "infer/serve_engine.h"
#include "infer/serve_request.h"

typedef struct serve_http serve_http;

typedef struct {
    const char *host;    // the address to bind (IPv4, or "localhost")
    int port;            // 0: any free port (serve_http_port says which)
    const char *api_key; // NULL: no key; else every route but /health needs it
    const char *model;   // the name /v1/models lists and responses carry
    size_t max_body;     // bytes of a request body (413 beyond)
    int idle_timeout_s;  // a connection idle this long is closed (slowloris)
    int max_connections; // at once
    serve_limits limits; // max_tokens and prompts
    int hf_tok;          // prompts through the folder's tokenizer.json (else bytes)
    const char *tok_dir;
} serve_http_opts;

// Starts listening; NULL with the reason in moe_last_error().
serve_http *serve_http_start(const serve_http_opts *o, serve_engine *e, serve_metrics *mt);
int serve_http_port(const serve_http *h);
// New completions get 503 from now on (the engine drains); /health says "draining".
void serve_http_drain(serve_http *h);
// Stops the listener and waits for the connection threads.
void serve_http_stop(serve_http *h);

#endif
