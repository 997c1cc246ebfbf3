#!/usr/bin/env python3
"""scripts/plot_load.py and scripts/tensorboard.py on damaged run directories: each damage
(binary bytes, NUL bytes, lines that are not one JSON object, nesting 10000 deep, wrong types,
negative, fractional or huge numbers, a layer beyond the config, repeated or decreasing steps,
wrong-sized co-activations, micro-batch counts that do not sum, a FIFO, a device, a folder,
a line over 256 MiB, a file over 64 GiB, ...) must give exit status 1 and one message naming
the file and (where a line is at fault) the line, never a traceback, within a time limit (a
FIFO must not block). A partial last line, blank lines and a last line without its newline are
accepted (exit 0), as are the valid run directories: a real `moe train` run (3 steps, 2 layers,
grad_accum 2, co-activations every step) when MOE is given (else hand-made logs in its format
take its place: the damage applies to them), and a hand-made one with the fields of expert
parallelism, a skipped step and a capacity decision.

  damaged_logs.py SCRIPTS_DIR WORKDIR PLOT_PYTHON TB_PYTHON [MOE]

PLOT_PYTHON runs plot_load.py (Debian's /usr/bin/python3 with python3-matplotlib), TB_PYTHON
tensorboard.py (the venv of scripts/install_hf5.sh, with tensorboardX). An interpreter that
is missing is replaced by this one: both scripts check the logs before importing their
libraries, so the damaged cases are checked anyway; where a library is missing the accepted
cases exit 77 and so does this test (skip) after every other check passed.
"""
import json
import os
import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

MAX_LINE = 256 << 20
TIMEOUT = 30  # seconds per script run: a damaged case takes 0.1, a conversion a few

CONFIG = """# moe.c training config, resolved: every key, defaults included.
model = {
  vocab_size = 256;
  d_model = 32;
  n_layers = 2;
  n_heads = 4;
  d_ff = 32;
  n_experts = 4;
  top_k = 2;
  max_seq_len = 32;
  capacity_factor = 1.0;
};

train = {
  steps = 3;
  batch_size = 2;
  seq_len = 32;
  grad_accum = 2;
  warmup_steps = 0;
  eval_interval = 2;
  threads = 1;
};
"""


def dumps(rec):
    return json.dumps(rec, separators=(",", ":")).encode()  # NaN / Infinity where planted


# ---- the valid run directories -----------------------------------------------------------

