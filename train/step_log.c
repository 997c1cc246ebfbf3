// The per-step records of a run (train/step_log.h): the step's MoE load, its metrics.jsonl and
// expert_load.jsonl records, the load alert and the console line.
#include "train/step_log.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/timing.h"
#include "train/log.h"
#include "train/trainer_internal.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double moe_step_log_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void moe_step_load_reset(moe_step_load *s, int L, int E) {
    memset(s->routed, 0, (size_t)L * E * sizeof(long));
    memset(s->kept, 0, (size_t)L * E * sizeof(long));
    memset(s->entropy, 0, (size_t)L * sizeof(double));
    memset(s->aux, 0, (size_t)L * sizeof(double));
    memset(s->seq_aux, 0, (size_t)L * sizeof(double));
    memset(s->z, 0, (size_t)L * sizeof(double));
    s->micro = 0;
}

void moe_step_load_add(moe_step_load *s, const moe_model *m) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    for (int l = 0; l < L; l++) {
        const moe_stats *st = &m->moe_stats[l];
        if (!moe_model_layer_is_moe(&m->cfg, l)) continue; // a dense layer routes nothing
        for (int e = 0; e < E; e++) {                      // slot e, global expert g
            const size_t g = (size_t)moe_model_expert_global(m, e);
            s->routed[(size_t)l * E + g] += st->routed[e];
            s->kept[(size_t)l * E + g] += st->kept[e];
            s->micro_routed[((size_t)s->micro * L + l) * E + g] = st->routed[e];
        }
        s->entropy[l] += st->entropy;
        s->aux[l] += st->aux;
        s->seq_aux[l] += st->seq_aux;
        s->z[l] += st->z;
    }
    s->micro++;
}

void moe_alert_window_free(moe_alert_window *w) {
    free(w->step), free(w->mom), free(w->hot), free(w->last_seen), free(w->scratch), free(w->votes);
    memset(w, 0, sizeof *w);
}

int moe_alert_window_init(moe_alert_window *w, int64_t W, int L, int E) {
    memset(w, 0, sizeof *w);
    w->W = W;
    w->step = calloc((size_t)W, sizeof *w->step);
    w->mom = calloc((size_t)L * W, sizeof *w->mom);
    w->hot = calloc((size_t)L * W, sizeof *w->hot);
    w->last_seen = calloc((size_t)L * E, sizeof *w->last_seen);
    w->scratch = calloc((size_t)W, sizeof *w->scratch);
    w->votes = calloc((size_t)E, sizeof *w->votes);
    if (w->step && w->mom && w->hot && w->last_seen && w->scratch && w->votes) return 0;
    moe_alert_window_free(w);
    return -1;
}

// The verdict of layer l on the window ending with the latest push (w->n == W).
static moe_alert_verdict alert_window_eval(moe_alert_window *w, int l, int E, double threshold) {
    moe_alert_verdict v = {0};
    const int64_t W = w->W;
    v.from = w->step[w->head], v.to = w->step[(w->head + W - 1) % W];
    memcpy(w->scratch, w->mom + (size_t)l * W, (size_t)W * sizeof *w->scratch);
    v.median = moe_step_log_median(w->scratch, (int)W);
    v.overload = v.median > threshold;
    memset(w->votes, 0, (size_t)E * sizeof *w->votes);
    for (int64_t i = 0; i < W; i++) w->votes[w->hot[(size_t)l * W + i]]++;
    for (int e = 1; e < E; e++)
        if (w->votes[e] > w->votes[v.expert]) v.expert = e;
    size_t len = 0;
    for (int e = 0; e < E; e++) {
        if (w->last_seen[(size_t)l * E + e] >= v.from) continue;
        if (v.n_dead++ < 16 && len < sizeof v.dead_list)
            len += (size_t)snprintf(v.dead_list + len, sizeof v.dead_list - len, " %d", e);
    }
    if (v.n_dead > 16 && len < sizeof v.dead_list)
        snprintf(v.dead_list + len, sizeof v.dead_list - len, " ...");
    return v;
}

