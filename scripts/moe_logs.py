"""Reading a moe.c run's logs (docs/training.md "Console and logs"; docs/DESIGN.md 5.4) with the
rules of `moe stats`: scripts/plot_load.py and scripts/tensorboard.py read through this module, so a
damaged log gives one message naming the file and the line (LogError), never a traceback.

What is refused:
  files    not a regular file (a FIFO, a device, a folder: checked before opening, so a FIFO
           does not block), larger than 64 GiB, a line longer than 256 MiB;
  lines    a NUL byte, bytes that are not UTF-8, a line that is not one JSON object (NaN and
           Infinity are not JSON), JSON nested deeper than 64 levels. Blank lines are skipped;
           a last line without its newline that does not parse is a write in progress:
           skipped with a note on stderr. Of a key given twice the first counts (as in cJSON);
  expert_load.jsonl  "step" not an integer in [1, 2^53] (a JSON number equal to an integer;
           true is not a number), steps not strictly increasing per layer; "layer" not an
           integer in [0, n_layers) (model.n_layers of RUN/config.cfg; without it [0, 65535]);
           "counts" not an array of E integers in [0, 2^53] (E: the config's model.n_experts,
           else the first record's); "kept" (optional) likewise, or above "counts"; "tokens",
           "capacity" not null or an integer >= 0; "dropped", "max_over_mean", "cv",
           "exchange_bytes" not null or a number >= 0; "entropy", "aux", "z", "seq_aux" not
           null or a number; "exchange_s", "expert_s" (if a number) outside [0, 1e7];
           "coactivation" not null or E*(E-1)/2 integers >= 0; "micro_counts" not null or
           arrays of E integers >= 0 that sum to "counts"; "ranks" not an integer in
           [1, 65536]; "received_rows" (integers >= 0) and "exchange_wait_s" (seconds in
           [0, 1e7]) not one entry per rank, the same number in every record;
  metrics.jsonl  "step" as above, strictly increasing; "loss", "ce", "aux", "z", "val_loss",
           "max_over_mean", "drop_frac" not null or a number; "lr", "grad_norm",
           "tokens_per_s", "capacity_factor" not null or a number >= 0; "step_s" not null or
           seconds in [0, 1e7]; "time" not an object of seconds in [0, 1e7]; "skipped" not
           null or a boolean; "skipped_total" not null or an integer >= 0;
           "capacity_decision" not null or an object whose "old", "new", "p99_need" are null
           or numbers >= 0.
Numbers must be finite (moe writes NaN and Inf as null).
"""
import json
import math
import os
import re
import stat
import sys

# what the scripts' --help says of these rules
HELP = ("The logs are checked first, by the rules of `moe stats` (scripts/moe_logs.py lists "
        "them): exit status 1 and one message naming the file (and the line) for a FIFO, device "
        "or folder in place of a log, a file over 64 GiB or a line over 256 MiB, NUL bytes, "
        "bytes that are not UTF-8, a line that is not one JSON object or nests deeper than 64, "
        "a \"step\" that is not an integer in [1, 2^53] or does not increase (per layer), a "
        "\"layer\" outside the config's n_layers, \"counts\" that are not E integers >= 0 (E: the "
        "config's n_experts), a negative or non-finite number where a count, a rate or seconds "
        "belong, a \"coactivation\" or \"micro_counts\" that does not fit the counts. A partial "
        "last line (a run writing it) is skipped with a note.")

MAX_FILE = 64 << 30     # bytes
MAX_LINE = 256 << 20    # bytes, without the newline
MAX_DEPTH = 64          # JSON nesting
MAX_COUNT = 2 ** 53     # counts, tokens, steps: exact in a double
MAX_LAYERS = 65536      # layers and experts when config.cfg does not say
MAX_EXPERTS = 65536
MAX_RANKS = 65536
MAX_SECONDS = 1e7
INF = math.inf


class LogError(Exception):
    """A damaged log or run directory; the message names the file and, for a line's fault,
    the line (PATH:LINE: what)."""


# ---- files and lines ----------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _check_regular(path, st):
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a plain file")
        raise LogError(f"{path}: not a regular file ({kind})")
    if st.st_size > MAX_FILE:
        raise LogError(f"{path}: {st.st_size} bytes, larger than the 64 GiB a log may have")


def open_regular(path):
    """path opened for reading in binary, or None when it does not exist; LogError when it is
    not a regular file (a FIFO is refused before it is opened, so nothing blocks) or too big."""
    try:
        _check_regular(path, os.stat(path))
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LogError(f"{path}: cannot open: {e.strerror}")
    try:
        _check_regular(path, os.fstat(fd))  # the file opened is the one checked
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _int(text):
    # as cJSON reads them (a double); also spares Python's limit on long integer literals
    return int(text) if len(text) <= 100 else float(text)


