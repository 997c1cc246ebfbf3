// The router's per-token bodies, shared by every backend (MOE_HD: the CPU compiles them as C,
// CUDA as __host__ __device__ functions), so that scores, the top-k tie rule (strict '>': the
// lower expert index wins), the combine weights, the router gradient and the jitter noise
// are one text: layers/cpu/router.c, losses.c and their twins cuda/router.cu, losses.cu call
// these per token / per element, and the router losses' sums and formulas are one text too.
// The sizes and hyper-parameters come as the kernels' structs (moe_router_shape,
// moe_router_hparams of layers/backend.h).
// Contracts: layers/backend.h (router_topk, router_backward, router_losses, uniform_noise);
// DESIGN.md §3.1, §3.6-3.8, §3.12.
#ifndef MOE_ROUTER_ROWS_H
#define MOE_ROUTER_ROWS_H

#include <stdint.h>

#include "layers/backend.h"
#include "layers/hd.h"
#include "layers/real.h"
#include "layers/rng.h"

// Group-limited routing (DeepSeek-V3's, transformers' DeepseekV3TopkRouter): the groups a
// token may pick from, as bits of a mask (hp.n_group <= 64). Group g holds experts
// [g G, (g+1) G), G = E / n_group; its score is the sum of its two largest v = s + bias; the
// hp.topk_group best groups are kept (strict '>': the lower group index wins a tie).
// hp.n_group <= 1: every group (~0).
MOE_HD static inline uint64_t moe_router_groups_row(const real *s, const real *bias, int E,
                                                    moe_router_hparams hp) {
    if (hp.n_group <= 1) return ~(uint64_t)0;
    const int G = E / hp.n_group;
    real score[64];
    for (int g = 0; g < hp.n_group; g++) {
        real top1 = 0, top2 = 0;
        for (int i = 0; i < G; i++) {
            const int e = g * G + i;
            const real v = bias ? s[e] + bias[e] : s[e];
            if (i == 0 || v > top1)
                top2 = i == 0 ? top2 : top1, top1 = v;
            else if (i == 1 || v > top2)
                top2 = v;
        }
        score[g] = top1 + top2;
    }
    uint64_t kept = 0;
    for (int j = 0; j < hp.topk_group; j++) {
        int best = -1;
        for (int g = 0; g < hp.n_group; g++)
            if (!(kept >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
        kept |= (uint64_t)1 << best;
    }
    return kept;
}

// One token: z [E] logits -> s, p [E] scores and the balancing distribution, *lse, the top k
// experts idx [k] (descending, ties: lower index) of s + bias (bias [E] or NULL), among the
// experts of the groups moe_router_groups_row keeps, and their combine weights w [k]
// (hp: scoring, norm_topk_prob, route_scale, n_group, topk_group).
MOE_HD static inline void moe_router_topk_row(real *s, real *p, real *lse, int *idx, real *w,
                                              const real *z, const real *bias, int E, int k,
                                              moe_router_hparams hp) {
    // lse = max + log(sum exp(z - max)); softmax p = exp(z - lse)
    real zmax = z[0];
    for (int e = 1; e < E; e++) zmax = z[e] > zmax ? z[e] : zmax;
    real sum = 0;
    for (int e = 0; e < E; e++) sum += real_exp(z[e] - zmax);
    *lse = zmax + real_log(sum);
    if (hp.scoring == MOE_SCORE_SOFTMAX) {
        for (int e = 0; e < E; e++) s[e] = p[e] = real_exp(z[e] - zmax) / sum;
    } else {
        real ssum = 0;
        for (int e = 0; e < E; e++) ssum += s[e] = 1 / (1 + real_exp(-z[e]));
        for (int e = 0; e < E; e++) p[e] = s[e] / ssum;
    }

    // top-k by repeated selection (k is small); strict '>' keeps the lower index on ties
    const uint64_t groups = moe_router_groups_row(s, bias, E, hp);
    const int G = hp.n_group > 1 ? E / hp.n_group : E;
    real sel_sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        real best_v = 0;
        for (int e = 0; e < E; e++) {
            int taken = !(groups >> (e / G) & 1);
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            real v = bias ? s[e] + bias[e] : s[e];
            if (!taken && (best < 0 || v > best_v)) best = e, best_v = v;
        }
        idx[j] = best;
        w[j] = s[best];
        sel_sum += s[best];
    }
    for (int j = 0; j < k; j++) w[j] = hp.route_scale * (hp.norm_topk_prob ? w[j] / sel_sum : w[j]);
}

// The scales of moe_router_backward_row, once per call:
// dL/ds'_e(t) = aux_scale c_e + seq_scale c_{b,e};  z-loss: z_scale lse softmax(z).
typedef struct {
    real aux_scale, seq_scale, z_scale;
    int seq_on; // seq_aux_coef != 0 (seq_counts is read only then)
} moe_router_grad_scales;

MOE_HD static inline moe_router_grad_scales
moe_router_grad_scales_of(moe_router_shape sh, moe_router_hparams hp, real dloss) {
    const int T = sh.T, E = sh.E, k = sh.k, seq_len = sh.seq_len, B = T / seq_len;
    moe_router_grad_scales g;
    const int Tf = hp.aux_tokens > 0 ? hp.aux_tokens : T; // f's tokens (P's are T)
    g.aux_scale = dloss * hp.aux_coef * (real)E / ((real)k * (real)Tf * (real)T);
    g.seq_scale =
        dloss * hp.seq_aux_coef * (real)E / ((real)B * (real)k * (real)seq_len * (real)seq_len);
    g.z_scale = dloss * 2 * hp.z_coef / (real)T;
    g.seq_on = hp.seq_aux_coef != 0;
    return g;
}

// One token's dL/dz, g [E] (written): the balancing losses through s' (f counts: counts [E],
// this token's sequence's sc [E]), the combine weights dw [k], the scoring Jacobian, the
// z-loss. s, p, z [E]; idx, w [k]; lse this token's; hp: scoring, norm_topk_prob, route_scale.
MOE_HD static inline void
moe_router_backward_row(real *g, const real *dw, const real *s, const real *p, const real *z,
                        real lse, const int *idx, const real *w, const int *counts, const int *sc,
                        int E, int k, moe_router_hparams hp, moe_router_grad_scales sc_) {
    const real route_scale = hp.route_scale;
    // balancing losses, through the distribution s'
    for (int e = 0; e < E; e++)
        g[e] = sc_.aux_scale * (real)counts[e] + (sc_.seq_on ? sc_.seq_scale * (real)sc[e] : 0);
    if (hp.scoring ==
        MOE_SCORE_SIGMOID) { // s' = s / sum(s): dL/ds_e = (g_e - sum_j g_j s'_j) / sum(s)
        real ssum = 0, dot = 0;
        for (int e = 0; e < E; e++) ssum += s[e], dot += g[e] * p[e];
        for (int e = 0; e < E; e++) g[e] = (g[e] - dot) / ssum;
    }
    // combine weights: w_j = rs s_j / S  =>  dL/ds_i = (rs dw_i - sum_j dw_j w_j) / S;
    // unnormalised: dL/ds_i = rs dw_i
    if (hp.norm_topk_prob) {
        real sel_sum = 0, dot = 0;
        for (int j = 0; j < k; j++) sel_sum += s[idx[j]], dot += dw[j] * w[j];
        for (int j = 0; j < k; j++) g[idx[j]] += (route_scale * dw[j] - dot) / sel_sum;
    } else {
        for (int j = 0; j < k; j++) g[idx[j]] += route_scale * dw[j];
    }
    // scores to logits: softmax dz_e = p_e (g_e - sum_i p_i g_i); sigmoid dz = g s (1 - s)
    if (hp.scoring == MOE_SCORE_SOFTMAX) {
        real pg = 0;
        for (int e = 0; e < E; e++) pg += p[e] * g[e];
        for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - pg);
    } else {
        for (int e = 0; e < E; e++) g[e] *= s[e] * (1 - s[e]);
    }
    // z-loss: d/dz_e of z_coef mean_t lse^2 = (2 z_coef / T) lse softmax(z)_e
    for (int e = 0; e < E; e++) g[e] += sc_.z_scale * lse * real_exp(z[e] - lse);
}

