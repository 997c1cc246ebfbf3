// The continuous-batching engine of `moe serve` (infer/serve_engine.h): a queue, the KV slots,
// and one thread that runs the steps. The HTTP threads only submit, cancel, wait and read.
#include "infer/serve_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/prepare.h"
#include "data/tokenizer.h"
#include "infer/infer.h"
#include "layers/timing.h"

// ---- sequences ---------------------------------------------------------------------------

serve_seq *serve_seq_new(const int *prompt, int n_prompt, int max_tokens) {
    serve_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->prompt = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof(int));
    s->out = malloc((size_t)(max_tokens > 0 ? max_tokens : 1) * sizeof(int));
    if (!s->prompt || !s->out) {
        free(s->prompt), free(s->out), free(s);
        return NULL;
    }
    if (n_prompt > 0) memcpy(s->prompt, prompt, (size_t)n_prompt * sizeof(int));
    s->n_prompt = n_prompt, s->max_tokens = max_tokens, s->slot = -1, s->refs = 1;
    s->top_p = 1;
    return s;
}

static void seq_free(serve_seq *s) {
    free(s->prompt), free(s->out), free(s->text);
    free(s);
}

// (mutex held)
static void seq_unref(serve_seq *s) {
    if (--s->refs == 0) seq_free(s);
}

void serve_engine_release(serve_engine *e, serve_seq *s) {
    pthread_mutex_lock(&e->mu);
    seq_unref(s);
    pthread_mutex_unlock(&e->mu);
}

// ---- submit, cancel ----------------------------------------------------------------------

// (engine mutex held)
static void metrics_gauges(serve_engine *e) {
    pthread_mutex_lock(&e->metrics->mu);
    e->metrics->queue = e->n_queued, e->metrics->active = e->n_active;
    e->metrics->kv_used = e->kv_used, e->metrics->kv_budget = e->o.kv_tokens;
    pthread_mutex_unlock(&e->metrics->mu);
}

int serve_engine_submit(serve_engine *e, serve_seq *s, char *why, size_t why_size) {
    const int need = s->n_prompt + s->max_tokens;
    if (s->n_prompt < 1) {
        snprintf(why, why_size, "the prompt is empty (no tokens)");
        return 400;
    }
    if (need > e->o.max_pos) {
        snprintf(why, why_size,
                 "this server's context is %d tokens per sequence (--max-pos); the prompt has %d "
                 "tokens and max_tokens asks for %d more",
                 e->o.max_pos, s->n_prompt, s->max_tokens);
        return 400;
    }
    if (need > e->o.kv_tokens) {
        snprintf(why, why_size,
                 "the request needs %d KV-cache tokens (prompt %d + max_tokens %d) and the pool "
                 "holds %d (--kv-tokens)",
                 need, s->n_prompt, s->max_tokens, e->o.kv_tokens);
        return 400;
    }
    pthread_mutex_lock(&e->mu);
    int status = 0;
    if (e->draining || e->stopping) {
        snprintf(why, why_size, "the server is shutting down");
        status = 503;
    } else if (e->n_queued >= e->o.max_queue + (e->o.max_seqs - e->n_active)) {
        // (the queue counts those waiting beyond the free slots: a burst that the next step
        // admits is not refused)
        snprintf(why, why_size,
                 "the server is at capacity: %d requests are waiting (--max-queue); retry later",
                 e->n_queued);
        status = 429;
    } else {
        s->reserved = need;
        s->state = SERVE_QUEUED;
        s->refs++;
        if (e->queue_tail)
            e->queue_tail->next = s;
        else
            e->queue_head = s;
        e->queue_tail = s;
        e->n_queued++;
        pthread_mutex_lock(&e->metrics->mu);
        e->metrics->requests++;
        pthread_mutex_unlock(&e->metrics->mu);
        pthread_cond_signal(&e->work);
    }
    metrics_gauges(e);
    pthread_mutex_unlock(&e->mu);
    return status;
}

