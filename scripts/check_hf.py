#!/usr/bin/env python3
"""Hugging Face transformers compatibility check for moe.c checkpoints (DESIGN.md §2, §5).

    /opt/moe-hf/bin/python scripts/check_hf.py --moe build/moe --workdir DIR
    python3 scripts/check_hf.py --moe build/moe        # re-runs itself under /opt/moe-hf/bin/python
    /opt/moe-hf/bin/python scripts/check_hf.py --selftest   # the HF + numpy half only, no moe

(transformers: scripts/install_hf.sh for 4.40 on Debian's torch 1.13, scripts/install_hf5.sh for
the latest 5.x on PyTorch 2.x from PyPI; MOE_HF_PYTHON picks the interpreter, and ctest runs
both.) Exit 0 when every check passes, 1 when one fails, 77 (CTest's skip code) when
transformers cannot be imported.

Forward (moe -> HF): train a tiny model for a few steps with `moe train`, `moe export` its
latest checkpoint (fp32 and bf16), `moe eval --logits` the first seq_len tokens of val.bin, and
compare with MixtralForCausalLM.from_pretrained on the same tokens. Also loads the raw
checkpoint folder in HF.
Reverse (HF -> moe): save seeded random MixtralForCausalLM models with save_pretrained
(fp32 single file, fp32 sharded with an index, tied embeddings, bf16, fp16), `moe eval --logits`
them and compare with HF's fp32 model built from the same (rounded) weights.

Every comparison is ||a - b|| / ||b|| over the whole [seq_len, vocab] logit matrix. Each one
also prints the distance to an independent float64 numpy implementation of Mixtral that reads
the safetensors files itself (and checks the format rules of DESIGN.md §5), so a failure says
which side is off.
"""
import argparse
import inspect
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import time

from check_common import SKIP, TOK_HEADER, TOK_MAGIC, CheckError, MoeCommand, Results, read_token_header  # noqa: E402,F401
HF_PYTHON = os.environ.get("MOE_HF_PYTHON", "/opt/moe-hf/bin/python")


def _import_hf():
    """Import numpy/torch/transformers; on failure re-exec under the HF venv or exit 77."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from transformers import MixtralConfig, MixtralForCausalLM  # noqa: F401
        return
    except Exception as e:  # ImportError, or a broken install raising something else
        why = f"{type(e).__name__}: {e}"
    in_venv = os.path.realpath(sys.prefix) == os.path.realpath(os.path.join(os.path.dirname(HF_PYTHON), ".."))
    if os.path.exists(HF_PYTHON) and not in_venv and not os.environ.get("MOE_HF_REEXEC"):
        os.environ["MOE_HF_REEXEC"] = "1"
        sys.stdout.flush()
        os.execv(HF_PYTHON, [HF_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    print(f"check_hf: SKIP: transformers is not importable with {sys.executable} ({why}); "
          f"run scripts/install_hf.sh, then use {HF_PYTHON}")
    sys.exit(SKIP)


_import_hf()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import MixtralConfig, MixtralForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()  # missing/unexpected keys are checked here, not warned
transformers.logging.disable_progress_bar()


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(res, name, got, want, tol, ref=None, got_name="moe", want_name="hf"):
    """PASS/FAIL on rel_err(got, want) <= tol; the numpy float64 reference (if given) is shown."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return res.check(name, False, f"shape {got_name} {got.shape} != {want_name} {want.shape}")
    if not np.all(np.isfinite(got)):
        return res.check(name, False, f"{got_name} logits have {int((~np.isfinite(got)).sum())} non-finite values")
    e = rel_err(got, want)
    detail = f"rel_err {got_name} vs {want_name} = {e:.3e} (tol {tol:g})"
    if ref is not None:
        detail += f"; vs numpy f64: {got_name} {rel_err(got, ref):.3e}, {want_name} {rel_err(want, ref):.3e}"
    ok = e <= tol
    if not ok:
        row = np.linalg.norm(got.astype(np.float64) - want, axis=-1) / np.maximum(np.linalg.norm(want, axis=-1), 1e-30)
        worst = int(np.argmax(row))
        detail += (f"; worst position {worst} (rel {row[worst]:.3e}); first position over tol: "
                   f"{int(np.argmax(row > tol)) if (row > tol).any() else '-'}")
    return res.check(name, ok, detail)


