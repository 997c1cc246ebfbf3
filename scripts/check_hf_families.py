#!/usr/bin/env python3
"""The Hugging Face families, both ways, against transformers itself (DESIGN.md §2.1):
MixtralForCausalLM (scripts/check_hf.py checks its formats and dtypes at length),
Qwen3MoeForCausalLM (q/k norm per head, head_dim of its own, dense layers),
Qwen2MoeForCausalLM (q/k/v biases, a gated shared expert, decoder_sparse_step) and
OlmoeForCausalLM (q/k norm over the whole projections).

    python3 scripts/check_hf_families.py --moe build/moe [--workdir DIR] [--family qwen3_moe]

(re-runs itself under the transformers 5 venv, scripts/install_hf5.sh; exit 77 without it.)

Reverse (HF -> moe): a seeded random model of each family with every part on (norms and
biases random too), save_pretrained, `moe eval --logits` on a token file; its logits against
the class's own forward in fp32.
Forward (moe -> HF): `moe train` a tiny model of the family for a few steps (its config keys:
model.family and the family's options), its checkpoint folder and its `moe export` loaded by
from_pretrained with every tensor accounted for; HF's logits against `moe eval --logits`.
Fine-tune: a config with no model keys and train.init_from the HF folder trains the folder's
model; a model key that disagrees with it is refused naming both values.
Gradients: one SGD step of a large lr from a random folder gives moe's gradient of every tensor,
against the HF class's in float64 (<= 1e-5 each).
Training: 20 AdamW steps from a random folder in moe and in PyTorch (float32 and float64) on
the same batch; moe's losses no further from float64's than PyTorch's float32 ones (3x).
Every logits comparison is ||a - b|| / ||b|| over the [seq_len, vocab] logits.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("MOE_HF_PYTHON", os.environ.get("MOE_HF5_PYTHON", "/opt/moe-hf5/bin/python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_hf as ch  # noqa: E402  (re-execs under MOE_HF_PYTHON or exits 77 without transformers)
from check_hf import CheckError, Moe, Results, compare, write_tokens  # noqa: E402

np, torch, transformers = ch.np, ch.torch, ch.transformers
V5 = int(transformers.__version__.split(".")[0]) >= 5


def load_kwargs():
    """from_pretrained in float32 with the plain (eager) attention and experts: the float64 run
    needs eager experts (transformers 5's grouped_mm takes no double); 4.x names dtype torch_dtype."""
    kw = dict(attn_implementation="eager")
    kw.update(dict(dtype=torch.float32, experts_implementation="eager") if V5 else dict(torch_dtype=torch.float32))
    return kw

# family: (HF class names, the HF config of the reverse check, the moe config keys of the forward)
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(head_dim=12, intermediate_size=40, moe_intermediate_size=24, num_experts=4,
                       num_hidden_layers=3, mlp_only_layers=[0], norm_topk_prob=True),
                  ["model.family=\"qwen3_moe\"", "model.qk_norm=\"head\"", "model.head_dim=12",
                   "model.first_k_dense=1", "model.dense_d_ff=40", "model.n_layers=3",
                   "model.norm_topk_prob=true"]),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=40, moe_intermediate_size=24, num_experts=4,
                       shared_expert_intermediate_size=20, decoder_sparse_step=2, num_hidden_layers=4,
                       norm_topk_prob=False),
                  ["model.family=\"qwen2_moe\"", "model.qkv_bias=true", "model.shared_d_ff=20",
                   "model.shared_gate=true", "model.sparse_step=2", "model.dense_d_ff=40",
                   "model.n_layers=4", "model.norm_topk_prob=false"]),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(intermediate_size=24, num_local_experts=4),
                ["model.family=\"mixtral\""]),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(intermediate_size=24, num_experts=4, norm_topk_prob=False),
              ["model.family=\"olmoe\"", "model.qk_norm=\"full\"", "model.norm_topk_prob=false"]),
}


def hf_classes(family):
    cfg_name, cls_name, _, _ = FAMILIES[family]
    return getattr(transformers, cfg_name), getattr(transformers, cls_name)


