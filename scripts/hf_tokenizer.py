#!/usr/bin/env python3
"""Hugging Face tokenizers for moe.c: what `moe prepare --tokenizer`, `moe train` (data.tokenizer)
and `moe generate` run (data/tokenizer.c finds and calls this script); usable by hand too.

    hf_tokenizer.py prepare --tokenizer DIR --text FILE_OR_DIR... --out DIR [--val-fraction 0.1]
    hf_tokenizer.py encode --tokenizer DIR < text      # -> ids on one line, space separated
    hf_tokenizer.py decode --tokenizer DIR < ids       # -> the text, UTF-8, nothing added

DIR is a Hugging Face tokenizer folder: its tokenizer.json (the `tokenizers` format, e.g. the
one beside an HF Mixtral checkpoint) does the work through the `tokenizers` library (we do not
re-implement BPE); its tokenizer_config.json, when present, says whether decoding cleans up
tokenization spaces, as transformers' decode does.

prepare reads text like `moe prepare` without --tokenizer (data/prepare.h: files as given,
folders walked in strcmp order taking text files of at most 8 MB, hidden entries, build*
folders and links to folders skipped); each file plus one "\\n" is encoded on its own with the
tokenizer's special tokens (tokenizer.encode(text), e.g. a leading BOS); the ids are
concatenated and the last floor(val_fraction * tokens) become val.bin, the rest train.bin:
token files (data/token_file.h) with vocab_size = the tokenizer's vocabulary including added
tokens, u16 ids when it is at most 65536, else u32. Files that are not valid UTF-8 are decoded
with U+FFFD replacements (counted on stderr). The tokenizer's files are copied into the output
folder, which says what made the token files (moe train checks it). Every file is written to a
temporary name, fsynced and renamed.

encode takes UTF-8 text on stdin and adds the tokenizer's special tokens (as transformers'
tokenizer(text) does); decode skips special tokens (as the text-generation pipeline does).

Exit status: 0; 1 on an error (the last line of stderr says what); 2 when the `tokenizers`
package is missing (pip install tokenizers).
"""
import argparse
import array
import os
import stat
import struct
import sys

MAX_FILE_BYTES = 8 << 20  # DATA_PREPARE_MAX_FILE_BYTES (data/prepare.h)
TEXT_NAMES = {"Makefile", "README", "LICENSE"}
TEXT_EXTS = {".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".cuh", ".py", ".md", ".txt", ".rst",
             ".cfg", ".conf", ".ini", ".toml", ".yaml", ".yml", ".json", ".sh", ".cmake", ".in"}
# the files that make a Hugging Face tokenizer folder (data/tokenizer.h copies the same)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json")
TOK_HEADER = struct.Struct("<8sIIQII")  # magic, version, bytes per token, count, vocab, reserved
TOK_MAGIC = b"MOETOK1\0"


class Error(Exception):
    pass


def load_tokenizer(folder):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.stderr.write(f"hf_tokenizer: the tokenizers package is not installed for {sys.executable}: "
                         "pip install tokenizers (or set MOE_PYTHON to a python that has it)\n")
        sys.exit(2)
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise Error(f"{path}: not found (a tokenizer folder holds the Hugging Face tokenizer.json)")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library's own message says what it could not read
        raise Error(f"{path}: the tokenizers library cannot load it: {e}")


# ---- text sources: the same walk as data/prepare.c ------------------------------------------

def is_text_name(name):
    if name in TEXT_NAMES:
        return True
    dot = name.rfind(".")
    return dot > 0 and name[dot:] in TEXT_EXTS


def walk(folder, out):
    """Appends the text files under folder to out, in strcmp order (bytes), like prepare.c."""
    try:
        names = sorted((os.fsencode(n) for n in os.listdir(folder) if not n.startswith(".")))
    except OSError as e:
        raise Error(f"cannot open folder '{folder}': {e.strerror}")
    for raw in names:
        name = os.fsdecode(raw)
        path = os.path.join(folder, name)
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            if not name.startswith("build"):
                walk(path, out)
            continue
        if stat.S_ISLNK(st.st_mode):  # a link counts when it points to a regular file
            try:
                st = os.stat(path)
            except OSError:
                continue
        if stat.S_ISREG(st.st_mode) and is_text_name(name) and st.st_size <= MAX_FILE_BYTES:
            out.append(path)


def text_files(sources):
    for s in sources:  # every source checked before any is read: a typo fails fast
        if not os.path.exists(s):
            raise Error(f"source '{s}' does not exist")
        if not (os.path.isdir(s) or os.path.isfile(s)):
            raise Error(f"source '{s}' is neither a file nor a folder")
    files = []
    for s in sources:
        if os.path.isdir(s):
            walk(s, files)
        else:
            files.append(s)
    if not files:
        raise Error(f"no text found in {len(sources)} source(s) (first: '{sources[0]}')")
    return files


# ---- writing ---------------------------------------------------------------------------------

