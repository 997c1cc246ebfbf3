#!/usr/bin/env python3
"""scripts/bench_common.py's CPU description, which every benchmark prints in its header,
against /proc/cpuinfo texts of known CPUs (each with two processors: the first one counts)
and against this machine's own: vendor, family and model parsed, the microarchitecture named
where the table knows it, nothing named where it does not.

  bench_cpu_info.py SCRIPTS_DIR WORKDIR
"""
import os
import sys

sys.path.insert(0, sys.argv[1])
from bench_common import cpu_info, cpu_line, cpu_name  # noqa: E402

CASES = [  # (vendor, family, model, model name, flags, expected name)
    ("AuthenticAMD", 25, 17, "AMD EPYC", "avx2 fma avx512f avx512_bf16",
     "AMD EPYC, family 25 model 17 (Zen 4)"),
    ("AuthenticAMD", 26, 2, "AMD EPYC", "avx2 fma avx512f avx512_bf16",
     "AMD EPYC, family 26 model 2 (Zen 5)"),
    ("AuthenticAMD", 25, 1, "AMD EPYC 7B13", "avx2 fma", "AMD EPYC 7B13, family 25 model 1 (Zen 3)"),
    ("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8481C", "avx2 fma avx512f amx_bf16 amx_tile",
     "Intel(R) Xeon(R) Platinum 8481C, family 6 model 143 (Sapphire Rapids)"),
    ("GenuineIntel", 6, 999, "Intel(R) Future", "avx2", "Intel(R) Future, family 6 model 999"),
    ("AuthenticAMD", 99, 0, "AMD Future", "", "AMD Future, family 99 model 0"),
]


def block(vendor, family, model, name, flags):
    return ("processor\t: 0\nvendor_id\t: %s\ncpu family\t: %d\nmodel\t\t: %d\nmodel name\t: %s\n"
            "flags\t\t: %s\n\n" % (vendor, family, model, name, flags))


def main():
    work = sys.argv[2]
    os.makedirs(work, exist_ok=True)
    fails = 0
    for vendor, family, model, name, flags, want in CASES:
        path = os.path.join(work, "cpuinfo")
        with open(path, "w") as f:  # the second processor must not override the first
            f.write(block(vendor, family, model, name, flags) + block("Other", 1, 1, "other CPU", "sse2"))
        c = cpu_info(path)
        got = cpu_name(c)
        ok = got == want and c["flags"] == set(flags.split())
        fails += not ok
        print("  %s  %-70s %s" % ("ok  " if ok else "FAIL", got, "" if ok else "(want %s)" % want))
    line = cpu_line(2, cpu_info(path))
    ok = line == "CPU: AMD Future, family 99 model 0 [no AVX2], 2 threads"
    fails += not ok
    print("  %s  %s" % ("ok  " if ok else "FAIL", line))
    here = cpu_info()  # this machine: an x86 CPU of either vendor has its numbers parsed
    ok = (here["vendor"] not in ("AuthenticAMD", "GenuineIntel") or
          (here["family"] is not None and here["model"] is not None and here["name"] != "unknown CPU"))
    fails += not ok
    print("  %s  this machine: %s" % ("ok  " if ok else "FAIL", cpu_line(2, here)))
    print("%d failure(s)" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
