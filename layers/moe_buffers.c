// The MoE layer's buffers (moe.h): creating a layer for its largest group (the routing, the
// expert rows, the exchange's staging and the dedup plan), the backward scratch that the
// model's layers share, and freeing them. The forward and backward are layers/moe.c.
#include "layers/moe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layers/moe_internal.h"

typedef struct {
    void **ptr;
    size_t bytes;
} buffer_spec;

void moe_row_bytes(const moe_config *cfg, size_t *forward, size_t *backward) {
    // forward: xp [d], h13 [2ff], act [ff], ye [d]; backward: dye, dact, dh13, dxp likewise
    const size_t per_row = (2 * (size_t)cfg->d_model + 3 * (size_t)cfg->d_ff) * sizeof(real);
    *forward = per_row;
    *backward = per_row;
}

// Allocates every spec from the backend, adding to *bytes; on failure frees what it got. A
// spec of 0 bytes (a part this layer does not use) stays NULL.
static moe_status alloc_specs(moe_backend *be, const buffer_spec *specs, size_t n, size_t *bytes) {
    for (size_t i = 0; i < n; i++) {
        if (!specs[i].bytes) {
            *specs[i].ptr = NULL;
            continue;
        }
        *specs[i].ptr = be->alloc(be, specs[i].bytes);
        if (!*specs[i].ptr) {
            for (size_t j = 0; j < i; j++)
                if (*specs[j].ptr) be->free(be, *specs[j].ptr), *specs[j].ptr = NULL;
            return moe_error(MOE_ENOMEM, "moe: cannot allocate %zu bytes of activations on %s",
                             specs[i].bytes, be->name);
        }
        *bytes += specs[i].bytes;
    }
    return MOE_OK;
}

size_t moe_layer_rows_bound(const moe_config *cfg, const moe_layer_shape *shape) {
    const int R = shape->ep ? shape->ep->size : 1, E = cfg->n_experts, El = R > 1 ? E / R : E;
    return (size_t)R * shape->max_tokens * (size_t)(cfg->top_k < El ? cfg->top_k : El);
}

// The shape with its defaults filled in and checked against the config.
static moe_status resolve_shape(moe_layer_shape *out, const moe_config *cfg,
                                const moe_layer_shape *shape) {
    *out = *shape;
    if (out->max_tokens < 1)
        return moe_error(MOE_EINVAL, "moe: max_tokens=%d must be >= 1", out->max_tokens);
    const int E = cfg->n_experts, R = out->ep ? out->ep->size : 1;
    if (R > 1 && E % R)
        return moe_error(MOE_EINVAL,
                         "moe: n_experts=%d is not divisible by the %d ranks of the "
                         "expert-parallel group",
                         E, R);
    const int El = E / R, first = R > 1 ? out->ep->rank * El : 0;
    if ((out->n_local_experts && out->n_local_experts != El) ||
        (out->first_expert && out->first_expert != first))
        return moe_error(MOE_EINVAL,
                         "moe: a layer holding experts %d..%d of %d needs an expert "
                         "exchange that gives it those (this one: %d..%d over %d rank(s))",
                         out->first_expert, out->first_expert + out->n_local_experts - 1, E, first,
                         first + El - 1, R);
    out->n_local_experts = El, out->first_expert = first;
    const size_t T = out->max_tokens, k = cfg->top_k, N = T * k;
    const size_t bound = moe_layer_rows_bound(cfg, out);
    const size_t wide = cfg->d_model > cfg->d_ff ? cfg->d_model : cfg->d_ff;
    if ((N > bound ? N : bound) * wide > INT32_MAX)
        return moe_error(MOE_EINVAL, "moe: max_tokens*top_k*max(d_model,d_ff) = %zu exceeds 2^31-1",
                         (N > bound ? N : bound) * wide);
    if (out->max_expert_rows < 0)
        return moe_error(MOE_EINVAL, "moe: max_expert_rows=%d must be >= 0", out->max_expert_rows);
    if (out->max_expert_rows == 0 || (size_t)out->max_expert_rows > bound)
        out->max_expert_rows = (int)bound; // a cap above what routing can reach changes nothing
    return MOE_OK;
}

