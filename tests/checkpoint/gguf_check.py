#!/usr/bin/env python3
"""`moe export --format gguf` read back by an independent GGUF reader (the `gguf` package),
and run by llama.cpp itself where llama-cpp-python is installed.

  gguf_check.py MOE_BINARY WORKDIR

Trains small models (seconds each) of every family and tokenizer kind moe.c writes:
  - Mixtral (llama.cpp's `llama`): configs/default.cfg 60 steps, untied; a tied one with
    head_dim != d_model / n_heads and d_ff = 48 (not whole Q8_0 blocks); in f32, f16, bf16, q8_0;
  - Qwen3-MoE (`qwen3moe`: q/k norm per head, head_dim 24 of d_model 64, tied), Qwen2-MoE
    (`qwen2moe`: q/k/v biases, a gated shared expert of 48, tied: output.weight written; and
    one without biases: zero biases written), OLMoE (`olmoe`: q/k norm over the projection,
    no top-k renormalisation); in f32 and q8_0;
  - tokenizer.json byte-level BPEs trained here (tokenizers library), one per pre-tokenizer
    llama.cpp has by name: gpt-2 (with a BOS template), llama-bpe (ignore_merges) and qwen2
    (no BOS: the extra token); each model's vocab_size 3 beyond the tokenizer's ([PADn]).
Each file is checked with gguf.GGUFReader:
  - the header (version 3), every metadata key (the exact set, each value and value type: the
    architecture's keys, the tokenizer's tokens, types, merges, BOS/EOS/padding, add_bos),
    every tensor's name, shape (ne) and type, every data offset a multiple of 32;
  - every tensor's values against the checkpoint's safetensors (read with the safetensors
    package), the q/k rows un-permuted from GGML's RoPE pairs back to HF's halves (llama
    only): f32 equal, f16 and bf16 equal to numpy's round-to-nearest-even of the fp32 value,
    q8_0 within half its block's scale of the value (the scale: the smallest fp16 >= max|x| /
    127), and gguf's own dequantizer agreeing with ours; the extra rows zero;
  - refusals, nothing written, a message naming the field: dense layers, norm_topk_prob the
    architecture does not compute, OLMoE with GQA, scoring_func "sigmoid",
    routed_scaling_factor 2, router_bias, n_group 2; tokenizer.json stages llama.cpp does not
    reproduce (a prefix space, a Lowercase normalizer, byte_fallback, WordPiece, a Metaspace
    decoder, ignore_merges without llama-3's pre-tokenizer);
  - a file size limit mid-write (a full disk): exit 1 naming FILE.tmp, neither file left;
    an existing output refused; --type misuse a usage error.
With llama-cpp-python importable ($MOE_LLAMA_PYTHON, else /opt/moe-llama/bin/python), also
llama.cpp itself on every f32 file (and the Mixtral's other types): it loads the file,
tokenizes a text to moe.c's ids (the text is chosen so that each pre-tokenizer gives other
ids), its logits (f32 KV cache) equal `moe eval --logits` within 1e-4 of the largest logit,
and its 32-token greedy continuation (decoded token by token) is moe.c's argmax at every
step; the other types' differences are printed. Exit 77 (skipped) when gguf, numpy or
safetensors is missing (scripts/install_hf5.sh installs gguf into /opt/moe-hf5).
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
    # MOE_PYTHON: this python (with the tokenizers package) runs scripts/hf_tokenizer.py
    env = dict(os.environ, MOE_PYTHON=sys.executable)
    return subprocess.run([MOE, *args], capture_output=True, text=True, cwd=ROOT, env=env, **kw)


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


# model_type -> llama.cpp's architecture: (name, q/k rows permuted to GGML's RoPE pairs,
# output.weight written even when tied, a gated shared expert)
ARCHS = {"mixtral": ("llama", True, False, False), "qwen3_moe": ("qwen3moe", False, False, False),
         "qwen2_moe": ("qwen2moe", False, True, True), "olmoe": ("olmoe", False, True, False)}


def byte_vocab():
    """What the byte tokenizer must be in the file (256 byte symbols + the extra token)."""
    sym = bytes_to_unicode()
    return {"pre": "gpt-2", "tokens": [sym[b] for b in range(256)] + ["<|endoftext|>"],
            "types": [1] * 256 + [3], "merges": [], "bos": EXTRA, "eos": EXTRA, "pad": None,
            "add_bos": False, "add_eos": False, "extra": EXTRA}


def bpe_vocab(folder, V, pre):
    """What a tokenizer.json BPE must be in the file, from the tokenizers library and the JSON."""
    from tokenizers import Tokenizer
    tj = json.loads((folder / "tokenizer.json").read_text())
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    by_id = {i: t for t, i in Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True).items()}
    added = {t["id"]: t for t in tj["added_tokens"]}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(V)]
    types = [(3 if added[i]["special"] else 4) if i in added else 1 if i in by_id else 5 for i in range(V)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    bos, eos = ids.get(tc.get("bos_token")), ids.get(tc.get("eos_token"))
    single = tj["post_processor"]["single"] if tj.get("post_processor") else []
    add_bos = bool(single) and "SpecialToken" in single[0]
    add_eos = bool(single) and "SpecialToken" in single[-1]
    if add_bos:
        bos = ids[single[0]["SpecialToken"]["id"]]
    v = {"pre": pre, "tokens": tokens, "types": types, "merges": merges, "bos": bos, "eos": eos,
         "pad": ids.get(tc.get("pad_token")), "add_bos": add_bos, "add_eos": add_eos, "extra": None}
    if bos is None or eos is None:
        v["extra"] = V
        v["tokens"], v["types"] = tokens + ["<|endoftext|>"], types + [3]
        v["bos"] = V if bos is None else bos
        v["eos"] = V if eos is None else eos
    return v


def expected_keys(cfg, name, type_name, vocab):
    arch, _, _, shared = ARCHS[cfg["model_type"]]
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or d // H
    ff = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    T = gguf.GGUFValueType
    keys = {
        "general.architecture": (T.STRING, arch),
        "general.name": (T.STRING, name),
        "general.file_type": (T.UINT32, TYPES[type_name][1]),
        "general.quantization_version": (T.UINT32, 2),
        "general.alignment": (T.UINT32, 32),
        "vocab_size": (T.UINT32, len(vocab["tokens"])),
        "context_length": (T.UINT32, cfg["max_position_embeddings"]),
        "embedding_length": (T.UINT32, d),
        "block_count": (T.UINT32, cfg["num_hidden_layers"]),
        "feed_forward_length": (T.UINT32, ff),
        "attention.head_count": (T.UINT32, H),
        "attention.head_count_kv": (T.UINT32, cfg["num_key_value_heads"]),
        "rope.dimension_count": (T.UINT32, hd),
        "rope.freq_base": (T.FLOAT32, float(np.float32(cfg["rope_theta"]))),
        "attention.layer_norm_rms_epsilon": (T.FLOAT32, float(np.float32(cfg["rms_norm_eps"]))),
        "expert_count": (T.UINT32, cfg.get("num_local_experts") or cfg["num_experts"]),
        "expert_used_count": (T.UINT32, cfg["num_experts_per_tok"]),
    }
    if arch in ("qwen3moe", "qwen2moe"):
        keys["expert_feed_forward_length"] = (T.UINT32, ff)
    if shared:
        keys["expert_shared_feed_forward_length"] = (T.UINT32, cfg["shared_expert_intermediate_size"])
    if hd * H != d:
        keys["attention.key_length"] = (T.UINT32, hd)
        keys["attention.value_length"] = (T.UINT32, hd)
    keys = {(k if k.startswith("general.") else f"{arch}.{k}"): v for k, v in keys.items()}
    keys.update({
        "tokenizer.ggml.model": (T.STRING, "gpt2"),
        "tokenizer.ggml.pre": (T.STRING, vocab["pre"]),
        "tokenizer.ggml.tokens": (T.ARRAY, vocab["tokens"]),
        "tokenizer.ggml.token_type": (T.ARRAY, vocab["types"]),
        "tokenizer.ggml.merges": (T.ARRAY, vocab["merges"]),
        "tokenizer.ggml.bos_token_id": (T.UINT32, vocab["bos"]),
        "tokenizer.ggml.eos_token_id": (T.UINT32, vocab["eos"]),
        "tokenizer.ggml.add_bos_token": (T.BOOL, vocab["add_bos"]),
        "tokenizer.ggml.add_eos_token": (T.BOOL, vocab["add_eos"]),
    })
    if vocab["pad"] is not None:
        keys["tokenizer.ggml.padding_token_id"] = (T.UINT32, vocab["pad"])
    if vocab["extra"] is not None:
        keys["tokenizer.ggml.suppress_tokens"] = (T.ARRAY, [vocab["extra"]])
    return keys


def unpermute(w, heads):
    # GGUF row 2i + j of a head is HF row j * hd/2 + i (llama.cpp's converter's permute)
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(cfg, st, type_name, extra_rows):
    """name -> (HF-layout reference in GGUF's numpy shape (ne reversed), ggml type, q/k heads)."""
    arch, permuted, output_needed, shared = ARCHS[cfg["model_type"]]
    L, E = cfg["num_hidden_layers"], cfg.get("num_local_experts") or cfg["num_experts"]
    want = TYPES[type_name][0]

    def typ(ref, router=False):
        if ref.ndim == 1 or router:
            return gguf.GGMLQuantizationType.F32
        if want == gguf.GGMLQuantizationType.Q8_0 and ref.shape[-1] % 32:
            return gguf.GGMLQuantizationType.F16  # the converter's fallback
        return want

    def pad(w):
        return np.concatenate([w, np.zeros((extra_rows, w.shape[1]), np.float32)])

    out = {}

    def add(name, ref, router=False, heads=0):
        out[name] = (ref, typ(ref, router), heads if permuted else 0)

    add("token_embd.weight", pad(st["model.embed_tokens.weight"]))
    moe, ex = ("block_sparse_moe", ("w1", "w2", "w3")) if arch == "llama" else ("mlp", ("gate_proj", "down_proj", "up_proj"))
    for l in range(L):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        add(f"blk.{l}.attn_norm.weight", st[p + "input_layernorm.weight"])
        add(f"blk.{l}.attn_q.weight", st[a + "q_proj.weight"], heads=cfg["num_attention_heads"])
        add(f"blk.{l}.attn_k.weight", st[a + "k_proj.weight"], heads=cfg["num_key_value_heads"])
        add(f"blk.{l}.attn_v.weight", st[a + "v_proj.weight"])
        add(f"blk.{l}.attn_output.weight", st[a + "o_proj.weight"])
        if arch == "qwen2moe":  # biases, zeros when the model has none
            for x in "qkv":
                add(f"blk.{l}.attn_{x}.bias", st.get(a + f"{x}_proj.bias", np.zeros(st[a + f"{x}_proj.weight"].shape[0], np.float32)))
        if arch in ("qwen3moe", "olmoe"):
            add(f"blk.{l}.attn_q_norm.weight", st[a + "q_norm.weight"])
            add(f"blk.{l}.attn_k_norm.weight", st[a + "k_norm.weight"])
        add(f"blk.{l}.ffn_norm.weight", st[p + "post_attention_layernorm.weight"])
        add(f"blk.{l}.ffn_gate_inp.weight", st[p + moe + ".gate.weight"], router=True)
        for g, w in zip(("gate", "down", "up"), ex):
            add(f"blk.{l}.ffn_{g}_exps.weight",
                np.stack([st[f"{p}{moe}.experts.{e}.{w}.weight"] for e in range(E)]))
        if shared:
            add(f"blk.{l}.ffn_gate_inp_shexp.weight", st[p + "mlp.shared_expert_gate.weight"].reshape(-1))
            for g in ("gate", "down", "up"):
                add(f"blk.{l}.ffn_{g}_shexp.weight", st[f"{p}mlp.shared_expert.{g}_proj.weight"])
    add("output_norm.weight", st["model.norm.weight"])
    if not cfg["tie_word_embeddings"]:
        add("output.weight", pad(st["lm_head.weight"]))
    elif output_needed:
        add("output.weight", pad(st["model.embed_tokens.weight"]))
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


def check_file(path, cfg, st, type_name, name, vocab):
    label = f"{path.name}"
    r = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    check(f"{label}: GGUF version 3", field_value(r.fields["GGUF.version"]) == 3)
    want = expected_keys(cfg, name, type_name, vocab)
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
    exp = expected_tensors(cfg, st, type_name, len(vocab["tokens"]) - cfg["vocab_size"])
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


LLAMA_SCRIPT = r'''
import json, sys, numpy as np, llama_cpp, llama_cpp.llama as L
# llama.cpp's AMX repack of Q8_0 weights crashes on this CPU (also for gguf-py's own Q8_0 files):
# load without the extra buffer types (plain CPU kernels)
orig = L.llama_cpp.llama_model_default_params
def params():
    p = orig(); p.use_extra_bufts = False; return p
L.llama_cpp.llama_model_default_params = params
out = {}
for job in json.loads(sys.stdin.read()):
    llm = llama_cpp.Llama(model_path=job["path"], logits_all=True, n_ctx=160, verbose=False,
                          type_k=0, type_v=0)  # an f32 KV cache (the default f16 one rounds K, V)
    ids, V = job["ids"], job["V"]
    res = {"n_vocab": llm.n_vocab(),
           "tokens": llm.tokenize(job["text"].encode(), add_bos=job["add_bos"], special=False)}
    llm.eval(ids)
    res["logits"] = np.array(llm.scores[:len(ids)]).tolist()
    seq = []
    for _ in range(job["n_new"]):  # greedy, one token per decode step (the KV-cache path)
        t = int(np.array(llm.scores[llm.n_tokens - 1, :V]).argmax()); seq.append(t); llm.eval([t])
    res["greedy"] = seq
    res["greedy_logits"] = np.array(llm.scores[len(ids) - 1:llm.n_tokens - 1]).tolist()
    out[job["label"]] = res
json.dump(out, sys.stdout)
'''


def llama_python():
    py = os.environ.get("MOE_LLAMA_PYTHON", "/opt/moe-llama/bin/python")
    if Path(py).exists() and subprocess.run([py, "-c", "import llama_cpp, numpy"], capture_output=True).returncode == 0:
        return py
    return None


def token_file(path, ids, V):
    with open(path, "wb") as f:
        f.write(b"MOETOK1\0" + struct.pack("<IIQII", 1, 2, len(ids), V, 0) + np.array(ids, "<u2").tobytes())


def moe_logits(ckpt, ids, label, V):
    """moe eval --logits over ids (the last id is only a target): [len(ids) - 1, V]."""
    tok, out = WORK / f"{label}_tokens.bin", WORK / f"{label}_logits.npy"
    token_file(tok, ids, V)
    r = moe("eval", "--ckpt", str(ckpt), "--data", str(tok), "--seq-len", str(len(ids) - 1), "--logits", str(out))
    if not check(f"{label}: moe eval --logits", r.returncode == 0, r.stderr[-300:]):
        return None
    return np.load(out)


def llama_cpp_part(models):
    """models: label -> (ckpt, {type: file}, text, ids (moe.c's encoding of text), V, add_bos).
    Every file loads; llama.cpp tokenizes text to ids; the f32 file's logits are moe.c's within
    1e-4 of the largest logit (f16, bf16, q8_0: TYPE_BOUND) and its 32-token greedy
    continuation is moe.c's argmax at each step."""
    py = llama_python()
    if not py:
        print("  skip  llama.cpp itself: no llama_cpp in $MOE_LLAMA_PYTHON or /opt/moe-llama")
        return
    n_new = 32
    # f32: every position's difference; the others: the median position's (their worst
    # position is printed: it moved between trainings, bf16 1.1e-3 to 2.0e-2, q8_0 2.5e-3 to
    # 0.25), all relative to the largest logit, and argmax agreement
    TYPE_BOUND = {"f16": 1e-3, "bf16": 5e-3, "q8_0": 1e-2}
    jobs = [{"label": f"{m}/{typ}", "path": str(path), "ids": ids, "V": V, "text": text, "add_bos": add_bos,
             "n_new": n_new if typ == "f32" else 0}
            for m, (ckpt, files, text, ids, V, add_bos) in models.items() for typ, path in files.items()]
    r = subprocess.run([py, "-c", LLAMA_SCRIPT], input=json.dumps(jobs), capture_output=True, text=True)
    if not check(f"llama.cpp (llama-cpp-python) loads every exported file ({len(jobs)})", r.returncode == 0,
                 r.stderr[-800:]):
        return
    res = json.loads(r.stdout)
    for m, (ckpt, files, text, ids, V, add_bos) in models.items():
        ref = moe_logits(ckpt, ids + [ids[-1]], m, V)
        if ref is None:
            continue
        scale = np.abs(ref).max()
        for typ in files:
            v = res[f"{m}/{typ}"]
            n_file = v["n_vocab"]
            check(f"llama.cpp {m} {typ}: tokenizes the text to moe.c's ids", v["tokens"] == ids,
                  f"{v['tokens'][:12]} vs {ids[:12]}")
            got = np.array(v["logits"], np.float32)
            rel = np.abs(got[:, :V] - ref).max() / scale
            extra = np.abs(got[:, V:]).max() if n_file > V else 0.0
            agree = (got[:, :V].argmax(1) == ref.argmax(1)).mean()
            med = np.median(np.abs(got[:, :V] - ref).max(1)) / scale
            line = f"llama.cpp {m} {typ}: logits vs moe eval: max |diff| / max |logit| = {rel:.3g} " \
                   f"(median position {med:.2g}), argmax agree {agree:.0%}, extra token's logit {extra:g}"
            # f32: moe.c's arithmetic; the others: the weights' rounding (f16 2^-11, bf16 2^-8
            # relative; q8_0 a 1/127 step per block of 32, and llama.cpp quantizes the
            # activations to 8 bits too) carried to the logits, with a margin (measured median
            # positions: f16 7.9e-5-8.2e-5, bf16 6.4e-4-7e-4, q8_0 1.6e-3-2.0e-3)
            if typ == "f32":
                check(line + " (<= 1e-4)", rel <= 1e-4 and extra == 0)
            else:
                check(line + " (median <= %g, argmax agree >= 90%%)" % TYPE_BOUND[typ],
                      med <= TYPE_BOUND[typ] and agree >= 0.9 and extra == 0)
        # the f32 greedy continuation: every token is moe.c's argmax at its position (moe eval
        # over the prompt and the continuation), within the f32 tolerance where two logits tie
        v = res[f"{m}/f32"]
        seq = ids + v["greedy"]
        ref2 = moe_logits(ckpt, seq + [seq[-1]], m + "_greedy", V)
        if ref2 is None:
            continue
        ref2 = ref2[len(ids) - 1:len(seq) - 1]
        gl = np.array(v["greedy_logits"], np.float32)[:, :V]
        chosen = ref2[np.arange(n_new), v["greedy"]]
        tol = 1e-4 * np.abs(ref2).max()
        check(f"llama.cpp {m} f32: greedy continuation of {n_new} tokens (decoded one at a time) is "
              f"moe.c's argmax at each step; decode logits within 1e-4",
              np.all(chosen >= ref2.max(1) - tol) and np.abs(gl - ref2).max() <= tol,
              f"max |diff| {np.abs(gl - ref2).max():.3g}")
        # the same text as moe generate --temperature 0 (its own prompt encoding and decode)
        if V == 256:
            want = text.encode() + bytes(v["greedy"])
        else:
            from tokenizers import Tokenizer
            tj = step_folder(ckpt) / "tokenizer.json"
            want = text.encode() + Tokenizer.from_file(str(tj)).decode(v["greedy"], skip_special_tokens=True).encode()
        g = subprocess.run([MOE, "generate", "--ckpt", str(ckpt), "--prompt", text, "-n", str(n_new),
                            "--temperature", "0"], capture_output=True, cwd=ROOT,
                           env=dict(os.environ, MOE_PYTHON=sys.executable))
        check(f"llama.cpp {m} f32: its greedy text is moe generate --temperature 0's ({want[-24:]!r})",
              g.returncode == 0 and g.stdout.rstrip(b"\n") == want, f"{g.stdout[-60:]!r}")


TEXT = "The MoE layer's router doesn't route 12345 tokens in 2025;\n\n\tit's 1,234,567 of them.  DON'T stop; they'LL go?  100% ok"
LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def pre_tokenizer(pre):
    from tokenizers import Regex, pre_tokenizers
    if pre == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE if pre == "llama-bpe" else QWEN2_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def tokenizer_corpus():
    """A fixed text (not the repository's files, which change): seeded sentences of words,
    contractions and numbers, and TEXT itself, so that GPT-2-style merges span the other
    pre-tokenizers' splits of TEXT."""
    import random
    rng = random.Random(5)
    words = ("the router expert token layer it's don't they'll we've 2025 12345 1,234,567 100% "
             "ok go stop DON'T they'LL of in to  \t \n\n").split(" ")
    soup = " ".join(rng.choice(words) for _ in range(6000))
    return soup + ("\n" + TEXT) * 20


def make_tokenizer(folder, pre, bos):
    """A byte-level BPE trained here (no download) with GPT-2's pre-tokenizer, then given
    llama.cpp's pre-tokenizer `pre` (so that its merges span the other pre-tokenizers' splits
    and the three tokenize TEXT differently); with bos, <s> in front of every encoding
    (TemplateProcessing), else no BOS at all."""
    from tokenizers import Tokenizer, decoders, models, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    tok.pre_tokenizer = pre_tokenizer("gpt-2")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizer("gpt-2").alphabet(), show_progress=False)
    tok.train_from_iterator([tokenizer_corpus()], trainer)
    tok.pre_tokenizer = pre_tokenizer(pre)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>" if bos else None, eos_token="</s>",
                            clean_up_tokenization_spaces=False).save_pretrained(folder)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def other_pre_ids(tok, pre):
    """TEXT's ids under each of the other two pre-tokenizers."""
    from tokenizers import Tokenizer
    out = []
    for other in ("gpt-2", "llama-bpe", "qwen2"):
        if other != pre:
            t = Tokenizer.from_str(tok.to_str())
            t.pre_tokenizer = pre_tokenizer(other)
            out.append(t.encode(TEXT).ids)
    return out


