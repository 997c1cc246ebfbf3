// The HTTP side of `moe serve` (infer/serve_http.h) on libmicrohttpd: a thread per connection,
// so a non-streaming request waits for its completion on its own thread and a stream's reader
// waits for the engine's next token the same way. No HTTP parsing of our own.
#include "infer/serve_http.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/prepare.h"
#include "data/tokenizer.h"
#include "layers/status.h"
#include "layers/timing.h"

struct serve_http {
    struct MHD_Daemon *d;
    serve_http_opts o;
    serve_engine *e;
    serve_metrics *mt;
    atomic_int draining;
    atomic_ulong next_id;
};

// One connection's request: its body, as it arrives.
typedef struct {
    char *body;
    size_t n, cap;
    int too_large;
} conn_ctx;

// ---- responses ---------------------------------------------------------------------------

static enum MHD_Result send_text(struct MHD_Connection *c, int status, char *text, size_t n,
                                 const char *type, int retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", v);
    }
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

// A generated 0x00 byte: cJSON's strings end at a NUL, so utf8_clean spells it 0xFF (a byte
// valid UTF-8 never holds, and the cleaned text holds no other) and json_print writes each
// 0xFF as the escape \u0000, what the client decodes back to the byte.
#define NUL_STAND_IN '\xFF'

static char *json_print(const cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    if (!s || !strchr(s, NUL_STAND_IN)) return s;
    size_t n = 0;
    for (const char *p = s; *p; p++) n += *p == NUL_STAND_IN ? 6 : 1;
    char *o = malloc(n + 1), *w = o;
    for (const char *p = s; o && *p; p++) {
        if (*p == NUL_STAND_IN) {
            memcpy(w, "\\u0000", 6);
            w += 6;
        } else {
            *w++ = *p;
        }
    }
    if (o) *w = 0;
    free(s);
    return o;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, cJSON *j, int retry_after) {
    char *s = json_print(j);
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    return send_text(c, status, s, strlen(s), "application/json", retry_after);
}

// {"error": {"message", "type", "param", "code"}} with the status
static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *type,
                                  const char *param, const char *code, const char *message,
                                  int retry_after) {
    serve_error err = {.status = status};
    snprintf(err.message, sizeof err.message, "%s", message);
    snprintf(err.type, sizeof err.type, "%s", type);
    snprintf(err.param, sizeof err.param, "%s", param ? param : "");
    snprintf(err.code, sizeof err.code, "%s", code ? code : "");
    char *s = serve_error_json(&err);
    if (!s) return MHD_NO;
    return send_text(c, status, s, strlen(s), "application/json", retry_after);
}

// ---- text --------------------------------------------------------------------------------

// The length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence.
static size_t utf8_complete(const char *s, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, back++;
    if (i == 0) return n;
    const unsigned char lead = (unsigned char)s[i - 1];
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return need > back + 1 ? i - 1 : n;
}

// s[0..n) as valid UTF-8 (malloc'd, NUL-terminated): each invalid byte becomes U+FFFD, the
// replacement a decoder makes (the byte tokenizer can cut a character anywhere), and a 0x00
// byte becomes NUL_STAND_IN (json_print escapes it).
static char *utf8_clean(const char *s, size_t n) {
    char *o = malloc(3 * n + 1), *w = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        const unsigned char b = (unsigned char)s[i];
        size_t k = b < 0x80                          ? 1
                   : (b & 0xE0) == 0xC0 && b >= 0xC2 ? 2
                   : (b & 0xF0) == 0xE0              ? 3
                   : (b & 0xF8) == 0xF0 && b <= 0xF4 ? 4
                                                     : 0;
        for (size_t j = 1; k && j < k; j++)
            if (i + j >= n || ((unsigned char)s[i + j] & 0xC0) != 0x80) k = 0;
        if (k == 3 && ((b == 0xE0 && (unsigned char)s[i + 1] < 0xA0) ||
                       (b == 0xED && (unsigned char)s[i + 1] >= 0xA0)))
            k = 0; // overlong, or a surrogate
        if (k == 4 && ((b == 0xF0 && (unsigned char)s[i + 1] < 0x90) ||
                       (b == 0xF4 && (unsigned char)s[i + 1] >= 0x90)))
            k = 0;
        if (b == 0) {
            *w++ = NUL_STAND_IN, i++;
        } else if (k) {
            memcpy(w, s + i, k), w += k, i += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3), w += 3, i++;
        }
    }
    *w = 0;
    return o;
}

