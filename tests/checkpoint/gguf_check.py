#!/usr/bin/env python3
"""`moe export --format gguf` read back by an independent GGUF reader (the `gguf` package).

  gguf_check.py MOE_BINARY WORKDIR

Trains two small Mixtral models (configs/default.cfg for 10 steps, untied; and a tied one with
head_dim != d_model / n_heads and d_ff = 48, whose down projection is not whole Q8_0 blocks),
exports each as f32, f16, bf16 and q8_0, and checks with gguf.GGUFReader:
  - the header (version 3), every metadata key (the exact set, each value and value type),
    every tensor's name, shape (ne) and type, every data offset a multiple of 32;
  - every tensor's values against the checkpoint's safetensors (read with the safetensors
    package), the q/k rows un-permuted from GGML's RoPE pairs back to HF's halves: f32 equal,
    f16 and bf16 equal to numpy's round-to-nearest-even of the fp32 value (so within half an
    ulp), q8_0 within half its block's scale of the value (the scale: the smallest fp16 >=
    max|x| / 127), and gguf's own dequantizer agreeing with ours; the extra token's rows zero;
    output.weight absent when the embeddings are tied;
  - the byte tokenizer: GPT-2's byte-to-unicode symbols (computed here), the extra
    <|endoftext|> token (control, BOS = EOS = 256, suppressed), no merges;
  - refusals, nothing written, a message naming the field: a trained Mixtral with
    norm_topk_prob = false, HF folders with scoring_func "sigmoid", routed_scaling_factor 2,
    router_bias, n_group 2, another tokenizer.json; a trained qwen3_moe model;
  - a file size limit mid-write (a full disk): exit 1 naming FILE.tmp, neither file left;
    an existing output refused; --type misuse a usage error.
With llama-cpp-python importable ($MOE_LLAMA_PYTHON, else /opt/moe-llama/bin/python), also
llama.cpp itself: it loads every file, tokenizes text to moe.c's ids, its logits of the f32
file (f32 KV cache) equal `moe eval --logits` within 1e-4 of the largest logit, and its greedy
continuation (decoded token by token) is moe.c's argmax at every step; the other types'
differences are printed. Exit 77 (skipped) when gguf, numpy or safetensors is missing
(scripts/install_hf5.sh installs gguf into /opt/moe-hf5).
"""
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

try:
    import numpy as np
    import gguf
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"skip: {e} (scripts/install_hf5.sh installs gguf into /opt/moe-hf5)")
    sys.exit(77)

ROOT = Path(__file__).resolve().parents[2]
MOE, WORK = sys.argv[1], Path(sys.argv[2]).resolve()
TYPES = {"f32": (gguf.GGMLQuantizationType.F32, 0), "f16": (gguf.GGMLQuantizationType.F16, 1),
         "bf16": (gguf.GGMLQuantizationType.BF16, 32), "q8_0": (gguf.GGMLQuantizationType.Q8_0, 7)}
V_BYTES, EXTRA = 256, 256  # the byte vocabulary; the extra token's id
failures = []


def check(what, ok, detail=""):
    print(("  ok    " if ok else "  FAIL  ") + what + ("" if ok or not detail else f": {detail}"))
    if not ok:
        failures.append(what)
    return ok


def moe(*args, **kw):
    return subprocess.run([MOE, *args], capture_output=True, text=True, cwd=ROOT, **kw)


def train(name, *sets, cfg="configs/default.cfg"):
    common = ["train.warmup_steps=1", f'log.dir="{WORK / name}"', f'data.dir="{WORK / "data"}"',
              f'data.text=["{ROOT / "README.md"}","{ROOT / "docs"}"]']
    args = ["train", cfg]
    for s in common + list(sets):
        args += ["--set", s]
    r = moe(*args)
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-2000:])
        sys.exit(f"moe train {name} failed")
    return WORK / name / "ckpt" / "latest"


def step_folder(latest):
    return latest.parent / latest.read_text().strip()


# ---- what the file must hold, from the checkpoint's own files -----------------------------