class _Duplicate(Exception):
    pass


def _unique_keys(pairs):
    # a repeated key is refused, as moe.c refuses it (cJSON would find the first, json the last)
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise _Duplicate(k)
        obj[k] = v
    return obj


def _json_type(v):
    if isinstance(v, bool):
        return "boolean"
    return {list: "array", str: "string", int: "number", float: "number"}.get(type(v), "null")


def _too_deep(obj):
    stack = [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        for v in (o.values() if isinstance(o, dict) else o):
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
    return False


class Lines:
    """The JSON objects of a log, as (line number, object), read on from where the previous
    call stopped (a run in progress keeps writing). read(final=False) leaves an unfinished last
    line for the next call; read(final=True) takes it when it parses and otherwise skips it with
    a note on stderr (a write in progress)."""

    def __init__(self, path, prog):
        self.path, self.prog = path, prog
        self.pos, self.line, self.rest = 0, 0, b""
        self.exists = False

    def _object(self, raw, last):
        """The object of line self.line; None for a blank line or an unfinished last line."""
        where = f"{self.path}:{self.line}"
        if b"\0" in raw:
            col = raw.index(b"\0") + 1
            raise LogError(f"{where}: NUL byte at column {col}")
        text = raw.strip()
        if not text:
            return None
        try:
            obj = json.loads(text.decode("utf-8"), parse_constant=_no_constant, parse_int=_int,
                             object_pairs_hook=_unique_keys)
        except RecursionError:
            raise LogError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
        except _Duplicate as e:
            raise LogError(f'{where}: key "{e.args[0]}" appears twice in an object')
        except UnicodeDecodeError as e:
            if last:
                return None
            raise LogError(f"{where}: not UTF-8 (byte {e.start + 1} of the line)")
        except ValueError as e:
            if last:
                return None
            what = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            start = text[:60].decode("utf-8", "replace")
            raise LogError(f"{where}: not a JSON object ({what}): {start!r}"
                           f"{'...' if len(text) > 60 else ''}")
        if not isinstance(obj, dict):
            raise LogError(f"{where}: not a JSON object (a JSON {_json_type(obj)})")
        if _too_deep(obj):
            raise LogError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
        return obj

    def _read(self, f, out):
        f.seek(self.pos)
        while True:
            raw = f.readline(MAX_LINE + 2 - len(self.rest))  # the line and its newline
            if not raw:
                break
            self.pos += len(raw)
            raw, self.rest = self.rest + raw, b""
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_LINE:
                    raise LogError(f"{self.path}:{self.line + 1}: line longer than 256 MiB")
                self.rest = raw  # the end of the file: an unfinished line
                break
            self.line += 1
            if len(raw) > MAX_LINE + 1:
                raise LogError(f"{self.path}:{self.line}: line longer than 256 MiB")
            obj = self._object(raw, False)
            if obj is not None:
                out.append((self.line, obj))

    def read(self, final=True):
        """The (line number, object) pairs of the lines added since the last call."""
        f = open_regular(self.path)
        if f is None:
            return []
        self.exists = True
        out = []
        try:
            with f:
                self._read(f, out)
        except OSError as e:
            raise LogError(f"{self.path}: read failed: {e.strerror or e}")
        if final and self.rest:
            raw, self.rest = self.rest, b""
            self.line += 1
            obj = self._object(raw, True)
            if obj is not None:
                out.append((self.line, obj))
            elif raw.strip():
                print(f"{self.prog}: note: {self.path}:{self.line}: partial last line ignored "
                      "(run in progress?)", file=sys.stderr)
        return out


# ---- the run's config ---------------------------------------------------------------

def run_config(run_dir):
    """{"n_layers", "n_experts", "steps"}: those of RUN_DIR/config.cfg (the libconfig text moe
    writes) that it gives; {} without the file."""
    path = os.path.join(run_dir, "config.cfg")
    f = open_regular(path)
    if f is None:
        return {}
    with f:
        try:
            text = f.read(MAX_LINE + 1).decode("utf-8", "replace")
        except OSError as e:
            raise LogError(f"{path}: cannot read: {e.strerror}")
    out = {"path": path}
    for group, key, hi in (("model", "n_layers", MAX_LAYERS), ("model", "n_experts", MAX_EXPERTS),
                           ("train", "steps", MAX_COUNT)):
        g = re.search(r"(?m)^\s*%s\s*[=:]\s*\{([^}]*)\}" % group, text)
        m = g and re.search(r"(?<![\w.])%s\s*[=:]\s*(\d{1,20})L?\s*;" % key, g.group(1))
        if m and 1 <= int(m.group(1)) <= hi:
            out[key] = int(m.group(1))
    return out


# ---- fields -------------------------------------------------------------------------

def _show(v):
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "an array"
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v, lo, hi):
    return (_is_number(v) and (isinstance(v, int) or (math.isfinite(v) and v.is_integer()))
            and lo <= v <= hi)