// (mutex held) a sequence that ends: its slot and KV tokens back, its counters, the waiters
static void seq_finish(serve_engine *e, serve_seq *s, serve_finish why) {
    if (s->state == SERVE_DONE) return;
    const int was_active = s->state != SERVE_QUEUED;
    s->state = SERVE_DONE, s->finish = why;
    if (was_active) {
        e->active[s->slot] = NULL;
        e->n_active--, e->kv_used -= s->reserved;
    }
    pthread_mutex_lock(&e->metrics->mu);
    e->metrics->finished[why]++;
    if (s->n_out) serve_hist_observe(&e->metrics->e2e, s->t_last - s->t_arrival);
    pthread_mutex_unlock(&e->metrics->mu);
    pthread_cond_broadcast(&e->done);
    seq_unref(s); // the engine's reference
}

// (mutex held) removes s from the queue
static void queue_remove(serve_engine *e, serve_seq *s) {
    serve_seq **p = &e->queue_head, *prev = NULL;
    while (*p && *p != s) prev = *p, p = &(*p)->next;
    if (!*p) return;
    *p = s->next;
    if (e->queue_tail == s) e->queue_tail = prev;
    s->next = NULL;
    e->n_queued--;
}

void serve_engine_cancel(serve_engine *e, serve_seq *s) {
    pthread_mutex_lock(&e->mu);
    if (s->state == SERVE_QUEUED) {
        queue_remove(e, s);
        seq_finish(e, s, SERVE_FINISH_CANCELLED);
    } else if (s->state == SERVE_PREFILL || s->state == SERVE_DECODE) {
        s->finish = SERVE_FINISH_CANCELLED; // the engine ends it before its next step
        pthread_cond_signal(&e->work);
    }
    metrics_gauges(e);
    pthread_mutex_unlock(&e->mu);
}

int serve_engine_retry_after(serve_engine *e) {
    pthread_mutex_lock(&e->metrics->mu);
    const double step = e->metrics->step.count ? e->metrics->step.sum / e->metrics->step.count : 0;
    pthread_mutex_unlock(&e->metrics->mu);
    pthread_mutex_lock(&e->mu);
    double tokens = 0; // what is ahead: the queued requests' tokens, decoded max_seqs at a time
    for (serve_seq *s = e->queue_head; s; s = s->next) tokens += s->max_tokens;
    pthread_mutex_unlock(&e->mu);
    const double s = step * tokens / (e->o.max_seqs > 0 ? e->o.max_seqs : 1);
    return s < 1 ? 1 : s > 3600 ? 3600 : (int)ceil(s);
}

// ---- one step ----------------------------------------------------------------------------

// (mutex held) the queue's head into free slots while its KV tokens fit and, with admission
// by expert load, while the active sequences stay within the step's row budget
static void admit(serve_engine *e, int row_budget) {
    while (e->queue_head && e->n_active < e->o.max_seqs &&
           e->kv_used + e->queue_head->reserved <= e->o.kv_tokens && e->n_active < row_budget) {
        serve_seq *s = e->queue_head;
        queue_remove(e, s);
        int slot = 0;
        while (e->active[slot]) slot++;
        e->active[slot] = s, s->slot = slot;
        s->state = SERVE_PREFILL, s->fed = 0, s->pos = 0;
        e->n_active++, e->kv_used += s->reserved;
    }
}

// The rows a step may take: --max-batch-tokens, and with --max-expert-rows R, R / rho.
static int row_budget(const serve_engine *e) {
    int budget = e->o.max_batch_tokens;
    if (e->o.max_expert_rows > 0 && e->rho > 0) {
        const double b = e->o.max_expert_rows / e->rho;
        if (b < budget) budget = b < 1 ? 1 : (int)b;
    }
    return budget;
}