moe_status moe_backward_scratch_init(moe_backward_scratch *s, moe_backend *be,
                                     const moe_config *cfg, const moe_layer_shape *shape) {
    memset(s, 0, sizeof *s);
    moe_layer_shape sh;
    moe_status st = resolve_shape(&sh, cfg, shape);
    if (st) return st;
    const size_t T = sh.max_tokens, E = cfg->n_experts, k = cfg->top_k, d = cfg->d_model,
                 ff = cfg->d_ff, N = T * k, Ne = sh.max_expert_rows, R = sizeof(real);
    const int ep = sh.ep && sh.ep->size > 1;
    buffer_spec specs[] = {
        {(void **)&s->dlogits, T * E * R},
        {(void **)&s->dweights, T * k * R},
        {(void **)&s->dye, N * d * R},
        {(void **)&s->dact, Ne * ff * R},
        {(void **)&s->dh13, 2 * Ne * ff * R},
        {(void **)&s->dxe, Ne * d * R},
        // expert parallelism: the rows at the experts and the exchange staging are their own
        {(void **)&s->dye_e, Ne * d * R},
        {(void **)&s->dstage, Ne * d * R},
        {(void **)&s->dxp, N * d * R},
    };
    const size_t n_specs = sizeof specs / sizeof specs[0] - (ep ? 0 : 3);
    if ((st = alloc_specs(be, specs, n_specs, &s->bytes))) return st;
    s->be = be;
    if (cfg->dtype == MOE_DTYPE_BF16) {
        // dlogits or dY rounded (the experts' dh13_16 goes into dh13: see h13_stage)
        size_t g = T * E;
        g = g > Ne * d ? g : Ne * d;
        buffer_spec b16 = {(void **)&s->g16, g * sizeof(moe_bf16)};
        if ((st = alloc_specs(be, &b16, 1, &s->bytes))) {
            moe_backward_scratch_free(s);
            return st;
        }
        // the forward's fp32 h13 (read by SwiGLU only) lives in dh13, which the bf16 backward
        // uses only for its rounded dh13_16 (half the bytes), after the forward is done
        s->h13_stage = s->dh13;
    }
    if (!ep) s->dye_e = s->dye, s->dxp = s->dxe; // one rank: the experts' rows are its own
    return MOE_OK;
}

void moe_backward_scratch_free(moe_backward_scratch *s) {
    if (s->be) {
        void *bufs[] = {s->dlogits, s->dweights, s->dye,    s->dact,
                        s->dh13,    s->dxe,      s->dstage, s->g16}; // h13_stage: dh13
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) s->be->free(s->be, bufs[i]);
        if (s->dstage) s->be->free(s->be, s->dye_e), s->be->free(s->be, s->dxp); // EP's own
    }
    memset(s, 0, sizeof *s);
}

