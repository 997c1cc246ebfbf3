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