def bytes_to_unicode():
    # GPT-2's table, as its encoder.py builds it
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b), cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def expected_keys(cfg, name, type_name):
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or d // H
    T = gguf.GGUFValueType
    sym = bytes_to_unicode()
    keys = {
        "general.architecture": (T.STRING, "llama"),
        "general.name": (T.STRING, name),
        "general.file_type": (T.UINT32, TYPES[type_name][1]),
        "general.quantization_version": (T.UINT32, 2),
        "general.alignment": (T.UINT32, 32),
        "llama.vocab_size": (T.UINT32, cfg["vocab_size"] + 1),
        "llama.context_length": (T.UINT32, cfg["max_position_embeddings"]),
        "llama.embedding_length": (T.UINT32, d),
        "llama.block_count": (T.UINT32, cfg["num_hidden_layers"]),
        "llama.feed_forward_length": (T.UINT32, cfg["intermediate_size"]),
        "llama.attention.head_count": (T.UINT32, H),
        "llama.attention.head_count_kv": (T.UINT32, cfg["num_key_value_heads"]),
        "llama.rope.dimension_count": (T.UINT32, hd),
        "llama.rope.freq_base": (T.FLOAT32, float(np.float32(cfg["rope_theta"]))),
        "llama.attention.layer_norm_rms_epsilon": (T.FLOAT32, float(np.float32(cfg["rms_norm_eps"]))),
        "llama.expert_count": (T.UINT32, cfg["num_local_experts"]),
        "llama.expert_used_count": (T.UINT32, cfg["num_experts_per_tok"]),
        "tokenizer.ggml.model": (T.STRING, "gpt2"),
        "tokenizer.ggml.pre": (T.STRING, "gpt-2"),
        "tokenizer.ggml.tokens": (T.ARRAY, [sym[b] for b in range(256)] + ["<|endoftext|>"]),
        "tokenizer.ggml.token_type": (T.ARRAY, [1] * 256 + [3]),
        "tokenizer.ggml.merges": (T.ARRAY, []),
        "tokenizer.ggml.bos_token_id": (T.UINT32, EXTRA),
        "tokenizer.ggml.eos_token_id": (T.UINT32, EXTRA),
        "tokenizer.ggml.add_bos_token": (T.BOOL, False),
        "tokenizer.ggml.add_eos_token": (T.BOOL, False),
        "tokenizer.ggml.suppress_tokens": (T.ARRAY, [EXTRA]),
    }
    if hd * H != d:
        keys["llama.attention.key_length"] = (T.UINT32, hd)
        keys["llama.attention.value_length"] = (T.UINT32, hd)
    return keys


def unpermute(w, heads):
    # GGUF row 2i + j of a head is HF row j * hd/2 + i (llama.cpp's converter's permute)
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(cfg, st, type_name):
    """name -> (HF-layout reference in GGUF's numpy shape (ne reversed), ggml type, q/k heads)."""
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    want = TYPES[type_name][0]

    def typ(ref, router=False):
        if ref.ndim == 1 or router:
            return gguf.GGMLQuantizationType.F32
        if want == gguf.GGMLQuantizationType.Q8_0 and ref.shape[-1] % 32:
            return gguf.GGMLQuantizationType.F16  # the converter's fallback
        return want

    def pad(w):
        return np.concatenate([w, np.zeros((1, w.shape[1]), np.float32)])

    out = {}

    def add(name, ref, router=False, heads=0):
        out[name] = (ref, typ(ref, router), heads)

    add("token_embd.weight", pad(st["model.embed_tokens.weight"]))
    for l in range(L):
        p = f"model.layers.{l}."
        add(f"blk.{l}.attn_norm.weight", st[p + "input_layernorm.weight"])
        add(f"blk.{l}.attn_q.weight", st[p + "self_attn.q_proj.weight"], heads=cfg["num_attention_heads"])
        add(f"blk.{l}.attn_k.weight", st[p + "self_attn.k_proj.weight"], heads=cfg["num_key_value_heads"])
        add(f"blk.{l}.attn_v.weight", st[p + "self_attn.v_proj.weight"])
        add(f"blk.{l}.attn_output.weight", st[p + "self_attn.o_proj.weight"])
        add(f"blk.{l}.ffn_norm.weight", st[p + "post_attention_layernorm.weight"])
        add(f"blk.{l}.ffn_gate_inp.weight", st[p + "block_sparse_moe.gate.weight"], router=True)
        for g, w in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
            add(f"blk.{l}.ffn_{g}_exps.weight",
                np.stack([st[f"{p}block_sparse_moe.experts.{e}.{w}.weight"] for e in range(E)]))
    add("output_norm.weight", st["model.norm.weight"])
    if not cfg["tie_word_embeddings"]:
        add("output.weight", pad(st["lm_head.weight"]))
    return out


