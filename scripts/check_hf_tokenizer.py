#!/usr/bin/env python3
"""Real tokenizers end to end, against Hugging Face transformers (docs/checkpoints.md "Tokenizers").

    python3 scripts/check_hf_tokenizer.py --moe build/moe [--workdir DIR]

Re-runs itself under /opt/moe-hf5/bin/python (transformers 5), else /opt/moe-hf/bin/python
(transformers 4.40; scripts/install_hf.sh), or $MOE_HF_PYTHON, when this python cannot import
transformers, tokenizers and torch. Exit 0 when every check passes, 1 when one fails, 77 (CTest's
skip code) when no interpreter has them.

BPE: a byte-level BPE tokenizer (vocabulary ~400, BOS/EOS special tokens, a post-processor
adding BOS) trained by the tokenizers library on text the test writes (no download), saved as an
HF tokenizer folder; `moe prepare --tokenizer` -> token files whose ids are tokenizer.encode of
the text; `moe train` a tiny model a few steps with data.tokenizer (the trainer prepares
data.text itself, the same files); `moe export`; then AutoTokenizer + MixtralForCausalLM greedy
generate of N tokens on a prompt, decoded, equals `moe generate --temperature 0 -n N` on the
export and on the checkpoint.
Byte tokenizer: a tiny byte run exported; AutoTokenizer on the export encodes text to its UTF-8
bytes and back; pipeline("text-generation", model=EXPORT) greedy output equals moe generate's,
byte for byte.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

from check_common import SKIP, CheckError, MoeCommand, Results, python_with, read_token_header  # noqa: E402,F401
PYTHONS = [p for p in (os.environ.get("MOE_HF_PYTHON"), "/opt/moe-hf5/bin/python", "/opt/moe-hf/bin/python") if p]


def _probe():
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoTokenizer, MixtralForCausalLM, pipeline  # noqa: F401


python_with("check_hf_tokenizer", _probe, PYTHONS,
            "transformers/tokenizers/torch (scripts/install_hf.sh) are")

import torch  # noqa: E402
import transformers  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer, MixtralForCausalLM, PreTrainedTokenizerFast, pipeline  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


class Moe(MoeCommand):
    def __init__(self, exe, workdir, timeout):
        # MOE_PYTHON: the python with the tokenizers package
        super().__init__(exe, workdir, timeout, MOE_PYTHON=sys.executable)

    def run(self, *args):
        """stdout, as bytes."""
        return self.run_bytes(*args)[0]

    def generate(self, ckpt, prompt, n):
        out = self.run("generate", "--ckpt", ckpt, "--prompt", prompt, "-n", n, "--temperature", 0)
        if not out.endswith(b"\n"):
            raise CheckError(f"moe generate's output does not end with a newline: {out[-40:]!r}")
        return out[:-1]  # raw bytes: the prompt, then the decoded tokens


# ---- token files (data/token_file.h) ----------------------------------------------------------

def read_tokens(path):
    data, count, vocab, dtype = read_token_header(path)
    fmt = "<%d%s" % (count, "H" if dtype == 2 else "I")
    return list(struct.unpack_from(fmt, data, 32)), vocab, dtype


# ---- text and the tokenizer -------------------------------------------------------------------

WORDS = ("the expert router sends each token to two of four experts and the load balancing loss keeps "
         "them busy while attention mixes positions with rotary embeddings mixture of experts language "
         "model checkpoint safetensors naïve café über straße déjà-vu").split()


def make_text(path, n_bytes, seed):
    import random
    rng = random.Random(seed)
    out, n = [], 0
    while n < n_bytes:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 13))).capitalize() + ".\n"
        out.append(line)
        n += len(line.encode())
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(out))
    return "".join(out)


def train_tokenizer(folder, text, vocab_size):
    """A byte-level BPE like GPT-2's/Mixtral's family, with <s> added in front of every encoding."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text[:6000]], trainer)  # a few KB of it
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                 clean_up_tokenization_spaces=False)
    hf.save_pretrained(folder)
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