static const char *finish_name(serve_finish f) {
    return f == SERVE_FINISH_STOP ? "stop" : f == SERVE_FINISH_LENGTH ? "length" : NULL;
}

// ---- a completion request's sequences ----------------------------------------------------

typedef struct {
    serve_http *h;
    serve_params p;
    serve_seq **seqs;
    int n;
    char id[48];
    long created;
    // streaming
    size_t *sent;  // [n] text bytes sent
    int *finished; // [n] its last chunk sent
    int done_sent, usage_sent;
    char *pending; // bytes not yet handed to MHD
    size_t pend_n, pend_off;
} completion;

static void completion_free(completion *cp) {
    for (int i = 0; i < cp->n; i++)
        if (cp->seqs[i]) {
            serve_engine_cancel(cp->h->e, cp->seqs[i]); // (no-op when it finished)
            serve_engine_release(cp->h->e, cp->seqs[i]);
        }
    serve_params_free(&cp->p);
    free(cp->seqs), free(cp->sent), free(cp->finished), free(cp->pending);
    free(cp);
}

static int *encode(const serve_http *h, const char *text, int *n) {
    int *ids = NULL;
    const size_t len = strlen(text);
    if (h->o.hf_tok) {
        if (moe_hf_tokenizer_encode(h->o.tok_dir, text, len, &ids, n)) return NULL;
        return ids;
    }
    if (!(ids = malloc((len + 1) * sizeof(int)))) return NULL;
    moe_byte_tokenize(ids, text, len);
    *n = (int)len;
    return ids;
}

// The sequences of cp->p submitted to the engine; 0, or an error response sent (its result in *r)
static int submit_all(completion *cp, struct MHD_Connection *c, enum MHD_Result *r) {
    serve_http *h = cp->h;
    cp->n = cp->p.n_prompts;
    cp->seqs = calloc((size_t)cp->n, sizeof *cp->seqs);
    cp->sent = calloc((size_t)cp->n, sizeof *cp->sent);
    cp->finished = calloc((size_t)cp->n, sizeof(int));
    if (!cp->seqs || !cp->sent || !cp->finished) {
        *r = send_error(c, 500, "server_error", NULL, NULL, "out of memory", 0);
        return -1;
    }
    const unsigned long seed =
        cp->p.has_seed ? cp->p.seed
                       : (unsigned long)time(NULL) * 2654435761u + atomic_fetch_add(&h->next_id, 1);
    int stop_max = 0;
    for (int i = 0; i < cp->p.n_stop; i++)
        if ((int)strlen(cp->p.stop[i]) > stop_max) stop_max = (int)strlen(cp->p.stop[i]);
    for (int i = 0; i < cp->n; i++) {
        int n_ids = 0;
        int *ids = encode(h, cp->p.prompts[i], &n_ids);
        serve_seq *s = ids ? serve_seq_new(ids, n_ids, cp->p.max_tokens) : NULL;
        free(ids);
        if (!s) {
            *r = send_error(c, 500, "server_error", "prompt", NULL,
                            h->o.hf_tok ? moe_last_error() : "out of memory", 0);
            return -1;
        }
        s->temperature = cp->p.temperature, s->top_p = cp->p.top_p, s->top_k = cp->p.top_k;
        s->rng = (uint64_t)seed + (uint64_t)i; // prompt i samples as moe generate's sequence i
        s->stop = cp->p.stop, s->n_stop = cp->p.n_stop, s->stop_max = stop_max;
        s->t_arrival = moe_clock_s();
        char why[512];
        const int status = serve_engine_submit(h->e, s, why, sizeof why);
        cp->seqs[i] = s;
        if (status) {
            serve_metrics_reject(h->mt, status == 429   ? SERVE_REJECT_QUEUE_FULL
                                        : status == 503 ? SERVE_REJECT_DRAINING
                                                        : SERVE_REJECT_TOO_LONG);
            *r = send_error(c, status, status == 400 ? "invalid_request_error" : "server_error",
                            status == 400 ? "max_tokens" : NULL,
                            status == 429   ? "rate_limit_exceeded"
                            : status == 503 ? "server_shutting_down"
                                            : "context_length_exceeded",
                            why, status == 429 ? serve_engine_retry_after(h->e) : 0);
            return -1;
        }
    }
    return 0;
}