def random_model(family, seed):
    Config, Model = hf_classes(family)
    kw = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64,
              rope_theta=10000.0, tie_word_embeddings=False, rms_norm_eps=1e-5, initializer_range=0.1,
              # no padding_idx: HF's nn.Embedding would freeze the pad token's row in training
              # (OLMoE's default pad_token_id is 1), which moe.c does not (docs/checkpoints.md)
              pad_token_id=None)
    kw.update(FAMILIES[family][2])
    torch.manual_seed(seed)
    model = Model(Config(**kw))
    with torch.no_grad():  # norms and biases away from 1 and 0, so a misread one shows
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif n.endswith(".bias"):
                p.normal_(0, 0.1)
    return model.eval()


def hf_load(family, folder, res, name):
    """AutoModelForCausalLM.from_pretrained in fp32: the family's class, every tensor from the folder."""
    _, Model = hf_classes(family)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True,
                                                                    **load_kwargs())
    res.check(f"{name}: AutoModelForCausalLM gives {Model.__name__}", type(model) is Model,
              type(model).__name__)
    bad = {k: [str(x) for x in v][:6] for k, v in info.items() if v}
    res.check(f"{name}: HF loads every tensor of the folder", not bad, str(bad) if bad else "")
    if bad:
        raise CheckError(f"{folder}: HF loading info {bad}")
    return model.eval()


def reverse(res, moe, wd, family, S, tol):
    model = random_model(family, seed=11)
    folder = os.path.join(wd, f"hf_{family}")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    model.save_pretrained(folder, safe_serialization=True)
    rng = np.random.default_rng(5)
    toks = rng.integers(0, 256, size=4 * S)
    data = os.path.join(wd, f"{family}_tokens.bin")
    write_tokens(data, toks, 256)
    got, _, _, _ = moe.eval(folder, data, S, os.path.join(wd, f"{family}_reverse.npy"))
    want = ch.hf_logits(model, toks[:S])
    compare(res, f"{family}: HF save_pretrained -> moe eval logits", got[:S] if got.ndim == 2 else got[0], want, tol)
    fine_tune(res, moe, wd, family, folder, S)


def fine_tune(res, moe, wd, family, folder, S):
    """train.init_from an HF folder with no model key in the config: the model is the folder's;
    a model key that disagrees with it is refused naming both values."""
    text = os.path.join(wd, "text.txt")
    ch.make_text(text)
    cfg = os.path.join(wd, "finetune.cfg")
    with open(cfg, "w") as f:
        f.write(f'train = {{ init_from = "{folder}"; steps = 2; warmup_steps = 0; batch_size = 2; '
                f'seq_len = {S}; eval_batches = 1; }};\n'
                f'model = {{ max_seq_len = {S}; }};\n'
                f'data = {{ dir = "{os.path.join(wd, "ft_data")}"; text = ["{text}"]; }};\n'
                f'log = {{ dir = "{os.path.join(wd, "ft_" + family)}"; }};\n')
    out = moe.run("train", cfg, "--overwrite")
    resolved = open(os.path.join(wd, "ft_" + family, "config.cfg")).read()
    res.check(f"{family}: train.init_from an HF folder with no model keys trains it",
              f'family = "{family}"' in resolved and "initialised from" in out)
    try:
        moe.run("train", cfg, "--overwrite", "--set", "model.n_layers=7")
        res.check(f"{family}: a model key that disagrees with the folder is refused", False, "exit 0")
    except CheckError as e:
        res.check(f"{family}: a model key that disagrees with the folder is refused",
                  "model.n_layers: 7, but train.init_from" in str(e), str(e).splitlines()[-1][:200])