// (mutex held) the step's rows: the decoding sequences' next tokens first, then prompt chunks;
// slots visited from a rotating start, so that none waits behind the others every step
static int build_rows(serve_engine *e, int budget) {
    int n = 0;
    const int S = e->o.max_seqs, start = (int)(e->steps % S);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < S && n < budget; i++) {
            serve_seq *s = e->active[(start + i) % S];
            if (!s || s->finish) continue;
            if (pass == 0 && s->state == SERVE_DECODE) {
                e->rows_tok[n] = s->last, e->rows_slot[n] = s->slot, e->rows_pos[n] = s->pos;
                e->rows_seq[n] = s, e->rows_sample[n] = 1;
                n++;
            } else if (pass == 1 && s->state == SERVE_PREFILL) {
                int c = s->n_prompt - s->fed;
                if (c > e->o.prefill_chunk) c = e->o.prefill_chunk;
                if (c > budget - n) c = budget - n;
                for (int j = 0; j < c; j++, n++) {
                    e->rows_tok[n] = s->prompt[s->fed + j], e->rows_slot[n] = s->slot;
                    e->rows_pos[n] = s->fed + j, e->rows_seq[n] = s;
                    e->rows_sample[n] = s->fed + j + 1 == s->n_prompt;
                }
            }
        }
    return n;
}

// (mutex held) the text of s's tokens (bytes, or the folder's tokenizer), truncated before the
// first stop string; returns 1 when one was found
static int update_text(serve_engine *e, serve_seq *s) {
    const size_t old = s->n_text;
    if (e->o.hf_tok) {
        char *t = NULL;
        size_t n = 0;
        if (moe_hf_tokenizer_decode(e->o.tok_dir, s->out, s->n_out, &t, &n)) return 0;
        free(s->text);
        s->text = t, s->n_text = n;
    } else {
        char *t = realloc(s->text, (size_t)s->n_out + 1);
        if (!t) return 0;
        s->text = t;
        moe_byte_detokenize(s->text + s->n_text, s->out + s->n_out - 1, 1);
        s->n_text++;
        s->text[s->n_text] = 0;
    }
    for (int i = 0; i < s->n_stop; i++) {
        const size_t k = strlen(s->stop[i]);
        const size_t from = old >= k ? old - k + 1 : 0; // a match ending in the new text
        for (size_t at = from; at + k <= s->n_text; at++)
            if (!memcmp(s->text + at, s->stop[i], k)) {
                s->n_text = at;
                s->text[at] = 0;
                return 1;
            }
    }
    return 0;
}

// (mutex held) row r's logits (host) sampled into its sequence
static void take_token(serve_engine *e, serve_seq *s, const real *logits, double now) {
    const int V = e->m->cfg.vocab_size;
    const long bad = infer_first_nonfinite(logits, (size_t)V);
    if (bad >= 0) {
        snprintf(s->error, sizeof s->error, "non-finite logit (%g) for token id %ld at position %d",
                 (double)logits[bad], bad, s->pos);
        seq_finish(e, s, SERVE_FINISH_ERROR);
        return;
    }
    const int tok = infer_sample(logits, V, s->temperature, s->top_k, s->top_p, &s->rng, e->cand);
    s->out[s->n_out++] = s->last = tok;
    pthread_mutex_lock(&e->metrics->mu);
    serve_hist_observe(s->n_out == 1 ? &e->metrics->ttft : &e->metrics->itl,
                       now - (s->n_out == 1 ? s->t_arrival : s->t_last));
    e->metrics->generated_tokens++;
    pthread_mutex_unlock(&e->metrics->mu);
    if (s->n_out == 1) s->t_first = now;
    s->t_last = now;
    s->state = SERVE_DECODE;
    if (update_text(e, s))
        seq_finish(e, s, SERVE_FINISH_STOP);
    else if (s->n_out >= s->max_tokens || s->pos >= e->o.max_pos)
        seq_finish(e, s, SERVE_FINISH_LENGTH);
}