// Test-only (tests/train/alerts.sh): MOE_TEST_LOAD_MOM="A-B:V[,A-B:V]..." makes the alert
// rule see layer 0's max/mean as V on steps A..B (the logs keep the measured value).
static double test_load_override(int64_t step, double mom) {
    const char *spec = getenv("MOE_TEST_LOAD_MOM");
    while (spec && *spec) {
        long long a, b;
        double v;
        int used = 0;
        if (sscanf(spec, "%lld-%lld:%lf%n", &a, &b, &v, &used) != 3) break;
        if (step >= a && step <= b) return v;
        spec += used;
        if (*spec == ',') spec++;
    }
    return mom;
}

// The console line's ETA: "42s", "3m07s", "2h05m".
static void format_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

// Layer l's exchanges in the step, from every rank (collective): exchange_bytes = the bytes
// that crossed between ranks, exchange_s = the longest time a rank spent in them; per rank its
// time (the straggler signal: a rank that waits long waits for a hot one), the rows its
// experts received, and the R x R matrix of bytes rank i sent to rank j.
static void trainer_log_exchange(trainer *t, int l, cJSON *rec) {
    const moe_layer *L = &t->m.moe[moe_model_moe_index(&t->m.cfg, l)];
    const int R = t->R, ep = L->ep_size, group0 = t->rank / ep * ep;
    double *mine = calloc((size_t)R + 2, sizeof(double)),
           *all = malloc((size_t)R * (R + 2) * sizeof(double));
    if (!mine || !all) moe_fatal("trainer: out of memory");
    // (ep_size 1, data parallelism only: no exchange, no sent_bytes; nothing crossed)
    for (int j = 0; j < ep && L->sent_bytes; j++) mine[group0 + j] = (double)L->sent_bytes[j];
    mine[R] = (double)L->received_rows, mine[R + 1] = L->exchange_s;
    t->world->allgather(t->world, all, mine, (size_t)(R + 2) * sizeof(double));
    double crossed = 0, longest = 0;
    cJSON *matrix = cJSON_CreateArray(), *rows = cJSON_CreateArray(), *wait = cJSON_CreateArray();
    for (int i = 0; i < R; i++) {
        const double *r = all + (size_t)i * (R + 2);
        cJSON *row = cJSON_CreateArray();
        for (int j = 0; j < R; j++) {
            cJSON_AddItemToArray(row, cJSON_CreateNumber(r[j]));
            if (j != i) crossed += r[j];
        }
        cJSON_AddItemToArray(matrix, row);
        cJSON_AddItemToArray(rows, cJSON_CreateNumber(r[R]));
        cJSON_AddItemToArray(wait, cJSON_CreateNumber(r[R + 1]));
        longest = r[R + 1] > longest ? r[R + 1] : longest;
    }
    cJSON_AddNumberToObject(rec, "exchange_bytes", crossed);
    cJSON_AddNumberToObject(rec, "exchange_s", longest);
    cJSON_AddItemToObject(rec, "exchange_wait_s", wait);
    cJSON_AddItemToObject(rec, "received_rows", rows);
    cJSON_AddItemToObject(rec, "exchange_matrix", matrix);
    free(mine), free(all);
}