TINY_CFG = """\
model = {{ vocab_size = {vocab}; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2; d_ff = 48;
          n_experts = 4; top_k = 2; max_seq_len = 96; rope_theta = 10000.0; }};
train = {{ steps = {steps}; batch_size = 4; seq_len = 32; warmup_steps = 1; eval_interval = 0;
          eval_batches = 1; lr = 3e-3; min_lr = 3e-4; {train} }};
data = {{ dir = "{data}"; text = ["{text}"]; {tokenizer} }};
log = {{ dir = "{run}"; interval = 100; }};
checkpoint = {{ interval = 0; keep = 1; }};
"""


def train_run(moe, wd, name, text_path, vocab, steps, tokenizer=None, init_from=None, data=None):
    data, run = data or os.path.join(wd, name + "_data"), os.path.join(wd, name + "_run")
    cfg = os.path.join(wd, name + ".cfg")
    with open(cfg, "w") as f:
        f.write(TINY_CFG.format(vocab=vocab, steps=steps, data=data, text=text_path, run=run,
                                tokenizer=f'tokenizer = "{tokenizer}";' if tokenizer else "",
                                train=f'init_from = "{init_from}";' if init_from else ""))
    out = moe.run("train", cfg).decode("utf-8", "replace")
    with open(os.path.join(run, "ckpt", "latest")) as f:
        ckpt = os.path.join(run, "ckpt", f.read().strip())
    return data, ckpt, out