// The step's load into the metrics: routed counts, each expert's rows, the expert phase's
// time and the hottest expert's estimated share of it, the hot share of the --stats windows;
// and rho, the hottest expert's rows per token, for the next steps' budget.
static void record_step(serve_engine *e, int n, double dt, double expert_s) {
    const moe_model *m = e->m;
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    serve_metrics *mt = e->metrics;
    double worst = 0, hot_frac = 0;
    pthread_mutex_lock(&mt->mu);
    serve_hist_observe(&mt->step, dt);
    serve_hist_observe(&mt->expert_s, expert_s);
    for (int l = 0; l < L; l++) {
        if (!mt->is_moe[l]) continue;
        long all = 0, hot = 0;
        for (int x = 0; x < E; x++) {
            const long c = m->step_hits[(size_t)l * E + x];
            mt->routed[(size_t)l * E + x] += c;
            serve_hist_observe(&mt->expert_rows, (double)c);
            all += c, hot = c > hot ? c : hot;
        }
        if ((double)hot / n > worst) worst = (double)hot / n;
        if (all && (double)hot / all > hot_frac) hot_frac = (double)hot / all;
    }
    serve_hist_observe(&mt->hot_expert_s, expert_s * hot_frac);
    const moe_serve_stats *ss = &e->stats;
    if (ss->n_win > 0) { // the --stats windows: the last one's mean hot share, its change
        mt->windows = (int)ss->n_win;
        for (int l = 0; l < L; l++) {
            const double now = ss->win_mean_hot[(ss->n_win - 1) * L + l];
            mt->hot_share[l] = now;
            mt->hot_change[l] = ss->n_win > 1 ? now - ss->win_mean_hot[(ss->n_win - 2) * L + l] : 0;
        }
    }
    pthread_mutex_unlock(&mt->mu);
    e->rho = e->rho > 0 ? 0.8 * e->rho + 0.2 * worst : worst;
}

// One step: build the rows (locked), run the forward (unlocked), sample and advance (locked).
static void step(serve_engine *e, moe_timer *timer) {
    const int budget = row_budget(e);
    const int n = build_rows(e, budget);
    int decode_rows = 0;
    for (int r = 0; r < n; r++) decode_rows += e->rows_seq[r]->state == SERVE_DECODE;
    pthread_mutex_unlock(&e->mu);

    moe_model *m = e->m;
    const int V = m->cfg.vocab_size;
    const double x0 = timer->s[MOE_T_EXPERTS], t0 = moe_clock_s();
    moe_status st = moe_model_decode_batch(m, e->rows_tok, n, e->rows_slot, e->rows_pos);
    if (!st && m->be->synchronize) m->be->synchronize(m->be);
    const double dt = moe_clock_s() - t0;
    if (!st)
        st = moe_serve_stats_step(&e->stats, m, decode_rows ? MOE_SERVE_DECODE : MOE_SERVE_PREFILL,
                                  n, dt);
    char err[256] = "";
    if (st)
        snprintf(err, sizeof err, "%s", moe_last_error());
    else
        record_step(e, n, dt, timer->s[MOE_T_EXPERTS] - x0);

    pthread_mutex_lock(&e->mu);
    const double now = moe_clock_s();
    long prompt_rows = 0;
    for (int r = 0; r < n; r++) {
        serve_seq *s = e->rows_seq[r];
        if (s->state == SERVE_DONE || s->finish == SERVE_FINISH_CANCELLED) continue;
        if (st) {
            snprintf(s->error, sizeof s->error, "%s", err);
            seq_finish(e, s, SERVE_FINISH_ERROR);
            continue;
        }
        if (s->state == SERVE_PREFILL) s->fed++, prompt_rows++;
        s->pos++;
        if (!e->rows_sample[r]) continue;
        m->be->copy_to_host(m->be, e->logits, m->logits + (size_t)r * V, (size_t)V * sizeof(real));
        take_token(e, s, e->logits, now);
    }
    pthread_mutex_lock(&e->metrics->mu);
    e->metrics->prompt_tokens += prompt_rows;
    pthread_mutex_unlock(&e->metrics->mu);
    e->steps++;
    pthread_cond_broadcast(&e->done);
}