# ---------------------------------------------------------------------------------------------
# token files (data/README.md)

def write_tokens(path, tokens, vocab):
    tokens = np.asarray(tokens)
    assert tokens.min() >= 0 and tokens.max() < vocab
    dtype = 2 if vocab <= 65536 else 4
    with open(path, "wb") as f:
        f.write(TOK_HEADER.pack(TOK_MAGIC, 1, dtype, len(tokens), vocab, 0))
        f.write(tokens.astype("<u2" if dtype == 2 else "<u4").tobytes())


def read_tokens(path):
    data, count, vocab, dtype = read_token_header(path)
    toks = np.frombuffer(data, dtype="<u2" if dtype == 2 else "<u4", offset=TOK_HEADER.size).astype(np.int64)
    if count and toks.max() >= vocab:
        raise CheckError(f"{path}: token {toks.max()} >= vocab {vocab}")
    return toks, vocab


# ---------------------------------------------------------------------------------------------
# safetensors, read with numpy (independent of the safetensors package and of torch)

ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}


def read_safetensors(path, strict=True):
    """Returns ({name: float64 array}, {name: dtype string}, metadata). strict: DESIGN.md §5 rules."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", data)
    if 8 + n > len(data):
        raise CheckError(f"{path}: header length {n} runs past the end of the file ({len(data)} bytes)")
    raw = data[8:8 + n]
    header = json.loads(raw.decode("utf-8"))
    meta = header.pop("__metadata__", None)
    problems = []
    if strict:
        if (8 + n) % 8:
            problems.append(f"header not padded to a multiple of 8 (8 + {n})")
        if raw.rstrip(b" ") != raw.rstrip() or raw.rstrip(b" ")[-1:] != b"}":
            problems.append("header padding is not spaces")
        if not meta or meta.get("format") != "pt":
            problems.append(f"__metadata__ is {meta!r}, want {{'format': 'pt'}}")
    base = 8 + n
    spans = []
    tensors, dtypes = {}, {}
    for name, t in header.items():
        dt, shape, (b, e) = t["dtype"], t["shape"], t["data_offsets"]
        if dt not in ST_DTYPES:
            raise CheckError(f"{path}: {name}: dtype {dt} not handled")
        np_dt, size = ST_DTYPES[dt]
        if e - b != size * int(np.prod(shape, dtype=np.int64)) or base + e > len(data):
            raise CheckError(f"{path}: {name}: offsets {b}..{e} do not fit shape {shape} {dt} / file size")
        a = np.frombuffer(data, dtype=np_dt, count=(e - b) // size, offset=base + b)
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = a.astype(np.float64).reshape(shape)
        dtypes[name] = dt
        spans.append((b, e, name))
    if strict:
        spans.sort()
        pos = 0
        for b, e, name in spans:
            if b != pos:
                problems.append(f"{name}: starts at {b}, previous tensor ends at {pos} (gap/overlap)")
            pos = e
        if base + pos != len(data):
            problems.append(f"data ends at {base + pos}, file has {len(data)} bytes")
    if problems:
        raise CheckError(f"{path}: " + "; ".join(problems))
    return tensors, dtypes, meta


def read_hf_folder(folder, strict=True):
    """A Mixtral folder: config.json + model.safetensors or an index + shards."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
    elif os.path.exists(os.path.join(folder, "model.safetensors")):
        wmap, files = None, ["model.safetensors"]
    else:
        raise CheckError(f"{folder}: neither model.safetensors nor model.safetensors.index.json")
    tensors, dtypes = {}, {}
    for fn in files:
        t, d, _ = read_safetensors(os.path.join(folder, fn), strict)
        if wmap is not None:
            for name in t:
                if wmap.get(name) != fn:
                    raise CheckError(f"{folder}/{fn}: {name} is not mapped to this file by the index")
        tensors.update(t)
        dtypes.update(d)
    if wmap is not None:
        missing = sorted(set(wmap) - set(tensors))
        if missing:
            raise CheckError(f"{folder}: index names tensors missing from the shards: {missing[:5]}")
    return cfg, tensors, dtypes