// The router losses' sums over tokens, in double (router_losses; DESIGN.md §3.6, §3.7):
// aux = sum_t sum_e c_e p_e(t) (f_e P_e = aux / (k T^2)), seq = the same with each token's
// sequence's counts, ent = sum_t H(p(t)), z = sum_t lse_t^2, lse = sum_t lse_t, and the
// logits' sum, sum of squares and largest |z| (a NaN logit makes zmax NaN).
typedef struct {
    double aux, seq, ent, z, lse, zsum, zsq, zmax;
} moe_router_loss_sums;

MOE_HD static inline moe_router_loss_sums moe_router_loss_sums_add(moe_router_loss_sums a,
                                                                   moe_router_loss_sums b) {
    a.aux += b.aux, a.seq += b.seq, a.ent += b.ent, a.z += b.z, a.lse += b.lse;
    a.zsum += b.zsum, a.zsq += b.zsq;
    a.zmax = b.zmax > a.zmax || b.zmax != b.zmax ? b.zmax : a.zmax;
    return a;
}

// One token's terms: p, z [E] its distribution and logits, lse its log-sum-exp; counts [E]
// the micro-batch's assignments, sc [E] its sequence's (read only when seq_on).
MOE_HD static inline moe_router_loss_sums moe_router_loss_row(const real *p, const real *z,
                                                              real lse, const int *counts,
                                                              const int *sc, int E, int seq_on) {
    moe_router_loss_sums r = {0, 0, 0, 0, 0, 0, 0, 0};
    r.z = (double)lse * lse, r.lse = lse;
    for (int e = 0; e < E; e++) {
        r.aux += (double)counts[e] * p[e];
        if (seq_on) r.seq += (double)sc[e] * p[e];
        if (p[e] > 0) r.ent -= (double)p[e] * log((double)p[e]);
        r.zsum += z[e], r.zsq += (double)z[e] * z[e];
        const double a = fabs((double)z[e]);
        r.zmax = a > r.zmax || a != a ? a : r.zmax;
    }
    return r;
}

