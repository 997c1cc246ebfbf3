// The run header (train/run_header.h): the model, its parameters, FLOPs per token and memory,
// printed before step 1 of `moe train` and by `moe train --dry-run`, with the formatting
// helpers they share.
#define _POSIX_C_SOURCE 200809L // stat

#include "train/run_header.h"

#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "data/token_file.h"
#include "train/run_data.h"
#include "train/trainer.h"
#include "train/zero.h"

void moe_run_header_bytes(char *buf, size_t n, double b) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, n, "%.1f %s", b, unit[u]);
}

// 1234567 -> "1,234,567"
static const char *grouped(char *buf, size_t n, uint64_t v) {
    char digits[32];
    const int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t at = 0;
    for (int i = 0; i < len && at + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[at++] = ',';
        buf[at++] = digits[i];
    }
    buf[at] = 0;
    return buf;
}

// 2304000 -> "2.30M" (K, M, G, T, P)
static const char *si(char *buf, size_t n, double v) {
    const char *unit[] = {"", "K", "M", "G", "T", "P"};
    int u = 0;
    while (fabs(v) >= 1000 && u < 5) v /= 1000, u++;
    snprintf(buf, n, u ? "%.2f%s" : "%.0f%s", v, unit[u]);
    return buf;
}

typedef struct {
    size_t params, grads, optimizer, activations, experts; // bytes; activations without experts
} run_memory;

static double memory_total(const run_memory *r) {
    return (double)(r->params + r->grads + r->optimizer + r->activations + r->experts);
}

// The memory of a training model as allocated (moe_model_memory), with the optimizer's state:
// sharded (parallel.shard_optimizer) the moments of the largest dense piece over D ranks and
// of the largest piece of the model's experts over De (train/zero.h).
static run_memory memory_of(const moe_model *m, const moe_train_config *cfg, int D, int De) {
    run_memory r = {0};
    size_t acts;
    moe_model_memory(m, &r.params, &r.grads, &acts);
    for (int l = 0; l < m->n_moe; l++) r.experts += m->moe[l].bytes;
    r.activations = acts - r.experts;
    const size_t moments = moe_zero_moments_per_rank(m->n_dense, m->n_params - m->n_dense, D, De);
    r.optimizer = cfg->optimizer == OPTIM_SGD ? 0 : 2 * moments * sizeof(real); // AdamW: m and v
    return r;
}