def _range(lo, hi):
    if hi == INF:
        return "" if lo == -INF else f" >= {lo:g}"
    return f" in [{lo:g}, {hi:g}]".replace("e+0", "e")  # [0, 1e7]


class _Record:
    """One record's fields; errors name the file, the line and the field."""

    def __init__(self, where, rec):
        self.where, self.rec = where, rec

    def bad(self, label, what):
        return LogError(f"{self.where}: {label} {what}")

    def integer(self, key, lo, hi, required=False):
        """rec[key]: an integer in [lo, hi]; None when null or absent (unless required)."""
        v = self.rec.get(key)
        if v is None and not required:
            return None
        if key not in self.rec:
            raise self.bad(f'"{key}"', "is missing")
        if not _is_int(v, lo, hi):
            raise self.bad(f'"{key}"', f"= {_show(v)} is not an integer in [{lo}, {hi}]")
        return int(v)

    def number(self, key, lo=-INF, hi=INF):
        """rec[key]: null, absent or a finite number in [lo, hi]."""
        return self.value(f'"{key}"', self.rec.get(key), lo, hi)

    def value(self, label, v, lo=-INF, hi=INF):
        if v is not None and not (_is_number(v) and math.isfinite(v) and lo <= v <= hi):
            raise self.bad(label, f"= {_show(v)} is not a finite number{_range(lo, hi)}")
        return v

    def counts(self, key, a, n, what="one per expert"):
        """a (rec[key] or a part of it): an array of n integers in [0, 2^53]."""
        if not isinstance(a, list):
            raise self.bad(f'"{key}"', "is missing" if key not in self.rec else
                           f"= {_show(a)} is not an array")
        if len(a) != n:
            raise self.bad(f'"{key}"', f"has {len(a)} entries, expected {n} ({what})")
        for e, c in enumerate(a):
            if not _is_int(c, 0, MAX_COUNT):
                raise self.bad(f'"{key}"', f"entry {e} is not a non-negative integer: {_show(c)}")
        return a


class LoadChecker:
    """The rules of expert_load.jsonl records (the module's docstring); call it on each
    (line number, record) in file order. config: run_config()'s."""

    def __init__(self, path, config):
        self.path, self.cfg = path, config
        self.E = config.get("n_experts")
        self.ranks = None   # the entries of received_rows / exchange_wait_s
        self.last = {}      # layer: its last step

    def _of_config(self, key):
        return f"model.{key} = {self.cfg[key]} of {self.cfg['path']}"

    def __call__(self, lineno, rec):
        r = _Record(f"{self.path}:{lineno}", rec)
        step = r.integer("step", 1, MAX_COUNT, required=True)
        layer = r.integer("layer", 0, MAX_LAYERS - 1, required=True)
        if "n_layers" in self.cfg and layer >= self.cfg["n_layers"]:
            raise r.bad('"layer"', f"= {layer}, but the run has {self._of_config('n_layers')}")
        counts = rec.get("counts")
        if self.E is None:  # no config: the first record says how many experts there are
            if not isinstance(counts, list):
                r.counts("counts", counts, 0)  # its message
            if not 1 <= len(counts) <= MAX_EXPERTS:
                raise r.bad('"counts"', f"has {len(counts)} entries (expected 1..{MAX_EXPERTS} "
                            "experts)")
            self.E = len(counts)
        E = self.E
        r.counts("counts", counts, E, self._of_config("n_experts") if "n_experts" in self.cfg
                 else "one per expert, as in the first record")
        kept = rec.get("kept")
        if kept is not None:
            r.counts("kept", kept, E)
            for e, (k, c) in enumerate(zip(kept, counts)):
                if k > c:
                    raise r.bad('"kept"', f'entry {e} = {_show(k)} is above "counts" entry {e} = '
                                f'{_show(c)}')
        r.integer("tokens", 0, MAX_COUNT)
        r.integer("capacity", 0, MAX_COUNT)
        for k in ("dropped", "max_over_mean", "cv", "exchange_bytes"):
            r.number(k, 0)
        for k in ("entropy", "aux", "z", "seq_aux"):
            r.number(k)
        r.number("exchange_s", 0, MAX_SECONDS)
        if _is_number(rec.get("expert_s")):
            r.number("expert_s", 0, MAX_SECONDS)
        if rec.get("coactivation") is not None:
            r.counts("coactivation", rec["coactivation"], E * (E - 1) // 2,
                     "E*(E-1)/2: the expert pairs")
        micro = rec.get("micro_counts")
        if micro is not None:
            if not isinstance(micro, list) or not micro:
                raise r.bad('"micro_counts"', f"= {_show(micro)} is not an array of micro-batches' "
                            "counts")
            for row in micro:
                r.counts("micro_counts", row, E)
            for e in range(E):
                s = sum(row[e] for row in micro)
                if s != counts[e]:
                    raise r.bad('"micro_counts"', f'sums to {_show(s)} for expert {e}, but "counts" '
                                f"has {_show(counts[e])}")
        ranks = r.integer("ranks", 1, MAX_RANKS)  # expert parallelism
        if ranks is not None:
            if self.ranks is not None and ranks != self.ranks:
                raise r.bad('"ranks"', f"= {ranks}, but the records before have {self.ranks} ranks")
            self.ranks = ranks
        rows, wait = rec.get("received_rows"), rec.get("exchange_wait_s")
        if rows is not None or wait is not None:  # one entry per rank
            n = self.ranks or (len(rows) if isinstance(rows, list) and rows else 1)
            r.counts("received_rows", rows, n, "one per rank")
            if not isinstance(wait, list) or len(wait) != n:
                raise r.bad('"exchange_wait_s"', f"is not an array of {n} entries (one per rank)")
            for e, v in enumerate(wait):
                r.value(f'"exchange_wait_s" entry {e}', v, 0, MAX_SECONDS)
            self.ranks = n
        prev = self.last.get(layer)
        if prev is not None and step <= prev:
            raise LogError(f"{r.where}: step {step} of layer {layer} comes after step {prev} "
                           "(steps must increase)")
        self.last[layer] = step