# ---------------------------------------------------------------------------------------------
# Mixtral forward in float64 numpy (HF semantics, DESIGN.md §2)

def numpy_mixtral_logits(cfg, W, tokens):
    d = cfg["hidden_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // H  # transformers 5 writes head_dim (may be null)
    k = cfg["num_experts_per_tok"]
    eps = cfg.get("rms_norm_eps", 1e-5)
    theta = cfg.get("rope_theta", 1e6)
    S = len(tokens)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(np.arange(S, dtype=np.float64), inv_freq)
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]

    def rope(x):  # [S, heads, hd], rotate_half pairing j <-> j + hd/2
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def silu(x):
        return x / (1.0 + np.exp(-x))

    x = W["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((S, S), -np.inf), 1)
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = rope((h @ W[p + "self_attn.q_proj.weight"].T).reshape(S, H, hd))
        kk = rope((h @ W[p + "self_attn.k_proj.weight"].T).reshape(S, KV, hd))
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(S, KV, hd)
        att = np.empty((S, H, hd))
        for i in range(H):
            j = i // (H // KV)
            s = q[:, i] @ kk[:, j].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, i] = (s / s.sum(-1, keepdims=True)) @ v[:, j]
        x = x + att.reshape(S, H * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        z = h @ W[p + "block_sparse_moe.gate.weight"].T
        pr = np.exp(z - z.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        sel = np.argsort(-pr, axis=-1, kind="stable")[:, :k]  # ties: lower expert index
        out = np.zeros_like(x)
        for t in range(S):
            w = pr[t, sel[t]] / pr[t, sel[t]].sum()
            for e, we in zip(sel[t], w):
                pe = p + f"block_sparse_moe.experts.{e}."
                g = silu(W[pe + "w1.weight"] @ h[t]) * (W[pe + "w3.weight"] @ h[t])
                out[t] += we * (W[pe + "w2.weight"] @ g)
        x = x + out
    x = rms(x, W["model.norm.weight"])
    head = W.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False):
        head = W["model.embed_tokens.weight"]
    return x @ head.T


def numpy_logits_of(folder, tokens, strict=True):
    cfg, W, _ = read_hf_folder(folder, strict)
    return numpy_mixtral_logits(cfg, W, np.asarray(tokens))


# ---------------------------------------------------------------------------------------------
# HF side

def hf_load(folder, res, name):
    """from_pretrained in fp32; every parameter must come from the folder (HF would silently
    random-initialise a missing one)."""
    model, info = MixtralForCausalLM.from_pretrained(
        folder, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {key: v for key, v in info.items() if v}
    if bad:
        res.check(f"{name}: HF loads every tensor", False, json.dumps({k: [str(x) for x in v][:6] for k, v in bad.items()}))
        raise CheckError(f"{folder}: HF loading info {bad}")
    model.eval()
    return model


def hf_logits(model, tokens):
    with torch.no_grad():
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))[None]
        return model(input_ids=ids).logits[0].float().numpy()


def hf_ce(logits, tokens):
    """mean next-token CE: position i of the logits predicts tokens[i + 1] (as many as there are)"""
    lg = torch.as_tensor(logits, dtype=torch.float64)
    n = min(len(tokens) - 1, lg.shape[0])
    return float(torch.nn.functional.cross_entropy(lg[:n], torch.as_tensor(np.asarray(tokens[1:n + 1]))))


