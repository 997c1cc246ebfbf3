"""Which BLAS this PyTorch process runs on: the resolved path of the BLAS library mapped into
the process. Debian's torch links libblas.so.3, an update-alternatives link that points at the
OpenMP or the pthread build of OpenBLAS (or reference BLAS) depending on what is installed, and
that choice alone changes PyTorch's MoE times by up to 2x here (the pthread build's threads
compete with torch's OpenMP workers). Benchmarks print it next to their PyTorch numbers."""
import ctypes
import os


def blas_library():
    """The real path of the first BLAS library in /proc/self/maps, or 'unknown'."""
    try:
        with open("/proc/self/maps") as f:
            paths = [line.split()[-1] for line in f if "/" in line]
    except OSError:
        return "unknown"
    for name in ("libopenblas", "libblas", "libmkl_rt", "libblis"):
        for p in paths:
            if os.path.basename(p).startswith(name):
                return os.path.realpath(p)
    return "unknown"


def blas_kernel():
    """OpenBLAS's kernel family in this process (openblas_get_corename), or 'unknown'."""
    path = blas_library()
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"
