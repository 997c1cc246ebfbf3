#!/usr/bin/env python3
"""Generate reference fixtures for the C Mixture-of-Experts (MoE) layer.

Independent PyTorch reference (float64, autograd, dense/vectorised) of a
top-k routed SwiGLU MoE layer with capacity dropping, load-balancing loss and
router z-loss.  Run as

    /usr/bin/python3 scripts/make_fixtures.py --out tests/fixtures

Output is deterministic (byte-identical on regeneration).

File format (little-endian), read by the C tests:
    8 bytes magic  b"MOEFIX1\\0"
    u32 n_tensors
    n_tensors records:
        u32 name_len, name bytes (no NUL),
        u32 dtype (0 = float32, 1 = int32, 2 = float64),
        u32 ndim, ndim x i64 dims,
        data, row-major.
    Scalars are tensors with ndim = 0 (one element).

    (numpy's ascontiguousarray makes 0-d scalars 1-d, so scalars are in
    fact written with ndim = 1, dims [1]; readers go by element count.)

Structure:
    moe_reference(...)      the reference forward + backward of one MoE layer
    make_inputs(...)        seeded float32 input draw
    check_margins(...)      float32-robustness of the discrete decisions
    write_fixture / read_fixture
    self-checks             finite differences, balanced-routing aux loss,
                            file round trip
  extended options (EXT_CASES, tests/fixtures/moe_*.bin, all off by default
  so the original cases are unchanged; DESIGN 3.1/3.9):
    bias [E]                aux-loss-free bias (DeepSeek-V3): selection on
                            score + bias, weights from the unbiased scores
    scoring sigmoid         s = sigmoid(z), w = s_sel/sum * route_scale;
                            balance losses / entropy on s' = s / sum_e s
    route_scale             multiplies the combine weights (both scorings)
    seq_len, seq_aux_coef   sequence-wise balance loss, reported as seq_aux
    jitter_noise [T,d]      router input x*u (an input of the fixture);
                            the experts see x
    extra tensors: scoring, seq_len, route_scale, seq_aux_coef, jitter_eps,
    bias, jitter_noise, seq_aux, scores (fixture_tensors_ext)
    self-checks             finite differences (every extended case), the
                            neutral extended path == every original case bit
                            for bit, aux/seq_aux == explicit loops,
                            seq_len = T gives seq_aux == aux
  whole model (tests/fixtures/model_*.bin):
    mixtral_forward(...)    HF Mixtral decoder in float64 (rmsnorm,
                            apply_rope, attention, moe_forward, lm_head, CE)
    train_reference(...)    steps of clip_grad_norm + adamw_step (torch
                            AdamW semantics) with margin checks per step
    self-checks             finite differences of the total loss, causality,
                            optimizer == torch.optim.AdamW

    --only moe|model        regenerate one family (default: all)
"""

import argparse
import math
import os
import struct
import sys

import numpy as np
import torch

# Determinism: single-threaded CPU maths so reductions always happen in the
# same order (byte-identical fixtures regardless of the host core count).
torch.set_num_threads(1)

MAGIC = b"MOEFIX1\0"
DTYPE_F32, DTYPE_I32, DTYPE_F64 = 0, 1, 2
_NP_OF_CODE = {DTYPE_F32: np.dtype("<f4"), DTYPE_I32: np.dtype("<i4"),
               DTYPE_F64: np.dtype("<f8")}
_CODE_OF_NP = {np.dtype(np.float32): DTYPE_F32, np.dtype(np.int32): DTYPE_I32,
               np.dtype(np.float64): DTYPE_F64}

POLICY_DROPLESS, POLICY_PROBS, POLICY_POSITION = 0, 1, 2
POLICY_NAMES = {"dropless": POLICY_DROPLESS, "probs": POLICY_PROBS,
                "position": POLICY_POSITION}
SCORING_SOFTMAX, SCORING_SIGMOID = 0, 1
SCORING_NAMES = {"softmax": SCORING_SOFTMAX, "sigmoid": SCORING_SIGMOID}

MARGIN_REL = 1e-4  # relative gap required between decisive values


# --------------------------------------------------------------------------
# File I/O
# --------------------------------------------------------------------------

def _to_numpy(value):
    """Accept numpy arrays / torch tensors; keep their dtype (f32, i32, f64)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.ascontiguousarray(value)
    if arr.dtype not in _CODE_OF_NP:
        raise TypeError("unsupported dtype %s" % arr.dtype)
    return arr


def write_fixture(path, tensors):
    """Write an ordered list of (name, array) pairs in the MOEFIX1 format."""
    buf = bytearray()
    buf += MAGIC
    buf += struct.pack("<I", len(tensors))
    for name, value in tensors:
        arr = _to_numpy(value)
        code = _CODE_OF_NP[arr.dtype]
        nb = name.encode("ascii")
        buf += struct.pack("<I", len(nb)) + nb
        buf += struct.pack("<II", code, arr.ndim)
        buf += struct.pack("<%dq" % arr.ndim, *arr.shape)
        buf += arr.astype(_NP_OF_CODE[code], copy=False).tobytes(order="C")
    with open(path, "wb") as f:
        f.write(bytes(buf))
    return len(buf)


def read_fixture(path):
    """Read a MOEFIX1 file; returns an ordered dict name -> numpy array."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise ValueError("%s: bad magic" % path)
    (n,) = struct.unpack_from("<I", data, 8)
    off = 12
    out = {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + ln].decode("ascii")
        off += ln
        code, ndim = struct.unpack_from("<II", data, off)
        off += 8
        dims = struct.unpack_from("<%dq" % ndim, data, off)
        off += 8 * ndim
        dt = _NP_OF_CODE[code]
        count = int(np.prod(dims)) if ndim else 1
        arr = np.frombuffer(data, dtype=dt, count=count, offset=off)
        off += count * dt.itemsize
        out[name] = arr.reshape(dims).copy()
    if off != len(data):
        raise ValueError("%s: %d trailing bytes" % (path, len(data) - off))
    return out


# --------------------------------------------------------------------------
# Reference MoE layer
# --------------------------------------------------------------------------

def capacity_of(T, k, E, capacity_factor):
    """Megatron capacity: C = ceil((T*k/E) * cf) in double, 0 = dropless."""
    if capacity_factor <= 0:
        return 0
    return int(math.ceil((T * k / E) * capacity_factor))