static int usage_tokens(const completion *cp, int *prompt, int *gen) {
    *prompt = *gen = 0;
    for (int i = 0; i < cp->n; i++) *prompt += cp->seqs[i]->n_prompt, *gen += cp->seqs[i]->n_out;
    return *prompt + *gen;
}

static cJSON *usage_json(const completion *cp) {
    int pt, gt;
    const int total = usage_tokens(cp, &pt, &gt);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", pt);
    cJSON_AddNumberToObject(u, "completion_tokens", gt);
    cJSON_AddNumberToObject(u, "total_tokens", total);
    return u;
}

static cJSON *chunk_head(const completion *cp) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", cp->id);
    cJSON_AddStringToObject(j, "object", "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)cp->created);
    cJSON_AddStringToObject(j, "model", cp->h->o.model);
    return j;
}

static void add_choice(cJSON *choices, const char *text, size_t n, int index, const char *finish) {
    cJSON *ch = cJSON_CreateObject();
    char *clean = utf8_clean(text ? text : "", text ? n : 0);
    cJSON_AddStringToObject(ch, "text", clean ? clean : "");
    free(clean);
    cJSON_AddNumberToObject(ch, "index", index);
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
}

// (engine mutex held) the first sequence that failed, or NULL
static const serve_seq *failed(const completion *cp) {
    for (int i = 0; i < cp->n; i++)
        if (cp->seqs[i]->state == SERVE_DONE && !finish_name(cp->seqs[i]->finish))
            return cp->seqs[i];
    return NULL;
}

static enum MHD_Result respond_whole(completion *cp, struct MHD_Connection *c) {
    serve_engine *e = cp->h->e;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < cp->n; i++)
        while (cp->seqs[i]->state != SERVE_DONE) pthread_cond_wait(&e->done, &e->mu);
    const serve_seq *bad = failed(cp);
    if (bad) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s",
                 bad->finish == SERVE_FINISH_SHUTDOWN ? "the server shut down before the "
                                                        "completion finished"
                                                      : bad->error);
        const int status = bad->finish == SERVE_FINISH_SHUTDOWN ? 503 : 500;
        pthread_mutex_unlock(&e->mu);
        return send_error(c, status, "server_error", NULL, NULL, msg, 0);
    }
    cJSON *j = chunk_head(cp), *choices = cJSON_AddArrayToObject(j, "choices");
    for (int i = 0; i < cp->n; i++)
        add_choice(choices, cp->seqs[i]->text, cp->seqs[i]->n_text, i,
                   finish_name(cp->seqs[i]->finish));
    cJSON_AddItemToObject(j, "usage", usage_json(cp));
    pthread_mutex_unlock(&e->mu);
    return send_json(c, 200, j, 0);
}

// ---- server-sent events ------------------------------------------------------------------

static int pend(completion *cp, cJSON *j) {
    char *s = j ? json_print(j) : NULL;
    cJSON_Delete(j);
    const size_t k = s ? strlen(s) + 8 : 14;
    char *p = realloc(cp->pending, cp->pend_n + k + 1);
    if (!p) {
        free(s);
        return -1;
    }
    cp->pending = p;
    cp->pend_n += (size_t)snprintf(p + cp->pend_n, k + 1, "data: %s\n\n", s ? s : "[DONE]");
    free(s);
    return 0;
}