// (mutex held) sequences the clients abandoned, or all of them when stopping for good
static void end_cancelled(serve_engine *e, int all) {
    for (int i = 0; i < e->o.max_seqs; i++) {
        serve_seq *s = e->active[i];
        if (s && (s->finish == SERVE_FINISH_CANCELLED || all))
            seq_finish(e, s,
                       all && s->finish != SERVE_FINISH_CANCELLED ? SERVE_FINISH_SHUTDOWN
                                                                  : SERVE_FINISH_CANCELLED);
    }
    while (all && e->queue_head) {
        serve_seq *s = e->queue_head;
        queue_remove(e, s);
        seq_finish(e, s, SERVE_FINISH_SHUTDOWN);
    }
}

static void *engine_main(void *arg) {
    serve_engine *e = arg;
    moe_timer timer = {.be = e->m->be};
    moe_model_set_timer(e->m, &timer);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        end_cancelled(e, e->stopping);
        if (e->stopping && !e->n_active && !e->n_queued) break;
        admit(e, row_budget(e));
        metrics_gauges(e);
        if (!e->n_active) {
            pthread_cond_wait(&e->work, &e->mu);
            continue;
        }
        step(e, &timer);
    }
    metrics_gauges(e);
    pthread_mutex_unlock(&e->mu);
    moe_model_set_timer(e->m, NULL);
    return NULL;
}

// ---- start, stop -------------------------------------------------------------------------

moe_status serve_engine_start(serve_engine *e, moe_model *m, const serve_engine_opts *o,
                              serve_metrics *metrics, const char *stats_out) {
    memset(e, 0, sizeof *e);
    e->m = m, e->o = *o, e->metrics = metrics;
    const int R = o->max_batch_tokens, V = m->cfg.vocab_size;
    e->active = calloc((size_t)o->max_seqs, sizeof *e->active);
    e->logits = malloc((size_t)V * sizeof(real));
    e->cand = malloc(infer_sample_scratch_bytes(V));
    e->rows_tok = malloc((size_t)R * sizeof(int));
    e->rows_slot = malloc((size_t)R * sizeof(int));
    e->rows_pos = malloc((size_t)R * sizeof(int));
    e->rows_sample = malloc((size_t)R * sizeof(int));
    e->rows_seq = malloc((size_t)R * sizeof(serve_seq *));
    if (!e->active || !e->logits || !e->cand || !e->rows_tok || !e->rows_slot || !e->rows_pos ||
        !e->rows_sample || !e->rows_seq)
        return moe_error(MOE_ENOMEM, "serve: out of memory");
    moe_status st = moe_serve_stats_init(&e->stats, m, o->stats_window, stats_out);
    if (st) return st;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->done, NULL);
    metrics_gauges(e); // (no other thread yet)
    if (pthread_create(&e->thread, NULL, engine_main, e))
        return moe_error(MOE_ENOMEM, "serve: cannot start the engine thread");
    e->running = 1;
    return MOE_OK;
}

void serve_engine_stop(serve_engine *e, double grace_s, FILE *stats_out) {
    if (!e->running) return;
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    const double until = moe_clock_s() + grace_s;
    while ((e->n_active || e->n_queued) && moe_clock_s() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&e->done, &e->mu, &ts);
    }
    e->stopping = 1; // what is left ends now (SERVE_FINISH_SHUTDOWN)
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->running = 0;
    if (stats_out && e->stats.n) moe_serve_stats_finish(&e->stats, stats_out);
    moe_serve_stats_free(&e->stats);
    free(e->active), free(e->logits), free(e->cand), free(e->rows_tok), free(e->rows_slot);
    free(e->rows_pos), free(e->rows_sample), free(e->rows_seq);
    // (the mutex and conditions stay: the HTTP threads still release their references)
}