def load_safetensors(folder):
    st = {}
    for f in sorted(folder.glob("model*.safetensors")):
        st.update(load_file(str(f)))
    return st


# ---- the file, read back -------------------------------------------------------------------

def field_value(f):
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if len(f.types) > 1 and f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [int(f.parts[i][0]) for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    v = f.parts[f.data[0]][0]
    return bool(v) if f.types[0] == gguf.GGUFValueType.BOOL else v.item()


def bf16_rne(x):
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def check_values(label, t, ref, ttype):
    """Values of tensor t (already un-permuted by the caller into ref's layout: see got())."""
    raw = np.asarray(t.data)
    if ttype == gguf.GGMLQuantizationType.F32:
        got = raw.reshape(ref.shape)
        return np.array_equal(got, ref), "not equal"
    if ttype == gguf.GGMLQuantizationType.F16:
        got = raw.view(np.float16).reshape(ref.shape)
        return np.array_equal(got, ref.astype(np.float16)), \
            f"max |err| {np.abs(got.astype(np.float32) - ref).max():.3g}"
    if ttype == gguf.GGMLQuantizationType.BF16:
        got = raw.view("<u2").reshape(ref.shape)
        return np.array_equal(got, bf16_rne(ref)), "not bf16(x) rounded to nearest even"
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    x = ref.reshape(-1, 32)
    deq = q * d
    want = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    below = np.nextafter(d.astype(np.float16), np.float16(0)).astype(np.float32)
    ok_scale = np.all(d >= want) and np.all((d == 0) | (below < want))
    err = np.abs(deq - x)
    ok_err = np.all(err <= d / 2 * (1 + 1e-6))
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(-1, 32)
    ok_theirs = np.array_equal(theirs, deq)
    return ok_scale and ok_err and ok_theirs, \
        f"scale rule {ok_scale}, |err| <= d/2 {ok_err} (max err/d {np.max(err / np.maximum(d, 1e-30)):.3f}), gguf's dequantizer agrees {ok_theirs}"


def check_file(path, cfg, st, type_name, name):
    label = f"{path.name}"
    r = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    check(f"{label}: GGUF version 3", field_value(r.fields["GGUF.version"]) == 3)
    want = expected_keys(cfg, name, type_name)
    check(f"{label}: the metadata keys are exactly the expected ones", set(fields) == set(want),
          f"extra {sorted(set(fields) - set(want))}, missing {sorted(set(want) - set(fields))}")
    bad = []
    for k, (vt, v) in want.items():
        if k not in fields:
            continue
        f = fields[k]
        got = field_value(f)
        if f.types[0] != vt or got != v:
            bad.append(f"{k} = {got if not isinstance(got, list) or len(got) < 8 else str(got[:4]) + '...'} "
                       f"({f.types[0].name})")
    check(f"{label}: every key's value and type ({len(want)} keys)", not bad, "; ".join(bad))
    exp = expected_tensors(cfg, st, type_name)
    names = [t.name for t in r.tensors]
    check(f"{label}: the tensor names ({len(exp)})", sorted(names) == sorted(exp) and len(names) == len(set(names)),
          f"extra {sorted(set(names) - set(exp))}, missing {sorted(set(exp) - set(names))}")
    shape_bad, type_bad, align_bad, value_bad = [], [], [], []
    for t in r.tensors:
        if t.name not in exp:
            continue
        ref, ttype, heads = exp[t.name]
        ne = [int(n) for n in t.shape]
        if ne != list(reversed(ref.shape)):
            shape_bad.append(f"{t.name} ne {ne}, expected {list(reversed(ref.shape))}")
            continue
        if t.tensor_type != ttype:
            type_bad.append(f"{t.name} {t.tensor_type.name}, expected {ttype.name}")
            continue
        if t.data_offset % 32:
            align_bad.append(f"{t.name} at {t.data_offset}")
        if heads:  # the file's rows, un-permuted, against HF's
            ok, why = check_values(label, UnpermutedView(t, heads, ref.shape), ref, ttype)
        else:
            ok, why = check_values(label, t, ref, ttype)
        if not ok:
            value_bad.append(f"{t.name}: {why}")
    check(f"{label}: every tensor's shape (ne reversed from HF's [.., rows, cols])", not shape_bad, "; ".join(shape_bad))
    check(f"{label}: every tensor's type (norms and router f32, else {type_name}"
          f"{'; f16 where ne[0] % 32' if type_name == 'q8_0' else ''})", not type_bad, "; ".join(type_bad))
    check(f"{label}: every data offset a multiple of 32", not align_bad, "; ".join(align_bad))
    check(f"{label}: every tensor's values against the safetensors (q/k un-permuted)", not value_bad,
          "; ".join(value_bad[:4]))
    return r


class UnpermutedView:
    """A q/k tensor's rows back in HF's order (the raw rows: blocks or elements of a row)."""

    def __init__(self, t, heads, shape):
        raw = np.asarray(t.data)
        rows = shape[0]
        self.data = unpermute(raw.reshape(rows, -1), heads)


# ---- the test -------------------------------------------------------------------------------

def export(ckpt, out, typ, **kw):
    return moe("export", "--ckpt", str(ckpt), "--format", "gguf", "--type", typ, "--out", str(out), **kw)


def refused(label, ckpt, field):
    out = WORK / f"refused-{label}.gguf"
    r = export(ckpt, out, "f32")
    check(f"refused: {label}: exit 1, the message names {field}, nothing written",
          r.returncode == 1 and field in r.stderr and not out.exists() and not Path(str(out) + ".tmp").exists(),
          f"rc {r.returncode}, {r.stderr.strip()[-300:]}")


def llama_cpp_part(files, ref_ckpt):
    py = os.environ.get("MOE_LLAMA_PYTHON", "/opt/moe-llama/bin/python")
    if not (Path(py).exists() and subprocess.run([py, "-c", "import llama_cpp, numpy"],
                                                 capture_output=True).returncode == 0):
        print(f"  skip  llama.cpp itself: no llama_cpp in {py}")
        return
    text = b"The MoE layer routes each token to its top-k experts; the router "
    S = 48
    ids = list(text[:S])
    tok = WORK / "llama_prompt.bin"
    with open(tok, "wb") as f:
        f.write(b"MOETOK1\0" + struct.pack("<IIQII", 1, 2, S + 1, 256, 0)
                + np.array(ids + [32], "<u2").tobytes())
    r = moe("eval", "--ckpt", str(ref_ckpt), "--data", str(tok), "--seq-len", str(S), "--logits",
            str(WORK / "moe_logits.npy"))
    if not check("moe eval --logits", r.returncode == 0, r.stderr[-300:]):
        return
    n_new = 24
    script = r'''
import json, sys, numpy as np, llama_cpp, llama_cpp.llama as L
# llama.cpp's AMX repack of Q8_0 weights crashes on this CPU (also for gguf-py's own Q8_0 files):
# load without the extra buffer types (plain CPU kernels)
orig = L.llama_cpp.llama_model_default_params
def params():
    p = orig(); p.use_extra_bufts = False; return p
L.llama_cpp.llama_model_default_params = params
files, text, n_new = json.loads(sys.argv[1]), sys.argv[2].encode("latin-1"), int(sys.argv[3])
ids = list(text)
out = {}
for typ, path in files.items():
    llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=128, verbose=False,
                          type_k=0, type_v=0)  # an f32 KV cache (the default f16 one rounds K, V)
    res = {"n_vocab": llm.n_vocab(), "tokens": llm.tokenize(text, add_bos=False, special=False)}
    llm.eval(ids)
    res["logits"] = np.array(llm.scores[:len(ids)]).tolist()
    seq = []
    for _ in range(n_new):  # greedy, one token per decode step (the KV-cache path)
        row = np.array(llm.scores[llm.n_tokens - 1, :256])
        t = int(row.argmax()); seq.append(t); llm.eval([t])
    res["greedy"] = seq
    res["greedy_logits"] = np.array(llm.scores[len(ids) - 1:llm.n_tokens - 1]).tolist()
    out[typ] = res
json.dump(out, sys.stdout)
'''
    r = subprocess.run([py, "-c", script, json.dumps({k: str(v) for k, v in files.items()}),
                        text[:S].decode("latin-1"), str(n_new)], capture_output=True, text=True)
    if not check("llama.cpp (llama-cpp-python) loads every exported file", r.returncode == 0,
                 r.stderr[-500:]):
        return
    res = json.loads(r.stdout)
    ref = np.load(WORK / "moe_logits.npy")
    scale = np.abs(ref).max()
    for typ, v in res.items():
        check(f"llama.cpp {typ}: n_vocab 257, tokenizes the text to moe.c's ids (the bytes)",
              v["n_vocab"] == 257 and v["tokens"] == ids, f"{v['n_vocab']}, {v['tokens'][:12]}")
        got = np.array(v["logits"], np.float32)
        rel = np.abs(got[:, :256] - ref).max() / scale
        extra = np.abs(got[:, 256]).max()
        agree = (got[:, :256].argmax(1) == ref.argmax(1)).mean()
        med = np.median(np.abs(got[:, :256] - ref).max(1)) / scale
        line = f"llama.cpp {typ}: logits vs moe eval: max |diff| / max |logit| = {rel:.3g} " \
               f"(median position {med:.2g}), argmax agree {agree:.0%}, extra token's logit {extra:g}"
        if typ == "f32":
            check(line + " (<= 1e-4)", rel <= 1e-4 and extra == 0)
        else:
            print("  info  " + line)
    # the f32 greedy continuation: every token is moe.c's argmax at its position (moe eval over
    # the prompt and the continuation), within the f32 tolerance where two logits nearly tie
    v = res["f32"]
    seq = ids + v["greedy"]
    with open(tok, "wb") as f:
        f.write(b"MOETOK1\0" + struct.pack("<IIQII", 1, 2, len(seq) + 1, 256, 0)
                + np.array(seq + [32], "<u2").tobytes())
    r = moe("eval", "--ckpt", str(ref_ckpt), "--data", str(tok), "--seq-len", str(len(seq)),
            "--logits", str(WORK / "moe_logits2.npy"))
    if not check("moe eval --logits over prompt + continuation", r.returncode == 0, r.stderr[-300:]):
        return
    ref2 = np.load(WORK / "moe_logits2.npy")[S - 1:len(seq) - 1]
    gl = np.array(v["greedy_logits"], np.float32)[:, :256]
    chosen = ref2[np.arange(len(v["greedy"])), v["greedy"]]
    tol = 1e-4 * np.abs(ref2).max()
    check(f"llama.cpp f32: greedy continuation of {n_new} tokens (decoded one at a time) is "
          f"moe.c's argmax at each step; decode logits within 1e-4 "
          f"({bytes(v['greedy'])!r})",
          np.all(chosen >= ref2.max(1) - tol) and np.abs(gl - ref2).max() <= tol,
          f"max |diff| {np.abs(gl - ref2).max():.3g}")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    print("training: default.cfg 10 steps; a tied model with head_dim 24 of d_model 64, d_ff 48")
    main_ckpt = train("run", "train.steps=60")
    tied_ckpt = train("tied", "train.steps=2", "model.d_model=64", "model.head_dim=24",
                      "model.d_ff=48", "model.tie_embeddings=true", "model.n_layers=2",
                      "train.batch_size=2", "train.seq_len=32")
    files = {}
    for label, ckpt in (("run", main_ckpt), ("tied", tied_ckpt)):
        folder = step_folder(ckpt)
        cfg = json.loads((folder / "config.json").read_text())
        st = load_safetensors(folder)
        name = f"{label}/{folder.name}"
        for typ in TYPES:
            out = WORK / f"{label}-{typ}.gguf"
            r = export(ckpt, out, typ)
            if not check(f"export {out.name}", r.returncode == 0 and out.exists(), r.stderr[-300:]):
                continue
            check_file(out, cfg, st, typ, name)
            if label == "run":
                files[typ] = out

    print("refusals")
    topk = train("topk", "train.steps=1", "model.norm_topk_prob=false", "model.n_layers=1")
    refused("mixtral norm_topk_prob=false", topk, "norm_topk_prob")
    qwen = train("qwen", "train.steps=1", "train.grad_accum=1", cfg="configs/qwen3-moe-tiny.cfg")
    refused("qwen3_moe", qwen, 'model_type = "qwen3_moe"')
    hf = WORK / "hf"
    r = moe("export", "--ckpt", str(main_ckpt), "--out", str(hf))
    check("export --format hf (the default) still writes a folder", r.returncode == 0 and (hf / "config.json").exists(),
          r.stderr[-300:])
    for field, value in (("scoring_func", "sigmoid"), ("routed_scaling_factor", 2.0),
                         ("router_bias", True), ("n_group", 2)):
        d = WORK / f"hf-{field}"
        shutil.copytree(hf, d)
        c = json.loads((d / "config.json").read_text())
        c[field] = value
        if field == "n_group":
            c["topk_group"] = 1
        (d / "config.json").write_text(json.dumps(c))
        refused(f"HF folder with {field} = {json.dumps(value)}", d, field)
    d = WORK / "hf-tokenizer"
    shutil.copytree(hf, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["added_tokens"] = [{"id": 255, "content": "<s>", "special": True, "single_word": False,
                           "lstrip": False, "rstrip": False, "normalized": False}]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    refused("HF folder with another tokenizer.json", d, "tokenizer.json")

    print("write failures and the command line")
    full = WORK / "full.gguf"

    def limit():  # a full disk: a 1 MiB file size limit, EFBIG instead of SIGXFSZ
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    r = export(main_ckpt, full, "f32", preexec_fn=limit)
    check("a write that fails mid-file (file size limit): exit 1 naming FILE.tmp, nothing left",
          r.returncode == 1 and f"{full}.tmp: write failed: File too large" in r.stderr
          and not full.exists() and not Path(str(full) + ".tmp").exists(),
          f"rc {r.returncode}, {r.stderr.strip()[-300:]}")
    r = export(main_ckpt, files.get("f32", WORK / "run-f32.gguf"), "f32")
    check("an existing output is refused", r.returncode == 1 and "already exists" in r.stderr, r.stderr[-200:])
    r = export(main_ckpt, WORK / "x.gguf", "q4_0")
    check("--type q4_0: a usage error (exit 2) naming the accepted types",
          r.returncode == 2 and "f32, f16, bf16 or q8_0" in r.stderr, f"rc {r.returncode} {r.stderr[-200:]}")
    r = moe("export", "--ckpt", str(main_ckpt), "--out", str(WORK / "x"), "--type", "f16")
    check("--type without --format gguf: a usage error (exit 2)", r.returncode == 2 and "--dtype" in r.stderr,
          f"rc {r.returncode} {r.stderr[-200:]}")

    print("llama.cpp itself")
    llama_cpp_part(files, main_ckpt)

    if failures:
        print(f"FAILED: {len(failures)} check(s)")
        return 1
    print("all GGUF checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