// model, parameter counts, FLOPs per token, memory (NULL: not measured, why in mem_note),
// the data line, BLAS and threads.
static void print_header(const moe_train_config *cfg, const moe_model_config *mc, size_t n_params,
                         size_t n_dense, const run_memory *mem, const char *mem_note,
                         const char *data_line, moe_backend *be) {
    const int L = mc->n_layers, E = mc->moe.n_experts, k = mc->moe.top_k;
    const double d = mc->d_model, ff = mc->moe.d_ff, V = mc->vocab_size;
    const double hd = moe_model_head_dim(mc), q_rows = (mc->n_heads + 2.0 * mc->n_kv_heads) * hd;
    const double expert = 3 * d * ff;          // w1, w3 (stacked as w13) and w2 of one expert
    const int Lm = moe_model_n_moe_layers(mc); // the others are dense layers
    const double active = (double)n_dense + (double)Lm * k * expert;
    printf("model: %d layers, d=%d, %d heads (%d kv), %d experts top-%d, ff=%d: %.2fM parameters "
           "(%.2fM in experts)\n",
           L, mc->d_model, mc->n_heads, mc->n_kv_heads, E, k, mc->moe.d_ff, n_params / 1e6,
           (n_params - n_dense) / 1e6);
    char a[32], b[32], c[32], e[32];
    printf("parameters: %s total, %s active per token (%s dense + top-%d of %d experts of %s\n"
           "  in each of %d MoE layers)\n",
           grouped(a, sizeof a, n_params), grouped(b, sizeof b, (uint64_t)active),
           grouped(c, sizeof c, n_dense), k, E, grouped(e, sizeof e, (uint64_t)expert), Lm);
    // forward FLOPs per token: 2 per weight of every matmul a token goes through (q/k/v, o,
    // router, its top_k experts, lm_head; the embedding is a lookup), and attention's
    // QK^T and AV: 2 x 2 x S x (heads x head_dim) per layer over the whole S x S window
    // (and the dense layers' MLPs, the shared experts: 3 d f each)
    const double dff = mc->dense_d_ff > 0 ? mc->dense_d_ff : ff;
    const double matmul = L * (q_rows * d + d * mc->n_heads * hd) +
                          Lm * (E * d + k * expert + 3 * d * mc->shared_d_ff) +
                          (L - Lm) * 3 * d * dff + V * d;
    const double attn = L * 4.0 * cfg->seq_len * mc->n_heads * hd;
    const double fwd = 2 * matmul + attn;
    char f1[32], f2[32], f3[32], f4[32];
    printf("FLOPs per token: %s forward (2 x %s matmul weights + %s attention: 4 x S x d per\n"
           "  layer at S = %d, the full S x S, not halved for the causal mask); %s to train "
           "(3 x forward)\n",
           si(f1, sizeof f1, fwd), si(f2, sizeof f2, matmul), si(f3, sizeof f3, attn), cfg->seq_len,
           si(f4, sizeof f4, 3 * fwd));
    if (mem) {
        char p[32], g[32], o[32], act[32], ex[32], all[32];
        moe_run_header_bytes(p, sizeof p, (double)mem->params);
        moe_run_header_bytes(g, sizeof g, (double)mem->grads);
        moe_run_header_bytes(o, sizeof o, (double)mem->optimizer);
        moe_run_header_bytes(act, sizeof act, (double)mem->activations);
        moe_run_header_bytes(ex, sizeof ex, (double)mem->experts);
        moe_run_header_bytes(all, sizeof all, memory_total(mem));
        printf("memory (%s, as allocated for %d x %d tokens): %s: parameters %s, gradients %s,\n"
               "  %s %s, activations %s, expert buffers %s\n",
               mc->dtype == MOE_DTYPE_BF16 ? "bf16" : "fp32", cfg->batch_size, cfg->seq_len, all, p,
               g, cfg->optimizer == OPTIM_SGD ? "SGD state" : "AdamW moments", o, act, ex);
    } else {
        printf("memory: not measured: %s\n", mem_note);
    }
    printf("%s\n", data_line);
    printf("precision: %s (train.dtype)\n",
           mc->dtype == MOE_DTYPE_BF16
               ? "bf16: bf16 GEMM operands with fp32 accumulation; fp32 master weights, "
                 "optimizer, norms, softmax, routing and losses"
               : "fp32");
    printf("device: %s (model.device)\n%s%s\n", be->name, be->describe(be),
           cfg->threads > 0 ? " (train.threads)" : " (automatic)");
}

// The dropless memory plan (docs/training.md "Memory plan"): the expert rows one rank's MoE
// layers hold, balanced (T k), at the cap (model.dropless_max_rows) and at the worst routing
// (R T min(k, E_local): every token of the group picks this rank's experts), in bytes from
// moe_row_bytes: each MoE layer keeps `forward` bytes per row for its backward (recompute:
// all but the hidden 3 ff, of which there is one set), and the
// backward scratch (shared) `backward` bytes per row; under expert parallelism three rows of
// d more per layer stage the exchange. And the KV cache of one inference sequence.
static void print_plan(const moe_train_config *cfg, const moe_model_config *mc, int ranks) {
    const int R = ranks > 1 ? ranks : 1, E = mc->moe.n_experts, k = mc->moe.top_k;
    const int El = E / R, Lm = moe_model_n_moe_layers(mc);
    const double T = (double)cfg->batch_size * cfg->seq_len;
    size_t fwd, bwd;
    moe_row_bytes(&mc->moe, &fwd, &bwd);
    // (train.recompute: the layers keep the input and combined rows, 2 d, and the hidden ones,
    // 3 ff, are one set for all of them)
    const double hidden = 3.0 * mc->moe.d_ff * sizeof(real),
                 kept = mc->recompute != MOE_RECOMPUTE_NONE ? (double)fwd - hidden : (double)fwd,
                 per_row = Lm * (kept + (R > 1 ? 3.0 * mc->d_model * sizeof(real) : 0)) + bwd +
                           (mc->recompute != MOE_RECOMPUTE_NONE ? hidden : 0);
    const double worst = R * T * (k < El ? k : El), cap = mc->dropless_max_rows;
    char bal[32], cp[32], wr[32], kv[32];
    moe_run_header_bytes(bal, sizeof bal, T * k * per_row);
    moe_run_header_bytes(wr, sizeof wr, worst * per_row);
    moe_run_header_bytes(cp, sizeof cp, (cap > 0 && cap < worst ? cap : worst) * per_row);
    printf("expert rows per rank (%d rank%s of experts%s): balanced T k = %.0f rows %s;\n"
           "  worst routing R T min(k, E_local) = %.0f rows %s; ",
           R, R > 1 ? "s" : "", ranks > 1 ? "" : "; parallel.ep_size sets R", T * k, bal, worst,
           wr);
    if (cap > 0 && cap < worst)
        printf("at the cap of %.0f rows (model.dropless_max_rows) %s:\n"
               "  what is allocated; a forward beyond it stops naming the rank and expert\n",
               cap, cp);
    else
        printf("no cap (model.dropless_max_rows = 0): buffers for the worst routing\n");
    const double kv_seq = 2.0 * mc->n_layers * mc->n_kv_heads * moe_model_head_dim(mc) *
                          mc->max_seq_len * sizeof(real);
    moe_run_header_bytes(kv, sizeof kv, kv_seq);
    printf("inference KV cache: %s per sequence of max_seq_len %d (2 L KV hd S x %zu bytes)\n", kv,
           mc->max_seq_len, sizeof(real));
}

