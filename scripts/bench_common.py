"""What scripts/bench_moe_layer and scripts/bench_train share: the PyTorch columns.

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
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        flags = next((l for l in f if l.startswith("flags")), "").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_line(threads):
    """'CPU: <model name> (<the ISA flags that matter>), N threads', for the report's header."""
    name, flags = "unknown CPU", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    isa = [x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if x in flags]
    return "CPU: %s (%s), %d threads" % (name, " ".join(isa) or "no AVX2", threads)