// The hot-expert path of layer l on this rank: its experts' seconds in the step (forward and
// backward GEMMs and SwiGLU), apportioned to its local experts by the rows each computed:
// "expert_s" {"max", "max_expert", "min", "min_expert", "all"}. An estimate: one grouped call
// computes every local expert, so their times are not measured apart.
static void trainer_log_expert_time(trainer *t, int l, cJSON *rec) {
    const moe_layer *L = &t->m.moe[moe_model_moe_index(&t->m.cfg, l)];
    const long *kept = t->sl.kept + (size_t)l * t->E; // global order
    long rows = 0;
    int hot = -1, cold = -1; // global experts of this rank's slots
    for (int s = t->m.expert0; s < t->m.expert0 + t->m.E_local; s++) {
        const int e = moe_model_expert_global(&t->m, s);
        rows += kept[e];
        if (hot < 0 || kept[e] > kept[hot]) hot = e;
        if (cold < 0 || kept[e] < kept[cold]) cold = e;
    }
    cJSON *o = cJSON_AddObjectToObject(rec, "expert_s");
    cJSON_AddNumberToObject(o, "max", rows ? L->experts_s * kept[hot] / rows : 0);
    cJSON_AddNumberToObject(o, "max_expert", hot);
    cJSON_AddNumberToObject(o, "min", rows ? L->experts_s * kept[cold] / rows : 0);
    cJSON_AddNumberToObject(o, "min_expert", cold);
    cJSON_AddNumberToObject(o, "all", L->experts_s);
}

// Layer l's expert_load.jsonl record of the step.
static moe_status trainer_log_layer(trainer *t, const step_result *s, int l, double mom, double cv,
                                    long dropped) {
    const int L = t->L, E = t->E;
    const moe_step_load *sl = &t->sl;
    const long *routed = sl->routed + (size_t)l * E, *kept = sl->kept + (size_t)l * E;
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddNumberToObject(rec, "step", (double)s->step + 1);
    cJSON_AddNumberToObject(rec, "layer", l);
    cJSON_AddNumberToObject(rec, "tokens", (double)t->T * sl->micro);
    cJSON_AddNumberToObject(rec, "capacity", t->m.moe_stats[l].capacity);
    cJSON_AddItemToObject(rec, "counts", moe_json_int_array(routed, E));
    cJSON_AddItemToObject(rec, "kept", moe_json_int_array(kept, E));
    if (sl->micro > 1) {
        cJSON *micro = cJSON_AddArrayToObject(rec, "micro_counts");
        for (int i = 0; i < sl->micro; i++)
            cJSON_AddItemToArray(micro,
                                 moe_json_int_array(sl->micro_routed + ((size_t)i * L + l) * E, E));
    }
    cJSON_AddNumberToObject(rec, "dropped", (double)dropped);
    cJSON_AddNumberToObject(rec, "max_over_mean", mom);
    cJSON_AddNumberToObject(rec, "cv", cv);
    cJSON_AddNumberToObject(rec, "entropy", sl->entropy[l] / sl->micro);
    cJSON_AddNumberToObject(rec, "aux", sl->aux[l] / sl->micro);
    cJSON_AddNumberToObject(rec, "z", sl->z[l] / sl->micro);
    cJSON_AddNumberToObject(rec, "seq_aux", sl->seq_aux[l] / sl->micro);
    if (t->m.router_bias) {
        real *b = malloc((size_t)E * sizeof(real));
        if (!b) {
            cJSON_Delete(rec);
            return moe_error(MOE_ENOMEM, "trainer: out of memory");
        }
        t->be->copy_to_host(t->be, b, t->m.router_bias + (size_t)l * E, (size_t)E * sizeof(real));
        moe_model_placement_permute(&t->m, b, 1, 1, 1); // global expert order
        cJSON *arr = cJSON_AddArrayToObject(rec, "bias");
        for (int e = 0; e < E; e++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(b[e]));
        free(b);
    } else {
        cJSON_AddNullToObject(rec, "bias");
    }
    const moe_stats *ms = &t->m.moe_stats[l]; // router logits: the step's last micro-batch
    cJSON_AddNumberToObject(rec, "logit_mean", ms->logit_mean);
    cJSON_AddNumberToObject(rec, "logit_std", ms->logit_std);
    cJSON_AddNumberToObject(rec, "logit_max_abs", ms->logit_max_abs);
    cJSON_AddNumberToObject(rec, "lse_mean", ms->lse_mean);
    if (t->cfg->timing) trainer_log_expert_time(t, l, rec);
    if (s->coact_log) { // the upper triangle, row by row: (0,1), (0,2), ..., (E-2, E-1)
        cJSON *c = cJSON_AddArrayToObject(rec, "coactivation");
        const long *m = t->coact + (size_t)l * E * E;
        for (int i = 0; i < E; i++)
            for (int j = i + 1; j < E; j++)
                cJSON_AddItemToArray(c, cJSON_CreateNumber((double)m[(size_t)i * E + j]));
        cJSON_AddNumberToObject(rec, "coactivation_steps", (double)t->coact_steps);
    }
    if (t->R > 1) {
        cJSON_AddNumberToObject(rec, "ranks", t->R); // micro_counts: grad_accum x ranks groups
        trainer_log_exchange(t, l, rec);
    } else {
        cJSON_AddNumberToObject(rec, "exchange_bytes", 0);
        cJSON_AddNumberToObject(rec, "exchange_s", 0);
    }
    return moe_jsonl_write(&t->load_log, rec);
}