def forward(res, moe, wd, family, S, tol, steps):
    text = os.path.join(wd, "text.txt")
    ch.make_text(text)
    run = os.path.join(wd, f"run_{family}")
    sets = ["model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=24",
            "model.n_experts=4", "model.top_k=2", f"model.max_seq_len={S}", "model.capacity_factor=0",
            f"train.seq_len={S}", "train.batch_size=2", f"train.steps={steps}", "train.warmup_steps=0",
            "train.eval_batches=1", f"train.eval_interval={steps}", f"checkpoint.interval={steps}",
            f"log.dir=\"{run}\"", f"data.dir=\"{os.path.join(wd, 'data')}\"",
            f"data.text=[\"{text}\"]"] + FAMILIES[family][3]
    args = ["train", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "default.cfg")]
    for s in sets:
        args += ["--set", s]
    moe.run(*args)
    with open(os.path.join(run, "ckpt", "latest")) as f:  # the name of the latest step's folder
        ckpt = os.path.join(run, "ckpt", f.read().strip())
    data = os.path.join(wd, "data", "val.bin")
    got, _, _, _ = moe.eval(ckpt, data, S, os.path.join(wd, f"{family}_forward.npy"))
    toks, _ = ch.read_tokens(data)
    model = hf_load(family, ckpt, res, f"{family}: moe train -> HF")
    want = ch.hf_logits(model, toks[:S])
    compare(res, f"{family}: moe train -> from_pretrained logits", got[:S] if got.ndim == 2 else got[0], want, tol)
    out = os.path.join(wd, f"export_{family}")
    if os.path.exists(out):
        shutil.rmtree(out)
    moe.run("export", "--ckpt", ckpt, "--out", out)
    exported = hf_load(family, out, res, f"{family}: moe export -> HF")
    compare(res, f"{family}: moe export -> from_pretrained logits", got[:S] if got.ndim == 2 else got[0],
            ch.hf_logits(exported, toks[:S]), tol)


def torch_train(model, dtype, batches, steps, lr, wd):
    """The same run as moe's in PyTorch: AdamW (betas 0.9, 0.95, eps 1e-8; weight decay on every
    tensor but norms and biases, as moe.c), constant lr, no clipping, CE only; the losses."""
    model = model.to(dtype).train()
    decay = [p for n, p in model.named_parameters() if not (n.endswith("norm.weight") or n.endswith(".bias"))]
    rest = [p for n, p in model.named_parameters() if n.endswith("norm.weight") or n.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    inp, tgt = (torch.as_tensor(x, dtype=torch.long) for x in batches)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        logits = model(input_ids=inp).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), tgt.reshape(-1))
        loss.backward()
        opt.step()
        out.append(float(loss))
    return np.array(out)


def one_batch_run(moe, wd, family, tag, seed, S, train_keys, B=4):
    """A random HF folder of the family, a token file of exactly one batch of B windows (every
    step sees all of them, in an order that does not change the mean loss) and `moe train` from
    the folder on it, CE only (no aux or z loss, dropless, constant lr, no clipping), with
    train_keys; returns (the folder, the batch's inputs and targets [B, S], the run folder)."""
    folder = os.path.join(wd, f"hf_{tag}_{family}")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    random_model(family, seed).save_pretrained(folder, safe_serialization=True)
    toks = np.random.default_rng(seed).integers(0, 256, size=B * S + 1)
    data, run = os.path.join(wd, f"{tag}_{family}.bin"), os.path.join(wd, f"{tag}_{family}")
    write_tokens(data, toks, 256)
    with open(run + ".cfg", "w") as f:
        f.write(f'train = {{ init_from = "{folder}"; batch_size = {B}; seq_len = {S}; warmup_steps = 0; '
                f'schedule = "constant"; grad_clip = 0.0; eval_interval = 0; threads = 1; {train_keys} }};\n'
                f'model = {{ max_seq_len = {S}; aux_coef = 0.0; z_coef = 0.0; capacity_factor = 0.0; }};\n'
                f'data = {{ train = "{data}"; val = "{data}"; }};\n'
                f'log = {{ dir = "{run}"; interval = 1; }};\ncheckpoint = {{ interval = 1; }};\n')
    moe.run("train", run + ".cfg", "--overwrite")
    windows = np.stack([toks[w * S:(w + 1) * S + 1] for w in range(B)])
    return folder, (windows[:, :-1], windows[:, 1:]), run