def tiny_hf_config(**over):
    kw = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
              num_experts_per_tok=2, max_position_embeddings=64, rope_theta=10000.0,
              tie_word_embeddings=False, rms_norm_eps=1e-5,
              # larger than HF's 0.02 so that routing is far from uniform and a wrong
              # expert choice or weight shows up clearly
              initializer_range=0.1)
    kw.update(over)
    return MixtralConfig(**kw)


def random_hf_model(seed, **over):
    torch.manual_seed(seed)
    model = MixtralForCausalLM(tiny_hf_config(**over))
    # norms are 1 at init: make them random too, so a norm read as the wrong tensor shows
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def save_hf(model, folder, dtype=None, **kw):
    if os.path.exists(folder):
        shutil.rmtree(folder)
    m = model if dtype is None else _copy_to(model, dtype)
    m.save_pretrained(folder, safe_serialization=True, **kw)
    names = sorted(os.listdir(folder))
    if not any(n.endswith(".safetensors") for n in names) or any(n.endswith(".bin") for n in names):
        raise CheckError(f"save_pretrained wrote {names}, want safetensors only")
    return names


def describe(files):
    shards = [f for f in files if f.endswith(".safetensors")]
    if "model.safetensors.index.json" in files:
        return f"index + {len(shards)} shards"
    return ", ".join(shards)


def _copy_to(model, dtype):
    m = MixtralForCausalLM(model.config)
    m.load_state_dict(model.state_dict())
    return m.to(dtype).eval()


# ---------------------------------------------------------------------------------------------
# moe side

# `moe eval`'s line: the loss, the perplexity and the token count, whatever words surround them
# ("loss 2.05 ppl 7.8 tokens 4800" or "loss 2.05 nats/token (... over 4800 tokens) | ppl 7.8")
EVAL_LOSS = re.compile(r"\bloss\s+([-+0-9.eEnaif]+)")
EVAL_PPL = re.compile(r"\bppl\s+([-+0-9.eEnaif]+)")
EVAL_TOKENS = re.compile(r"\btokens\s+(\d+)|\b(\d+)\s+tokens\b")


class Moe(MoeCommand):
    def run(self, *args):
        """stdout and stderr, as text."""
        out, err = self.run_bytes(*args)
        return (out + err).decode("utf-8", "replace")

    def eval(self, ckpt, data, seq_len, logits_path):
        if os.path.exists(logits_path):
            os.remove(logits_path)
        out = self.run("eval", "--ckpt", ckpt, "--data", data, "--seq-len", seq_len, "--logits", logits_path)
        m, p, t = EVAL_LOSS.search(out), EVAL_PPL.search(out), EVAL_TOKENS.search(out)
        if not (m and p and t):
            raise CheckError(f"moe eval printed no loss, ppl and token count:\n{out[-2000:]}")
        loss, ppl, ntok = float(m.group(1)), float(p.group(1)), int(t.group(1) or t.group(2))
        a = np.load(logits_path)
        if a.dtype != np.float32:
            raise CheckError(f"{logits_path}: dtype {a.dtype}, want float32")
        return a, loss, ppl, ntok


def check_eval_line(res, name, loss, ppl, ntok):
    ok = math.isfinite(loss) and ntok > 0 and abs(ppl - math.exp(loss)) <= 1e-4 * math.exp(loss)
    res.check(f"{name}: eval line", ok, f"loss {loss:.6f} ppl {ppl:.6f} (exp(loss) {math.exp(loss):.6f}) tokens {ntok}")


# ---------------------------------------------------------------------------------------------
# (a) forward: moe train -> export -> HF