// parallel.shard_optimizer with AdamW: the moments (m and v) one rank keeps over R ranks,
// 2 x 4 x (ceil(n_dense / R) + ceil(its experts' parameters / De)), De = R / ep_size ranks
// holding the same experts, against 2 x 4 x (n_dense + its experts') unsharded; experts_all:
// the expert parameters of the whole model, ep_size ranks (0: R) share them. ranks <= 1 (a
// dry run outside mpirun): for R = 2, 4 and 8.
static void print_shard(const moe_train_config *cfg, size_t n_dense, size_t experts_all,
                        int ranks) {
    if (!cfg->shard_optimizer || cfg->optimizer == OPTIM_SGD) return;
    const int some[3] = {2, 4, 8}, *R = ranks > 1 ? &ranks : some, n = ranks > 1 ? 1 : 3;
    printf("optimizer sharded (parallel.shard_optimizer): AdamW moments per rank");
    for (int i = 0; i < n; i++) {
        const int ep = cfg->ep_size ? cfg->ep_size : R[i];
        if (R[i] % ep || cfg->model.moe.n_experts % ep) continue;
        const size_t experts = experts_all / (size_t)ep,
                     mine = moe_zero_moments_per_rank(n_dense, experts, R[i], R[i] / ep);
        char a[32], b[32];
        moe_run_header_bytes(a, sizeof a, 2.0 * (double)mine * sizeof(real));
        moe_run_header_bytes(b, sizeof b, 2.0 * (double)(n_dense + experts) * sizeof(real));
        printf("%s R = %d: %s (unsharded %s)", i ? ";" : "", R[i], a, b);
    }
    printf("\n  (each rank: 1/R of the dense parameters' moments, 1/De of its experts' with De = "
           "R / ep_size\n  ranks holding them; the fp32 weights and their bf16 copy stay whole "
           "on every rank)\n");
}

// What moe_run_data_open would read, without reading or preparing anything.
static void dry_data_line(const moe_train_config *cfg, char *buf, size_t n) {
    data_paths d;
    moe_run_data_paths(cfg, &d);
    size_t at = (size_t)snprintf(buf, n, "data:");
    for (int i = 0; i < 2 && at < n; i++) {
        struct stat sb;
        char size[32];
        const char *what = size;
        if (stat(d.path[i], &sb) == 0)
            moe_run_header_bytes(size, sizeof size, (double)sb.st_size);
        else if (d.from_dir && cfg->n_text)
            what = "missing: prepared from data.text by the run";
        else
            what = "missing";
        at += (size_t)snprintf(buf + at, n - at, "%s %s (%s, %s)", i ? ",\n " : "", d.path[i],
                               d.key[i], what);
    }
    if (at < n)
        snprintf(buf + at, n - at, "; %d x %d tokens x %d micro-batch%s per step", cfg->batch_size,
                 cfg->seq_len, cfg->grad_accum, cfg->grad_accum == 1 ? "" : "es");
}