// The dedup exchange's plan (host, and device copies of the indexes the kernels read) and
// the packets' combine weights and their gradients (device).
static moe_status create_packet_buffers(moe_layer *L) {
    const size_t T = L->max_tokens, k = L->cfg.top_k, R = L->ep_size, Ne = L->max_expert_rows;
    const size_t P_send = T * (k < R ? k : R), P_recv = R * T, I = sizeof(int);
    buffer_spec specs[] = {
        {(void **)&L->d_pk_token, P_send * I},
        {(void **)&L->d_pk_home, T * R * I},
        {(void **)&L->d_pk_expand, Ne * I},
        {(void **)&L->d_pk_assign, P_recv * k * I},
        {(void **)&L->d_pk_assign_b, P_recv * k * I},
        {(void **)&L->d_pk_perm_b, P_recv * I},
        {(void **)&L->w_send, P_send * k * sizeof(real)},
        {(void **)&L->w_recv, P_recv * k * sizeof(real)},
        {(void **)&L->w_recv_b, P_recv * k * sizeof(real)},
        {(void **)&L->dw_recv, P_recv * k * sizeof(real)},
        {(void **)&L->dw_send, P_send * k * sizeof(real)},
    };
    moe_status st = alloc_specs(L->be, specs, sizeof specs / sizeof specs[0], &L->bytes);
    if (st) return st;
    // (pk_slots: one spare item, the plan's scratch)
    L->pk_token = malloc((P_send + T * R + (P_send + 1) * (k + 1) + P_recv * (3 * k + 3) + Ne) * I);
    if (!L->pk_token) return moe_error(MOE_ENOMEM, "moe: out of host memory");
    L->pk_home = L->pk_token + P_send;
    L->pk_slots = L->pk_home + T * R;
    L->pk_slots_in = L->pk_slots + (P_send + 1) * (k + 1);
    L->pk_assign = L->pk_slots_in + P_recv * (k + 1);
    L->pk_assign_b = L->pk_assign + P_recv * k;
    L->pk_perm_b = L->pk_assign_b + P_recv * k;
    L->pk_order = L->pk_perm_b + P_recv;
    L->pk_expand = L->pk_order + P_recv;
    return MOE_OK;
}

// Expert parallelism: the received rows and the local experts' own input and output rows
// (device), and the exchange plan (host).
static moe_status create_exchange_buffers(moe_layer *L) {
    const size_t Ne = L->max_expert_rows, d = L->cfg.d_model, R = L->ep_size, El = L->E_local;
    buffer_spec specs[] = {
        {(void **)&L->xr, Ne * d * sizeof(real)},
        {(void **)&L->xe, Ne * d * sizeof(real)},
        {(void **)&L->ye_local, (size_t)L->owns_hidden * Ne * d * sizeof(real)},
    };
    moe_status st = alloc_specs(L->be, specs, 3, &L->bytes);
    if (st) {
        L->xe = L->ye_local = NULL;
        return st;
    }
    const size_t C = (size_t)L->chunks;
    L->send_rows = calloc(2 * R * El + 2 * R + El + 1 + (C + 1) + 8 * C * R, sizeof(int));
    L->to_expert = calloc(2 * R * El, sizeof(moe_row_chunk));
    L->sent_bytes = calloc(R, sizeof(long));
    if (!L->send_rows || !L->to_expert || !L->sent_bytes)
        return moe_error(MOE_ENOMEM, "moe: out of host memory");
    L->recv_rows = L->send_rows + R;
    L->send_counts = L->recv_rows + R;
    L->recv_counts = L->send_counts + R * El;
    L->local_offsets = L->recv_counts + R * El;
    L->chunk_expert = L->local_offsets + El + 1;
    L->tok_rows = L->chunk_expert + C + 1;
    L->tok_at = L->tok_rows + C * R, L->exp_rows = L->tok_at + C * R;
    L->exp_at = L->exp_rows + C * R;
    L->tokb_rows = L->exp_at + C * R, L->tokb_at = L->tokb_rows + C * R;
    L->expb_rows = L->tokb_at + C * R, L->expb_at = L->expb_rows + C * R;
    for (size_t c = 0; c <= C; c++) L->chunk_expert[c] = (int)(c * El / C);
    L->to_source = L->to_expert + R * El;
    return L->cfg.exchange == MOE_EXCHANGE_DEDUP ? create_packet_buffers(L) : MOE_OK;
}

