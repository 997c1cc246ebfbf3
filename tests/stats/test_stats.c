// `moe stats` and scripts/plot_load.py on a hand-made run directory whose answers are known.
//
// The run (written by write_run): config E=4 experts, top-2, 2 MoE layers, micro-batch
// T = 4 x 64 = 256 tokens (512 assignments), capacity_factor 1.25 -> C = 160; 200 logged
// records r = 1..200 at steps r (r <= 54) and r + 2 (steps 55 and 56 are skipped steps:
// in metrics.jsonl only).
//   layer 0: counts [128]*4, except r = 10j (j = 1..12): [128+9j, 128-3j, 128-3j, 128-3j];
//            entropy 1.38 - 0.001*(r%7), aux 0.01 + 1e-5*r, z 0.002 + 1e-6*r (entropy and z
//            null at r = 7); exchange_s 0.01; max_over_mean written as 0 (it must be
//            recomputed from the counts) and cv as null.
//   layer 1: counts [168,120,112,112] for r <= 100, then [256,128,128,0] (expert 3 dead in
//            the last window, drops rising from 1.56% to 18.75%); entropy 1.2, aux 0.011 then
//            0.02, z 0.003, exchange_s 0 or absent; no logit_* fields (an older log).
//   kept = min(counts, 160), dropped = sum(counts - kept); metrics step_s = 0.1 + 0.001*(step%3).
// The expected numbers were computed independently with numpy (1.24) from this description:
//   import numpy as np, math
//   R = np.arange(1, 201); step = np.where(R <= 54, R, R + 2)
//   l0 = lambda r: [128+9*(r//10)] + [128-3*(r//10)]*3 if r % 10 == 0 and r <= 120 else [128]*4
//   l1 = lambda r: [168, 120, 112, 112] if r <= 100 else [256, 128, 128, 0]
//   c = np.array([l0(r) for r in R], float)                  # (l1 for layer 1)
//   mom = c.max(1)/c.mean(1); mom.mean(); np.percentile(mom, 95); np.percentile(mom, 99)
//   np.median(mom[-100:]); (c.std(1)/c.mean(1)).mean()
//   last = c[-100:].sum(0); last.argmax(); last.max()/last.sum(); np.where(last == 0)
//   d = (c - np.minimum(c, 160)).sum(1); r = c.sum(1); d[:100].sum()/r[:100].sum()
//   ent = [nan if r == 7 else 1.38-0.001*(r%7) for r in R]; np.nanmean(ent)/math.log(4)
//   200*0.01 / (0.1 + 0.001*(step % 3)).sum()                # exchange share, layer 0
//   need = [min(C for C in range(1, 513) if np.maximum(0, x-C).sum() <= 0.01*x.sum()) for x in c]
//   cf = np.array(need)*4/(256*2); p99 = np.percentile(cf, 99); math.ceil(128*p99); cf.max()
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layers/moe.h"
#include "test_util.h"
#include "stats/stats.h"

#define N_REC 200

static long rec_step(int r) { return r <= 54 ? r : r + 2; }

static void counts_of(int layer, int r, long c[4]) {
    if (layer == 0) {
        for (int e = 0; e < 4; e++) c[e] = 128;
        if (r % 10 == 0 && r <= 120) {
            const long j = r / 10;
            c[0] = 128 + 9 * j;
            c[1] = c[2] = c[3] = 128 - 3 * j;
        }
    } else if (r <= 100) {
        const long v[4] = {168, 120, 112, 112};
        memcpy(c, v, sizeof v);
    } else {
        const long v[4] = {256, 128, 128, 0};
        memcpy(c, v, sizeof v);
    }
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "test_stats: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static FILE *open_in(const char *dir, const char *name, const char *mode) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, mode);
    if (!f) die("cannot open", path);
    return f;
}

static void null_or(FILE *f, const char *key, int is_null, double v) {
    if (is_null)
        fprintf(f, ",\"%s\":null", key);
    else
        fprintf(f, ",\"%s\":%.17g", key, v);
}

// The hand-made run; grad_accum n > 1 writes counts summed over n equal micro-batches.
// micro: also log each micro-batch's own counts ("micro_counts", as the trainer does when
// grad_accum > 1); here the micro-batches are equal, so the answers match the equal-share guess.
static void write_run(const char *dir, int grad_accum, double capacity_factor, int micro) {
    if (mkdir(dir, 0777) && errno != EEXIST) die("cannot create", dir);
    FILE *f = open_in(dir, "config.cfg", "w");
    fprintf(f,
            "# hand-made run for the stats tests\n"
            "model = { d_model = 32; d_ff = 64; n_layers = 2; n_heads = 4; n_experts = 4;\n"
            "          top_k = 2; max_seq_len = 64; capacity_factor = %.17g; };\n"
            "train = { batch_size = 4; seq_len = 64; grad_accum = %d; steps = 202;\n"
            "          warmup_steps = 10; };\n",
            capacity_factor, grad_accum);
    fclose(f);

    f = open_in(dir, "expert_load.jsonl", "w");
    const long n = grad_accum;
    for (int r = 1; r <= N_REC; r++) {
        for (int layer = 0; layer < 2; layer++) {
            long c[4], kept[4], dropped = 0;
            counts_of(layer, r, c);
            for (int e = 0; e < 4; e++) {
                kept[e] = c[e] < 160 ? c[e] : 160;
                dropped += c[e] - kept[e];
            }
            fprintf(f, "{\"step\":%ld,\"layer\":%d,\"tokens\":%ld,\"capacity\":%d,", rec_step(r),
                    layer, 256 * n, capacity_factor > 0 ? 160 : 0);
            fprintf(f, "\"counts\":[%ld,%ld,%ld,%ld],\"kept\":[%ld,%ld,%ld,%ld],\"dropped\":%ld",
                    n * c[0], n * c[1], n * c[2], n * c[3], n * kept[0], n * kept[1], n * kept[2],
                    n * kept[3], n * dropped);
            if (micro) {
                fprintf(f, ",\"micro_counts\":[");
                for (long i = 0; i < n; i++)
                    fprintf(f, "%s[%ld,%ld,%ld,%ld]", i ? "," : "", c[0], c[1], c[2], c[3]);
                fprintf(f, "]");
            }
            if (layer == 0) {
                fprintf(f, ",\"max_over_mean\":0,\"cv\":null");
                null_or(f, "entropy", r == 7, 1.38 - 0.001 * (r % 7));
                null_or(f, "aux", 0, 0.01 + 1e-5 * r);
                null_or(f, "z", r == 7, 0.002 + 1e-6 * r);
                fprintf(f, ",\"bias\":null,\"exchange_bytes\":4096,\"exchange_s\":0.01");
                fprintf(f, ",\"logit_mean\":0.1,\"logit_std\":1.5,\"logit_max_abs\":4,\"lse_mean\":"
                           "2.1}\n");
            } else {
                fprintf(f,
                        ",\"max_over_mean\":2,\"cv\":0.5,\"entropy\":1.2,\"aux\":%.17g,\"z\":0.003",
                        r <= 100 ? 0.011 : 0.02);
                fprintf(f, ",\"bias\":[0,0,0,0]%s}\n",
                        r % 2 ? "" : ",\"exchange_bytes\":0,\"exchange_s\":0");
            }
        }
    }
    fclose(f);

    f = open_in(dir, "metrics.jsonl", "w");
    for (long s = 1; s <= N_REC + 2; s++) {
        if (s == 55 || s == 56)
            fprintf(f,
                    "{\"step\":%ld,\"loss\":null,\"grad_norm\":null,\"skipped\":true,\"skipped_"
                    "total\":%ld}\n",
                    s, s - 54);
        else
            fprintf(f,
                    "{\"step\":%ld,\"loss\":3.5,\"ce\":3.4,\"aux\":0.02,\"z\":0.005,\"lr\":0.001,"
                    "\"grad_norm\":1.1,\"tokens_per_s\":2500,\"step_s\":%.17g,\"max_over_mean\":2,"
                    "\"drop_frac\":0.1,\"skipped_total\":%d%s}\n",
                    s, 0.1 + 0.001 * (double)(s % 3), s > 56 ? 2 : 0,
                    s % 100 == 0 ? ",\"val_loss\":3.6" : "");
    }
    fclose(f);
}

