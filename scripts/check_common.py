"""What scripts/check_hf.py and scripts/check_hf_tokenizer.py share: the skip code, PASS/FAIL
results, the moe command run as a subprocess, and the token file header (data/token_file.h).
Imported by path: both scripts run from scripts/ (python3 scripts/check_hf.py ...)."""
import os
import struct
import subprocess
import sys
import time

SKIP = 77  # CTest's skip code: no interpreter with transformers

TOK_MAGIC = b"MOETOK1\0"
TOK_HEADER = struct.Struct("<8sIIQII")  # magic, version, dtype bytes, count, vocab, reserved


def python_with(name, probe, pythons, hint):
    """probe() imports what the calling script needs. When it raises, the script is run again
    (os.execv) under the first of pythons not tried yet ($MOE_HF_TRIED), else it prints a SKIP
    line naming why and exits 77."""
    try:
        probe()
        return
    except Exception as e:  # ImportError, or a broken install raising something else
        why = f"{type(e).__name__}: {e}"
    # (by path, not resolved: a venv's python is a link to the base interpreter)
    tried = os.environ.get("MOE_HF_TRIED", "").split(os.pathsep) + [os.path.abspath(sys.executable)]
    for py in pythons:
        if os.path.exists(py) and os.path.abspath(py) not in tried:
            os.environ["MOE_HF_TRIED"] = os.pathsep.join(tried)
            sys.stdout.flush()
            os.execv(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:])
    print(f"{name}: SKIP: {hint} not importable with {sys.executable} ({why}); tried {pythons}")
    sys.exit(SKIP)


class CheckError(Exception):
    pass


class Results:
    def __init__(self):
        self.passed, self.failed = [], []

    def check(self, name, ok, detail=""):
        (self.passed if ok else self.failed).append(name)
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def error(self, name, err):
        self.failed.append(name)
        print(f"FAIL {name}: {err}", flush=True)

    def attempt(self, name, fn, *args):
        """Runs one step; a CheckError (or a bug) is one FAIL and the next steps still run."""
        try:
            return fn(*args)
        except CheckError as e:
            self.error(name, e)
        except Exception as e:
            import traceback
            traceback.print_exc()
            self.error(name, f"{type(e).__name__}: {e}")
        return None

    def finish(self, prog, t0, workdir, remove):
        """The closing lines ("PROG: N passed, M failed (...)", the failed names); the workdir removed
        when everything passed and it was a temporary one. The exit code: 0 all passed, else 1."""
        import shutil
        import time
        ok = not self.failed and self.passed
        print(f"{prog}: {len(self.passed)} passed, {len(self.failed)} failed "
              f"({time.time() - t0:.1f}s, workdir {workdir})")
        for n in self.failed:
            print(f"  failed: {n}")
        if ok and remove:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0 if ok else 1


class MoeCommand:
    """The moe binary, run in workdir with one thread (the checks are about numbers, not
    speed, on a machine that may be shared); a non-zero exit or a timeout is a CheckError."""

    def __init__(self, exe, workdir, timeout, **env):
        self.exe, self.workdir, self.timeout = os.path.abspath(exe), workdir, timeout
        self.env = dict(os.environ)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.env.update(env)

    def run_bytes(self, *args):
        """(stdout, stderr) as bytes."""
        cmd = [self.exe] + [str(a) for a in args]
        print("+ " + " ".join(cmd), flush=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=self.workdir, env=self.env, capture_output=True,
                               timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise CheckError(f"timed out after {self.timeout}s: {' '.join(cmd)}")
        if p.returncode != 0:
            out = (p.stdout + p.stderr).decode("utf-8", "replace")
            tail = "\n".join(out.splitlines()[-30:])
            raise CheckError(f"exit {p.returncode} after {time.time() - t0:.1f}s: "
                             f"{' '.join(cmd)}\n{tail}")
        return p.stdout, p.stderr


def read_token_header(path):
    """A token file's bytes, count, vocab and element size, the header and size checked."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < TOK_HEADER.size:
        raise CheckError(f"{path}: {len(data)} bytes, shorter than the 32-byte header")
    magic, version, dtype, count, vocab, reserved = TOK_HEADER.unpack_from(data)
    if magic != TOK_MAGIC or version != 1 or dtype not in (2, 4) or reserved != 0:
        raise CheckError(f"{path}: bad header magic={magic!r} version={version} dtype={dtype} "
                         f"reserved={reserved}")
    if len(data) != TOK_HEADER.size + count * dtype:
        raise CheckError(f"{path}: size {len(data)} != 32 + {count} * {dtype}")
    return data, count, vocab, dtype
