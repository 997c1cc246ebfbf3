#!/usr/bin/env python3
"""The MoE layer with a shared expert against transformers 5's own DeepseekV3MoE block.

    deepseek_moe_hf.py TEST_DEEPSEEK_MOE WORKDIR

For a few shapes (group-limited sigmoid routing with a random correction bias, norm_topk_prob
on and off, routed_scaling_factor 1 and 2.5, one or two shared experts' width): a
DeepseekV3MoE with random weights (float32, CPU, the eager experts) maps T random tokens x;
out = block(x) and the gradients of sum(out * dout) with respect to x and every weight are
written as a MOEFIX1 fixture (scripts/make_fixtures.py's format), the weights already in moe.c's
layout (routed experts: w13 [E, 2ff, d] gate rows then up rows, w2 [E, d, ff]; the shared
expert: w13 [2s, d], w2 [d, s], s = n_shared_experts * moe_intermediate_size).
TEST_DEEPSEEK_MOE runs moe.c's layer plus the shared SwiGLU MLP on them. Seeds whose routing
decisions sit within 1e-4 of a tie (a group's score, the k-th choice) are skipped: float32 may
break those either way. Runs under /opt/moe-hf5/bin/python (or $MOE_HF_PYTHON) when this
python has no transformers with DeepSeek-V3; exit 77 (ctest's skip) when none has it.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONS = [p for p in (os.environ.get("MOE_HF_PYTHON"), "/opt/moe-hf5/bin/python") if p]


def probe():
    import torch  # noqa: F401
    from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: F401
    assert hasattr(modeling_deepseek_v3, "DeepseekV3MoE")


sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
sys.path.insert(0, HERE)
from check_common import python_with  # noqa: E402

python_with("deepseek_moe_hf", probe, PYTHONS,
            "transformers 5 with DeepSeek-V3 (scripts/install_hf5.sh) is")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402

from make_fixtures import write_fixture  # noqa: E402
from router_groups_hf import margins_ok, run_cases  # noqa: E402

torch.set_num_threads(1)

# (d, E, k, n_group, topk_group, moe_intermediate_size, n_shared_experts, norm_topk_prob,
#  routed_scaling_factor)
CASES = [(24, 16, 4, 4, 2, 12, 1, True, 2.5), (24, 16, 4, 4, 2, 12, 2, False, 1.0),
         (24, 16, 3, 8, 3, 8, 2, True, 1.0)]
T, STD = 64, 0.3


def experts_moe_layout(experts, E, ff, d, t):
    """Routed experts' weights (t = identity) or gradients (t = .grad) as moe.c's
    w13 [E, 2ff, d], w2 [E, d, ff]: the fused gate_up_proj [E, 2ff, d] (gate rows first, as
    chunk(2) splits it) and down_proj [E, d, ff] of transformers 5, or a per-expert list of
    MLPs (older layouts)."""
    if hasattr(experts, "gate_up_proj"):
        assert tuple(experts.gate_up_proj.shape) == (E, 2 * ff, d), experts.gate_up_proj.shape
        assert tuple(experts.down_proj.shape) == (E, d, ff), experts.down_proj.shape
        return t(experts.gate_up_proj), t(experts.down_proj)
    return (torch.stack([torch.cat([t(m.gate_proj.weight), t(m.up_proj.weight)]) for m in experts]),
            torch.stack([t(m.down_proj.weight) for m in experts]))


def make_case(i, d, E, k, n_group, topk_group, ff, n_shared, norm, scale, out):
    cfg = DeepseekV3Config(hidden_size=d, n_routed_experts=E, num_experts_per_tok=k,
                           n_group=n_group, topk_group=topk_group, norm_topk_prob=norm,
                           routed_scaling_factor=scale, moe_intermediate_size=ff,
                           n_shared_experts=n_shared, hidden_act="silu")
    cfg._experts_implementation = "eager"  # the plain loop over experts, float32 on the CPU
    for seed in range(100 * i, 100 * i + 50):
        torch.manual_seed(seed)
        block = DeepseekV3MoE(cfg).float()
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0, STD)
            block.gate.e_score_correction_bias.copy_(0.2 * torch.randn(E))
        x = torch.randn(T, d)
        dout = torch.randn(T, d)
        with torch.no_grad():
            logits, _, idx = block.gate(x)
        scores = torch.sigmoid(logits.double()).numpy()
        bias = block.gate.e_score_correction_bias.double().numpy()
        if margins_ok(scores, bias, E, k, n_group, topk_group):
            break
    else:
        raise RuntimeError(f"case {i}: no seed without near-ties")
    x.requires_grad_(True)
    y = block(x.view(1, T, d))  # a batch of one sequence, as the decoder layer calls it
    assert tuple(y.shape) == (1, T, d), y.shape
    (y * dout.view(1, T, d)).sum().backward()

    sh = block.shared_experts
    s = n_shared * ff
    assert tuple(sh.gate_proj.weight.shape) == (s, d)
    value, grad = (lambda p: p), (lambda p: p.grad)

    def shared_layout(t):  # the shared MLP as moe.c's w13 [2s, d] (gate rows, up rows), w2 [d, s]
        return torch.cat([t(sh.gate_proj.weight), t(sh.up_proj.weight)]), t(sh.down_proj.weight)

    w13, w2 = experts_moe_layout(block.experts, E, ff, d, value)
    dw13, dw2 = experts_moe_layout(block.experts, E, ff, d, grad)
    sw13, sw2 = shared_layout(value)
    gw13, gw2 = shared_layout(grad)
    f32 = lambda v: v.detach().numpy().astype(np.float32)
    i32 = lambda v: np.array(v, dtype=np.int32)
    write_fixture(out, [
        ("T", i32(T)), ("d", i32(d)), ("ff", i32(ff)), ("E", i32(E)), ("k", i32(k)),
        ("n_group", i32(n_group)), ("topk_group", i32(topk_group)),
        ("norm_topk_prob", i32(int(norm))), ("route_scale", np.array(scale, np.float64)),
        ("shared_ff", i32(s)),
        ("x", f32(x)), ("dout", f32(dout)),
        ("gate", f32(block.gate.weight)), ("bias", f32(block.gate.e_score_correction_bias)),
        ("w13", f32(w13)), ("w2", f32(w2)), ("shared_w13", f32(sw13)), ("shared_w2", f32(sw2)),
        ("topk_idx", idx.numpy().astype(np.int32)),
        ("out", f32(y.view(T, d))), ("dx", f32(x.grad)),
        ("dgate", f32(block.gate.weight.grad)), ("dw13", f32(dw13)), ("dw2", f32(dw2)),
        ("dshared_w13", f32(gw13)), ("dshared_w2", f32(gw2))])
    print(f"case {i}: d={d} E={E} k={k} n_group={n_group} topk_group={topk_group} ff={ff} "
          f"n_shared={n_shared} norm={norm} scale={scale} seed {seed}", flush=True)


def main():
    run_cases(CASES, make_case, "deepseek_moe", __doc__)


if __name__ == "__main__":
    main()
