#!/usr/bin/env python3
"""transformers' MixtralForCausalLM trained the way moe.c trains a config: the yardstick of
`moe train` on a GPU (scripts/gpu_check.sh) and usable on a CPU with small shapes.

Model: MixtralConfig with the config's sizes (vocab, d, layers, heads, kv heads, expert ff,
experts, top-k, rope theta, RMSNorm eps), untied LM head, SDPA attention, router logits on
(so the load-balancing loss is part of the loss, as in moe.c; HF has no router z-loss).
Weights are fp32 master weights; the step runs under torch.autocast(bf16) with --dtype bf16
(moe.c's train.dtype = "bf16": bf16 GEMM operands, fp32 accumulation, fp32 optimizer), plain
fp32 otherwise. AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1; fused on CUDA), gradient
clipping at 1.0, a fresh batch each step from random windows of --data (a moe.c token file)
or random ids. --experts-impl picks transformers' expert implementation ("default" is what
from_config chooses: grouped_mm where it can dispatch, else eager).

tokens/s = batch * seq / median step time after --warmup steps (each step synchronised);
with --flops-per-token F it prints MFU = tokens/s * F / --peak-tflops.

  python3 bench/train_hf.py --vocab 256 --d 1024 --layers 16 --heads 16 --kv-heads 4 \
      --ff 2560 --experts 8 --top-k 2 --batch 16 --seq 1024 --steps 12 --warmup 3 \
      --device cuda --dtype bf16 [--data runs/data/repo/train.bin] [--json]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build(a, torch):
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=a.vocab, hidden_size=a.d, intermediate_size=a.ff,
                        num_hidden_layers=a.layers, num_attention_heads=a.heads,
                        num_key_value_heads=a.kv_heads, num_local_experts=a.experts,
                        num_experts_per_tok=a.top_k, max_position_embeddings=a.seq,
                        rope_theta=a.rope_theta, rms_norm_eps=a.rms_eps,
                        router_aux_loss_coef=a.aux_coef, output_router_logits=True,
                        tie_word_embeddings=False, initializer_range=0.02)
    kw = {"attn_implementation": "sdpa"}
    if a.experts_impl != "default":
        kw["experts_implementation"] = a.experts_impl
    torch.manual_seed(a.seed)
    model = MixtralForCausalLM._from_config(cfg, dtype=torch.float32, **kw)
    impl = getattr(model.config, "_experts_implementation", None) or "eager"
    return model.to(a.device), impl


def batches(a, torch):
    gen = torch.Generator().manual_seed(a.seed)
    if a.data:
        from train_torch import read_token_file  # the MOETOK1 reader
        corpus = read_token_file(a.data)
        starts = torch.randint(0, len(corpus) - a.seq - 1, (a.steps, a.batch), generator=gen)
        return [torch.stack([corpus[s:s + a.seq + 1] for s in row.tolist()]).to(a.device)
                for row in starts]
    return [torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen).to(a.device)
            for _ in range(a.steps)]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("vocab", 256), ("d", 192), ("layers", 4), ("heads", 6),
                          ("kv-heads", 2), ("ff", 384), ("experts", 8), ("top-k", 2),
                          ("batch", 8), ("seq", 256), ("steps", 12), ("warmup", 3), ("seed", 0)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--experts-impl", default="default",
                    help="default | eager | grouped_mm | batched_mm (transformers 5)")
    ap.add_argument("--data", default=None, help="a moe.c token file (MOETOK1)")
    ap.add_argument("--flops-per-token", type=float, default=0.0)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="H200/H100 SXM dense bf16")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        sys.exit("train_hf: --steps must exceed --warmup")

    import torch
    import transformers
    cuda = a.device.startswith("cuda")
    model, impl = build(a, torch)
    n_params = sum(p.numel() for p in model.parameters())
    data = batches(a, torch)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, **({"fused": True} if cuda else {}))
    model.train()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times, losses = [], []
    for seq in data:
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            out = model(input_ids=seq[:, :-1], labels=seq[:, :-1])
        out.loss.float().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(out.loss.item())
    timed = times[a.warmup:]
    med = statistics.median(timed)
    tps = a.batch * a.seq / med
    mfu = tps * a.flops_per_token / (a.peak_tflops * 1e12) if a.flops_per_token else None
    rec = {"impl": "transformers", "experts_implementation": impl, "tokens_per_s": tps,
           "median_step_s": med, "steps": len(timed), "params": n_params, "dtype": a.dtype,
           "device": torch.cuda.get_device_name() if cuda else "cpu", "mfu": mfu,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "loss_first": losses[0], "loss_last": losses[-1],
           "finite": all(math.isfinite(v) for v in losses),
           "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
    if a.json:
        print(json.dumps(rec))
    else:
        print("transformers %s Mixtral (%s experts, %.2fB params) on %s, %s: %.0f tokens/s "
              "(median step %.1f ms over %d)%s; loss %.4f -> %.4f"
              % (transformers.__version__, impl, n_params / 1e9, rec["device"], a.dtype, tps,
                 med * 1e3, len(timed), "" if mfu is None else ", MFU %.1f%%" % (100 * mfu),
                 losses[0], losses[-1]))
    return 0 if rec["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