// Runs `moe stats` in-process; *out and *err receive the two streams (free them).
static int run_stats(char **out, char **err, int argc, ...) {
    char *argv[16];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc && i < 16; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    size_t no, ne;
    FILE *fo = open_memstream(out, &no), *fe = open_memstream(err, &ne);
    if (!fo || !fe) die("open_memstream", "");
    const int rc = stats_cli(argc, argv, fo, fe);
    fclose(fo);
    fclose(fe);
    return rc;
}

static void check_num(const char *what, double got, double want, double tol) {
    check_rel(what, &got, &want, 1, tol);
}

static const cJSON *jget(const cJSON *o, const char *path) {
    // "a.b.c"
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "."); tok && o; tok = strtok(NULL, "."))
        o = cJSON_GetObjectItemCaseSensitive(o, tok);
    return o;
}

static double jd(const cJSON *o, const char *path) {
    const cJSON *it = jget(o, path);
    if (!cJSON_IsNumber(it)) {
        printf("  %s: missing or not a number\n", path);
        return NAN;
    }
    return it->valuedouble;
}

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

// The longest line of s, in characters (bytes: the reports are ASCII).
static size_t longest_line(const char *s) {
    size_t best = 0;
    while (s && *s) {
        const size_t n = strcspn(s, "\n");
        if (n > best) best = n;
        s += n + (s[n] == '\n');
    }
    return best;
}

// ---- cases --------------------------------------------------------------------------

static void case_units(void) {
    // np.percentile([1,2,3,4], [95, 99, 50]) -> 3.85, 3.97, 2.5
    const double a[4] = {1, 2, 3, 4};
    check_num("percentile p95 of 1..4", stats_percentile_sorted(a, 4, 95), 3.85, 1e-15);
    check_num("percentile p99 of 1..4", stats_percentile_sorted(a, 4, 99), 3.97, 1e-15);
    check_num("percentile p50 of 1..4", stats_percentile_sorted(a, 4, 50), 2.5, 1e-15);
    check_num("percentile of one value", stats_percentile_sorted(a, 1, 99), 1, 0);
    check_true("percentile p100 / p0",
               stats_percentile_sorted(a, 4, 100) == 4 && stats_percentile_sorted(a, 4, 0) == 1);
    // counts [300, 100, 60, 52] (sum 512): d = 0.01 allows 5.12 -> C = 295;
    // d = 0 -> C = 300; d = 0.5 -> 256 allowed: 300-C + max(0,100-C) <= 256 -> C = 72
    const long c[4] = {300, 100, 60, 52};
    check_true("needed capacity d=0.01", stats_needed_capacity(c, 1, 4, 1, 0.01) == 295);
    check_true("needed capacity d=0", stats_needed_capacity(c, 1, 4, 1, 0) == 300);
    check_true("needed capacity d=0.5", stats_needed_capacity(c, 1, 4, 1, 0.5) == 72);
    // two groups: counts/2 = [150, 50, 30, 26]: allowed 2.56 -> C = 148
    check_true("needed capacity, 2 groups", stats_needed_capacity(c, 1, 4, 2, 0.01) == 148);
    // two micro-batches with their own counts (sum = c): [290, 10, 30, 26] and [10, 90, 30, 26].
    // d = 0: C = 290 (the equal-share guess says 150). d = 0.01 allows 5.12: C = 285 drops 5.
    const long mc[8] = {290, 10, 30, 26, 10, 90, 30, 26};
    check_true("needed capacity, 2 exact micro-batches d=0",
               stats_needed_capacity(mc, 2, 4, 1, 0) == 290);
    check_true("needed capacity, 2 exact micro-batches d=0.01",
               stats_needed_capacity(mc, 2, 4, 1, 0.01) == 285);
    const long z[4] = {0, 0, 0, 0};
    check_true("needed capacity of no tokens is 1", stats_needed_capacity(z, 1, 4, 1, 0.01) == 1);
    // the capacity factor gives back C through the model's own moe_capacity
    int ok = 1;
    const int Es[3] = {4, 8, 7}, ks[3] = {2, 2, 3}, Ts[3] = {256, 1000, 4093};
    for (int t = 0; t < 3; t++) {
        moe_config moe = moe_config_default(32, 64, Es[t], ks[t]);
        for (long C = 1; C <= Ts[t]; C++) {
            moe.capacity_factor = stats_capacity_factor(C, Ts[t], ks[t], Es[t]);
            if (moe_capacity(&moe, Ts[t], moe.capacity_factor) != C ||
                stats_capacity_of(moe.capacity_factor, Ts[t], ks[t], Es[t]) != C) {
                printf("  C=%ld E=%d k=%d T=%d: cf %.17g gives %d\n", C, Es[t], ks[t], Ts[t],
                       moe.capacity_factor, moe_capacity(&moe, Ts[t], moe.capacity_factor));
                ok = 0;
                break;
            }
        }
    }
    check_true("cf = C*E/(T*k) gives C back (moe_capacity)", ok);
}