class MetricsChecker:
    """The rules of metrics.jsonl records (the module's docstring)."""

    def __init__(self, path, config=None):
        self.path, self.last = path, None

    def __call__(self, lineno, rec):
        r = _Record(f"{self.path}:{lineno}", rec)
        step = r.integer("step", 1, MAX_COUNT, required=True)
        for k in ("loss", "ce", "aux", "z", "val_loss", "max_over_mean", "drop_frac"):
            r.number(k)
        for k in ("lr", "grad_norm", "tokens_per_s", "capacity_factor"):
            r.number(k, 0)
        r.number("step_s", 0, MAX_SECONDS)
        t = rec.get("time")
        if "time" in rec and not isinstance(t, dict):
            raise r.bad('"time"', f"= {_show(t)} is not an object (seconds per phase)")
        for k, v in (t or {}).items():
            r.value(f'"time" entry "{k}"', v, 0, MAX_SECONDS)
        sk = rec.get("skipped")
        if sk is not None and not isinstance(sk, bool):
            raise r.bad('"skipped"', f"= {_show(sk)} is not a boolean")
        r.integer("skipped_total", 0, MAX_COUNT)
        d = rec.get("capacity_decision")
        if d is not None:
            if not isinstance(d, dict):
                raise r.bad('"capacity_decision"', f"= {_show(d)} is not an object")
            for k in ("old", "new", "p99_need"):
                r.value(f'"capacity_decision" entry "{k}"', d.get(k), 0)
        if self.last is not None and step <= self.last:
            raise LogError(f"{r.where}: step {step} comes after step {self.last} "
                           "(steps must increase)")
        self.last = step


class Log:
    """A log of the run, its lines checked as they are read."""

    def __init__(self, run_dir, name, prog, config):
        self.path = os.path.join(run_dir, name)
        self.lines = Lines(self.path, prog)
        checker = LoadChecker if name == "expert_load.jsonl" else MetricsChecker
        self.check = checker(self.path, config)

    def read(self, final=True):
        """The records added since the last call (see Lines.read), checked."""
        out = []
        for lineno, rec in self.lines.read(final):
            self.check(lineno, rec)
            out.append(rec)
        return out

    @property
    def exists(self):
        return self.lines.exists


def read_log(run_dir, name, prog, config, required):
    """The checked records of RUN_DIR/name; a missing file is an error when required, else []."""
    log = Log(run_dir, name, prog, config)
    recs = log.read()
    if required and not log.exists:
        raise LogError(f"{log.path}: cannot open: no such file")
    return recs


def dropped(rec):
    """The dropped assignments of an expert-load record: "dropped", else counts - kept, else
    None."""
    d = rec.get("dropped")
    if d is None and isinstance(rec.get("kept"), list):
        d = sum(rec["counts"]) - sum(rec["kept"])
    return d