SMALL = ["train.steps=60", "model.n_layers=2", "model.d_model=64", "model.d_ff=64", "model.n_experts=4",
         "train.batch_size=2", "train.seq_len=32"]


def family_runs():
    """name -> (train --set arguments): the other families, each as llama.cpp computes it."""
    small = SMALL
    return {
        "qwen3": small + ['model.family="qwen3_moe"', 'model.qk_norm="head"', "model.head_dim=24",
                          "model.tie_embeddings=true"],
        "qwen2": small + ['model.family="qwen2_moe"', "model.qkv_bias=true", "model.shared_d_ff=48",
                          "model.shared_gate=true", "model.norm_topk_prob=false", "model.tie_embeddings=true"],
        "qwen2-nobias": small + ['model.family="qwen2_moe"', "model.shared_d_ff=32", "model.shared_gate=true",
                                 "model.norm_topk_prob=false", "model.n_layers=1"],
        "olmoe": small + ['model.family="olmoe"', 'model.qk_norm="full"', "model.norm_topk_prob=false",
                          "model.n_kv_heads=4"],
    }


def export_and_read(label, ckpt, types, vocab_of):
    """Exports ckpt as each type and checks the file; {type: path} of those written."""
    folder = step_folder(ckpt) if ckpt.name == "latest" else ckpt
    cfg = json.loads((folder / "config.json").read_text())
    st = load_safetensors(folder)
    vocab = vocab_of(folder, cfg)
    files = {}
    for typ in types:
        out = WORK / f"{label}-{typ}.gguf"
        r = export(ckpt, out, typ)
        if check(f"export {out.name}", r.returncode == 0 and out.exists(), r.stderr[-300:]):
            check_file(out, cfg, st, typ, f"{label}/{folder.name}", vocab)
            files[typ] = out
    return files


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    byte = (lambda folder, cfg: byte_vocab())
    S = 48
    byte_ids = list(TEXT.encode()[:S])
    llama_models = {}
    print("Mixtral (llama): default.cfg 60 steps; a tied model with head_dim 24 of d_model 64, d_ff 48")
    main_ckpt = train("run", "train.steps=60")
    tied_ckpt = train("tied", "train.steps=2", "model.d_model=64", "model.head_dim=24",
                      "model.d_ff=48", "model.tie_embeddings=true", "model.n_layers=2",
                      "train.batch_size=2", "train.seq_len=32")
    files = export_and_read("run", main_ckpt, TYPES, byte)
    llama_models["mixtral"] = (main_ckpt, files, TEXT.encode()[:S].decode(), byte_ids, 256, False)
    export_and_read("tied", tied_ckpt, TYPES, byte)

    print("Qwen3-MoE (qwen3moe), Qwen2-MoE (qwen2moe), OLMoE (olmoe)")
    for name, sets in family_runs().items():
        ckpt = train(name, *sets)
        fam = export_and_read(name, ckpt, ("f32", "q8_0"), byte)
        llama_models[name] = (ckpt, {"f32": fam["f32"]} if "f32" in fam else {}, TEXT.encode()[:S].decode(),
                              byte_ids, 256, False)

    print("tokenizer.json byte-level BPE (gpt-2 with BOS; llama-bpe and qwen2 without BOS)")
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
        have_tok = True
    except ImportError as e:
        print(f"  skip  tokenizer.json models: {e}")
        have_tok = False
    for pre, bos in (("gpt-2", True), ("llama-bpe", False), ("qwen2", False)) if have_tok else ():
        tdir = WORK / f"tok-{pre}"
        tok = make_tokenizer(tdir, pre, bos)
        V = tok.get_vocab_size() + 3  # 3 ids the tokenizer leaves out: [PADn] in the file
        ckpt = train(f"bpe-{pre}", "train.steps=60", f"model.vocab_size={V}", "model.n_layers=1",
                     "model.d_model=64", "model.d_ff=64", "model.n_experts=4", "train.batch_size=2",
                     "train.seq_len=32", f'data.tokenizer="{tdir}"', f'data.dir="{WORK / ("data-" + pre)}"')
        fam = export_and_read(f"bpe-{pre}", ckpt, ("f32",), lambda folder, cfg, pre=pre: bpe_vocab(folder, cfg["vocab_size"], pre))
        ids = tok.encode(TEXT).ids
        check(f"bpe-{pre}: the test text ({len(ids)} tokens of {len(TEXT)} bytes) has other ids under the "
              "other two pre-tokenizers (a wrong tokenizer.ggml.pre would show)",
              len(ids) < len(TEXT) * 0.8 and all(o != ids for o in other_pre_ids(tok, pre)))
        llama_models[f"bpe-{pre}"] = (ckpt, fam, TEXT, ids, V, bos)

    print("refusals")
    topk = train("topk", "train.steps=1", "model.norm_topk_prob=false", "model.n_layers=1")
    refused("mixtral norm_topk_prob=false", topk, "norm_topk_prob")
    qwen = train("qwen", "train.steps=1", "train.grad_accum=1", cfg="configs/qwen3-moe-tiny.cfg")
    refused("qwen3_moe with a dense layer (configs/qwen3-moe-tiny.cfg)", qwen, "mlp_only_layers")
    small = SMALL + ["train.steps=1", "model.n_layers=1"]
    for label, sets, field in (
            ("qwen3_moe norm_topk_prob=false", ['model.family="qwen3_moe"', 'model.qk_norm="head"',
                                                "model.norm_topk_prob=false"], "norm_topk_prob"),
            ("qwen2_moe norm_topk_prob=true", ['model.family="qwen2_moe"', "model.shared_d_ff=32",
                                               "model.shared_gate=true"], "norm_topk_prob"),
            ("olmoe with GQA", ['model.family="olmoe"', 'model.qk_norm="full"', "model.norm_topk_prob=false",
                                "model.n_kv_heads=2"], "num_key_value_heads")):
        refused(label, train("r-" + label.split()[0] + str(len(field)), *(small + sets)), field)
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
    if have_tok:  # tokenizer.json stages llama.cpp does not reproduce, each refused by name
        bpe_hf = WORK / "hf-bpe"
        r = moe("export", "--ckpt", str(llama_models["bpe-gpt-2"][0]), "--out", str(bpe_hf))
        check("export the gpt-2 BPE model as an HF folder", r.returncode == 0, r.stderr[-300:])
        edits = {
            "pre_tokenizer": lambda t: t["pre_tokenizer"].update(add_prefix_space=True),
            "normalizer": lambda t: t.update(normalizer={"type": "Lowercase"}),
            "model.byte_fallback": lambda t: t["model"].update(byte_fallback=True),
            "model.type": lambda t: t["model"].update(type="WordPiece"),
            "decoder": lambda t: t.update(decoder={"type": "Metaspace", "replacement": "_"}),
            "model.ignore_merges": lambda t: t["model"].update(ignore_merges=True),
        }
        for field, edit in edits.items():
            d = WORK / f"hf-tok-{field}"
            shutil.copytree(bpe_hf, d)
            tj = json.loads((d / "tokenizer.json").read_text())
            edit(tj)
            (d / "tokenizer.json").write_text(json.dumps(tj))
            refused(f"tokenizer.json with another {field}", d, f"tokenizer.json: {field}")
    d = WORK / "hf-tokenizer"
    shutil.copytree(hf, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["added_tokens"] = [{"id": 255, "content": "<s>", "special": True, "single_word": False,
                           "lstrip": False, "rstrip": False, "normalized": False}]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    refused("the byte tokenizer's tokenizer.json with an added token (its pre-tokenizer has no regex)", d,
            "tokenizer.json: pre_tokenizer")

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
    llama_cpp_part(llama_models)

    if failures:
        print(f"FAILED: {len(failures)} check(s)")
        return 1
    print("all GGUF checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
