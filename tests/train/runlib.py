"""Shared by the end-to-end Python tests (tests/train, tests/stats): a fresh work folder with a
random text corpus for `moe train`, and the ok/FAIL lines that count the failures."""
import os
import random
import shutil
import sys


def fresh_work(work, seed, chars=40000, alphabet="abcdefgh ijklmnop,.\n"):
    """An empty work folder holding text.txt: chars random characters of alphabet."""
    empty_work(work)
    rnd = random.Random(seed)
    with open(os.path.join(work, "text.txt"), "w") as f:
        f.write("".join(rnd.choice(alphabet) for _ in range(chars)))


def mpi_args(argv=None):
    """The arguments of an MPI test, MOE [MPIRUN...] -- WORK: (moe, the mpirun command (empty
    without MPI), WORK)."""
    argv = sys.argv if argv is None else argv
    sep = argv.index("--")
    return argv[1], argv[2:sep], argv[sep + 1]


def empty_work(work):
    """WORK, emptied (created when missing)."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)


class Report:
    """report(ok, what) prints one check; report.exit() the count, exit 1 after a failure."""

    def __init__(self):
        self.fails = 0

    def __call__(self, ok, what):
        self.fails += not ok
        print("  %s  %s" % ("ok  " if ok else "FAIL", what))

    def exit(self):
        print("%d failure(s)" % self.fails)
        sys.exit(1 if self.fails else 0)