// (engine mutex held) the events that are ready: new text of each sequence (what no stop
// string can still take back, whole UTF-8 characters), its end, then usage and [DONE]
static void compose(completion *cp) {
    int all = 1;
    for (int i = 0; i < cp->n; i++) {
        const serve_seq *s = cp->seqs[i];
        if (cp->finished[i]) continue;
        const int done = s->state == SERVE_DONE;
        all &= done;
        size_t ready = s->n_text;
        if (!done) {
            ready = s->n_text > (size_t)(s->stop_max > 0 ? s->stop_max - 1 : 0)
                        ? s->n_text - (size_t)(s->stop_max > 0 ? s->stop_max - 1 : 0)
                        : 0;
            ready = utf8_complete(s->text ? s->text : "", ready);
        }
        if (ready < cp->sent[i]) ready = cp->sent[i];
        if (done && !finish_name(s->finish)) { // an error or a shutdown: an error event
            serve_error err = {.status = 500};
            snprintf(err.message, sizeof err.message, "%s",
                     s->finish == SERVE_FINISH_SHUTDOWN ? "the server shut down before the "
                                                          "completion finished"
                                                        : s->error);
            snprintf(err.type, sizeof err.type, "server_error");
            char *ej = serve_error_json(&err);
            cJSON *j = ej ? cJSON_Parse(ej) : NULL;
            free(ej);
            pend(cp, j);
            cp->finished[i] = 1;
            continue;
        }
        if (ready > cp->sent[i] || done) {
            cJSON *j = chunk_head(cp), *choices = cJSON_AddArrayToObject(j, "choices");
            add_choice(choices, s->text + cp->sent[i], ready - cp->sent[i], i,
                       done ? finish_name(s->finish) : NULL);
            pend(cp, j);
            cp->sent[i] = ready;
            cp->finished[i] = done;
        }
    }
    if (all && !cp->done_sent) {
        if (cp->p.include_usage) {
            cJSON *j = chunk_head(cp);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "usage", usage_json(cp));
            pend(cp, j);
        }
        pend(cp, NULL);
        cp->done_sent = 1;
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    completion *cp = cls;
    serve_engine *e = cp->h->e;
    pthread_mutex_lock(&e->mu);
    while (cp->pend_off == cp->pend_n) {
        cp->pend_n = cp->pend_off = 0;
        if (cp->done_sent) {
            pthread_mutex_unlock(&e->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        compose(cp);
        if (cp->pend_n) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&e->done, &e->mu, &ts);
    }
    size_t k = cp->pend_n - cp->pend_off;
    if (k > max) k = max;
    memcpy(buf, cp->pending + cp->pend_off, k);
    cp->pend_off += k;
    pthread_mutex_unlock(&e->mu);
    return (ssize_t)k;
}

// The response is gone: finished, or the client went away (then its sequences are cancelled
// and their slots free at the engine's next step).
static void stream_free(void *cls) { completion_free(cls); }

static enum MHD_Result respond_stream(completion *cp, struct MHD_Connection *c) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, cp, stream_free);
    if (!r) {
        completion_free(cp);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

// ---- routes ------------------------------------------------------------------------------

static enum MHD_Result completions(serve_http *h, struct MHD_Connection *c, conn_ctx *cc) {
    if (cc->too_large) {
        serve_metrics_reject(h->mt, SERVE_REJECT_TOO_LARGE);
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes (--max-body)", h->o.max_body);
        return send_error(c, 413, "invalid_request_error", NULL, "request_too_large", msg, 0);
    }
    if (atomic_load(&h->draining)) {
        serve_metrics_reject(h->mt, SERVE_REJECT_DRAINING);
        return send_error(c, 503, "server_error", NULL, "server_shutting_down",
                          "the server is shutting down", 0);
    }
    completion *cp = calloc(1, sizeof *cp);
    if (!cp) return send_error(c, 500, "server_error", NULL, NULL, "out of memory", 0);
    cp->h = h;
    serve_error err;
    if (serve_parse_completion(cc->body ? cc->body : "", cc->n, &h->o.limits, &cp->p, &err)) {
        free(cp);
        serve_metrics_reject(h->mt, SERVE_REJECT_BAD_REQUEST);
        char *s = serve_error_json(&err);
        return s ? send_text(c, err.status, s, strlen(s), "application/json", 0) : MHD_NO;
    }
    snprintf(cp->id, sizeof cp->id, "cmpl-%lx%08lx", (unsigned long)time(NULL),
             atomic_fetch_add(&h->next_id, 1));
    cp->created = (long)time(NULL);
    enum MHD_Result r;
    if (submit_all(cp, c, &r)) {
        completion_free(cp);
        return r;
    }
    if (cp->p.stream) return respond_stream(cp, c);
    r = respond_whole(cp, c);
    completion_free(cp);
    return r;
}

static enum MHD_Result models(serve_http *h, struct MHD_Connection *c) {
    cJSON *j = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(j, "data");
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", h->o.model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "moe.c");
    cJSON_AddItemToArray(data, m);
    return send_json(c, 200, j, 0);
}

static enum MHD_Result metrics(serve_http *h, struct MHD_Connection *c) {
    size_t n = 0;
    char *s = serve_metrics_render(h->mt, h->o.model, &n);
    if (!s) return send_error(c, 500, "server_error", NULL, NULL, "out of memory", 0);
    return send_text(c, 200, s, n, "text/plain; version=0.0.4; charset=utf-8", 0);
}

// 1 when the request carries the key (constant time in the key's length)
static int authorized(const serve_http *h, struct MHD_Connection *c) {
    if (!h->o.api_key) return 1;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!v || strncmp(v, "Bearer ", 7)) return 0;
    v += 7;
    const size_t n = strlen(h->o.api_key);
    if (strlen(v) != n) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(v[i] ^ h->o.api_key[i]);
    return diff == 0;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    serve_http *h = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) { // the headers: a context for the body
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        return MHD_YES;
    }
    if (*upload_size) { // a piece of the body
        if (!cc->too_large && cc->n + *upload_size > h->o.max_body) {
            cc->too_large = 1;
        } else if (!cc->too_large) {
            if (cc->n + *upload_size + 1 > cc->cap) {
                size_t cap = (cc->n + *upload_size + 1) * 2;
                if (cap > h->o.max_body + 1) cap = h->o.max_body + 1;
                char *b = realloc(cc->body, cap);
                if (!b) return MHD_NO;
                cc->body = b, cc->cap = cap;
            }
            memcpy(cc->body + cc->n, upload, *upload_size);
            cc->n += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    const int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(c, 405, "invalid_request_error", NULL, NULL, "use GET", 0);
        const int dr = atomic_load(&h->draining);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", dr ? "draining" : "ok");
        return send_json(c, dr ? 503 : 200, j, 0);
    }
    if (!authorized(h, c)) {
        serve_metrics_reject(h->mt, SERVE_REJECT_UNAUTHORIZED);
        return send_error(c, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "a valid API key is required: Authorization: Bearer KEY", 0);
    }
    if (!strcmp(url, "/v1/completions")) {
        if (!post) return send_error(c, 405, "invalid_request_error", NULL, NULL, "use POST", 0);
        return completions(h, c, cc);
    }
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/metrics")) {
        if (!get) return send_error(c, 405, "invalid_request_error", NULL, NULL, "use GET", 0);
        return url[1] == 'v' ? models(h, c) : metrics(h, c);
    }
    char msg[300];
    snprintf(msg, sizeof msg,
             "no route %.200s (this server has POST /v1/completions, GET /v1/models, /health, "
             "/metrics)",
             url);
    return send_error(c, 404, "invalid_request_error", NULL, "not_found", msg, 0);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode why) {
    (void)cls, (void)c, (void)why;
    conn_ctx *cc = *con_cls;
    if (cc) free(cc->body), free(cc);
    *con_cls = NULL;
}

serve_http *serve_http_start(const serve_http_opts *o, serve_engine *e, serve_metrics *mt) {
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        moe_error(MOE_ENOMEM, "serve: out of memory");
        return NULL;
    }
    h->o = *o, h->e = e, h->mt = mt;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        moe_error(MOE_EINVAL, "--host '%s': not an IPv4 address (e.g. 127.0.0.1, 0.0.0.0)",
                  o->host);
        free(h);
        return NULL;
    }
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG, 0,
        NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)o->max_connections, MHD_OPTION_NOTIFY_COMPLETED, completed, h, MHD_OPTION_END);
    if (!h->d) {
        moe_error(MOE_EIO, "serve: cannot listen on %s:%d (in use, or not allowed)", o->host,
                  o->port);
        free(h);
        return NULL;
    }
    return h;
}

int serve_http_port(const serve_http *h) {
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    return i ? i->port : -1;
}

void serve_http_drain(serve_http *h) { atomic_store(&h->draining, 1); }

void serve_http_stop(serve_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