// The report's numbers, layer by layer, and its alerts.
static void check_report_json(const char *json, int layers_expected) {
    cJSON *doc = cJSON_Parse(json);
    check_true("report --json parses", doc != NULL);
    if (!doc) return;
    check_true("steps_logged 200, steps 1..202", jd(doc, "steps_logged") == 200 &&
                                                     jd(doc, "first_step") == 1 &&
                                                     jd(doc, "last_step") == 202);
    check_true("metrics: 202 steps, 2 skipped",
               jd(doc, "metrics_steps") == 202 && jd(doc, "skipped_steps") == 2);
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(doc, "layers");
    check_true("layers array", cJSON_GetArraySize(layers) == layers_expected);
    const cJSON *L;
    cJSON_ArrayForEach(L, layers) {
        const int l = (int)jd(L, "layer");
        printf(" layer %d\n", l);
        check_true("200 steps, window 100", jd(L, "steps") == 200 && jd(L, "window") == 100);
        if (l == 0) {
            // numpy (expect.py in the header comment):
            // mom.mean(), np.percentile(mom,95), np.percentile(mom,99), np.median(mom[-100:])
            check_num("max/mean mean", jd(L, "max_over_mean.mean"), 1.027421875, 1e-12);
            check_num("max/mean p95", jd(L, "max_over_mean.p95"), 1.1441406249999988, 1e-12);
            check_num("max/mean p99", jd(L, "max_over_mean.p99"), 1.7038281249999994, 1e-12);
            check_num("max/mean median last window", jd(L, "max_over_mean.median_last_window"), 1.0,
                      1e-12);
            // (c.std(1)/c.mean(1)).mean()
            check_num("cv mean", jd(L, "cv_mean"), 0.01583202691293427, 1e-12);
            // last = c[-100:].sum(0); last.argmax(), last.max()/last.sum()
            check_true("hottest expert 0", jd(L, "hottest_expert.expert") == 0);
            check_num("hottest share", jd(L, "hottest_expert.share"), 0.25404296875, 1e-12);
            check_true("no dead experts", cJSON_GetArraySize(jget(L, "dead_experts")) == 0);
            // dropped[:100].sum()/routed[:100].sum(), dropped[-100:].sum()/routed[-100:].sum()
            check_num("drop first window", jd(L, "drop_fraction.first_window"), 0.00423828125,
                      1e-12);
            check_num("drop last window", jd(L, "drop_fraction.last_window"), 0.00279296875, 1e-12);
            // np.nanmean(ent), np.nanmean(ent)/log(4)
            check_num("entropy mean", jd(L, "entropy.mean"), 1.3769949748743717, 1e-12);
            check_num("entropy / log E", jd(L, "entropy.fraction_of_log_e"), 0.9932919107901395,
                      1e-12);
            check_num("aux first", jd(L, "aux.first_window"), 0.010505, 1e-12);
            check_num("aux last", jd(L, "aux.last_window"), 0.011505000000000001, 1e-12);
            check_num("z first (nan skipped)", jd(L, "z.first_window"), 0.0020509393939393936,
                      1e-12);
            check_num("z last", jd(L, "z.last_window"), 0.0021505000000000005, 1e-12);
            // 200*0.01 / step_s.sum() over the 200 logged steps
            check_num("exchange share", jd(L, "exchange_share"), 0.09901480271300558, 1e-12);
        } else {
            check_num("max/mean mean", jd(L, "max_over_mean.mean"), 1.65625, 1e-12);
            check_num("max/mean p95", jd(L, "max_over_mean.p95"), 2.0, 1e-12);
            check_num("max/mean p99", jd(L, "max_over_mean.p99"), 2.0, 1e-12);
            check_num("max/mean median last window", jd(L, "max_over_mean.median_last_window"), 2.0,
                      1e-12);
            check_num("cv mean", jd(L, "cv_mean"), 0.44466201395023164, 1e-12);
            check_true("hottest expert 0", jd(L, "hottest_expert.expert") == 0);
            check_num("hottest share", jd(L, "hottest_expert.share"), 0.5, 1e-12);
            const cJSON *dead = jget(L, "dead_experts");
            check_true("dead experts = [3]", cJSON_GetArraySize(dead) == 1 &&
                                                 cJSON_GetArrayItem(dead, 0)->valuedouble == 3);
            check_num("drop first window", jd(L, "drop_fraction.first_window"), 0.015625, 1e-12);
            check_num("drop last window", jd(L, "drop_fraction.last_window"), 0.1875, 1e-12);
            check_num("entropy mean", jd(L, "entropy.mean"), 1.2, 1e-12);
            check_num("entropy / log E", jd(L, "entropy.fraction_of_log_e"), 0.8656170245333779,
                      1e-12);
            check_num("aux first", jd(L, "aux.first_window"), 0.011, 1e-12);
            check_num("aux last", jd(L, "aux.last_window"), 0.02, 1e-12);
            check_num("z first", jd(L, "z.first_window"), 0.003, 1e-12);
            check_num("z last", jd(L, "z.last_window"), 0.003, 1e-12);
            check_true("exchange share null (n/a)", cJSON_IsNull(jget(L, "exchange_share")));
        }
    }
    // alerts: all three on layer 1, none on layer 0
    const cJSON *alerts = cJSON_GetObjectItemCaseSensitive(doc, "alerts"), *a;
    int load = 0, dead = 0, drops = 0, other = 0;
    cJSON_ArrayForEach(a, alerts) {
        const char *kind = cJSON_GetStringValue(jget(a, "kind"));
        const int l = (int)jd(a, "layer");
        if (l == 1 && kind && !strcmp(kind, "load_imbalance") && jd(a, "value") == 2.0 &&
            jd(a, "expert") == 0)
            load++;
        else if (l == 1 && kind && !strcmp(kind, "dead_experts") &&
                 cJSON_GetArrayItem(jget(a, "experts"), 0)->valuedouble == 3)
            dead++;
        else if (l == 1 && kind && !strcmp(kind, "rising_drops"))
            drops++;
        else
            other++;
        check_true("alert has a message", cJSON_GetStringValue(jget(a, "message")) != NULL);
    }
    if (layers_expected == 2)
        check_true("alerts: layer 1 load, dead 3, rising drops; nothing else",
                   load == 1 && dead == 1 && drops == 1 && other == 0);
    else
        check_true("no alerts for layer 0 alone", load + dead + drops + other == 0);
    cJSON_Delete(doc);
}