// The loss slots (MOE_LOSS_*) from the sums over all T tokens of B = T / seq_len sequences:
// L_aux = aux_coef E aux / (k Tf T) (Tf: hp.aux_tokens or T), L_seq = seq_aux_coef E seq / (B k seq_len^2),
// L_z = z_coef z / T, and the statistics (mean entropy, logits' mean, std, max |z|, mean lse).
MOE_HD static inline void moe_router_losses_of(real *out, moe_router_loss_sums s,
                                               moe_router_shape sh, moe_router_hparams hp) {
    const int T = sh.T, E = sh.E, k = sh.k, seq_len = sh.seq_len, B = T / seq_len;
    const real aux_coef = hp.aux_coef, seq_aux_coef = hp.seq_aux_coef, z_coef = hp.z_coef;
    const double n = (double)T * E, mean = s.zsum / n;
    const double Tf = hp.aux_tokens > 0 ? hp.aux_tokens : T; // f's tokens (P's are T)
    out[MOE_LOSS_AUX] = (real)((double)aux_coef * E * s.aux / ((double)k * Tf * T));
    out[MOE_LOSS_Z] = (real)((double)z_coef * s.z / T);
    out[MOE_LOSS_ENTROPY] = (real)(s.ent / T);
    out[MOE_LOSS_SEQ_AUX] =
        (real)((double)seq_aux_coef * E * s.seq / ((double)B * k * seq_len * seq_len));
    out[MOE_LOSS_LOGIT_MEAN] = (real)mean;
    out[MOE_LOSS_LOGIT_STD] = (real)sqrt(fmax(s.zsq / n - mean * mean, 0.0));
    out[MOE_LOSS_LOGIT_MAX_ABS] = (real)s.zmax;
    out[MOE_LOSS_LSE_MEAN] = (real)(s.lse / T);
}

// Jitter: element i of the noise of `key`, uniform in [lo, hi) (24 random bits), counter-based.
MOE_HD static inline real moe_noise_value(uint64_t key, uint64_t i, real lo, real hi) {
    const uint64_t x = moe_mix64(key ^ (MOE_GOLDEN_GAMMA * (i + 1)));
    return lo + (hi - lo) * (real)((double)(x >> 40) * 0x1.0p-24);
}

#endif