def route(x, gate, k, norm_topk_prob, scoring=None, bias=None,
          route_scale=None, jitter=None):
    """Router: logits, scores, top-k selection and combine weights.

    xr = x * jitter  (router input jitter; experts see plain x)  else x
    z = xr @ gate^T                      [T,E]
    s = softmax(z)  (scoring softmax, default)  or  sigmoid(z)  (sigmoid)
    lse = logsumexp(z) per token (z-loss, both scorings)
    top-k of s + bias (bias: selection only, no gradient), descending,
    ties -> lower expert index (stable sort)
    w[t,j] = s_sel / sum_j s_sel   (norm_topk_prob)   else   s_sel,
    then times route_scale.

    The optional arguments default to None = the original code path (no
    operation at all); any value, even a neutral one (bias 0, jitter 1,
    route_scale 1), is applied literally (selfcheck_ext_neutral).
    """
    xr = x if jitter is None else x * jitter
    z = xr @ gate.t()
    if scoring == SCORING_SIGMOID:
        p = torch.sigmoid(z)
    else:
        p = torch.softmax(z, dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    key = p.detach() if bias is None else p.detach() + bias
    # Stable descending sort: equal keys keep ascending expert index.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    topk_idx = order[:, :k]
    p_sel = torch.gather(p, 1, topk_idx)          # differentiable
    if norm_topk_prob:
        w = p_sel / p_sel.sum(dim=-1, keepdim=True)
    else:
        w = p_sel
    if route_scale is not None:
        w = w * route_scale
    return z, p, lse, topk_idx, w


def capacity_keep(topk_idx, w, E, policy, C):
    """Decide which (token, slot) assignments survive the capacity limit.

    Works on dense [T,E] matrices: A[t,e] = 1 iff e is among token t's top-k,
    W[t,e] = its combine weight.  For each expert column:
      probs    : keep the C assignments with the largest W (ties: earlier
                 token wins -> stable sort on -W over tokens);
      position : keep the first C in token order (cumulative count <= C).
    Returns keep [T,k] (bool), in the top-k slot layout.
    """
    T, k = topk_idx.shape
    A = torch.zeros(T, E, dtype=torch.bool)
    A.scatter_(1, topk_idx, True)
    if policy == POLICY_DROPLESS:
        return torch.ones(T, k, dtype=torch.bool)
    if policy == POLICY_PROBS:
        W = torch.zeros(T, E, dtype=torch.float64)
        W.scatter_(1, topk_idx, w.detach())
        key = torch.where(A, W, torch.full_like(W, -math.inf))
        # rank[t,e] = position of token t when column e is sorted by
        # descending weight (stable -> earlier token first among equals).
        order = torch.sort(key, dim=0, descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(0, order, torch.arange(T).unsqueeze(1).expand(T, E))
        keep_dense = A & (rank < C)
    elif policy == POLICY_POSITION:
        # position of the assignment among that expert's assignments, 1-based
        pos = torch.cumsum(A.to(torch.int64), dim=0)
        keep_dense = A & (pos <= C)
    else:
        raise ValueError(policy)
    return torch.gather(keep_dense, 1, topk_idx)


def experts_dense(x, w1, w2, w3):
    """All experts applied to all tokens (dense; cheap at fixture sizes).

    h1 = x w1_e^T, h3 = x w3_e^T, a = silu(h1) * h3, y_e = a w2_e^T
    Returns Y [T,E,d].
    """
    h1 = torch.einsum("td,efd->tef", x, w1)
    h3 = torch.einsum("td,efd->tef", x, w3)
    a = torch.nn.functional.silu(h1) * h3
    return torch.einsum("tef,edf->ted", a, w2)


def moe_forward(x, gate, w1, w2, w3, k, norm_topk_prob, policy,
                capacity_factor, aux_coef, z_coef, scoring=None, bias=None,
                route_scale=None, jitter=None, seq_len=None,
                seq_aux_coef=None):
    """Forward pass; all tensors float64.  Returns a dict of results.

    Optional extensions (None = off, original code path; see route()):
      scoring       SCORING_SOFTMAX / SCORING_SIGMOID
      bias [E]      aux-loss-free bias, selection only
      route_scale   multiplies the combine weights
      jitter [T,d]  multiplicative router-input noise u (router sees x*u)
      seq_len, seq_aux_coef   sequence-wise balance loss (DeepSeek-V3)
    """
    T, d = x.shape
    E = gate.shape[0]
    z, p, lse, topk_idx, w = route(x, gate, k, norm_topk_prob, scoring,
                                   bias, route_scale, jitter)
    # per-token expert distribution for the balance losses / entropy:
    # s'(t) = s(t) / sum_e s_e(t) for sigmoid scores, p itself for softmax
    if scoring == SCORING_SIGMOID:
        pn = p / p.sum(dim=-1, keepdim=True)
    else:
        pn = p

    # counts before dropping: c_e = #assignments to e
    counts = torch.bincount(topk_idx.reshape(-1), minlength=E)
    C = capacity_of(T, k, E, capacity_factor) if policy != POLICY_DROPLESS else 0
    keep = capacity_keep(topk_idx, w, E, policy, C)

    # dense combine matrix G[t,e] = w[t,j] if e = topk_idx[t,j] kept, else 0
    # (scatter is differentiable w.r.t. the weights; dropped -> weight 0,
    #  survivors are NOT renormalised)
    w_kept = w * keep.to(w.dtype)
    G = torch.zeros(T, E, dtype=w.dtype).scatter(1, topk_idx, w_kept)

    # out[t] = sum_e G[t,e] * expert_e(x[t])
    Y = experts_dense(x, w1, w2, w3)
    out = torch.einsum("te,ted->td", G, Y)

    # load balancing: L_aux = aux_coef * E * sum_e f_e P_e,
    # f_e = c_e / (k T) (constant), P_e = mean_t s'_e(t)
    f = (counts.to(torch.float64) / (k * T)).detach()
    P = pn.mean(dim=0)
    L_aux = aux_coef * E * torch.sum(f * P)
    # sequence-wise balance loss: B = T / seq_len sequences of consecutive
    # tokens; L_seq = coef * (1/B) sum_b E sum_e f_be P_be,
    # f_be = c_be / (k seq_len) (constant), P_be = mean_{t in b} s'_e(t)
    L_seq = None
    if seq_aux_coef is not None:
        assert T % seq_len == 0, (T, seq_len)
        B = T // seq_len
        A = torch.zeros(T, E, dtype=torch.float64)
        A.scatter_(1, topk_idx, 1.0)
        c_b = A.view(B, seq_len, E).sum(dim=1)               # [B,E] exact
        f_b = (c_b / (k * seq_len)).detach()
        P_b = pn.view(B, seq_len, E).mean(dim=1)
        L_seq = seq_aux_coef * torch.mean(E * torch.sum(f_b * P_b, dim=-1))
    # router z-loss: L_z = z_coef * mean_t lse(t)^2  (on the logits)
    L_z = z_coef * torch.mean(lse ** 2)
    # router entropy: mean_t -sum_e s' log s'
    entropy = torch.mean(-torch.sum(pn * torch.log(pn), dim=-1))

    kept_counts = torch.zeros(E, dtype=torch.int64)
    kept_counts.scatter_add_(0, topk_idx.reshape(-1),
                             keep.reshape(-1).to(torch.int64))
    res = dict(out=out, aux=L_aux, z=L_z, probs=pn, weights=w,
               entropy=entropy, topk_idx=topk_idx, keep=keep, counts=counts,
               kept_counts=kept_counts, capacity=C, logits=z)
    if L_seq is not None:
        res["seq_aux"] = L_seq
    if scoring is not None or bias is not None:
        res["scores"] = p
        res["sel_key"] = (p.detach() if bias is None
                          else p.detach() + bias)
    return res


def moe_loss(res, dout):
    """Total scalar: sum(out * dout) + L_aux [+ L_seq] + L_z."""
    loss = torch.sum(res["out"] * dout) + res["aux"]
    if "seq_aux" in res:
        loss = loss + res["seq_aux"]
    return loss + res["z"]


def ext_kwargs(cfg, inputs):
    """moe_forward keyword arguments of the extended options (float64).

    {} for the original cases (cfg without "scoring"): original code path.
    """
    if "scoring" not in cfg:
        return {}
    return dict(scoring=cfg["scoring"],
                bias=inputs["bias"].to(torch.float64),
                route_scale=cfg["route_scale"],
                jitter=inputs["jitter_noise"].to(torch.float64),
                seq_len=cfg["seq_len"], seq_aux_coef=cfg["seq_aux_coef"])


def moe_reference(inputs, cfg):
    """Forward + backward in float64 from the (float32) inputs.

    inputs: dict of float32 tensors x, gate, w1, w2, w3, dout.
    cfg: dict with k, norm_topk_prob, policy, capacity_factor, aux_coef,
         z_coef; extended cases also scoring, route_scale, seq_len,
         seq_aux_coef, jitter_eps, and inputs bias, jitter_noise.
    Returns the forward dict plus gradients dx, dgate, dw1, dw2, dw3.
    """
    params = {n: inputs[n].to(torch.float64).clone().requires_grad_(True)
              for n in ("x", "gate", "w1", "w2", "w3")}
    dout = inputs["dout"].to(torch.float64)
    res = moe_forward(params["x"], params["gate"], params["w1"], params["w2"],
                      params["w3"], cfg["k"], cfg["norm_topk_prob"],
                      cfg["policy"], cfg["capacity_factor"], cfg["aux_coef"],
                      cfg["z_coef"], **ext_kwargs(cfg, inputs))
    loss = moe_loss(res, dout)
    loss.backward()
    for n, t in params.items():
        res["d" + n] = t.grad.detach().clone()
    res["loss"] = loss.detach()
    return res


# --------------------------------------------------------------------------
# Inputs and margin checks
# --------------------------------------------------------------------------

def make_inputs(seed, T, d, ff, E, skew, bias_std=None, jitter_eps=None):
    """Seeded float32 draw.

    x ~ N(0,1); gate ~ 0.3 N(0,1) plus a skew: expert e's gate row gets
    skew * s_e * u added, u = unit mean direction of x, s_e = 1, 0.5, 0, ...
    (favours the first experts so capacity cases drop assignments);
    w1, w3 ~ N(0,1)/sqrt(d); w2 ~ N(0,1)/sqrt(ff); dout ~ N(0,1).

    Extended cases (bias_std / jitter_eps not None) also get, drawn after
    the above from the same generator (so x..dout are those of the seed):
      bias [E]           = bias_std * N(0,1)          (zeros when 0)
      jitter_noise [T,d] = 1 + eps * U(-1,1) ~ U(1-eps, 1+eps)  (ones when 0)
    """
    g = torch.Generator().manual_seed(seed)
    f32 = torch.float32
    x = torch.randn(T, d, generator=g, dtype=f32)
    gate = torch.randn(E, d, generator=g, dtype=f32) * 0.3
    w1 = torch.randn(E, ff, d, generator=g, dtype=f32) / math.sqrt(d)
    w3 = torch.randn(E, ff, d, generator=g, dtype=f32) / math.sqrt(d)
    w2 = torch.randn(E, d, ff, generator=g, dtype=f32) / math.sqrt(ff)
    dout = torch.randn(T, d, generator=g, dtype=f32)
    u = x.mean(dim=0)
    u = u / u.norm()
    for e, s in enumerate((1.0, 0.5)):
        if e < E:
            gate[e] += skew * s * u
    out = dict(x=x, gate=gate, w1=w1, w2=w2, w3=w3, dout=dout)
    if bias_std is not None or jitter_eps is not None:
        if bias_std:
            out["bias"] = torch.randn(E, generator=g, dtype=f32) * bias_std
        else:
            out["bias"] = torch.zeros(E, dtype=f32)
        if jitter_eps:
            r = torch.rand(T, d, generator=g, dtype=f32)
            out["jitter_noise"] = 1.0 + jitter_eps * (2.0 * r - 1.0)
        else:
            out["jitter_noise"] = torch.ones(T, d, dtype=f32)
    return out


def rel_gap(a, b):
    """Relative gap |a-b| / max(|a|,|b|) (elementwise)."""
    return (a - b).abs() / torch.maximum(a.abs(), b.abs())


def capacity_margin(res, E):
    """probs policy: for every overflowing expert, the C-th and (C+1)-th largest combine
    weights differ by more than MARGIN_REL (relative). Returns (ok, message)."""
    C = res["capacity"]
    topk_idx, w = res["topk_idx"], res["weights"].detach()
    for e in range(E):
        we = w[topk_idx == e]
        if we.numel() > C:
            srt = torch.sort(we, descending=True).values
            gap = rel_gap(srt[C - 1], srt[C]).item()
            if gap <= MARGIN_REL:
                return False, "capacity gap %.3g (expert %d)" % (gap, e)
    return True, "ok"


def check_margins(res, k, E, policy):
    """Return (ok, message).  Decisions must survive float32 evaluation.

    (a) top-k: for every token, the sorted probabilities p_(1..k+1) have
        pairwise-adjacent relative gaps > MARGIN_REL (this covers the
        contract's k-th vs (k+1)-th gap, and additionally the order inside
        the top-k, which fixes topk_idx/weights ordering).  For k == E only
        the in-order gaps are checked.
    (b) probs policy: for every overflowing expert, the C-th and (C+1)-th
        largest combine weights differ by > MARGIN_REL relative.
    """
    p = res["probs"].detach()
    ps = torch.sort(p, dim=-1, descending=True).values
    m = min(k + 1, E)
    if m >= 2:
        gaps = rel_gap(ps[:, :m - 1], ps[:, 1:m])
        if gaps.min().item() <= MARGIN_REL:
            return False, "top-k gap %.3g" % gaps.min().item()
    if policy == POLICY_PROBS:
        return capacity_margin(res, E)
    return True, "ok"


def check_margins_ext(res, k, E, policy):
    """check_margins for the extended cases.  Returns (ok, message).

    (a) selection key = score + bias: for every token, the sorted keys
        key_(1..k+1) have adjacent gaps > MARGIN_REL * scale, scale =
        max(|key_a|, |key_b|, |s_a|, |s_b|) (the unbiased scores enter the
        scale so that a key near 0 by cancellation of s and -b is not
        judged relative to its tiny value).  For k == E only in-order gaps.
    (b) probs policy: the capacity boundary on the (unbiased, route-scaled)
        combine weights, as in check_margins.
    """
    key = res["sel_key"]
    s = res["scores"].detach()
    m = min(k + 1, E)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    ks = torch.gather(key, 1, order[:, :m])
    ss = torch.gather(s, 1, order[:, :m])
    if m >= 2:
        scale = torch.stack([ks[:, :-1].abs(), ks[:, 1:].abs(),
                             ss[:, :-1].abs(), ss[:, 1:].abs()]).amax(dim=0)
        gaps = (ks[:, :-1] - ks[:, 1:]).abs() / scale
        if gaps.min().item() <= MARGIN_REL:
            return False, "top-k key gap %.3g" % gaps.min().item()
    if policy == POLICY_PROBS:
        return capacity_margin(res, E)
    return True, "ok"


def n_selection_changed(idx_a, idx_b, E):
    """Number of tokens whose SET of selected experts differs."""
    T = idx_a.shape[0]
    A = torch.zeros(T, E, dtype=torch.bool).scatter_(1, idx_a, True)
    B = torch.zeros(T, E, dtype=torch.bool).scatter_(1, idx_b, True)
    return int((A != B).any(dim=1).sum())


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

# Dimensions: T=64, d=32.  ff=20 instead of 48: with ff=48 the float32
# weights + float64 weight gradients alone exceed the 2 MB total budget
# (~3.5 MB); 20 keeps ff distinct from every other dim (T, d, E, k).
DEFAULT_DIMS = dict(T=64, d=32, ff=20)

CASES = [
    # name,                     E,  k, cf,   policy,     norm, aux,  zc,   seed0
    ("moe_e8k2_dropless",       8,  2, 0.0,  "dropless", 1, 0.01, 0.001, 100),
    ("moe_e8k2_cf1_probs",      8,  2, 1.0,  "probs",    1, 0.1,  0.01,  200),
    ("moe_e8k2_cf1_position",   8,  2, 1.0,  "position", 1, 0.01, 0.001, 300),
    ("moe_e16k4_cf125_probs",  16,  4, 1.25, "probs",    1, 0.01, 0.001, 400),
    ("moe_e8k1_cf1_switch",     8,  1, 1.0,  "probs",    0, 0.1,  0.01,  500),
    ("moe_e8k2_nonorm",         8,  2, 1.0,  "probs",    0, 0.01, 0.001, 600),
    ("moe_e4k4_dropless",       4,  4, 0.0,  "dropless", 1, 0.01, 0.001, 700),
]

SKEW = 1.0          # strength of the router bias towards experts 0 and 1
MIN_DROPPED = 3     # capacity cases must drop at least this many assignments
MAX_SEED_TRIES = 1000
FD_CASES = ("moe_e8k2_cf1_probs", "moe_e8k1_cf1_switch")  # FD self-check

# Extended MoE-layer cases (DESIGN 3.1/3.9 and DeepSeek-V3 / Switch options).
# Keys not given take EXT_DEFAULTS (= option off).  All new files carry the
# extra tensors scoring, seq_len, route_scale, seq_aux_coef, jitter_eps,
# bias, jitter_noise, seq_aux, scores (see fixture_tensors_ext).
EXT_DEFAULTS = dict(cf=0.0, policy="dropless", norm=1, aux=0.01, zc=0.001,
                    scoring="softmax", route_scale=1.0, bias_std=0.0,
                    jitter_eps=0.0, seq_len=None, seq_aux_coef=0.0,
                    min_bias_changed=0)
EXT_CASES = [
    dict(name="moe_e8k2_bias", E=8, k=2, cf=1.0, policy="probs",
         bias_std=0.05, min_bias_changed=4, seed0=800),
    dict(name="moe_e8k2_seqaux", E=8, k=2, seq_len=16, seq_aux_coef=0.1,
         seed0=900),
    dict(name="moe_e8k2_jitter", E=8, k=2, cf=1.0, policy="probs",
         jitter_eps=0.1, seed0=1100),
    dict(name="moe_e16k4_sigmoid", E=16, k=4, cf=1.25, policy="probs",
         scoring="sigmoid", route_scale=2.5, bias_std=0.02, seq_len=16,
         seq_aux_coef=0.05, seed0=1200),
    dict(name="moe_e8k2_sigmoid_nonorm", E=8, k=2, norm=0, scoring="sigmoid",
         route_scale=1.0, seed0=1300),
]


def build_case(spec):
    name, E, k, cf, pol, norm, aux_coef, z_coef, seed0 = spec
    dims = DEFAULT_DIMS
    T, d, ff = dims["T"], dims["d"], dims["ff"]
    cfg = dict(k=k, norm_topk_prob=norm, policy=POLICY_NAMES[pol],
               capacity_factor=float(cf), aux_coef=aux_coef, z_coef=z_coef)
    for seed in range(seed0, seed0 + MAX_SEED_TRIES):
        inputs = make_inputs(seed, T, d, ff, E, SKEW)
        res = moe_reference(inputs, cfg)
        ok, why = check_margins(res, k, E, cfg["policy"])
        dropped = int((~res["keep"]).sum())
        if ok and cfg["policy"] != POLICY_DROPLESS and dropped < MIN_DROPPED:
            ok, why = False, "only %d dropped" % dropped
        if ok:
            break
        print("  %s: seed %d rejected (%s)" % (name, seed, why))
    else:
        raise RuntimeError("%s: no acceptable seed" % name)
    meta = dict(T=T, d=d, ff=ff, E=E, seed=seed, dropped=dropped)
    return inputs, cfg, res, meta


def ext_case_cfg(spec, T):
    """cfg dict (moe_reference) of an EXT_CASES entry."""
    c = dict(EXT_DEFAULTS, **spec)
    seq_len = T if c["seq_len"] is None else c["seq_len"]
    assert T % seq_len == 0
    return c, dict(k=c["k"], norm_topk_prob=c["norm"],
                   policy=POLICY_NAMES[c["policy"]],
                   capacity_factor=float(c["cf"]), aux_coef=c["aux"],
                   z_coef=c["zc"], scoring=SCORING_NAMES[c["scoring"]],
                   route_scale=float(c["route_scale"]), seq_len=seq_len,
                   seq_aux_coef=float(c["seq_aux_coef"]),
                   jitter_eps=float(c["jitter_eps"]))


def routing_without(inputs, cfg, what):
    """topk_idx of the same router without the bias or without the jitter."""
    kw = ext_kwargs(cfg, inputs)
    kw.pop("seq_len")
    kw.pop("seq_aux_coef")
    kw[what] = None
    x = inputs["x"].to(torch.float64)
    gate = inputs["gate"].to(torch.float64)
    return route(x, gate, cfg["k"], cfg["norm_topk_prob"], **kw)[3]


def build_ext_case(spec):
    dims = DEFAULT_DIMS
    T, d, ff = dims["T"], dims["d"], dims["ff"]
    c, cfg = ext_case_cfg(spec, T)
    name, E, k = c["name"], c["E"], c["k"]
    for seed in range(c["seed0"], c["seed0"] + MAX_SEED_TRIES):
        inputs = make_inputs(seed, T, d, ff, E, SKEW, c["bias_std"],
                             c["jitter_eps"])
        res = moe_reference(inputs, cfg)
        ok, why = check_margins_ext(res, k, E, cfg["policy"])
        dropped = int((~res["keep"]).sum())
        bias_changed = n_selection_changed(
            res["topk_idx"], routing_without(inputs, cfg, "bias"), E)
        jitter_changed = n_selection_changed(
            res["topk_idx"], routing_without(inputs, cfg, "jitter"), E)
        if ok and cfg["policy"] != POLICY_DROPLESS and dropped < MIN_DROPPED:
            ok, why = False, "only %d dropped" % dropped
        if ok and bias_changed < c["min_bias_changed"]:
            ok, why = False, "bias changes only %d selections" % bias_changed
        if ok:
            break
        print("  %s: seed %d rejected (%s)" % (name, seed, why))
    else:
        raise RuntimeError("%s: no acceptable seed" % name)
    assert bias_changed >= c["min_bias_changed"]
    meta = dict(T=T, d=d, ff=ff, E=E, seed=seed, dropped=dropped,
                bias_changed=bias_changed, jitter_changed=jitter_changed)
    return inputs, cfg, res, meta


def fixture_tensors(inputs, cfg, res, meta):
    """Ordered (name, array) list written to the fixture file."""
    i32 = lambda v: np.array(v, dtype=np.int32)
    f64 = lambda v: np.array(v, dtype=np.float64)
    t64 = lambda t: t.detach().to(torch.float64).numpy()
    ti32 = lambda t: t.detach().to(torch.int32).numpy()
    return [
        ("T", i32(meta["T"])), ("d", i32(meta["d"])), ("ff", i32(meta["ff"])),
        ("E", i32(meta["E"])), ("k", i32(cfg["k"])),
        ("norm_topk_prob", i32(cfg["norm_topk_prob"])),
        ("policy", i32(cfg["policy"])), ("capacity", i32(res["capacity"])),
        ("capacity_factor", f64(cfg["capacity_factor"])),
        ("aux_coef", f64(cfg["aux_coef"])), ("z_coef", f64(cfg["z_coef"])),
        ("x", inputs["x"].numpy()), ("gate", inputs["gate"].numpy()),
        ("w1", inputs["w1"].numpy()), ("w2", inputs["w2"].numpy()),
        ("w3", inputs["w3"].numpy()), ("dout", inputs["dout"].numpy()),
        ("y", t64(res["out"])), ("aux", t64(res["aux"])),
        ("z", t64(res["z"])), ("probs", t64(res["probs"])),
        ("weights", t64(res["weights"])), ("entropy", t64(res["entropy"])),
        ("dx", t64(res["dx"])), ("dgate", t64(res["dgate"])),
        ("dw1", t64(res["dw1"])), ("dw2", t64(res["dw2"])),
        ("dw3", t64(res["dw3"])),
        ("topk_idx", ti32(res["topk_idx"])), ("keep", ti32(res["keep"])),
        ("counts", ti32(res["counts"])),
        ("kept_counts", ti32(res["kept_counts"])),
    ]


def fixture_tensors_ext(inputs, cfg, res, meta):
    """fixture_tensors plus the extended-option tensors:
    int32 scoring, seq_len; float64 route_scale, seq_aux_coef, jitter_eps
    (after z_coef); float32 inputs bias [E], jitter_noise [T,d] (after
    dout); float64 outputs seq_aux (after z) and scores [T,E] (raw scores
    p or sigmoid(z), after probs = s')."""
    i32 = lambda v: np.array(v, dtype=np.int32)
    f64 = lambda v: np.array(v, dtype=np.float64)
    t64 = lambda t: t.detach().to(torch.float64).numpy()
    after = {
        "z_coef": [("scoring", i32(cfg["scoring"])),
                   ("seq_len", i32(cfg["seq_len"])),
                   ("route_scale", f64(cfg["route_scale"])),
                   ("seq_aux_coef", f64(cfg["seq_aux_coef"])),
                   ("jitter_eps", f64(cfg["jitter_eps"]))],
        "dout": [("bias", inputs["bias"].numpy()),
                 ("jitter_noise", inputs["jitter_noise"].numpy())],
        "z": [("seq_aux", t64(res["seq_aux"]))],
        "probs": [("scores", t64(res["scores"]))],
    }
    out = []
    for name, value in fixture_tensors(inputs, cfg, res, meta):
        out.append((name, value))
        out += after.pop(name, [])
    assert not after and len(out) == len(dict(out))
    return out


# --------------------------------------------------------------------------
# Self-checks of the reference itself
# --------------------------------------------------------------------------

def selfcheck_finite_difference(inputs, cfg, n_elems=6, eps=1e-6):
    """Autograd gradients of x and gate vs central differences in float64.

    The loss is re-routed at every evaluation, so this covers the router
    path (softmax, top-k normalisation, aux and z losses) as well as the
    experts; margins guarantee that +-eps does not flip any decision.
    """
    res = moe_reference(inputs, cfg)
    base = {n: inputs[n].to(torch.float64)
            for n in ("x", "gate", "w1", "w2", "w3", "dout")}

    def loss_at(**over):
        a = dict(base, **over)
        r = moe_forward(a["x"], a["gate"], a["w1"], a["w2"], a["w3"],
                        cfg["k"], cfg["norm_topk_prob"], cfg["policy"],
                        cfg["capacity_factor"], cfg["aux_coef"],
                        cfg["z_coef"], **ext_kwargs(cfg, inputs))
        return moe_loss(r, a["dout"]).item()

    g = torch.Generator().manual_seed(12345)
    worst = 0.0
    for name in ("x", "gate"):
        t0 = base[name]
        for _ in range(n_elems):
            i = int(torch.randint(t0.shape[0], (1,), generator=g))
            j = int(torch.randint(t0.shape[1], (1,), generator=g))
            tp, tm = t0.clone(), t0.clone()
            tp[i, j] += eps
            tm[i, j] -= eps
            fd = (loss_at(**{name: tp}) - loss_at(**{name: tm})) / (2 * eps)
            ad = res["d" + name][i, j].item()
            err = abs(fd - ad) / max(1.0, abs(ad))
            worst = max(worst, err)
            if err > 1e-6:
                raise AssertionError("FD mismatch d%s[%d,%d]: fd=%r ad=%r"
                                     % (name, i, j, fd, ad))
    print("selfcheck: finite-difference dx, dgate ok (max rel err %.2e)"
          % worst)


def selfcheck_balanced_aux():
    """Perfectly balanced routing -> L_aux == aux_coef.

    E = d = 4, k = 1, T = 8, gate = I, x_t = 3 * onehot(t mod E): every
    expert gets exactly T/E tokens (f_e = 1/E) and by symmetry P_e = 1/E,
    so L_aux = aux_coef * E * sum_e (1/E)(1/E) = aux_coef.
    """
    E, T, aux_coef = 4, 8, 0.01
    x = torch.zeros(T, E, dtype=torch.float64)
    x[torch.arange(T), torch.arange(T) % E] = 3.0
    gate = torch.eye(E, dtype=torch.float64)
    w1 = torch.zeros(E, 5, E, dtype=torch.float64)
    w3 = torch.zeros(E, 5, E, dtype=torch.float64)
    w2 = torch.zeros(E, E, 5, dtype=torch.float64)
    res = moe_forward(x, gate, w1, w2, w3, 1, 0, POLICY_DROPLESS, 0.0,
                      aux_coef, 0.0)
    assert res["counts"].tolist() == [T // E] * E, res["counts"]
    aux = res["aux"].item()
    assert abs(aux - aux_coef) < 1e-15, aux
    print("selfcheck: balanced routing aux = %.17g (aux_coef %g) ok"
          % (aux, aux_coef))


def selfcheck_ext_neutral(inputs, cfg, meta, tensors):
    """The extended code path with every option neutral (scoring softmax,
    bias 0, route_scale 1, jitter 1, seq_len T with seq_aux_coef 0)
    reproduces an original case's fixture tensors bit for bit."""
    T, E = meta["T"], meta["E"]
    cfg2 = dict(cfg, scoring=SCORING_SOFTMAX, route_scale=1.0, seq_len=T,
                seq_aux_coef=0.0, jitter_eps=0.0)
    inputs2 = dict(inputs, bias=torch.zeros(E, dtype=torch.float32),
                   jitter_noise=torch.ones(T, meta["d"], dtype=torch.float32))
    res2 = moe_reference(inputs2, cfg2)
    assert "seq_aux" in res2 and "scores" in res2  # really the new path
    new = dict(fixture_tensors_ext(inputs2, cfg2, res2, meta))
    for name, value in tensors:
        a, b = _to_numpy(value), _to_numpy(new[name])
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), "neutral ext path differs: " + name
    assert new["seq_aux"] == 0.0
    assert new["scores"].tobytes() == new["probs"].tobytes()


def selfcheck_ext_losses(inputs, cfg, res):
    """Balance losses of the extended path vs explicit loops, and
    seq_len = T with seq_aux_coef = aux_coef gives L_seq == L_aux;
    normalised combine weights sum to route_scale."""
    T, E, k = inputs["x"].shape[0], inputs["gate"].shape[0], cfg["k"]
    L, B = cfg["seq_len"], T // cfg["seq_len"]
    s = res["scores"].detach().tolist()
    idx = res["topk_idx"].tolist()
    sn = [[v / (sum(row) if cfg["scoring"] == SCORING_SIGMOID else 1.0)
           for v in row] for row in s]
    assert np.allclose(np.array(sn), res["probs"].detach().numpy(),
                       rtol=1e-15, atol=0)

    def balance(tokens, coef):
        cnt = [0] * E
        for t in tokens:
            for e in idx[t]:
                cnt[e] += 1
        return coef * E * sum(cnt[e] / (k * len(tokens))
                              * sum(sn[t][e] for t in tokens) / len(tokens)
                              for e in range(E))

    aux = balance(range(T), cfg["aux_coef"])
    seq = sum(balance(range(b * L, (b + 1) * L), cfg["seq_aux_coef"])
              for b in range(B)) / B
    for name, want in (("aux", aux), ("seq_aux", seq)):
        got = res[name].item()
        assert abs(got - want) <= 1e-14 * max(abs(want), 1e-300), \
            (name, got, want)
    cfg_t = dict(cfg, seq_len=T, seq_aux_coef=cfg["aux_coef"])
    r = moe_reference(inputs, cfg_t)
    assert abs(r["seq_aux"].item() - r["aux"].item()) <= \
        1e-14 * r["aux"].item(), (r["seq_aux"].item(), r["aux"].item())
    if cfg["norm_topk_prob"]:
        ws = res["weights"].detach().sum(dim=-1)
        assert (ws - cfg["route_scale"]).abs().max().item() < 1e-14
    print("selfcheck: aux %.10g / seq_aux %.10g == explicit loops; "
          "seq_len=T seq_aux == aux ok" % (aux, seq))


def selfcheck_roundtrip(path, tensors):
    back = read_fixture(path)
    assert list(back.keys()) == [n for n, _ in tensors], path
    for name, value in tensors:
        a = _to_numpy(value)
        b = back[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name


# --------------------------------------------------------------------------
# Whole-model reference: Mixtral decoder (HF semantics) + AdamW training
# --------------------------------------------------------------------------
#
# Independent float64 re-implementation of HF MixtralForCausalLM (no
# transformers import), using the MoE layer above unchanged.  The group of
# the MoE layer is the whole micro-batch: T = B*S tokens in row-major order
# (token t = b*S + s), so "earlier token" in the capacity tie rule means
# lower b, then lower s.
#
#   x = embed[tokens]                                        [B,S,d]
#   per layer l:  h = x + Attn(RMSNorm_1(x));  x = h + MoE(RMSNorm_2(h))
#   logits = RMSNorm_f(x) @ lm_head^T      (lm_head = embed when tied)
#   loss = CE(logits, targets) (mean over B*S) + sum_l (L_aux_l + L_z_l)
#
# Training: step t (t = 0..steps-1) uses batch t: forward/backward at the
# current weights, global-norm clipping, AdamW update (torch semantics).

def model_param_shapes(cfg):
    """Ordered (HF name, shape) list in MixtralForCausalLM state_dict order."""
    V, d, H, KV = cfg["V"], cfg["d"], cfg["n_heads"], cfg["n_kv_heads"]
    ff, E = cfg["ff"], cfg["E"]
    hd = d // H
    shapes = [("model.embed_tokens.weight", (V, d))]
    for l in range(cfg["n_layers"]):
        pre = "model.layers.%d." % l
        shapes += [(pre + "self_attn.q_proj.weight", (H * hd, d)),
                   (pre + "self_attn.k_proj.weight", (KV * hd, d)),
                   (pre + "self_attn.v_proj.weight", (KV * hd, d)),
                   (pre + "self_attn.o_proj.weight", (d, H * hd)),
                   (pre + "block_sparse_moe.gate.weight", (E, d))]
        for j in range(E):
            ex = pre + "block_sparse_moe.experts.%d." % j
            shapes += [(ex + "w1.weight", (ff, d)), (ex + "w2.weight", (d, ff)),
                       (ex + "w3.weight", (ff, d))]
        shapes += [(pre + "input_layernorm.weight", (d,)),
                   (pre + "post_attention_layernorm.weight", (d,))]
    shapes.append(("model.norm.weight", (d,)))
    if not cfg["tie_embeddings"]:
        shapes.append(("lm_head.weight", (V, d)))
    return shapes


def is_norm_weight(name):
    """RMSNorm weights (input/post_attention layernorms, model.norm)."""
    return name.endswith("layernorm.weight") or name == "model.norm.weight"


def make_model_weights(seed, cfg):
    """Seeded float32 draw of all weights, then tokens and targets.

    Scales are chosen so every part of the model matters (not std 0.02,
    which makes attention uniform and the experts negligible):
      RMSNorm weights   1 + 0.1 N(0,1)       (not trivially 1)
      router gate       0.2 N(0,1)           (decisive routing, z ~ N(0,1.1^2))
      embed_tokens      0.5 N(0,1)
      other matrices    N(0,1) / sqrt(fan_in)  (q,k,v,o, w1,w2,w3, lm_head)
    tokens, targets: uniform ids in [0,V), int32 [steps,B,S].
    """
    g = torch.Generator().manual_seed(seed)
    f32 = torch.float32
    weights = {}
    for name, shape in model_param_shapes(cfg):
        r = torch.randn(*shape, generator=g, dtype=f32)
        if is_norm_weight(name):
            w = 1.0 + 0.1 * r
        elif name.endswith("block_sparse_moe.gate.weight"):
            w = 0.2 * r
        elif name == "model.embed_tokens.weight":
            w = 0.5 * r
        else:
            w = r / math.sqrt(shape[1])
        weights[name] = w.contiguous()
    shape = (cfg["steps"], cfg["B"], cfg["S"])
    tokens = torch.randint(cfg["V"], shape, generator=g).to(torch.int32)
    targets = torch.randint(cfg["V"], shape, generator=g).to(torch.int32)
    return weights, tokens, targets


def rmsnorm(x, w, eps):
    """y = x * rsqrt(mean(x^2, -1) + eps) * w."""
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * w


def rope_cos_sin(S, hd, theta):
    """HF rotary tables, float64, positions 0..S-1.

    inv_freq[i] = theta^(-2i/hd), i < hd/2;  ang[s,i] = s * inv_freq[i]
    cos = cos(cat(ang, ang)), sin = sin(cat(ang, ang))       [S,hd]
    """
    i = torch.arange(hd // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / hd)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    """rotate_half(x) = cat(-x[hd/2:], x[:hd/2])  (dim j pairs with j+hd/2)."""
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x' = x * cos + rotate_half(x) * sin;  x [B,S,heads,hd], cos/sin [S,hd]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attention(n, wq, wk, wv, wo, H, KV, cos, sin):
    """Causal GQA self-attention with RoPE, no biases.

    q = n wq^T [B,S,H,hd], k = n wk^T, v = n wv^T [B,S,KV,hd]; RoPE on q, k;
    query head h uses KV head h // (H/KV);
    a = softmax(q k^T * hd^-0.5 + causal mask) ; o = (a v) wo^T.
    """
    B, S, _ = n.shape
    hd = wq.shape[0] // H
    q = (n @ wq.t()).view(B, S, H, hd)
    k = (n @ wk.t()).view(B, S, KV, hd)
    v = (n @ wv.t()).view(B, S, KV, hd)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    rep = H // KV
    k = k.repeat_interleave(rep, dim=2)       # head h -> KV head h // rep
    v = v.repeat_interleave(rep, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))     # [B,H,S,hd]
    scores = (q @ k.transpose(-1, -2)) * hd ** -0.5      # [B,H,S,S]
    future = torch.ones(S, S, dtype=torch.bool).triu(1)  # key s' > query s
    scores = scores.masked_fill(future, -math.inf)
    a = torch.softmax(scores, dim=-1)
    o = (a @ v).transpose(1, 2).reshape(B, S, H * hd)
    return o @ wo.t()


def mixtral_forward(params, tokens, targets, cfg, policy=None):
    """Forward of the whole model; params: HF name -> float64 tensor.

    tokens, targets: integer [B,S].  policy overrides cfg["policy"] (used
    by the causality self-check).  Returns logits [B,S,V], loss (total),
    ce, aux_per_layer, z_per_layer (lists of 0-d tensors) and the per-layer
    MoE result dicts of moe_forward (routing, keep, counts, ...).
    """
    B, S = tokens.shape
    d, H, KV, V = cfg["d"], cfg["n_heads"], cfg["n_kv_heads"], cfg["V"]
    E, eps = cfg["E"], cfg["rms_norm_eps"]
    policy = cfg["policy"] if policy is None else policy
    cos, sin = rope_cos_sin(S, d // H, cfg["rope_theta"])
    embed = params["model.embed_tokens.weight"]
    x = embed[tokens.long()]                                  # [B,S,d]
    moe_res, aux_l, z_l = [], [], []
    for l in range(cfg["n_layers"]):
        P = lambda s: params["model.layers.%d.%s" % (l, s)]
        # h = x + Attn(RMSNorm_1(x))
        n1 = rmsnorm(x, P("input_layernorm.weight"), eps)
        h = x + attention(n1, P("self_attn.q_proj.weight"),
                          P("self_attn.k_proj.weight"),
                          P("self_attn.v_proj.weight"),
                          P("self_attn.o_proj.weight"), H, KV, cos, sin)
        # x = h + MoE(RMSNorm_2(h)), MoE group = all B*S tokens
        n2 = rmsnorm(h, P("post_attention_layernorm.weight"), eps)
        ex = lambda j, w: P("block_sparse_moe.experts.%d.%s.weight" % (j, w))
        w1 = torch.stack([ex(j, "w1") for j in range(E)])    # [E,ff,d]
        w2 = torch.stack([ex(j, "w2") for j in range(E)])    # [E,d,ff]
        w3 = torch.stack([ex(j, "w3") for j in range(E)])    # [E,ff,d]
        res = moe_forward(n2.reshape(B * S, d), P("block_sparse_moe.gate.weight"),
                          w1, w2, w3, cfg["k"], cfg["norm_topk_prob"], policy,
                          cfg["capacity_factor"], cfg["aux_coef"],
                          cfg["z_coef"])
        x = h + res["out"].view(B, S, d)
        moe_res.append(res)
        aux_l.append(res["aux"])
        z_l.append(res["z"])
    xf = rmsnorm(x, params["model.norm.weight"], eps)
    lm_head = embed if cfg["tie_embeddings"] else params["lm_head.weight"]
    logits = xf @ lm_head.t()                                 # [B,S,V]
    # CE = mean_t ( logsumexp(logits_t) - logits_t[target_t] )
    ce = torch.nn.functional.cross_entropy(logits.reshape(B * S, V),
                                           targets.reshape(-1).long())
    loss = ce + sum(a + z for a, z in zip(aux_l, z_l))
    return dict(logits=logits, loss=loss, ce=ce, aux_per_layer=aux_l,
                z_per_layer=z_l, moe=moe_res)


def clip_grad_norm(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_ (L2), in place on the list of grads.

    total = || (||g_1||, ||g_2||, ...) ||_2 ;  coef = max_norm / (total + 1e-6)
    g *= coef if coef < 1.  Returns total (before clipping) as a float.
    """
    total = torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0)
    coef = max_norm / (total.item() + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total.item()


def adamw_step(params, grads, state, t, hp):
    """One torch.optim.AdamW step (t = 1, 2, ...), same operation order.

    p *= 1 - lr*wd                     (decoupled decay; wd = 0 for RMSNorm)
    m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
    p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
    """
    lr, b1, b2, eps = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"]
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    with torch.no_grad():
        for name, g in zip(params, grads):
            p = params[name]
            m, v = state[name]
            wd = 0.0 if is_norm_weight(name) else hp["weight_decay"]
            p.mul_(1 - lr * wd)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
            p.addcdiv_(m, denom, value=-lr / bc1)


def params_f64(weights):
    """float32 weights -> float64 leaf tensors (same order) with grads."""
    return {n: w.to(torch.float64).clone().requires_grad_(True)
            for n, w in weights.items()}


def train_reference(weights, tokens, targets, cfg, hp, check=None,
                    check_grads0=None):
    """Run cfg["steps"] training steps in float64 from the float32 weights.

    check(step, fwd) -> (ok, why) is called after each forward and
    check_grads0(grads) -> (ok, why) on the step-0 gradients; on failure
    returns (None, why).  Otherwise returns (run, "ok"), run a dict with
    step0 (forward dict + grads before clipping + grad_norm), per-step
    lists loss/ce/grad_norm, and final weights.
    """
    params = params_f64(weights)
    state = {n: (torch.zeros_like(p), torch.zeros_like(p))
             for n, p in params.items()}
    run = dict(loss=[], ce=[], grad_norm=[])
    for t in range(cfg["steps"]):
        fwd = mixtral_forward(params, tokens[t], targets[t], cfg)
        if check is not None:
            ok, why = check(t, fwd)
            if not ok:
                return None, "step %d: %s" % (t, why)
        grads = list(torch.autograd.grad(fwd["loss"], list(params.values())))
        if t == 0:
            run["step0"] = dict(fwd, grads={n: g.clone() for n, g in
                                            zip(params, grads)})
            if check_grads0 is not None:
                ok, why = check_grads0(run["step0"]["grads"])
                if not ok:
                    return None, "step 0: %s" % why
        gn = clip_grad_norm(grads, hp["grad_clip"])
        if t == 0:
            run["step0"]["grad_norm"] = gn
        run["loss"].append(fwd["loss"].item())
        run["ce"].append(fwd["ce"].item())
        run["grad_norm"].append(gn)
        adamw_step(params, grads, state, t + 1, hp)
    run["final"] = {n: p.detach().clone() for n, p in params.items()}
    return run, "ok"


# Model fixture configurations.  ff=24 keeps ff distinct from d, V, S, B*S.
MODEL_BASE = dict(V=48, d=32, n_layers=2, n_heads=4, n_kv_heads=2, ff=24,
                  E=4, k=2, B=2, S=16, tie_embeddings=0, norm_topk_prob=1,
                  policy=POLICY_PROBS, steps=5, rope_theta=10000.0,
                  rms_norm_eps=1e-5, capacity_factor=1.0, aux_coef=0.01,
                  z_coef=0.001)
MODEL_HP = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                grad_clip=1.0)
MODEL_CASES = [
    # name, config overrides, first seed
    ("model_small", dict(), 1000),
    ("model_tied", dict(tie_embeddings=1, n_kv_heads=4, capacity_factor=0.0,
                        policy=POLICY_DROPLESS), 2000),
]
MODEL_MIN_DROPPED = 1   # capacity model: every layer drops >= this at step 0
ADAM_SIGN_MARGIN = 1e-5  # step-0 grads: nonzero |g| >= this * max|g| per tensor
MODEL_INT_KEYS = ("V", "d", "n_layers", "n_heads", "n_kv_heads", "ff", "E",
                  "k", "B", "S", "tie_embeddings", "norm_topk_prob", "policy",
                  "steps")
MODEL_F64_KEYS = ("rope_theta", "rms_norm_eps", "capacity_factor", "aux_coef",
                  "z_coef")
HP_F64_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")


def model_decisions_ok(cfg):
    """check(step, fwd) for train_reference: margins of every MoE layer
    (check_margins: top-(k+1) gaps and the capacity boundary), and at step 0
    in capacity mode at least MODEL_MIN_DROPPED drops in every layer."""
    def check(t, fwd):
        for l, res in enumerate(fwd["moe"]):
            ok, why = check_margins(res, cfg["k"], cfg["E"], cfg["policy"])
            if not ok:
                return False, "layer %d %s" % (l, why)
            dropped = int((~res["keep"]).sum())
            if (t == 0 and cfg["policy"] != POLICY_DROPLESS
                    and dropped < MODEL_MIN_DROPPED):
                return False, "layer %d only %d dropped" % (l, dropped)
        return True, "ok"
    return check


def step0_grads_ok(grads):
    """check_grads0 for train_reference: adam_sign_margin >= ADAM_SIGN_MARGIN."""
    r, where = adam_sign_margin(grads)
    if r < ADAM_SIGN_MARGIN:
        return False, "gradient sign margin %.2g (%s)" % (r, where)
    return True, "ok"


def build_model_case(name, overrides, seed0):
    cfg = dict(MODEL_BASE, **overrides)
    for seed in range(seed0, seed0 + MAX_SEED_TRIES):
        weights, tokens, targets = make_model_weights(seed, cfg)
        run, why = train_reference(weights, tokens, targets, cfg, MODEL_HP,
                                   check=model_decisions_ok(cfg),
                                   check_grads0=step0_grads_ok)
        if run is not None:
            break
        print("  %s: seed %d rejected (%s)" % (name, seed, why))
    else:
        raise RuntimeError("%s: no acceptable seed" % name)
    return cfg, seed, weights, tokens, targets, run


def model_fixture_tensors(cfg, hp, weights, tokens, targets, run):
    """Ordered (name, array) list of a model fixture."""
    i32 = lambda v: np.array(v, dtype=np.int32)
    f64 = lambda v: np.array(v, dtype=np.float64)
    t64 = lambda t: t.detach().to(torch.float64).numpy()
    s0 = run["step0"]
    moe = s0["moe"]
    out = [(k, i32(cfg[k])) for k in MODEL_INT_KEYS]
    out.append(("capacity", i32(moe[0]["capacity"])))
    out += [(k, f64(cfg[k])) for k in MODEL_F64_KEYS]
    out += [(k, f64(hp[k])) for k in HP_F64_KEYS]
    out += [(n, w.numpy()) for n, w in weights.items()]
    out += [("tokens", tokens.numpy()), ("targets", targets.numpy())]
    out += [
        ("logits", t64(s0["logits"])), ("loss", t64(s0["loss"])),
        ("ce", t64(s0["ce"])),
        ("aux", f64(sum(a.item() for a in s0["aux_per_layer"]))),
        ("z", f64(sum(z.item() for z in s0["z_per_layer"]))),
        ("aux_per_layer", f64([a.item() for a in s0["aux_per_layer"]])),
        ("z_per_layer", f64([z.item() for z in s0["z_per_layer"]])),
        ("dropped_per_layer", i32([int((~r["keep"]).sum()) for r in moe])),
        ("counts_per_layer", i32([r["counts"].tolist() for r in moe])),
    ]
    out += [("grad." + n, t64(g)) for n, g in s0["grads"].items()]
    out += [("grad_norm", f64(s0["grad_norm"])),
            ("step_loss", f64(run["loss"])), ("step_ce", f64(run["ce"])),
            ("step_grad_norm", f64(run["grad_norm"]))]
    out += [("final." + n, t64(p)) for n, p in run["final"].items()]
    assert len(out) == len(dict(out)), "duplicate tensor names"
    return out


# --- self-checks of the model reference -----------------------------------

def selfcheck_model_fd(cfg, weights, tokens, targets, grads, n_random=2,
                       eps=1e-6):
    """Autograd gradient of the total loss vs central differences (float64).

    Checked tensors cover embedding, attention (q, GQA k), RMSNorm, router,
    an expert and the output head; per tensor the largest-|g| element plus
    n_random random ones.  Routing is recomputed at every evaluation; the
    margins make +-eps unable to flip a decision.
    """
    base = params_f64(weights)
    base = {n: p.detach() for n, p in base.items()}
    L, E = cfg["n_layers"], cfg["E"]
    names = ["model.embed_tokens.weight",
             "model.layers.0.self_attn.q_proj.weight",
             "model.layers.%d.self_attn.k_proj.weight" % (L - 1),
             "model.layers.0.post_attention_layernorm.weight",
             "model.layers.0.block_sparse_moe.gate.weight",
             "model.layers.%d.block_sparse_moe.experts.%d.w1.weight"
             % (L - 1, E - 1),
             "model.norm.weight"]
    if not cfg["tie_embeddings"]:
        names.append("lm_head.weight")

    def loss_at(name, idx, delta):
        p = dict(base)
        p[name] = base[name].clone()
        p[name][idx] += delta
        return mixtral_forward(p, tokens, targets, cfg)["loss"].item()

    g = torch.Generator().manual_seed(4321)
    worst = 0.0
    for name in names:
        G = grads[name]
        flat = [int(G.abs().argmax())]
        flat += [int(torch.randint(G.numel(), (1,), generator=g))
                 for _ in range(n_random)]
        for fi in flat:
            idx = np.unravel_index(fi, tuple(G.shape))
            fd = (loss_at(name, idx, eps) - loss_at(name, idx, -eps)) / (2 * eps)
            ad = G[idx].item()
            err = abs(fd - ad)
            worst = max(worst, err / max(abs(ad), 1e-3))
            if err > 1e-8 + 1e-6 * abs(ad):
                raise AssertionError("FD mismatch grad.%s%s: fd=%r ad=%r"
                                     % (name, idx, fd, ad))
    print("selfcheck: model finite differences ok (%d tensors, max rel err "
          "%.2e)" % (len(names), worst))


def selfcheck_model_causal(cfg, weights, tokens, targets):
    """Changing token (b=1, s=s0) leaves logits of sequence 0 and of
    positions < s0 of sequence 1 unchanged, and changes position s0.
    Run dropless: with capacity dropping, tokens of one group compete for
    expert slots, so a later token can legitimately change an earlier
    token's drop decision (not a causality leak)."""
    params = {n: p.detach() for n, p in params_f64(weights).items()}
    tok, tgt = tokens[0], targets[0]
    s0 = cfg["S"] // 2 + 2
    tok2 = tok.clone()
    tok2[1, s0] = (tok2[1, s0] + 1) % cfg["V"]
    la = mixtral_forward(params, tok, tgt, cfg, POLICY_DROPLESS)["logits"]
    lb = mixtral_forward(params, tok2, tgt, cfg, POLICY_DROPLESS)["logits"]
    unchanged = max((la[0] - lb[0]).abs().max().item(),
                    (la[1, :s0] - lb[1, :s0]).abs().max().item())
    changed = (la[1, s0] - lb[1, s0]).abs().max().item()
    assert unchanged <= 1e-12 and changed > 1e-3, (unchanged, changed)
    print("selfcheck: causal ok (earlier/other-sequence max diff %.1e, "
          "changed position %.3g)" % (unchanged, changed))


def selfcheck_model_torch_optim(cfg, weights, tokens, targets, run):
    """Our clip_grad_norm + adamw_step vs torch.nn.utils.clip_grad_norm_ +
    torch.optim.AdamW (decay / no-decay parameter groups), same steps."""
    params = params_f64(weights)
    decay = [p for n, p in params.items() if not is_norm_weight(n)]
    nodecay = [p for n, p in params.items() if is_norm_weight(n)]
    hp = MODEL_HP
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=hp["weight_decay"]),
         dict(params=nodecay, weight_decay=0.0)],
        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    for t in range(cfg["steps"]):
        opt.zero_grad()
        loss = mixtral_forward(params, tokens[t], targets[t], cfg)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), hp["grad_clip"])
        opt.step()
    worst = max((params[n].detach() - run["final"][n]).abs().max().item()
                for n in params)
    assert worst <= 1e-14, worst
    print("selfcheck: clip_grad_norm + adamw_step == torch AdamW "
          "(max diff %.1e)" % worst)


def adam_sign_margin(grads):
    """Smallest nonzero |g| / max|g| over the tensors of a gradient dict.

    The first AdamW step moves every weight by lr * g/(|g|+eps) ~ lr*sign(g):
    a gradient element that is ~0 up to float32 noise could move the other
    way in the C run (error up to 2*lr in that weight).  Exact zeros (rows
    of tokens absent from the batch, idle experts) are zero in C as well.
    Returns (ratio, tensor name)."""
    worst, where = math.inf, None
    for n, g in grads.items():
        a = g.abs()
        nz = a[a > 0]
        if nz.numel():
            r = (nz.min() / a.max()).item()
            if r < worst:
                worst, where = r, n
    return worst, where


def build_model_fixtures(out_dir, selfchecks=True):
    total = 0
    for name, overrides, seed0 in MODEL_CASES:
        cfg, seed, weights, tokens, targets, run = build_model_case(
            name, overrides, seed0)
        s0 = run["step0"]
        if selfchecks:
            selfcheck_model_fd(cfg, weights, tokens[0], targets[0],
                               s0["grads"])
            selfcheck_model_causal(cfg, weights, tokens, targets)
            selfcheck_model_torch_optim(cfg, weights, tokens, targets, run)
        tensors = model_fixture_tensors(cfg, MODEL_HP, weights, tokens,
                                        targets, run)
        path = os.path.join(out_dir, name + ".bin")
        nbytes = write_fixture(path, tensors)
        selfcheck_roundtrip(path, tensors)
        total += nbytes
        moe = s0["moe"]
        sm, sm_where = adam_sign_margin(s0["grads"])
        print("%-12s seed %d  C=%d  loss %.10g = ce %.10g + aux %s + z %s"
              % (name, seed, moe[0]["capacity"], s0["loss"].item(),
                 s0["ce"].item(),
                 "+".join("%.8g" % a.item() for a in s0["aux_per_layer"]),
                 "+".join("%.8g" % z.item() for z in s0["z_per_layer"])))
        print("    step-0 counts %s  dropped per layer %s  grad_norm %.8g"
              % ([r["counts"].tolist() for r in moe],
                 [int((~r["keep"]).sum()) for r in moe], s0["grad_norm"]))
        print("    step losses %s" % " ".join("%.10g" % v for v in run["loss"]))
        print("    step ce     %s" % " ".join("%.10g" % v for v in run["ce"]))
        print("    step |g|    %s" % " ".join("%.6g" % v
                                             for v in run["grad_norm"]))
        print("    min nonzero |g|/max|g| at step 0: %.2e (%s)  (%d bytes)"
              % (sm, sm_where, nbytes))
    print("model fixtures total %d bytes" % total)
    assert total < 1.5 * 1024 * 1024
    return total


# --------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--only", choices=("all", "moe", "model"), default="all",
                    help="generate only the MoE-layer or the model fixtures")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    if args.only != "model":
        build_moe_fixtures(args.out)
    if args.only != "moe":
        build_model_fixtures(args.out)
    return 0