static void case_report(void) {
    write_run("run_report", 1, 1.25, 0);
    char *out, *err;
    int rc = run_stats(&out, &err, 2, "run_report", "--json");
    check_true("--json exits 0 with alerts", rc == 0);
    check_report_json(out, 2);
    free(out);
    free(err);

    // the default table fits 100 columns: the same first columns, dead experts counted
    rc = run_stats(&out, &err, 1, "run_report");
    printf("%s%s", out, err);
    check_true("default table exits 0", rc == 0);
    check_true("default table: no line over 100 columns", longest_line(out) <= 100);
    check_true("default table: layer 0 row",
               contains(out, "    0    200 |  1.027  1.144  1.704    1.000 | 0.016 |   0  25.4% |  "
                             " 0.42%   0.28% |   0.993 |    0\n"));
    check_true("default table: layer 1 row",
               contains(out, "    1    200 |  1.656  2.000  2.000    2.000 | 0.445 |   0  50.0% |  "
                             " 1.56%  18.75% |   0.866 |    1\n"));
    check_true("default table: 3 alerts, wrapped",
               contains(out, "3 alerts") &&
                   contains(out, "ALERT layer 1: dead expert 3: no tokens in the last 100 steps"));
    free(out);
    free(err);

    // --wide: the full table
    rc = run_stats(&out, &err, 2, "run_report", "--wide");
    printf("%s%s", out, err);
    check_true("table exits 0", rc == 0);
    check_true("--wide: lines over 100 columns", longest_line(out) > 100);
    check_true(
        "table: header",
        contains(out, "200 steps logged (steps 1..202); metrics.jsonl: 202 steps, 2 skipped"));
    check_true("table: layer 0 row",
               contains(out, "    0    200 |  1.027  1.144  1.704    1.000 |"));
    check_true("table: layer 1 row",
               contains(out, "    1    200 |  1.656  2.000  2.000    2.000 |"));
    check_true("table: exchange n/a", contains(out, "n/a"));
    check_true("table: 3 alerts", contains(out, "3 alerts"));
    check_true("table: load alert",
               contains(out, "ALERT layer 1: max/mean load 2.000 (median over the last 100 steps) "
                             "exceeds 1.5; hottest expert 0 has 50.0% of the tokens"));
    check_true("table: dead alert",
               contains(out, "ALERT layer 1: dead expert 3: no tokens in the last 100 steps"));
    check_true("table: drops alert",
               contains(out, "ALERT layer 1: drops rising: 1.56% of the assignments dropped in the "
                             "first 100 steps, 18.75% in the last 100"));
    check_true("table: no alert on layer 0", !contains(out, "ALERT layer 0"));
    free(out);
    free(err);

    rc = run_stats(&out, &err, 4, "--json", "--layer", "0", "run_report");
    check_true("--layer 0 exits 0", rc == 0);
    check_report_json(out, 1);
    free(out);
    free(err);

    // --alert above the median: no load alert; --window 50: the last 50 steps
    rc = run_stats(&out, &err, 6, "run_report", "--alert", "2.5", "--window", "50", "--json");
    cJSON *doc = cJSON_Parse(out);
    int load = 0;
    const cJSON *a, *l0 = cJSON_GetArrayItem(jget(doc, "layers"), 0);
    cJSON_ArrayForEach(a, jget(doc, "alerts")) load +=
        !strcmp(cJSON_GetStringValue(jget(a, "kind")), "load_imbalance");
    check_true("--alert 2.5: no load alert", rc == 0 && doc && load == 0);
    // layer 0, first 50 records: spikes j = 1..5 drop max(0, 9j - 32) = 0+0+0+4+13 of 50*512
    check_num("--window 50: layer 0 first-window drops", jd(l0, "drop_fraction.first_window"),
              17.0 / 25600, 1e-12);
    check_true("--window 50 echoed", jd(doc, "window") == 50 && jd(l0, "window") == 50);
    cJSON_Delete(doc);
    free(out);
    free(err);
}

// bytes: the layer's forward rows, 4*C rows x (2*32 + 3*64)*4 = 1024 bytes (layers/moe.h
// moe_row_bytes); all layers: 2 layers' forward rows + one shared backward scratch = 3 x that.
static void check_need(const cJSON *o, const char *what, double cf, long C, double bytes) {
    char name[96];
    snprintf(name, sizeof name, "%s capacity_factor", what);
    check_num(name, jd(o, "capacity_factor"), cf, 1e-12);
    snprintf(name, sizeof name, "%s C, rows, bytes", what);
    check_true(name, jd(o, "capacity") == C && jd(o, "rows") == 4.0 * C &&
                         jd(o, "bytes_per_layer") == bytes &&
                         jd(o, "bytes_all_layers") == 3 * bytes);
}

// --capacity on a run with grad_accum n (the same per-micro-batch answers for any n).
static void capacity_run(const char *dir, int n, int micro) {
    write_run(dir, n, 1.25, micro);
    char *out, *err;
    int rc = run_stats(&out, &err, 3, dir, "--capacity", "--json");
    check_true("--capacity --json exits 0", rc == 0);
    cJSON *doc = cJSON_Parse(out);
    check_true("--capacity --json parses", doc != NULL);
    if (!doc) return;
    check_true("current cf 1.25 -> C 160",
               jd(doc, "current.capacity_factor") == 1.25 && jd(doc, "current.capacity") == 160);
    check_true("row bytes (2*32 + 3*64)*4 = 1024 per layer, 1024 once for the backward",
               jd(doc, "row_bytes") == 1024 && jd(doc, "row_bytes_backward") == 1024);
    check_true("groups_approximated",
               cJSON_IsTrue(jget(doc, "groups_approximated")) == (n > 1 && !micro));
    const cJSON *l0 = cJSON_GetArrayItem(jget(doc, "layers"), 0);
    const cJSON *l1 = cJSON_GetArrayItem(jget(doc, "layers"), 1);
    // need = smallest C with np.maximum(0, row - C).sum() <= 0.01*row.sum(); cf = need*4/512
    // np.percentile(cf, 99) -> C = ceil(128*cf); bytes = 4*C*1024
    check_need(jget(l0, "p99"), "layer 0 P99", 1.6647656249999994, 214, 876544);
    check_need(jget(l0, "worst"), "layer 0 worst", 1.8046875, 231, 946176);
    check_true("layer 0 worst step 122", jd(l0, "worst.step") == 122);
    check_need(jget(l1, "p99"), "layer 1 P99", 1.9609375, 251, 1028096);
    check_need(jget(l1, "worst"), "layer 1 worst", 1.9609375, 251, 1028096);
    check_true("layer 1 worst step 103", jd(l1, "worst.step") == 103);
    check_num("layer 0 current drop fraction", jd(l0, "current_drop_fraction"), 0.003515625, 1e-12);
    check_num("layer 1 current drop fraction", jd(l1, "current_drop_fraction"), 0.1015625, 1e-12);
    // one factor for the run: the largest over the layers (layer 1 here)
    check_need(jget(doc, "run.p99"), "run P99 (max over layers)", 1.9609375, 251, 1028096);
    check_need(jget(doc, "run.worst"), "run worst", 1.9609375, 251, 1028096);
    // the shortest decimal factor giving C: ceil(128*1.67) = 214, ceil(128*1.80) = 231, 1.96 -> 251
    check_true("suggested factors", jd(l0, "p99.suggested_capacity_factor") == 1.67 &&
                                        jd(l0, "worst.suggested_capacity_factor") == 1.80 &&
                                        jd(l1, "p99.suggested_capacity_factor") == 1.96);
    check_true("run factors from layer 1",
               jd(doc, "run.p99.layer") == 1 && jd(doc, "run.worst.layer") == 1);
    check_true("current rows and bytes", jd(doc, "current.rows") == 640 &&
                                             jd(doc, "current.bytes_per_layer") == 640 * 1024.0);
    cJSON_Delete(doc);
    free(out);
    free(err);

    rc = run_stats(&out, &err, 4, dir, "--capacity", "--max-drop", "0.05");
    printf("%s%s", out, err);
    check_true("--capacity default table exits 0, fits 100 columns",
               rc == 0 && longest_line(out) <= 100);
    check_true("--capacity default table: layer 0 without rows and all-layer MiB",
               contains(out, "    0    200 |     1.51    194     0.758 |    1.641    211     0.824 "
                             "    122 | 0.35%\n"));
    free(out);
    free(err);

    rc = run_stats(&out, &err, 5, dir, "--capacity", "--max-drop", "0.05", "--wide");
    printf("%s%s", out, err);
    check_true("--capacity --wide table exits 0, over 100 columns",
               rc == 0 && longest_line(out) > 100);
    // max_drop 0.05: layer 0 P99 cf 1.5085156249999994 (C 194), worst 1.6484375 (C 211);
    // layer 1 1.8046875 (C 231); rows 4*C, MiB 4*C*1024/2^20 per layer, 4*C*3072/2^20 for the 2
    // layers with their shared backward scratch; the
    // table shows the shortest decimal factor giving C: 1.51 (ceil(128*1.51) = 194), 1.641, 1.80
    check_true("table: layer 0 at max_drop 0.05",
               contains(out, "    0    200 |     1.51    194     776     0.758    2.273 |    1.641 "
                             "   211     844     0.824    2.473     122 | 0.35%"));
    check_true("table: layer 1 at max_drop 0.05",
               contains(out, "    1    200 |     1.80    231     924     0.902    2.707 |     1.80 "
                             "   231     924     0.902    2.707     103 | 10.16%"));
    check_true("table: current cf",
               contains(out, "current: capacity_factor 1.25 -> C = 160 per expert per micro-batch, "
                             "640 rows, 0.625 MiB per layer, 1.875 MiB for 2 layers"));
    check_true("table: run-wide factor from layer 1",
               contains(out, "P99 step:   capacity_factor 1.80 (layer 1) -> C = 231, 924 rows, "
                             "0.902 MiB per layer, 2.707 MiB for 2 layers"));
    check_true("table: grad_accum note iff n > 1 without micro_counts",
               contains(out, "approximated as counts / 2") == (n == 2 && !micro));
    free(out);
    free(err);
}

