#!/usr/bin/python3
"""PyTorch reference benchmark: forward+backward of a Mixtral-style sparse MoE block.

Reimplements transformers' ``MixtralSparseMoeBlock`` (modeling_mixtral.py) in fp32,
dropless, on CPU, and times one training step (zero grads, forward, backward) of

    loss = (out * dout).sum() + aux + z

where aux is the load-balancing loss and z the router z-loss, so the router
backward path (gate weight and input grads through softmax/topk/logsumexp) is
exercised.

  aux = aux_coef * E * sum_e f_e * P_e
        f_e = (number of (token, slot) assignments to expert e) / (T * k)
        P_e = mean over tokens of softmax(router_logits)[:, e]
  z   = z_coef * mean_t logsumexp(router_logits[t])^2

Usage:
  /usr/bin/python3 bench/moe_layer_torch.py --T 4096 --d 512 --ff 1408 --E 8 --k 2 \
      --threads 2 --warmup 2 --reps 7 --seed 0 [--dtype fp32|bf16] [--json]

Runs on Debian's torch 1.13 and on PyTorch 2.x (scripts/bench_moe_layer uses both); --dtype
bf16 runs the forward under torch.autocast("cpu", dtype=torch.bfloat16) (the backward follows
autocast's casts), the loss in fp32.
"""
import os
import sys


def _early_threads(argv):
    """Parse --threads from argv before torch is imported (default 2)."""
    threads = 2
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            threads = int(argv[i + 1])
        elif a.startswith("--threads="):
            threads = int(a.split("=", 1)[1])
    return threads


_THREADS = _early_threads(sys.argv[1:])
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(_THREADS)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch_blas import blas_kernel, blas_library  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class MixtralBlockSparseTop2MLP(nn.Module):
    """expert(x) = w2(silu(w1 x) * w3 x), Linear layers without bias."""

    def __init__(self, hidden_dim, ffn_dim):
        super().__init__()
        self.w1 = nn.Linear(hidden_dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, hidden_dim, bias=False)
        self.w3 = nn.Linear(hidden_dim, ffn_dim, bias=False)

    def forward(self, hidden_states):
        current_hidden_states = F.silu(self.w1(hidden_states)) * self.w3(hidden_states)
        return self.w2(current_hidden_states)


class MixtralSparseMoeBlock(nn.Module):
    """Faithful copy of transformers' MixtralSparseMoeBlock (no jitter noise)."""

    def __init__(self, hidden_dim, ffn_dim, num_experts, top_k):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.ffn_dim = ffn_dim
        self.num_experts = num_experts
        self.top_k = top_k
        self.gate = nn.Linear(hidden_dim, num_experts, bias=False)
        self.experts = nn.ModuleList(
            [MixtralBlockSparseTop2MLP(hidden_dim, ffn_dim) for _ in range(num_experts)]
        )

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        # router_logits: (batch * sequence_length, n_experts)
        router_logits = self.gate(hidden_states)

        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        # norm_topk_prob
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        # cast back to the input dtype
        routing_weights = routing_weights.to(hidden_states.dtype)

        final_hidden_states = torch.zeros(
            (batch_size * sequence_length, hidden_dim),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )

        # One hot encode the selected experts to create an expert mask
        # this will be used to easily index which expert is going to be sollicitated
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)

        # Loop over all available experts in the model and perform the computation on each expert
        for expert_idx in range(self.num_experts):
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx])

            # Index the correct hidden states and compute the expert hidden state for
            # the current expert. We need to make sure to multiply the output hidden
            # states by `routing_weights` on the corresponding tokens (top-1 and top-2)
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]

            # However `index_add_` only support torch tensors for indexing so we'll use
            # the `top_x` tensor here.
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        final_hidden_states = final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)
        return final_hidden_states, router_logits, selected_experts


def router_losses(router_logits, selected_experts, num_experts, top_k, aux_coef, z_coef):
    """Load-balancing aux loss and router z-loss (both differentiable wrt logits)."""
    n_tokens = router_logits.shape[0]
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float)
    counts = torch.bincount(selected_experts.reshape(-1), minlength=num_experts).to(probs.dtype)
    f = counts / float(n_tokens * top_k)  # fraction of assignments (no grad)
    P = probs.mean(dim=0)  # mean router probability (grad)
    aux = aux_coef * num_experts * torch.sum(f * P)
    lse = torch.logsumexp(router_logits.float(), dim=-1)
    z = z_coef * torch.mean(lse * lse)
    return aux, z


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=4096, help="tokens")
    ap.add_argument("--d", type=int, default=512, help="hidden dim")
    ap.add_argument("--ff", type=int, default=1408, help="expert ffn dim")
    ap.add_argument("--E", type=int, default=8, help="number of experts")
    ap.add_argument("--k", type=int, default=2, help="top-k")
    ap.add_argument("--shared", type=int, default=0,
                    help="a shared expert of this width added to the output (DeepSeek's, ungated); 0: none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--z-coef", type=float, default=0.001)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args()
    assert args.threads == _THREADS
    assert 1 <= args.k <= args.E

    torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)

    block = MixtralSparseMoeBlock(args.d, args.ff, args.E, args.k)
    shared = MixtralBlockSparseTop2MLP(args.d, args.shared) if args.shared else None
    with torch.no_grad():
        for p in list(block.parameters()) + (list(shared.parameters()) if shared else []):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * args.init_std)

    x = torch.randn(1, args.T, args.d, generator=gen, dtype=torch.float32).requires_grad_(True)
    dout = torch.randn(1, args.T, args.d, generator=gen, dtype=torch.float32)
    params = list(block.parameters()) + (list(shared.parameters()) if shared else [])

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            out, router_logits, selected = block(x)
            if shared is not None:  # the always-on expert beside the routed ones
                out = out + shared(x)
            aux, z = router_losses(router_logits, selected, args.E, args.k, args.aux_coef, args.z_coef)
            loss = (out.float() * dout).sum() + aux + z
        loss.backward()
        return loss

    for _ in range(args.warmup):
        step()

    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)

    med = statistics.median(times)
    mn = min(times)
    if args.json:
        print(json.dumps({
            "impl": "pytorch",
            "T": args.T, "d": args.d, "ff": args.ff, "E": args.E, "k": args.k, "shared": args.shared,
            "threads": args.threads, "dtype": args.dtype,
            "median_s": med, "min_s": mn, "reps": times,
            "torch": torch.__version__,
            "blas": blas_library(),
            "blas_kernel": blas_kernel(),
        }))
    else:
        print("pytorch moe fwd+bwd T=%d d=%d ff=%d E=%d k=%d threads=%d: median %.4f s, min %.4f s, reps [%s] (torch %s)"
              % (args.T, args.d, args.ff, args.E, args.k, args.threads, med, mn,
                 ", ".join("%.4f" % t for t in times), torch.__version__))


if __name__ == "__main__":
    main()