def build_moe_fixtures(out_dir):
    selfcheck_balanced_aux()
    total = 0
    for spec in CASES:
        inputs, cfg, res, meta = build_case(spec)
        if spec[0] in FD_CASES:
            selfcheck_finite_difference(inputs, cfg)
        tensors = fixture_tensors(inputs, cfg, res, meta)
        selfcheck_ext_neutral(inputs, cfg, meta, tensors)
        path = os.path.join(out_dir, spec[0] + ".bin")
        nbytes = write_fixture(path, tensors)
        selfcheck_roundtrip(path, tensors)
        total += nbytes
        print("%-24s seed %4d  C=%-3d dropped %-3d aux %.10g  z %.10g  "
              "entropy %.6g  counts %s  kept %s  (%d bytes)"
              % (spec[0], meta["seed"], res["capacity"], meta["dropped"],
                 res["aux"].item(), res["z"].item(), res["entropy"].item(),
                 res["counts"].tolist(), res["kept_counts"].tolist(), nbytes))
    print("total %d bytes" % total)
    print("selfcheck: neutral extended path == original, all %d cases "
          "(bit-identical)" % len(CASES))
    assert total < 2 * 1024 * 1024
    total += build_ext_fixtures(out_dir)
    return total


def build_ext_fixtures(out_dir):
    """The extended-option cases (EXT_CASES); own 2 MiB budget."""
    total = 0
    for spec in EXT_CASES:
        inputs, cfg, res, meta = build_ext_case(spec)
        selfcheck_finite_difference(inputs, cfg)
        selfcheck_ext_losses(inputs, cfg, res)
        tensors = fixture_tensors_ext(inputs, cfg, res, meta)
        path = os.path.join(out_dir, spec["name"] + ".bin")
        nbytes = write_fixture(path, tensors)
        selfcheck_roundtrip(path, tensors)
        total += nbytes
        print("%-24s seed %4d  C=%-3d dropped %-3d aux %.10g  seq_aux %.10g  "
              "z %.10g  entropy %.6g  bias changed %d  jitter changed %d"
              % (spec["name"], meta["seed"], res["capacity"], meta["dropped"],
                 res["aux"].item(), res["seq_aux"].item(), res["z"].item(),
                 res["entropy"].item(), meta["bias_changed"],
                 meta["jitter_changed"]))
        print("    counts %s  kept %s  (%d bytes)"
              % (res["counts"].tolist(), res["kept_counts"].tolist(), nbytes))
    print("extended total %d bytes" % total)
    assert total < 2 * 1024 * 1024
    return total


if __name__ == "__main__":
    sys.exit(main())
