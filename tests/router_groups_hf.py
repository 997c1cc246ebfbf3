#!/usr/bin/env python3
"""Group-limited routing against transformers 5's DeepseekV3TopkRouter (issue 30).

    router_groups_hf.py TEST_ROUTER_GROUPS WORKDIR

For a few shapes (groups of 2 to 4 experts, 1 to 3 groups kept, with and without the
correction bias and norm_topk_prob, routed_scaling_factor 1 and 2.5): a DeepseekV3TopkRouter
with random weights routes random tokens; its logits, bias, chosen experts and weights are
written as a MOEFIX1 fixture (scripts/make_fixtures.py's format) and TEST_ROUTER_GROUPS
compares moe.c's router_topk on the same logits with them. Seeds whose decisions sit within
1e-4 of a tie (a group's score, the k-th choice) are skipped: float32 may break those either
way. Runs under /opt/moe-hf5/bin/python (or $MOE_HF_PYTHON) when this python has no
transformers with DeepSeek-V3; exit 77 (ctest's skip) when none has it.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONS = [p for p in (os.environ.get("MOE_HF_PYTHON"), "/opt/moe-hf5/bin/python") if p]


def probe():
    import torch  # noqa: F401
    from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: F401


sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from check_common import python_with  # noqa: E402

python_with("router_groups_hf", probe, PYTHONS,
            "transformers 5 with DeepSeek-V3 (scripts/install_hf5.sh) is")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter  # noqa: E402

from make_fixtures import write_fixture  # noqa: E402

# (E, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor, bias)
CASES = [(16, 4, 4, 2, True, 2.5, True), (8, 2, 4, 1, False, 1.0, False),
         (32, 6, 8, 3, True, 1.0, True), (12, 3, 3, 2, True, 1.0, True)]
T, D, MARGIN = 96, 24, 1e-4


def margins_ok(scores, bias, E, k, n_group, topk_group):
    """Every decision of every token more than MARGIN from a tie (float64)."""
    v = scores + bias
    G = E // n_group
    group = np.sort(v.reshape(-1, n_group, G), axis=-1)[..., -2:].sum(-1)
    order = np.sort(group, axis=-1)[:, ::-1]
    if topk_group < n_group and np.min(order[:, topk_group - 1] - order[:, topk_group]) <= MARGIN:
        return False
    kept = np.argsort(-group, axis=-1, kind="stable")[:, :topk_group]
    mask = np.zeros((v.shape[0], n_group), bool)
    np.put_along_axis(mask, kept, True, axis=-1)
    masked = np.where(np.repeat(mask, G, axis=-1), v, -np.inf)
    top = np.sort(masked, axis=-1)[:, ::-1]
    return k >= E or np.min(top[:, k - 1] - top[:, k]) > MARGIN


def make_case(i, E, k, n_group, topk_group, norm, scale, with_bias, out):
    cfg = DeepseekV3Config(hidden_size=D, n_routed_experts=E, num_experts_per_tok=k,
                           n_group=n_group, topk_group=topk_group, norm_topk_prob=norm,
                           routed_scaling_factor=scale)
    for seed in range(100 * i, 100 * i + 50):
        torch.manual_seed(seed)
        router = DeepseekV3TopkRouter(cfg)
        with torch.no_grad():
            router.weight.normal_(0, 0.5)
            router.e_score_correction_bias.copy_(0.2 * torch.randn(E) if with_bias else torch.zeros(E))
        x = torch.randn(T, D)
        with torch.no_grad():
            logits, weights, idx = router(x)
        scores = torch.sigmoid(logits.double()).numpy()
        if margins_ok(scores, router.e_score_correction_bias.double().numpy(), E, k, n_group, topk_group):
            break
    else:
        raise RuntimeError(f"case {i}: no seed without near-ties")
    i32 = lambda v: np.array(v, dtype=np.int32)
    write_fixture(out, [("T", i32(T)), ("E", i32(E)), ("k", i32(k)), ("n_group", i32(n_group)),
                        ("topk_group", i32(topk_group)), ("norm_topk_prob", i32(int(norm))),
                        ("route_scale", np.array(scale, np.float64)),
                        ("logits", logits.numpy().astype(np.float32)),
                        ("bias", router.e_score_correction_bias.numpy().astype(np.float32)),
                        ("topk_idx", idx.numpy().astype(np.int32)),
                        ("weights", weights.double().numpy())])
    print(f"case {i}: E={E} k={k} n_group={n_group} topk_group={topk_group} norm={norm} "
          f"scale={scale} bias={with_bias} seed {seed}", flush=True)


def run_cases(cases, make_case, stem, doc):
    """argv: TEST_PROGRAM WORKDIR. Writes WORKDIR/STEM_i.bin for each case (make_case(i,
    *case, path)), runs the program on them and exits with its status."""
    if len(sys.argv) != 3:
        sys.exit(doc)
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    files = []
    for i, case in enumerate(cases):
        files.append(os.path.join(work, f"{stem}_{i}.bin"))
        make_case(i, *case, files[-1])
    sys.exit(subprocess.run([exe] + files).returncode)


def main():
    run_cases(CASES, make_case, "router_groups", __doc__)


if __name__ == "__main__":
    main()