TINY_CFG = """\
model = {{ vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2; d_ff = 48;
          n_experts = 4; top_k = 2; max_seq_len = 64; rope_theta = 10000.0; }};
train = {{ steps = {steps}; batch_size = 2; seq_len = 32; warmup_steps = 1; eval_interval = 0;
          eval_batches = 1; }};
data = {{ dir = "{data}"; text = ["{text}"]; }};
log = {{ dir = "{run}"; }};
checkpoint = {{ interval = 0; keep = 1; }};
"""


def make_text(path, n_bytes=48000, seed=3):
    rng = np.random.default_rng(seed)
    words = ("the expert router sends each token to two of four experts and the load balancing "
             "loss keeps them busy while attention mixes positions with rotary embeddings "
             "mixture of experts language model checkpoint safetensors").split()
    out, n = [], 0
    while n < n_bytes:
        line = " ".join(rng.choice(words, size=int(rng.integers(4, 14)))).capitalize() + ".\n"
        out.append(line)
        n += len(line)
    with open(path, "w") as f:
        f.write("".join(out))


def expected_names(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.get("tie_word_embeddings", False):
        names.add("lm_head.weight")
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        names |= {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                  "block_sparse_moe.gate.weight")}
        for e in range(cfg["num_local_experts"]):
            names |= {p + f"block_sparse_moe.experts.{e}.w{i}.weight" for i in (1, 2, 3)}
    return names


def check_folder(res, name, folder, want_dt, x):
    """Format (DESIGN.md §5), config.json, tensor names and dtypes of a folder the C side wrote;
    returns the numpy float64 logits of x."""
    cfg, W, dts = read_hf_folder(folder, strict=True)
    want = expected_names(cfg) if "num_hidden_layers" in cfg and "num_local_experts" in cfg else set()
    missing, extra = sorted(want - set(W)), sorted(set(W) - want)
    odd = sorted({d for d in dts.values() if d != want_dt})
    ok = (cfg.get("model_type") == "mixtral" and cfg.get("architectures") == ["MixtralForCausalLM"]
          and "rope_theta" in cfg and want and not missing and not extra and not odd)
    res.check(f"forward: {name} files (safetensors rules, config.json, names, {want_dt})", ok,
              f"{len(W)} tensors; model_type {cfg.get('model_type')!r}; architectures "
              f"{cfg.get('architectures')}; rope_theta {cfg.get('rope_theta')}; missing {missing[:4]}; "
              f"unexpected {extra[:4]}; other dtypes {odd}; config torch_dtype {cfg.get('torch_dtype')!r}")
    return numpy_mixtral_logits(cfg, W, x) if not missing else None