// Expert load, one record per MoE layer; the load alert's window gets the step's values;
// the result sums the run's counts.
moe_status moe_trainer_log_load(trainer *t, step_result *s) {
    const int L = t->L, E = t->E;
    moe_alert_window *aw = &t->aw;
    double drop_sum = 0, routed_sum = 0;
    moe_status st;
    s->worst_mom = 0, s->worst_layer = 0;
    const int64_t step = s->step;
    s->coact_log = t->coact && ((step + 1) % t->cfg->interval == 0 || step + 1 == t->cfg->steps);
    if (s->coact_log && t->R > 1) // every rank's tokens
        t->world->allreduce_sum_long(t->world, t->coact, (size_t)L * E * E);
    for (int l = 0; l < L; l++) {
        if (!moe_model_layer_is_moe(&t->m.cfg, l)) continue; // dense: no load, no record
        const long *routed = t->sl.routed + (size_t)l * E, *kept = t->sl.kept + (size_t)l * E;
        double mom, cv;
        int hot;
        moe_load_summary(routed, E, &mom, &cv, &hot);
        long dropped = 0, total = 0;
        for (int e = 0; e < E; e++) dropped += routed[e] - kept[e], total += routed[e];
        drop_sum += dropped, routed_sum += total;
        if (mom > s->worst_mom) s->worst_mom = mom, s->worst_layer = l;
        for (int e = 0; e < E; e++) // the load alert's window (pushed after the layers)
            if (routed[e] > 0) aw->last_seen[(size_t)l * E + e] = s->step + 1;
        aw->mom[(size_t)l * aw->W + aw->head] = l == 0 ? test_load_override(s->step + 1, mom) : mom;
        aw->hot[(size_t)l * aw->W + aw->head] = hot;
        if ((st = trainer_log_layer(t, s, l, mom, cv, dropped))) return st;
    }
    if (s->coact_log) {
        memset(t->coact, 0, (size_t)L * E * E * sizeof *t->coact);
        t->coact_steps = 0;
    }
    s->drop_frac = routed_sum > 0 ? drop_sum / routed_sum : 0;
    s->tok_per_s = (double)t->T * t->cfg->grad_accum * t->R / s->dt; // all ranks' tokens
    for (size_t i = 0; i < (size_t)L * E; i++)
        t->res.routed[i] += t->sl.routed[i], t->res.kept[i] += t->sl.kept[i];
    for (int l = 0; l < L; l++) t->res.last_stats[l] = t->m.moe_stats[l];
    if (s->step > t->start_step) t->step_tps[t->n_tps++ % TPS_WINDOW] = s->tok_per_s;
    return MOE_OK;
}