static void case_capacity(void) {
    capacity_run("run_capacity", 1, 0);
    printf(" grad_accum 2 (counts of two micro-batches per record, no micro_counts)\n");
    capacity_run("run_capacity_accum2", 2, 0);
    printf(" grad_accum 2 with micro_counts\n");
    capacity_run("run_capacity_micro", 2, 1);
    // a dropless run: the current factor is 0
    write_run("run_capacity_dropless", 1, 0, 0);
    char *out, *err;
    int rc = run_stats(&out, &err, 2, "run_capacity_dropless", "--capacity");
    check_true("dropless run: current says so",
               rc == 0 && contains(out, "capacity_factor 0 (dropless)"));
    free(out);
    free(err);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) die("cannot read", path);
    buf[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void spit(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) die("cannot write", path);
    fclose(f);
}

// Replaces line `line` (1-based) of path by `text` (no newline).
static void replace_line(const char *path, int line, const char *text) {
    size_t n;
    char *s = slurp(path, &n), *p = s;
    for (int i = 1; i < line; i++) p = strchr(p, '\n') + 1;
    char *e = strchr(p, '\n');
    FILE *f = fopen(path, "wb");
    fwrite(s, 1, (size_t)(p - s), f);
    fputs(text, f);
    fputs(e, f);
    fclose(f);
    free(s);
}

static void case_partial(void) {
    write_run("run_partial", 1, 1.25, 0);
    char *want, *out, *err;
    run_stats(&want, &err, 2, "run_partial", "--json");
    free(err);
    // a run in progress: the writer stopped in the middle of a record of each file
    FILE *f = open_in("run_partial", "expert_load.jsonl", "a");
    fputs("{\"step\":203,\"layer\":0,\"tokens\":256,\"capacity\":160,\"counts\":[128,12", f);
    fclose(f);
    f = open_in("run_partial", "metrics.jsonl", "a");
    fputs("{\"step\":203,\"loss\":3.", f);
    fclose(f);
    int rc = run_stats(&out, &err, 2, "run_partial", "--json");
    printf("%s", err);
    check_true("partial last line: exit 0", rc == 0);
    check_true("partial last line: same report", !strcmp(out, want));
    check_true("partial last line: noted",
               contains(err, "expert_load.jsonl:401: partial last line ignored") &&
                   contains(err, "metrics.jsonl:203: partial last line ignored"));
    free(out);
    free(err);
    free(want);
    // a complete last record without its newline is used
    write_run("run_partial", 1, 1.25, 0);
    size_t n;
    char *s = slurp("run_partial/expert_load.jsonl", &n);
    spit("run_partial/expert_load.jsonl", s, n - 1);
    free(s);
    rc = run_stats(&out, &err, 2, "run_partial", "--json");
    cJSON *doc = cJSON_Parse(out);
    check_true("last line without newline but complete: used",
               rc == 0 && jd(cJSON_GetArrayItem(jget(doc, "layers"), 1), "steps") == 200);
    cJSON_Delete(doc);
    free(out);
    free(err);
}

static void expect_error(const char *what, int want_rc, const char *msg, int argc, char *a0,
                         char *a1, char *a2) {
    char *out, *err;
    int rc = run_stats(&out, &err, argc, a0, a1, a2);
    char name[160];
    snprintf(name, sizeof name, "%s: exit %d", what, want_rc);
    check_true(name, rc == want_rc);
    snprintf(name, sizeof name, "%s: message", what);
    check_true(name, contains(err, msg));
    if (!contains(err, msg)) printf("    stderr: %s\n", err);
    free(out);
    free(err);
}

