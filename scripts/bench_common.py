"""What the benchmark scripts share: the CPU they ran on, and (bench_moe_layer, bench_train)
the PyTorch columns.

Each column is (label, python, extra arguments, environment, is fp32):
  PyTorch 1.13           Debian's torch (/usr/bin/python3), as installed
  PyTorch 1.13 passive   the same with OMP_WAIT_POLICY=passive
  PyTorch 2.x fp32       PyPI's torch in the venv of scripts/install_hf5.sh ($MOE_HF5_VENV,
                         default /opt/moe-hf5), installed by that script when missing
  PyTorch 2.x bf16       the same with --dtype bf16 (torch.autocast("cpu", torch.bfloat16)),
                         only on CPUs with AVX512_BF16 or AMX unless --bf16: elsewhere PyTorch
                         emulates bf16, ~30x slower than its own fp32 here
"""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# A learning rate so small that the routing stays where initialisation put it (balanced) in
# both programs over the measured steps: at the config's 2e-3 the byte model collapses onto
# 2 of 8 experts within ~5 steps, which makes larger (faster) expert GEMMs and a different
# workload from a real run's. The cost of a step does not depend on the rate otherwise.
BENCH_LR = 1e-5


def cfg_values(path):
    """The numbers of a libconfig file we need (key = value; at any depth)."""
    text = open(path).read()
    vals = {}
    for key in ["vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "n_experts",
                "top_k", "batch_size", "seq_len", "tie_embeddings"]:
        m = re.search(r"^\s*%s\s*=\s*([0-9a-z]+)\s*;" % key, text, re.M)
        if m:
            vals[key] = {"true": 1, "false": 0}.get(m.group(1), None)
            if vals[key] is None:
                vals[key] = int(m.group(1))
    vals.setdefault("tie_embeddings", 0)
    vals.setdefault("n_kv_heads", vals["n_heads"])
    return vals


def bench_train_sets(steps, dtype, threads, log_dir):
    """moe train's --set arguments of a timed run (bench_train, bench_step): no warmup, BENCH_LR
    throughout, no evaluation but the final one (one batch), dropless, into log_dir."""
    sets = ["train.steps=%d" % steps, "train.warmup_steps=0", "train.lr=%g" % BENCH_LR,
            "train.min_lr=%g" % BENCH_LR, "train.eval_interval=0", 'train.dtype="%s"' % dtype,
            "train.eval_batches=1", "model.capacity_factor=0.0", "train.threads=%d" % threads,
            'log.dir="%s"' % log_dir]
    return [a for s in sets for a in ("--set", s)] + ["--overwrite"]


def torch_variants(args, env):
    """(label, python, extra args, environment, is fp32) of the PyTorch columns to run."""
    v = []
    if args.no_torch:
        return v
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0:
        v += [("PyTorch 1.13", "/usr/bin/python3", [], env, True),
              ("PyTorch 1.13 passive", "/usr/bin/python3", [], dict(env, OMP_WAIT_POLICY="passive"), True)]
    else:
        print("Debian's torch not importable by /usr/bin/python3: PyTorch 1.13 columns skipped")
    if not args.no_torch2:
        py = torch2_python()
        if py:
            v.append(("PyTorch 2.x fp32", py, [], env, True))
            if args.bf16 or cpu_has_bf16():
                v.append(("PyTorch 2.x bf16", py, ["--dtype", "bf16"], env, False))
            else:
                print("no AVX512_BF16/AMX on this CPU: PyTorch 2.x bf16 (emulated) not run (--bf16 runs it)")
    return v


def torch2_python():
    """The venv's python with torch 2.x, installing it (scripts/install_hf5.sh) when missing."""
    py = os.path.join(os.environ.get("MOE_HF5_VENV", "/opt/moe-hf5"), "bin", "python")
    probe = [py, "-c", "import torch; assert torch.__version__.split('.')[0] == '2'"]
    ok = lambda: os.access(py, os.X_OK) and subprocess.run(probe, capture_output=True).returncode == 0
    if not ok():
        print("PyTorch 2.x: installing with scripts/install_hf5.sh", flush=True)
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "install_hf5.sh")])
    if not ok():
        print("PyTorch 2.x not available (%s): its columns skipped" % py)
        return None
    return py


# Microarchitectures by (vendor, family, model) as far as this table knows them (AMD's and
# Intel's published family/model numbers); anything else prints its numbers alone. Zen 4's
# AVX-512 runs on 256-bit units (half Zen 5's fp32 GEMM rate on the same cores), so the
# name matters when figures from two sessions are compared.
AMD_UARCH = [(23, range(0x00, 0x30), "Zen/Zen+"), (23, range(0x30, 0x100), "Zen 2"),
             (25, range(0x00, 0x10), "Zen 3"), (25, range(0x10, 0x20), "Zen 4"),
             (25, range(0x20, 0x60), "Zen 3"), (25, range(0x60, 0x80), "Zen 4"),
             (25, range(0xa0, 0xb0), "Zen 4"), (26, range(0x00, 0x100), "Zen 5")]
INTEL_UARCH = {0x3f: "Haswell-EP", 0x4f: "Broadwell-EP", 0x55: "Skylake-SP/Cascade Lake/Cooper Lake",
               0x6a: "Ice Lake-SP", 0x6c: "Ice Lake-D", 0x8f: "Sapphire Rapids",
               0xcf: "Emerald Rapids", 0xad: "Granite Rapids", 0xae: "Granite Rapids-D"}
ISA = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_info(cpuinfo="/proc/cpuinfo"):
    """The first CPU of /proc/cpuinfo: dict of name, vendor, family, model, uarch (or None),
    flags (a set)."""
    c = {"name": "unknown CPU", "vendor": "", "family": None, "model": None, "flags": set()}
    keys = {"model name": "name", "vendor_id": "vendor", "cpu family": "family", "model": "model"}
    with open(cpuinfo) as f:
        for line in f:
            if not line.strip():
                break  # the end of the first processor's block
            key, _, value = (x.strip() for x in line.partition(":"))
            if key in keys:
                c[keys[key]] = int(value) if key in ("cpu family", "model") and value.isdigit() else value
            elif key == "flags":
                c["flags"] = set(value.split())
    fam, model = c["family"], c["model"]
    c["uarch"] = None
    if c["vendor"] == "AuthenticAMD" and model is not None:
        c["uarch"] = next((u for f, r, u in AMD_UARCH if f == fam and model in r), None)
    elif c["vendor"] == "GenuineIntel" and fam == 6:
        c["uarch"] = INTEL_UARCH.get(model)
    return c


def cpu_has_bf16(c=None):
    """Whether the CPU has bf16 instructions (AVX512_BF16 or AMX)."""
    return bool((c or cpu_info())["flags"] & {"avx512_bf16", "amx_bf16"})


def cpu_name(c=None):
    """'<model name>, family F model M (<uarch>)': the model name alone does not tell a
    virtual machine's Zen 4 from its Zen 5 ('AMD EPYC' on both)."""
    c = c or cpu_info()
    s = c["name"]
    if c["family"] is not None and c["model"] is not None:
        s += ", family %d model %d" % (c["family"], c["model"])
        if c["uarch"]:
            s += " (%s)" % c["uarch"]
    return s


def cpu_line(threads, c=None):
    """'CPU: <cpu_name> [<the ISA flags that matter>], N threads', for the report's header."""
    c = c or cpu_info()
    isa = [x for x in ISA if x in c["flags"]]
    return "CPU: %s [%s], %d threads" % (cpu_name(c), " ".join(isa) or "no AVX2", threads)