def hf_generate(folder, prompt, n):
    """AutoTokenizer + MixtralForCausalLM greedy: the prompt, then the new tokens decoded."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = MixtralForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager") \
        if int(transformers.__version__.split(".")[0]) >= 5 else \
        MixtralForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    model.generation_config.eos_token_id = None  # moe generate never stops early: N tokens each
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False, pad_token_id=tok.eos_token_id if tok.eos_token_id is not None else 0)
    new = out[0, ids.shape[1]:].tolist()
    return prompt + tok.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False), ids[0].tolist(), new


# ---- the checks ---------------------------------------------------------------------------------

def bpe_checks(res, moe, wd, n_new):
    text_path = os.path.join(wd, "corpus.txt")
    text = make_text(text_path, 40000, seed=5)
    tok_dir = os.path.join(wd, "bpe_tokenizer")
    tok = train_tokenizer(tok_dir, text, 400)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    res.check("BPE: tokenizer trained (vocabulary 300-500)", 300 <= vocab <= 500, f"vocabulary {vocab}")

    prep = os.path.join(wd, "prepared")
    moe.run("prepare", "--tokenizer", tok_dir, "--text", text_path, "--out", prep, "--val-fraction", 0.1)
    train, v1, dt = read_tokens(os.path.join(prep, "train.bin"))
    val, v2, _ = read_tokens(os.path.join(prep, "val.bin"))
    want = tok.encode(text + "\n").ids  # each file plus one "\n", the tokenizer's BOS in front
    res.check("BPE prepare: train.bin + val.bin == tokenizer.encode(text)", train + val == want,
              f"{len(train)} + {len(val)} tokens, want {len(want)}; first ids {(train + val)[:6]} vs {want[:6]}")
    res.check("BPE prepare: vocab_size = the tokenizer's, u16", v1 == v2 == vocab and dt == 2,
              f"vocab {v1}/{v2}, dtype {dt}")
    res.check("BPE prepare: split as moe prepare (last floor(0.1 n) tokens to val)",
              len(val) == int(len(want) * 0.1))
    res.check("BPE prepare: the tokenizer's files beside the token files",
              os.path.isfile(os.path.join(prep, "tokenizer.json")))

    data, ckpt, log = train_run(moe, wd, "bpe", text_path, vocab, 20, tokenizer=tok_dir)
    res.check("BPE train: says which tokenizer", f"tokenizer: {tok_dir}" in log)
    same = all(open(os.path.join(data, n), "rb").read() == open(os.path.join(prep, n), "rb").read()
               for n in ("train.bin", "val.bin"))
    res.check("BPE train: the trainer prepared data.text with data.tokenizer, as moe prepare does", same)
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        state = json.load(f)
    res.check("BPE checkpoint: carries the tokenizer, CRC'd",
              "tokenizer.json" in state["crc32"] and "tokenizer_config.json" in state["crc32"] and
              open(os.path.join(ckpt, "tokenizer.json"), "rb").read() == open(os.path.join(tok_dir, "tokenizer.json"), "rb").read())
    res.check("BPE checkpoint: the resolved config records data.tokenizer", f'tokenizer = "{tok_dir}"' in state["config"])

    exp = os.path.join(wd, "bpe_export")
    shutil.rmtree(exp, ignore_errors=True)
    moe.run("export", "--ckpt", ckpt, "--out", exp)
    with open(os.path.join(exp, "generation_config.json")) as f:
        gen = json.load(f)
    with open(os.path.join(exp, "config.json")) as f:
        cfg = json.load(f)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    res.check("BPE export: tokenizer files, generation_config.json with bos/eos",
              os.path.isfile(os.path.join(exp, "tokenizer.json")) and gen.get("bos_token_id") == bos and
              gen.get("eos_token_id") == eos and "pad_token_id" not in gen and
              cfg.get("bos_token_id") == bos and cfg.get("eos_token_id") == eos, f"{gen}")

    # init_from an HF folder with a tokenizer (the export) and no data.tokenizer: its tokenizer
    data2, ckpt2, log = train_run(moe, wd, "init", text_path, vocab, 2, init_from=exp)
    res.check("init_from: the trainer uses the HF folder's tokenizer and says so",
              "train.init_from's" in log and
              open(os.path.join(data2, "train.bin"), "rb").read() == open(os.path.join(prep, "train.bin"), "rb").read() and
              open(os.path.join(ckpt2, "tokenizer.json"), "rb").read() == open(os.path.join(exp, "tokenizer.json"), "rb").read())
    byte_data = os.path.join(wd, "byte_prepared")
    moe.run("prepare", "--text", text_path, "--out", byte_data)
    try:
        train_run(moe, wd, "init_bytes", text_path, vocab, 2, init_from=exp, data=byte_data)
        res.check("init_from: byte-tokenized data.dir refused", False, "it trained")
    except CheckError as e:
        res.check("init_from: byte-tokenized data.dir refused", "byte-tokenized" in str(e), str(e).splitlines()[-1])

    prompt = "The expert router sends"
    want_text, ids, new = hf_generate(exp, prompt, n_new)
    res.check("BPE: AutoTokenizer(export) encodes the prompt like the tokenizer (BOS first)",
              ids == tok.encode(prompt).ids and ids[0] == bos, f"{ids}")
    for name, folder in (("export", exp), ("checkpoint", ckpt)):
        got = moe.generate(folder, prompt, n_new).decode("utf-8")
        res.check(f"BPE: moe generate ({name}) == HF generate + decode, {n_new} tokens", got == want_text,
                  f"\n      moe: {got!r}\n      hf:  {want_text!r}")


def byte_checks(res, moe, wd, n_new):
    text_path = os.path.join(wd, "ascii.txt")
    make_text(text_path, 40000, seed=9)
    with open(text_path, encoding="utf-8") as f:  # ASCII only: greedy bytes stay valid UTF-8
        ascii_text = "".join(c for c in f.read() if ord(c) < 128)
    with open(text_path, "w") as f:
        f.write(ascii_text)
    _, ckpt, _ = train_run(moe, wd, "byte", text_path, 256, 30)
    exp = os.path.join(wd, "byte_export")
    shutil.rmtree(exp, ignore_errors=True)
    moe.run("export", "--ckpt", ckpt, "--out", exp)
    names = sorted(os.listdir(exp))
    res.check("byte export: tokenizer.json, tokenizer_config.json, generation_config.json",
              {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(names), f"{names}")
    tok = AutoTokenizer.from_pretrained(exp)
    s = "héllo \x00\x01\x7f wörld\n\t \"q\" \\ ~"
    ids = tok(s).input_ids
    res.check("byte export: AutoTokenizer encodes text to its UTF-8 bytes (id = byte)", ids == list(s.encode()),
              f"{type(tok).__name__}")
    res.check("byte export: and decodes them back", tok.decode(ids) == s and
              tok.decode(list(range(256))).encode("utf-8", "replace") != b"")

    # the script's walk and split are data/prepare.c's: through the byte tokenizer's files, the
    # same token files as the byte prepare, for folders of this repository
    # (a snapshot: the tree may change while the test runs; symlinks kept as links)
    src, snap = os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.join(wd, "tree")
    shutil.rmtree(snap, ignore_errors=True)
    for name in ("data", "train"):
        shutil.copytree(os.path.join(src, name), os.path.join(snap, name), symlinks=True)
    shutil.copy(os.path.join(src, "README.md"), snap)
    sources = [os.path.join(snap, "data"), os.path.join(snap, "train"), os.path.join(snap, "README.md")]
    a, b = os.path.join(wd, "walk_c"), os.path.join(wd, "walk_py")
    moe.run("prepare", "--text", *sources, "--out", a, "--val-fraction", 0.2)
    moe.run("prepare", "--tokenizer", exp, "--text", *sources, "--out", b, "--val-fraction", 0.2)
    same = all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read()
               for n in ("train.bin", "val.bin"))
    res.check("byte: prepare --tokenizer BYTE_EXPORT == the byte prepare (folders walked alike)", same,
              f"{os.path.getsize(os.path.join(a, 'train.bin'))} vs {os.path.getsize(os.path.join(b, 'train.bin'))} bytes")

    prompt = "The load balancing"
    pipe = pipeline("text-generation", model=exp, device="cpu")
    hf = pipe(prompt, do_sample=False, max_new_tokens=n_new)[0]["generated_text"]
    got = moe.generate(exp, prompt, n_new)
    try:
        got_text = got.decode("utf-8")
        exact = True
    except UnicodeDecodeError:  # bytes >= 128 that are not UTF-8 come out as U+FFFD in HF
        got_text, exact = got.decode("utf-8", "replace"), False
    res.check(f"byte: pipeline('text-generation', model=export) greedy == moe generate, byte for byte "
              f"({n_new} tokens)", exact and got == hf.encode("utf-8"),
              f"\n      moe: {got!r}\n      hf:  {hf.encode('utf-8')!r}" +
              ("" if exact else f" (moe's bytes are not UTF-8; as text they {'match' if got_text == hf else 'differ'})"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moe", required=True, help="path to the moe executable")
    ap.add_argument("--workdir", help="scratch folder (default: a temporary one, removed on success)")
    ap.add_argument("-n", type=int, default=40, help="tokens to generate")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--only", choices=["bpe", "byte"])
    args = ap.parse_args()
    if not os.access(args.moe, os.X_OK):
        ap.error(f"--moe {args.moe}: not an executable")
    torch.set_num_threads(1)
    print(f"check_hf_tokenizer: python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}", flush=True)
    tmp = args.workdir is None
    wd = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="moe_check_tok_"))
    os.makedirs(wd, exist_ok=True)
    res, t0 = Results(), time.time()
    moe = Moe(args.moe, wd, args.timeout)
    if args.only in (None, "bpe"):
        res.attempt("BPE", bpe_checks, res, moe, wd, args.n)
    if args.only in (None, "byte"):
        res.attempt("byte", byte_checks, res, moe, wd, args.n)
    return res.finish("check_hf_tokenizer", t0, wd, tmp)


if __name__ == "__main__":
    sys.exit(main())