static void case_malformed(void) {
    write_run("run_bad", 1, 1.25, 0);
    // line 57 of 400: a garbled record in the middle
    replace_line("run_bad/expert_load.jsonl", 57, "{\"step\":29,\"layer\":0,\"tokens\":256,,}");
    expect_error("garbled middle line", 1, "run_bad/expert_load.jsonl:57: not a JSON object", 1,
                 "run_bad", NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57, "[1,2,3]");
    expect_error("array instead of object", 1, "run_bad/expert_load.jsonl:57: not a JSON object", 1,
                 "run_bad", NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57,
                 "{\"step\":29,\"layer\":0,\"counts\":[1,2,3],\"dropped\":0}");
    expect_error("3 counts for 4 experts", 1,
                 "run_bad/expert_load.jsonl:57: \"counts\" has 3 entries, expected 4", 1, "run_bad",
                 NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57,
                 "{\"step\":29,\"layer\":0,\"counts\":[1,2,-3,4],\"dropped\":0}");
    expect_error("negative count", 1, "run_bad/expert_load.jsonl:57: \"counts\" entry 2", 1,
                 "run_bad", NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57, "{\"step\":29,\"layer\":2,\"counts\":[1,2,3,4]}");
    expect_error("layer beyond n_layers", 1, "run_bad/expert_load.jsonl:57: \"layer\"", 1,
                 "run_bad", NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57, "{\"step\":3,\"layer\":0,\"counts\":[1,2,3,4]}");
    expect_error("step going back", 1,
                 "run_bad/expert_load.jsonl:57: step 3 of layer 0 comes after step 28", 1,
                 "run_bad", NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57, "{\"layer\":0,\"counts\":[1,2,3,4]}");
    expect_error("no step", 1, "run_bad/expert_load.jsonl:57: \"step\" is missing", 1, "run_bad",
                 NULL, NULL);
    replace_line("run_bad/expert_load.jsonl", 57,
                 "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"aux\":\"x\"}");
    expect_error("aux a string", 1, "run_bad/expert_load.jsonl:57: \"aux\" is not a number", 1,
                 "run_bad", NULL, NULL);
    // micro_counts (read by --capacity) that do not add up to the counts, or are too few
    write_run("run_bad", 2, 1.25, 1);
    replace_line(
        "run_bad/expert_load.jsonl", 57,
        "{\"step\":29,\"layer\":0,\"counts\":[2,3,4,6],\"micro_counts\":[[1,2,3,4],[1,1,1,1]]}");
    expect_error("micro_counts do not sum to counts", 1,
                 "run_bad/expert_load.jsonl:57: \"micro_counts\" sums to 5 for expert 3, but "
                 "\"counts\" has 6",
                 2, "run_bad", "--capacity", NULL);
    replace_line("run_bad/expert_load.jsonl", 57,
                 "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"micro_counts\":[[1,2,3,4]]}");
    expect_error("one micro_counts row for grad_accum 2", 1,
                 "run_bad/expert_load.jsonl:57: \"micro_counts\" has 1 entries, expected "
                 "train.grad_accum = 2",
                 2, "run_bad", "--capacity", NULL);
    // metrics.jsonl
    write_run("run_bad", 1, 1.25, 0);
    replace_line("run_bad/metrics.jsonl", 10, "{\"step\":10,\"loss\":nan}");
    expect_error("garbled metrics line", 1, "run_bad/metrics.jsonl:10: not a JSON object", 1,
                 "run_bad", NULL, NULL);
    replace_line("run_bad/metrics.jsonl", 10, "{\"step\":10,\"step_s\":\"slow\"}");
    expect_error("metrics step_s a string", 1,
                 "run_bad/metrics.jsonl:10: \"step_s\" is not a number", 1, "run_bad", NULL, NULL);
    // config.cfg
    write_run("run_bad", 1, 1.25, 0);
    const char *bad_cfg = "model = { n_expertz = 4; };\n";
    spit("run_bad/config.cfg", bad_cfg, strlen(bad_cfg));
    expect_error("bad config", 1, "run_bad/config.cfg:1", 1, "run_bad", NULL, NULL);
    // no config: the report works from the counts, --capacity needs it
    remove("run_bad/config.cfg");
    expect_error("no config: --capacity", 1, "run_bad/config.cfg", 2, "run_bad", "--capacity",
                 NULL);
    char *out, *err;
    int rc = run_stats(&out, &err, 2, "run_bad", "--json");
    cJSON *doc = cJSON_Parse(out);
    check_true("no config: report from the counts",
               rc == 0 && jd(doc, "n_experts") == 4 && cJSON_IsNull(jget(doc, "top_k")));
    cJSON_Delete(doc);
    free(out);
    free(err);
    // no metrics: exchange share n/a, the rest as before
    remove("run_bad/metrics.jsonl");
    rc = run_stats(&out, &err, 2, "run_bad", "--json");
    doc = cJSON_Parse(out);
    check_true(
        "no metrics.jsonl: report, exchange n/a",
        rc == 0 &&
            cJSON_IsNull(jget(cJSON_GetArrayItem(jget(doc, "layers"), 0), "exchange_share")) &&
            cJSON_IsNull(jget(doc, "metrics_steps")));
    cJSON_Delete(doc);
    free(out);
    free(err);
    // empty log, missing log
    spit("run_bad/expert_load.jsonl", "", 0);
    expect_error("empty expert_load.jsonl", 1, "run_bad/expert_load.jsonl: no expert-load records",
                 1, "run_bad", NULL, NULL);
    expect_error("missing run dir", 1, "run_missing/expert_load.jsonl: cannot open", 1,
                 "run_missing", NULL, NULL);
}

// Replaces line `line` (1-based) of path by the n bytes of data (NUL bytes allowed).
static void replace_line_bytes(const char *path, int line, const char *data, size_t n) {
    size_t len;
    char *s = slurp(path, &len), *p = s;
    for (int i = 1; i < line; i++) p = strchr(p, '\n') + 1;
    char *e = strchr(p, '\n');
    FILE *f = fopen(path, "wb");
    fwrite(s, 1, (size_t)(p - s), f);
    fwrite(data, 1, n, f);
    fwrite(e, 1, len - (size_t)(e - s), f);
    fclose(f);
    free(s);
}

// Every mode of moe stats on run_hostile: exit 1 and msg in what it printed (--watch draws
// the error into its refresh, on stdout).
static void expect_all_modes(const char *what, const char *msg) {
    static char dir[] = "run_hostile", capacity[] = "--capacity", placement[] = "--placement",
                two[] = "2", watch[] = "--watch", count[] = "--count", one[] = "1";
    char *modes[4][4] = {{dir}, {dir, capacity}, {dir, placement, two}, {dir, watch, count, one}};
    const int argc[4] = {1, 2, 3, 4};
    const char *names[4] = {"report", "--capacity", "--placement 2", "--watch"};
    for (int m = 0; m < 4; m++) {
        char *out, *err, name[200];
        size_t no, ne;
        FILE *fo = open_memstream(&out, &no), *fe = open_memstream(&err, &ne);
        const int rc = stats_cli(argc[m], modes[m], fo, fe);
        fclose(fo), fclose(fe);
        snprintf(name, sizeof name, "%s, %s: exit 1 naming it", what, names[m]);
        const int ok = rc == 1 && (contains(err, msg) || contains(out, msg));
        check_true(name, ok);
        if (!ok) printf("    rc %d, stdout: %.300s\n    stderr: %.300s\n", rc, out, err);
        free(out), free(err);
    }
}

