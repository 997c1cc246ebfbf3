#!/usr/bin/env python3
"""public_names.py BUILD_DIR WORK_DIR: every name the installed moe gives a program is prefixed.

`cmake --install BUILD_DIR --prefix WORK_DIR/prefix`, then:
  lib/libmoe.so   every symbol it exports (nm -D) starts with moe_ or a room's prefix
                  (data_ ckpt_ stats_ infer_ cli_ optim_ train_);
  lib/libmoe.a    every global symbol its objects define (nm -g, demangled) too, or cpu_/cuda_:
                  the backends' own functions, hidden in libmoe.so but global in the archive;
  include/moe/    every typedef, enum constant, macro, extern variable and inline function the
                  installed headers declare: the same prefixes (MOE_, DATA_, ... for constants).
The one exception is layers/real.h's numeric type `real` (with real_exp, real_log, real_sqrt):
the precision switch every signature is written in (docs/library.md).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

ROOMS = ("data", "ckpt", "stats", "infer", "cli", "optim", "train")
LOWER = tuple(p + "_" for p in ("moe",) + ROOMS)
UPPER = tuple(p.upper() + "_" for p in ("moe",) + ROOMS)
BACKENDS = ("cpu_", "cuda_")
LINKER = {"_edata", "_end", "__bss_start", "_init", "_fini"}
# names compilers make for a symbol: ASan's one-definition-rule indicator of a global, a CUDA
# kernel's launch stub; the name after it is what is checked
MADE_FOR = re.compile(r"^(?:__odr_asan[._]|__device_stub__)")
REAL_H = {"real", "real_exp", "real_log", "real_sqrt"}

failures = []


def fail(what):
    failures.append(what)
    print("public_names: FAIL: " + what)


def nm(*args):
    out = subprocess.run(["nm", *args], capture_output=True, text=True)
    if out.returncode:
        sys.exit("public_names: nm %s: %s" % (" ".join(args), out.stderr.strip()))
    return out.stdout


def check_shared(lib):
    names = [MADE_FOR.sub("", ln.split()[-1])
             for ln in nm("-D", "--defined-only", lib).splitlines() if ln.strip()]
    bad = sorted(n for n in names if n not in LINKER and not n.startswith(LOWER))
    for n in bad:
        fail("libmoe.so exports %s (no moe_ or room prefix)" % n)
    print("public_names: libmoe.so exports %d symbols, %d unprefixed" % (len(names), len(bad)))


def check_static(lib):
    n_syms, bad = 0, set()
    for ln in nm("-g", "--defined-only", "-C", lib).splitlines():
        parts = ln.split(None, 2)
        if len(parts) < 3 or ln.endswith(":"):
            continue  # blank lines and "object.o:" headers
        name = parts[2].split("(")[0].split("<")[0].strip()
        name = MADE_FOR.sub("", name)
        n_syms += 1
        if name not in LINKER and not name.startswith(LOWER + BACKENDS):
            bad.add(name)
    for n in sorted(bad):
        fail("libmoe.a defines the global %s (no moe_, room or backend prefix)" % n)
    print("public_names: libmoe.a defines %d global symbols, %d unprefixed" % (n_syms, len(bad)))


def header_names(text):
    """(kind, name) of what a header declares at file scope, comments removed."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    for body in re.findall(r"\benum\s*\w*\s*\{([^}]*)\}", text):
        for c in re.findall(r"(?:^|,)\s*([A-Za-z_]\w*)", body):
            yield "enum constant", c
    for name in re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M):
        yield "macro", name
    for name in re.findall(r"}\s*(\w+)\s*;", text):
        yield "type", name
    for name in re.findall(r"\btypedef\s[^;{}]*?\b(\w+)\s*;", text):
        yield "type", name
    for name in re.findall(r"\btypedef\s[^;{}]*?\(\s*\*\s*(\w+)\s*\)", text):
        yield "type", name
    for name in re.findall(r"\bextern\s[^;(]*?\b(\w+)\s*(?:\[[^\]]*\])?\s*;", text):
        yield "extern variable", name
    for name in re.findall(r"\bstatic\s+inline\s[^;{(]*?\b(\w+)\s*\(", text):
        yield "inline function", name


def check_headers(include):
    n_names, n_files = 0, 0
    for path in sorted(glob.glob(os.path.join(include, "**", "*.h"), recursive=True)):
        rel = os.path.relpath(path, include)
        n_files += 1
        with open(path) as f:
            names = list(header_names(f.read()))
        for kind, name in names:
            n_names += 1
            if rel == "layers/real.h" and name in REAL_H:
                continue
            allowed = {"macro": UPPER, "enum constant": UPPER + LOWER}.get(kind, LOWER)
            if not name.startswith(allowed):
                fail("include/moe/%s: %s %s has no moe_ or room prefix" % (rel, kind, name))
    print("public_names: %d names in %d installed headers checked" % (n_names, n_files))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    prefix = os.path.join(work, "prefix")
    cmake = os.environ.get("MOE_CMAKE", "cmake")
    done = subprocess.run([cmake, "--install", build, "--prefix", prefix], capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit("public_names: cmake --install failed:\n" + done.stdout + done.stderr)
    libdir = next((d for d in sorted(glob.glob(os.path.join(prefix, "lib*")))
                   if os.path.exists(os.path.join(d, "libmoe.a"))), None)  # lib or lib64
    if not libdir:
        sys.exit("public_names: no lib*/libmoe.a under " + prefix)
    check_shared(os.path.join(libdir, "libmoe.so"))
    check_static(os.path.join(libdir, "libmoe.a"))
    check_headers(os.path.join(prefix, "include", "moe"))
    if failures:
        sys.exit("public_names: %d unprefixed public names" % len(failures))
    print("public_names: ok")


if __name__ == "__main__":
    main()
