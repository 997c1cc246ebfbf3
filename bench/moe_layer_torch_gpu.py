#!/usr/bin/env python3
"""PyTorch on the GPU: forward+backward of a Mixtral-style MoE block, the reference of
scripts/bench_gpu.

Two implementations, the same math as moe.c's layer (dropless, softmax top-k, renormalised
weights, aux + z losses; loss = (out * dout).sum() + aux + z):
  hf       transformers' MixtralSparseMoeBlock (bench/moe_layer_torch.py): a Python loop over
           experts, torch.where + index_add_
  grouped  tokens sorted by expert, the expert GEMMs as torch._grouped_mm (w1|w3 stacked),
           combine by index_add_
fp32 storage; --math fp32 (torch.backends.cuda.matmul.allow_tf32 = False), tf32, or bf16
(torch.autocast to bf16: fp32 weights, bf16 GEMM operands, as moe.c's bf16 layer). CUDA events
around each step after warm-up, median of the repeats. One JSON line per implementation with
--json; an implementation this torch cannot run reports "error".

  python3 bench/moe_layer_torch_gpu.py --T 16384 --d 4096 --ff 4096 --E 8 --k 2 --math tf32
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from moe_layer_torch import MixtralSparseMoeBlock, router_losses  # noqa: E402


class GroupedMoe(torch.nn.Module):
    """The same block with stacked expert weights and torch._grouped_mm."""

    def __init__(self, block):
        super().__init__()
        self.E, self.k = block.num_experts, block.top_k
        self.gate = block.gate
        self.w13 = torch.nn.Parameter(torch.stack([torch.cat([e.w1.weight, e.w3.weight]) for e in block.experts]).detach().clone())
        self.w2 = torch.nn.Parameter(torch.stack([e.w2.weight for e in block.experts]).detach().clone())
        self.cd = torch.float32  # the grouped GEMMs' operand type (bf16: --math bf16)

    def forward(self, x):
        T, d = x.shape[1], x.shape[2]
        h = x.view(-1, d)
        logits = self.gate(h)
        w = F.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, self.k, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        flat = sel.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.k
        counts = torch.bincount(flat, minlength=self.E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xp = h[token].to(self.cd)
        h13 = torch._grouped_mm(xp, self.w13.to(self.cd).transpose(-2, -1), offs=offs)
        ff = h13.shape[1] // 2
        act = F.silu(h13[:, :ff]) * h13[:, ff:]
        ye = torch._grouped_mm(act, self.w2.to(self.cd).transpose(-2, -1), offs=offs)
        ye = ye.float() * w.reshape(-1)[order, None]
        out = torch.zeros_like(h).index_add_(0, token, ye)
        return out.view(1, T, d), logits, sel


def time_step(step, warmup, reps):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("T", 16384), ("d", 4096), ("ff", 4096), ("E", 8), ("k", 2)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--math", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--impl", choices=["hf", "grouped", "both"], default="both")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        sys.exit(77)
    torch.backends.cuda.matmul.allow_tf32 = args.math == "tf32"
    torch.backends.cudnn.allow_tf32 = args.math == "tf32"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(args.d, args.ff, args.E, args.k)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    block = block.to(dev)
    x = torch.randn(1, args.T, args.d, device=dev).requires_grad_(True)
    dout = torch.randn(1, args.T, args.d, device=dev)
    impls = ["hf", "grouped"] if args.impl == "both" else [args.impl]
    for impl in impls:
        model = block if impl == "hf" else GroupedMoe(block).to(dev)
        params = list(model.parameters())
        bf16 = args.math == "bf16"
        if bf16 and impl == "grouped":
            model.cd = torch.bfloat16

        def step():
            for p in params:
                p.grad = None
            x.grad = None
            # bf16: fp32 weights, bf16 GEMM operands (autocast), as moe.c's bf16 layer
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                out, logits, sel = model(x)
            aux, z = router_losses(logits.float(), sel, args.E, args.k, 0.01, 0.001)
            ((out.float() * dout).sum() + aux + z).backward()

        rec = {"impl": "pytorch " + impl, "math": args.math, "T": args.T, "d": args.d, "ff": args.ff,
               "E": args.E, "k": args.k, "torch": torch.__version__,
               "device": torch.cuda.get_device_name()}
        try:
            med = time_step(step, args.warmup, args.reps)
            rec["median_s"] = med
            rec["tflops"] = 18.0 * args.T * args.k * args.d * args.ff / med * 1e-12
        except Exception as e:  # e.g. torch._grouped_mm without fp32 support
            rec["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
        if impl == "grouped":
            del model
        torch.cuda.empty_cache()
        print(json.dumps(rec) if args.json else rec, flush=True)


if __name__ == "__main__":
    main()
