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

Structure (meant to be extended later, e.g. with whole-model fixtures):
    moe_reference(...)      the reference forward + backward of one MoE layer
    make_inputs(...)        seeded float32 input draw
    check_margins(...)      float32-robustness of the discrete decisions
    write_fixture / read_fixture
    self-checks             finite differences, balanced-routing aux loss,
                            file round trip
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


def route(x, gate, k, norm_topk_prob):
    """Router: logits, probabilities, top-k selection and combine weights.

    z = x @ gate^T                      [T,E]
    p = softmax(z), lse = logsumexp(z)  per token
    top-k of p, descending, ties -> lower expert index (stable sort)
    w[t,j] = p_sel / sum_j p_sel   (norm_topk_prob)   else   p_sel
    """
    z = x @ gate.t()
    p = torch.softmax(z, dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    # Stable descending sort: equal probabilities keep ascending expert index.
    order = torch.sort(p.detach(), dim=-1, descending=True, stable=True).indices
    topk_idx = order[:, :k]
    p_sel = torch.gather(p, 1, topk_idx)          # differentiable
    if norm_topk_prob:
        w = p_sel / p_sel.sum(dim=-1, keepdim=True)
    else:
        w = p_sel
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
                capacity_factor, aux_coef, z_coef):
    """Forward pass; all tensors float64.  Returns a dict of results."""
    T, d = x.shape
    E = gate.shape[0]
    z, p, lse, topk_idx, w = route(x, gate, k, norm_topk_prob)

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
    # f_e = c_e / (k T) (constant), P_e = mean_t p_e(t)
    f = (counts.to(torch.float64) / (k * T)).detach()
    P = p.mean(dim=0)
    L_aux = aux_coef * E * torch.sum(f * P)
    # router z-loss: L_z = z_coef * mean_t lse(t)^2
    L_z = z_coef * torch.mean(lse ** 2)
    # router entropy: mean_t -sum_e p log p
    entropy = torch.mean(-torch.sum(p * torch.log(p), dim=-1))

    kept_counts = torch.zeros(E, dtype=torch.int64)
    kept_counts.scatter_add_(0, topk_idx.reshape(-1),
                             keep.reshape(-1).to(torch.int64))
    return dict(out=out, aux=L_aux, z=L_z, probs=p, weights=w,
                entropy=entropy, topk_idx=topk_idx, keep=keep, counts=counts,
                kept_counts=kept_counts, capacity=C, logits=z)


def moe_loss(res, dout):
    """Total scalar: sum(out * dout) + L_aux + L_z."""
    return torch.sum(res["out"] * dout) + res["aux"] + res["z"]


def moe_reference(inputs, cfg):
    """Forward + backward in float64 from the (float32) inputs.

    inputs: dict of float32 tensors x, gate, w1, w2, w3, dout.
    cfg: dict with k, norm_topk_prob, policy, capacity_factor, aux_coef,
         z_coef.
    Returns the forward dict plus gradients dx, dgate, dw1, dw2, dw3.
    """
    params = {n: inputs[n].to(torch.float64).clone().requires_grad_(True)
              for n in ("x", "gate", "w1", "w2", "w3")}
    dout = inputs["dout"].to(torch.float64)
    res = moe_forward(params["x"], params["gate"], params["w1"], params["w2"],
                      params["w3"], cfg["k"], cfg["norm_topk_prob"],
                      cfg["policy"], cfg["capacity_factor"], cfg["aux_coef"],
                      cfg["z_coef"])
    loss = moe_loss(res, dout)
    loss.backward()
    for n, t in params.items():
        res["d" + n] = t.grad.detach().clone()
    res["loss"] = loss.detach()
    return res


# --------------------------------------------------------------------------
# Inputs and margin checks
# --------------------------------------------------------------------------

def make_inputs(seed, T, d, ff, E, skew):
    """Seeded float32 draw.

    x ~ N(0,1); gate ~ 0.3 N(0,1) plus a skew: expert e's gate row gets
    skew * s_e * u added, u = unit mean direction of x, s_e = 1, 0.5, 0, ...
    (favours the first experts so capacity cases drop assignments);
    w1, w3 ~ N(0,1)/sqrt(d); w2 ~ N(0,1)/sqrt(ff); dout ~ N(0,1).
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
    return dict(x=x, gate=gate, w1=w1, w2=w2, w3=w3, dout=dout)


def rel_gap(a, b):
    """Relative gap |a-b| / max(|a|,|b|) (elementwise)."""
    return (a - b).abs() / torch.maximum(a.abs(), b.abs())


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
        C = res["capacity"]
        topk_idx, w = res["topk_idx"], res["weights"].detach()
        for e in range(E):
            we = w[topk_idx == e]
            if we.numel() > C:
                s = torch.sort(we, descending=True).values
                gap = rel_gap(s[C - 1], s[C]).item()
                if gap <= MARGIN_REL:
                    return False, "capacity gap %.3g (expert %d)" % (gap, e)
    return True, "ok"


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
                        cfg["z_coef"])
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


def selfcheck_roundtrip(path, tensors):
    back = read_fixture(path)
    assert list(back.keys()) == [n for n, _ in tensors], path
    for name, value in tensors:
        a = _to_numpy(value)
        b = back[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name


# --------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    selfcheck_balanced_aux()
    total = 0
    for spec in CASES:
        inputs, cfg, res, meta = build_case(spec)
        if spec[0] in FD_CASES:
            selfcheck_finite_difference(inputs, cfg)
        tensors = fixture_tensors(inputs, cfg, res, meta)
        path = os.path.join(args.out, spec[0] + ".bin")
        nbytes = write_fixture(path, tensors)
        selfcheck_roundtrip(path, tensors)
        total += nbytes
        print("%-24s seed %4d  C=%-3d dropped %-3d aux %.10g  z %.10g  "
              "entropy %.6g  counts %s  kept %s  (%d bytes)"
              % (spec[0], meta["seed"], res["capacity"], meta["dropped"],
                 res["aux"].item(), res["z"].item(), res["entropy"].item(),
                 res["counts"].tolist(), res["kept_counts"].tolist(), nbytes))
    print("total %d bytes" % total)
    assert total < 2 * 1024 * 1024
    return 0


if __name__ == "__main__":
    sys.exit(main())
