#!/usr/bin/python3
"""PyTorch reference benchmark: training throughput (tokens/s) of a Mixtral-style MoE LM.

fp32 on CPU, HF Mixtral semantics (modeling_mixtral.py, eager attention path):

  x = embed[tokens]                                   embed [V, d]
  per layer:  h = x + Attn(RMSNorm(x));  x = h + MoE(RMSNorm(h))
  logits = RMSNorm(x) lm_head^T                       untied lm_head [V, d]
  loss = CE (mean over tokens) + sum over layers (aux + z)

  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w
  Attn: q/k/v/o projections without bias, RoPE (HF rotate_half), GQA via repeat_kv
        (repeat_interleave over heads), softmax(q k^T * hd^-0.5 + causal mask) in fp32, @ v.
  MoE:  MixtralSparseMoeBlock and router_losses from bench/moe_layer_torch.py
        (dropless, loop over experts with index_add_; load-balancing aux + router z loss).

Each step: zero_grad, forward, backward, clip_grad_norm_(1.0), AdamW.step
(lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1). Inputs are seeded random windows
of --data (a moe.c token file), else seeded random token ids (a fresh batch each step,
generated before timing). Weights are N(0, 0.02); RMSNorm weights start at 1 (as in HF).

The first --warmup steps are discarded; tokens/s = batch*seq / median step time.
To bound the runtime on a loaded machine, stepping stops early once --time-budget seconds
have passed (but never before 3 timed steps); "steps" reports how many steps were timed.

Usage:
  /usr/bin/python3 bench/train_torch.py --vocab 256 --d 192 --layers 4 --heads 6 \
      --kv-heads 2 --ff 384 --experts 8 --top-k 2 --batch 8 --seq 256 --threads 2 \
      --steps 12 --warmup 3 [--json]
  (set OMP_WAIT_POLICY=passive in the environment to keep torch's OpenMP pool from
   spinning against Debian's pthread OpenBLAS)
"""
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Importing moe_layer_torch first sets OPENBLAS/OMP/MKL_NUM_THREADS from --threads, which
# must happen before torch is imported.
import moe_layer_torch  # noqa: E402
from moe_layer_torch import MixtralSparseMoeBlock, router_losses  # noqa: E402

import argparse  # noqa: E402
import array  # noqa: E402
import struct  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch_blas import blas_kernel, blas_library  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    # cos, sin: [S, hd] broadcast over [B, H, S, hd]
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(x, n_rep):
    """[B, KV, S, hd] -> [B, KV*n_rep, S, hd]; head j uses kv head j // n_rep (HF repeat_kv)."""
    if n_rep == 1:
        return x
    return torch.repeat_interleave(x, n_rep, dim=1)


class Attention(nn.Module):
    def __init__(self, d, n_heads, n_kv_heads):
        super().__init__()
        assert d % n_heads == 0 and n_heads % n_kv_heads == 0
        self.h = n_heads
        self.kv = n_kv_heads
        self.hd = d // n_heads
        self.scaling = self.hd ** -0.5
        self.q_proj = nn.Linear(d, n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, n_kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, n_kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(n_heads * self.hd, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.hd).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.h // self.kv)
        v = repeat_kv(v, self.h // self.kv)
        attn = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        attn = attn + mask
        attn = F.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v)  # [B, H, S, hd]
        out = out.transpose(1, 2).reshape(B, S, self.h * self.hd)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.input_layernorm = RMSNorm(a.d, a.rms_eps)
        self.self_attn = Attention(a.d, a.heads, a.kv_heads)
        self.post_attention_layernorm = RMSNorm(a.d, a.rms_eps)
        self.block_sparse_moe = MixtralSparseMoeBlock(a.d, a.ff, a.experts, a.top_k)

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        out, router_logits, selected = self.block_sparse_moe(self.post_attention_layernorm(h))
        return h + out, router_logits, selected


class MixtralLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed_tokens = nn.Embedding(a.vocab, a.d)
        self.layers = nn.ModuleList([DecoderLayer(a) for _ in range(a.layers)])
        self.norm = RMSNorm(a.d, a.rms_eps)
        self.lm_head = nn.Linear(a.d, a.vocab, bias=False)

        hd = a.d // a.heads
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        pos = torch.arange(a.seq, dtype=torch.float64)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, hd]
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        mask = torch.full((a.seq, a.seq), torch.finfo(torch.float32).min, dtype=torch.float32)
        self.register_buffer("mask", torch.triu(mask, diagonal=1), persistent=False)

    def forward(self, tokens, targets):
        a = self.a
        x = self.embed_tokens(tokens)
        aux_total = x.new_zeros(())
        z_total = x.new_zeros(())
        for layer in self.layers:
            x, router_logits, selected = layer(x, self.cos, self.sin, self.mask)
            aux, z = router_losses(router_logits, selected, a.experts, a.top_k, a.aux_coef, a.z_coef)
            aux_total = aux_total + aux
            z_total = z_total + z
        logits = self.lm_head(self.norm(x))
        ce = F.cross_entropy(logits.view(-1, a.vocab).float(), targets.view(-1))
        return ce + aux_total + z_total, ce, aux_total, z_total