// The peak resident memory of a run of this config (docs/training.md "Memory plan"): every
// buffer above (a step and the validation write them all), one host copy of the parameters
// while a checkpoint is written (ckpt/save.c stages each tensor file through it; with
// parallel.shard_optimizer also the whole AdamW moments it gathers first), the token
// files as read (4 bytes a token) and what this process holds now (libraries, runtime: its own
// peak RSS so far, which the buffers above, allocated but never written, are not part of).
// A device backend's buffers are device memory: the host's part only then. Under expert
// parallelism a rank's expert buffers are allocated for the worst routing and written as far
// as the routing reaches: balanced (> 0: the buffers of a layout capped at T k rows a rank)
// gives the figure at balanced routing beside it.
static void print_peak(const run_memory *mem, double balanced, size_t n_params,
                       const moe_train_config *cfg, const moe_backend *be) {
    const double buffers = memory_total(mem),
                 // (sharded AdamW: the save gathers the whole moments first, 2 more copies)
        staging = (double)n_params * sizeof(real) *
                  (cfg->shard_optimizer && cfg->optimizer == OPTIM_ADAMW ? 3 : 1);
    data_paths d;
    moe_run_data_paths(cfg, &d);
    double tokens = 0;
    int counted = 0;
    for (int i = 0; i < 2; i++) {
        uint64_t n;
        if (moe_token_file_count(d.path[i], &n) == MOE_OK) tokens += 4.0 * (double)n, counted++;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double base = (double)ru.ru_maxrss * 1024; // Linux: KiB
    const double rest = staging + tokens + base, host = (be->host_memory ? buffers : 0) + rest;
    char b[32], s[32], t[32], p[32];
    moe_run_header_bytes(b, sizeof b, buffers);
    moe_run_header_bytes(s, sizeof s, staging);
    moe_run_header_bytes(t, sizeof t, tokens);
    moe_run_header_bytes(p, sizeof p, base);
    if (be->host_memory)
        printf("peak memory per rank, predicted: %.1f MiB resident: the buffers above %s,\n",
               host / 1048576, b);
    else
        printf(
            "peak memory per rank, predicted: %.1f MiB resident on the host (the buffers above,\n"
            "  %s, are device memory):\n",
            host / 1048576, b);
    printf("  checkpoint staging %s, token files %s%s, this process %s (`moe train` ends with the\n"
           "  measured peak RSS)\n",
           s, t, counted == 2 ? "" : " (not prepared yet: not counted)", p);
    if (balanced > 0 && be->host_memory && balanced < buffers)
        printf("  (that is at the worst routing, which the expert buffers are allocated for; at\n"
               "  balanced routing, T k rows a rank: %.1f MiB)\n",
               (balanced + rest) / 1048576);
}

moe_status moe_trainer_dry_run(const moe_train_config *cfg) {
    printf("# the resolved config: %s with the --set overrides, every key\n",
           cfg->source[0] ? cfg->source : "(defaults)");
    moe_status st = moe_train_config_write(cfg, stdout);
    if (st) return st;
    printf("\n");
    moe_backend *be;
    const moe_backend_options bo = {.threads = cfg->threads,
                                    .tf32 = cfg->tf32,
                                    .attention_cudnn = cfg->attention == MOE_ATTENTION_CUDNN};
    ;
    if ((st = moe_backend_create(&be, cfg->device, &bo)))
        return moe_trainer_key_error(st, "model.device", cfg->device);
    moe_model_config mc = moe_trainer_model_config(cfg);
    const size_t n_params = moe_model_param_count(&mc);
    const size_t n_dense = n_params - (size_t)moe_model_n_moe_layers(&mc) * mc.moe.n_experts * 3 *
                                          (size_t)mc.d_model * mc.moe.d_ff;
    char data_line[3 * MOE_PATH_MAX + 256];
    dry_data_line(cfg, data_line, sizeof data_line);
    // the model allocated as the run would (not initialised, no data): its real buffers; under
    // mpirun -np R (or with parallel.ep_size > 1) those of rank 0 of its expert-parallel group,
    // through a communicator that only gives the layout (allocating never communicates)
    const int R = moe_launch_size() > 1 ? moe_launch_size() : 1,
              R_ep = cfg->ep_size > 0 ? cfg->ep_size : R;
    moe_comm layout = {.name = "layout", .rank = 0, .size = R_ep};
    moe_model m = {0};
    run_memory mem;
    st = moe_model_create_parallel(&m, be, &mc, cfg->batch_size, cfg->seq_len,
                                   R_ep > 1 ? &layout : NULL);
    if (!st) mem = memory_of(&m, cfg, cfg->shard_optimizer ? moe_launch_size() : 1, 1);
    print_header(cfg, &mc, n_params, n_dense, st ? NULL : &mem, moe_last_error(), data_line, be);
    print_plan(cfg, &mc, cfg->ep_size);
    print_shard(cfg, n_dense, n_params - n_dense, moe_launch_size());
    double balanced = 0; // EP: the same layout's buffers capped at T k rows a rank
    const int Tk = cfg->batch_size * cfg->seq_len * mc.moe.top_k;
    if (!st && R_ep > 1 && (mc.dropless_max_rows == 0 || mc.dropless_max_rows > Tk)) {
        moe_model_config capped = mc;
        capped.dropless_max_rows = Tk;
        moe_model mb = {0};
        if (moe_model_create_parallel(&mb, be, &capped, cfg->batch_size, cfg->seq_len, &layout) ==
            MOE_OK) {
            const run_memory r = memory_of(&mb, cfg, cfg->shard_optimizer ? R : 1, 1);
            balanced = memory_total(&r);
        }
        moe_model_destroy(&mb);
    }
    if (!st) print_peak(&mem, balanced, m.n_params, cfg, be);
    if (st) fprintf(stderr, "warning: the model does not allocate here: %s\n", moe_last_error());
    moe_model_destroy(&m);
    moe_backend_destroy(be);
    data_paths d;
    moe_run_data_paths(cfg, &d);
    if (moe_run_data_from_text(cfg, &d) && moe_run_data_check_text(cfg))
        fprintf(stderr, "warning: moe train would stop here: %s\n", moe_last_error());
    return MOE_OK;
}

void moe_run_header_print(const moe_train_config *cfg, const moe_model *m, moe_backend *be,
                          const moe_token_file *train, const moe_token_file *val, int ranks,
                          const char *transport) {
    const int E = m->cfg.moe.n_experts;
    char data_line[2 * MOE_PATH_MAX + 256];
    snprintf(data_line, sizeof data_line,
             "data: %s (%llu tokens), %s (%llu tokens); %d x %d tokens x %d micro-batches per step",
             train->path, (unsigned long long)train->count, val->path,
             (unsigned long long)val->count, cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    const int ep = m->ep ? m->ep->size : 1; // (the model holds E / ep of the experts)
    const int D = cfg->shard_optimizer ? ranks : 1, De = cfg->shard_optimizer ? ranks / ep : 1;
    const run_memory mem = memory_of(m, cfg, D, De);
    print_header(cfg, &m->cfg, m->n_params, m->n_dense, &mem, NULL, data_line, be);
    print_plan(cfg, &m->cfg, m->ep ? m->ep->size : 1);
    print_shard(cfg, m->n_dense, (m->n_params - m->n_dense) * (size_t)ep, ranks);
    printf("note: aux is Switch/Megatron-normalised (balanced = aux_coef); HF's helper reports "
           "top_k times this\n");
    if (ranks > 1 && !m->placement) // the figures above are rank 0's: its experts and buffers
        printf("expert parallelism: %d ranks (%s), groups of %d: each rank holds experts %d..%d "
               "of %d and trains on its own %d x %d tokens x %d micro-batches; memory and "
               "parameters above are per rank\n",
               ranks, transport, m->ep ? m->ep->size : 1, m->expert0, m->expert0 + m->E_local - 1,
               E, cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    if (ranks > 1 && m->placement) { // parallel.expert_placement: the global experts of each rank
        const int El = m->E_local;
        printf("expert parallelism: %d ranks (%s), groups of %d, %d experts placed by "
               "parallel.expert_placement:",
               ranks, transport, m->ep ? m->ep->size : 1, E);
        for (int s = 0; s < E; s++) {
            if (s % El == 0) printf("%s rank %d [", s ? "]," : "", s / El);
            printf("%s%d", s % El ? ", " : "", m->placement[s]);
        }
        printf("]; each trains on its own %d x %d tokens x %d micro-batches; memory and "
               "parameters above are per rank\n",
               cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    }
}