// metrics.jsonl's "time": this rank's seconds per phase of the step (layers/timing.h; forward
// and backward of every micro-batch), the optimizer's, the exchanges' (the MoE layers' time in
// them: waiting included), the validation's, and the checkpoint save after the previous step.
static void trainer_log_time(trainer *t, const step_result *s, cJSON *rec) {
    cJSON *o = cJSON_AddObjectToObject(rec, "time");
    for (int p = 0; p < MOE_T_PHASES; p++)
        cJSON_AddNumberToObject(o, moe_phase_names[p], t->timer.s[p]);
    double exchange = 0;
    for (int j = 0; j < t->m.n_moe; j++) exchange += t->m.moe[j].exchange_s;
    cJSON_AddNumberToObject(o, "optimizer", s->optimizer_s);
    cJSON_AddNumberToObject(o, "exchange_wait", exchange);
    cJSON_AddNumberToObject(o, "validation", s->evaluated ? s->val_s : 0);
    cJSON_AddNumberToObject(o, "checkpoint", t->ckpt_s);
    t->ckpt_s = 0;
}

// The step's metrics.jsonl record.
moe_status moe_trainer_log_metrics(trainer *t, const step_result *s) {
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddNumberToObject(rec, "step", (double)s->step + 1);
    cJSON_AddNumberToObject(rec, "loss", s->loss);
    cJSON_AddNumberToObject(rec, "ce", s->ce);
    cJSON_AddNumberToObject(rec, "aux", s->aux);
    cJSON_AddNumberToObject(rec, "z", s->z);
    cJSON_AddNumberToObject(rec, "lr", s->lr);
    cJSON_AddNumberToObject(rec, "grad_norm", s->grad_norm);
    cJSON_AddNumberToObject(rec, "tokens_per_s", s->tok_per_s);
    cJSON_AddNumberToObject(rec, "step_s", s->dt);
    cJSON_AddNumberToObject(rec, "max_over_mean", s->worst_mom);
    cJSON_AddNumberToObject(rec, "drop_frac", s->drop_frac);
    cJSON_AddNumberToObject(rec, "skipped_total", (double)t->res.skipped);
    if (s->evaluated) cJSON_AddNumberToObject(rec, "val_loss", s->val_loss);
    cJSON_AddNumberToObject(rec, "capacity_factor", s->capacity_factor);
    if (t->cfg->timing) trainer_log_time(t, s, rec);
    if (s->capacity_decided) {
        const moe_capacity_decision *d = &s->capacity;
        cJSON *c = cJSON_AddObjectToObject(rec, "capacity_decision");
        cJSON_AddNumberToObject(c, "old", d->old_factor);
        cJSON_AddNumberToObject(c, "new", d->new_factor);
        cJSON_AddNumberToObject(c, "p99_need", d->p99);
        cJSON_AddNumberToObject(c, "layer", d->p99_layer);
        cJSON_AddStringToObject(c, "why", d->why);
    }
    return moe_jsonl_write(&t->metrics, rec);
}

// train.load_alert_action = "stop": the error of the first step in alert.
static moe_status alert_stop(const moe_train_config *cfg, int64_t step, int l,
                             const moe_alert_verdict *v) {
    char why[400];
    if (v->overload)
        snprintf(why, sizeof why,
                 "median max/mean load %.2f over steps %lld-%lld, hottest expert %d "
                 "(log.load_alert = %.2f",
                 v->median, v->from, v->to, v->expert, cfg->load_alert);
    else
        snprintf(why, sizeof why, "%d dead expert%s (no token in steps %lld-%lld):%s (", v->n_dead,
                 v->n_dead == 1 ? "" : "s", v->from, v->to, v->dead_list);
    return moe_error(MOE_ENUMERIC,
                     "stopping at step %lld: layer %d: %s%slog.alert_window = %lld, "
                     "log.alert_after = %lld, train.load_alert_action = \"stop\")",
                     (long long)step + 1, l, why, v->overload ? ", " : "",
                     (long long)cfg->alert_window, (long long)cfg->alert_after);
}