def read_token_file(path):
    """Tokens of a MOETOK1 file: 32-byte header (magic, version, bytes per token, count,
    vocab size, reserved), then count little-endian u16 or u32 ids."""
    with open(path, "rb") as f:
        header = f.read(32)
        if len(header) != 32 or header[:8] != b"MOETOK1\0":
            raise SystemExit("%s: not a MOETOK1 token file" % path)
        dtype, count = struct.unpack("<I", header[12:16])[0], struct.unpack("<Q", header[16:24])[0]
        raw = f.read()
    if dtype not in (2, 4) or len(raw) != count * dtype:
        raise SystemExit("%s: %d bytes of tokens, header says %d x %d" % (path, len(raw), count, dtype))
    return torch.tensor(array.array("H" if dtype == 2 else "I", raw), dtype=torch.long)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--d", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=384, help="expert ffn dim")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="total steps including warmup")
    ap.add_argument("--warmup", type=int, default=3, help="leading steps left out of the timing")
    ap.add_argument("--time-budget", type=float, default=45.0,
                    help="stop early (after at least 3 timed steps) once the steps have taken this "
                         "many seconds; <= 0 disables")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--z-coef", type=float, default=0.001)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--data", default=None,
                    help="a moe.c token file (MOETOK1, data/token_file.h): batches are seeded "
                         "random windows of it, as moe.c's loader draws them, so both programs "
                         "route real text (random ids route evenly, real bytes do not); default: "
                         "random ids")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    a = ap.parse_args()
    assert a.threads == moe_layer_torch._THREADS
    assert 1 <= a.top_k <= a.experts
    assert a.d % a.heads == 0 and a.heads % a.kv_heads == 0 and (a.d // a.heads) % 2 == 0
    assert a.steps > a.warmup >= 0

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)

    model = MixtralLM(a)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * a.init_std)
    n_params = sum(p.numel() for p in model.parameters())

    # one fresh batch per step, generated up front (seeded)
    if a.data:
        corpus = read_token_file(a.data)
        starts = torch.randint(0, len(corpus) - a.seq - 1, (a.steps, a.batch), generator=gen)
        data = torch.stack([torch.stack([corpus[s:s + a.seq + 1] for s in row.tolist()])
                            for row in starts])
    else:
        data = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq + 1), generator=gen)
    batches = [(data[i, :, :-1].contiguous(), data[i, :, 1:].contiguous()) for i in range(a.steps)]

    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    model.train()

    times, losses = [], []
    t_start = time.perf_counter()
    for tokens, targets in batches:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss, ce, aux, z = model(tokens, targets)
        loss.float().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if (a.time_budget > 0 and time.perf_counter() - t_start > a.time_budget
                and len(times) - a.warmup >= 3):
            break

    timed = times[a.warmup:]
    med = statistics.median(timed)
    tps = a.batch * a.seq / med
    finite = all(math.isfinite(v) for v in losses)

    if a.json:
        print(json.dumps({
            "impl": "pytorch",
            "tokens_per_s": tps,
            "median_step_s": med,
            "steps": len(timed),
            "threads": a.threads, "dtype": a.dtype,
            "params": n_params,
            "torch": torch.__version__,
            "blas": blas_library(),
            "blas_kernel": blas_kernel(),
        }))
    else:
        print("pytorch MoE LM train V=%d d=%d L=%d H=%d KV=%d ff=%d E=%d k=%d B=%d S=%d threads=%d "
              "(torch %s, OMP_WAIT_POLICY=%s)"
              % (a.vocab, a.d, a.layers, a.heads, a.kv_heads, a.ff, a.experts, a.top_k,
                 a.batch, a.seq, a.threads, torch.__version__,
                 os.environ.get("OMP_WAIT_POLICY", "unset")))
        print("params: %d" % n_params)
        print("step times (s): [%s]  (first %d discarded)%s"
              % (", ".join("%.3f" % t for t in times), a.warmup,
                 "" if len(times) == a.steps else
                 "  (stopped after %d of %d steps: --time-budget %g s)"
                 % (len(times), a.steps, a.time_budget)))
        print("median step %.4f s, min %.4f s over %d steps -> %.1f tokens/s"
              % (med, min(timed), len(timed), tps))
        print("loss first %.4f, last %.4f (last: ce %.4f aux %.4f z %.6f)%s"
              % (losses[0], losses[-1], ce.item(), aux.item(), z.item(),
                 "" if finite else "  WARNING: non-finite loss"))
    if not finite:
        sys.exit(1)


if __name__ == "__main__":
    main()