// Issue 28 (items 1, 3, 4, 5): damaged logs, FIFOs and devices, in every mode. Each of these
// was either read (--placement printed a mapping from it, exit 0), blocked, grew without
// bound, or read out of bounds before the one validated reader (stats/records.h).
static void case_hostile(void) {
    alarm(120); // a reader that blocks on a FIFO fails the case instead of hanging ctest
    const char *load = "run_hostile/expert_load.jsonl", *metrics = "run_hostile/metrics.jsonl";
    static const struct {
        const char *what, *line, *msg;
    } load_cases[] = {
        {"negative count", "{\"step\":29,\"layer\":0,\"counts\":[1,2,-3,4]}",
         "expert_load.jsonl:57: \"counts\" entry 2 is not a non-negative integer"},
        {"count 1e300", "{\"step\":29,\"layer\":0,\"counts\":[1e300,2,3,4]}",
         "expert_load.jsonl:57: \"counts\" entry 0 is not a non-negative integer"},
        {"string count", "{\"step\":29,\"layer\":0,\"counts\":[\"1\",2,3,4]}",
         "expert_load.jsonl:57: \"counts\" entry 0 is not a non-negative integer"},
        {"repeated step", "{\"step\":28,\"layer\":0,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: step 28 of layer 0 comes after step 28"},
        {"decreasing step", "{\"step\":3,\"layer\":0,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: step 3 of layer 0 comes after step 28"},
        {"step 1e300", "{\"step\":1e300,\"layer\":0,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: \"step\" = 1.0000000000000001e+300 is not an integer"},
        {"negative step", "{\"step\":-29,\"layer\":0,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: \"step\" = -29 is not an integer"},
        {"negative tokens", "{\"step\":29,\"layer\":0,\"tokens\":-1,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: \"tokens\" = -1 is not an integer"},
        {"layer 99 of 2", "{\"step\":29,\"layer\":99,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: \"layer\" = 99, but the run has model.n_layers = 2"},
        {"layer 1e300", "{\"step\":29,\"layer\":1e300,\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: \"layer\" = 1.0000000000000001e+300 is not an integer"},
        {"8 experts for 4", "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4,5,6,7,8]}",
         "expert_load.jsonl:57: \"counts\" has 8 entries, expected 4"},
        {"coactivation of 2 pairs",
         "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"coactivation\":[1,2]}",
         "expert_load.jsonl:57: \"coactivation\" has 2 entries, expected 6"},
        {"negative coactivation",
         "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"coactivation\":[1,2,3,4,5,-6]}",
         "expert_load.jsonl:57: \"coactivation\" entry 5 is not a non-negative integer"},
        {"kept above counts", "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"kept\":[1,2,9,4]}",
         "expert_load.jsonl:57: \"kept\" entry 2 (9) exceeds \"counts\" (3)"},
        {"micro_counts not summing",
         "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"micro_counts\":[[1,2,3,3]]}",
         "expert_load.jsonl:57: \"micro_counts\" sums to 3 for expert 3"},
        {"exchange_s -1e300",
         "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"exchange_s\":-1e300}",
         "expert_load.jsonl:57: \"exchange_s\" = -1e+300 is not a finite number in [0, 1e+07]"},
        {"a string layer", "{\"step\":29,\"layer\":\"0\",\"counts\":[1,2,3,4]}",
         "expert_load.jsonl:57: \"layer\" is not a number"},
        {"a key twice (cJSON reads the first, Python the last)",
         "{\"step\":29,\"layer\":0,\"counts\":[1,2,3,4],\"layer\":1}",
         "expert_load.jsonl:57: key \"layer\" appears twice in the top level"},
    };
    for (size_t i = 0; i < sizeof load_cases / sizeof *load_cases; i++) {
        write_run("run_hostile", 1, 1.25, 0);
        replace_line(load, 57, load_cases[i].line);
        expect_all_modes(load_cases[i].what, load_cases[i].msg);
    }
    // item 1: a line that starts with a NUL byte (--placement read before its buffer)
    write_run("run_hostile", 1, 1.25, 0);
    replace_line_bytes(load, 57, "\0{\"step\":29}", 12);
    expect_all_modes("a line starting with NUL", "expert_load.jsonl:57: NUL byte at column 1");
    write_run("run_hostile", 1, 1.25, 0);
    replace_line_bytes(load, 57, "{\"step\":29,\0\"layer\":0}", 22);
    expect_all_modes("a NUL byte inside a line", "expert_load.jsonl:57: NUL byte at column 12");
    // item 5: metrics.jsonl times (the report printed a 300-digit time per step)
    static const struct {
        const char *what, *line, *msg;
    } metric_cases[] = {
        {"step_s -1e300", "{\"step\":10,\"step_s\":-1e300}",
         "metrics.jsonl:10: \"step_s\" = -1e+300 is not a finite number in [0, 1e+07]"},
        {"step_s 1e300", "{\"step\":10,\"step_s\":1e300}",
         "metrics.jsonl:10: \"step_s\" = 1e+300 is not a finite number in [0, 1e+07]"},
        {"a phase of 1e300 s",
         "{\"step\":10,\"step_s\":0.1,\"time\":{\"attention\":1e300,\"router\":0,\"dispatch\":0,"
         "\"experts\":0,\"combine\":0,\"dense\":0,\"optimizer\":0,\"exchange_wait\":0,"
         "\"validation\":0,\"checkpoint\":0}}",
         "metrics.jsonl:10: \"time\" phase \"attention\" = 1e+300 s is beyond 1e+07 s"},
        {"a repeated metrics step", "{\"step\":9,\"step_s\":0.1}",
         "metrics.jsonl:10: step 9 comes after step 9"},
        {"a string loss", "{\"step\":10,\"loss\":\"low\"}",
         "metrics.jsonl:10: \"loss\" is not a number"},
    };
    for (size_t i = 0; i < sizeof metric_cases / sizeof *metric_cases; i++) {
        write_run("run_hostile", 1, 1.25, 0);
        replace_line(metrics, 10, metric_cases[i].line);
        char *out, *err, name[160];
        const int rc = run_stats(&out, &err, 1, "run_hostile");
        snprintf(name, sizeof name, "%s: report exits 1 naming it", metric_cases[i].what);
        check_true(name, rc == 1 && contains(err, metric_cases[i].msg));
        if (!(rc == 1 && contains(err, metric_cases[i].msg))) printf("    stderr: %s\n", err);
        free(out), free(err);
    }
    // item 3: a FIFO or a device as the log, in every mode (they blocked, or grew to 2 GB)
    write_run("run_hostile", 1, 1.25, 0);
    remove(load);
    if (mkfifo(load, 0600)) die("mkfifo", load);
    expect_all_modes(
        "expert_load.jsonl a FIFO",
        "expert_load.jsonl: not a regular file (a FIFO): a log must be a regular file");
    remove(load);
    if (symlink("/dev/zero", load)) die("symlink", load);
    expect_all_modes("expert_load.jsonl -> /dev/zero",
                     "expert_load.jsonl: not a regular file (a character device)");
    remove(load);
    write_run("run_hostile", 1, 1.25, 0);
    remove(metrics);
    if (mkfifo(metrics, 0600)) die("mkfifo", metrics);
    char *out, *err;
    int rc = run_stats(&out, &err, 1, "run_hostile");
    check_true("metrics.jsonl a FIFO: exit 1 naming it",
               rc == 1 && contains(err, "metrics.jsonl: not a regular file (a FIFO)"));
    free(out), free(err);
    remove(metrics);
    alarm(0);
}