def forward_checks(res, moe, wd, S, tol, tol_bf16, steps):
    text = os.path.join(wd, "text.txt")
    data, run = os.path.join(wd, "data"), os.path.join(wd, "run")
    for p in (data, run):
        shutil.rmtree(p, ignore_errors=True)
    make_text(text)
    cfg = os.path.join(wd, "tiny.cfg")
    with open(cfg, "w") as f:
        f.write(TINY_CFG.format(steps=steps, data=data, text=text, run=run))
    moe.run("train", cfg)

    latest = os.path.join(run, "ckpt", "latest")
    if not os.path.isfile(latest):
        raise CheckError(f"moe train wrote no {latest} (contents of {run}: "
                         f"{sorted(os.listdir(run)) if os.path.isdir(run) else 'missing'})")
    with open(latest) as f:
        step_name = f.read().strip()
    res.check("forward: ckpt/latest names the last step", step_name == f"step_{steps:08d}",
              f"latest = {step_name!r}")
    ckpt = os.path.join(run, "ckpt", step_name)
    if not os.path.isdir(ckpt):
        raise CheckError(f"{latest} names {step_name!r}, which is not a folder")

    val = os.path.join(data, "val.bin")
    toks, vocab = read_tokens(val)
    if vocab != 256 or len(toks) < S + 1:
        raise CheckError(f"{val}: vocab {vocab}, {len(toks)} tokens; want 256 and >= {S + 1}")
    x = toks[:S]

    exp32, exp16 = os.path.join(wd, "export_fp32"), os.path.join(wd, "export_bf16")
    for p in (exp32, exp16):
        shutil.rmtree(p, ignore_errors=True)
    res.attempt("forward: moe export fp32", moe.run, "export", "--ckpt", ckpt, "--out", exp32)
    res.attempt("forward: moe export bf16", moe.run, "export", "--ckpt", ckpt, "--out", exp16, "--dtype", "bf16")

    ref = {}
    for name, folder, dt in (("checkpoint", ckpt, "F32"), ("export fp32", exp32, "F32"), ("export bf16", exp16, "BF16")):
        if os.path.isdir(folder):
            ref[folder] = res.attempt(f"forward: {name} files", check_folder, res, name, folder, dt, x)
    if os.path.isdir(exp32):
        names = sorted(os.listdir(exp32))
        extra = [n for n in names if not (n in ("config.json", "generation_config.json", "model.safetensors.index.json",
                                                 "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
                                          or (n.startswith("model") and n.endswith(".safetensors")))]
        res.check("forward: fp32 export is inference-only", not extra, f"files {names}")

    def fp32_vs_hf():
        a, loss, ppl, ntok = moe.eval(exp32, val, S, os.path.join(wd, "a.npy"))
        check_eval_line(res, "forward fp32", loss, ppl, ntok)
        b = hf_logits(hf_load(exp32, res, "forward export fp32"), x)
        compare(res, "forward: moe eval vs HF, fp32 export", a, b, tol, ref.get(exp32))
        print(f"     HF next-token CE on these {S} tokens: {hf_ce(b, toks[:S + 1]):.6f} "
              f"(moe eval loss over val.bin: {loss:.6f})")
        return a

    def ckpt_vs_hf(a):
        b = hf_logits(hf_load(ckpt, res, "forward checkpoint"), x)
        compare(res, "forward: moe eval (fp32 export) vs HF, raw checkpoint folder", a, b, tol, ref.get(ckpt))

    def bf16_vs_hf(a):
        b16 = hf_logits(hf_load(exp16, res, "forward export bf16"), x)
        if a is not None:
            compare(res, "forward: HF bf16 export vs moe fp32", b16, a, tol_bf16, None, "hf-bf16", "moe-fp32")
        a16, loss16, ppl16, ntok16 = moe.eval(exp16, val, S, os.path.join(wd, "a16.npy"))
        check_eval_line(res, "forward bf16", loss16, ppl16, ntok16)
        compare(res, "forward: moe eval vs HF, bf16 export (fp32 compute)", a16, b16, tol, ref.get(exp16))

    a = res.attempt("forward: fp32 export", fp32_vs_hf) if os.path.isdir(exp32) else None
    if a is not None:
        res.attempt("forward: raw checkpoint", ckpt_vs_hf, a)
    if os.path.isdir(exp16):
        res.attempt("forward: bf16 export", bf16_vs_hf, a)


# ---------------------------------------------------------------------------------------------
# (b) reverse: HF save_pretrained -> moe eval

REVERSE_CASES = [
    # name, seed, dtype, config overrides, save_pretrained kwargs, short token file
    ("fp32", 1, None, {}, {}, True),
    ("fp32 sharded", 1, None, {}, {"max_shard_size": "40KB"}, False),
    ("fp32 tied embeddings", 2, None, {"tie_word_embeddings": True}, {}, False),
    ("bf16", 1, torch.bfloat16, {}, {}, False),
    ("fp16", 1, torch.float16, {}, {}, False),
]
# head_dim other than hidden_size / num_attention_heads (32 / 4 = 8): Qwen3-MoE's shape, in a
# Mixtral folder; transformers' Mixtral reads head_dim from 4.46 on
if "head_dim" in inspect.signature(MixtralConfig.__init__).parameters:
    REVERSE_CASES.append(("fp32 head_dim 12", 3, None, {"head_dim": 12}, {}, False))


def reverse_models(wd, res, S):
    """Yields (case, folder, hf_logits, numpy_logits, tokens, token_file) per case."""
    rng = np.random.default_rng(7)
    long_toks = rng.integers(0, 256, size=4 * S + 5)
    long_file, short_file = os.path.join(wd, "tokens_long.bin"), os.path.join(wd, "tokens_short.bin")
    write_tokens(long_file, long_toks, 256)
    write_tokens(short_file, long_toks[:S + 1], 256)  # one window: S positions, S targets
    back, _ = read_tokens(long_file)
    assert np.array_equal(back, long_toks)
    for name, seed, dtype, over, save_kw, short in REVERSE_CASES:
        folder = os.path.join(wd, "hf_" + name.replace(" ", "_"))
        try:
            model = random_hf_model(seed, **over)
            files = save_hf(model, folder, dtype, **save_kw)
            if save_kw.get("max_shard_size") and "model.safetensors.index.json" not in files:
                raise CheckError(f"sharded save wrote {files}, no index")
            # HF's fp32 model from the saved (possibly rounded) weights
            ref_model = hf_load(folder, res, f"reverse {name}")
            cfg_json, W, dts = read_hf_folder(folder, strict=True)
            want_dt = {None: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]
            if set(dts.values()) != {want_dt}:
                raise CheckError(f"{folder}: dtypes {set(dts.values())}, want {want_dt}")
            if over.get("tie_word_embeddings") and "lm_head.weight" in W:
                print(f"     note: {name}: HF wrote lm_head.weight although tied")
            x = long_toks[:S]
            b = hf_logits(ref_model, x)
            ref = numpy_mixtral_logits(cfg_json, W, x)
            yield name, folder, b, ref, (long_toks[:S + 1] if short else long_toks), (short_file if short else long_file), files
        except CheckError as e:
            res.error(f"reverse {name}", e)
        except Exception as e:
            import traceback
            traceback.print_exc()
            res.error(f"reverse {name}", f"{type(e).__name__}: {e}")


def reverse_checks(res, moe, wd, S, tol):
    def one(name, folder, b, ref, toks, tok_file, files):
        a, loss, ppl, ntok = moe.eval(folder, tok_file, S, os.path.join(wd, f"b_{name.replace(' ', '_')}.npy"))
        check_eval_line(res, f"reverse {name}", loss, ppl, ntok)
        compare(res, f"reverse: moe eval vs HF, {name} ({describe(files)})", a, b, tol, ref)
        if len(toks) == S + 1:  # the whole file is one window: the eval loss is this CE
            ce = hf_ce(b, toks)
            if ntok == S:
                res.check(f"reverse {name}: eval loss == HF CE", abs(loss - ce) <= 1e-5 * max(1.0, abs(ce)),
                          f"moe {loss:.7f} HF {ce:.7f}")
            else:
                print(f"     note: {S + 1}-token file gave tokens {ntok} (not {S}); loss {loss:.6f}, HF CE {ce:.6f}")

    for case in reverse_models(wd, res, S):
        res.attempt(f"reverse {case[0]}: moe eval", one, *case)


# ---------------------------------------------------------------------------------------------
# selftest: the HF half without moe

def selftest(res, wd, S, tol):
    # numpy reference and safetensors reader vs HF on every reverse case
    for name, folder, b, ref, toks, tok_file, files in reverse_models(wd, res, S):
        compare(res, f"selftest: numpy f64 vs HF, {name} ({describe(files)})", ref, b, tol, None, "numpy", "hf")
    # the reference must be sensitive: a wrong expert choice or a wrong RoPE pairing must fail
    model = random_hf_model(1)
    folder = os.path.join(wd, "hf_fp32")
    cfg_json, W, _ = read_hf_folder(folder)
    x = np.random.default_rng(7).integers(0, 256, size=S)
    b = hf_logits(model, x)
    W2 = dict(W)
    W2["model.layers.1.block_sparse_moe.experts.0.w1.weight"] = W["model.layers.1.block_sparse_moe.experts.1.w1.weight"]
    e = rel_err(numpy_mixtral_logits(cfg_json, W2, x), b)
    res.check("selftest: swapped expert weight is detected", e > 100 * tol, f"rel_err {e:.3e}")
    cfg2 = dict(cfg_json, num_experts_per_tok=1)
    e = rel_err(numpy_mixtral_logits(cfg2, W, x), b)
    res.check("selftest: top-1 instead of top-2 is detected", e > 100 * tol, f"rel_err {e:.3e}")
    cfg3 = dict(cfg_json, rope_theta=1e6)
    e = rel_err(numpy_mixtral_logits(cfg3, W, x), b)
    res.check("selftest: wrong rope_theta is detected", e > 100 * tol, f"rel_err {e:.3e}")
    # HF's own loss helpers, for the record (DESIGN.md §3.6: HF reports k times the Switch value)
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    T, E, k = 64, 4, 2
    z = torch.zeros(T, E)  # uniform probabilities, balanced-ish counts
    z[torch.arange(T), torch.arange(T) % E] = 1e-3
    z[torch.arange(T), (torch.arange(T) + 1) % E] = 5e-4
    hf_val = float(load_balancing_loss_func((z,), E, k))
    res.check("selftest: HF load_balancing_loss_func on balanced routing == top_k (not 1)",
              abs(hf_val - k) < 1e-3, f"{hf_val:.6f}")
    # token file round trip
    p = os.path.join(wd, "rt.bin")
    t = np.random.default_rng(0).integers(0, 70000, size=100)
    write_tokens(p, t, 70000)
    back, v = read_tokens(p)
    res.check("selftest: token file round trip (u32)", np.array_equal(back, t) and v == 70000)


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moe", help="path to the moe executable (required unless --selftest)")
    ap.add_argument("--workdir", help="scratch folder (default: a temporary folder, removed on success)")
    ap.add_argument("--selftest", action="store_true", help="check the HF/numpy half only; no moe needed")
    ap.add_argument("--only", choices=["forward", "reverse"], help="run one direction")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5, help="training steps of the forward check")
    ap.add_argument("--tol", type=float, default=1e-5, help="fp32 tolerance (rel. Frobenius)")
    ap.add_argument("--tol-bf16", type=float, default=2e-2, help="bf16-weights vs fp32-weights tolerance")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per moe command")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    if not args.selftest and not args.moe:
        ap.error("--moe is required (or --selftest)")
    if args.moe and not os.access(args.moe, os.X_OK):
        ap.error(f"--moe {args.moe}: not an executable")

    torch.set_num_threads(args.threads)
    print(f"check_hf: python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, numpy {np.__version__}", flush=True)

    tmp = args.workdir is None
    wd = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="moe_check_hf_"))
    os.makedirs(wd, exist_ok=True)
    res = Results()
    t0 = time.time()
    try:
        if args.selftest:
            selftest(res, wd, args.seq_len, args.tol)
        else:
            moe = Moe(args.moe, wd, args.timeout)
            if args.only in (None, "forward"):
                res.attempt("forward", forward_checks, res, moe, wd, args.seq_len, args.tol, args.tol_bf16, args.steps)
            if args.only in (None, "reverse"):
                res.attempt("reverse", reverse_checks, res, moe, wd, args.seq_len, args.tol)
    except Exception as e:  # a bug here or an unexpected HF behaviour: report, do not skip
        import traceback
        traceback.print_exc()
        res.error("check_hf", f"{type(e).__name__}: {e}")
    return res.finish("check_hf", t0, wd, tmp)


if __name__ == "__main__":
    sys.exit(main())