// bf16: the fp32 xp, xe, act and h13 are read only by the bf16 rounding (and SwiGLU) right
// after the kernel that writes them (the backward reads xe16, act16 and h13_16; on one rank
// xp and xe are not written at all: dispatch rounds as it gathers), so they need no memory
// of their own per layer: the backward scratch's dxp, dxe, dact and h13_stage (same shapes)
// hold them in the forward, which never overlaps a backward. Frees the layer's own.
static moe_status stage_in_scratch(moe_layer *L) {
    moe_backend *be = L->be;
    const size_t N = (size_t)L->max_tokens * L->cfg.top_k, Ne = L->max_expert_rows,
                 d = L->cfg.d_model, ff = L->cfg.d_ff, R = sizeof(real);
    buffer_spec h16 = {(void **)&L->h13_16,
                       (size_t)L->owns_hidden * 2 * Ne * ff * sizeof(moe_bf16)};
    moe_status st = alloc_specs(be, &h16, 1, &L->bytes);
    if (st) return st;
    if (L->act) be->free(be, L->act), L->bytes -= Ne * ff * R; // (recompute: none of its own)
    if (L->h13) be->free(be, L->h13), L->bytes -= 2 * Ne * ff * R;
    be->free(be, L->xp), L->bytes -= N * d * R;
    if (L->ep) be->free(be, L->xe), L->bytes -= Ne * d * R;
    L->act = L->bwd->dact, L->h13 = L->bwd->h13_stage;
    L->xp = L->bwd->dxp, L->xe = L->bwd->dxe; // one rank: dxp == dxe
    L->staged_in_bwd = 1;
    return MOE_OK;
}

// Recompute: src's hidden buffers (h13, act, bf16 h13_16 and act16, EP's ye_local) serve this
// layer too (it allocated none: owns_hidden 0; staged h13 and act are the shared scratch's
// already). Backwards run one layer at a time, each recomputing them first.
static moe_status adopt_hidden(moe_layer *L, const moe_layer *src) {
    if (src->be != L->be || src->max_expert_rows != L->max_expert_rows ||
        src->cfg.d_ff != L->cfg.d_ff || src->cfg.d_model != L->cfg.d_model ||
        src->cfg.dtype != L->cfg.dtype || src->ep_size != L->ep_size || !src->owns_hidden)
        return moe_error(MOE_EINVAL, "moe: recompute shares the hidden buffers of a layer of "
                                     "another shape (or one that does not own them)");
    if (!L->staged_in_bwd) L->h13 = src->h13, L->act = src->act;
    L->act16 = src->act16, L->h13_16 = src->h13_16;
    if (L->xr) L->ye_local = src->ye_local; // expert parallelism (one rank: ye, kept)
    return MOE_OK;
}

// Every kernel a bf16 layer calls is in the backend's table.
static int has_bf16_kernels(const moe_backend *be) {
    return be->to_bf16 && be->from_bf16 && be->matmul_bf16 && be->expert_matmul_forward_bf16 &&
           be->swiglu_forward_bf16 && be->swiglu_backward_bf16 && be->expert_swiglu_forward_bf16 &&
           be->expert_swiglu_backward_bf16 && be->moe_permute_bf16 &&
           be->moe_combine_backward_bf16 && be->expert_matmul_backward_input_bf16 &&
           be->expert_matmul_backward_weight_bf16;
}

// The backward scratch the shape hands over, else (a layer on its own, not forward-only) one
// of the layer's own; the layer's gradient pointers into it.
static moe_status attach_backward_scratch(moe_layer *L, const moe_layer_shape *shape,
                                          const moe_layer_shape *sh) {
    L->bwd = shape->scratch;
    if (!L->bwd && !shape->forward_only) {
        L->bwd = malloc(sizeof *L->bwd);
        if (!L->bwd) return moe_error(MOE_ENOMEM, "moe: out of host memory");
        L->owns_bwd = 1;
        moe_status st = moe_backward_scratch_init(L->bwd, L->be, &L->cfg, sh);
        if (st) return st;
        L->bytes += L->bwd->bytes;
    }
    if (L->bwd) {
        L->dlogits = L->bwd->dlogits, L->dweights = L->bwd->dweights, L->dye = L->bwd->dye;
        L->dact = L->bwd->dact, L->dh13 = L->bwd->dh13, L->dxp = L->bwd->dxp;
    }
    return MOE_OK;
}