// --from STEP: the records (and metrics) of earlier steps are ignored, for the report and for
// --capacity. From step 103 (records 101..200): layer 1 is [256,128,128,0] on every step.
static void case_from(void) {
    write_run("run_from", 1, 1.25, 0);
    char *out, *err;
    int rc = run_stats(&out, &err, 4, "run_from", "--from", "103", "--json");
    cJSON *doc = cJSON_Parse(out);
    check_true("--from 103 --json exits 0", rc == 0 && doc);
    check_true("--from 103: 100 steps 103..202, from_step echoed",
               jd(doc, "steps_logged") == 100 && jd(doc, "first_step") == 103 &&
                   jd(doc, "last_step") == 202 && jd(doc, "from_step") == 103);
    check_true("--from 103: metrics from step 103 (the skipped steps 55, 56 are before)",
               jd(doc, "metrics_steps") == 100 && jd(doc, "skipped_steps") == 0);
    const cJSON *l1 = cJSON_GetArrayItem(jget(doc, "layers"), 1);
    check_num("--from 103: layer 1 max/mean mean", jd(l1, "max_over_mean.mean"), 2.0, 1e-15);
    check_num("--from 103: layer 1 drops in the first window", jd(l1, "drop_fraction.first_window"),
              0.1875, 1e-15);
    cJSON_Delete(doc);
    free(out);
    free(err);
    rc = run_stats(&out, &err, 5, "run_from", "--capacity", "--from", "103", "--json");
    doc = cJSON_Parse(out);
    const cJSON *l0 = cJSON_GetArrayItem(jget(doc, "layers"), 0);
    l1 = cJSON_GetArrayItem(jget(doc, "layers"), 1);
    // layer 1: every step needs C = 251; layer 0: its worst step (122) is after 103
    check_true("--capacity --from 103: 100 steps per layer, the worst steps unchanged",
               rc == 0 && jd(l0, "steps") == 100 && jd(l0, "worst.step") == 122 &&
                   jd(l0, "worst.capacity") == 231 && jd(l1, "worst.capacity") == 251 &&
                   jd(l1, "p99.capacity") == 251);
    cJSON_Delete(doc);
    free(out);
    free(err);
    rc = run_stats(&out, &err, 3, "run_from", "--from", "103");
    check_true("--from table: says so, fits 100 columns",
               rc == 0 && contains(out, "(--from 103: earlier steps ignored)") &&
                   longest_line(out) <= 100);
    free(out);
    free(err);
    expect_error(
        "--from after the last step", 1,
        "run_from/expert_load.jsonl: no expert-load records at or after step 1000 (--from)", 3,
        "run_from", "--from", "1000");
    expect_error("--from 0", 2, "--from '0': expected a step >= 1", 3, "run_from", "--from", "0");
}

static void case_usage(void) {
    write_run("run_usage", 1, 1.25, 0);
    expect_error("no RUN_DIR", 2, "a RUN_DIR is required", 1, "--json", NULL, NULL);
    expect_error("unknown option", 2, "unknown option '--bogus'", 2, "run_usage", "--bogus", NULL);
    expect_error("--window 0", 2, "--window '0'", 3, "run_usage", "--window", "0");
    expect_error("--window missing value", 2, "'--window' needs a value", 2, "run_usage",
                 "--window", NULL);
    expect_error("--alert x", 2, "--alert 'x'", 3, "run_usage", "--alert", "x");
    expect_error("--layer -1", 2, "--layer '-1'", 3, "run_usage", "--layer", "-1");
    expect_error("--layer 5 absent", 2, "--layer 5: no records of that layer", 3, "run_usage",
                 "--layer", "5");
    expect_error("two RUN_DIRs", 2, "more than one RUN_DIR", 2, "run_usage", "other", NULL);
    expect_error("--max-drop without --capacity", 2, "--max-drop needs --capacity", 3, "run_usage",
                 "--max-drop", "0.1");
    expect_error("--max-drop 1", 2, "--max-drop '1'", 3, "--capacity", "--max-drop", "1");
    char *out, *err;
    check_true("--help exits 0",
               run_stats(&out, &err, 1, "--help") == 0 && contains(out, "usage: moe stats"));
    free(out);
    free(err);
}

// ---- plots --------------------------------------------------------------------------

static int png_size(const char *path, uint32_t *w, uint32_t *h) {
    unsigned char b[24];
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n != sizeof b || memcmp(b, sig, 8) || memcmp(b + 12, "IHDR", 4)) return -1;
    *w = (uint32_t)b[16] << 24 | (uint32_t)b[17] << 16 | (uint32_t)b[18] << 8 | b[19];
    *h = (uint32_t)b[20] << 24 | (uint32_t)b[21] << 16 | (uint32_t)b[22] << 8 | b[23];
    return 0;
}

static int run_program(char *const argv[]) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execv(argv[0], argv);
        fprintf(stderr, "test_stats: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(77);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int case_plot(const char *python, const char *script) {
    write_run("run_plot", 1, 1.25, 0);
    // a run in progress: partial last line
    FILE *f = open_in("run_plot", "expert_load.jsonl", "a");
    fputs("{\"step\":203,\"layer\":0,\"counts\":[1,", f);
    fclose(f);
    char *argv[] = {(char *)python, (char *)script, "run_plot", "--out", "run_plot/plots", NULL};
    int rc = run_program(argv);
    if (rc == 77) {
        printf("matplotlib not available: skipped\n");
        return 77;
    }
    check_true("plot_load.py exits 0", rc == 0);
    static const struct {
        const char *name;
        uint32_t w, h;
    } want[] = {{"load_heatmap_layer0.png", 1000, 400},
                {"load_heatmap_layer1.png", 1000, 400},
                {"max_over_mean.png", 1000, 500},
                {"drop_fraction.png", 1000, 500},
                {"aux_z.png", 1000, 800},
                {"entropy.png", 1000, 500}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char path[256], what[160];
        snprintf(path, sizeof path, "run_plot/plots/%s", want[i].name);
        struct stat st;
        uint32_t w = 0, h = 0;
        const int ok = !stat(path, &st) && st.st_size > 1000 && !png_size(path, &w, &h);
        snprintf(what, sizeof what, "%s: %ux%u (want %ux%u)", want[i].name, w, h, want[i].w,
                 want[i].h);
        check_true(what, ok && w == want[i].w && h == want[i].h);
    }
    // a malformed middle line: exit 1 naming file and line
    replace_line("run_plot/expert_load.jsonl", 12, "{oops");
    char *argv2[] = {(char *)python, (char *)script, "run_plot", "--out", "run_plot/plots2", NULL};
    check_true("plot_load.py on a malformed line exits 1", run_program(argv2) == 1);
    return test_failures() != 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr,
                "usage: test_stats units|report|capacity|partial|malformed|usage|from|hostile|plot "
                "PYTHON SCRIPT\n");
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "units"))
        case_units();
    else if (!strcmp(c, "report"))
        case_report();
    else if (!strcmp(c, "capacity"))
        case_capacity();
    else if (!strcmp(c, "partial"))
        case_partial();
    else if (!strcmp(c, "malformed"))
        case_malformed();
    else if (!strcmp(c, "usage"))
        case_usage();
    else if (!strcmp(c, "from"))
        case_from();
    else if (!strcmp(c, "hostile"))
        case_hostile();
    else if (!strcmp(c, "plot")) {
        if (argc < 4 || !argv[2][0] || access(argv[2], X_OK)) {
            printf("no python3: skipped\n");
            return 77;
        }
        return case_plot(argv[2], argv[3]);
    } else {
        fprintf(stderr, "test_stats: unknown case '%s'\n", c);
        return 2;
    }
    return test_failures() != 0;
}