def real_run(moe, work):
    """A 3-step run of moe: (config text, expert_load lines, metrics lines), or None."""
    d = os.path.join(work, "train")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rnd = random.Random(3)
    with open(os.path.join(d, "text.txt"), "w") as f:
        f.write("".join(rnd.choice("abcdefgh ijklmnop,.\n") for _ in range(40000)))
    cfg = os.path.join(d, "t.cfg")
    with open(cfg, "w") as f:
        f.write(CONFIG.split("\n", 1)[1] + 'data = { dir = "%s/data"; text = ["%s/text.txt"]; };\n'
                'log = { dir = "%s/run"; interval = 1; };\n' % (d, d, d))
    r = subprocess.run([moe, "train", cfg], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit("damaged_logs: moe train failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    run = os.path.join(d, "run")

    def lines(name):
        return open(os.path.join(run, name), "rb").read().splitlines()

    return open(os.path.join(run, "config.cfg")).read(), lines("expert_load.jsonl"), lines("metrics.jsonl")


def hand_run(ep):
    """The logs of CONFIG as moe writes them (3 steps; ep: 2 ranks, step 2 skipped, a capacity
    decision at step 4, 4 steps then)."""
    rnd = random.Random(7)
    steps = [1, 3, 4] if ep else [1, 2, 3]
    load, metrics = [], []
    for s in range(1, steps[-1] + 1):
        if s not in steps:
            metrics.append(dumps({"step": s, "loss": None, "grad_norm": None, "skipped": True,
                                  "skipped_total": 1}))
            continue
        for layer in range(2):
            micro = [[rnd.randint(20, 44) for _ in range(4)] for _ in range(2)]
            counts = [a + b for a, b in zip(*micro)]
            kept = [min(c, 64) for c in counts]
            co = [rnd.randint(0, 30) for _ in range(6)]
            r = {"step": s, "layer": layer, "tokens": 128, "capacity": 64, "counts": counts,
                 "kept": kept, "micro_counts": micro, "dropped": sum(counts) - sum(kept),
                 "max_over_mean": max(counts) / (sum(counts) / 4), "cv": 0.15, "entropy": 1.38,
                 "aux": 0.01, "z": 0.002, "seq_aux": 0, "bias": None, "logit_mean": -0.006,
                 "logit_std": 0.11, "logit_max_abs": 0.33, "lse_mean": 1.385,
                 "expert_s": {"max": 2e-05, "max_expert": 0, "min": 1.6e-05, "min_expert": 2,
                              "all": 7.8e-05}, "coactivation": co, "coactivation_steps": 1}
            if ep:
                r.update({"ranks": 2, "exchange_bytes": 8192, "exchange_s": 0.002,
                          "exchange_wait_s": [0.001, 0.002], "received_rows": [120, 136],
                          "exchange_matrix": [[0, 4096], [4096, 0]]})
            else:
                r.update({"exchange_bytes": 0, "exchange_s": 0})
            load.append(dumps(r))
        m = {"step": s, "loss": 5.56, "ce": 5.54, "aux": 0.02, "z": 0.0038, "lr": 0.0003,
             "grad_norm": 0.85, "tokens_per_s": 114082.8, "step_s": 0.0011, "max_over_mean": 1.2,
             "drop_frac": 0.07, "skipped_total": 1 if ep and s > 2 else 0, "capacity_factor": 1.25,
             "time": {"attention": 0.0004, "router": 9e-05, "dispatch": 1e-05, "experts": 0.00016,
                      "combine": 2e-05, "dense": 0.00025, "optimizer": 1e-04, "exchange_wait": 0,
                      "validation": 0, "checkpoint": 0}}
        if s == 2:
            m["val_loss"] = 5.54
        if ep and s == 4:
            m["capacity_decision"] = {"old": 2.0, "new": 1.6, "p99_need": 1.4, "layer": 1,
                                      "why": "window P99 need"}
        metrics.append(dumps(m))
    return load, metrics


# ---- the damage ---------------------------------------------------------------------------

L, M, C = "expert_load.jsonl", "metrics.jsonl", "config.cfg"
EXPECT_ERROR = {"plot": 1, "tb": 1}
ACCEPT = {"plot": 0, "tb": 0}


class Case:
    def __init__(self, name, file, line, setup, want=None, rc=EXPECT_ERROR, note=()):
        self.name, self.file, self.line, self.setup, self.want, self.rc = name, file, line, setup, want, rc
        self.note = note  # the files whose partial last line is skipped with a note
        self.steps = 3     # the steps an accepted run directory has


def rec(file, line, fn):
    """Damages record `line` of `file`: fn(record) edits it."""
    def setup(d, logs):
        r = json.loads(logs[file][line - 1])
        fn(r)
        logs[file][line - 1] = dumps(r)
    return setup


def raw(file, line, data):
    """Replaces line `line` of `file` by data (bytes, or a function of the old line)."""
    def setup(d, logs):
        logs[file][line - 1] = data(logs[file][line - 1]) if callable(data) else data
    return setup


def setitem(key, value):
    return lambda r: r.__setitem__(key, value)


def entry(key, i, value):
    return lambda r: r[key].__setitem__(i, value)


def delete(key):
    return lambda r: r.pop(key)


def replace_value(key, text):
    """The record's JSON with key's value written as text (literals json.dumps would not write)."""
    def fn(old):
        r = json.loads(old)
        r[key] = "@@"
        return dumps(r).replace(b'"@@"', text)
    return fn


def nested(depth):
    return b'{"step":2,"layer":0,"counts":[1,2,3,4],"x":' + b"[" * depth + b"]" * depth + b"}"


def special(kind, file):
    """file replaced by a FIFO, a symlink to /dev/zero or a folder."""
    def setup(d, logs):
        logs.pop(file)
        p = os.path.join(d, file)
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dev_zero":
            os.symlink("/dev/zero", p)
        else:
            os.mkdir(p)
    return setup


def huge_line(d, logs):
    """Line 2: a record over 256 MiB (a sparse file: its middle reads as NUL bytes)."""
    head = logs[L][0] + b'\n{"step":2,'
    logs["after"] = lambda: _sparse(os.path.join(d, L), head, len(head) + MAX_LINE, b'}\n')


def huge_file(d, logs):
    """Valid lines, then a hole: 64 GiB and one byte (sparse)."""
    logs["after"] = lambda: _sparse(os.path.join(d, L), b"\n".join(logs[L]) + b"\n", 64 << 30, b"\n")


def _sparse(path, head, size, tail):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
        f.seek(size)
        f.write(tail)


def partial(file, cut=0.5):
    """A last line cut short (no newline): a write in progress."""
    def setup(d, logs):
        last = logs[file][-1]
        logs[file].append(last[:int(len(last) * cut)])
        logs.setdefault("no_newline", []).append(file)
    return setup


def accepted(d, logs):
    """Blank lines in both logs, a partial last line in expert_load.jsonl (a record cut short,
    no newline), metrics.jsonl's last line complete but without its newline."""
    logs[L].insert(2, b"")
    logs[L].insert(3, b"   \t")
    logs[M].insert(1, b"")
    partial(L)(d, logs)
    logs["no_newline"].append(M)


def drop_file(file):
    def setup(d, logs):
        logs.pop(file)
    return setup


def empty_file(file):
    def setup(d, logs):
        logs[file] = []
    return setup


def config_text(fn):
    def setup(d, logs):
        logs[C] = fn(logs[C])
    return setup


def counts_as_strings(r):
    r["counts"] = [str(c) for c in r["counts"]]


def co_short(r):
    r["coactivation"].pop()


def micro_off(r):
    r["micro_counts"][0][1] += 1


def kept_above(r):
    r["kept"][0] = r["counts"][0] + 1


def ep_fields(rows, wait):
    return lambda r: r.update({"ranks": 2, "received_rows": rows, "exchange_wait_s": wait})


def cases():
    # expert_load.jsonl: line 3 is step 2, layer 0 (lines 1, 2: step 1, layers 0 and 1)
    c = [
        Case("binary_bytes", L, 3, raw(L, 3, b"\x89PNG\r\x1a\xff\xfe garbage \x80\x81"), "not UTF-8"),
        Case("nul_byte", L, 3, raw(L, 3, lambda o: o[:1] + b"\0" + o[1:]), "NUL"),
        Case("nul_tail", L, 3, raw(L, 3, lambda o: o + b"\0\0\0\0"), "NUL"),
        Case("duplicate_key", L, 3, raw(L, 3, lambda o: o[:-1] + b',"layer":0}'),
             'key "layer" appears twice'),
        Case("whole_file_binary", L, 1, lambda d, logs: logs.__setitem__(
            L, [b"\x8b\x1f" + random.Random(5).randbytes(8192)])),
        Case("not_json", L, 3, raw(L, 3, b"{oops"), "not a JSON object"),
        Case("truncated_middle_line", L, 3, raw(L, 3, lambda o: o[:len(o) // 2]), "not a JSON object"),
        Case("utf8_bom", L, 3, raw(L, 3, lambda o: b"\xef\xbb\xbf" + o), "not a JSON object"),
        Case("array_line", L, 3, raw(L, 3, b"[1,2,3]"), "not a JSON object"),
        Case("number_line", L, 3, raw(L, 3, b"42"), "not a JSON object"),
        Case("string_line", L, 3, raw(L, 3, b'"step"'), "not a JSON object"),
        Case("null_line", L, 3, raw(L, 3, b"null"), "not a JSON object"),
        Case("nesting_10000", L, 3, raw(L, 3, nested(10000)), "nested deeper"),
        Case("nesting_100", L, 3, raw(L, 3, nested(100)), "nested deeper"),
        Case("nan_literal", L, 3, raw(L, 3, replace_value("aux", b"NaN")), "NaN is not JSON"),
        Case("infinity_literal", L, 3, raw(L, 3, replace_value("z", b"-Infinity")), "-Infinity is not JSON"),
        Case("number_overflow_1e999", L, 3, raw(L, 3, replace_value("entropy", b"1e999")),
             '"entropy" = Infinity is not a finite number'),
        Case("integer_5000_digits", L, 3, raw(L, 3, replace_value("tokens", b"1" * 5000)),
             '"tokens" = Infinity is not an integer'),
        Case("counts_strings", L, 3, rec(L, 3, counts_as_strings),
             '"counts" entry 0 is not a non-negative integer: "'),
        Case("counts_string", L, 3, rec(L, 3, setitem("counts", "1,2,3,4")), '"counts" = "1,2,3,4" is not'),
        Case("counts_missing", L, 3, rec(L, 3, delete("counts")), '"counts" is missing'),
        Case("counts_short", L, 3, rec(L, 3, lambda r: r["counts"].pop()), '"counts" has 3 entries'),
        Case("counts_empty", L, 3, rec(L, 3, setitem("counts", [])), '"counts" has 0 entries'),
        Case("counts_negative", L, 3, rec(L, 3, entry("counts", 2, -1)),
             '"counts" entry 2 is not a non-negative integer: -1'),
        Case("counts_fraction", L, 3, rec(L, 3, entry("counts", 2, 2.5)),
             '"counts" entry 2 is not a non-negative integer: 2.5'),
        Case("counts_1e300", L, 3, rec(L, 3, entry("counts", 2, 1e300)),
             '"counts" entry 2 is not a non-negative integer: 1e+300'),
        Case("counts_2^53+2", L, 3, rec(L, 3, entry("counts", 1, 2 ** 53 + 2)),
             '"counts" entry 1 is not a non-negative integer: 9007199254740994'),
        Case("counts_bool", L, 3, rec(L, 3, entry("counts", 0, True)),
             '"counts" entry 0 is not a non-negative integer: true'),
        Case("counts_null_entry", L, 3, rec(L, 3, entry("counts", 3, None)),
             '"counts" entry 3 is not a non-negative integer: null'),
        Case("step_missing", L, 3, rec(L, 3, delete("step")), '"step" is missing'),
        Case("step_1e300", L, 3, rec(L, 3, setitem("step", 1e300)), '"step" = 1e+300 is not'),
        Case("step_0", L, 3, rec(L, 3, setitem("step", 0)), '"step" = 0 is not'),
        Case("step_2.5", L, 3, rec(L, 3, setitem("step", 2.5)), '"step" = 2.5 is not'),
        Case("step_true", L, 3, rec(L, 3, setitem("step", True)), '"step" = true is not'),
        Case("step_string", L, 3, rec(L, 3, setitem("step", "2")), '"step" = "2" is not'),
        Case("step_negative", L, 3, rec(L, 3, setitem("step", -2)), '"step" = -2 is not'),
        Case("step_2^53+2", L, 3, rec(L, 3, setitem("step", 2 ** 53 + 2)),
             '"step" = 9007199254740994 is not'),
        Case("layer_missing", L, 3, rec(L, 3, delete("layer")), '"layer" is missing'),
        Case("layer_99", L, 3, rec(L, 3, setitem("layer", 99)), "n_layers = 2"),
        Case("layer_2_beyond_config", L, 3, rec(L, 3, setitem("layer", 2)), "n_layers = 2"),
        Case("layer_1e300", L, 3, rec(L, 3, setitem("layer", 1e300)), '"layer" = 1e+300 is not'),
        Case("layer_negative", L, 3, rec(L, 3, setitem("layer", -1)), '"layer" = -1 is not'),
        Case("layer_0.5", L, 3, rec(L, 3, setitem("layer", 0.5)), '"layer" = 0.5 is not'),
        Case("layer_string", L, 3, rec(L, 3, setitem("layer", "0")), '"layer" = "0" is not'),
        Case("step_repeated", L, 3, rec(L, 3, setitem("step", 1)), "step 1 of layer 0 comes after step 1"),
        Case("step_decreasing", L, 5, rec(L, 5, setitem("step", 1)), "step 1 of layer 0 comes after step 2"),
        Case("kept_above_counts", L, 3, rec(L, 3, kept_above), 'is above "counts" entry 0'),
        Case("kept_negative", L, 3, rec(L, 3, entry("kept", 1, -3)),
             '"kept" entry 1 is not a non-negative integer: -3'),
        Case("kept_short", L, 3, rec(L, 3, lambda r: r["kept"].pop()), '"kept" has 3 entries'),
        Case("tokens_negative", L, 3, rec(L, 3, setitem("tokens", -1)), '"tokens" = -1 is not'),
        Case("tokens_string", L, 3, rec(L, 3, setitem("tokens", "128")), '"tokens" = "128" is not'),
        Case("capacity_fraction", L, 3, rec(L, 3, setitem("capacity", 3.5)), '"capacity" = 3.5 is not'),
        Case("dropped_negative", L, 3, rec(L, 3, setitem("dropped", -1)), '"dropped" = -1 is not'),
        Case("dropped_string", L, 3, rec(L, 3, setitem("dropped", "3")), '"dropped" = "3" is not'),
        Case("entropy_string", L, 3, rec(L, 3, setitem("entropy", "high")), '"entropy" = "high" is not'),
        Case("aux_bool", L, 3, rec(L, 3, setitem("aux", True)), '"aux" = true is not'),
        Case("seq_aux_array", L, 3, rec(L, 3, setitem("seq_aux", [1])), '"seq_aux" = an array is not'),
        Case("max_over_mean_negative", L, 3, rec(L, 3, setitem("max_over_mean", -1)),
             '"max_over_mean" = -1 is not'),
        Case("exchange_bytes_string", L, 3, rec(L, 3, setitem("exchange_bytes", "0")),
             '"exchange_bytes" = "0" is not'),
        Case("exchange_s_negative", L, 3, rec(L, 3, setitem("exchange_s", -1)), '"exchange_s" = -1 is not'),
        Case("exchange_s_1e300", L, 3, rec(L, 3, setitem("exchange_s", 1e300)),
             '"exchange_s" = 1e+300 is not'),
        Case("expert_s_negative", L, 3, rec(L, 3, setitem("expert_s", -5)), '"expert_s" = -5 is not'),
        Case("coactivation_wrong_size", L, 3, rec(L, 3, co_short), '"coactivation" has 5 entries'),
        Case("coactivation_negative", L, 3, rec(L, 3, entry("coactivation", 0, -1)),
             '"coactivation" entry 0 is not a non-negative integer: -1'),
        Case("coactivation_string", L, 3, rec(L, 3, setitem("coactivation", "x")),
             '"coactivation" = "x" is not'),
        Case("micro_counts_not_summing", L, 3, rec(L, 3, micro_off), '"micro_counts" sums to'),
        Case("micro_counts_short_row", L, 3, rec(L, 3, lambda r: r["micro_counts"][0].pop()),
             '"micro_counts" has 3 entries'),
        Case("micro_counts_number", L, 3, rec(L, 3, setitem("micro_counts", 5)), '"micro_counts" = 5 is not'),
        Case("micro_counts_string_entry", L, 3, rec(L, 3, lambda r: r["micro_counts"][1].__setitem__(0, "1")),
             '"micro_counts" entry 0 is not a non-negative integer: "1"'),
        Case("ranks_zero", L, 3, rec(L, 3, setitem("ranks", 0)), '"ranks" = 0 is not'),
        Case("received_rows_vs_wait", L, 3, rec(L, 3, ep_fields([1, 2], [0.1])),
             '"exchange_wait_s" is not an array of 2 entries'),
        Case("exchange_wait_negative", L, 3, rec(L, 3, ep_fields([1, 2], [0.1, -1])),
             '"exchange_wait_s" entry 1 = -1 is not a finite number in [0, 1e7]'),
        Case("received_rows_negative", L, 3, rec(L, 3, ep_fields([1, -2], [0.1, 0.2])),
             '"received_rows" entry 1 is not a non-negative integer: -2'),
        Case("ranks_change", L, 4, lambda d, logs: (rec(L, 3, setitem("ranks", 2))(d, logs),
                                                    rec(L, 4, setitem("ranks", 3))(d, logs)),
             '"ranks" = 3, but the records before have 2 ranks'),
        Case("received_rows_count_changes", L, 4, lambda d, logs: (
            rec(L, 3, ep_fields([1, 2], [0.1, 0.2]))(d, logs),
            rec(L, 4, lambda r: r.update(received_rows=[1, 2, 3], exchange_wait_s=[0, 0, 0]))(d, logs)),
             '"received_rows" has 3 entries, expected 2 (one per rank)'),
        Case("load_fifo", L, None, special("fifo", L), "not a regular file (a FIFO)"),
        Case("load_dev_zero_symlink", L, None, special("dev_zero", L),
             "not a regular file (a character device)"),
        Case("load_folder", L, None, special("folder", L), "not a regular file (a folder)"),
        Case("load_huge_line", L, 2, huge_line, "longer than 256 MiB"),
        Case("load_huge_file", L, None, huge_file, "larger than the 64 GiB"),
        # (tensorboard.py converts a run without expert-load records: not run on these, each
        # conversion takes seconds; valid_run covers converting)
        Case("load_empty", L, None, empty_file(L), "no expert-load records", rc={"plot": 1}),
        Case("load_missing", L, None, drop_file(L), "no such file", rc={"plot": 1}),
        Case("experts_change_without_config", L, 3, lambda d, logs: (
            logs.pop(C), rec(L, 3, lambda r: r["counts"].pop())(d, logs)),
            '"counts" has 3 entries, expected 4 (one per expert, as in the first record)'),
        Case("layer_65536_without_config", L, 3, lambda d, logs: (
            logs.pop(C), rec(L, 3, setitem("layer", 65536))(d, logs)),
            '"layer" = 65536 is not an integer in [0, 65535]'),
        Case("config_n_experts_8", L, 1, config_text(lambda t: t.replace("n_experts = 4;", "n_experts = 8;")),
             "expected 8 (model.n_experts = 8"),
        Case("config_fifo", C, None, special("fifo", C), "not a regular file (a FIFO)"),
        # accepted (each converted, seconds each: one run directory has them all)
        Case("partial_last_line_blank_lines_no_newline", L, None, accepted, rc=ACCEPT, note=(L,)),
        # metrics.jsonl: line 2 is step 2
        Case("m_binary_bytes", M, 2, raw(M, 2, b"\xc3\x28\xa0\xa1 binary"), "not UTF-8"),
        Case("m_nul_byte", M, 2, raw(M, 2, lambda o: o[:10] + b"\0" + o[10:]), "NUL"),
        Case("m_array_line", M, 2, raw(M, 2, b"[]"), "not a JSON object"),
        Case("m_nesting_10000", M, 2, raw(M, 2, b'{"step":2,"x":' + b"{\"a\":" * 10000 + b"1" + b"}" * 10001),
             "nested deeper"),
        Case("m_step_missing", M, 2, rec(M, 2, delete("step")), '"step" is missing'),
        Case("m_step_1e300", M, 2, rec(M, 2, setitem("step", 1e300)), '"step" = 1e+300 is not'),
        Case("m_step_repeated", M, 2, rec(M, 2, setitem("step", 1)), "step 1 comes after step 1"),
        Case("m_step_decreasing", M, 3, rec(M, 3, setitem("step", 1)), "step 1 comes after step 2"),
        Case("m_loss_string", M, 2, rec(M, 2, setitem("loss", "5.5")), '"loss" = "5.5" is not'),
        Case("m_loss_1e999", M, 2, raw(M, 2, replace_value("loss", b"1e999")), '"loss" = Infinity is not'),
        Case("m_ce_bool", M, 2, rec(M, 2, setitem("ce", False)), '"ce" = false is not'),
        Case("m_lr_negative", M, 2, rec(M, 2, setitem("lr", -1e-3)), '"lr" = -0.001 is not'),
        Case("m_grad_norm_negative", M, 2, rec(M, 2, setitem("grad_norm", -1)), '"grad_norm" = -1 is not'),
        Case("m_tokens_per_s_negative", M, 2, rec(M, 2, setitem("tokens_per_s", -5)),
             '"tokens_per_s" = -5 is not'),
        Case("m_capacity_factor_negative", M, 2, rec(M, 2, setitem("capacity_factor", -1)),
             '"capacity_factor" = -1 is not'),
        Case("m_step_s_-1e300", M, 2, rec(M, 2, setitem("step_s", -1e300)), '"step_s" = -1e+300 is not'),
        Case("m_step_s_1e300", M, 2, rec(M, 2, setitem("step_s", 1e300)), '"step_s" = 1e+300 is not'),
        Case("m_time_negative", M, 2, rec(M, 2, lambda r: r["time"].__setitem__("attention", -1)),
             '"time" entry "attention" = -1 is not a finite number in [0, 1e7]'),
        Case("m_time_1e300", M, 2, rec(M, 2, lambda r: r["time"].__setitem__("router", 1e300)),
             '"time" entry "router" = 1e+300 is not'),
        Case("m_time_string", M, 2, rec(M, 2, lambda r: r["time"].__setitem__("dense", "fast")),
             '"time" entry "dense" = "fast" is not'),
        Case("m_time_array", M, 2, rec(M, 2, setitem("time", [1, 2])), '"time" = an array is not'),
        Case("m_skipped_string", M, 2, rec(M, 2, setitem("skipped", "yes")), '"skipped" = "yes" is not'),
        Case("m_skipped_total_negative", M, 2, rec(M, 2, setitem("skipped_total", -1)),
             '"skipped_total" = -1 is not'),
        Case("m_val_loss_string", M, 2, rec(M, 2, setitem("val_loss", "nan")), '"val_loss" = "nan" is not'),
        Case("m_drop_frac_array", M, 2, rec(M, 2, setitem("drop_frac", [0])),
             '"drop_frac" = an array is not'),
        Case("m_capacity_decision_number", M, 2, rec(M, 2, setitem("capacity_decision", 5)),
             '"capacity_decision" = 5 is not'),
        Case("m_capacity_decision_new_string", M, 2, rec(M, 2, setitem("capacity_decision", {"new": "1.5"})),
             '"capacity_decision" entry "new" = "1.5" is not'),
        Case("m_fifo", M, None, special("fifo", M), "not a regular file (a FIFO)"),
        Case("m_dev_zero_symlink", M, None, special("dev_zero", M), "not a regular file"),
        Case("m_missing", M, None, drop_file(M), "no such file", rc={"tb": 1}),  # plot_load: optional
    ]
    names = [x.name for x in c]
    assert len(names) == len(set(names)), "duplicate case names"
    return c


# ---- running them -------------------------------------------------------------------------

def write_case(case, base, cases_dir):
    d = os.path.join(cases_dir, case.name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    logs = {C: base[0], L: list(base[1]), M: list(base[2])}
    case.setup(d, logs)
    for name in (C, L, M):
        if name in logs:
            data = logs[name] if name == C else b"\n".join(logs[name]) + (b"\n" if logs[name] else b"")
            if name in logs.get("no_newline", ()):
                data = data[:-1]
            with open(os.path.join(d, name), "w" if name == C else "wb") as f:
                f.write(data)
    if "after" in logs:
        logs["after"]()
    return d


def run_script(python, script, d, which):
    out = os.path.join(d, "out_" + which)
    try:
        r = subprocess.run([python, script, d, "--out", out], capture_output=True, timeout=TIMEOUT)
        return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %d s" % TIMEOUT


def check(case, d, which, rc, out, err, skips):
    """(ok, what) of one script on one case."""
    prog = {"plot": "plot_load.py", "tb": "tensorboard.py"}[which]
    want_rc = case.rc[which]
    bad = []
    if rc == 77 and want_rc == 0:
        skips.add(which)
    elif rc != want_rc:
        bad.append("exit %s, expected %d" % (rc, want_rc))
    if "Traceback" in err:
        bad.append("a traceback")
    path = os.path.join(d, case.file)
    errors = [l for l in err.splitlines() if l.startswith(prog + ": error: ")]
    if want_rc == 1:
        if len(errors) != 1:
            bad.append("%d error lines, expected 1" % len(errors))
        msg = errors[0] if errors else ""
        where = path + (":%d:" % case.line if case.line else ":")
        if where not in msg:
            bad.append("the message does not name %s" % where)
        if case.want and case.want not in msg:
            bad.append("the message does not say %r" % case.want)
    elif errors:
        bad.append("an error line")
    elif rc == 0 and which == "tb" and not out.rstrip().endswith("(%d steps)" % case.steps):
        bad.append("not all %d steps converted" % case.steps)  # a last line without its newline counts
    notes = [l for l in err.splitlines()
             if l.startswith(prog + ": note: ") and "partial last line ignored" in l]
    for name in case.note:
        n = len(open(os.path.join(d, name), "rb").read().split(b"\n"))  # the last line's number
        if not any(l.startswith("%s: note: %s:%d: " % (prog, os.path.join(d, name), n)) for l in notes):
            bad.append("no note on %s:%d, the partial last line" % (name, n))
    if len(notes) != len(case.note):
        bad.append("%d notes on partial last lines, expected %d" % (len(notes), len(case.note)))
    line = (errors[0] if errors else err.strip().splitlines()[-1] if err.strip() else "exit %s" % rc)
    return not bad, "%-40s %-14s %s%s" % (case.name, prog, "; ".join(bad) + " -- " if bad else "",
                                          line.replace(d, "RUN")[:160])


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    scripts, work, plot_py, tb_py = sys.argv[1:5]
    moe = sys.argv[5] if len(sys.argv) == 6 else None
    pythons = {}
    for which, py in (("plot", plot_py), ("tb", tb_py)):
        if not (py and os.access(py, os.X_OK)):
            print("damaged_logs: %s is missing: %s runs it (its library may be missing too)"
                  % (py, sys.executable))
            py = sys.executable
        pythons[which] = py
    script = {"plot": os.path.join(scripts, "plot_load.py"), "tb": os.path.join(scripts, "tensorboard.py")}
    os.makedirs(work, exist_ok=True)
    if moe and os.access(moe, os.X_OK):
        base = real_run(moe, work)
        print("damaged_logs: the damage applies to a 3-step run of %s" % moe)
    else:
        base = (CONFIG,) + hand_run(False)
        print("damaged_logs: no moe: the damage applies to hand-made logs in its format")
    cases_dir = os.path.join(work, "cases")
    shutil.rmtree(cases_dir, ignore_errors=True)
    os.makedirs(cases_dir)
    valid = [Case("valid_run", L, None, lambda d, logs: None, rc=ACCEPT)]
    ep = (CONFIG.replace("steps = 3;", "steps = 4;"),) + hand_run(True)
    ep_case = Case("valid_hand_made_ep_run", L, None, lambda d, logs: None, rc=ACCEPT)
    ep_case.steps = 4
    todo = [(c, base) for c in valid + cases()] + [(ep_case, ep)]
    dirs = {}
    for c, b in todo:
        try:
            dirs[c.name] = write_case(c, b, cases_dir)
        except OSError as e:  # a file system without sparse files or FIFOs
            print("  skip  %-40s cannot be made here: %s" % (c.name, e))
    jobs = [(c, which) for c, _ in todo if c.name in dirs for which in ("plot", "tb") if which in c.rc]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda j: run_script(pythons[j[1]], script[j[1]], dirs[j[0].name], j[1]),
                                jobs))
    for name in ("load_huge_line", "load_huge_file"):  # sparse, but 64 GiB to a copy
        if name in dirs:
            os.remove(os.path.join(dirs[name], L))
    fails, skips = 0, set()
    for (c, which), (rc, out, err) in zip(jobs, results):
        ok, what = check(c, dirs[c.name], which, rc, out, err, skips)
        fails += not ok
        print("  %s  %s" % ("ok  " if ok else "FAIL", what))
    n_damaged = sum(1 for c, _ in todo if c.name in dirs and c.rc != ACCEPT)
    print("%d damaged run directories, %d accepted ones, %d script runs: %d failure(s)"
          % (n_damaged, len(dirs) - n_damaged, len(jobs), fails))
    if fails:
        sys.exit(1)  # the run directories stay for a look
    shutil.rmtree(cases_dir)  # FIFOs and links to /dev/zero: not left in a build tree
    if skips:
        print("damaged_logs: every damage refused; the accepted cases were not converted (exit 77: "
              "no library for %s): skipped" % ", ".join(sorted(script[w] for w in skips)))
        sys.exit(77)


main()