moe_status moe_layer_create(moe_layer *L, moe_backend *be, const moe_config *cfg,
                            const moe_layer_shape *shape) {
    memset(L, 0, sizeof *L);
    // recompute: the layers after the first allocate no hidden buffers (adopt_hidden)
    L->owns_hidden = !(shape->recompute && shape->hidden_from && !shape->forward_only);
    if (!be) return moe_error(MOE_EINVAL, "moe: backend is NULL");
    moe_status st = moe_config_check(cfg);
    if (st) return st;
    if (cfg->dtype == MOE_DTYPE_BF16 && !has_bf16_kernels(be))
        return moe_error(MOE_EINVAL,
                         "moe: backend %s has no bf16 kernels yet (dtype bf16 needs them; fp32 "
                         "runs on it)",
                         be->name);
    moe_layer_shape sh;
    if ((st = resolve_shape(&sh, cfg, shape))) return st;
    const size_t T = sh.max_tokens, E = cfg->n_experts, k = cfg->top_k, d = cfg->d_model,
                 ff = cfg->d_ff, N = T * k, Ne = sh.max_expert_rows;
    L->cfg = *cfg;
    L->be = be;
    L->max_tokens = sh.max_tokens;
    L->E_local = sh.n_local_experts, L->expert0 = sh.first_expert;
    L->max_expert_rows = sh.max_expert_rows;
    L->rows_bound = (int)moe_layer_rows_bound(cfg, &sh);
    L->ep = sh.ep && sh.ep->size > 1 ? sh.ep : NULL;
    L->ep_size = L->ep ? L->ep->size : 1;
    L->chunks = 1; // one rank: no exchange to overlap (as cfg.exchange has no effect there)
    // (a forward-only layer: one exchange; the pipelined dedup combine sums into the backward
    // scratch, which it has not)
    if (L->ep && cfg->overlap_chunks > 1 && !shape->forward_only) {
        if (cfg->overlap_chunks > L->E_local)
            return moe_error(MOE_EINVAL,
                             "moe: overlap_chunks=%d exceeds the %d experts of a rank (chunks are "
                             "groups of local experts)",
                             cfg->overlap_chunks, L->E_local);
        L->chunks = cfg->overlap_chunks;
    }

    const size_t R = sizeof(real), I = sizeof(int);
    // the router's jittered input and its noise: training with jitter only (else never touched)
    const size_t J = cfg->jitter_eps > 0 && !shape->forward_only ? T * d * R : 0,
                 own = (size_t)L->owns_hidden;
    buffer_spec specs[] = {
        {(void **)&L->logits, T * E * R},
        {(void **)&L->probs, T * E * R},
        {(void **)&L->scores, T * E * R},
        {(void **)&L->seq_counts, T * E * I},
        {(void **)&L->jitter, J},
        {(void **)&L->router_in, J},
        {(void **)&L->lse, T * R},
        {(void **)&L->weights, T * k * R},
        {(void **)&L->assign_row, N * I},
        {(void **)&L->row_token, N * I},
        {(void **)&L->scratch, 2 * N * I},
        {&L->readback, readback_bytes((int)E) + 2 * N * I},
        {(void **)&L->xp, N * d * R},
        {(void **)&L->h13, own * 2 * Ne * ff * R},
        {(void **)&L->act, own * Ne * ff * R},
        {(void **)&L->ye, N * d * R},
        {(void **)&L->aux_counts, E * I},
    };
    if ((st = alloc_specs(be, specs, sizeof specs / sizeof specs[0], &L->bytes))) {
        memset(L, 0, sizeof *L);
        return st;
    }
    L->counts = L->readback;
    L->losses = (real *)((char *)L->readback + readback_loss_offset((int)E));
    L->topk_idx = readback_topk(L->readback, (int)E);
    L->keep = readback_keep(L, L->readback);
    L->xe = L->xp, L->ye_local = L->ye; // one rank: the exchange is the identity
    if (cfg->dtype == MOE_DTYPE_BF16) {
        const size_t B = sizeof(moe_bf16);
        buffer_spec b16[] = {
            {(void **)&L->router_in16, T * d * B},
            {(void **)&L->xe16, Ne * d * B},
            {(void **)&L->act16, own * Ne * ff * B},
        };
        if ((st = alloc_specs(be, b16, 3, &L->bytes))) {
            moe_layer_free(L);
            return st;
        }
    }
    if (L->ep && (st = create_exchange_buffers(L))) {
        moe_layer_free(L);
        return st;
    }
    if ((st = attach_backward_scratch(L, shape, &sh)) ||
        (cfg->dtype == MOE_DTYPE_BF16 && L->bwd && (st = stage_in_scratch(L)))) {
        moe_layer_free(L);
        return st;
    }
    L->host_readback = calloc(1, readback_bytes((int)E) + 2 * N * I);
    L->host_kept = calloc(E, I);
    L->coact = calloc(E * E, sizeof(long));
    if (!L->host_readback || !L->host_kept || !L->coact) {
        moe_layer_free(L);
        return moe_error(MOE_ENOMEM, "moe: cannot allocate host counts");
    }
    L->host_counts = L->host_readback;
    L->host_losses = (real *)((char *)L->host_readback + readback_loss_offset((int)E));
    L->recompute = shape->recompute && L->bwd;
    if (!L->owns_hidden && (st = adopt_hidden(L, shape->hidden_from))) {
        moe_layer_free(L);
        return st;
    }
    return MOE_OK;
}