def write_atomic(path, chunks):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def token_file_chunks(ids, vocab):
    """The token file format of data/token_file.h: u16 when every id fits, else u32."""
    dtype = 2 if vocab <= 65536 else 4
    a = array.array("H" if dtype == 2 else "I", ids)
    if a.itemsize != dtype:  # (array's "I" is 4 bytes on every platform we build on)
        a = array.array("L", ids)
    if sys.byteorder == "big":
        a.byteswap()
    return [TOK_HEADER.pack(TOK_MAGIC, 1, dtype, len(ids), vocab, 0), a.tobytes()]


def copy_tokenizer_files(src, dst):
    for name in TOKENIZER_FILES:
        p = os.path.join(src, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                data = f.read()
            write_atomic(os.path.join(dst, name), [data])


def cmd_prepare(args):
    if not (args.val_fraction > 0 and args.val_fraction <= 0.5):
        raise Error(f"val_fraction {args.val_fraction:g} is not in (0, 0.5]")
    tok = load_tokenizer(args.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    files = text_files(args.text)
    ids = array.array("I")
    replaced, batch, batch_bytes = 0, [], 0

    def flush():
        for enc in tok.encode_batch(batch, add_special_tokens=True):
            ids.extend(enc.ids)
        batch.clear()

    for path in files:
        with open(path, "rb") as f:
            raw = f.read() + b"\n"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            replaced += 1
        batch.append(text)
        batch_bytes += len(raw)
        if batch_bytes >= (16 << 20):  # bounded memory for the library's encodings
            flush()
            batch_bytes = 0
    flush()
    if replaced:
        sys.stderr.write(f"hf_tokenizer: {replaced} file(s) were not valid UTF-8: their invalid bytes "
                         "were read as U+FFFD\n")
    n = len(ids)
    nv = int(n * args.val_fraction)
    nt = n - nv
    if nv < 2 or nt < 2:
        raise Error(f"too few tokens: {n} tokens of text in '{args.text[0]}'"
                    f"{' and the other sources' if len(args.text) > 1 else ''} give {nt} train and {nv} "
                    f"validation tokens at val_fraction {args.val_fraction:g}; each split needs at least 2")
    if n and max(ids) >= vocab:  # a tokenizer.json whose ids exceed its own vocabulary
        raise Error(f"{args.tokenizer}/tokenizer.json: id {max(ids)} >= its vocabulary size {vocab}")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise Error(f"cannot create folder '{args.out}': {e.strerror}")
    write_atomic(os.path.join(args.out, "train.bin"), token_file_chunks(ids[:nt], vocab))
    write_atomic(os.path.join(args.out, "val.bin"), token_file_chunks(ids[nt:], vocab))
    if os.path.realpath(args.out) != os.path.realpath(args.tokenizer):
        copy_tokenizer_files(args.tokenizer, args.out)
    print(f"{args.out}/train.bin: {nt} tokens, {args.out}/val.bin: {nv} tokens "
          f"(tokenizer {args.tokenizer}, vocabulary {vocab}, {len(files)} file(s))")


# ---- encode / decode -------------------------------------------------------------------------

def clean_up_spaces(folder):
    """tokenizer_config.json's clean_up_tokenization_spaces (transformers applies it in decode)."""
    import json
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            return bool(json.load(f).get("clean_up_tokenization_spaces", False))
    except (OSError, ValueError):
        return False


def clean_up_tokenization(s):  # transformers' PreTrainedTokenizerBase.clean_up_tokenization
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        s = s.replace(a, b)
    return s


def cmd_encode(args):
    tok = load_tokenizer(args.tokenizer)
    raw = sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Error(f"the text is not valid UTF-8 (byte {e.start}): the tokenizer takes Unicode text")
    ids = tok.encode(text, add_special_tokens=True).ids
    sys.stdout.write(" ".join(map(str, ids)) + "\n")


def cmd_decode(args):
    tok = load_tokenizer(args.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    try:
        ids = [int(x) for x in sys.stdin.read().split()]
    except ValueError as e:
        raise Error(f"decode reads integer ids: {e}")
    bad = [i for i in ids if i < 0 or i >= vocab]
    if bad:
        raise Error(f"id {bad[0]} is outside the tokenizer's vocabulary [0, {vocab})")
    text = tok.decode(ids, skip_special_tokens=True)
    if clean_up_spaces(args.tokenizer):
        text = clean_up_tokenization(text)
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="text files/folders -> OUT/train.bin, OUT/val.bin")
    p.add_argument("--tokenizer", required=True, metavar="DIR")
    # extend: `--text A B` and `--text=A --text=B` (how moe passes them: a path may start with -)
    p.add_argument("--text", required=True, nargs="+", action="extend", metavar="FILE_OR_DIR")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--val-fraction", type=float, default=0.1)
    for name, what in (("encode", "UTF-8 text on stdin -> ids"), ("decode", "ids on stdin -> text")):
        sub.add_parser(name, help=what).add_argument("--tokenizer", required=True, metavar="DIR")
    args = ap.parse_args()
    try:
        {"prepare": cmd_prepare, "encode": cmd_encode, "decode": cmd_decode}[args.cmd](args)
    except Error as e:
        sys.stderr.write(f"hf_tokenizer {args.cmd}: {e}\n")
        return 1
    except OSError as e:
        sys.stderr.write(f"hf_tokenizer {args.cmd}: {e.filename or ''}: {e.strerror}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