// The load alert: past the grace, the step enters the window; on a full window each layer's
// verdict stops the run ("stop") or is kept for the next console line ("warn").
moe_status moe_trainer_alerts(trainer *t, int64_t step) {
    const moe_train_config *cfg = t->cfg;
    moe_alert_window *aw = &t->aw;
    if (step + 1 > cfg->alert_after) {
        aw->step[aw->head] = step + 1;
        aw->head = (aw->head + 1) % aw->W;
        if (aw->n < aw->W) aw->n++;
    }
    for (int l = 0; aw->n == aw->W && l < t->L; l++) {
        if (!moe_model_layer_is_moe(&t->m.cfg, l)) continue;
        const moe_alert_verdict v = alert_window_eval(aw, l, t->E, cfg->load_alert);
        if (!v.overload && !v.n_dead) continue;
        if (cfg->load_alert_action == MOE_ALERT_STOP) return alert_stop(cfg, step, l, &v);
        moe_load_alert *a = &t->alerts[l];
        if (v.overload) {
            if (!a->n_load || v.median > a->load.median) a->load = v, a->step = step + 1;
            a->n_load++;
        }
        if (v.n_dead) a->dead = v, a->dead_step = step + 1, a->n_dead++;
    }
    return MOE_OK;
}

// The warnings of the layers in alert since the last console line, then a fresh count.
static void trainer_print_alerts(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    for (int l = 0; l < t->L; l++) {
        const moe_load_alert *a = &t->alerts[l];
        if (a->n_load)
            fprintf(stderr,
                    "warning: step %lld layer %d: median max/mean load %.2f over steps "
                    "%lld-%lld, hottest expert %d (log.load_alert = %.2f; %lld step%s in "
                    "alert since the last report)\n",
                    a->step, l, a->load.median, a->load.from, a->load.to, a->load.expert,
                    cfg->load_alert, a->n_load, a->n_load == 1 ? "" : "s");
        if (a->n_dead)
            fprintf(stderr,
                    "warning: step %lld layer %d: %d dead expert%s (no token in steps "
                    "%lld-%lld):%s (%lld step%s in alert since the last report)\n",
                    a->dead_step, l, a->dead.n_dead, a->dead.n_dead == 1 ? "" : "s", a->dead.from,
                    a->dead.to, a->dead.dead_list, a->n_dead, a->n_dead == 1 ? "" : "s");
    }
    memset(t->alerts, 0, (size_t)t->L * sizeof *t->alerts);
}

// The console line, every log.interval steps, at the first, the last and on validation.
void moe_trainer_print_step(trainer *t, const step_result *s) {
    const moe_train_config *cfg = t->cfg;
    const int64_t step = s->step;
    if (!((step + 1) % cfg->interval == 0 || step == 0 || step + 1 == cfg->steps || s->evaluated))
        return;
    char eta[32];
    const double elapsed = moe_clock_s() - t->t_start;
    format_duration(eta, sizeof eta,
                    elapsed / (step + 1 - t->start_step) * (cfg->steps - step - 1));
    printf("step %5lld/%lld | loss %.4f (ce %.4f aux %.4f z %.4f) | lr %.2e | gnorm %.3f | "
           "%.0f tok/s | ETA %s | load max/mean %.2f (L%d) | drop %.2f%%",
           (long long)step + 1, (long long)cfg->steps, s->loss, s->ce, s->aux, s->z, s->lr,
           s->grad_norm, s->tok_per_s, eta, s->worst_mom, s->worst_layer, 100 * s->drop_frac);
    if (s->evaluated) printf(" | val %.4f", s->val_loss);
    printf("\n");
    fflush(stdout);
    trainer_print_alerts(t); // warn ("stop" acted in moe_trainer_alerts, on every step)
}