def train_vs_torch(res, moe, wd, family, S, steps=20):
    """20 AdamW steps from a random HF folder in moe and in PyTorch on the same batch, both
    against PyTorch in float64: moe no further from it than PyTorch's own float32 run (3x)."""
    lr, wdk = 1e-3, 0.1
    folder, batches, run = one_batch_run(
        moe, wd, family, "adamw", 21, S, f"steps = {steps}; lr = {lr}; beta1 = 0.9; beta2 = 0.95; "
        f"eps = 1e-8; weight_decay = {wdk};")
    ours = np.array([r["loss"] for r in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if "loss" in r])
    f32 = torch_train(hf_copy(family, folder), torch.float32, batches, steps, lr, wdk)
    f64 = torch_train(hf_copy(family, folder), torch.float64, batches, steps, lr, wdk)
    d_moe, d_t32 = np.abs(ours - f64).max(), np.abs(f32 - f64).max()
    ok = len(ours) == steps and d_moe <= max(3 * d_t32, 1e-6)
    res.check(f"{family}: {steps} AdamW steps, moe vs PyTorch float64 no further than PyTorch float32", ok,
              f"max |loss - f64|: moe {d_moe:.2e}, torch f32 {d_t32:.2e}; loss {ours[0]:.4f} -> {ours[-1]:.4f} "
              f"(f64 {f64[0]:.4f} -> {f64[-1]:.4f})")


def grads_vs_torch(res, moe, wd, family, S, tol=1e-5):
    """Every parameter's gradient against PyTorch's, tensor by tensor: one SGD step of lr 1000
    in moe (weights after - before, / lr: the update dominates the weights, so the fp32 rounding
    of the difference is ~1e-7 of it) against the gradient of the same CE loss through the HF
    class in float64, saved with save_pretrained (its own names, experts unfused as moe.c's)."""
    lr = 1000.0
    folder, (inp, tgt), run = one_batch_run(moe, wd, family, "sgd", 31, S,
                                            f'steps = 1; optimizer = "sgd"; lr = {lr};')
    _, before, _ = ch.read_hf_folder(folder, strict=False)
    _, after, _ = ch.read_hf_folder(os.path.join(run, "ckpt", "step_00000001"), strict=False)
    m = hf_copy(family, folder).double()
    logits = m(input_ids=torch.as_tensor(inp)).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      torch.as_tensor(tgt).reshape(-1)).backward()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    gfolder = folder + "_grads"
    if os.path.exists(gfolder):
        shutil.rmtree(gfolder)
    m.save_pretrained(gfolder, safe_serialization=True)
    _, want, _ = ch.read_hf_folder(gfolder, strict=False)
    worst, name, bad = 0.0, "-", []
    for k, g in want.items():
        got = (before[k] - after[k]) / lr
        e = float(np.linalg.norm(got - g) / max(np.linalg.norm(g), 1e-30)) if np.any(g) else float(np.abs(got).max())
        if e > worst:
            worst, name = e, k
        if e > tol:
            bad.append(k)
    ok = set(want) == set(before) == set(after) and not bad
    res.check(f"{family}: every gradient against PyTorch float64 (one SGD step), {len(want)} tensors", ok,
              f"worst {worst:.2e} ({name}), tol {tol:g}" + (f"; over: {bad[:4]}" if bad else ""))


def hf_copy(family, folder):
    _, Model = hf_classes(family)
    return Model.from_pretrained(folder, **load_kwargs())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moe", required=True)
    ap.add_argument("--workdir")
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"check_hf_families: torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    tmp = args.workdir is None
    wd = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="moe_check_families_"))
    os.makedirs(wd, exist_ok=True)
    moe, res, t0 = Moe(args.moe, wd, args.timeout), Results(), time.time()
    families = args.family or sorted(FAMILIES)
    missing = [f for f in families if not hasattr(transformers, FAMILIES[f][1])]
    for f in missing:  # (Qwen3-MoE from 4.51, OLMoE from 4.45)
        print(f"check_hf_families: {f}: transformers {transformers.__version__} has no {FAMILIES[f][1]}: not checked")
    for fam in [f for f in families if f not in missing]:
        res.attempt(f"{fam} reverse", reverse, res, moe, wd, fam, args.seq_len, args.tol)
        res.attempt(f"{fam} forward", forward, res, moe, wd, fam, args.seq_len, args.tol, args.steps)
        if V5:  # (transformers 4.x's float64 forward overflows its float32 attention mask)
            res.attempt(f"{fam} training", train_vs_torch, res, moe, wd, fam, args.seq_len)
            res.attempt(f"{fam} gradients", grads_vs_torch, res, moe, wd, fam, args.seq_len)
    return res.finish("check_hf_families", t0, wd, tmp)


if __name__ == "__main__":
    sys.exit(main())