moe_status moe_layer_init(moe_layer *L, moe_backend *be, const moe_config *cfg, int max_tokens) {
    const moe_layer_shape shape = {.max_tokens = max_tokens};
    return moe_layer_create(L, be, cfg, &shape);
}

void moe_layer_free(moe_layer *L) {
    if (L->be) {
        void *bufs[] = {
            L->logits,  L->probs,        L->scores,     L->seq_counts,
            L->jitter,  L->router_in,    L->lse,        NULL /* topk_idx: in readback */,
            L->weights, NULL /* keep */, L->assign_row, L->row_token,
            L->scratch, L->readback,     L->xp,         L->h13,
            L->act,     L->ye,           L->xr,         L->router_in16,
            L->xe16,    L->act16,        L->h13_16,     L->aux_counts};
        if (L->staged_in_bwd) bufs[14] = bufs[15] = bufs[16] = NULL; // xp, h13, act: bwd's
        if (!L->owns_hidden) bufs[15] = bufs[16] = bufs[21] = bufs[22] = NULL; // another's
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) L->be->free(L->be, bufs[i]);
        if (L->xr) { // expert parallelism: the experts' rows are their own buffers
            if (L->xe && !L->staged_in_bwd) L->be->free(L->be, L->xe);
            if (L->ye_local && L->owns_hidden) L->be->free(L->be, L->ye_local);
        }
        void *packets[] = {L->d_pk_token,    L->d_pk_home,   L->d_pk_expand, L->d_pk_assign,
                           L->d_pk_assign_b, L->d_pk_perm_b, L->w_send,      L->w_recv,
                           L->w_recv_b,      L->dw_recv,     L->dw_send};
        for (size_t i = 0; i < sizeof packets / sizeof packets[0]; i++)
            if (packets[i]) L->be->free(L->be, packets[i]);
    }
    free(L->pk_token);
    free(L->send_rows);
    free(L->to_expert);
    free(L->sent_bytes);
    if (L->owns_bwd) {
        moe_backward_scratch_free(L->bwd);
        free(L->bwd);
    }
    free(L->host_readback);
    free(L->coact);
    free(L->host_kept);
    memset(L, 0, sizeof *L);
}
